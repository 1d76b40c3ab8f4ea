"""Preemption in the chaos suite: the ``gpu-reuse`` rule on hand-made histories (a
victim's GPUs are never bound to another attempt before its members are confirmed
stopped), the ledger's GPUs read back, and the workload's queues and classes."""

from __future__ import annotations

import json
import random
from pathlib import Path

from chaos import ledger
from chaos.checker import (
    EffectRecord,
    History,
    MemberRecord,
    Submission,
    check_history,
    load_history,
    preemptions,
)
from chaos.report import most_attempts
from chaos.workload import WorkloadConfig, job_spec
from synapse_ha.core.codec.versioned import encode_state
from synapse_ha.core.model import JobState
from tests.chaos.test_chaos_checker import HEAL_WALL_MS, MS, final_state


def gang(
    job: str,
    token: int,
    attempt: int,
    start_ms: int,
    end_ms: int,
    gpus: tuple[tuple[int, ...], tuple[int, ...]],
    *,
    preempted_at_ms: int | None = None,
) -> list[MemberRecord]:
    """Both ranks of one attempt on node w1 with the given GPUs: start, heartbeats, then
    an effect and end, or (preempted) a notice, heartbeats while it drains, term."""
    out = []
    for rank in (0, 1):

        def rec(kind: str, at_ms: int, r: int = rank) -> MemberRecord:
            return MemberRecord(kind, job, attempt, token, r, "w1", at_ms * MS, 10 + r, gpus[r])

        out.append(rec("start", start_ms))
        stop = preempted_at_ms if preempted_at_ms is not None else end_ms
        out += [rec("heartbeat", t) for t in range(start_ms + 100, stop, 100)]
        if preempted_at_ms is None:
            out += [rec("effect", end_ms), rec("end", end_ms + 1)]
        else:
            out.append(rec("preempted", preempted_at_ms))
            out += [rec("heartbeat", t) for t in range(preempted_at_ms + 50, end_ms, 50)]
            out.append(rec("term", end_ms))
    return out


def effects(job: str, token: int, at_ms: int) -> list[EffectRecord]:
    return [EffectRecord(job, token, rank, True, at_ms * MS + rank) for rank in (0, 1)]


def preemption_history(preemptor_starts_ms: int) -> History:
    """j1 (token 3) runs on w1's GPUs 0-3 and is preempted at 1000 ms; it drains until
    1300 ms. j2 (token 4) then runs on GPUs 0-1 from ``preemptor_starts_ms``; j1 runs
    again later (token 5) on GPUs 2-3 and succeeds."""
    state = final_state(
        ("j1", "req-1", 5, 2, JobState.SUCCEEDED), ("j2", "req-2", 4, 1, JobState.SUCCEEDED)
    )
    members = [
        *gang("j1", 3, 1, 0, 1_300, ((0, 1), (2, 3)), preempted_at_ms=1_000),
        *gang("j2", 4, 1, preemptor_starts_ms, 3_000, ((0,), (1,))),
        *gang("j1", 5, 2, 4_000, 5_000, ((2,), (3,))),
    ]
    return History(
        members=members,
        effects=[*effects("j2", 4, 3_000), *effects("j1", 5, 5_000)],
        submissions=[Submission("req-1", "ok", "j1"), Submission("req-2", "ok", "j2")],
        replica_states={r: encode_state(state) for r in ("r1", "r2", "r3")},
        heal_wall_ms=HEAL_WALL_MS,
        final_deadline_ms=60_000,
    )


def test_a_preemptor_starting_after_its_victims_stopped_is_clean() -> None:
    history = preemption_history(preemptor_starts_ms=1_400)
    assert check_history(history) == []
    assert preemptions(history) == ["j1/3"]


def test_a_victims_gpu_bound_before_it_stopped_is_gpu_reuse() -> None:
    found = check_history(preemption_history(preemptor_starts_ms=1_150))
    assert {v.kind for v in found} == {"gpu-reuse"}
    # j1 rank 0 held GPUs 0 and 1; j2 took one with each rank: two pairs, each named once.
    assert len(found) == 2
    assert all(v.job == "j1" for v in found)
    assert "a preempted member (rank 0, token 3)" in found[0].detail
    assert "of j2 (token 4) started on it" in found[0].detail


def test_other_gpus_or_other_nodes_at_the_same_time_are_fine() -> None:
    history = preemption_history(preemptor_starts_ms=1_400)
    # Another gang on GPUs j1 never had, and one on another node's GPU 0, overlapping j1.
    history.members += [
        MemberRecord("start", "j3", 1, 9, 0, "w1", 500 * MS, 30, (4,)),
        MemberRecord("heartbeat", "j3", 1, 9, 0, "w1", 900 * MS, 30, (4,)),
        MemberRecord("start", "j4", 1, 10, 0, "w2", 500 * MS, 31, (0,)),
        MemberRecord("heartbeat", "j4", 1, 10, 0, "w2", 900 * MS, 31, (0,)),
    ]
    assert "gpu-reuse" not in {v.kind for v in check_history(history)}


def test_the_ledger_records_each_members_gpus(tmp_path: Path) -> None:
    record = {
        "type": "start", "job": "j1", "attempt": 1, "token": 3, "rank": 0, "node": "10.0.0.21",
        "mono_ns": 5, "pid": 7, "gpus": "2,3",
    }  # fmt: skip
    (tmp_path / ledger.LEDGER).write_text(json.dumps(record) + "\n")
    (tmp_path / ledger.EFFECTS).write_text("")
    (tmp_path / ledger.SUBMISSIONS).write_text("")
    (member,) = load_history(tmp_path).members
    assert member.gpus == (2, 3)


def test_the_workload_submits_to_both_queues_with_a_preempting_class() -> None:
    cfg = WorkloadConfig(
        seed=1, replicas=["127.0.0.1:1"], submissions="s", ledger="l", sink="h:1",
        stop_file="x", python="python", pythonpath=".", queue_gpus=8,
    )  # fmt: skip
    rng = random.Random(3)
    drawn = {(s.queue, s.priority_class) for s in (job_spec(cfg, rng, i) for i in range(200))}
    assert drawn == {("team-a", "low"), ("team-a", "high"), ("team-b", "low")}


def test_the_report_names_the_jobs_with_the_most_attempts() -> None:
    assert most_attempts(preemption_history(preemptor_starts_ms=1_400)) == ["j1: 2 attempts"]
    assert most_attempts(History()) == []
