"""A run's saved history, as the checker reads it: the records of the members, the sink,
the submissions and the nemesis, the replicas' final states, and what the run measured
(:func:`load_history` reads a run directory written by :mod:`chaos.run`; tests build a
:class:`History` by hand).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos import ledger
from chaos.nemesis import GPU_XID, NODE_CANNOT_RUN
from synapse_ha.core.model import AttemptState, JobState

JOB_HISTORY = "job_history.json"  # the replicas' history of finished jobs (chaos.run)


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    job: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} [{self.job or '-'}]: {self.detail}"


@dataclass(frozen=True, slots=True)
class MemberRecord:
    type: str  # start | heartbeat | effect | end | term | preempted
    job: str
    attempt: int
    token: int
    rank: int
    node: str
    mono_ns: int
    pid: int
    gpus: tuple[int, ...] = ()  # the member's CUDA_VISIBLE_DEVICES
    outcome: str = ""  # an end record's: accepted | already committed | rejected | ...
    world: int = 0  # the gang's size (0: not recorded)
    pid_ns: int = 0  # the inode of the member's PID namespace (0: not recorded)
    start_ticks: int = 0  # when its process started, in clock ticks since boot (0: not recorded)
    # Its rank's generation ($SYNAPSE_MEMBER_GENERATION): 0 as bound with its attempt, one
    # more each time the rank was placed again (on_node_failure: replace).
    generation: int = 0
    # An elastic gang's member: its gang's ``<min>:<max>`` ("" for a fixed gang).
    elastic: str = ""
    # A ``preempted`` record's notice: the kind (reclaim | priority | fair_share) and the
    # preemptor's job id.
    preemption: str = ""
    preemptor: str = ""

    @property
    def member(self) -> tuple[str, int, int, int]:
        """Who wrote it: (job, fencing token, rank, generation)."""
        return (self.job, self.token, self.rank, self.generation)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """A record of an sbatch job's batch script or of one task of its job steps
    (``steps.jsonl``, :mod:`chaos.steptask`)."""

    type: str  # task-start | task-heartbeat | task-end | task-term | batch-start | batch-end
    job: str
    attempt: int
    token: int
    node: str
    mono_ns: int
    pid: int
    step: int = -1  # the job step (SLURM_STEP_ID); -1: the batch script
    task: int = -1  # the task's rank in its step (SLURM_PROCID); -1: the batch script
    pid_ns: int = 0
    start_ticks: int = 0

    @property
    def process(self) -> tuple[int, int, int]:
        """The process that wrote it: PID namespace, start time, pid."""
        return (self.pid_ns, self.start_ticks, self.pid)


@dataclass(frozen=True, slots=True)
class EffectRecord:
    job: str
    token: int
    rank: int
    accepted: bool
    mono_ns: int
    highest_before: int = 0
    done: bool = False  # refused because the job's output was already committed
    generation: int = 0  # the asking member's generation


@dataclass(frozen=True, slots=True)
class Submission:
    request_id: str
    outcome: str  # ok | failed | unknown
    job_id: str = ""  # an array's id for an array (its tasks are ``<job_id>_<index>``)
    array: str = ""  # the ``array:`` text submitted ("" for a single job)
    throttle: int = 0  # the array's throttle (0: none)
    sbatch: bool = False  # an sbatch job (chaos.workload.batch_script)


@dataclass(frozen=True, slots=True)
class FaultRecord:
    """What the nemesis did (``faults.jsonl``), as far as the checker needs it."""

    kind: str
    targets: tuple[str, ...]
    start_ns: int
    end_ns: int  # the heal: for a freeze, the thaw
    frozen: tuple[tuple[str, int], ...] = ()  # freeze-host: (job, token) running there
    frozen_node: str = ""  # freeze-host: the frozen host as member records name it
    declared_dead_ns: int = 0  # freeze-host: when the leader declared the frozen node dead
    # freeze-host: frozen (job, token) with no newer attempt started at the thaw (the bound
    # ran out): nothing could refuse their resumed members' first writes.
    unfenced: tuple[tuple[str, int], ...] = ()
    declared_dead: tuple[str, ...] = ()  # clock jumps: ready nodes declared dead during it
    # Clock jumps: for each node declared dead, an upper bound on its silence at the
    # declaration (its silence before the jump plus the time until it was seen dead), and
    # the cluster's dead timeout. Without a bound the declaration counts as early.
    silence_bound_ms: tuple[tuple[str, int], ...] = ()
    dead_timeout_ms: int = 0


@dataclass(frozen=True, slots=True)
class GpuUnhealthy:
    """A span in which the replicated state held a GPU unhealthy (a ``gpu-xid`` fault
    and its repair, or a fault still in the final state)."""

    node: str  # the worker's host, as the members' records name it
    gpu: int
    since_ms: int  # leader clock: when the fault was recorded
    # The suite's wall clock when the repair that cleared it was sent (the repair's own
    # stamp is later); 0: never repaired.
    repair_sent_ms: int = 0


@dataclass(frozen=True, slots=True)
class UnfitSpan:
    """A span in which the replicated state held a node unfit for an owner: from the
    failure that marked it (``until_ms - backoff_ms``) to ``until_ms`` (leader clock)."""

    node: str  # the node's id
    owner: str
    until_ms: int
    backoff_ms: int

    @property
    def since_ms(self) -> int:
        return self.until_ms - self.backoff_ms


@dataclass(frozen=True, slots=True)
class AttemptHistory:
    """One ended attempt of a finished job, as the replicas' history keeps it."""

    number: int
    token: int
    state: AttemptState
    bound_at_ms: int
    outcome_code: str  # a ReasonCode value ("gpu_unhealthy", ...)
    nodes: tuple[str, ...] = ()  # the nodes it was bound to (empty: not recorded)
    ended_at_ms: int = 0  # leader clock (0: not recorded)
    outcome: str = ""  # the outcome's sentence ("preempted by job-000012 (fair share: ...)")


