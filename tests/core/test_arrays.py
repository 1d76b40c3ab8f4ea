"""Job arrays in the core (core/workflows/arrays.py): the ``array:`` text, one command for the whole
array, the throttle at plan and at apply, cancelling an array, dependencies on an array,
purging, the codec and the format gate."""

from __future__ import annotations

import dataclasses

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.codec.formats import format_needed
from synapse_ha.core.codec.versioned import decode_state, encode_state
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, JobSpec, JobState
from synapse_ha.core.reasons import ReasonCode, render
from synapse_ha.core.snapshot import SnapshotBuilder, apply_tracked
from synapse_ha.core.spec.document import SpecError, parse_job_spec
from synapse_ha.core.workflows.arrays import (
    MAX_TASKS,
    ArrayPlan,
    ArrayTextError,
    parse_array,
    task_of,
)
from synapse_ha.core.workflows.dependencies import Dependencies
from tests.core.harness import Cluster, job, node


@pytest.mark.parametrize(
    ("text", "indices", "throttle"),
    [
        ("0-3", (0, 1, 2, 3), 0),
        ("0-99%10", tuple(range(100)), 10),
        ("1,3,5", (1, 3, 5), 0),
        ("0-8:2", (0, 2, 4, 6, 8), 0),
        ("0-98:2%4", tuple(range(0, 99, 2)), 4),
        ("7", (7,), 0),
        (" 5, 1-2 ,1 ", (1, 2, 5), 0),  # an index named twice is one task
        ("0-9999", tuple(range(10_000)), 0),
    ],
)
def test_array_texts_parse_as_slurm_reads_them(
    text: str, indices: tuple[int, ...], throttle: int
) -> None:
    assert parse_array(text) == ArrayPlan(indices, throttle)


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("", "names no task"),
        ("%3", "names no task"),
        ("0-9%0", "throttle after % must be a whole number >= 1"),
        ("0-9%x", "throttle after % must be a whole number >= 1"),
        ("5-1", "a range ends at or after its start"),
        ("0-9:0", "the step must be >= 1"),
        ("a-b", "is not an index"),
        ("-1", "is not an index"),
        ("0-10000", f"at most {MAX_TASKS} tasks"),
        ("0-5000,6000-11000", f"at most {MAX_TASKS} tasks"),
        ("0-2000000", "indices go up to 1000000"),
        ("1;2", "is not an index"),
    ],
)
def test_bad_array_texts_name_the_rule(text: str, rule: str) -> None:
    with pytest.raises(ArrayTextError, match=rule):
        parse_array(text)


def test_the_spec_field_is_checked_and_named() -> None:
    doc = {"name": "sweep", "replicas": 1, "command": "true", "array": "0-9%0"}
    with pytest.raises(SpecError) as caught:
        parse_job_spec(doc)
    assert caught.value.field == "array"
    assert "throttle" in caught.value.rule
    assert parse_job_spec({**doc, "array": "0-9%2"}).spec.array == "0-9%2"
    assert parse_job_spec({**doc, "array": 4}).spec.array == "4"
    with pytest.raises(SpecError, match="array: expected a string"):
        parse_job_spec({**doc, "array": ["0-3"]})


def sweep(text: str, gpu: int = 8, **more: object) -> JobSpec:
    return dataclasses.replace(job("sweep", gpu=gpu), array=text, **more)  # type: ignore[arg-type]


def cluster(nodes: int = 4) -> Cluster:
    k = Cluster()
    k.add(*(node(f"n{i}", gpus=8) for i in range(nodes)))
    return k


def test_one_command_makes_the_array_and_its_tasks() -> None:
    k = cluster()
    applied = k.state.applied_commands
    array_id = k.submit(sweep("0-4"))
    assert k.state.applied_commands == applied + 1
    array = k.state.arrays[array_id]
    assert array.indices == (0, 1, 2, 3, 4) and array.throttle == 0
    tasks = [k.state.jobs[f"{array_id}_{i}"] for i in range(5)]
    assert all(t.spec is array.spec for t in tasks)  # shared, not copied
    assert [(t.array_id, t.array_index) for t in tasks] == [(array_id, i) for i in range(5)]
    assert task_of(tasks[3].job_id) == (array_id, 3)
    assert array_id not in k.state.jobs
    # The same request again names the array and makes nothing.
    again = k.do(c.SubmitJob(array.spec, array.request_id, k.now))
    assert (again.job_id, again.created) == (array_id, False)
    assert len(k.state.jobs) == 5


