"""``synapse-scheduler``: one replica of the control plane (composition root).

Its configuration, flags and TOML file, is :mod:`synapse_ha.programs.scheduler_config`.

The process runs in the foreground, logs to stderr, logs ``ready: ...`` once it has joined
a quorum with a known leader, and stops gracefully on SIGTERM or SIGINT.
"""

from __future__ import annotations

import gc
import logging
import os
import queue
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import overload

from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.backup import BackupError, decode_backup
from synapse_ha.core.health.slowness import SlownessRule
from synapse_ha.core.identity.access import Role, split_token
from synapse_ha.history.events import EventRing
from synapse_ha.history.recorder import HistoryRecorder
from synapse_ha.history.store import FILE_NAME as HISTORY_FILE
from synapse_ha.history.store import HistoryStore
from synapse_ha.leader.liveness import Liveness
from synapse_ha.leader.loop import STALL_MS, LeaderLoop, LoopSettings
from synapse_ha.leader.scheduling import DesiredSettings
from synapse_ha.leader.slow_nodes import SlowNodes, SlowNodeSettings
from synapse_ha.observe.dashboard import Dashboard
from synapse_ha.observe.http import ObserveServer
from synapse_ha.observe.metrics import ReplicaMetrics
from synapse_ha.programs.config_file import ConfigError, load_program_config, stop_on_signals
from synapse_ha.programs.log_queue import queued_logging, stop_queued_logging
from synapse_ha.programs.read_config import read_gates
from synapse_ha.programs.scheduler_config import SchedulerConfig, load_config
from synapse_ha.raft.channel import TLS_CHANNEL
from synapse_ha.raft.replica import RaftReplica
from synapse_ha.raft.restore import RestoreError, seed_restored_state
from synapse_ha.raft.snapshot_file import SnapshotMember
from synapse_ha.rpc.auth import AuthInterceptor, identify_token, token_hash
from synapse_ha.rpc.nudge import WorkerNudger
from synapse_ha.rpc.server import ReplicaAddress, ReplicaContext, build_server
from synapse_ha.rpc.server.format_gate import FormatGate
from synapse_ha.rpc.stream import StreamFirstNudger, StreamServer
from synapse_ha.security.grants import GrantClaims, sign_grant
from synapse_ha.security.tls import Transport, peer_identity

log = logging.getLogger("synapse.scheduler")

# The user the bootstrap admin token names, and how long a log grant lasts.
BOOTSTRAP_ADMIN = "admin"
GRANT_TTL_S = 300.0


# ------------------------------------------------------------------------ running


def tune_gc(collect: bool = True) -> None:
    """Keep the cyclic garbage collector's pauses short on a large state.

    The replicated state of a big cluster is millions of long-lived objects; a full
    collection walks all of them and, landing inside the apply lock or a heartbeat, stalls
    it for a hundred milliseconds and more. Objects alive now (the state loaded from the
    snapshot and the journal) are moved out of the collector's view, and the youngest
    generation is collected less often. Called at start (``collect``: a collection first,
    over what the imports left) and once the replica has caught up, without one: that
    collection would walk the whole state just loaded (0.25 s at 40,000 jobs, holding the
    interpreter as the replica starts to serve) and find nothing, since decoding and
    applying make no reference cycles.
    """
    if collect:
        gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def slow_node_settings(config: SchedulerConfig) -> SlowNodeSettings:
    """How this replica, when it leads, weighs its members' paces (docs/slow-nodes.md)."""
    return SlowNodeSettings(
        window_ms=config.slow_node_window_ms,
        rule=SlownessRule(threshold_pct=config.slow_node_threshold_pct),
    )