@dataclass(frozen=True, slots=True)
class JobHistory:
    """A finished job as the replicas' history keeps it (``job_history.json``)."""

    job: str
    state: JobState
    reason_code: str
    requeues: int
    retries_used: int
    attempts: tuple[AttemptHistory, ...] = ()
    owner: str = ""
    queue: str = ""
    submitted_at_ms: int = 0  # leader clock
    gpus: int = 0  # what the gang asks at most (an elastic gang's max; 0: not recorded)
    min_gpus: int = 0  # at least (an elastic gang's min)
    replaces: bool = False  # on_node_failure: replace (lost members are placed again)

    @property
    def places_later(self) -> bool:
        """Whether an attempt may get members after its bind: members placed again, or an
        elastic gang grown."""
        return self.replaces or 0 < self.min_gpus < self.gpus


# A thawed supervisor must stop a superseded member within this bound (it finds its lease
# expired at its first check after the thaw).
THAW_KILL_BOUND_MS = 1_000


@dataclass(slots=True)
class History:
    members: list[MemberRecord] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)  # sbatch scripts and step tasks
    effects: list[EffectRecord] = field(default_factory=list)  # in the sink's order
    submissions: list[Submission] = field(default_factory=list)
    replica_states: dict[str, bytes] = field(default_factory=dict)  # replica id -> encoding
    heal_wall_ms: int = 0
    final_deadline_ms: int = 60_000
    final_stall_ms: int = 0  # 0: no stall bound (a run that recorded none)
    faults: list[FaultRecord] = field(default_factory=list)
    # Lines of the replicas' logs saying an applied entry was deleted, as "replica: line".
    applied_truncations: list[str] = field(default_factory=list)
    gpu_unhealthy: list[GpuUnhealthy] = field(default_factory=list)  # gpu-xid and repairs
    job_history: list[JobHistory] = field(default_factory=list)  # every attempt's bind
    unfit: list[UnfitSpan] = field(default_factory=list)  # node-cannot-run saw them


