"""Job arrays in the chaos suite: the checker's throttle and task rules
(chaos/array_rules.py) on hand-made member ledgers, the checker at large on a finished
array, dependencies on an array (chaos/dependency_rules.py), and the workload's arrays
(chaos/workload.py) as drawn and as recorded in submissions.jsonl."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from chaos import ledger
from chaos.array_rules import check_arrays, check_tasks, check_throttle, first_excess
from chaos.checker import check_history
from chaos.dependency_rules import check_dependency_order
from chaos.history import (
    THAW_KILL_BOUND_MS,
    EffectRecord,
    FaultRecord,
    History,
    MemberRecord,
    Submission,
    load_history,
)
from chaos.report import write_report
from chaos.workload import ARRAY_TASKS, WorkloadConfig, job_spec, submit_one
from synapse_ha.core.codec.versioned import encode_state
from synapse_ha.core.model import JobState
from synapse_ha.core.workflows.arrays import parse_array
from synapse_ha.core.workflows.dependencies import Dependencies
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.core.harness import Cluster, job, node

MS = 1_000_000
ARRAY = "job-000001"


def member(job_id: str, start_ms: int, end_ms: int, *, token: int = 1, rank: int = 0,
           node_name: str = "w1") -> list[MemberRecord]:  # fmt: skip
    """One member of ``job_id``: start, a heartbeat every 100 ms, end (accepted)."""
    out = [MemberRecord("start", job_id, 1, token, rank, node_name, start_ms * MS, 10)]
    for t in range(start_ms + 100, end_ms, 100):
        out.append(MemberRecord("heartbeat", job_id, 1, token, rank, node_name, t * MS, 10))
    out.append(
        MemberRecord("end", job_id, 1, token, rank, node_name, end_ms * MS, 10, outcome="accepted")
    )
    return out


def throttled(text: str = "0-2%2", outcome: str = "ok") -> Submission:
    return Submission("req-1", outcome, ARRAY, text, parse_array(text).throttle)


def task(index: int) -> str:
    return f"{ARRAY}_{index}"


# ------------------------------------------------------------------ array-throttle


def test_three_tasks_at_once_under_a_throttle_of_two_is_a_violation() -> None:
    members = [*member(task(0), 0, 1_000), *member(task(1), 100, 900), *member(task(2), 500, 800)]
    history = History(members=members, submissions=[throttled()])
    (violation,) = check_throttle(history, None)
    assert violation.kind == "array-throttle" and violation.job == ARRAY
    assert "3 tasks ran at once (throttle 2)" in violation.detail
    assert all(task(i) in violation.detail for i in range(3))
    assert "0.500 s" in violation.detail  # the instant the third one started


def test_tasks_back_to_back_keep_the_throttle_even_when_end_and_start_touch() -> None:
    members = [
        *member(task(0), 0, 1_000),
        *member(task(1), 0, 1_000),
        *member(task(2), 1_000, 2_000),  # starts the very instant task 0 ended
        *member(task(3), 1_000, 1_500),
        *member(task(4), 1_500, 2_500),
    ]
    history = History(members=members, submissions=[throttled("0-4%2")])
    assert check_throttle(history, None) == []
    # One millisecond earlier, and task 2 overlaps the end of tasks 0 and 1.
    early = [dataclasses.replace(r, mono_ns=r.mono_ns - MS) if r.job == task(2) else r
             for r in members]  # fmt: skip
    (violation,) = check_throttle(dataclasses.replace(history, members=early), None)
    assert task(2) in violation.detail


def test_a_throttle_of_one_means_one_task_at_a_time() -> None:
    members = [*member(task(0), 0, 1_000), *member(task(1), 999, 2_000)]
    assert len(check_throttle(History(members=members, submissions=[throttled("0-1%1")]), None))
    members = [*member(task(0), 0, 1_000), *member(task(1), 1_000, 2_000)]
    assert check_throttle(History(members=members, submissions=[throttled("0-1%1")]), None) == []


def test_members_and_attempts_of_one_task_count_as_one_task() -> None:
    members = [
        *member(task(0), 0, 1_000, rank=0),
        *member(task(0), 0, 1_000, rank=1, node_name="w2"),
        *member(task(0), 800, 1_500, token=5),  # its next attempt (the overlap rule's case)
        *member(task(1), 200, 1_200),
    ]
    assert check_throttle(History(members=members, submissions=[throttled("0-1%2")]), None) == []
    assert check_throttle(History(members=members, submissions=[throttled("0-1%1")]), None)


def test_a_member_that_wrote_only_its_start_runs_at_that_instant() -> None:
    start_only = MemberRecord("start", task(2), 1, 9, 0, "w3", 500 * MS, 10)
    members = [*member(task(0), 0, 1_000), *member(task(1), 0, 1_000), start_only]
    assert check_throttle(History(members=members, submissions=[throttled()]), None)
    # At the instant the others ended it overlaps nothing.
    at_end = dataclasses.replace(start_only, mono_ns=1_000 * MS)
    members = [*member(task(0), 0, 1_000), *member(task(1), 0, 1_000), at_end]
    assert check_throttle(History(members=members, submissions=[throttled()]), None) == []


def test_unthrottled_arrays_failed_submissions_and_plain_jobs_are_not_checked() -> None:
    members = [*member(task(0), 0, 1_000), *member(task(1), 0, 1_000), *member(task(2), 0, 1_000)]
    members += [*member("job-000002", 0, 1_000), *member("job-000003", 0, 1_000)]
    for submission in (throttled("0-2"), throttled(outcome="failed"), Submission("r", "ok", "x")):
        assert check_throttle(History(members=members, submissions=[submission]), None) == []


def test_records_of_a_frozen_superseded_member_in_the_thaw_window_do_not_count() -> None:
    """Task 0's member is frozen with w1 from 500 ms to 3 s; the cluster declared w1 dead
    and gave the slot to task 2 at 2 s. The member resumes at the thaw and is killed
    within THAW_KILL_BOUND_MS: those records do not extend its span. Past the bound they
    do."""
    frozen = [*member(task(0), 0, 400), *member(task(0), 3_000, 3_300)]  # ends at the kill
    freeze = FaultRecord("freeze-host", ("w1",), 450 * MS, 3_000 * MS, ((task(0), 1),), "w1")
    others = [
        *member(task(1), 0, 5_000, node_name="w2"),
        *member(task(2), 2_000, 4_000, node_name="w3"),
    ]
    history = History(members=frozen + others, submissions=[throttled()], faults=[freeze])
    assert check_throttle(history, None) == []
    late_ms = 3_000 + THAW_KILL_BOUND_MS + 200
    late = MemberRecord("heartbeat", task(0), 1, 1, 0, "w1", late_ms * MS, 10)
    resumed = dataclasses.replace(history, members=[*history.members, late])
    (violation,) = check_throttle(resumed, None)
    assert "3 tasks ran at once" in violation.detail
    # Without the freeze, the same records are three tasks at once.
    assert check_throttle(dataclasses.replace(history, faults=[]), None)


def test_first_excess_reports_the_first_instant_and_the_tasks_running() -> None:
    spans = [("a", (0, 10)), ("b", (5, 20)), ("c", (12, 30)), ("d", (15, 16))]
    assert first_excess(spans, 2) == (15, ["b", "c", "d"])
    assert first_excess(spans, 3) is None
    assert first_excess([], 1) is None


# ------------------------------------------------------- arrays in the final state


def finished_array(text: str) -> tuple[Cluster, str]:
    """A cluster that ran every task of the array ``text`` (one rank, 8 GPUs) to success."""
    k = Cluster()
    k.add(*(node(f"n{i}", gpus=8) for i in range(4)))
    spec = dataclasses.replace(job("sweep", gpu=8), array=text)
    array_id = k.submit(spec)
    for task_id in k.state.arrays[array_id].task_ids():
        if k.state_of(task_id) is JobState.PENDING:
            k.run_pass()
        k.start_all(task_id)
        k.exit_member(task_id, 0, 0)
    assert all(j.state is JobState.SUCCEEDED for j in k.state.jobs.values())
    return k, array_id


def history_of(k: Cluster, array_id: str, outcome: str = "ok") -> History:
    """The ledger of an array whose tasks ran one after another, each with one attempt."""
    array = k.state.arrays[array_id]
    members: list[MemberRecord] = []
    effects: list[EffectRecord] = []
    for n, task_id in enumerate(array.task_ids()):
        token = k.state.jobs[task_id].fencing_token
        members += [dataclasses.replace(r, token=token)
                    for r in member(task_id, n * 1_000, n * 1_000 + 900)]  # fmt: skip
        effects.append(EffectRecord(task_id, token, 0, True, (n * 1_000 + 900) * MS))
    plan = (array.spec.array, array.throttle)
    job_id = array_id if outcome == "ok" else ""
    return History(
        members=members,
        effects=effects,
        submissions=[Submission(array.request_id, outcome, job_id, *plan)],
        replica_states={r: encode_state(k.state) for r in ("r1", "r2", "r3")},
    )


def test_a_finished_array_passes_every_rule_of_the_checker() -> None:
    """Its tasks were acknowledged as the array: neither phantoms nor a lost job."""
    k, array_id = finished_array("0-3%1")
    assert check_history(history_of(k, array_id)) == []
    assert check_history(history_of(k, array_id, outcome="unknown")) == []


def test_an_acknowledged_array_without_its_tasks_is_reported() -> None:
    k, array_id = finished_array("0-2%2")
    history = history_of(k, array_id)
    assert check_tasks(history, k.state) == []
    del k.state.jobs[f"{array_id}_1"]
    (violation,) = check_tasks(history, k.state)
    assert violation.kind == "array-tasks" and violation.job == array_id
    assert f"tasks missing from the final state: {array_id}_1" in violation.detail
    del k.state.arrays[array_id]
    problems = [v.detail for v in check_tasks(history, k.state)]
    assert any("the acknowledged array is not in the final state" in p for p in problems)


def test_tasks_must_name_their_array_and_match_what_was_submitted() -> None:
    k, array_id = finished_array("0-2%2")
    history = history_of(k, array_id)
    k.state.jobs[f"{array_id}_2"] = dataclasses.replace(
        k.state.jobs[f"{array_id}_2"], array_index=7
    )
    extra = dataclasses.replace(k.state.jobs[f"{array_id}_0"], job_id=f"{array_id}_9")
    k.state.jobs[extra.job_id] = extra
    asked_one = dataclasses.replace(history.submissions[0], array="0-2%1", throttle=1)
    details = " | ".join(v.detail for v in check_tasks(
        dataclasses.replace(history, submissions=[asked_one]), k.state))  # fmt: skip
    assert f"{array_id}_2 names array '{array_id}' index 7" in details
    assert f"jobs of the array that are not its tasks: {array_id}_9" in details
    assert "throttle 2, not [0, 1, 2] and 1" in details


def test_the_throttle_of_an_unknown_submission_comes_from_its_array_in_the_final_state() -> None:
    k, array_id = finished_array("0-2%1")
    history = history_of(k, array_id, outcome="unknown")
    assert check_arrays(history, k.state) == []
    # Every task from 0 to 900 ms instead of one after another.
    overlapping = [
        dataclasses.replace(r, mono_ns=r.mono_ns % (1_000 * MS)) for r in history.members
    ]
    (violation,) = check_arrays(dataclasses.replace(history, members=overlapping), k.state)
    assert violation.kind == "array-throttle" and violation.job == array_id


def test_a_job_waiting_for_an_array_must_start_after_every_task_finished() -> None:
    k, array_id = finished_array("0-2")
    waits = dataclasses.replace(job("eval"), dependencies=Dependencies((array_id,)))
    after = k.submit(waits)
    tasks = k.state.arrays[array_id].task_ids()
    ran = [r for n, t in enumerate(tasks) for r in member(t, n * 100, n * 100 + 1_000)]
    in_order = [*ran, *member(after, 1_300, 1_400)]
    assert check_dependency_order(History(members=in_order), k.state) == []
    early = [*ran, *member(after, 1_150, 1_400)]  # before the last task's end (1_200)
    (violation,) = check_dependency_order(History(members=early), k.state)
    assert violation.kind == "dependency-early" and violation.job == after
    assert f"afterok {array_id} (task {tasks[2]})" in violation.detail


# ------------------------------------------------------------------------ workload


def config(**more: Any) -> WorkloadConfig:
    return WorkloadConfig(
        seed=1, replicas=["127.0.0.1:1"], submissions="s", ledger="l", sink="h:1",
        stop_file="x", python="python", pythonpath=".", **more,
    )  # fmt: skip


def test_the_workload_submits_its_share_of_arrays_of_small_gangs() -> None:
    cfg = config(array_share=0.5, member_ms=(1000, 3000))
    rng = random.Random(5)
    specs = [job_spec(cfg, rng, i) for i in range(300)]
    arrays = [s for s in specs if s.array]
    assert 100 < len(arrays) < 200
    plans = [parse_array(s.array) for s in arrays]
    assert {len(p.indices) for p in plans} == set(range(ARRAY_TASKS[0], ARRAY_TASKS[1] + 1))
    assert all(p.indices == tuple(range(len(p.indices))) for p in plans)
    assert {p.throttle for p in plans} == {0, 1, 2}
    assert 0.3 < sum(1 for p in plans if p.throttle) / len(plans) < 0.7
    assert all((s.replicas, s.resources.gpu) == (2, 1) for s in arrays)
    assert all(int(s.argv.args[-1]) <= 2000 for s in arrays)  # the lower half of member_ms


def test_without_arrays_the_workload_draws_the_same_jobs_as_before() -> None:
    """``array_share`` 0 draws nothing: a seed makes the jobs it made before the field."""
    cfg = config(dependency_share=0.5)
    ours, theirs = random.Random(9), random.Random(9)
    for i in range(50):
        spec = job_spec(cfg, ours, i, "job-000004")
        duration = theirs.randint(*cfg.member_ms)
        waits = theirs.random() < cfg.dependency_share
        replicas, gpu = theirs.choice(cfg.gang_sizes), theirs.choice(cfg.gpus_per_member)
        assert not spec.array
        assert (int(spec.argv.args[-1]), spec.HasField("dependencies")) == (duration, waits)
        assert (spec.replicas, spec.resources.gpu) == (replicas, gpu)


def test_a_job_may_wait_for_an_array() -> None:
    cfg = config(dependency_share=1.0)
    spec = job_spec(cfg, random.Random(1), 0, ARRAY)
    assert list(spec.dependencies.after_ok) == [ARRAY]


class FakeClient:
    def submit_job(self, spec: pb.JobSpec, request_id: str, timeout_s: float) -> Any:
        return SimpleNamespace(job_id="job-000042")


def test_an_array_submission_is_recorded_with_its_text_and_throttle(tmp_path: Path) -> None:
    spec = pb.JobSpec(name="chaos-1-0", replicas=2, array="0-4%2")
    with ledger.Appender(tmp_path / ledger.SUBMISSIONS) as out:
        assert submit_one(FakeClient(), spec, out, 1.0) == ("ok", "job-000042")  # type: ignore[arg-type]
        submit_one(FakeClient(), pb.JobSpec(name="chaos-1-1", replicas=2), out, 1.0)  # type: ignore[arg-type]
    records = list(ledger.read_records(tmp_path / ledger.SUBMISSIONS))
    assert [(r["type"], r.get("array"), r.get("throttle")) for r in records] == [
        ("begin", "0-4%2", 2), ("ok", "0-4%2", 2), ("begin", None, None), ("ok", None, None),
    ]  # fmt: skip
    array, single = sorted(load_history(tmp_path).submissions, key=lambda s: s.array, reverse=True)
    assert (array.outcome, array.job_id, array.array, array.throttle) == (
        "ok", "job-000042", "0-4%2", 2,
    )  # fmt: skip
    assert (single.array, single.throttle) == ("", 0)
    # The report counts array submissions apart.
    (tmp_path / "meta.json").write_text("{}\n", encoding="utf-8")
    report = write_report(tmp_path, [], faults=0, jobs=0)
    assert (report["submissions"], report["array_submissions"]) == ({"ok": 2}, {"ok": 1})
