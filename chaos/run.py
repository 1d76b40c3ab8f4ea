"""One chaos scenario end to end: build the network, start the cluster and the workload,
play the nemesis schedule, heal, quiesce, collect the replicas' states and check.

:func:`run_scenario` owns everything it creates: namespaces, links, the nftables table and
every process are removed in its ``finally`` (and swept before it starts, in case an
earlier run crashed). The caller holds :func:`chaos.net.machine_lock`, so that only one
run uses the machine at a time.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc

from chaos import hosts, ledger, membership, nemesis, net
from chaos.checker import Violation, check_run
from chaos.nemesis import FaultTimeouts, Step
from chaos.workload import WorkloadConfig, write_config
from synapse_ha.client.cluster import ClusterClient, ClusterUnavailable
from synapse_ha.core.codec import decode_state
from synapse_ha.core.membership import ReplicaRole
from synapse_ha.core.model import MAX_REQUEUES_LIMIT, NodeStatus
from synapse_ha.local.commands import Peer
from synapse_ha.local.launcher import Launcher
from synapse_ha.local.process import Process, Replica, Worker
from synapse_ha.programs.worker_config import (
    UNSAFE_NO_SELF_FENCING_ENV,
    UNSAFE_NO_SELF_FENCING_FLAG,
)
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.rpc.states import job_state, node_status, replica_role
from synapse_ha.security.bundle import LOOPBACK_HOSTS, ClusterCredentials
from synapse_ha.security.tls import Transport

log = logging.getLogger("chaos")

REPO = Path(__file__).resolve().parent.parent
RAFT_PASSWORD = "eR82Q9ICx+bbMKByoNMieHUaHiAj/sFAQSHOPhNEmAI="
SINK_PORT = 7900
RAFT_PORT = 7001
GRPC_PORT = 7101
WORKER_PORT = 7070
WORKER_GPUS = 4
# After the heal the cluster drains its backlog: the run waits while jobs keep finishing
# and gives up when none has for FINAL_STALL_S (a healed cluster that finishes nothing
# for that long is stuck; between finishes it takes a few seconds), or at the cap,
# FINAL_DEADLINE_S per unit of lane load (a five-lane soak leaves hundreds of jobs).
FINAL_STALL_S = 60.0
FINAL_DEADLINE_S = 270.0
SUBMIT_INTERVAL_S = 1.2  # between the client's submissions (one lane)


def lane_load(lanes: int) -> float:
    """How much longer the final cap and the gap between submissions are with
    ``lanes`` fault schedules at once: each worker lane keeps some workers faulted, so the
    cluster completes fewer gangs a second, and the same submission rate would leave a
    backlog no deadline drains (one lane: 1; three: 2)."""
    return (lanes + 1) / 2


CONVERGE_S = 30.0
GANG_WAIT_S = 20.0
# The workload's classes (chaos.workload): short grace periods keep preempted gangs from
# holding their GPUs long when a fault stops them from exiting.
PRIORITY_CLASSES = (
    "--priority-class=low=-100,grace=2s",
    "--priority-class=normal=0,grace=2s",
    "--priority-class=high=100,preempts,grace=2s",
)
# Scenarios inject a fault every few seconds: a gang can be disrupted far more often than
# a production cluster's default of 5 requeues allows, and must still finish. A fault
# disrupts a gang at most once (it ends the attempt on the hosts it holds), so a bound of
# one requeue per fault of the schedule is never reached by the faults alone.
MIN_REQUEUES = 50


def max_requeues(steps: list[Step]) -> int:
    """The scenario's ``--max-requeues``: one per fault of its schedule, at least 50, at
    most what the scheduler accepts."""
    return min(MAX_REQUEUES_LIMIT, max(MIN_REQUEUES, len(steps)))


_PROXY_VARS = ("http_proxy", "https_proxy", "grpc_proxy", "HTTP_PROXY", "HTTPS_PROXY")


@dataclass(frozen=True, slots=True)
class ScenarioConfig:
    name: str  # targeted | random | broken-build
    seed: int
    steps: list[Step]
    member_ms: tuple[int, int] = (1500, 5000)
    submit_interval_s: float = SUBMIT_INTERVAL_S
    gang_sizes: tuple[int, ...] = (2, 3)
    gpus_per_member: tuple[int, ...] = (1, 2)
    unsafe_no_self_fencing: bool = False
    workers: int = 4
    timeouts: FaultTimeouts = field(default_factory=FaultTimeouts)
    replicas: int = 3  # five for the membership scenario (chaos/membership.py)

    @property
    def dir_name(self) -> str:
        return f"{self.name}-seed{self.seed}"


@dataclass
class ScenarioResult:
    name: str
    seed: int
    run_dir: Path
    faults: int
    jobs: int
    violations: list[Violation]
    expect_violations: bool
    error: str = ""
    lanes: int = 1

    @property
    def passed(self) -> bool:
        if self.error:
            return False
        return bool(self.violations) if self.expect_violations else not self.violations


# ------------------------------------------------------------------- helpers


class SinkFailed(Exception):
    """The sink exited before it listened (its address taken, e.g. by a sink a killed run
    left behind): every member would fail to reach it."""


def sink_listening(sink: Process, address: str) -> bool:
    """Whether the sink listens on ``address`` (it says so in its log); raises
    :class:`SinkFailed` at once if it exited instead."""
    if not sink.alive:
        raise SinkFailed(
            f"the sink exited (code {sink.returncode}) before it listened on {address}; "
            f"its log ends: {sink.log_tail(400).strip()!r}"
        )
    return f"sink listening on {address}" in sink.log_tail(4000)


class InsecureCluster(Exception):
    """A replica answered a plaintext call: the cluster under test is not the secure one."""


def _duration_flag(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


class LedgerTail:
    """New complete records of an append-only file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def read(self) -> list[dict[str, object]]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()
        out = []
        for line in lines:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    out.append(record)
        return out