# ---------------------------------------------------------------- frozen hosts

Thaws = dict[tuple[str, int], list[tuple[str, int, int]]]


def frozen_attempts(history: History) -> Thaws:
    """(job, token) frozen with a host -> each freeze of it: (the host as members name it,
    the freeze, the thaw). A gang on several hosts can be frozen on more than one at once
    (soak lanes freeze hosts independently).

    Frozen are the attempts the nemesis listed and every attempt with a record on the host
    before the thaw: the whole host is frozen, so a member that started just before the
    freeze, too late for the nemesis's list, is frozen all the same. (An attempt that ended
    before the freeze has no record in the window, so listing it changes nothing.)"""
    freezes = [f for f in history.faults if f.kind == "freeze-host"]
    out: Thaws = defaultdict(list)
    if not freezes:
        return out
    first_on: dict[str, dict[tuple[str, int], int]] = defaultdict(dict)
    for r in history.members:
        seen = first_on[r.node]
        key = (r.job, r.token)
        if key not in seen or r.mono_ns < seen[key]:
            seen[key] = r.mono_ns
    for f in freezes:
        there = {key for key, at in first_on[f.frozen_node].items() if at <= f.end_ns}
        for job, token in sorted(there | set(f.frozen)):
            out[(job, token)].append((f.frozen_node, f.start_ns, f.end_ns))
    return out


def in_thaw_window(r: MemberRecord, thaws: Thaws) -> bool:
    """A record of a frozen attempt on a host frozen with it, written while frozen (from
    the freeze) or at most ``THAW_KILL_BOUND_MS`` after the thaw. An ``effect`` record here
    is a request the member made before its supervisor could kill it: whether the sink
    accepted it is ``stale-write``'s question."""
    bound = THAW_KILL_BOUND_MS * 1_000_000
    return any(
        r.node == node and frozen <= r.mono_ns <= thawed + bound
        for node, frozen, thawed in thaws.get((r.job, r.token), ())
    )


# What pysyncobj logs when a replica deletes entries it has applied.
APPLIED_TRUNCATED = "truncating already-applied log entries"


# ---------------------------------------------------------------------- loading


