"""The ``slow-node`` kind: a node turns slow under a running gang, and the leader must mark
it ``degraded`` from its members' pace (docs/slow-nodes.md), and no other node.

The chaos cluster's replicas weigh a window of each gang's paces every
:data:`chaos.nemesis.SLOW_NODE_WINDOW_S` (``--slow-node-window``), and a share of the
workload's gangs are paced (chaos/workload.py): their members do a fixed amount of CPU
work per step and append a pace line to ``$SYNAPSE_PROGRESS_FILE`` (chaos/member.py).

How it plays (:func:`play`):

* the target is a member of a paced gang that started at most :data:`FRESH_S` ago and
  plans to work on for :data:`LASTING_S` (the step's ``pick`` chooses among them): the
  worker's pace is a member's median over its whole run, so a member slow from its start
  turns it at once. Without one within :data:`FIND_S`, the nemesis submits a paced gang,
  as the workload does (recorded in ``submissions.jsonl``), and takes one of its members
  once they start (within :data:`START_WAIT_S`); without that either, the kind *found no
  paced gang*: said and recorded (``slow_found: false``), nothing throttled;
* the member's process is throttled: moved into a cgroup (v1 ``cpu`` controller) with a
  CPU quota of :data:`QUOTA_US` per :data:`PERIOD_US` (1 % of a core: a paced step's work, more
  than two quotas, then always waits out at least one period), or, where that
  controller is not writable, stopped and continued in a duty cycle (SIGSTOP for
  :data:`DUTY_STOP_S`, SIGCONT for :data:`DUTY_RUN_S`); ``slow_throttle`` says which;
* the fault lasts its duration and then waits for the node's ``degraded`` condition, at
  most :data:`MARK_WAIT_S` from the throttle (``slow_marked_ns``, ``slow_mark``);
* the heal lets the member go and tells it to finish its work (SIGUSR2: it commits at
  once), waits for it to end (at most :data:`END_WAIT_S`: its median stays slow for as
  long as it runs, and would mark the node again once uncordoned), and uncordons the node
  until the leader has cleared its mark (``slow_uncordon_ns``, ``slow_cleared``).

The record (``faults.jsonl``) also carries ``slow_node`` (the worker), ``slow_member``
(``job/tN rank r``) and ``slow_started_ns``. A fault that throttled a member and saw no
mark is a violation (``slow-node-unmarked``, chaos/slow_rules.py), and so is a mark on a
node no slow-node fault throttled, and a gang placed on a node while it was marked.

:class:`MarkWatch` follows every node's ``degraded`` condition for the whole scenario
(``degraded.jsonl``: each mark when first seen, and when seen gone), for those rules.
:func:`sweep` lets go of whatever a fault left throttled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from chaos import ledger, nemesis
from chaos.cluster import REPLACE_CPU_MILLI, REPO, ChaosCluster
from chaos.members_seen import Member, SeenMember
from chaos.steptask import pid_namespace, start_ticks
from chaos.workload import paced_spec, submit_one
from synapse_ha.client.cluster import ClusterUnavailable
from synapse_ha.core.health.slowness import DEGRADED
from synapse_ha.core.model import NodeStatus
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.states import node_status

KIND = nemesis.SLOW_NODE
MARKS = "degraded.jsonl"  # MarkWatch's records
CPU_CGROUPS = Path("/sys/fs/cgroup/cpu")  # the cgroup v1 cpu controller
CGROUP = "synapse-chaos-slow"
PERIOD_US = 100_000
QUOTA_US = 1_000
DUTY_STOP_S = 0.098
DUTY_RUN_S = 0.002  # less than a paced step's work: every step waits out a stop
FRESH_S = 1.5
LASTING_S = 12.0
FIND_S = 2.0
START_WAIT_S = 8.0
MARK_WAIT_S = 16.0
END_WAIT_S = 5.0
UNCORDON_WAIT_S = 10.0
POLL_S = 0.1
LOOK_S = 0.3  # how often the fault lists the nodes for its mark
WATCH_S = 0.5  # MarkWatch's period

Heal = Callable[[], None]


# ------------------------------------------------------------------- throttles


def cgroup_problem(root: Path = CPU_CGROUPS) -> str:
    """ "" when a cpu cgroup of ours can be made and given a quota here; else why not."""
    probe = root / f"{CGROUP}-probe"
    try:
        probe.mkdir(exist_ok=True)
        try:
            (probe / "cpu.cfs_quota_us").write_text(f"{QUOTA_US}\n")
        finally:
            with contextlib.suppress(OSError):
                probe.rmdir()
    except OSError as exc:
        return f"cgroup v1 cpu controller not writable here: {exc}"
    return ""


def _own_cgroup(pid: int) -> str:
    """The cpu cgroup ``pid`` is in (relative to the controller's root), "/" if unknown."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "cpu" in controllers.split(","):
                return path or "/"
    return "/"


class CpuQuota:
    """The cgroup backend: the process in a cgroup of its own with a CPU quota."""

    name = f"cgroup v1 cpu quota {QUOTA_US * 100 // PERIOD_US}% of a core"

    def __init__(self, pid: int, tag: str) -> None:
        self.pid = pid
        self.home = CPU_CGROUPS / _own_cgroup(pid).lstrip("/")
        self.cgroup = CPU_CGROUPS / f"{CGROUP}-{tag}"
        self.cgroup.mkdir(exist_ok=True)
        (self.cgroup / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
        (self.cgroup / "cpu.cfs_quota_us").write_text(f"{QUOTA_US}\n")
        (self.cgroup / "cgroup.procs").write_text(f"{pid}\n")

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            (self.home / "cgroup.procs").write_text(f"{self.pid}\n")
        _remove(self.cgroup)


class DutyCycle:
    """The fallback: the process (its group, when it leads one) stopped and continued."""

    name = (
        f"SIGSTOP/SIGCONT duty cycle ({DUTY_STOP_S * 1000:.0f} ms stopped of every "
        f"{(DUTY_STOP_S + DUTY_RUN_S) * 1000:.0f} ms)"
    )

    def __init__(self, pid: int, tag: str) -> None:
        del tag
        self.pid = pid
        self.group = False
        with contextlib.suppress(OSError):
            self.group = os.getpgid(pid) == pid
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._cycle, name="slow-node-duty", daemon=True)
        self.thread.start()

    def _send(self, signum: int) -> bool:
        try:
            if self.group:
                os.killpg(self.pid, signum)
            else:
                os.kill(self.pid, signum)
        except OSError:
            return False
        return True

    def _cycle(self) -> None:
        while not self.done.is_set():
            if not self._send(signal.SIGSTOP):
                return
            self.done.wait(DUTY_STOP_S)
            self._send(signal.SIGCONT)
            self.done.wait(DUTY_RUN_S)

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=2.0)
        self._send(signal.SIGCONT)