# -------------------------------------------------------------------- cluster


class ChaosCluster:
    """Replicas, workers, the client's submitter and the sink of one scenario."""

    def __init__(self, cfg: ScenarioConfig, run_dir: Path, freezer: bool = False) -> None:
        self.cfg = cfg
        self.dir = run_dir
        self.freezer = freezer
        t = cfg.timeouts
        self.replica_hosts = [
            net.Host(f"r{i}", f"{net.SUBNET_PREFIX}{10 + i}") for i in range(1, cfg.replicas + 1)
        ]
        self.worker_hosts = [
            net.Host(f"w{i}", f"{net.SUBNET_PREFIX}{20 + i}") for i in range(1, cfg.workers + 1)
        ]
        self.client_host = net.Host("client", f"{net.SUBNET_PREFIX}30")
        self.sink_address = f"{net.BRIDGE_ADDRESS}:{SINK_PORT}"
        self.grpc = {h.name: f"{h.address}:{GRPC_PORT}" for h in self.replica_hosts}
        env = {k: v for k, v in os.environ.items() if k not in _PROXY_VARS}
        env["PYTHONPATH"] = str(REPO)
        # Secure as a real cluster is: mutual TLS on every connection and the admin token
        # bootstrapped on the replicas. Replicas and workers are dialled at their
        # namespace addresses, so every certificate names all of them.
        self.credentials = ClusterCredentials.ensure(
            run_dir / "credentials",
            hosts=[*LOOPBACK_HOSTS, *(h.address for h in self.hosts)],
        )
        # The suite's own calls (the observer, the submitter) are the admin's.
        self.admin_tls = self.credentials.admin_tls()
        # Every process runs inside its host's namespace (``ip netns exec`` execs it, so
        # the pid is the program's own) and leads a process group of its own.
        self.launcher = Launcher(run_dir, env=env, credentials=self.credentials)
        peers = [
            Peer(h.name, f"{h.address}:{RAFT_PORT}", f"{h.address}:{GRPC_PORT}")
            for h in self.replica_hosts
        ]
        self.replicas: dict[str, Replica] = {
            h.name: self.launcher.replica(
                peer,
                peers,
                run_dir / h.name,
                extra=[
                    f"--heartbeat-interval={_duration_flag(t.heartbeat_s)}",
                    f"--lease-ttl={_duration_flag(t.lease_ttl_s)}",
                    f"--leader-step-down={_duration_flag(t.leader_step_down_s)}",
                    f"--dead-timeout={_duration_flag(t.dead_timeout_s)}",
                    "--election-min=400ms",
                    f"--election-max={_duration_flag(t.election_max_s)}",
                    "--compact-state",
                    *PRIORITY_CLASSES,
                    f"--max-requeues={max_requeues(cfg.steps)}",
                ],
                log_path=run_dir / f"{h.name}.log",
                env={
                    **env,
                    "SYNAPSE_RAFT_PASSWORD": RAFT_PASSWORD,
                    **hosts.clock_env(self.clock_file(h.name), env["PYTHONPATH"]),
                },
                prefix=net.exec_prefix(h),
                name=h.name,
            )
            for h, peer in zip(self.replica_hosts, peers, strict=True)
        }
        worker_env = dict(env)
        unsafe_flags: list[str] = []
        if cfg.unsafe_no_self_fencing:
            worker_env[UNSAFE_NO_SELF_FENCING_ENV] = "1"
            unsafe_flags = [UNSAFE_NO_SELF_FENCING_FLAG]
        self.workers: dict[str, Worker] = {
            h.name: self.launcher.worker(
                list(self.grpc.values()),
                h.name,
                run_dir / h.name,
                listen=f"{h.address}:{WORKER_PORT}",
                extra=[
                    "--cpu=8",
                    "--memory=16Gi",
                    f"--mock-gpus={WORKER_GPUS}",
                    f"--topology=rack=rack{1 + i % 2}",
                    f"--heartbeat-interval={_duration_flag(t.heartbeat_s)}",
                    f"--lease-ttl={_duration_flag(t.lease_ttl_s)}",
                    "--fence-grace=200ms",
                    "--stop-grace=1s",
                    "--no-cgroups",
                    *unsafe_flags,
                ],
                log_path=run_dir / f"{h.name}.log",
                env=worker_env,
                # In the host's cgroup (when the freezer works here): the supervisors and
                # members the agent spawns inherit it, so one write freezes them all.
                prefix=(
                    [*hosts.cgroup_prefix(hosts.host_cgroup(h.name)), *net.exec_prefix(h)]
                    if freezer
                    else net.exec_prefix(h)
                ),
                name=h.name,
            )
            for i, h in enumerate(self.worker_hosts)
        }
        self.submitter = Process(
            "client",
            [sys.executable, "-m", "chaos.workload", str(run_dir / "workload.json")],
            run_dir / "client.log",
            env=dict(env),
            prefix=net.exec_prefix(self.client_host),
        )
        self.sink: Process | None = None
        self.observer = ClusterClient(
            list(self.grpc.values()),
            timeout_s=5.0,
            per_try_timeout_s=1.0,
            channel_factory=Transport(self.admin_tls).channel,
        )
        self.leader = ""
        self.leaders_out = ledger.Appender(run_dir / ledger.LEADERS)
        self.ledger_tail = LedgerTail(run_dir / ledger.LEDGER)
        self.last_beat: dict[str, int] = {}  # worker name -> newest member record time
        self.last_start: dict[str, int] = {}  # worker name -> newest member start time
        # (job, token, worker) -> newest record time: which gangs run where.
        self.last_seen: dict[tuple[str, int, str], int] = {}
        self.newest_token: dict[str, int] = {}  # job -> highest token with a start record
        self.node_by_address = {h.address: h.name for h in self.worker_hosts}
        self._stop_observer = threading.Event()
        self._observer = threading.Thread(target=self._observe, name="observer", daemon=True)

    @property
    def hosts(self) -> list[net.Host]:
        return [*self.replica_hosts, *self.worker_hosts, self.client_host]

    @property
    def processes(self) -> list[Process]:
        return [*self.replicas.values(), *self.workers.values(), self.submitter]

    def address(self, name: str) -> str:
        return next(h.address for h in self.hosts if h.name == name)

    def clock_file(self, replica: str) -> Path:
        return self.dir / f"{replica}.clock"

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        net.create(self.hosts)
        for h in [*self.replica_hosts, *self.worker_hosts]:
            # A small disk of its own, which the disk-full faults fill.
            hosts.mount_disk(self.dir / h.name)
        self.sink = self.launcher.process(
            "sink",
            [sys.executable, "-m", "chaos.sink", self.sink_address, str(self.dir / ledger.EFFECTS)],
            log_path=self.dir / "sink.log",
        )
        sink = self.sink
        self.wait("the sink to listen", lambda: sink_listening(sink, self.sink_address), 15.0)
        for p in self.replicas.values():
            self.launcher.start(p)
        self._observer.start()
        self.wait("a serving leader", self._serving_leader, 60.0)
        self.check_plaintext_refused()
        for w in self.workers.values():
            self.launcher.start(w)
        self.wait("every worker to register", self._all_registered, 120.0)
        write_config(
            WorkloadConfig(
                seed=self.cfg.seed,
                replicas=list(self.grpc.values()),
                submissions=str(self.dir / ledger.SUBMISSIONS),
                ledger=str(self.dir / ledger.LEDGER),
                sink=self.sink_address,
                stop_file=str(self.dir / "stop-workload"),
                python=sys.executable,
                pythonpath=str(REPO),
                member_ms=self.cfg.member_ms,
                interval_s=self.cfg.submit_interval_s,
                gang_sizes=self.cfg.gang_sizes,
                gpus_per_member=self.cfg.gpus_per_member,
                tls_ca=str(self.admin_tls.ca),
                tls_cert=str(self.admin_tls.cert),
                tls_key=str(self.admin_tls.key),
                queue_gpus=self.cfg.workers * WORKER_GPUS // 2,
            ),
            self.dir / "workload.json",
        )
        self.launcher.start(self.submitter)

    def restart(self, p: Process) -> None:
        """Start a killed replica or worker again (same command, same log)."""
        self.launcher.start(p)

    def close(self) -> None:
        self._stop_observer.set()
        with contextlib.suppress(RuntimeError):
            self._observer.join(timeout=5.0)
        try:
            # The sink outlives the members' last writes: stop the cluster first.
            self.launcher.stop_all(self.processes, grace_s=3.0)
        finally:
            self.launcher.close()
        self.observer.close()
        self.leaders_out.close()

    @staticmethod
    def wait(what: str, probe: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(grpc.RpcError, ClusterUnavailable, OSError):
                if probe():
                    return
            time.sleep(0.1)
        raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")

    # --------------------------------------------------------------- observing

    def _local_status(self, name: str) -> pb.ReplicaStatus | None:
        try:
            answer = self.observer.scheduler(self.grpc[name]).GetClusterStatus(
                pb.GetClusterStatusRequest(local_only=True), timeout=0.5
            )
        except grpc.RpcError:
            return None
        return answer.replicas[0] if answer.replicas else None

    def _observe(self) -> None:
        seen: dict[str, tuple[str, int]] = {}
        while not self._stop_observer.wait(0.2):
            best: tuple[int, str] = (-1, "")
            for name, process in self.replicas.items():
                status = None if process.paused else self._local_status(name)
                role = (
                    "down"
                    if not process.alive
                    else "paused"
                    if process.paused
                    else str(replica_role(status) or "unknown")
                    if status
                    else str(ReplicaRole.UNREACHABLE)
                )
                term = status.term if status else 0
                if role == ReplicaRole.LEADER and term > best[0]:
                    best = (term, name)
                if seen.get(name) != (role, term):
                    seen[name] = (role, term)
                    self.leaders_out.append(
                        {
                            "type": "role",
                            "replica": name,
                            "role": role,
                            "term": term,
                            "mono_ns": ledger.now_ns(),
                        }
                    )
            if best[1]:
                self.leader = best[1]
            self._read_ledger()

    def _read_ledger(self) -> None:
        for record in self.ledger_tail.read():
            node = self.node_by_address.get(str(record.get("node", "")).rpartition(":")[0])
            if node is None:
                node = self.node_by_address.get(str(record.get("node", "")), "")
            if node:
                at = int(str(record["mono_ns"]))
                self.last_beat[node] = max(self.last_beat.get(node, 0), at)
                if record.get("type") == "start":
                    self.last_start[node] = max(self.last_start.get(node, 0), at)
                    job, token = str(record["job"]), int(str(record["token"]))
                    self.newest_token[job] = max(self.newest_token.get(job, 0), token)
                key = (str(record["job"]), int(str(record["token"])), node)
                self.last_seen[key] = max(self.last_seen.get(key, 0), at)

    def _serving_leader(self) -> bool:
        if not self.leader:
            return False
        stub = pb_grpc.SchedulerServiceStub(self.observer.channel(self.grpc[self.leader]))  # type: ignore[no-untyped-call]
        stub.ListNodes(pb.ListNodesRequest(), timeout=1.0)
        return True

    def check_plaintext_refused(self) -> None:
        """Every replica must turn away a caller without TLS; :class:`InsecureCluster`
        when one answers."""
        for name, address in self.grpc.items():
            with grpc.insecure_channel(address) as channel:
                stub = pb_grpc.SchedulerServiceStub(channel)  # type: ignore[no-untyped-call]
                try:
                    stub.GetClusterStatus(pb.GetClusterStatusRequest(local_only=True), timeout=2.0)
                except grpc.RpcError:
                    continue
            raise InsecureCluster(f"replica {name} at {address} answered a plaintext call")

    def _all_registered(self) -> bool:
        nodes = self.observer.list_nodes()
        return sum(1 for n in nodes if node_status(n) is NodeStatus.READY) == len(self.workers)

    def busy_workers(self, within_s: float = 0.6, fresh_s: float = 0.0) -> list[str]:
        """Workers whose members wrote a ledger record in the last ``within_s``; with
        ``fresh_s``, only those where a member started in the last ``fresh_s``."""
        now = ledger.now_ns()
        busy = sorted(
            n
            for n, t in self.last_beat.items()
            if t >= now - int(within_s * 1e9) and self.workers[n].alive
        )
        if fresh_s > 0:
            return [n for n in busy if self.last_start.get(n, 0) >= now - int(fresh_s * 1e9)]
        return busy

    def running_gangs(self, workers: list[str] | None = None, within_s: float = 0.6) -> list[str]:
        """``job/token@worker`` for members that wrote a record in the last ``within_s``."""
        horizon = ledger.now_ns() - int(within_s * 1e9)
        return sorted(
            f"{job}/t{token}@{node}"
            for (job, token, node), at in self.last_seen.items()
            if at >= horizon and (workers is None or node in workers)
        )

    def followers(self) -> list[str]:
        return sorted(n for n in self.replicas if n != self.leader)

    def in_flight_submission(self) -> bool:
        path = self.dir / ledger.SUBMISSIONS
        if not path.exists():
            return False
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - 600))
            tail = f.read().decode(errors="replace").strip().splitlines()
        return bool(tail) and '"type":"begin"' in tail[-1]

    def fresh_leader(self, timeout_s: float = 20.0) -> str:
        self.wait("a leader", lambda: bool(self.leader) and self._leader_role(), timeout_s)
        return self.leader

    def _leader_role(self) -> bool:
        status = self._local_status(self.leader)
        return status is not None and replica_role(status) is ReplicaRole.LEADER

    # ---------------------------------------------------------------- quiesce

    def all_jobs_final(self) -> tuple[int, int]:
        """(jobs in a final state, jobs in all)."""
        jobs = self.observer.list_jobs()
        final = [j for j in jobs if job_state(j).finished]
        return len(final), len(jobs)

    def collect_states(self) -> dict[str, pb.GetReplicaStateResponse]:
        return {name: self.observer.replica_state(addr) for name, addr in self.grpc.items()}


