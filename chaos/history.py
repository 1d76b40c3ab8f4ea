"""A run's saved history, as the checker reads it: the records of the members, the sink,
the submissions and the nemesis, the replicas' final states, and what the run measured
(:func:`load_history` reads a run directory written by :mod:`chaos.run`; tests build a
:class:`History` by hand).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos import ledger


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


@dataclass(frozen=True, slots=True)
class EffectRecord:
    job: str
    token: int
    rank: int
    accepted: bool
    mono_ns: int
    highest_before: int = 0
    done: bool = False  # refused because the job's output was already committed


@dataclass(frozen=True, slots=True)
class Submission:
    request_id: str
    outcome: str  # ok | failed | unknown
    job_id: str = ""


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


# A thawed supervisor must stop a superseded member within this bound (it finds its lease
# expired at its first check after the thaw).
THAW_KILL_BOUND_MS = 1_000


@dataclass(slots=True)
class History:
    members: list[MemberRecord] = field(default_factory=list)
    effects: list[EffectRecord] = field(default_factory=list)  # in the sink's order
    submissions: list[Submission] = field(default_factory=list)
    replica_states: dict[str, bytes] = field(default_factory=dict)  # replica id -> encoding
    heal_wall_ms: int = 0
    final_deadline_ms: int = 60_000
    final_stall_ms: int = 0  # 0: no stall bound (a run that recorded none)
    faults: list[FaultRecord] = field(default_factory=list)
    # Lines of the replicas' logs saying an applied entry was deleted, as "replica: line".
    applied_truncations: list[str] = field(default_factory=list)


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
            )
        )
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
            )
        )
    outcomes: dict[str, Submission] = {}
    for r in ledger.read_records(run_dir / ledger.SUBMISSIONS):
        rid = str(r["request_id"])
        if r["type"] == "begin":
            outcomes.setdefault(rid, Submission(rid, "unknown"))
        else:
            outcomes[rid] = Submission(rid, str(r["type"]), str(r.get("job_id", "")))
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
    return history
