"""The generic trace format: good lines load, a bad line names its number, field and rule."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from synapse_ha.core.cluster_config import Queue
from synapse_ha.sim.tenants import from_trace
from synapse_ha.sim.trace import TraceError, openb_to_trace, parse_trace, write_trace
from synapse_ha.sim.workload import synthetic_cluster

TRACE = Path(__file__).resolve().parents[3] / "shared" / "data" / "alibaba-openb-v2023"

GOOD = """\
# a comment, then the header
submit_s,user,queue,members,gpus_per_member,duration_s,time_limit_s,topology_required,priority_class
90.5,alice,team-a,8,8,3600,7200,rack,high
0,bob,team-b,1,2,60,,,

10,,team-a,2,0,1.25,0,,
"""


def test_good_lines_load_sorted_by_submission_time() -> None:
    jobs = parse_trace(GOOD)
    assert [j.line for j in jobs] == [4, 6, 3]
    bob, anon, alice = jobs
    assert (bob.submit_ms, bob.user, bob.spec.queue, bob.spec.replicas) == (0, "bob", "team-b", 1)
    assert bob.spec.resources.gpu == 2 and bob.duration_ms == 60_000
    assert bob.spec.time_limit_ms == 0 and bob.spec.topology_required == ""
    assert anon.user == "" and anon.duration_ms == 1_250 and anon.spec.resources.gpu == 0
    assert alice.submit_ms == 90_500 and alice.spec.replicas == 8
    assert alice.spec.topology_required == "rack" and alice.spec.priority_class == "high"
    assert alice.spec.time_limit_ms == 7_200_000
    assert alice.spec.resources.cpu_milli == 64_000  # the default: 8 cores per GPU


HEADER = "submit_s,queue,members,gpus_per_member,duration_s,topology_required,user"


@pytest.mark.parametrize(
    ("line", "field", "rule"),
    [
        ("x,team-a,1,1,10,,", "submit_s", "number of seconds"),
        ("-1,team-a,1,1,10,,", "submit_s", ">= 0"),
        ("0,Team A,1,1,10,,", "queue", "queue name"),
        ("0,,1,1,10,,", "queue", "queue name"),
        ("0,team-a,0,1,10,,", "members", "between 1 and"),
        ("0,team-a,two,1,10,,", "members", "integer"),
        ("0,team-a,1,65,10,,", "gpus_per_member", "between 0 and 64"),
        ("0,team-a,1,1,0,,", "duration_s", "> 0"),
        ("0,team-a,1,1,nan,,", "duration_s", "> 0"),
        ("0,team-a,1,1,10,galaxy,", "topology_required", "not a topology level"),
        ("0,team-a,1,1,10,,Alice!", "user", "a-z"),
        ("0,team-a,1,1", "line", "has 4 fields"),
    ],
)
def test_a_bad_line_names_its_number_field_and_rule(line: str, field: str, rule: str) -> None:
    text = f"{HEADER}\n0,team-a,1,1,10,,\n{line}\n"
    with pytest.raises(TraceError) as info:
        parse_trace(text, source="t.csv")
    assert (info.value.line, info.value.field) == (3, field)
    assert rule in info.value.rule
    assert str(info.value).startswith(f"t.csv line 3: {field}: ")


@pytest.mark.parametrize(
    ("header", "rule"),
    [
        ("submit_s,queue,members,gpus_per_member", "'duration_s' is missing"),
        ("submit_s,queue,members,gpus_per_member,duration_s,colour", "unknown column 'colour'"),
        ("submit_s,queue,queue,members,gpus_per_member,duration_s", "named twice"),
    ],
)
def test_a_bad_header_is_refused(header: str, rule: str) -> None:
    with pytest.raises(TraceError, match=rule) as info:
        parse_trace(header + "\n")
    assert (info.value.line, info.value.field) == (1, "header")


def test_an_empty_trace_asks_for_a_header() -> None:
    with pytest.raises(TraceError, match="header line"):
        parse_trace("# nothing\n")


def test_written_traces_load_back_to_the_same_jobs() -> None:
    jobs = parse_trace(GOOD)
    out = io.StringIO()
    assert write_trace(jobs, out) == 3
    again = parse_trace(out.getvalue())
    assert [(j.submit_ms, j.user, j.duration_ms) for j in again] == [
        (j.submit_ms, j.user, j.duration_ms) for j in jobs
    ]
    assert [j.spec for j in again] == [j.spec for j in jobs]


def test_a_trace_becomes_a_workload_with_equal_quotas_by_default() -> None:
    jobs = parse_trace(GOOD)
    nodes = synthetic_cluster(4)
    w = from_trace(jobs, nodes)
    assert w.queues == (
        Queue("team-a", gpu=16, cohort="trace"),
        Queue("team-b", gpu=16, cohort="trace"),
    )
    assert [j.user for j in w.jobs] == ["bob", "", "alice"]
    with pytest.raises(ValueError, match="team-b"):
        from_trace(jobs, nodes, queues=[Queue("team-a", gpu=8)])


@pytest.mark.skipif(
    not TRACE.is_dir(), reason="the shared Alibaba trace is not beside the checkout"
)
def test_openb_pods_convert_to_one_member_jobs_queued_by_qos() -> None:
    jobs = openb_to_trace(TRACE, limit=300)
    assert len(jobs) == 300
    assert {j.spec.queue for j in jobs} <= {"ls", "be", "burstable", "guaranteed"}
    assert len({j.spec.queue for j in jobs}) >= 2
    assert all(j.spec.replicas == 1 and j.duration_ms > 0 for j in jobs)
    out = io.StringIO()
    write_trace(jobs, out)
    assert len(parse_trace(out.getvalue())) == 300


CHECKPOINT_HEADER = "submit_s,queue,members,gpus_per_member,duration_s,checkpoint_s"


def test_checkpoint_intervals_load_write_back_and_reach_the_workload() -> None:
    text = f"{CHECKPOINT_HEADER}\n0,team-a,2,8,3600,600\n5,team-a,1,1,60,\n9,team-a,1,1,60,1.5\n"
    jobs = parse_trace(text)
    assert [j.checkpoint_ms for j in jobs] == [600_000, 0, 1_500]
    out = io.StringIO()
    write_trace(jobs, out)
    assert [j.checkpoint_ms for j in parse_trace(out.getvalue())] == [600_000, 0, 1_500]
    w = from_trace(jobs, synthetic_cluster(4))
    assert [j.checkpoint_ms for j in w.jobs] == [600_000, 0, 1_500]


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("often", "must be a number of seconds, got 'often'"),
        ("0", "must be > 0 seconds, got '0'"),
        ("-60", "must be > 0 seconds, got '-60'"),
        ("inf", "must be > 0 seconds"),
        ("0.5", "must be at least 1 second, got '0.5'"),
        ("40000000", "must be at most 31622400 seconds"),
    ],
)
def test_a_bad_checkpoint_interval_names_its_line_and_column(value: str, rule: str) -> None:
    text = f"# intervals\n{CHECKPOINT_HEADER}\n0,team-a,1,1,10,60\n0,team-a,1,1,10,{value}\n"
    with pytest.raises(TraceError) as info:
        parse_trace(text, source="t.csv")
    assert (info.value.line, info.value.field) == (4, "checkpoint_s")
    assert rule in info.value.rule
    assert str(info.value).startswith("t.csv line 4: checkpoint_s: ")
