"""The checker's dependency rule (chaos/dependency_rules.py): a dependant's first start
must follow what it waited for, by the members' own records; and the workload's jobs wait
for the newest acknowledged one at the configured share."""

from __future__ import annotations

import dataclasses
import random

from chaos.dependency_rules import check_dependency_order
from chaos.history import History, MemberRecord
from chaos.workload import WorkloadConfig, job_spec
from synapse_ha.core import commands as c
from synapse_ha.core.workflows.dependencies import Dependencies
from tests.core.harness import Cluster, job, node

MS = 1_000_000


def chain(code: int, kind: str = "after_ok") -> tuple[Cluster, str, str]:
    """``first`` run to exit ``code``, ``second`` waiting on it with ``kind``."""
    k = Cluster()
    k.add(node("a", gpus=8))
    first = k.submit(job("first", gpu=8))
    deps = Dependencies(**{kind: (first,)})
    second = k.submit(dataclasses.replace(job("second", gpu=8), dependencies=deps))
    k.run_pass()
    k.start_all(first)
    k.exit_member(first, 0, code)
    return k, first, second


def record(kind: str, job_id: str, at_ms: int, outcome: str = "") -> MemberRecord:
    return MemberRecord(kind, job_id, 1, 1, 0, "w1", at_ms * MS, 10, outcome=outcome)


def test_a_dependant_that_started_after_its_dependency_ended_is_fine() -> None:
    k, first, second = chain(0)
    members = [
        record("start", first, 100),
        record("end", first, 200, "accepted"),
        record("start", second, 250),
    ]
    assert check_dependency_order(History(members=members), k.state) == []


def test_a_dependant_that_started_before_its_dependency_ended_is_a_violation() -> None:
    k, first, second = chain(0)
    members = [
        record("start", first, 100),
        record("start", second, 150),
        record("end", first, 200, "accepted"),
    ]
    (violation,) = check_dependency_order(History(members=members), k.state)
    assert violation.kind == "dependency-early" and violation.job == second
    assert "started before the job it waited for had finished" in violation.detail


def test_a_dependant_that_ran_although_its_dependency_failed_is_a_violation() -> None:
    k, first, second = chain(1)
    members = [record("start", first, 100), record("start", second, 300)]
    (violation,) = check_dependency_order(History(members=members), k.state)
    assert "ended FAILED" in violation.detail
    # Without a start of its own, the cancelled dependant breaks nothing.
    assert check_dependency_order(History(members=members[:1]), k.state) == []


def test_after_needs_the_dependency_started_first() -> None:
    k = Cluster()
    k.add(node("a", gpus=8))
    first = k.submit(job("first", gpu=4))
    second = k.submit(
        dataclasses.replace(job("second", gpu=4), dependencies=Dependencies(after=(first,)))
    )
    k.run_pass()
    k.start_all(first)
    assert k.do(c.CancelJob(first, now_ms=k.now)).ok
    early = [record("start", second, 100), record("start", first, 120)]
    assert len(check_dependency_order(History(members=early), k.state)) == 1
    ordered = [record("start", first, 100), record("start", second, 120)]
    assert check_dependency_order(History(members=ordered), k.state) == []


def test_the_workload_makes_its_share_of_jobs_wait_for_the_newest_one() -> None:
    cfg = WorkloadConfig(
        seed=1, replicas=["127.0.0.1:1"], submissions="s", ledger="l", sink="h:1",
        stop_file="x", python="python", pythonpath=".", dependency_share=0.5,
    )  # fmt: skip
    rng = random.Random(3)
    specs = [job_spec(cfg, rng, i, "job-000007") for i in range(200)]
    waiting = [s for s in specs if s.HasField("dependencies")]
    assert 60 < len(waiting) < 140
    assert all(list(s.dependencies.after_ok) == ["job-000007"] for s in waiting)
    assert not job_spec(cfg, rng, 0, "").HasField("dependencies")  # nothing to wait for
    none = dataclasses.replace(cfg, dependency_share=0.0)
    assert not any(job_spec(none, rng, i, "job-000007").HasField("dependencies") for i in range(50))