def _remove(cgroup: Path) -> None:
    """Move what is left in ``cgroup`` to the controller's root and remove it."""
    with contextlib.suppress(OSError):
        for line in (cgroup / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (CPU_CGROUPS / "cgroup.procs").write_text(f"{line}\n")
        cgroup.rmdir()


def sweep() -> list[str]:
    """Remove every cpu cgroup of ours a fault left (its processes let go)."""
    removed = []
    with contextlib.suppress(OSError):
        for child in sorted(p for p in CPU_CGROUPS.glob(f"{CGROUP}-*") if p.is_dir()):
            _remove(child)
            removed.append(f"cgroup {child}")
    return removed


# ------------------------------------------------------------------- the target


def fresh_paced(c: ChaosCluster) -> list[tuple[Member, SeenMember]]:
    """Paced members that started within :data:`FRESH_S` and plan to work on for
    :data:`LASTING_S`, newest generation, in a stable order."""
    now = ledger.now_ns()
    seen = c.members_seen
    return sorted(
        (key, m)
        for key, m in list(seen.members.items())
        if m.paced
        and not m.ended
        and m.started_ns >= now - int(FRESH_S * 1e9)
        and m.until_ns >= now + int(LASTING_S * 1e9)
        and not seen.newer_generation(key)
    )


def host_pid(m: SeenMember, proc: Path = Path("/proc")) -> int:
    """The member's process as this suite sees it (0: not found). A worker may start each
    member in a PID namespace of its own (where its pid is 2): the process is the one in
    that namespace (``ns/pid``) whose innermost pid (``NSpid``) is the member's and that
    started when it did."""
    pid, ns, ticks = m.process
    if pid <= 0:
        return 0
    if ns == pid_namespace():
        return pid if start_ticks(pid) == ticks else 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns" / "pid") != f"pid:[{ns}]":
                continue
            status = (entry / "status").read_text()
        except OSError:
            continue
        nspid = next((x.split()[1:] for x in status.splitlines() if x.startswith("NSpid:")), [])
        if nspid and nspid[-1] == str(pid) and start_ticks(int(entry.name)) == ticks:
            return int(entry.name)
    return 0


def choose(
    c: ChaosCluster, pick: int, wait_s: float, job: str = ""
) -> tuple[Member, SeenMember, int] | None:
    """A fresh paced member (of ``job`` when given) and its process as seen here, waiting
    for one up to ``wait_s``; None when none came."""
    deadline = time.monotonic() + wait_s
    while True:
        found = [(k, m) for k, m in fresh_paced(c) if not job or k[0] == job]
        if found:
            key, m = found[pick % len(found)]
            pid = host_pid(m)
            if pid:
                return key, m, pid
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_S)