def test_the_throttle_bounds_the_tasks_placed_and_says_why_the_rest_wait() -> None:
    k = cluster(nodes=4)
    array_id = k.submit(sweep("0-5%2"))
    k.run_pass()
    states = [k.state_of(f"{array_id}_{i}") for i in range(6)]
    assert states == [JobState.SCHEDULED] * 2 + [JobState.PENDING] * 4
    waiting = k.state.jobs[f"{array_id}_2"].reason
    assert waiting.code is ReasonCode.ARRAY_THROTTLE
    assert "at most 2 of its tasks run at once" in render(waiting)
    # A task that ends frees its slot for the next one.
    k.start_all(f"{array_id}_0")
    k.exit_member(f"{array_id}_0", 0, 0)
    k.run_pass()
    assert k.state_of(f"{array_id}_2") is JobState.SCHEDULED
    assert k.state_of(f"{array_id}_3") is JobState.PENDING


def test_apply_refuses_a_plan_beyond_the_throttle() -> None:
    k = cluster(nodes=4)
    array_id = k.submit(sweep("0-3%1"))
    other = k.submit(sweep("0-3"))  # no throttle: a plan for all of it is fine
    free = cluster(nodes=4)
    free.submit(sweep("0-3"))
    free.submit(sweep("0-3"))
    # A plan made as if there were no throttle: every task of the first array.
    plan = free.plan()
    placements = tuple(p for p in plan.command(k.now).placements if p.job_id.startswith(array_id))
    assert len(placements) == 4
    result = k.do(c.BindPlan(placements, (), k.now))
    assert result.bound == (f"{array_id}_0",)
    assert {r.code for r in result.rejected} == {c.RejectCode.ARRAY_THROTTLE}
    assert other in k.state.arrays


def test_cancelling_an_array_cancels_every_unfinished_task() -> None:
    k = cluster(nodes=2)
    array_id = k.submit(sweep("0-3"))
    k.run_pass()
    first = f"{array_id}_0"
    k.start_all(first)
    k.exit_member(first, 0, 0)
    result = k.do(c.CancelJob(array_id, "enough", k.now, actor="user:alice"))
    assert result.ok, result.message
    assert "3 unfinished task(s) cancelled" in result.message
    states = [k.state_of(f"{array_id}_{i}") for i in range(4)]
    assert states == [JobState.SUCCEEDED] + [JobState.CANCELLED] * 3
    assert all(not n.allocated.gpu for n in k.state.nodes.values())


def run_task(k: Cluster, job_id: str, code: int) -> None:
    if k.state_of(job_id) is JobState.PENDING:
        k.run_pass()
    k.start_all(job_id)
    k.exit_member(job_id, 0, code)


def test_afterok_on_an_array_waits_for_every_task() -> None:
    k = cluster(nodes=4)
    array_id = k.submit(sweep("0-2"))
    after = k.submit(dataclasses.replace(job("eval"), dependencies=Dependencies((array_id,))))
    assert k.state.arrays[array_id].dependants == (after,)
    k.run_pass()
    for i in range(2):
        run_task(k, f"{array_id}_{i}", 0)
        assert k.state.jobs[after].waiting_for == (("afterok", array_id),)
    run_task(k, f"{array_id}_2", 0)
    assert k.state.jobs[after].waiting_for == ()
    k.run_pass()
    assert k.state_of(after) is JobState.SCHEDULED


def test_afterok_on_an_array_is_never_met_once_a_task_fails() -> None:
    k = cluster(nodes=4)
    array_id = k.submit(sweep("0-2"))
    after = k.submit(dataclasses.replace(job("eval"), dependencies=Dependencies((array_id,))))
    chained = k.submit(dataclasses.replace(job("report"), dependencies=Dependencies((after,))))
    k.run_pass()
    run_task(k, f"{array_id}_1", 3)
    assert k.state_of(after) is JobState.CANCELLED
    said = render(k.state.jobs[after].reason)
    assert f"afterok on {array_id} can never be met" in said
    assert f"failed in task {array_id}_1" in said
    assert k.state_of(chained) is JobState.CANCELLED  # down the chain
    # Naming it now is refused at submission.
    late = k.do(
        c.SubmitJob(
            dataclasses.replace(job("x"), dependencies=Dependencies((array_id,))), "late", k.now
        )
    )
    assert late.code is c.ResultCode.INVALID and "can never be met" in late.message