def load_history(run_dir: Path) -> History:
    """Read a run directory written by :mod:`chaos.run`."""
    history = History()
    for r in ledger.read_records(run_dir / ledger.LEDGER):
        history.members.append(
            MemberRecord(
                type=str(r["type"]),
                job=str(r["job"]),
                attempt=int(r["attempt"]),
                token=int(r["token"]),
                rank=int(r["rank"]),
                node=str(r.get("node", "")),
                mono_ns=int(r["mono_ns"]),
                pid=int(r.get("pid", 0)),
                gpus=tuple(int(g) for g in str(r.get("gpus", "")).split(",") if g.strip()),
                outcome=str(r.get("outcome", "")),
                world=int(r.get("world", 0)),
                pid_ns=int(r.get("pid_ns", 0)),
                start_ticks=int(r.get("start_ticks", 0)),
                generation=int(r.get("generation", 0)),
                elastic=str(r.get("elastic", "")),
                preemption=str(r.get("preemption", "")),
                preemptor=str(r.get("preemptor", "")),
            )
        )
    history.steps = load_steps(run_dir / ledger.STEPS)
    for r in ledger.read_records(run_dir / ledger.EFFECTS):
        if r.get("type", "effect") != "effect":
            continue  # a member's claim of its token (chaos.sink)
        history.effects.append(
            EffectRecord(
                job=str(r["job"]),
                token=int(r["token"]),
                rank=int(r["rank"]),
                accepted=bool(r["accepted"]),
                mono_ns=int(r["mono_ns"]),
                highest_before=int(r.get("highest_before", 0)),
                done=bool(r.get("done", False)),
                generation=int(r.get("generation", 0)),
            )
        )
    outcomes: dict[str, Submission] = {}
    for r in ledger.read_records(run_dir / ledger.SUBMISSIONS):
        rid = str(r["request_id"])
        array, throttle = str(r.get("array", "")), int(r.get("throttle", 0))
        sbatch = bool(r.get("sbatch", False))
        if r["type"] == "begin":
            outcomes.setdefault(rid, Submission(rid, "unknown", "", array, throttle, sbatch))
        else:
            job_id = str(r.get("job_id", ""))
            outcomes[rid] = Submission(rid, str(r["type"]), job_id, array, throttle, sbatch)
    history.submissions = list(outcomes.values())
    for r in ledger.read_records(run_dir / ledger.FAULTS):
        history.faults.append(
            FaultRecord(
                kind=str(r["kind"]),
                targets=tuple(str(t) for t in r.get("targets", [])),
                start_ns=int(r["start_ns"]),
                end_ns=int(r["end_ns"]),
                frozen=tuple((str(j), int(t)) for j, t in r.get("frozen", [])),
                frozen_node=str(r.get("frozen_node", "")),
                declared_dead_ns=int(r.get("declared_dead_ns", 0)),
                unfenced=tuple((str(j), int(t)) for j, t in r.get("unfenced", [])),
                declared_dead=tuple(str(n) for n in r.get("declared_dead", [])),
                silence_bound_ms=tuple(
                    sorted((str(n), int(ms)) for n, ms in r.get("silence_bound_ms", {}).items())
                ),
                dead_timeout_ms=int(r.get("dead_timeout_ms", 0)),
            )
        )
    for log in sorted(run_dir.glob("r*.log")):
        with open(log, encoding="utf-8", errors="replace") as f:
            history.applied_truncations += [
                f"{log.stem}: {line.strip()}" for line in f if APPLIED_TRUNCATED in line
            ]
    states_dir = run_dir / "replica_states"
    if states_dir.is_dir():
        for path in sorted(states_dir.glob("*.state")):
            history.replica_states[path.stem] = path.read_bytes()
    meta_path = run_dir / "meta.json"
    if meta_path.exists():
        meta: dict[str, Any] = json.loads(meta_path.read_text(encoding="utf-8"))
        history.heal_wall_ms = int(meta.get("heal_wall_ms", 0))
        history.final_deadline_ms = int(meta.get("final_deadline_ms", history.final_deadline_ms))
        history.final_stall_ms = int(meta.get("final_stall_ms", 0))
    history.gpu_unhealthy = load_gpu_spans(run_dir)
    history.job_history = load_job_history(run_dir / JOB_HISTORY)
    history.unfit = load_unfit_spans(run_dir)
    return history


def load_steps(path: Path) -> list[StepRecord]:
    return [
        StepRecord(
            type=str(r["type"]),
            job=str(r["job"]),
            attempt=int(r["attempt"]),
            token=int(r["token"]),
            node=str(r.get("node", "")),
            mono_ns=int(r["mono_ns"]),
            pid=int(r.get("pid", 0)),
            step=int(r.get("step", -1)),
            task=int(r.get("task", -1)),
            pid_ns=int(r.get("pid_ns", 0)),
            start_ticks=int(r.get("start_ticks", 0)),
        )
        for r in ledger.read_records(path)
    ]


def load_unfit_spans(run_dir: Path) -> list[UnfitSpan]:
    """The unfit entries the ``node-cannot-run`` faults saw in the node list."""
    return [
        UnfitSpan(str(r["unfit_node"]), str(owner), int(until), int(r["unfit_backoff_ms"]))
        for r in ledger.read_records(run_dir / ledger.FAULTS)
        if r.get("kind") == NODE_CANNOT_RUN
        for owner, until in r.get("unfit_seen", [])
    ]


