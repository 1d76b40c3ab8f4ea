"""A client for a cluster of replicas that finds the leader by itself.

:class:`ClusterClient` takes every replica's gRPC address. Each call goes to the replica
it last found to be the leader, and branches on the error's reason
(:class:`~synapse_ha.rpc.errors.Reason`, read from its ErrorInfo), never on its text:

* NOT_LEADER sends it straight to the leader named in the ErrorInfo metadata;
* LEADER_NOT_READY (a new leader committing its barrier) and OVERLOADED (heavy reads are
  rationed there) wait and ask it again, except an OVERLOADED that names followers
  (``read_from``: the leader hands reads a follower can serve to them), which moves on;
* NO_LEADER, NOT_COMMITTED and a replica that does not answer at all (UNAVAILABLE without
  a reason) move it to the next address;
* OUTCOME_UNKNOWN (or a deadline with no answer) is retried only when ``idempotent`` is
  set (every submission carries a request id, so resubmitting returns the same job);
* every other error is raised to the caller as the ``grpc.RpcError`` it is (read it with
  :func:`synapse_ha.rpc.errors.failure_of`).

A call that is safe to send twice (``idempotent``: reads, and writes whose retry returns
the same result) is hedged: when the replica asked has not answered within ``hedge_s``
(default 0.2 s), the next replica is asked while the first attempt keeps running, and
the first definitive answer wins (:mod:`synapse_ha.client.attempts`). A replica with an
attempt in flight is not asked again in that call, nor followed to by a redirect. So a
client that has never seen the cluster, whose first address is a frozen leader, loses
``hedge_s`` there rather than the whole per-try deadline; a call answered within
``hedge_s`` goes to one replica only.

After a full round without an answer it backs off (exponentially, with jitter) until the
call's overall deadline. While the replicas say a leader is being elected (NO_LEADER,
LEADER_NOT_READY) the pause is at most ``election_backoff_s``: an election ends within
an election timeout (well under a second), and a client that had backed off to a second
would find the new leader up to a second late.

A replica that did not answer at all is suspect for a while (a frozen or cut-off leader:
:mod:`synapse_ha.client.suspects`; :meth:`ClusterClient.suspect` marks one by hand).

When no replica answers in time it raises :class:`ClusterUnavailable`, listing each
address tried and what it answered; with ``fail_fast``, as soon as every replica failed
to connect for a cause waiting does not cure (connection refused, a name that does not
resolve, a TLS handshake that failed), with the cause and a hint
(:mod:`synapse_ha.client.unavailable`).

Every call carries the client's credential: a bearer token (``token``) is sent as
``authorization: Bearer <token>`` metadata on each call; a client certificate comes with
the channel (``channel_factory``, e.g. the TLS transport's). A refusal
(``UNAUTHENTICATED``, ``PERMISSION_DENIED``) is raised at once, never retried.

The token goes only where the channel lets a call go: with the TLS transport's
``Transport.channel`` that is a server whose certificate names it a replica of the
cluster, checked in the handshake, before any call. A worker or a user certificate of
the same CA answering at a replica's address (or at an address learnt from a
NOT_LEADER redirect) fails the handshake and never sees the token: the call fails
``UNAVAILABLE`` and the client moves on to the next replica.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import grpc

from synapse_ha.client.attempts import Flight, Outcome, Workers, fly
from synapse_ha.client.events import watch_events
from synapse_ha.client.routing import Route
from synapse_ha.client.suspects import Suspects, silent
from synapse_ha.client.token import BearerToken, ReadToken
from synapse_ha.client.unavailable import Cause, ClusterUnavailable, cause_of
from synapse_ha.core.model import NodeStatus
from synapse_ha.rpc import states
from synapse_ha.rpc.errors import LEADER_METADATA_KEY, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc

__all__ = [
    "LEADER_METADATA_KEY",
    "ClusterClient",
    "ClusterUnavailable",
    "new_request_id",
]

Response = TypeVar("Response")


# Reads a follower serves to a client with a read token (docs/consistency.md).
FOLLOWER_READS = frozenset({"GetJob", "ListJobs", "GetArray", "ListNodes", "ListQueues"})


def new_request_id() -> str:
    return uuid.uuid4().hex


class ClusterClient:
    """Thread-safe; reuse one per process. Close it (or use ``with``) to free channels."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        timeout_s: float = 10.0,
        per_try_timeout_s: float = 2.0,
        backoff_s: float = 0.05,
        max_backoff_s: float = 1.0,
        election_backoff_s: float = 0.2,
        rng: random.Random | None = None,
        token: str | None = None,
        channel_factory: Callable[[str], grpc.Channel] | None = None,
        credentials_version: Callable[[], object] | None = None,
        suspect_s: float = 5.0,
        suspect_try_s: float = 0.5,
        follower_reads: bool = False,
        hedge_s: float | None = 0.2,
        fail_fast: bool = False,
        secure: bool | None = None,
    ) -> None:
        """``token``: a bearer token sent with every call. ``channel_factory``: makes
        the channel to one address (default: a plaintext channel); with a token it must be
        one that checks the server is a replica, as ``Transport.channel`` does.
        ``credentials_version``
        (e.g. ``Transport.version``): checked at most once a second; when it changes
        (rotated certificates) the channels are rebuilt with the new files.
        ``follower_reads``: reads that a follower may serve (:data:`FOLLOWER_READS`) go
        first to one replica drawn for this client, with the client's read token, so
        they spread over the replicas and never see a state older than this client's
        acknowledged writes (docs/consistency.md). ``hedge_s``: how long an idempotent
        call waits for one replica before it also asks the next (None: never).
        ``fail_fast``: a call gives up at once when every replica failed to connect for
        a cause waiting does not cure (refused, unresolvable, TLS handshake;
        :mod:`synapse_ha.client.routing`), for people waiting at a prompt; programs that
        must outlast a restart of every replica (workers) leave it off. ``secure``:
        whether the channels present TLS files, for the hint of
        :class:`ClusterUnavailable` (None: not known)."""
        if not addresses:
            raise ValueError("at least one replica address is required")
        self.addresses = list(dict.fromkeys(addresses))
        self.timeout_s = timeout_s
        self.per_try_timeout_s = per_try_timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.election_backoff_s = election_backoff_s
        self.hedge_s = hedge_s
        self.fail_fast = fail_fast
        self.secure = secure
        self.rng = rng or random.Random()
        self._workers = Workers()
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._preferred = self.addresses[0]
        self._token = token
        self._channel_factory = channel_factory or grpc.insecure_channel
        self._credentials_version = credentials_version
        self._version = credentials_version() if credentials_version else None
        self._version_checked = time.monotonic()
        self.credentials_check_s = 1.0
        self.suspects = Suspects(suspect_s, suspect_try_s)
        self.read_token = ReadToken()
        self.read_token.send = follower_reads
        self._home = self.rng.choice(self.addresses) if follower_reads else ""

    # ------------------------------------------------------------------ plumbing

    def close(self) -> None:
        """Close the channels (ending the attempts in flight) and the idle threads; the
        client may still be used (it opens what it needs again)."""
        with self._lock:
            channels, self._channels = self._channels, {}
            workers, self._workers = self._workers, Workers()
        for channel in channels.values():
            channel.close()
        workers.close()

    def __enter__(self) -> ClusterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def leader_hint(self) -> str:
        return self._preferred

    def suspect(self, address: str) -> None:
        """``address`` did not answer (:mod:`synapse_ha.client.suspects`)."""
        self.suspects.add(address)
        with self._lock:
            if self._preferred == address and len(self.addresses) > 1:
                self._preferred = self.next_address(address)

    def _rotated(self) -> list[grpc.Channel]:
        """Under the lock: the channels to close when the credentials changed on disk."""
        if self._credentials_version is None:
            return []
        now = time.monotonic()
        if now - self._version_checked < self.credentials_check_s:
            return []
        self._version_checked = now
        version = self._credentials_version()
        if version == self._version:
            return []
        self._version = version
        stale, self._channels = list(self._channels.values()), {}
        return stale

    def channel(self, address: str) -> grpc.Channel:
        with self._lock:
            stale = self._rotated()
        for old in stale:
            old.close()
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = grpc.intercept_channel(self._channel_factory(address), self.read_token)
                if self._token:
                    channel = grpc.intercept_channel(channel, BearerToken(self._token))
                self._channels[address] = channel
            return channel

    def scheduler(self, address: str) -> pb_grpc.SchedulerServiceStub:
        return pb_grpc.SchedulerServiceStub(self.channel(address))  # type: ignore[no-untyped-call]

    def agent(self, address: str) -> pb_grpc.NodeAgentServiceStub:
        return pb_grpc.NodeAgentServiceStub(self.channel(address))  # type: ignore[no-untyped-call]

    def call(
        self,
        method: str,
        invoke: Callable[[str, float], Response],
        *,
        idempotent: bool = True,
        timeout_s: float | None = None,
        start: str = "",
        hedge: bool = True,
    ) -> Response:
        """Run ``invoke(address, per_try_timeout)`` against the leader (or first against
        ``start``, a replica that may serve it), following redirects and retrying as
        described in the module docstring. An ``idempotent`` call is hedged unless
        ``hedge`` is False (a call too heavy to send twice): ``invoke`` may then run in
        another thread, and more than once at a time for different addresses."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        route = Route(self, method, idempotent, deadline)
        hedged = hedge and idempotent and self.hedge_s is not None and len(self.addresses) > 1
        flight = Flight(invoke, self._workers if hedged else None, self._after_call)
        try:
            outcome = fly(flight, route, start or self._preferred, self.hedge_s if hedged else None)
        finally:
            flight.close()
        if outcome.address != start:  # a follower that served a read is not the leader
            self._preferred = outcome.address
        self.suspects.clear(outcome.address)
        result: Response = outcome.result
        return result

    def _after_call(self, outcome: Outcome) -> None:
        """An attempt that ended after its call was answered elsewhere: a replica silent
        to its deadline is suspect; one that answered is trusted again."""
        if outcome.error is None:
            self.suspects.clear(outcome.address)
        elif isinstance(outcome.error, grpc.RpcError) and silent(failure_of(outcome.error)):
            self.suspect(outcome.address)

    def next_address(self, address: str) -> str:
        try:
            i = self.addresses.index(address)
        except ValueError:
            return self.addresses[0]
        return self.addresses[(i + 1) % len(self.addresses)]

    # -------------------------------------------------------------- typed calls

    def ask(
        self, method: str, request: Any, *, idempotent: bool = True, timeout_s: float | None = None
    ) -> Any:
        """The answer of the scheduler's unary ``method`` to ``request``, as :meth:`call`
        gets it (the leader, redirects, retries of an idempotent call)."""
        return self.call(
            method,
            lambda a, t: getattr(self.scheduler(a), method)(request, timeout=t),
            idempotent=idempotent,
            timeout_s=timeout_s,
            start=self._read_start(method),
        )

    def _read_start(self, method: str) -> str:
        """Where a call of ``method`` starts: this client's home replica for a read a
        follower may serve, with follower reads on; else the leader ("")."""
        return self._home if method in FOLLOWER_READS else ""

    def submit_job(
        self, spec: pb.JobSpec, request_id: str | None = None, timeout_s: float | None = None
    ) -> pb.SubmitJobResponse:
        """Submit with an idempotency key (generated when not given) reused on retries."""
        request = pb.SubmitJobRequest(spec=spec, request_id=request_id or new_request_id())
        response: pb.SubmitJobResponse = self.ask("SubmitJob", request, timeout_s=timeout_s)
        return response

    def submit_jobs(
        self, requests: Sequence[pb.SubmitJobRequest], timeout_s: float | None = None
    ) -> list[pb.SubmitJobResponse]:
        """Submit many jobs in one call (at most 1,000), each with its idempotency key
        (generated here when a request has none) reused on retries."""
        sent = pb.SubmitJobsRequest()
        for r in requests:
            sent.jobs.add(spec=r.spec, request_id=r.request_id or new_request_id())
        response: pb.SubmitJobsResponse = self.ask("SubmitJobs", sent, timeout_s=timeout_s)
        return list(response.jobs)

    def get_job(self, job_id: str, allow_stale: bool = False) -> pb.Job:
        job: pb.Job = self.ask(
            "GetJob", pb.GetJobRequest(job_id=job_id, allow_stale=allow_stale)
        ).job
        return job

    def list_jobs(self, limit: int = 0, **filters: Any) -> list[pb.Job]:
        """Every matching job (at most ``limit`` when it is set), page after page."""
        return [item for item in self.list_lines(limit, **filters) if isinstance(item, pb.Job)]

    def list_lines(self, limit: int = 0, **filters: Any) -> list[pb.Job | pb.ArraySummary]:
        """Every matching job, and with ``collapse_arrays=True`` each array as one
        summary in its place, in submission order (at most ``limit`` when it is set)."""
        lines: list[pb.Job | pb.ArraySummary] = []
        page_token = ""
        while True:
            page_size = min(limit - len(lines), 1000) if limit else 0
            request = pb.ListJobsRequest(limit=page_size, page_token=page_token, **filters)

            def page(address: str, timeout: float, r: pb.ListJobsRequest = request) -> Any:
                return self.scheduler(address).ListJobs(r, timeout=timeout)

            response = self.call("ListJobs", page, start=self._read_start("ListJobs"))
            got: list[pb.Job | pb.ArraySummary] = [*response.jobs, *response.arrays]
            lines.extend(sorted(got, key=lambda item: item.seq))
            page_token = response.next_page_token
            if not page_token or (limit and len(lines) >= limit):
                return lines

    def get_array(self, array_id: str, allow_stale: bool = False) -> pb.ArraySummary:
        request = pb.GetArrayRequest(array_id=array_id, allow_stale=allow_stale)
        array: pb.ArraySummary = self.ask("GetArray", request).array
        return array

    def cancel_job(self, job_id: str, reason: str = "") -> pb.CancelJobResponse:
        response: pb.CancelJobResponse = self.ask(
            "CancelJob", pb.CancelJobRequest(job_id=job_id, reason=reason)
        )
        return response

    def requeue_job(self, job_id: str, reason: str = "") -> pb.RequeueJobResponse:
        """Stop the job's live attempt and queue it again in its place."""
        response: pb.RequeueJobResponse = self.ask(
            "RequeueJob", pb.RequeueJobRequest(job_id=job_id, reason=reason)
        )
        return response

    def explain_job(self, job_id: str) -> pb.ExplainJobResponse:
        response: pb.ExplainJobResponse = self.ask(
            "ExplainJob", pb.ExplainJobRequest(job_id=job_id)
        )
        return response

    def create_token(
        self,
        user: str,
        role: str = "user",
        queues: Sequence[str] = (),
        ttl_ms: int = 0,
        *,
        priority_classes: Sequence[str] = (),
        max_priority: int = 0,
    ) -> pb.CreateTokenResponse:
        """A new bearer token for ``user`` (admins only); its text is in the answer, once.
        ``priority_classes`` (classes that preempt) and ``max_priority``: what it allows
        beyond a queue's own rules. Not retried on an unknown outcome: a retry would make
        a second token."""
        request = pb.CreateTokenRequest(
            user=user,
            role=role,
            queues=list(queues),
            ttl_ms=ttl_ms,
            priority_classes=list(priority_classes),
            max_priority=max_priority,
        )
        response: pb.CreateTokenResponse = self.ask("CreateToken", request, idempotent=False)
        return response

    # ------------------------------------------------------------ per-identity limits

    def get_limits(self) -> pb.Limits:
        """The cluster's per-identity limits (anyone may read them)."""
        response: pb.GetLimitsResponse = self.ask("GetLimits", pb.GetLimitsRequest())
        return response.limits

    def set_limits(self, values: Mapping[str, int]) -> pb.Limits:
        """Change the named limits, keep the others (admins only); the limits now."""
        request = pb.SetLimitsRequest(
            values=[pb.LimitValue(name=k, value=v) for k, v in sorted(values.items())]
        )
        response: pb.GetLimitsResponse = self.ask("SetLimits", request)
        return response.limits

    # --------------------------------------------- queues and preemption

    def list_queues(self) -> pb.ListQueuesResponse:
        """Every queue with its usage, the priority classes and the preemption mode."""
        response: pb.ListQueuesResponse = self.ask("ListQueues", pb.ListQueuesRequest())
        return response

    def set_queue(self, queue: pb.Queue) -> pb.SetQueueResponse:
        """Create or replace a queue (admins only). Idempotent: the same settings again
        change nothing (a retry may report ``created`` false)."""
        response: pb.SetQueueResponse = self.ask("SetQueue", pb.SetQueueRequest(queue=queue))
        return response

    def delete_queue(self, name: str) -> pb.DeleteQueueResponse:
        """Delete a queue (admins only); refused for ``default`` and while unfinished jobs
        name it. Not retried on an unknown outcome (a retry would answer not found)."""
        request = pb.DeleteQueueRequest(name=name)
        response: pb.DeleteQueueResponse = self.ask("DeleteQueue", request, idempotent=False)
        return response

    def set_node_status(self, node_id: str, action: str, reason: str = "") -> NodeStatus:
        """``action`` is ``cordon``, ``uncordon`` or ``drain``; returns the new status."""
        methods = {"cordon": "CordonNode", "uncordon": "UncordonNode", "drain": "DrainNode"}
        if action not in methods:
            raise ValueError(f"action must be one of {sorted(methods)}, got {action!r}")
        method = methods[action]
        request = pb.NodeStatusRequest(node_id=node_id, reason=reason)
        response: pb.NodeStatusResponse = self.ask(method, request)
        return states.node_status(response)

    def repair_gpus(self, node_id: str, gpus: Sequence[int] = ()) -> pb.RepairGpusResponse:
        """Clear the faults of ``node_id``'s GPUs (``gpus`` empty: all of them)."""
        request = pb.RepairGpusRequest(node_id=node_id, gpus=list(gpus))
        response: pb.RepairGpusResponse = self.ask("RepairGpus", request)
        return response

    def list_nodes(self) -> list[pb.Node]:
        return list(self.ask("ListNodes", pb.ListNodesRequest()).nodes)

    def cluster_status(self) -> pb.GetClusterStatusResponse:
        """Asked of any replica that answers (no leader needed)."""
        request = pb.GetClusterStatusRequest()
        attempts: list[tuple[str, str]] = []
        causes: dict[str, Cause] = {}
        for address in [self._preferred, *self.addresses]:
            try:
                response: pb.GetClusterStatusResponse = self.scheduler(address).GetClusterStatus(
                    request, timeout=self.per_try_timeout_s
                )
                return response
            except grpc.RpcError as exc:
                attempts.append((address, failure_of(exc).describe()))
                cause = cause_of(failure_of(exc))
                if cause is not None:
                    causes[address] = cause
        raise ClusterUnavailable(
            "GetClusterStatus",
            attempts,
            causes=causes,
            fast=set(causes) >= set(self.addresses),
            secure=self.secure,
        )

    def replica_state(self, address: str) -> pb.GetReplicaStateResponse:
        """The replica at ``address`` answers from its own copy (no redirect, no retry)."""
        response: pb.GetReplicaStateResponse = self.scheduler(address).GetReplicaState(
            pb.GetReplicaStateRequest(), timeout=self.per_try_timeout_s
        )
        return response

    def register_node(self, request: pb.RegisterNodeRequest) -> pb.RegisterNodeResponse:
        response: pb.RegisterNodeResponse = self.call(
            "RegisterNode", lambda a, t: self.agent(a).RegisterNode(request, timeout=t)
        )
        return response

    def heartbeat(
        self, request: pb.HeartbeatRequest, timeout_s: float | None = None
    ) -> pb.HeartbeatResponse:
        response: pb.HeartbeatResponse = self.call(
            "Heartbeat",
            lambda a, t: self.agent(a).Heartbeat(request, timeout=t),
            timeout_s=timeout_s,
        )
        return response

    # ------------------------------------------------- membership and backup

    def learn(self, address: str) -> None:
        """Remember a replica address learnt from the cluster (a leader added after this
        client started), so that later failovers may also try it."""
        with self._lock:
            if address not in self.addresses:
                self.addresses.append(address)

    def add_replica(
        self, replica_id: str, raft_address: str, grpc_address: str, timeout_s: float = 30.0
    ) -> pb.MembershipResponse:
        """Add a replica (admin); returns the members once the change is committed. Not
        retried on an unknown outcome: read the members before trying again."""
        request = pb.AddReplicaRequest(
            replica_id=replica_id, raft_address=raft_address, grpc_address=grpc_address
        )
        response: pb.MembershipResponse = self.ask(
            "AddReplica", request, idempotent=False, timeout_s=timeout_s
        )
        return response

    def remove_replica(self, replica_id: str, timeout_s: float = 30.0) -> pb.MembershipResponse:
        """Remove a replica (admin); when it is the leader, the call waits while it hands
        leadership over and then asks the new leader."""
        request = pb.RemoveReplicaRequest(replica_id=replica_id)
        response: pb.MembershipResponse = self.ask(
            "RemoveReplica", request, idempotent=False, timeout_s=timeout_s
        )
        return response

    def save_snapshot(self, timeout_s: float = 120.0) -> tuple[pb.SnapshotChunk, bytes]:
        """The leader's state: the first chunk (raft index, term, replica, size, SHA-256)
        and the whole encoded state. Raises ``ValueError`` when the bytes received do not
        match the size or checksum the leader announced."""

        def fetch(address: str, per_try: float) -> tuple[pb.SnapshotChunk, bytes]:
            stream = self.scheduler(address).SaveSnapshot(
                pb.SaveSnapshotRequest(), timeout=max(per_try, timeout_s)
            )
            first: pb.SnapshotChunk | None = None
            parts: list[bytes] = []
            for chunk in stream:
                if first is None:
                    first = chunk
                parts.append(chunk.data)
            if first is None:
                raise ValueError("the leader sent no snapshot")
            return first, b"".join(parts)

        # One stream of the whole state: too heavy to send twice.
        head, data = self.call("SaveSnapshot", fetch, timeout_s=timeout_s, hedge=False)
        if len(data) != head.total_bytes:
            raise ValueError(f"snapshot truncated: {len(data)} of {head.total_bytes} bytes")
        if hashlib.sha256(data).hexdigest() != head.sha256:
            raise ValueError("snapshot corrupted in transit: SHA-256 mismatch")
        return head, data

    # ---------------------------------------------- history and events

    def list_history(self, **filters: Any) -> list[pb.HistoryJob]:
        """Finished jobs from the history of the replica that answers (any replica:
        every one holds the same history), newest first. ``filters`` are the fields of
        ListHistoryRequest (user, queue, node_id, since_ms, until_ms, limit)."""
        request = pb.ListHistoryRequest(**filters)
        response = self.ask("ListHistory", request)
        return list(response.jobs)

    def get_usage(self, by: str, since_ms: int, until_ms: int = 0) -> pb.GetUsageResponse:
        """GPU-milliseconds per ``by`` (user or queue) and UTC day."""
        request = pb.GetUsageRequest(by=by, since_ms=since_ms, until_ms=until_ms)
        response: pb.GetUsageResponse = self.ask("GetUsage", request)
        return response

    def watch_events(
        self, since_index: int = 0, follow: bool = False, reconnect_s: float | None = None
    ) -> Iterator[pb.Event]:
        """Events after ``since_index`` (0: the oldest the replica holds); with
        ``follow``, until the caller stops iterating
        (:func:`synapse_ha.client.events.watch_events`)."""
        return watch_events(self, since_index, follow, reconnect_s)