class SteadyClock:
    """Wall-clock milliseconds that a step of the system clock does not move.

    The reading is the wall clock when the process started plus the monotonic time since.
    Everything the leader measures with it (silence before a dead declaration, start
    timeouts, time limits, back-offs, retention) is therefore a real elapsed duration: a
    clock stepped forward or back while the replica runs changes nothing until the replica
    restarts. The monotonic clock is slewed by NTP like the wall clock, so its rate stays
    true; only steps are left out. Timestamps written into replicated commands come from
    the proposing leader's reading: across a leader change they can differ by the skew
    between the two machines' clocks when their replicas started (docs/chaos.md, "Clocks").
    """

    def __init__(
        self,
        wall_ns: Callable[[], int] = time.time_ns,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._monotonic_ns = monotonic_ns
        self._start_monotonic_ns = monotonic_ns()
        self._start_wall_ns = wall_ns()

    def __call__(self) -> int:
        elapsed = self._monotonic_ns() - self._start_monotonic_ns
        return (self._start_wall_ns + elapsed) // 1_000_000


_now_ms = SteadyClock()


def _history_recorder(config: SchedulerConfig) -> HistoryRecorder | None:
    """The recorder of the replica's history and events, when it keeps them."""
    if not config.history:
        return None
    store = HistoryStore(os.path.join(config.data_dir, HISTORY_FILE))
    return HistoryRecorder(store, EventRing(config.event_ring))


class Replica:
    """Wires the Raft replica, the leader loop and the gRPC server together."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.stopping = threading.Event()
        self._wake = threading.Event()
        self._roles: queue.SimpleQueue[tuple[bool, int, int]] = queue.SimpleQueue()
        self.liveness = Liveness()
        # The leader's evidence of slow nodes, never replicated.
        self.slow_nodes = SlowNodes(slow_node_settings(config))
        self.transport = Transport(config.tls)
        self.nudger = WorkerNudger(
            channel_factory=self.transport.channel, credentials_version=self.transport.version
        )
        # Workers with a heartbeat stream get pushes on it; the others nudges.
        self.stream_nudger = StreamFirstNudger(None, self.nudger)
        self._bootstrap_proposed_at = 0.0
        self._bootstrapped = False
        self.history = _history_recorder(config)
        self.raft = self._raft_replica()
        self.metrics = ReplicaMetrics(
            config.replica_id, self.raft, last_plan=lambda: self.loop.last_plan
        )
        self.loop = self._leader_loop()
        self.context = self._replica_context()
        self.server = build_server(
            self.context, config.me.grpc, auth=self._auth(), add_port=self.transport.add_port
        )
        self.streams = self._stream_server()
        self._driver = threading.Thread(target=self._drive, name="leader-loop", daemon=True)
        self._format_gate = threading.Thread(
            target=FormatGate(self.context).run,
            args=(self.stopping,),
            name="format-gate",
            daemon=True,
        )
        self.observe: ObserveServer | None = None
        if config.metrics_address:
            self._serve_observe(config.metrics_address)

    def _raft_replica(self) -> RaftReplica:
        """This replica's Raft node. A restored replica starts a new cluster alone; the
        others join it one by one."""
        config = self.config
        me = config.me
        partners = [me] if config.restore else list(config.replicas)
        return RaftReplica(
            me.raft,
            [r.raft for r in partners],
            config.data_dir,
            config.raft_password,
            secure=config.tls is not None,
            raft_tls=config.tls if config.raft_transport == TLS_CHANNEL else None,
            timing=config.timing,
            on_role_change=self._role_changed,
            on_applied=self._wake.set,
            directory={r.raft: (r.replica_id, r.grpc) for r in config.replicas},
            join=config.join,
            observer=self.history,
            fsync=config.raft_fsync,
        )

    def _leader_loop(self) -> LeaderLoop:
        config = self.config
        return LeaderLoop(
            self.raft,
            self.metrics.proposer(self.raft),
            self.liveness,
            config.replica_id,
            settings=LoopSettings(),
            rng=random.Random(),
            desired=DesiredSettings(config.timeouts, config.locality_wait_ms, config.scheduling),
            nudger=self.stream_nudger,
            wake=self._wake.set,
            slow_nodes=self.slow_nodes,
        )

    def _replica_context(self) -> ReplicaContext:
        """What the gRPC services serve from."""
        config = self.config
        read_gate, leader_read_gate = read_gates(
            config.heavy_reads, config.heavy_read_cpu_share, config.leader_read_cpu_share
        )
        return ReplicaContext(
            self_id=config.replica_id,
            replicas=MemberDirectory(self.raft, config.me),
            backend=self.raft,
            liveness=self.liveness,
            serving=lambda: self.loop.ready and self.raft.leads_with_quorum(),
            clock_ms=_now_ms,
            last_plan=lambda: self.loop.last_plan,
            read_gate=read_gate,
            leader_read_gate=leader_read_gate,
            peer_channel=self.transport.channel,
            grant_signer=self._sign_grant if config.tls is not None else None,
            membership=self.raft,
            history=self.history.store if self.history else None,
            events=self.history.ring if self.history else None,
            pinned_limits=config.scheduling.pinned_limits,
            follows_live_leader=self.raft.follows_live_leader,
            paces=self.slow_nodes,
        )

    def _auth(self) -> AuthInterceptor | None:
        """Token authentication of the gRPC services; none without TLS."""
        if self.config.tls is None:
            return None
        return AuthInterceptor(
            lambda: self.raft.snapshot().tokens, _now_ms, identify_peer=peer_identity
        )

    def _stream_server(self) -> StreamServer | None:
        """The workers' heartbeat streams, when the replica has an agent address."""
        if not self.config.agent_address:
            return None
        assert self.context.auth is not None  # set by build_server
        streams = StreamServer(
            self.context, self.config.agent_address, self.context.auth, self.transport.add_port
        )
        self.stream_nudger.streams = streams
        self.metrics.watch_streams(streams)
        return streams

    def _serve_observe(self, metrics_address: str) -> None:
        """The metrics endpoint and the dashboard, which shows every replica."""
        config = self.config
        others = [r.grpc for r in config.replicas if r.replica_id != config.replica_id]
        self.dashboard = Dashboard(
            [config.me.grpc, *others], self.transport, clock_ms=_now_ms, identify=self._who
        )
        self.observe = ObserveServer(
            metrics_address, self.metrics.registry, config.tls, app=self.dashboard
        )
        self.context.metrics_url = self.observe.metrics_url
        self.context.dashboard_url = self.observe.url + "/"

    def _who(self, token: str) -> str:
        """The dashboard's name for the viewer of ``token``: ``alice (user)``; "" when
        the token proves nobody (the API call refuses it then)."""
        identity, refusal = identify_token(token, self.raft.snapshot().tokens, _now_ms())
        if identity is None or refusal is not None:
            return ""
        return f"{identity.name} ({identity.role})"

    def _sign_grant(self, job_id: str, subject: str, node_id: str) -> tuple[str, int]:
        """A log grant for ``subject`` to read ``job_id``'s member logs on ``node_id``,
        signed with this replica's key (read afresh: certificates rotate)."""
        material = self.transport.material()
        if material is None:
            raise RuntimeError("log grants need TLS material")
        expires_at_s = time.time() + GRANT_TTL_S
        claims = GrantClaims(
            job_id=job_id, subject=subject, expires_at_s=expires_at_s, node_id=node_id
        )
        grant = sign_grant(claims, key_pem=material.key, cert_pem=material.cert)
        return grant, int(expires_at_s * 1000)

    def _bootstrap_admin(self) -> None:
        """As the serving leader, replicate the bootstrap admin token's hash once: only
        if the cluster has never had that token (a revoked one stays revoked)."""
        parsed = split_token(self.config.bootstrap_token)
        if parsed is None or self._bootstrapped:
            return
        if not self.loop.ready or not self.raft.is_leader():
            return  # followers never look: no snapshot on every loop tick
        token_id, secret = parsed
        if token_id in self.raft.snapshot().tokens:
            self._bootstrapped = True  # replicated (and maybe revoked since): never again
            return
        now = time.monotonic()
        if now - self._bootstrap_proposed_at < 1.0:
            return
        self._bootstrap_proposed_at = now
        self.raft.propose(
            cmd.CreateToken(
                token_id=token_id,
                user=BOOTSTRAP_ADMIN,
                role=Role.ADMIN,
                secret_sha256=token_hash(secret),
                queues=(),
                expires_at_ms=0,
                now_ms=_now_ms(),
                actor="bootstrap",
            )
        )
        log.info("replicating the bootstrap admin token %s (user %s)", token_id, BOOTSTRAP_ADMIN)

    def _role_changed(self, is_leader: bool, term: int) -> None:
        self._roles.put((is_leader, term, _now_ms()))
        self._wake.set()

    def start(self) -> None:
        self.server.start()
        if self.streams is not None:
            self.streams.start()
            host = self.streams.address.rpartition(":")[0]
            if host in ("0.0.0.0", "::", "[::]"):
                host = self.config.me.grpc.rpartition(":")[0]
            self.context.stream_address = f"{host}:{self.streams.port}"
            log.info("heartbeat streams at %s", self.context.stream_address)
        if self.observe is not None:
            self.observe.start()
            log.info("metrics at %s, dashboard at %s/", self.observe.metrics_url, self.observe.url)
        self._driver.start()
        self._format_gate.start()
        log.info(
            "replica %s started: raft %s, grpc %s, data %s",
            self.config.replica_id,
            self.config.me.raft,
            self.config.me.grpc,
            self.config.data_dir,
        )

    def _drive(self) -> None:
        said_ready = False
        last = ""
        # Each round (a short wait, then a step), the wall time this process neither slept
        # on purpose nor spent on a CPU is time it did not run (stopped, starved): the
        # leader was not reading heartbeats then (LeaderLoop.note_not_running). A long
        # scheduling pass uses CPU, so it is not mistaken for one.
        round_wall, round_cpu = time.monotonic(), time.process_time()
        while not self.stopping.is_set():
            due_ms = self.loop.next_step_in_ms(_now_ms())
            timeout_s = 0.05 if due_ms is None else min(0.05, due_ms / 1000)
            self._wake.wait(timeout_s)
            self._wake.clear()
            wall, cpu = time.monotonic(), time.process_time()
            stalled_ms = int(((wall - round_wall) - (cpu - round_cpu) - timeout_s) * 1000)
            round_wall, round_cpu = wall, cpu
            try:
                if stalled_ms >= STALL_MS:
                    self.loop.note_not_running(stalled_ms, _now_ms())
                while True:
                    try:
                        is_leader, term, at = self._roles.get_nowait()
                    except queue.Empty:
                        break
                    self.loop.on_role_change(is_leader, term, at)
                    log.info("%s leadership in term %d", "gained" if is_leader else "lost", term)
                # No note_state_changed() here: the loop plans when a command was applied
                # since its last pass (and every schedule_period_ms), not on every wake.
                self.metrics.note_leader(self.raft.leader_address())
                step_started = time.perf_counter()
                sentence = self.loop.step(_now_ms())
                self.metrics.observe_step(self.loop.last_plan, time.perf_counter() - step_started)
                self._bootstrap_admin()
                for notable in self.loop.take_notable():
                    log.info("%s", notable)
                if sentence != last:
                    log.debug("%s", sentence)
                last = sentence
                if not said_ready:
                    status = self.raft.status()
                    if status.ready and status.leader and status.has_quorum:
                        leader = self.context.by_raft(status.leader)
                        log.info(
                            "ready: joined the quorum as %s in term %d; leader is %s",
                            status.role,
                            status.term,
                            leader.replica_id if leader else status.leader,
                        )
                        said_ready = True
                        tune_gc(collect=False)
            except Exception:
                log.exception("leader loop step failed")

    def stop(self) -> None:
        self.stopping.set()
        self._wake.set()
        if self.streams is not None:
            self.streams.stop()
        self.server.stop(grace=1.0).wait(2.0)
        self._driver.join(timeout=2.0)
        self._format_gate.join(timeout=2.0)
        if self.observe is not None:
            self.observe.stop()
            self.dashboard.close()
        self.nudger.close()
        self.raft.stop()
        if self.history is not None:
            self.history.close()
        log.info("replica %s stopped", self.config.replica_id)


# ------------------------------------------------- membership and backup


class MemberDirectory(Sequence[ReplicaAddress]):
    """The replicas as the Raft membership has them at each read (members added or
    removed online included), this replica always among them: what GetClusterStatus
    lists and NOT_LEADER points to."""

    def __init__(self, raft: RaftReplica, me: ReplicaAddress) -> None:
        self._raft = raft
        self._me = me

    def _current(self) -> list[ReplicaAddress]:
        out = [
            ReplicaAddress(replica_id=m.replica_id, raft=m.raft, grpc=m.grpc)
            for m in self._raft.member_addresses()
        ]
        if not any(r.raft == self._me.raft for r in out):
            out.append(self._me)
        return [self._me if r.raft == self._me.raft else r for r in out]

    @overload
    def __getitem__(self, index: int) -> ReplicaAddress: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[ReplicaAddress]: ...
    def __getitem__(self, index: int | slice) -> ReplicaAddress | Sequence[ReplicaAddress]:
        return self._current()[index]

    def __len__(self) -> int:
        return len(self._current())

    def __iter__(self) -> Iterator[ReplicaAddress]:
        return iter(self._current())


def restore_into(config: SchedulerConfig) -> str:
    """Seed an empty data directory from the backup ``config.restore``; return a line
    for the log. Raises :class:`ConfigError` for a corrupt backup or a used directory."""
    try:
        with open(config.restore, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ConfigError(f"--restore {config.restore}: {exc}") from None
    try:
        backup = decode_backup(data)
    except BackupError as exc:
        raise ConfigError(f"--restore {config.restore}: {exc}") from None
    me = config.me
    try:
        seed_restored_state(
            config.data_dir,
            backup.state,
            backup.header.raft_index,
            SnapshotMember(raft=me.raft, replica_id=me.replica_id, grpc=me.grpc),
        )
    except RestoreError as exc:
        raise ConfigError(f"--restore {config.restore}: {exc}") from None
    return (
        f"restored {config.restore}: raft index {backup.header.raft_index} of replica "
        f"{backup.header.replica_id}, {len(backup.state.jobs)} jobs, "
        f"{len(backup.state.nodes)} nodes; starting a new cluster with this replica alone"
    )


def main(argv: Sequence[str] | None = None) -> int:
    handler = queued_logging()
    try:
        return _run(argv)
    finally:
        stop_queued_logging(handler)


def _run(argv: Sequence[str] | None) -> int:
    config = load_program_config("synapse-scheduler", load_config, argv, log)
    if config is None:
        return 2
    if config.restore:
        try:
            log.info("%s", restore_into(config))
        except ConfigError as exc:
            print(f"synapse-scheduler: {exc}", file=sys.stderr)
            return 2
    tune_gc()
    replica = Replica(config)
    stop = stop_on_signals(log, "stopping")
    replica.start()
    while not stop.wait(1.0):
        pass
    replica.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