def load_gpu_spans(run_dir: Path) -> list[GpuUnhealthy]:
    """The spans the end-of-run repairs (``meta.json``) and the ``gpu-xid`` faults saw."""
    meta_path = run_dir / "meta.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.exists() else {}
    records = [
        *meta.get("gpu_repairs", []),
        *(r for r in ledger.read_records(run_dir / ledger.FAULTS) if r.get("kind") == GPU_XID),
    ]
    return [s for r in records for s in gpu_spans(r)]


def gpu_spans(record: dict[str, Any]) -> list[GpuUnhealthy]:
    """The unhealthy spans a ``gpu-xid`` record (or an end-of-run repair) saw."""
    return [
        GpuUnhealthy(
            str(record["gpu_node_address"]), int(record["gpu"]), int(span[0]), int(span[1])
        )
        for span in record.get("gpu_unhealthy_ms", [])
    ]


def load_job_history(path: Path) -> list[JobHistory]:
    if not path.exists():
        return []
    return [
        JobHistory(
            job=str(j["job"]),
            state=JobState(j["state"]),
            reason_code=str(j["reason_code"]),
            requeues=int(j["requeues"]),
            retries_used=int(j["retries_used"]),
            attempts=tuple(
                AttemptHistory(
                    int(a["number"]),
                    int(a["token"]),
                    AttemptState(a["state"]),
                    int(a["bound_at_ms"]),
                    str(a["outcome_code"]),
                    tuple(str(n) for n in a.get("nodes", [])),
                    int(a.get("ended_at_ms", 0)),
                    str(a.get("outcome", "")),
                )
                for a in j["attempts"]
            ),
            owner=str(j.get("owner", "")),
            queue=str(j.get("queue", "")),
            submitted_at_ms=int(j.get("submitted_at_ms", 0)),
            gpus=int(j.get("gpus", 0)),
            min_gpus=int(j.get("min_gpus", 0)),
            replaces=bool(j.get("replaces", False)),
        )
        for j in json.loads(path.read_text(encoding="utf-8"))
    ]


# ------------------------------------------------------- what the report counts


def preemptions(history: History) -> list[str]:
    """``job/token`` of every attempt with a member that got a preemption notice."""
    return sorted({f"{r.job}/{r.token}" for r in history.members if r.type == "preempted"})


# End-record outcomes after which a chaos member exits 0 (chaos/member.py).
_EXITS_ZERO = ("accepted", "already committed")


def reruns(history: History) -> list[str]:
    """Jobs that ran again after an attempt had finished: every rank of it wrote its end
    record with an outcome it exits 0 on, and a newer attempt started after the last of
    them. The job had succeeded; the leader learned it too late (a lost or late success
    report)."""
    started: dict[tuple[str, int], set[int]] = defaultdict(set)
    world: dict[tuple[str, int], int] = {}
    first_start: dict[tuple[str, int], int] = {}
    ended: dict[tuple[str, int], dict[int, int]] = defaultdict(dict)
    for r in history.members:
        key = (r.job, r.token)
        if r.world:
            world[key] = r.world
        if r.type == "start":
            started[key].add(r.rank)
            first_start[key] = min(first_start.get(key, r.mono_ns), r.mono_ns)
        elif r.type == "end" and r.outcome in _EXITS_ZERO:
            ended[key][r.rank] = r.mono_ns
    out: set[str] = set()
    for (job, token), ranks in ended.items():
        key = (job, token)
        gang = set(range(world[key])) if key in world else started[key]
        if set(ranks) != gang:
            continue  # a rank never ran, or did not end: the attempt did not finish
        finished = max(ranks.values())
        if any(j == job and t > token and at > finished for (j, t), at in first_start.items()):
            out.add(job)
    return sorted(out)


def reruns_after_unfinished(history: History) -> list[str]:
    """Jobs the sink told "already committed" that :func:`reruns` does not count: the
    attempt that committed was stopped (killed, fenced, frozen) before every rank had
    ended, so nothing could know the job had succeeded."""
    return sorted({e.job for e in history.effects if e.done} - set(reruns(history)))
