"""Sending fuzzed requests to live processes and checking them afterwards.

:class:`Caller` sends one request of any :class:`~tests.fuzz.strategies.Method` over a
channel (unary, server-, client- or bidirectional streaming, all generic) and classifies
the answer:

* ``accepted``: the call succeeded (a stream that delivered answers until our deadline
  also counts: WatchEvents never ends by itself);
* ``rejected``: any status the servers give on purpose (INVALID_ARGUMENT,
  PERMISSION_DENIED, NOT_FOUND, ..., and DEADLINE_EXCEEDED with the replica's own
  OUTCOME_UNKNOWN ErrorInfo, which means "maybe");
* ``crash``: UNKNOWN (an exception escaped a handler: grpcio's "Exception calling
  application") or INTERNAL — a bug every time;
* ``timeout``: our own deadline passed on a unary call — a possible hang, checked by the
  liveness probe after the batch.

:class:`Tally` counts them for the run's summary (:func:`record` writes it as one JSON
line to stdout and, when ``SYNAPSE_FUZZ_RESULTS`` names a file, merges it there).
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError, Message

from synapse_ha.rpc.errors import Reason, failure_of
from tests.fuzz.strategies import Method

EXAMPLES_VARIABLE = "SYNAPSE_FUZZ_EXAMPLES"
RESULTS_VARIABLE = "SYNAPSE_FUZZ_RESULTS"

ACCEPTED = "accepted"
REJECTED = "rejected"
CRASH = "crash"
TIMEOUT = "timeout"
UNCERTAIN = "uncertain"  # OUTCOME_UNKNOWN: the write may or may not have committed

STREAM_ITEMS = 3  # answers read from a server stream before hanging up
CALL_TIMEOUT_S = 20.0  # generous: the machine is shared
STREAM_TIMEOUT_S = 2.0


def examples(default: int) -> int:
    """The example count of one property: ``default`` in ``make test``, the value of
    ``SYNAPSE_FUZZ_EXAMPLES`` in a soak."""
    raw = os.environ.get(EXAMPLES_VARIABLE, "")
    return int(raw) if raw.strip().isdigit() and int(raw) > 0 else default


@dataclass(frozen=True)
class Outcome:
    kind: str
    code: str
    detail: str = ""


def _classify_error(exc: grpc.RpcError, *, stream: bool) -> Outcome:
    failure = failure_of(exc)
    code = failure.code
    if code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL) or (
        failure.reason is Reason.INTERNAL
    ):
        return Outcome(CRASH, code.name, failure.message[:500])
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        if failure.reason is Reason.OUTCOME_UNKNOWN:
            return Outcome(UNCERTAIN, code.name)
        return Outcome(ACCEPTED if stream else TIMEOUT, code.name)
    return Outcome(REJECTED, code.name, failure.reason.value)


def _messages(requests: list[Message]) -> Iterator[Message]:
    yield from requests


def call(
    channel: grpc.Channel,
    method: Method,
    requests: list[Message],
    metadata: tuple[tuple[str, str], ...] = (),
) -> Outcome:
    """Send ``requests`` (one for a unary request, all for a client stream) and classify
    the answer. Never raises for an RPC error."""
    serialize = method.request.SerializeToString
    deserialize = method.response.FromString
    stream = method.server_streaming
    timeout = STREAM_TIMEOUT_S if stream else CALL_TIMEOUT_S
    md = metadata or None
    try:
        if method.client_streaming and stream:
            rpc: Any = channel.stream_stream(method.path, serialize, deserialize)
            answers = rpc(_messages(requests), timeout=timeout, metadata=md)
        elif method.client_streaming:
            rpc = channel.stream_unary(method.path, serialize, deserialize)
            rpc(_messages(requests), timeout=timeout, metadata=md)
            return Outcome(ACCEPTED, "OK")
        elif stream:
            rpc = channel.unary_stream(method.path, serialize, deserialize)
            answers = rpc(requests[0], timeout=timeout, metadata=md)
        else:
            rpc = channel.unary_unary(method.path, serialize, deserialize)
            rpc(requests[0], timeout=timeout, metadata=md)
            return Outcome(ACCEPTED, "OK")
        for i, _ in enumerate(answers):
            if i + 1 >= STREAM_ITEMS:
                answers.cancel()
                break
        return Outcome(ACCEPTED, "OK")
    except grpc.RpcError as exc:
        if getattr(exc, "code", lambda: None)() is grpc.StatusCode.CANCELLED and stream:
            return Outcome(ACCEPTED, "OK")  # we hung up after STREAM_ITEMS answers
        return _classify_error(exc, stream=stream)


# Services of the API's protos that a replica serves on another port than its API port:
# the heartbeat stream, on the address a node's registration names (rpc/stream.py).
SERVED_ELSEWHERE = frozenset({"synapse.v1.NodeStreamService"})


def call_raw(
    channel: grpc.Channel,
    method: Method,
    payload: bytes,
    metadata: tuple[tuple[str, str], ...] = (),
) -> Outcome:
    """Send ``payload`` as the request's serialized bytes: a well-formed gRPC frame whose
    protobuf may be anything. The answer is not decoded."""

    def raw(_: Any) -> bytes:
        return payload

    def keep(data: bytes) -> bytes:
        return data

    stream = method.server_streaming
    timeout = STREAM_TIMEOUT_S if stream else CALL_TIMEOUT_S
    md = metadata or None
    try:
        if method.client_streaming:
            rpc: Any = (channel.stream_stream if stream else channel.stream_unary)(
                method.path, raw, keep
            )
            answers = rpc(iter([None]), timeout=timeout, metadata=md)
        else:
            rpc = (channel.unary_stream if stream else channel.unary_unary)(method.path, raw, keep)
            answers = rpc(None, timeout=timeout, metadata=md)
        if stream:
            for i, _ in enumerate(answers):
                if i + 1 >= STREAM_ITEMS:
                    answers.cancel()
                    break
        return Outcome(ACCEPTED, "OK")
    except grpc.RpcError as exc:
        code = getattr(exc, "code", lambda: None)()
        if code is grpc.StatusCode.CANCELLED and stream:
            return Outcome(ACCEPTED, "OK")
        outcome = _classify_error(exc, stream=stream)
        if outcome.kind == REJECTED and not _parses(method, payload):
            if method.service in SERVED_ELSEWHERE:
                # Not a method of this port: gRPC refuses it before reading the request.
                assert outcome.code == "UNIMPLEMENTED", (method.name, outcome)
            else:
                # A request that cannot be decoded is refused, once its caller is checked,
                # as an invalid ``request`` (rpc/auth.py), never handled.
                refusals = ("UNAUTHENTICATED", "PERMISSION_DENIED", "INVALID_FIELD")
                assert outcome.detail in refusals, (method.name, outcome)
        return outcome


def _parses(method: Method, payload: bytes) -> bool:
    try:
        method.request.FromString(payload)
    except DecodeError:
        return False
    return True


@dataclass
class Tally:
    """Counts of one fuzz target, printed and recorded at the end of its module."""

    target: str
    examples: int = 0
    batches: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    codes: Counter[str] = field(default_factory=Counter)
    crashes: list[str] = field(default_factory=list)
    state_checks: int = 0  # rejected-only batches whose state was compared
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, method: str, identity: str, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes[outcome.kind] += 1
            self.codes[outcome.code] += 1
            if outcome.kind == CRASH:
                self.crashes.append(f"{identity} {method}: {outcome.code} {outcome.detail}")

    def summary(self) -> dict[str, Any]:
        sent = sum(self.outcomes.values())
        return {
            "target": self.target,
            "examples": self.examples,
            "batches": self.batches,
            "requests_sent": sent,
            "accepted": self.outcomes[ACCEPTED],
            "rejected": self.outcomes[REJECTED],
            "uncertain": self.outcomes[UNCERTAIN],
            "timeouts": self.outcomes[TIMEOUT],
            "crashes": self.outcomes[CRASH],
            "state_checks": self.state_checks,
            "codes": dict(sorted(self.codes.items())),
        }


def recorder(tally: Tally) -> Any:
    """A module-scoped autouse fixture that records ``tally`` after the module's last
    test, whatever order the tests ran in (assign it to a name in the test module)."""

    @pytest.fixture(scope="module", autouse=True)
    def record_the_counts() -> Iterator[None]:
        yield
        if tally.examples:
            record(tally.summary())

    return record_the_counts


def record(summary: dict[str, Any]) -> None:
    """Print the summary as one JSON line; merge it into the results file if one is set."""
    line = json.dumps({"fuzz": summary}, sort_keys=True)
    print(line)
    target = os.environ.get(RESULTS_VARIABLE, "")
    if not target:
        return
    path = Path(target)
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    data.setdefault("targets", {})[summary["target"]] = summary
    targets = data["targets"].values()
    data["totals"] = {
        key: sum(int(t.get(key, 0)) for t in targets)
        for key in ("examples", "requests_sent", "accepted", "rejected", "crashes", "timeouts")
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