# -------------------------------------------------------------------- faults


# After the newer attempts of a frozen host's gangs started, how long the thaw waits for
# their members' token claims to reach the sink.
CLAIM_SETTLE_S = 0.3


class Nemesis:
    """Plays steps against a :class:`ChaosCluster`, logging each to ``faults.jsonl``."""

    def __init__(self, cluster: ChaosCluster, lane: int = 0, lanes: int = 1) -> None:
        self.c = cluster
        self.lane = lane
        self.owner = f"lane{lane}"  # its part of the nftables sets (chaos/net.py)
        self.pool = nemesis.worker_pool(sorted(cluster.workers), lane, lanes)
        self.out = ledger.Appender(cluster.dir / ledger.FAULTS)
        self._watch: Callable[[], None] | None = None  # polled while a fault lasts

    def close(self) -> None:
        self.out.close()

    def wait_for_gangs(self, need_worker: bool) -> list[str]:
        """Wait (bounded) until gangs run. For a fault aimed at a worker, prefer workers
        where a gang member has just started, so that the fault hits a gang in the middle
        of its run rather than at its end; fall back to any busy worker."""

        def mine(workers: list[str]) -> list[str]:
            return [w for w in workers if w in self.pool]

        deadline = time.monotonic() + GANG_WAIT_S
        while time.monotonic() < deadline:
            fresh = mine(self.c.busy_workers(fresh_s=1.0))
            if fresh or (not need_worker and mine(self.c.busy_workers())):
                return fresh or mine(self.c.busy_workers())
            time.sleep(0.02)
        busy = mine(self.c.busy_workers())
        if busy or not need_worker:
            return busy
        # Nothing ran: any live worker, or (none alive) any worker at all.
        return sorted(w for w in self.pool if self.c.workers[w].alive) or list(self.pool)

    def play(self, step: Step) -> dict[str, object]:
        c = self.c
        time.sleep(step.gap_before_s)
        worker_fault = step.kind in (
            nemesis.CUT_WORKER_FROM_LEADER,
            nemesis.CUT_WORKER_FROM_REPLICAS,
            nemesis.KILL_WORKER,
            nemesis.PAUSE_WORKER,
            nemesis.FREEZE_HOST,
            nemesis.DISK_FULL_WORKER,
        )
        busy = self.wait_for_gangs(worker_fault)
        leader = c.fresh_leader()
        rng = random.Random(step.pick)
        replicas = [h.address for h in c.replica_hosts]
        targets: list[str] = []
        detail = ""
        start_ns = ledger.now_ns()
        heal: Callable[[], None] = lambda: net.set_blocked([], self.owner)  # noqa: E731
        extra: dict[str, object] = {}
        hold: Callable[[], str] | None = None  # waits past the duration; says what it saw
        if step.kind == nemesis.ISOLATE_LEADER:
            targets = [leader]
            others = [h.address for h in c.hosts if h.name != leader]
            net.set_blocked(net.cut([c.address(leader)], others), self.owner)
        elif step.kind == nemesis.ISOLATE_FOLLOWER:
            targets = [rng.choice(c.followers())]
            others = [h.address for h in c.hosts if h.name != targets[0]]
            net.set_blocked(net.cut([c.address(targets[0])], others), self.owner)
        elif step.kind == nemesis.BRIDGE:
            bridge, far = rng.sample(c.followers(), 2)
            targets = [leader, bridge, far]
            detail = f"{bridge} sees both {leader} and {far}, who cannot see each other"
            net.set_blocked(net.cut([c.address(leader)], [c.address(far)]), self.owner)
        elif step.kind in (nemesis.CUT_WORKER_FROM_LEADER, nemesis.CUT_WORKER_FROM_REPLICAS):
            worker = busy[step.pick % len(busy)]
            peers = [c.address(leader)] if step.kind == nemesis.CUT_WORKER_FROM_LEADER else replicas
            targets = [worker]
            detail = f"cut from {'leader ' + leader if len(peers) == 1 else 'every replica'}"
            net.set_blocked(net.cut([c.address(worker)], peers), self.owner)
        elif step.kind == nemesis.PARTITION_CLIENT:
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline and not c.in_flight_submission():
                time.sleep(0.002)
            caught = c.in_flight_submission()
            net.set_blocked(net.cut([c.client_host.address], replicas), self.owner)
            targets = ["client"]
            detail = (
                "cut while a submission was in flight"
                if caught
                else ("cut between submissions (none was in flight within 10 s)")
            )
        elif step.kind == nemesis.KILL_LEADER:
            targets = [leader]
            victim: Process = c.replicas[leader]
            victim.kill()
            heal = lambda: c.restart(victim)  # noqa: E731
        elif step.kind == nemesis.KILL_ALL_REPLICAS:
            targets = sorted(c.replicas)
            for p in c.replicas.values():
                p.kill()

            def restart_all() -> None:
                for p in c.replicas.values():
                    c.restart(p)

            heal = restart_all
        elif step.kind == nemesis.KILL_WORKER:
            worker = busy[step.pick % len(busy)]
            targets = [worker]
            killed: Process = c.workers[worker]
            killed.kill()
            heal = lambda: c.restart(killed)  # noqa: E731
        elif step.kind == nemesis.PAUSE_WORKER:
            worker = busy[step.pick % len(busy)]
            targets = [worker]
            c.workers[worker].pause()
            heal = c.workers[worker].resume
        elif step.kind == nemesis.PAUSE_LEADER:
            targets = [leader]
            c.replicas[leader].pause()
            heal = c.replicas[leader].resume
        elif step.kind in nemesis.HOST_FAULTS:
            targets, detail, heal, hold = self.play_host_fault(step, leader, busy, rng, extra)
        elif step.kind in membership.KINDS:
            targets, detail, heal = membership.play(c, step, leader, rng)
        else:
            raise ValueError(f"unknown fault {step.kind!r}")
        on_workers = [t for t in targets if t in c.workers] or None
        gangs = c.running_gangs(on_workers)
        until = time.monotonic() + step.duration_s
        while (left := until - time.monotonic()) > 0:
            if self._watch is not None:
                with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
                    self._watch()
            time.sleep(min(left, 0.1) if self._watch is not None else left)
        self._watch = None
        if hold is not None:
            detail = f"{detail}; {hold()}"
        heal()
        record: dict[str, object] = {
            "type": "fault",
            "step": step.index,
            "lane": step.lane,
            "kind": step.kind,
            "targets": targets,
            "hit": {
                "leader": leader,
                "workers_running_gangs": busy,
                "gangs_running" + (" on targets" if on_workers else ""): gangs,
            },
            "detail": detail,
            "start_ns": start_ns,
            "end_ns": ledger.now_ns(),
            **extra,
        }
        self.out.append(record)
        log.info(
            "fault %d %s on %s for %.1f s %s; gangs hit: %s",
            step.index,
            step.kind,
            targets,
            step.duration_s,
            detail,
            ", ".join(gangs) or "none",
        )
        return record

    def play_host_fault(
        self,
        step: Step,
        leader: str,
        busy: list[str],
        rng: random.Random,
        extra: dict[str, object],
    ) -> tuple[list[str], str, Callable[[], None], Callable[[], str] | None]:
        """Start a loss, freeze, disk or clock fault: targets, a sentence, how to heal,
        and (for a freeze) what to wait for after the duration."""
        c = self.c
        replicas = [h.address for h in c.replica_hosts]
        if step.kind == nemesis.PACKET_LOSS:
            pool = [leader, *sorted(c.workers)] if step.pick % 2 else [leader]
            target = rng.choice(pool)
            others = [h.address for h in c.hosts if h.name != target]
            net.set_lossy(net.cut([c.address(target)], others), self.owner)
            detail = f"{net.LOSS_PERCENT}% of packets to and from {target} dropped at random"
            return [target], detail, lambda: net.set_lossy([], self.owner), None
        if step.kind == nemesis.ONE_WAY_LOSS:
            if step.pick % 2 and busy:
                target = busy[step.pick % len(busy)]
                net.set_lossy(net.one_way([c.address(target)], replicas), self.owner)
                detail = f"{net.LOSS_PERCENT}% of packets from {target} to the replicas dropped"
            else:
                target = leader
                others = [h.address for h in c.hosts if h.name != leader]
                net.set_lossy(net.one_way([c.address(leader)], others), self.owner)
                detail = f"{net.LOSS_PERCENT}% of the leader's outgoing packets dropped"
            return [target], detail, lambda: net.set_lossy([], self.owner), None
        if step.kind == nemesis.FREEZE_HOST:
            return self._freeze(step, busy, extra)
        if step.kind in (nemesis.DISK_FULL_REPLICA, nemesis.DISK_FULL_WORKER):
            if step.kind == nemesis.DISK_FULL_REPLICA:
                names = [leader] if step.pick % 2 else c.followers()
                target = rng.choice(names)
                process: Process = c.replicas[target]
            else:
                target = busy[step.pick % len(busy)]
                process = c.workers[target]
            disk = process.data_dir if isinstance(process, Replica | Worker) else c.dir / target
            if not hosts.is_our_disk(disk):
                # A replaced replica's fresh data directory is not a disk of ours.
                return [target], f"{disk} is not a small disk: nothing filled", lambda: None, None
            taken = hosts.fill(disk)

            def heal_disk() -> None:
                hosts.unfill(disk)
                extra["alive_at_heal"] = process.alive
                # A negative code is the signal that ended it (SIGBUS: a write through a
                # memory map found no space).
                extra["exit_code_at_heal"] = process.returncode
                if not process.alive:
                    c.restart(process)

            return [target], f"{disk.name} full ({taken >> 20} MiB taken)", heal_disk, None
        # Clock jumps: the leader's wall clock moves; its monotonic clock does not.
        offset = nemesis.clock_jump_s(step.kind, step.pick)
        clock = c.clock_file(leader)
        # Each ready node's silence as the leader saw it just before the jump (-1: not
        # heard since this leader's election, so unknown and left out).
        ages = {
            n.node_id: int(n.last_heartbeat_age_ms)
            for n in c.observer.list_nodes()
            if node_status(n) is NodeStatus.READY and n.last_heartbeat_age_ms >= 0
        }
        listed = time.monotonic()
        hosts.set_clock(clock, offset)
        extra["clock_offset_s"] = offset
        extra["ready_before"] = sorted(ages)
        extra["dead_timeout_ms"] = int(c.cfg.timeouts.dead_timeout_s * 1000)
        silence: dict[str, int] = {}
        extra["declared_dead"] = []
        extra["silence_bound_ms"] = silence

        def watch() -> None:
            # A node ready when the jump came and dead now was declared dead while the
            # clock was off. Its silence at the declaration was at most its silence before
            # the jump plus the time since: a fault that ended just before the jump (a cut,
            # a killed agent) can leave a node silent long enough to die for real.
            for n in c.observer.list_nodes():
                dead = node_status(n) is NodeStatus.DEAD
                if n.node_id in ages and dead and n.node_id not in silence:
                    since = int((time.monotonic() - listed) * 1000)
                    silence[n.node_id] = ages[n.node_id] + since
            extra["declared_dead"] = sorted(silence)

        self._watch = watch

        def heal_clock() -> None:
            with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
                watch()
            hosts.set_clock(clock, 0.0)

        return [leader], f"wall clock moved by {offset:+.0f} s", heal_clock, None

    def _freeze(
        self, step: Step, busy: list[str], extra: dict[str, object]
    ) -> tuple[list[str], str, Callable[[], None], Callable[[], str] | None]:
        """Freeze a whole worker host (agent, supervisors, members) and thaw it only after
        a newer attempt of a gang it ran has started elsewhere (bounded)."""
        c = self.c
        target = busy[step.pick % len(busy)]
        horizon = ledger.now_ns() - int(0.6e9)
        frozen_gangs = {
            job: token
            for (job, token, node), at in list(c.last_seen.items())
            if node == target and at >= horizon
        }
        extra["frozen"] = sorted([job, token] for job, token in frozen_gangs.items())
        extra["frozen_node"] = c.address(target)  # as the members' records name it
        cgroup = hosts.host_cgroup(target)
        hosts.freeze(cgroup, True)
        started = time.monotonic()

        def watch() -> None:
            # When the leader declared the frozen node dead: from then on its attempts
            # are superseded, and a write of theirs after the thaw is stale.
            if "declared_dead_ns" not in extra and any(
                n.node_id == target and node_status(n) is NodeStatus.DEAD
                for n in c.observer.list_nodes()
            ):
                extra["declared_dead_ns"] = ledger.now_ns()

        self._watch = watch

        def hold() -> str:
            # Thaw once every frozen gang has a newer attempt started (its members claim
            # their token at the sink as they start, so the sink can refuse a resumed
            # member of the old one), bounded. A gang with no newer attempt by then is
            # "unfenced": nothing can refuse its resumed members' first writes.
            def unfenced() -> list[list[str | int]]:
                return sorted(
                    [job, token]
                    for job, token in frozen_gangs.items()
                    if c.newest_token.get(job, 0) <= token
                )

            deadline = started + nemesis.FREEZE_MAX_S
            while time.monotonic() < deadline:
                with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
                    watch()
                if not unfenced():
                    if frozen_gangs:
                        time.sleep(CLAIM_SETTLE_S)  # a start record comes before its claim
                    break
                time.sleep(0.05)
            waited = time.monotonic() - started
            left = unfenced()
            extra["unfenced"] = left
            if not frozen_gangs:
                return f"no gang ran there; thawed after {waited:.1f} s"
            newer = [
                f"{job}/t{c.newest_token[job]}"
                for job, token in sorted(frozen_gangs.items())
                if c.newest_token.get(job, 0) > token
            ]
            text = f"thawed {waited:.1f} s in"
            if newer:
                text += f", after newer attempts started: {', '.join(newer)}"
            if left:
                text += "; no newer attempt of: " + ", ".join(f"{j}/t{t}" for j, t in left)
            return text

        detail = "frozen whole (cgroup.freeze): " + (
            ", ".join(f"{j}/t{t}" for j, t in sorted(frozen_gangs.items())) or "no gang"
        )
        return [target], detail, lambda: hosts.freeze(cgroup, False), hold

    def heal_all(self) -> None:
        net.heal_network()
        for name in self.c.replicas:
            hosts.set_clock(self.c.clock_file(name), 0.0)
        if self.c.freezer:
            for name in self.c.workers:
                hosts.freeze(hosts.host_cgroup(name), False)
        for h in [*self.c.replica_hosts, *self.c.worker_hosts]:
            hosts.unfill(self.c.dir / h.name)
        for p in [*self.c.replicas.values(), *self.c.workers.values()]:
            p.resume()
            if not p.alive:
                self.c.restart(p)


