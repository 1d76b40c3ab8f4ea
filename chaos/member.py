"""The gang member the chaos workload runs: ``python -m chaos.member LEDGER SINK MS``.

It reads its identity from the DESIGN §5 environment (``SYNAPSE_JOB_ID``,
``SYNAPSE_ATTEMPT``, ``SYNAPSE_FENCING_TOKEN``, ``RANK``, ``SYNAPSE_MEMBER_HOSTS``,
``SYNAPSE_MEMBER_GENERATION``: a rank placed again runs in the next generation of the same
attempt), appends a ``start`` record to the ledger, claims its token at the sink, writes a
``heartbeat`` every 100 ms while it "trains" for MS milliseconds, then performs its
effect by asking the sink (HOST:PORT) to accept (job, token, rank, world size), and ends
with an ``end`` record naming the answer. It exits 0 when the sink accepted, or answered
that the job's output is already committed; 3 when it refused (a newer attempt exists);
4 when the sink could not be reached. SIGTERM writes ``term`` and exits 143. A preempted
member (its ``$SYNAPSE_PREEMPT_FILE`` exists when SIGTERM arrives) first writes
``preempted`` with the notice's kind and preemptor and keeps "checkpointing"
(heartbeats) for ``PREEMPT_DRAIN_S`` before it exits, as a real program would within its
grace: the checker then sees whether its GPUs were given to another attempt while it
still ran. A member of a gang with ``on_node_failure: replace`` (the workload sets
``CHAOS_REPLACE=1``) says so in its records; when its gang's membership changes it gets
``SIGUSR1`` and writes a ``membership`` record with the last line of
``$SYNAPSE_MEMBERSHIP_FILE`` (how many times the gang changed, its size, its hosts) at
its next heartbeat. A member of an elastic gang (``CHAOS_ELASTIC=<min>:<max>``) names
its gang's range in its records (``elastic``) and commits with a world of ``min``: the
gang's output is whole once its ranks ``0..min-1`` committed, whatever it grew to.

A member of a paced gang (``CHAOS_PACE=1``, chaos/slowfaults.py) "trains" in steps, each
a fixed amount of CPU work (:data:`PACE_WORK`) and a rest (the wait for the others at the
collective), and appends a pace line to ``$SYNAPSE_PROGRESS_FILE`` every
:data:`PACE_LINE_S`: the fastest of its own times per step (the work, timed on the wall
clock) since the line before (docs/slow-nodes.md). Its records say ``paced``. SIGUSR2
ends its work early: it commits at once (the slow-node kind's heal, so that its slow
median does not mark its node again once the node is made ready).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from chaos.ledger import Appender, now_ns
from chaos.steptask import HEARTBEAT_S, pid_namespace, start_ticks

PREEMPT_DRAIN_S = 0.3
# The worker's names (synapse_ha.worker.environment), spelled out: the member imports
# nothing of the package, so that it starts fast.
GENERATION_ENV = "SYNAPSE_MEMBER_GENERATION"
MEMBERSHIP_FILE_ENV = "SYNAPSE_MEMBERSHIP_FILE"
# Set by the workload for the gangs it submits with on_node_failure: replace.
REPLACE_ENV = "CHAOS_REPLACE"
# Set by the workload for its elastic gangs: ``<min>:<max>``.
ELASTIC_ENV = "CHAOS_ELASTIC"
# Set by the workload (and the slow-node kind) for its paced gangs.
PACE_ENV = "CHAOS_PACE"
# A paced step: this many iterations of arithmetic (about 4 ms of one of the suite's busy
# cores, more than twice the slow-node kind's CPU quota of 1 ms a period: a step that
# straddles a period's end uses the quota of two periods, and a step of less could end
# without waiting, fast under the throttle), then a rest, so that a member takes about 5 %
# of a core. A pace line with the fastest of the steps' own times this often: the suite's
# "nodes" share two cores with everything else, and a step preempted by another process
# is slow for no fault of its node (with the median, and members on either core, two
# healthy members of a gang were 15 % to 130 % apart for windows on end, and nodes were
# marked); a throttled step is never fast. By time, not by steps, so that a throttled
# member (a step of 300-700 ms) writes a line every step or so, and the worker's median
# over the member's lines turns soon after it was throttled at its start.
PACE_WORK = 120_000
PACE_REST_S = (0.05, 0.1)  # drawn for each step: peers on one core never fall in step
PACE_LINE_S = 0.5


def identity() -> dict[str, Any]:
    hosts = os.environ.get("SYNAPSE_MEMBER_HOSTS", "").split(",")
    rank = int(os.environ["RANK"])
    node = hosts[rank] if rank < len(hosts) else ""
    return {
        "job": os.environ["SYNAPSE_JOB_ID"],
        "attempt": int(os.environ["SYNAPSE_ATTEMPT"]),
        "token": int(os.environ["SYNAPSE_FENCING_TOKEN"]),
        "rank": rank,
        "world": int(os.environ.get("WORLD_SIZE", "0")),
        "node": node,
        "pid": os.getpid(),
        "pid_ns": pid_namespace(),
        "start_ticks": start_ticks(os.getpid()),
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        "generation": int(os.environ.get(GENERATION_ENV, "") or 0),
        "replace": os.environ.get(REPLACE_ENV, "") == "1",
        **({"elastic": os.environ[ELASTIC_ENV]} if os.environ.get(ELASTIC_ENV) else {}),
        **({"paced": True} if os.environ.get(PACE_ENV) == "1" else {}),
    }


def commit_world(me: dict[str, Any]) -> int:
    """The world size the member commits with: its gang's size, or an elastic gang's
    ``min``."""
    elastic = str(me.get("elastic", ""))
    return int(elastic.partition(":")[0]) if elastic else int(me["world"])


def membership_now() -> dict[str, Any]:
    """The last line of ``$SYNAPSE_MEMBERSHIP_FILE``: the gang as the worker last told it
    (``membership``, ``world_size``, ``member_hosts``); empty when there is none to read."""
    path = os.environ.get(MEMBERSHIP_FILE_ENV, "")
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines() if path else []
        doc = json.loads(lines[-1]) if lines else {}
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    sized = {"world_size": doc["world_size"]} if "world_size" in doc else {}
    return {
        "membership": doc.get("membership", 0),
        **sized,
        "member_hosts": doc.get("member_hosts", []),
    }


def ask_sink(address: str, request: dict[str, Any], timeout_s: float = 2.0) -> dict[str, Any]:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as conn:
        conn.sendall(json.dumps(request).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
    answer = json.loads(data)
    if not isinstance(answer, dict):
        raise ValueError("bad sink answer")
    return answer


class Pacer:
    """A paced member's steps and pace lines (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.step = 0
        self.times: list[float] = []  # own times (ms) since the last line
        self.next_line = time.monotonic() + PACE_LINE_S
        # Every paced member on the same core (the highest this process may use): the
        # suite's "nodes" share the machine's cores, and a member on a core busy with
        # other work would be slower than its peers for no fault of its node. Its rest is
        # drawn for each step: with a fixed one, two members started together woke in
        # lockstep, one always waiting for the other's step (40 % slower throughout).
        with contextlib.suppress(OSError, AttributeError):
            os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})

    def run_until(self, until: float) -> None:
        """Step until ``until`` (monotonic seconds)."""
        while time.monotonic() < until:
            started = time.perf_counter()
            total = 0
            for i in range(PACE_WORK):
                total += i * i
            self.times.append((time.perf_counter() - started) * 1000)
            self.step += 1
            if time.monotonic() >= self.next_line:
                self.write_line()
            rest = random.uniform(*PACE_REST_S)
            time.sleep(max(0.0, min(rest, until - time.monotonic())))

    def write_line(self) -> None:
        line = {"step": self.step, "step_ms": round(max(min(self.times), 0.001), 3)}
        self.times.clear()
        self.next_line = time.monotonic() + PACE_LINE_S
        if not self.path:
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)


