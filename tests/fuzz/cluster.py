"""The live cluster the fuzz modules send to, and the checks run after every batch.

One :class:`FuzzCluster` per module (a module-scoped fixture stops every process in
``finally``): three replicas with mutual TLS. Requests go out as three identities:

* ``admin``: the admin user's certificate;
* ``user``: a bearer token of an ordinary user, over the transport-only certificate;
* ``node``: a worker certificate (node ``fuzz-node``), as an agent presents it.

The dead timeout is long, so that nothing the fuzzer registers is declared dead while it
runs: the replicated state then changes only through what the fuzzer's requests did.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

import grpc

from synapse_ha.core import invariants
from synapse_ha.core.codec.versioned import decode_state, encode_state
from synapse_ha.local.replicas import LocalReplicas
from synapse_ha.local.waiting import RPC_ERRORS, wait_until
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.security.tls import Transport

NODE_ID = "fuzz-node"
STATUS_BOUND_S = 30.0  # a replica that cannot answer GetClusterStatus in this long hangs
SETTLE_S = 30.0


@dataclass(frozen=True)
class Snapshot:
    replica_id: str
    last_applied: int
    sha256: str
    encoded: bytes


class FuzzCluster:
    def __init__(self, root: Path) -> None:
        self.replicas = LocalReplicas(root, 3, extra_args=["--dead-timeout", "1h"])
        self.channels: dict[tuple[str, str], grpc.Channel] = {}
        self.metadata: dict[str, tuple[tuple[str, str], ...]] = {}
        self.last: Snapshot | None = None  # the leader's settled state after the last batch

    def start(self) -> None:
        self.replicas.start()
        self.replicas.serving_leader(timeout_s=90.0)
        creds = self.replicas.credentials
        assert creds is not None
        with self.replicas.client(timeout_s=30.0) as admin:
            token = admin.create_token("fuzzer", "user").token
        transports = {
            "admin": Transport(creds.admin_tls()),
            "user": Transport(creds.client_tls()),
            "node": Transport(creds.worker_tls(NODE_ID)),
        }
        self.metadata = {"admin": (), "user": (("authorization", f"Bearer {token}"),), "node": ()}
        for identity, transport in transports.items():
            for r in self.replicas.replicas:
                self.channels[identity, r.replica_id] = transport.channel(r.grpc)

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()
        self.replicas.close()

    @property
    def ids(self) -> list[str]:
        return [r.replica_id for r in self.replicas.replicas]

    def leader_id(self) -> str:
        return self.replicas.serving_leader(timeout_s=60.0).replica_id

    # ------------------------------------------------------------------ checks

    def assert_alive(self) -> None:
        """Every replica process runs and answers GetClusterStatus within a bound."""
        for r in self.replicas.replicas:
            assert r.alive, f"replica {r.replica_id} exited:\n{r.log_tail()}"
            stub = pb_grpc.SchedulerServiceStub(self.channels["admin", r.replica_id])  # type: ignore[no-untyped-call]
            try:
                stub.GetClusterStatus(pb.GetClusterStatusRequest(), timeout=STATUS_BOUND_S)
            except grpc.RpcError as exc:
                # A follower may redirect; it answered, so it does not hang.
                if exc.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                    raise AssertionError(
                        f"replica {r.replica_id} did not answer GetClusterStatus within "
                        f"{STATUS_BOUND_S}s: {exc.code().name}\n{r.log_tail()}"
                    ) from exc

    def state(self, replica_id: str) -> Snapshot:
        stub = pb_grpc.SchedulerServiceStub(self.channels["admin", replica_id])  # type: ignore[no-untyped-call]
        answer = stub.GetReplicaState(pb.GetReplicaStateRequest(), timeout=STATUS_BOUND_S)
        assert answer.state_sha256 == hashlib.sha256(answer.encoded_state).hexdigest()
        return Snapshot(replica_id, answer.last_applied, answer.state_sha256, answer.encoded_state)

    @staticmethod
    def comparable(snap: Snapshot) -> bytes:
        """The state's encoding without its bookkeeping: the count of applied commands
        and the replicated clock (``last_time_ms``). Both advance with every committed
        command, also with the leader's own housekeeping (a periodic purge, a new
        term's barrier) and with a request refused only when applied (CordonNode of an
        unknown node is committed, and apply answers NOT_FOUND changing nothing else)."""
        state = decode_state(snap.encoded)
        return encode_state(replace(state, applied_commands=0, last_time_ms=0))

    def assert_invariants(self, snap: Snapshot) -> None:
        problems = invariants.check(decode_state(snap.encoded))
        assert problems == [], f"invariants broken on {snap.replica_id}: {problems}"

    def settled_state(self, replica_id: str) -> Snapshot:
        """The replica's state once its applied index stopped moving for a few reads
        (what accepted requests set off, such as a placement, has been committed)."""
        seen: list[Snapshot] = []

        def probe() -> Snapshot | None:
            seen.append(self.state(replica_id))
            recent = seen[-3:]
            if len(recent) == 3 and len({s.last_applied for s in recent}) == 1:
                return recent[-1]
            return None

        return wait_until(
            "a settled replicated state", probe, SETTLE_S, every_s=0.1, retry_on=RPC_ERRORS
        )

    def converged(self) -> list[Snapshot]:
        """Wait (bounded) until every replica holds the same state; their snapshots."""

        def probe() -> list[Snapshot] | None:
            snaps = [self.state(i) for i in self.ids]
            return snaps if len({s.sha256 for s in snaps}) == 1 else None

        return wait_until("identical replica states", probe, SETTLE_S, retry_on=RPC_ERRORS)
