"""Job dependencies in the state machine and the scheduler (core/workflows/dependencies.py): checked
at submission, resolved at the transition of the job depended on, never placed while
waiting, cancelled when they can never be met, and gated by the cluster's format."""

from __future__ import annotations

import dataclasses
import re

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.codec.formats import format_needed
from synapse_ha.core.model import ClusterState, JobState
from synapse_ha.core.reasons import ReasonCode, render
from synapse_ha.core.scheduler.explainer import why_pending
from synapse_ha.core.snapshot import Changes, apply_tracked
from synapse_ha.core.spec.document import SpecError, parse_job_spec
from synapse_ha.core.workflows.dependencies import Dependencies
from tests.core.harness import Cluster, job, node


def cluster() -> Cluster:
    k = Cluster()
    k.add(node("a", gpus=8), node("b", gpus=8))
    return k


def after(**kinds: tuple[str, ...]) -> Dependencies:
    return Dependencies(**kinds)


def submit(k: Cluster, name: str, deps: Dependencies | None = None) -> str:
    return k.submit(dataclasses.replace(job(name, gpu=8), dependencies=deps))


def run_to(k: Cluster, job_id: str, code: int) -> None:
    """Place ``job_id`` (a pass), start it, and end it with exit ``code``."""
    k.run_pass()
    assert k.state_of(job_id) is JobState.SCHEDULED, k.state.jobs[job_id].reason
    k.start_all(job_id)
    k.exit_member(job_id, 0, code)


def test_a_waiting_job_is_not_placed_until_its_dependency_succeeds() -> None:
    k = cluster()
    first = submit(k, "prep")
    second = submit(k, "train", after(after_ok=(first,)))
    waiting = k.state.jobs[second]
    assert waiting.waiting_for == (("afterok", first),)
    assert waiting.reason.code is ReasonCode.DEPENDENCY
    assert render(waiting.reason) == f"waiting for {first} to succeed"
    assert k.state.jobs[first].dependants == (second,)
    k.run_pass()  # room for both: only the first is placed
    assert (k.state_of(first), k.state_of(second)) == (JobState.SCHEDULED, JobState.PENDING)
    assert why_pending(k.state, second, k.now, k.plan()).code is ReasonCode.DEPENDENCY
    k.start_all(first)
    k.exit_member(first, 0, 0)
    assert k.state_of(first) is JobState.SUCCEEDED
    assert k.state.jobs[second].waiting_for == ()
    assert k.state.jobs[second].reason.code is ReasonCode.PENDING_FIRST_PASS
    k.run_pass()
    assert k.state_of(second) is JobState.SCHEDULED


@pytest.mark.parametrize(
    ("kind", "code", "placed"),
    [
        ("after_ok", 1, False),
        ("after_ok", 0, True),
        ("after_any", 1, True),
        ("after_not_ok", 1, True),
        ("after_not_ok", 0, False),
    ],
)
def test_each_kind_is_met_or_never_met_by_how_the_other_job_ended(
    kind: str, code: int, placed: bool
) -> None:
    k = cluster()
    first = submit(k, "first")
    second = submit(k, "second", after(**{kind: (first,)}))
    run_to(k, first, code)
    waiting = k.state.jobs[second]
    if placed:
        assert waiting.state is JobState.PENDING and not waiting.waiting_for
        return
    assert waiting.state is JobState.CANCELLED
    assert waiting.reason.code is ReasonCode.DEPENDENCY_NEVER_SATISFIED
    assert waiting.reason.text("job") == first
    assert "can never be met" in render(waiting.reason)


def test_a_cancelled_dependency_cancels_the_whole_chain_at_once() -> None:
    k = cluster()
    a = submit(k, "a")
    b = submit(k, "b", after(after_ok=(a,)))
    c3 = submit(k, "c", after(after_ok=(b,)))
    d = submit(k, "d", after(after_any=(b,)))  # met: b ends (cancelled)
    assert k.do(c.CancelJob(a, "wrong data", now_ms=k.now)).ok
    assert [k.state_of(j) for j in (a, b, c3, d)] == [
        JobState.CANCELLED,
        JobState.CANCELLED,
        JobState.CANCELLED,
        JobState.PENDING,
    ]
    assert k.state.jobs[c3].reason.text("job") == b
    assert k.state.jobs[d].waiting_for == ()