# ------------------------------------------------------------------ scenario


def run_scenario(cfg: ScenarioConfig, out_dir: Path, backends: net.Backends) -> ScenarioResult:
    run_dir = out_dir / cfg.dir_name
    run_dir.mkdir(parents=True, exist_ok=False)
    nemesis.save(cfg.steps, run_dir / "schedule.json", scenario=cfg.name, seed=cfg.seed)
    meta: dict[str, object] = {
        "scenario": cfg.name,
        "seed": cfg.seed,
        "timeouts": asdict(cfg.timeouts),
        "backends": asdict(backends),
        "unsafe_no_self_fencing": cfg.unsafe_no_self_fencing,
        "final_deadline_ms": int(FINAL_DEADLINE_S * lane_load(nemesis.lanes_of(cfg.steps)) * 1000),
        "final_stall_ms": int(FINAL_STALL_S * 1000),
        "member_ms": list(cfg.member_ms),
        "submit_interval_s": cfg.submit_interval_s,
        "security": "mutual TLS on every connection; the suite calls as the admin",
    }
    error = ""
    faults = 0
    net.sweep()
    hosts.sweep()
    cluster = ChaosCluster(cfg, run_dir, freezer=not backends.freezer_skip)
    lanes = nemesis.lanes_of(cfg.steps)
    meta["lanes"] = lanes
    players = [Nemesis(cluster, lane, lanes) for lane in range(lanes)]
    played = [0] * lanes
    try:
        cluster.start()
        meta["start_ns"] = ledger.now_ns()
        play_lanes(players, cfg.steps, played)
        (run_dir / "stop-workload").touch()
        cluster.submitter.stop(grace_s=cluster_submit_grace())
        players[0].heal_all()
        meta["heal_ns"] = ledger.now_ns()
        meta["heal_wall_ms"] = int(time.time() * 1000)
        quiesce(cluster, meta)
    except (
        TimeoutError,
        net.NetError,
        hosts.HostError,
        ClusterUnavailable,
        grpc.RpcError,
        OSError,
        InsecureCluster,
        SinkFailed,
    ) as exc:
        error = f"{type(exc).__name__}: {exc}"
        log.error("scenario %s seed %d aborted: %s", cfg.name, cfg.seed, error)
    finally:
        faults = sum(played)
        for player in players:
            player.close()
        cluster.close()
        net.sweep()
        hosts.sweep_cgroups()
        hosts.sweep_disks(run_dir)
    meta["end_ns"] = ledger.now_ns()
    meta["error"] = error
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    violations = check_run(run_dir)
    jobs = len({str(r["job"]) for r in ledger.read_records(run_dir / ledger.LEDGER)})
    return ScenarioResult(
        name=cfg.name,
        seed=cfg.seed,
        run_dir=run_dir,
        faults=faults,
        jobs=jobs,
        violations=violations,
        expect_violations=cfg.unsafe_no_self_fencing,
        error=error,
        lanes=lanes,
    )