def preempt_notice() -> dict[str, Any] | None:
    """The notice the worker wrote before the SIGTERM of a preemption, if any."""
    path = os.environ.get("SYNAPSE_PREEMPT_FILE", "")
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8")) if path else None
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m chaos.member LEDGER SINK_HOST:PORT DURATION_MS", file=sys.stderr)
        return 2
    # First of all: a membership signal before its handler would end the member.
    told: list[int] = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: told.append(now_ns()))
    # A paced member finishes its work early on SIGUSR2 (the slow-node kind's heal).
    finish: list[int] = []
    signal.signal(signal.SIGUSR2, lambda signum, frame: finish.append(now_ns()))
    ledger_path, sink, duration_ms = args[0], args[1], int(args[2])
    me = identity()
    out = Appender(Path(ledger_path))

    def record(kind: str, **extra: Any) -> None:
        out.append({"type": kind, **me, "mono_ns": now_ns(), **extra})

    def on_term(signum: int, frame: object) -> None:
        notice = preempt_notice()
        if notice is not None:
            record(
                "preempted",
                preemption=notice.get("kind", ""),
                preemptor=notice.get("preemptor", ""),
            )
            drain_until = time.monotonic() + PREEMPT_DRAIN_S
            while time.monotonic() < drain_until:
                time.sleep(HEARTBEAT_S / 2)
                record("heartbeat")
        record("term")
        os._exit(143)

    signal.signal(signal.SIGTERM, on_term)
    record("start", until_ns=now_ns() + duration_ms * 1_000_000)  # when it plans to end
    # Claim the token at the sink first, so that an older attempt resuming later (its host
    # frozen and thawed) is refused there. Best effort: the effect is fenced anyway.
    for _ in range(3):
        try:
            ask_sink(sink, {**me, "op": "claim"})
            break
        except (OSError, ValueError):
            time.sleep(0.1)
    end_at = time.monotonic() + duration_ms / 1000
    paced = os.environ.get(PACE_ENV) == "1"
    pacer = Pacer(os.environ.get("SYNAPSE_PROGRESS_FILE", "")) if paced else None
    while time.monotonic() < end_at and not finish:
        if pacer is None:
            time.sleep(min(HEARTBEAT_S, max(0.0, end_at - time.monotonic())))
        else:
            pacer.run_until(min(end_at, time.monotonic() + HEARTBEAT_S))
        record("heartbeat")
        if told:
            record("membership", told_ns=told[-1], **membership_now())
            told.clear()
    record("effect")
    answer: dict[str, Any] | None = None
    for _ in range(5):
        try:
            answer = ask_sink(sink, {**me, "world": commit_world(me)})
            break
        except (OSError, ValueError):
            time.sleep(0.2)
    if answer is None:
        record("end", outcome="sink unreachable")
        return 4
    if answer.get("done"):
        record("end", outcome="already committed")
        return 0
    accepted = bool(answer.get("accepted"))
    record("end", outcome="accepted" if accepted else "rejected")
    return 0 if accepted else 3


if __name__ == "__main__":
    sys.exit(main())
