"""The lifecycle tables: every declared row, every undeclared pair refused, and the
state machine moving records only along declared rows."""

from __future__ import annotations

import itertools
from enum import Enum
from typing import Any

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core import lifecycle as lc
from synapse_ha.core.model import AttemptState, JobState, MemberState, NodeStatus
from tests.core.harness import Cluster, job, node

# Every row, written out again by hand: a change to a table must change this list too.
EXPECTED: dict[str, set[tuple[str, str, str]]] = {
    "job": {
        ("PENDING", "bind", "SCHEDULED"),
        ("PENDING", "cancel", "CANCELLED"),
        ("SCHEDULED", "start", "RUNNING"),
        ("RUNNING", "succeed", "SUCCEEDED"),
        ("SCHEDULED", "retry", "PENDING"),
        ("RUNNING", "retry", "PENDING"),
        ("SCHEDULED", "requeue", "PENDING"),
        ("RUNNING", "requeue", "PENDING"),
        ("SCHEDULED", "fail", "FAILED"),
        ("RUNNING", "fail", "FAILED"),
        ("SCHEDULED", "cancel", "CANCELLED"),
        ("RUNNING", "cancel", "CANCELLED"),
        ("PENDING", "late_success", "SUCCEEDED"),
        ("SCHEDULED", "late_success", "SUCCEEDED"),
        ("RUNNING", "late_success", "SUCCEEDED"),
    },
    "attempt": {
        ("bound", "start", "running"),
        ("running", "succeed", "succeeded"),
        ("bound", "fail", "failed"),
        ("running", "fail", "failed"),
        ("bound", "requeue", "requeued"),
        ("running", "requeue", "requeued"),
        ("bound", "stop", "stopped"),
        ("running", "stop", "stopped"),
    },
    "member": {
        ("bound", "start", "running"),
        ("running", "start", "running"),
        ("bound", "exit", "exited"),
        ("running", "exit", "exited"),
    },
    "node": {
        *((s, "uncordon", "ready") for s in ("ready", "cordoned", "draining")),
        *((s, "cordon", "cordoned") for s in ("ready", "cordoned", "draining")),
        *((s, "drain", "draining") for s in ("ready", "cordoned", "draining")),
        *((s, "die", "dead") for s in ("ready", "cordoned", "draining")),
        *((s, "register", s) for s in ("ready", "cordoned", "draining")),
        ("draining", "emptied", "cordoned"),
        ("dead", "register", "ready"),
    },
}


def rows(lifecycle: lc.Lifecycle[Any, Any]) -> set[tuple[str, str, str]]:
    return {(s.value, e.value, after.value) for (s, e), after in lifecycle.rows.items()}


@pytest.mark.parametrize("lifecycle", lc.LIFECYCLES, ids=lambda lf: lf.name)
def test_every_row_is_declared_as_expected_and_walks(lifecycle: lc.Lifecycle[Any, Any]) -> None:
    assert rows(lifecycle) == EXPECTED[lifecycle.name]
    for (state, event), after in lifecycle.rows.items():
        assert lc.transition(lifecycle, state, event) is after
        assert lc.move(lifecycle, state, event) is after


@pytest.mark.parametrize("lifecycle", lc.LIFECYCLES, ids=lambda lf: lf.name)
def test_every_undeclared_pair_is_refused(lifecycle: lc.Lifecycle[Any, Any]) -> None:
    states: list[Enum] = list(lifecycle.states)
    events: list[Enum] = list(lifecycle.events)
    refused = 0
    for state, event in itertools.product(states, events):
        if (state, event) in lifecycle.rows:
            continue
        answer = lc.transition(lifecycle, state, event)
        assert answer == lc.UndeclaredTransition(lifecycle.name, str(state.value), str(event.value))
        with pytest.raises(lc.TransitionRefused):
            lc.move(lifecycle, state, event)
        refused += 1
    assert refused == len(states) * len(events) - len(lifecycle.rows)


def test_finished_jobs_and_ended_attempts_are_final() -> None:
    for state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
        assert all(lc.transition(lc.JOB, state, e) != state for e in lc.JobEvent)
        assert all(
            isinstance(lc.transition(lc.JOB, state, e), lc.UndeclaredTransition)
            for e in lc.JobEvent
        )
    for attempt in AttemptState:
        if not attempt.live:
            assert all(
                isinstance(lc.transition(lc.ATTEMPT, attempt, e), lc.UndeclaredTransition)
                for e in lc.AttemptEvent
            )
    assert all(
        isinstance(lc.transition(lc.MEMBER, MemberState.EXITED, e), lc.UndeclaredTransition)
        for e in lc.MemberEvent
    )


def test_set_node_status_on_a_dead_node_is_a_refusal_result_not_an_exception() -> None:
    cl = Cluster()
    cl.add(node("n1"))
    cl.do(c.MarkNodeDead("n1"))
    for status in (NodeStatus.READY, NodeStatus.CORDONED, NodeStatus.DRAINING):
        assert cl.do(c.SetNodeStatus("n1", status)).code is c.ResultCode.CONFLICT
    assert cl.state.nodes["n1"].status is NodeStatus.DEAD


def test_the_machine_moves_records_only_along_declared_rows() -> None:
    """Record the (before, after) of every job, attempt and node across a busy run and
    check each change is a row (or a chain of rows within one command)."""
    cl = Cluster()
    cl.add(node("n1", gpus=8), node("n2", gpus=8))
    seen: list[tuple[str, str, str]] = []

    def snapshot() -> dict[str, str]:
        out = {f"job {k}": j.state.value for k, j in cl.state.jobs.items()}
        out.update({f"node {k}": n.status.value for k, n in cl.state.nodes.items()})
        return out

    def step(command: c.Command) -> None:
        before = snapshot()
        cl.do(command)
        after = snapshot()
        for key, value in after.items():
            if key in before and before[key] != value:
                seen.append((key.split()[0], before[key], value))

    a = cl.submit(job("a", replicas=2, gpu=8, retries=1, backoff_s=0))
    plan = cl.plan().command(cl.now)
    assert plan is not None
    step(plan)
    attempt = cl.state.jobs[a].attempt
    assert attempt is not None
    for m in attempt.members:
        ev = c.MemberEvent(a, attempt.fencing_token, m.rank, c.MemberEventKind.STARTED)
        step(c.ReportMembers(m.node_id, (ev,), now_ms=cl.now))
    step(c.SetNodeStatus("n1", NodeStatus.DRAINING))
    step(c.MarkNodeDead("n2", "silent", now_ms=cl.now))
    ev = c.MemberEvent(a, attempt.fencing_token, 0, c.MemberEventKind.EXITED, 143)
    step(c.ReportMembers(attempt.members[0].node_id, (ev,), now_ms=cl.now))
    step(c.CancelJob(a, now_ms=cl.now))
    reachable = {
        "job": {(b, x) for b, _, x in EXPECTED["job"]},
        "node": {(b, x) for b, _, x in EXPECTED["node"]},
    }
    # Two rows in one command (drain, then emptied) count as their composition.
    reachable["node"].add(("ready", "cordoned"))
    assert seen, "the run changed nothing"
    for kind, before, after in seen:
        assert (before, after) in reachable[kind], (kind, before, after)
    assert ("node", "ready", "dead") in seen
    assert ("job", "RUNNING", "PENDING") in seen  # the requeue