def submit_paced(c: ChaosCluster, index: int, extra: dict[str, object]) -> str:
    """Submit a paced gang as the workload does; its job id ("" when not acknowledged)."""
    spec = paced_spec(
        f"chaos-{c.cfg.seed}-slow-{index}",
        sys.executable,
        str(REPO),
        str(c.dir / ledger.LEDGER),
        c.sink_address,
        REPLACE_CPU_MILLI,
    )
    with ledger.Appender(c.dir / ledger.SUBMISSIONS) as out:
        outcome, job_id = submit_one(c.observer, spec, out, 5.0)
    extra["slow_submitted"] = job_id or outcome
    return job_id


def node_of(c: ChaosCluster, worker: str) -> pb.Node | None:
    return next((n for n in c.observer.list_nodes() if n.node_id == worker), None)


def degraded(node: pb.Node | None) -> pb.NodeCondition | None:
    return next((k for k in node.conditions if k.name == DEGRADED), None) if node else None


# ---------------------------------------------------------------------- playing


def play(
    c: ChaosCluster, index: int, pick: int, extra: dict[str, object]
) -> tuple[list[str], str, Callable[[], None], Heal, Callable[[], str]]:
    """Start a slow-node fault: its targets, a sentence, what to poll while it lasts, the
    heal, and the hold (wait for the mark)."""
    chosen = choose(c, pick, FIND_S)
    parts = []
    if chosen is None:
        with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
            job = submit_paced(c, index, extra)
            if job:
                parts.append(f"no fresh paced gang: submitted {job}")
                chosen = choose(c, pick, START_WAIT_S, job)
    extra["slow_found"] = chosen is not None
    if chosen is None:
        parts.insert(0, "found no paced gang")
        extra["slow_node"] = ""
        return ["none"], "; ".join(parts), lambda: None, lambda: None, lambda: "nothing to mark"
    key, member, pid = chosen
    job, token, rank, _ = key
    worker = member.node
    backend: type[CpuQuota] | type[DutyCycle] = CpuQuota if not cgroup_problem() else DutyCycle
    try:
        throttle = backend(pid, f"{c.cfg.seed}-{index}")
    except OSError as exc:  # the member ended meanwhile
        extra.update(slow_found=False, slow_node="")
        text = f"{job}/t{token} rank {rank} could not be throttled: {exc}"
        return ["none"], text, lambda: None, lambda: None, lambda: "nothing to mark"
    started = time.monotonic()
    extra.update(
        slow_node=worker,
        slow_member=f"{job}/t{token} rank {rank}",
        slow_pid=pid,
        slow_throttle=backend.name,
        slow_started_ns=ledger.now_ns(),
        slow_marked_ns=0,
    )
    parts.insert(0, f"{job}/t{token} rank {rank} on {worker} throttled: {backend.name}")

    looked = [0.0]  # when the node was last listed

    def watch() -> None:
        if not extra["slow_marked_ns"] and time.monotonic() - looked[0] >= LOOK_S:
            looked[0] = time.monotonic()
            mark = degraded(node_of(c, worker))
            if mark is not None:
                extra.update(slow_marked_ns=ledger.now_ns(), slow_mark=mark.message[:300])

    def hold() -> str:
        while not extra["slow_marked_ns"] and time.monotonic() - started < MARK_WAIT_S:
            with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
                watch()
            time.sleep(POLL_S)
        marked_ns = int(str(extra["slow_marked_ns"]))
        if not marked_ns:
            return f"no degraded mark within {time.monotonic() - started:.1f} s"
        after = (marked_ns - int(str(extra["slow_started_ns"]))) / 1e9
        return f"marked degraded {after:.1f} s after the throttle: {extra['slow_mark']}"

    def heal() -> None:
        throttle.stop()
        with contextlib.suppress(OSError):  # it finishes its work and commits at once
            os.kill(pid, signal.SIGUSR2)
        # Until the member ends, or goes silent.
        deadline = time.monotonic() + END_WAIT_S
        while time.monotonic() < deadline:
            seen = c.members_seen.members.get(key)
            now = ledger.now_ns()
            if seen is None or seen.ended or seen.last_ns < now - int(2e9):
                break
            time.sleep(POLL_S)
        extra["slow_cleared"] = uncordon(c, worker, extra)

    return [worker], "; ".join(parts), watch, heal, hold