def play_lanes(players: list[Nemesis], steps: list[Step], played: list[int]) -> None:
    """Play each lane's steps in order, the lanes at once (one thread each), counting the
    faults played per lane in ``played``. The first error stops every lane after its
    current fault (each fault is bounded and heals itself) and is raised here."""
    if len(players) == 1:
        for step in steps:
            players[0].play(step)
            played[0] += 1
        return
    stop = threading.Event()
    errors: list[BaseException] = []

    def lane(player: Nemesis) -> None:
        try:
            for step in (s for s in steps if s.lane == player.lane):
                if stop.is_set():
                    return
                player.play(step)
                played[player.lane] += 1
        except BaseException as exc:  # re-raised in the scenario's thread below
            errors.append(exc)
            stop.set()

    threads = [
        threading.Thread(target=lane, args=(p,), name=f"nemesis-lane{p.lane}", daemon=True)
        for p in players
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def cluster_submit_grace() -> float:
    return 8.0  # one submission's deadline (5 s) plus its record


def drain(
    progress: Callable[[], tuple[int, int]],
    cap_s: float,
    stall_s: float,
    poll_s: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Poll ``progress`` (jobs final, jobs in all) until every job is final, none has
    become final for ``stall_s``, or ``cap_s`` has passed; say which. A poll that fails
    (no leader yet) counts as no progress."""
    start = clock()
    last_change, best, last = start, -1, "no answer from the cluster"
    while True:
        with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
            final, total = progress()
            last = f"{total - final} of {total} jobs not final"
            if final == total:
                return "every job final"
            if final > best:
                best, last_change = final, clock()
        now = clock()
        if now - last_change >= stall_s:
            return f"{last}: none became final for {now - last_change:.0f} s"
        if now - start >= cap_s:
            return f"{last} after {now - start:.0f} s"
        sleep(poll_s)


def quiesce(cluster: ChaosCluster, meta: dict[str, object]) -> None:
    """Wait for every job to finish (:func:`drain`) and every replica to hold the same
    state; save the states whatever happens, for the checker."""
    final_deadline_ms, final_stall_ms = meta["final_deadline_ms"], meta["final_stall_ms"]
    assert isinstance(final_deadline_ms, int) and isinstance(final_stall_ms, int)
    meta["quiesce"] = drain(cluster.all_jobs_final, final_deadline_ms / 1000, final_stall_ms / 1000)
    states_dir = cluster.dir / "replica_states"
    states_dir.mkdir(exist_ok=True)
    states: dict[str, pb.GetReplicaStateResponse] = {}
    deadline = time.monotonic() + CONVERGE_S
    while time.monotonic() < deadline:
        with contextlib.suppress(grpc.RpcError):
            states = cluster.collect_states()
            if len({s.state_sha256 for s in states.values()}) == 1:
                break
        time.sleep(0.5)
    for name, answer in states.items():
        (states_dir / f"{name}.state").write_bytes(answer.encoded_state)
        (states_dir / f"{name}.json").write_text(
            json.dumps(
                {
                    "replica_id": answer.replica_id,
                    "last_applied": answer.last_applied,
                    "state_sha256": answer.state_sha256,
                    "jobs": len(decode_state(answer.encoded_state).jobs),
                }
            )
            + "\n",
            encoding="utf-8",
        )