def test_after_is_met_once_the_other_started_and_a_requeue_releases_nobody_twice() -> None:
    k = cluster()
    first = submit(k, "server")
    second = submit(k, "client", after(after=(first,)))
    k.run_pass()
    assert k.state.jobs[second].waiting_for == (("after", first),)
    k.start_all(first)
    assert k.state.jobs[second].waiting_for == ()
    assert k.state.jobs[second].reason.code is ReasonCode.PENDING_FIRST_PASS
    # The first is requeued (its node died), placed and started again: the second,
    # released once, neither waits again nor is cancelled.
    k.now += 60_000
    assert k.do(c.MarkNodeDead(k.nodes_of(first)[0], k.now, "gone")).ok
    assert k.state_of(first) is JobState.PENDING
    assert k.state_of(second) is JobState.PENDING and k.state.jobs[second].waiting_for == ()
    k.run_pass()  # the surviving node has room for one: the first in line takes it
    assert k.state_of(first) is JobState.SCHEDULED
    k.start_all(first)
    waiting = k.state.jobs[second]
    assert waiting.state is JobState.PENDING and waiting.waiting_for == ()
    assert waiting.reason.code is not ReasonCode.DEPENDENCY


def test_after_on_a_job_cancelled_before_it_started_is_never_met() -> None:
    k = cluster()
    first = submit(k, "server")
    second = submit(k, "client", after(after=(first,)))
    assert k.do(c.CancelJob(first, "never mind", now_ms=k.now)).ok
    assert k.state_of(second) is JobState.CANCELLED


def test_submissions_naming_unknown_or_hopeless_jobs_are_refused_and_change_nothing() -> None:
    k = cluster()
    failed = submit(k, "failed")
    run_to(k, failed, 3)
    assert k.state_of(failed) is JobState.FAILED
    before = k.state.next_job_seq
    for deps, says in (
        (after(after_ok=("job-999999",)), "no job job-999999"),
        (after(after_ok=(failed,)), f"dependencies.afterok: {failed} failed"),
    ):
        spec = dataclasses.replace(job("x"), dependencies=deps)
        result = k.do(c.SubmitJob(spec, f"req-{says}", k.now))
        assert result.code is c.ResultCode.INVALID and says in result.message
    assert k.state.next_job_seq == before
    assert k.state.jobs[failed].dependants == ()
    # A dependency already met is recorded as met: the job does not wait.
    spec = dataclasses.replace(job("y"), dependencies=after(after_not_ok=(failed,)))
    result = k.do(c.SubmitJob(spec, "req-y", k.now))
    assert result.ok and k.state.jobs[result.job_id].waiting_for == ()


def test_malformed_dependencies_are_refused_naming_the_field() -> None:
    k = cluster()
    first = submit(k, "first")
    for deps, field in (
        (after(after_ok=("job-1",)), "dependencies.afterok"),
        (after(after_ok=(first,), after=(first,)), "dependencies.after"),
        (Dependencies(), "dependencies"),
    ):
        spec = dataclasses.replace(job("x"), dependencies=deps)
        result = k.do(c.SubmitJob(spec, f"req-{field}-{len(deps.pairs())}", k.now))
        assert result.code is c.ResultCode.INVALID and f"{field}:" in result.message


def test_dependencies_need_format_4_and_are_refused_below_it() -> None:
    spec = dataclasses.replace(job("x"), dependencies=after(after_ok=("job-000001",)))
    assert format_needed(c.SubmitJob(spec, "r", 0)) == 4
    assert format_needed(c.SubmitJob(job("x"), "r", 0)) < 4
    state = ClusterState()  # floor 2: no replica is known to read format 4
    result = c.SubmitJob(spec, "r", 0)
    from synapse_ha.core.machine import apply

    answer = apply(state, result)
    assert answer.code is c.ResultCode.CONFLICT and "needs format 4" in answer.message
    assert state.jobs == {}