def uncordon(c: ChaosCluster, worker: str, extra: dict[str, object]) -> bool:
    """Uncordon ``worker`` whenever it is cordoned until it is ready with no ``degraded``
    mark (the leader clears it once an operator made the node ready); False when
    :data:`UNCORDON_WAIT_S` ran out first."""
    deadline = time.monotonic() + UNCORDON_WAIT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
            node = node_of(c, worker)
            status = node_status(node) if node is not None else None
            if status is NodeStatus.CORDONED:
                c.observer.set_node_status(worker, "uncordon", "slow-node healed")
                extra.setdefault("slow_uncordon_ns", ledger.now_ns())
            elif status is NodeStatus.READY and degraded(node) is None:
                return True
        time.sleep(POLL_S)
    return False


# ---------------------------------------------------------------------- the watch


class MarkWatch:
    """Every node's ``degraded`` condition, looked at every :data:`WATCH_S` for the whole
    scenario: ``degraded.jsonl`` gets a ``degraded`` record (node, ``since_ms``, message,
    ``seen_ns``) when a mark is first seen, a ``ready`` record when its node is first seen
    ready while marked (made ready again: the mark is about to be cleared) and a
    ``cleared`` record when it is seen gone."""

    def __init__(self, c: ChaosCluster) -> None:
        self.c = c
        self.out = ledger.Appender(c.dir / MARKS)
        self.marked: dict[str, int] = {}  # node -> since_ms of the mark it holds
        self.ready: set[tuple[str, int]] = set()  # marks whose node was seen ready
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="mark-watch", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def look(self) -> None:
        now = ledger.now_ns()
        nodes = self.c.observer.list_nodes()
        held = {n.node_id: k for n in nodes if (k := degraded(n)) is not None}
        ready = {n.node_id for n in nodes if node_status(n) is NodeStatus.READY}
        for node_id, k in sorted(held.items()):
            if self.marked.get(node_id) != k.since_ms:
                self.marked[node_id] = k.since_ms
                self.out.append(
                    {
                        "type": "degraded",
                        "node": node_id,
                        "since_ms": k.since_ms,
                        "message": k.message[:300],
                        "seen_ns": now,
                    }
                )
            if node_id in ready and (node_id, k.since_ms) not in self.ready:
                self.ready.add((node_id, k.since_ms))
                self.out.append(
                    {"type": "ready", "node": node_id, "since_ms": k.since_ms, "seen_ns": now}
                )
        for node_id in sorted(set(self.marked) - set(held)):
            since = self.marked.pop(node_id)
            self.out.append({"type": "cleared", "node": node_id, "since_ms": since, "seen_ns": now})

    def _run(self) -> None:
        while not self.done.wait(WATCH_S):
            with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
                self.look()

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=5.0)
        with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
            self.look()
        self.out.close()


def unfound(fault_files: list[Path]) -> list[str]:
    """A sentence when ``slow-node`` faults of these ``faults.jsonl`` files found no paced
    gang to throttle (said and recorded, as an elastic kind that resized nothing is)."""
    played = found = 0
    for path in fault_files:
        for r in ledger.read_records(path) if path.exists() else []:
            if r.get("kind") == KIND:
                played += 1
                found += bool(r.get("slow_found"))
    if played == found:
        return []
    return [f"{KIND}: {played - found} of {played} faults found no paced gang"]
