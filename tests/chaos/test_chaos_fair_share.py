"""Fair-sharing preemption in the chaos suite: the workload's cohort and queues, what
preempted each attempt (the state's record and the victims' notices), the rules of
chaos/fair_rules.py on made-up histories, and the run failing without a fair-share
preemption."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from chaos import fair_rules, workload
from chaos.__main__ import fair_share_unexercised, preemption_kinds
from chaos.checker import History, MemberRecord, check_history
from chaos.history import AttemptHistory, JobHistory
from chaos.run import ScenarioResult
from synapse_ha.core.cluster_config import Cohort, Queue
from synapse_ha.core.codec.versioned import decode_state, encode_state
from synapse_ha.core.model import AttemptState, ClusterState, JobState
from synapse_ha.core.reasons import ReasonCode, reason, render
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.chaos.test_chaos_checker import MS
from tests.chaos.test_chaos_preemption import preemption_history

# ------------------------------------------------------------------ the workload


def test_the_queues_share_the_cohorts_gpus_team_b_the_least() -> None:
    assert workload.queue_nominals(16) == {"team-a": 6, "team-b": 4, "team-c": 6}
    assert sum(workload.queue_nominals(12).values()) == 12


class FakeClient:
    def __init__(self) -> None:
        self.asked: list[tuple[str, Any]] = []

    def ask(self, method: str, request: Any) -> None:
        self.asked.append((method, request))


def test_the_cohort_has_fair_sharing_preemption_on_before_its_queues(tmp_path: Path) -> None:
    cfg = workload.WorkloadConfig(
        seed=1, replicas=[], submissions="s", ledger="l", sink="h:1",
        stop_file=str(tmp_path / "stop"), python="python", pythonpath=".", queue_gpus=16,
    )  # fmt: skip
    client = FakeClient()
    workload.set_up_queues(client, cfg, tmp_path / "stop")  # type: ignore[arg-type]
    (first, cohort), *queues = client.asked
    assert first == "SetCohort"
    assert cohort.cohort == pb.Cohort(name="chaos", fair_sharing_preemption=True)
    assert {(r.queue.name, r.queue.gpu, r.queue.cohort) for _, r in queues} == {
        ("team-a", 6, "chaos"), ("team-b", 4, "chaos"), ("team-c", 6, "chaos"),
    }  # fmt: skip


# ------------------------------------------------------------------ what preempted


def outcome(preemptor: str, kind: str) -> str:
    return render(reason(ReasonCode.PREEMPTED, preemptor=preemptor, kind=kind))


def test_the_outcome_sentence_names_the_kind_and_the_preemptor() -> None:
    for kind in fair_rules.KINDS:
        assert fair_rules.parse_outcome(outcome("job-000007", kind)) == (kind, "job-000007")
    assert fair_rules.parse_outcome("every member exited 0") is None


def notice(job: str, token: int, kind: str, preemptor: str, at_ms: int = 1_000) -> MemberRecord:
    return MemberRecord(
        "preempted", job, 1, token, 0, "w1", at_ms * MS, 10, (0,),
        preemption=kind, preemptor=preemptor,
    )  # fmt: skip


def attempt(
    token: int, bound: int, ended: int, preempted_by: tuple[str, str] | None = None
) -> AttemptHistory:
    if preempted_by is None:
        return AttemptHistory(1, token, AttemptState.SUCCEEDED, bound, "all_exited_zero", (), ended)
    text = outcome(*preempted_by)
    return AttemptHistory(1, token, AttemptState.REQUEUED, bound, "preempted", (), ended, text)


def job(name: str, queue: str, gpus: int, *attempts: AttemptHistory) -> JobHistory:
    return JobHistory(
        name, JobState.SUCCEEDED, "", 0, 0, attempts, queue=queue, gpus=gpus, min_gpus=gpus
    )


def test_counts_come_from_the_state_and_else_from_the_notices() -> None:
    history = History(
        members=[notice("v1", 3, "reclaim", "p1"), notice("v2", 4, "fair_share", "p2")],
        job_history=[job("v1", "team-b", 2, attempt(3, 0, 10, ("p1", "fair_share")))],
    )
    found = fair_rules.preemptions_of(history)
    assert found[("v1", 3)].source == "state" and found[("v2", 4)].source == "notice"
    assert fair_rules.preemption_counts(history) == {"reclaim": 0, "priority": 0, "fair_share": 2}


# ------------------------------------------------------------------ the rules


def cohort_state(switch: bool = True) -> ClusterState:
    state = ClusterState()
    for name, gpu in workload.queue_nominals(16).items():
        state.queues[name] = Queue(name, gpu=gpu, cohort="chaos")
    state.cohorts["chaos"] = Cohort("chaos", fair_sharing_preemption=switch)
    return state


def fair_history(*others: JobHistory, victim_queue: str = "team-b") -> History:
    """v (4 GPUs of ``victim_queue``, token 3, bound at 1,000, ended at 5,000) preempted
    by fair share for p (team-a), with every member's notice; and ``others``."""
    victim = job("v", victim_queue, 4, attempt(3, 1_000, 5_000, ("p", "fair_share")))
    victim = replace(victim, attempts=(*victim.attempts, attempt(7, 6_000, 9_000)))
    preemptor = job("p", "team-a", 2, attempt(6, 5_100, 8_000))
    return History(
        members=[notice("v", 3, "fair_share", "p", 4_000)],
        job_history=[victim, preemptor, *others],
    )


def kinds(history: History, state: ClusterState) -> list[str]:
    return [v.kind for v in fair_rules.check_preemptions(history, state)]


