"""The cluster of one chaos scenario: replicas, workers, the submitting client and the
sink, each in a network namespace of its own (:mod:`chaos.net`), started and observed by
:class:`ChaosCluster`.

The observer thread follows the replicas' roles (``leaders.jsonl``) and tails the member
ledger to know which gangs run where (the nemesis aims worker faults with it); the
scenario's own calls go through one admin client over mutual TLS.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from chaos import hosts, ledger, net
from chaos.members_seen import SeenMembers
from chaos.nemesis import SLOW_NODE_THRESHOLD_PCT, SLOW_NODE_WINDOW_S, FaultTimeouts, Step
from chaos.workload import PACED_SHARE, WorkloadConfig, write_config
from synapse_ha.client.cluster import ClusterClient, ClusterUnavailable
from synapse_ha.core.cluster_config import MAX_REQUEUES_LIMIT
from synapse_ha.core.membership import ReplicaRole
from synapse_ha.core.model import NodeStatus
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
# Read by a replica only on the password Raft channel (raft.transport = password); the
# chaos cluster's replicas talk Raft over mutual TLS.
RAFT_PASSWORD = "eR82Q9ICx+bbMKByoNMieHUaHiAj/sFAQSHOPhNEmAI="
SINK_PORT = 7900
RAFT_PORT = 7001
GRPC_PORT = 7101
WORKER_PORT = 7070
WORKER_GPUS = 4
WORKER_CPUS = 8
SUBMIT_INTERVAL_S = 1.2  # between the client's submissions (one lane)
# The share of submissions that wait (afterok) for the job acknowledged before them.
DEPENDENCY_SHARE = 0.2
# The share of submissions that are job arrays of small gangs (chaos/workload.py), some
# throttled: the throttle must hold through the faults (chaos/array_rules.py).
ARRAY_SHARE = 0.15
# The share of submissions that are sbatch jobs with background job steps, in place of as
# many gangs (chaos/workload.py, chaos/step_rules.py).
SBATCH_SHARE = 0.15
# The share of single gangs submitted with on_node_failure: replace (chaos/workload.py):
# the replacement kinds aim at them (chaos/replacefaults.py), and every other fault that
# hits one has its lost member placed again (chaos/replace_rules.py).
REPLACE_SHARE = 0.2
# The share of the other single gangs submitted elastic, replicas: {min, max}
# (chaos/workload.py): the elastic kinds grow and shrink them (chaos/elasticfaults.py),
# and the leader shrinks them for gangs that wait for room all through a run.
ELASTIC_SHARE = 0.25
# What each member of such a gang asks of a worker's memory (16 GiB): more than half, so
# that a node holds one elastic member at most; elastic-shrink's waiting gang asks as much
# per member, one more than the nodes have room for (chaos/elasticfaults.py).
WORKER_MEMORY_MIB = 16 * 1024
ELASTIC_MEMORY_MIB = WORKER_MEMORY_MIB // 2 + 1024
# What each member of such a gang asks of a worker's CPUs: more than half, so that no two
# of them share a node (the scheduler would pack a gang onto one node, and a node lost
# with every member of its gang requeues the gang whole: nothing is left to replace).
REPLACE_CPU_MILLI = WORKER_CPUS * 1000 // 2 + 500

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
# How long a node that could not start a member skips that owner's gangs: short, so that
# a node healed of ``node-cannot-run`` runs gangs again within the scenario.
UNFIT_BACKOFF_S = 2.0


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
    array_share: float = ARRAY_SHARE
    sbatch_share: float = SBATCH_SHARE
    replace_share: float = REPLACE_SHARE
    elastic_share: float = ELASTIC_SHARE
    paced_share: float = PACED_SHARE  # paced gangs (chaos/workload.py, chaos/slowfaults.py)
    # Followers terminate the workers' heartbeat streams (docs/relay.md).
    relay_heartbeats: bool = False

    @property
    def dir_name(self) -> str:
        return f"{self.name}-seed{self.seed}"


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


# The records that start a process of an attempt on a host: a member's, an sbatch job's
# batch script's and a step task's (chaos.steptask).
STARTS = ("start", "batch-start", "task-start")


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
                    # Ended gangs keep their GPUs until their members are confirmed stopped.
                    "--hold-until-stopped",
                    *PRIORITY_CLASSES,
                    f"--max-requeues={max_requeues(cfg.steps)}",
                    f"--unfit-backoff={_duration_flag(UNFIT_BACKOFF_S)}",
                    f"--slow-node-window={_duration_flag(SLOW_NODE_WINDOW_S)}",
                    f"--slow-node-threshold={SLOW_NODE_THRESHOLD_PCT}",
                    *(["--relay-heartbeats"] if cfg.relay_heartbeats else []),
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
                    f"--cpu={WORKER_CPUS}",
                    "--memory=16Gi",  # WORKER_MEMORY_MIB
                    f"--mock-gpus={WORKER_GPUS}",
                    f"--topology=rack=rack{1 + i % 2}",
                    f"--heartbeat-interval={_duration_flag(t.heartbeat_s)}",
                    f"--lease-ttl={_duration_flag(t.lease_ttl_s)}",
                    "--fence-grace=200ms",
                    "--stop-grace=1s",
                    "--no-cgroups",
                    f"--mock-gpu-faults={self.gpu_fault_file(h.name)}",
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
        # sbatch jobs' scripts and step tasks: they run on the hosts as members do.
        self.steps_tail = LedgerTail(run_dir / ledger.STEPS)
        self.last_beat: dict[str, int] = {}  # worker name -> newest member record time
        self.last_start: dict[str, int] = {}  # worker name -> newest member start time
        # (job, token, worker) -> newest record time: which gangs run where.
        self.last_seen: dict[tuple[str, int, str], int] = {}
        self.newest_token: dict[str, int] = {}  # job -> highest token with a start record
        # (job, token, worker) -> the GPUs its members there started on.
        self.gpus_seen: dict[tuple[str, int, str], set[int]] = {}
        self.node_by_address = {h.address: h.name for h in self.worker_hosts}
        # Members by (job, token, rank, generation): ranks placed again (replacement).
        self.members_seen = SeenMembers()
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

    def gpu_fault_file(self, worker: str) -> Path:
        """The worker's mock GPU fault file (``gpu-xid`` appends to it): in the run
        directory, not on the worker's small disk, which a disk fault fills."""
        return self.dir / f"{worker}.gpu-faults"

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        net.create(self.hosts)
        for h in [*self.replica_hosts, *self.worker_hosts]:
            # A small disk of its own, which the disk-full faults fill.
            hosts.mount_disk(self.dir / h.name)
        for h in self.worker_hosts:
            self.gpu_fault_file(h.name).touch()
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
                queue_gpus=self.cfg.workers * WORKER_GPUS,
                dependency_share=DEPENDENCY_SHARE,
                array_share=self.cfg.array_share,
                sbatch_share=self.cfg.sbatch_share,
                replace_share=self.cfg.replace_share,
                elastic_share=self.cfg.elastic_share,
                elastic_memory_mib=ELASTIC_MEMORY_MIB,
                paced_share=self.cfg.paced_share,
                replace_cpu_milli=REPLACE_CPU_MILLI,
                steps=str(self.dir / ledger.STEPS),
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
        for record in [*self.ledger_tail.read(), *self.steps_tail.read()]:
            node = self.node_by_address.get(str(record.get("node", "")).rpartition(":")[0])
            if node is None:
                node = self.node_by_address.get(str(record.get("node", "")), "")
            if node:
                at = int(str(record["mono_ns"]))
                self.last_beat[node] = max(self.last_beat.get(node, 0), at)
                if record.get("type") in STARTS:
                    self.last_start[node] = max(self.last_start.get(node, 0), at)
                    job, token = str(record["job"]), int(str(record["token"]))
                    if record.get("type") == "start":
                        # A member claims its token at the sink as it starts; an sbatch
                        # job's script and tasks claim nothing (its commit step's members
                        # do): a freeze waits for a newer attempt that has claimed.
                        self.newest_token[job] = max(self.newest_token.get(job, 0), token)
                    gpus = str(record.get("gpus", "")).split(",")
                    held = self.gpus_seen.setdefault((job, token, node), set())
                    held.update(int(g) for g in gpus if g.strip().isdigit())
                key = (str(record["job"]), int(str(record["token"])), node)
                self.last_seen[key] = max(self.last_seen.get(key, 0), at)
                if "rank" in record:
                    self.members_seen.saw(record, node, at)

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

    def held_gpus(self, worker: str, within_s: float = 0.6) -> set[int]:
        """The GPUs of ``worker`` held by gangs whose members there wrote a record in the
        last ``within_s``."""
        horizon = ledger.now_ns() - int(within_s * 1e9)
        return {
            gpu
            for (job, token, node), at in self.last_seen.items()
            if node == worker and at >= horizon
            for gpu in self.gpus_seen.get((job, token, node), ())
        }

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