def test_afternotok_and_afterany_on_an_array() -> None:
    k = cluster(nodes=4)
    array_id = k.submit(sweep("0-1"))
    notok = k.submit(
        dataclasses.replace(job("cleanup"), dependencies=Dependencies(after_not_ok=(array_id,)))
    )
    anyway = k.submit(
        dataclasses.replace(job("report"), dependencies=Dependencies(after_any=(array_id,)))
    )
    k.run_pass()
    run_task(k, f"{array_id}_0", 1)
    assert k.state.jobs[notok].waiting_for  # not every task has finished
    run_task(k, f"{array_id}_1", 0)
    assert k.state.jobs[notok].waiting_for == () and k.state.jobs[anyway].waiting_for == ()


def test_a_task_may_be_depended_on_alone() -> None:
    k = cluster(nodes=4)
    array_id = k.submit(sweep("0-1"))
    after = k.submit(
        dataclasses.replace(job("eval"), dependencies=Dependencies((f"{array_id}_1",)))
    )
    k.run_pass()
    run_task(k, f"{array_id}_1", 0)
    assert k.state.jobs[after].waiting_for == ()


def test_an_array_leaves_with_its_last_task() -> None:
    k = cluster(nodes=2)
    array_id = k.submit(sweep("0-1"))
    request = k.state.arrays[array_id].request_id
    k.do(c.CancelJob(array_id, "", k.now))
    k.now += k.state.config.retention_ms + 1
    assert k.do(c.PurgeFinished(k.now)).ok
    assert array_id not in k.state.arrays and request not in k.state.request_ids
    assert not k.state.jobs


def test_the_state_round_trips_and_tasks_share_the_spec_again() -> None:
    k = cluster(nodes=2)
    array_id = k.submit(sweep("0-9%3"))
    k.run_pass()
    decoded = decode_state(encode_state(k.state))
    assert encode_state(decoded) == encode_state(k.state)
    spec = decoded.arrays[array_id].spec
    assert all(decoded.jobs[f"{array_id}_{i}"].spec is spec for i in range(10))


def test_snapshots_carry_every_task_made_by_one_command() -> None:
    state = ClusterState()
    builder = SnapshotBuilder()
    apply_tracked(state, c.RaiseFormat(5), builder.changes)
    builder.take(state)
    apply_tracked(state, c.RegisterNode(node("a"), 1), builder.changes)
    apply_tracked(state, c.SubmitJob(sweep("0-99"), "r", 2), builder.changes)
    snap = builder.take(state)
    assert list(snap.jobs) == list(state.jobs)
    assert snap.arrays.keys() == state.arrays.keys()


def test_an_array_needs_format_5() -> None:
    spec = sweep("0-3")
    assert format_needed(c.SubmitJob(spec, "r", 1)) == 5
    state = ClusterState()
    result = apply(state, c.SubmitJob(spec, "r", 1))
    assert result.code is c.ResultCode.CONFLICT and "needs format 5" in result.message
    assert not state.jobs and not state.arrays


def test_an_array_waiting_on_an_array_is_released_or_cancelled_once() -> None:
    k = cluster(nodes=4)
    first = k.submit(sweep("0-2", gpu=0))
    second = k.submit(sweep("0-199", gpu=0, dependencies=Dependencies((first,))))
    assert len(k.state.arrays[first].dependants) == 200
    k.run_pass()
    for i in range(3):
        run_task(k, f"{first}_{i}", 0)
    assert all(not k.state.jobs[f"{second}_{i}"].waiting_for for i in range(200))
    assert k.state.arrays[first].dependants == ()  # settled: not looked at again
    third = k.submit(sweep("0-99", gpu=0, dependencies=Dependencies((second,))))
    result = k.do(c.CancelJob(second, "stop", k.now))
    assert result.ok, result.message
    assert {k.state_of(f"{third}_{i}") for i in range(100)} == {JobState.CANCELLED}
    assert k.state.arrays[second].dependants == ()
