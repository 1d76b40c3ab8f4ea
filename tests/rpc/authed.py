"""An in-process replica for access tests: the real servicers and auth interceptor on
127.0.0.1 in front of a fake backend that applies commands to a real state, with users'
tokens, two nodes and a job of alice's and one of bob's. Certificates are stood in for
by a test peer identity read from the metadata (the TLS layer supplies the real one)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import grpc

from synapse_ha.core import commands as cmd
from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.identity import access
from synapse_ha.core.identity.access import Identity, Role
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState
from synapse_ha.core.snapshot import full_copy
from synapse_ha.leader.liveness import Liveness
from synapse_ha.rpc.auth import AuthInterceptor, new_token
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.rpc.server import ReplicaAddress, ReplicaContext, build_server
from tests.core.harness import job, node

PEER_KEY = "x-test-peer"  # the SPIFFE id a client certificate would carry


@dataclass
class FakeRaft:
    role: str = "leader"
    term: int = 1
    commit_index: int = 0
    last_applied: int = 0
    leader: str = "127.0.0.1:1"
    has_quorum: bool = True
    tick_stalls: int = 0
    longest_tick_interval_s: float = 0.0


@dataclass
class FakeBackend:
    """Applies proposals to a real state, at once or (``hold``) when the test commits
    them; snapshots are copies."""

    state: ClusterState = field(default_factory=ClusterState)
    lock: threading.Lock = field(default_factory=threading.Lock)
    hold: bool = False
    pending: list[tuple[cmd.Command, Future[cmd.Result]]] = field(default_factory=list)
    leads: bool = True  # whether it says it leads (serving is the context's to say)
    leader_term: int = 1

    def propose(self, command: cmd.Command) -> Future[cmd.Result]:
        future: Future[cmd.Result] = Future()
        with self.lock:
            if self.hold:
                self.pending.append((command, future))
            else:
                future.set_result(apply(self.state, command))
        return future

    def commit_pending(self) -> None:
        with self.lock:
            pending, self.pending = self.pending, []
            for command, future in pending:
                future.set_result(apply(self.state, command))

    def snapshot(self) -> ClusterState:
        with self.lock:
            return full_copy(self.state)

    def reading(self) -> AbstractContextManager[ClusterState]:
        return nullcontext(self.state)

    def cluster_config(self) -> ClusterConfig:
        return self.state.config

    def status(self) -> FakeRaft:
        return FakeRaft(last_applied=self.state.applied_commands, term=self.leader_term)

    def is_leader(self) -> bool:
        return self.leads

    def leader_address(self) -> str:
        return "127.0.0.1:1"

    def term(self) -> int:
        return self.status().term


def peer_from_metadata(context: grpc.ServicerContext) -> Identity | None:
    for key, value in context.invocation_metadata():
        if key == PEER_KEY and isinstance(value, str):
            return access.parse_spiffe_id(value)
    return None


@dataclass
class Replica:
    address: str
    backend: FakeBackend
    auth: AuthInterceptor
    ctx: ReplicaContext
    clock: list[int]
    tokens: dict[str, str]  # who → token text
    jobs: dict[str, str]  # owner → job id
    channel: grpc.Channel

    @property
    def scheduler(self) -> pb_grpc.SchedulerServiceStub:
        return pb_grpc.SchedulerServiceStub(self.channel)  # type: ignore[no-untyped-call]

    @property
    def agent(self) -> pb_grpc.NodeAgentServiceStub:
        return pb_grpc.NodeAgentServiceStub(self.channel)  # type: ignore[no-untyped-call]


NOW = 1_000_000


def _token(backend: FakeBackend, user: str, role: Role, ttl_ms: int = 0) -> str:
    text, command = new_token(user, role, (), ttl_ms, NOW, "bootstrap")
    assert backend.propose(command).result().ok
    return text


@contextmanager
def serving_replica() -> Iterator[Replica]:
    """A started replica; stopped on exit."""
    backend = FakeBackend()
    state = backend.state
    clock = [NOW]
    for info in (node("n1", gpus=2), node("n2", gpus=2)):
        assert apply(state, cmd.RegisterNode(info, NOW)).ok
    tokens = {
        "admin": _token(backend, "root", Role.ADMIN),
        "operator": _token(backend, "ops", Role.OPERATOR),
        "alice": _token(backend, "alice", Role.USER),
        "bob": _token(backend, "bob", Role.USER),
        "expired": _token(backend, "carol", Role.USER, ttl_ms=10),
        "revoked": _token(backend, "dave", Role.USER),
    }
    revoked_id = access.split_token(tokens["revoked"])
    assert revoked_id is not None
    assert apply(state, cmd.RevokeToken(revoked_id[0], NOW, "user:root")).ok
    jobs = {}
    for owner in ("alice", "bob"):
        spec = job(f"{owner}-job", replicas=1, gpu=1)
        result = apply(state, cmd.SubmitJob(spec, f"req-{owner}", NOW, owner=owner))
        jobs[owner] = result.job_id
    auth = AuthInterceptor(
        lambda: backend.snapshot().tokens, lambda: clock[0], identify_peer=peer_from_metadata
    )
    ctx = ReplicaContext(
        self_id="r1",
        replicas=[ReplicaAddress("r1", "127.0.0.1:1", "127.0.0.1:0")],
        backend=backend,
        liveness=Liveness(),
        serving=lambda: True,
        clock_ms=lambda: clock[0],
    )
    clock[0] = NOW + 1_000  # the "expired" token is past its 10 ms
    server = build_server(ctx, "127.0.0.1:0", max_workers=4, auth=auth)
    # build_server bound an ephemeral port; find it by binding another and reading both.
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Replica(f"127.0.0.1:{port}", backend, auth, ctx, clock, tokens, jobs, channel)
    finally:
        channel.close()
        server.stop(grace=None)


def lone_context(backend: FakeBackend, serving: bool = True, **fields: Any) -> ReplicaContext:
    """A context of replica r1 serving ``backend`` without credentials (``serving``: as
    the serving leader or not); ``fields`` set the others (``replicas``, gates, plan)."""
    fields.setdefault("replicas", [ReplicaAddress("r1", "127.0.0.1:1", "127.0.0.1:0")])
    return ReplicaContext(
        self_id="r1",
        backend=backend,
        liveness=Liveness(),
        serving=lambda: serving,
        clock_ms=lambda: NOW,
        **fields,
    )


@contextmanager
def served(ctx: ReplicaContext) -> Iterator[str]:
    """``ctx`` served in process on a loopback port, in insecure mode; its address. The
    server is stopped on exit."""
    server = build_server(ctx, "127.0.0.1:0", max_workers=2)
    port = server.add_insecure_port("127.0.0.1:0")  # build_server's own port is unknown
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)
