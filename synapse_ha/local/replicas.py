"""The replicas of one control plane on loopback, started and stopped together.

:class:`LocalReplicas` prepares ``synapse-scheduler`` replicas through a
:class:`~synapse_ha.local.launcher.Launcher` (with the cluster's credentials unless
insecure), hands them the Raft password through their environment only (read on the
password Raft channel: an insecure cluster, or ``--raft-transport password``; a secure
replica talks Raft over mutual TLS), adds replicas, and finds the leader by asking each
replica for its own status.
"""

from __future__ import annotations

import contextlib
import random
import signal
import threading
from collections.abc import Sequence
from pathlib import Path

import grpc

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.membership import ReplicaRole
from synapse_ha.local.commands import Peer, loopback_peers
from synapse_ha.local.launcher import Launcher
from synapse_ha.local.process import DEFAULT_STOP_GRACE_S, LaunchError, Replica
from synapse_ha.local.waiting import RPC_ERRORS, wait_until
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.rpc.states import replica_role
from synapse_ha.security.bundle import ClusterCredentials, new_raft_password
from synapse_ha.security.tls import Transport

RAFT_PASSWORD_VARIABLE = "SYNAPSE_RAFT_PASSWORD"


class LocalReplicas:
    """The replicas of one control plane, started and stopped together.

    ``peers`` default to ``size`` replicas ``r1``, ``r2``, ... on free loopback ports.
    Replica ``id`` keeps its data in ``data_root/id`` and logs to ``logs_dir`` under
    ``log_name`` (``{id}`` is replaced). The Raft password (random unless given) reaches
    the replicas only through their environment. With a ``launcher`` of the caller's,
    :meth:`close` stops the replicas only; otherwise it closes its own launcher.
    """

    def __init__(
        self,
        root: Path,
        size: int = 3,
        extra_args: Sequence[str] = (),
        *,
        insecure: bool = False,
        peers: Sequence[Peer] | None = None,
        data_root: Path | None = None,
        logs_dir: Path | None = None,
        log_name: str = "{id}.log",
        password: str | None = None,
        launcher: Launcher | None = None,
    ) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.extra_args = list(extra_args)
        if not any(a.startswith("--master-port-base") for a in self.extra_args):
            # Each local cluster its own range: clusters side by side on one machine (tests,
            # several users' dev clusters) do not hand their jobs the same ports.
            base = random.SystemRandom().randrange(20_000, 45_000, 100)  # at most 45,536
            self.extra_args += ["--master-port-base", str(base)]
        # The cluster format a serving leader is waited for: every replica here runs this
        # release, so its leader raises the format at once (None: some run an older one).
        self.expect_format: int | None = FORMAT
        self.password = password or new_raft_password()
        self._owns_launcher = launcher is None
        self.launcher = launcher or Launcher(logs_dir or root)
        ids = [f"r{i + 1}" for i in range(size)]
        self.peers = list(peers or loopback_peers(ids, holder=self.launcher.ports))
        if self.launcher.credentials is None and not insecure:
            self.launcher.credentials = ClusterCredentials.ensure(root / "credentials")
        self.credentials = self.launcher.credentials
        # The launcher's own calls: as the admin user, by certificate.
        self.transport = Transport(
            None if self.credentials is None else self.credentials.admin_tls()
        )
        data_root = data_root or root
        logs_dir = logs_dir or self.launcher.logs_dir
        env = {**self.launcher.env, RAFT_PASSWORD_VARIABLE: self.password}
        self.replicas: list[Replica] = [
            self.launcher.replica(
                peer,
                self.peers,
                data_root / peer.replica_id,
                extra=self.extra_args,
                log_path=logs_dir / log_name.format(id=peer.replica_id),
                env=env,
            )
            for peer in self.peers
        ]

    # ---------------------------------------------------------------- processes

    def start(self, replica: Replica | None = None) -> None:
        """Start one replica (again), or every replica; returns at once (see
        :meth:`serving_leader`)."""
        for r in [replica] if replica else self.replicas:
            r.data_dir.mkdir(parents=True, exist_ok=True)
            self.launcher.start(r)

    def kill(self, replica: Replica, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the replica's group and wait until it has exited (SIGKILL
        after a bounded wait)."""
        replica.kill(sig)

    def close(self, grace_s: float = DEFAULT_STOP_GRACE_S) -> None:
        """Stop every replica (and, with its own launcher, everything it started)."""
        if self._owns_launcher:
            self.launcher.close(grace_s)
        else:
            self.launcher.stop_all(self.replicas, grace_s)

    def logs(self, chars: int = 4000) -> str:
        return "\n".join(f"----- {r.replica_id} -----\n{r.log_tail(chars)}" for r in self.replicas)

    # ------------------------------------------ membership and backup

    def add_replica(self, replica_id: str, extra: Sequence[str] | None = None) -> Replica:
        """A new replica on free loopback ports, prepared but not started, knowing every
        peer so far and itself; it gets its own certificate. By default it runs with the
        cluster's extra arguments and ``--join``. Make it a member with
        ``client().add_replica(...)`` before or after starting it."""
        if any(p.replica_id == replica_id for p in self.peers):
            raise LaunchError(f"replica {replica_id!r} exists already")
        (peer,) = loopback_peers([replica_id], holder=self.launcher.ports)
        self.peers.append(peer)
        first = self.replicas[0]
        replica = self.launcher.replica(
            peer,
            self.peers,
            first.data_dir.parent / replica_id,
            extra=[*self.extra_args, "--join"] if extra is None else extra,
            log_path=first.log_path.parent
            / first.log_path.name.replace(first.replica_id, replica_id),
            env=first.env,
        )
        self.replicas.append(replica)
        return replica

    # ------------------------------------------------------------------- access

    @property
    def grpc_addresses(self) -> list[str]:
        return [r.grpc for r in self.replicas]

    def replica(self, replica_id: str) -> Replica:
        for r in self.replicas:
            if r.replica_id == replica_id:
                return r
        ids = [r.replica_id for r in self.replicas]
        raise LaunchError(f"no replica {replica_id!r} (replicas are {ids})")

    def client(
        self,
        timeout_s: float = 10.0,
        per_try_timeout_s: float = 2.0,
        *,
        token: str | None = None,
        transport: Transport | None = None,
    ) -> ClusterClient:
        """A new client of these replicas; the caller closes it. By default it is the
        admin (by certificate); with ``token`` it is that token's user (over the
        transport-only client certificate unless ``transport`` is given)."""
        if transport is None:
            transport = self.transport
            if token is not None and self.credentials is not None:
                transport = Transport(self.credentials.client_tls())
        return ClusterClient(
            self.grpc_addresses,
            timeout_s=timeout_s,
            per_try_timeout_s=per_try_timeout_s,
            token=token,
            channel_factory=transport.channel,
        )

    def channel(self, address: str) -> grpc.Channel:
        """A channel to ``address`` as the admin (the caller closes it)."""
        return self.transport.channel(address)

    def local_status(self, replica: Replica, timeout_s: float = 1.0) -> pb.ReplicaStatus:
        """The replica's own view of itself (raises ``grpc.RpcError`` when it is down)."""
        return replica_status(replica.grpc, timeout_s, self.transport)

    def leader(self) -> Replica | None:
        """The running replica that says it leads (the highest term wins), or None."""
        best: tuple[int, Replica] | None = None
        for r in self.replicas:
            if not r.alive or r.paused:
                continue
            try:
                status = self.local_status(r)
            except grpc.RpcError:
                continue
            if replica_role(status) is ReplicaRole.LEADER and (
                best is None or status.term > best[0]
            ):
                best = (status.term, r)
        return best[1] if best else None

    def serving_leader(
        self, timeout_s: float = 15.0, *, abort: threading.Event | None = None
    ) -> Replica:
        """Wait (bounded) until exactly one running replica says it leads, it answers a
        leader-only read and, when every replica runs, the cluster reads
        ``expect_format``; that replica. Fails early when a replica expected to run has
        exited."""

        def probe() -> Replica | None:
            leaders = []
            for r in self.replicas:
                if not r.alive or r.paused:
                    continue
                with contextlib.suppress(grpc.RpcError):
                    if replica_role(self.local_status(r)) is ReplicaRole.LEADER:
                        leaders.append(r)
            if len(leaders) != 1:
                return None
            with self.channel(leaders[0].grpc) as channel:
                stub = pb_grpc.SchedulerServiceStub(channel)  # type: ignore[no-untyped-call]
                stub.ListNodes(pb.ListNodesRequest(), timeout=1.0)
                # The leader raises the format only once every replica answers.
                everyone = all(r.alive and not r.paused for r in self.replicas)
                if self.expect_format is not None and everyone:
                    local = pb.GetClusterStatusRequest(local_only=True)
                    if stub.GetClusterStatus(local, timeout=1.0).format_floor < self.expect_format:
                        return None  # the leader raises the format within a second
            return leaders[0]

        return wait_until(
            "a serving leader",
            probe,
            timeout_s,
            every_s=0.05,
            watch=self.replicas,
            retry_on=RPC_ERRORS,
            abort=abort,
        )

    def followers(self, leader: Replica) -> list[Replica]:
        return [r for r in self.replicas if r is not leader and r.alive]


def replica_status(
    address: str, timeout_s: float = 1.0, transport: Transport | None = None
) -> pb.ReplicaStatus:
    """What the replica at ``address`` says about itself (``grpc.RpcError`` when down)."""
    with (transport or Transport.insecure()).channel(address) as channel:
        stub = pb_grpc.SchedulerServiceStub(channel)  # type: ignore[no-untyped-call]
        answer = stub.GetClusterStatus(
            pb.GetClusterStatusRequest(local_only=True), timeout=timeout_s
        )
    status: pb.ReplicaStatus = answer.replicas[0]
    return status