def test_snapshots_see_every_dependant_a_finish_changed() -> None:
    k = cluster()
    a = submit(k, "a")
    b = submit(k, "b", after(after_ok=(a,)))
    c3 = submit(k, "c", after(after_ok=(b,)))
    changes = Changes()
    apply_tracked(k.state, c.CancelJob(a, "x", now_ms=k.now), changes)
    assert {a, b, c3} <= changes.jobs


def test_a_waiting_job_cancelled_by_its_owner_waits_for_nothing_more() -> None:
    k = cluster()
    first = submit(k, "first")
    second = submit(k, "second", after(after_ok=(first,)))
    assert k.do(c.CancelJob(second, "not needed", now_ms=k.now)).ok
    assert k.state.jobs[second].waiting_for == ()
    run_to(k, first, 0)  # its dependency's end finds it already final: nothing changes
    assert k.state_of(second) is JobState.CANCELLED
    assert k.state.jobs[second].reason.code is ReasonCode.CANCELLED


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("", "dependencies: expected a mapping, got str"),
        ({"afterok": 5}, "dependencies.afterok: expected a string, got int"),
        ({"before": ["job-000001"]}, "dependencies.before: unknown field"),
        ({"afterok": ["job-1"]}, "dependencies.afterok: 'job-1' is not a job id"),
        ({"after": ["job-000001", "job-000001"]}, "job-000001 is named more than once"),
    ],
)
def test_spec_documents_with_bad_dependencies_name_the_field(value: object, says: str) -> None:
    with pytest.raises(SpecError, match=re.escape(says)):
        parse_job_spec({"name": "a", "replicas": 1, "command": "true", "dependencies": value})


def test_spec_documents_take_one_id_or_a_list_and_empty_lists_mean_none() -> None:
    doc = {"name": "a", "replicas": 1, "command": "true"}
    parsed = parse_job_spec({**doc, "dependencies": {"afterok": "job-000012", "after": []}})
    assert parsed.spec.dependencies == Dependencies(after_ok=("job-000012",))
    for empty in ({}, {"afterok": [], "afterany": []}):
        assert parse_job_spec({**doc, "dependencies": empty}).spec.dependencies is None


def test_a_singleton_waits_for_every_earlier_unfinished_job_of_its_owner_and_name() -> None:
    k = cluster()
    first = submit(k, "nightly")
    other_name = submit(k, "eval")
    bobs = k.do(c.SubmitJob(job("nightly", gpu=8), "bob-1", k.now, owner="bob"))
    assert bobs.ok
    lone = Dependencies(singleton=True)
    second = submit(k, "nightly", lone)
    waiting = k.state.jobs[second]
    # Only the same owner's job of that name; the spec keeps what it waits for.
    assert waiting.waiting_for == (("afterany", first),)
    assert waiting.spec.dependencies == Dependencies(after_any=(first,), singleton=True)
    assert other_name not in waiting.spec.dependencies.after_any
    run_to(k, first, 3)  # a failure releases it too: afterany
    assert k.state.jobs[second].waiting_for == ()
    third = submit(k, "nightly", lone)  # the second is still pending: the third waits
    assert k.state.jobs[third].waiting_for == (("afterany", second),)
    alone = submit(k, "weekly", lone)  # none of its name: nothing to wait for
    assert k.state.jobs[alone].waiting_for == ()
    assert format_needed(c.SubmitJob(k.state.jobs[alone].spec, "r", 0)) == 13


def test_singleton_reads_from_a_document_and_alone_is_a_dependency() -> None:
    doc = {"name": "n", "replicas": 1, "command": "true"}
    spec = parse_job_spec({**doc, "dependencies": {"singleton": True}}).spec
    assert spec.dependencies == Dependencies(singleton=True)
    with pytest.raises(SpecError, match=r"dependencies\.singleton: expected true or false"):
        parse_job_spec({**doc, "dependencies": {"singleton": "yes"}})