def test_a_preemption_of_a_queue_borrowing_the_victims_gpus_is_clean() -> None:
    # team-b (nominal 4) also ran b2's 4 GPUs from 2,000 to 4,500: 8 held, 4 borrowed.
    history = fair_history(job("b2", "team-b", 4, attempt(11, 2_000, 4_500)))
    assert kinds(history, cohort_state()) == []


def test_a_victim_queue_that_never_borrowed_is_fair_share_unborrowed() -> None:
    # b2 ran before the victim was bound: team-b held the victim's 4 GPUs alone, its nominal.
    history = fair_history(job("b2", "team-b", 4, attempt(11, 0, 900)))
    (found,) = fair_rules.check_preemptions(history, cohort_state())
    assert found.kind == "fair-share-unborrowed" and found.job == "v"
    assert "queue team-b held at most 4 GPUs while it ran (nominal 4)" in found.detail


def test_a_waiting_preemptors_claim_counts_for_its_queue() -> None:
    # b3 of team-b preempted someone and waited from 1,500 to its bind at 5,200: its claim
    # of 4 GPUs counted for team-b meanwhile.
    b3 = job("b3", "team-b", 4, attempt(12, 5_200, 6_000))
    other = job("x", "team-a", 2, attempt(13, 0, 1_400, ("b3", "reclaim")))
    history = fair_history(replace(b3, submitted_at_ms=1_500), other)
    assert kinds(history, cohort_state()) == []
    history = fair_history(replace(b3, submitted_at_ms=1_500))  # b3 preempted nobody
    assert kinds(history, cohort_state()) == ["fair-share-unborrowed"]


def test_an_unknown_job_leaves_the_borrowing_rule_unjudged() -> None:
    history = fair_history(job("b2", "team-b", 4, attempt(11, 0, 900)))
    history.members.append(MemberRecord("start", "ghost", 1, 40, 0, "w1", MS, 10, (1,)))
    assert kinds(history, cohort_state()) == []


def test_a_victim_of_the_preemptors_own_queue_is_fair_share_queue() -> None:
    history = fair_history(job("b2", "team-a", 4, attempt(11, 2_000, 4_500)), victim_queue="team-a")
    found = fair_rules.check_preemptions(history, cohort_state())
    assert [v.kind for v in found] == ["fair-share-queue"]
    assert "both are of queue team-a" in found[0].detail


def test_queues_meeting_where_the_switch_is_off_are_fair_share_queue() -> None:
    history = fair_history(job("b2", "team-b", 4, attempt(11, 2_000, 4_500)))
    found = fair_rules.check_preemptions(history, cohort_state(switch=False))
    assert [v.kind for v in found] == ["fair-share-queue"]
    assert "meet in cohort chaos, which has it off" in found[0].detail


def test_a_notice_naming_another_kind_than_the_state_is_preemption_notice() -> None:
    history = fair_history(job("b2", "team-b", 4, attempt(11, 2_000, 4_500)))
    history.members.append(notice("v", 3, "reclaim", "p", 4_001))
    found = fair_rules.check_preemptions(history, cohort_state())
    assert [v.kind for v in found] == ["preemption-notice"]
    assert "preempted by p (reclaim); the state recorded p (fair_share)" in found[0].detail


def test_a_fair_share_victim_running_again_before_it_stopped_is_an_overlap() -> None:
    # The exactly-once rules hold a fair-share victim as every preempted gang: j1 token 3,
    # told it is preempted by fair share, writes after its next attempt (token 5) started.
    history = preemption_history(preemptor_starts_ms=1_400)
    state = decode_state(history.replica_states["r1"])
    state.queues.update(cohort_state().queues)
    state.cohorts.update(cohort_state().cohorts)
    for job_id, queue in (("j1", "team-b"), ("j2", "team-a")):
        state.jobs[job_id].spec = replace(state.jobs[job_id].spec, queue=queue)
    history.replica_states = dict.fromkeys(history.replica_states, encode_state(state))
    history.members = [
        replace(r, preemption="fair_share", preemptor="j2") if r.type == "preempted" else r
        for r in history.members
    ]
    assert check_history(history) == []
    assert fair_rules.preemption_counts(history)["fair_share"] == 1
    late = [r for r in history.members if r.job == "j1" and r.token == 3][-1]
    history.members.append(replace(late, type="heartbeat", mono_ns=4_500 * MS))
    assert "overlap" in {v.kind for v in check_history(history)}


# ------------------------------------------------------------------ the run


def result(
    tmp_path: Path, name: str, counts: dict[str, int], broken: bool = False
) -> ScenarioResult:
    run_dir = tmp_path / name
    run_dir.mkdir()
    (run_dir / "report.json").write_text(json.dumps({"preemptions": counts}))
    return ScenarioResult(name, 1, run_dir, 3, 10, [], expect_violations=broken)


def test_a_run_without_a_fair_share_preemption_is_named(tmp_path: Path) -> None:
    none = {"reclaim": 4, "priority": 2, "fair_share": 0}
    results = [
        result(tmp_path, "targeted", none),
        result(tmp_path, "broken-build", {**none, "fair_share": 3}, broken=True),
    ]
    assert preemption_kinds(results) == none
    assert "no fair-share preemption in targeted seed 1" in fair_share_unexercised(results)
    results.append(result(tmp_path, "random", {**none, "fair_share": 1}))
    assert fair_share_unexercised(results) == ""
    assert fair_share_unexercised(results[1:2]) == ""  # the broken build alone: not judged
