"""Trace lines that submit arrays (``array``) and wait for earlier lines (``after_ok``),
replayed through the real state machine."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.sim.cli import main
from synapse_ha.sim.engine import GRACE_MS, AfterOkRun, Pacing, build_cluster, simulate
from synapse_ha.sim.metrics import JobRecord
from synapse_ha.sim.policies import POLICIES, Ours
from synapse_ha.sim.tenants import from_trace
from synapse_ha.sim.trace import TraceError, parse_trace, write_trace
from synapse_ha.sim.workload import Workload, synthetic_cluster

# Line 3 is an array of 4 one-GPU tasks, at most 2 at once; line 4 waits for all of them.
SWEEP = """\
submit_s,queue,members,gpus_per_member,duration_s,name,array,after_ok
# the sweep, then the step that picks its best trial
0,default,1,1,60,sweep,0-3%2,
0,default,1,1,30,pick,,3
"""


def _workload(text: str, nodes: int = 4) -> Workload:
    return from_trace(parse_trace(text, source="t.csv"), synthetic_cluster(nodes))


def _replay(workload: Workload, purge_every: int = 500) -> AfterOkRun:
    state = build_cluster(workload, ClusterConfig(retention_ms=0))
    run = AfterOkRun(workload, Ours(), state, Pacing(GRACE_MS, 500, purge_every))
    run.run()
    return run


def _most_at_once(records: list[JobRecord]) -> int:
    """The most of ``records`` running at one instant (an end frees its slot first)."""
    edges = sorted(
        [(r.start_ms, 1) for r in records if r.start_ms is not None]
        + [(r.end_ms, -1) for r in records if r.end_ms is not None]
    )
    most = running = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def test_the_line_loads_as_an_array_and_a_job_waiting_for_it() -> None:
    sweep, pick = parse_trace(SWEEP)
    assert sweep.spec.array == "0-3%2" and sweep.after_ok == ()
    assert pick.spec.array == "" and pick.after_ok == (3,)
    assert _workload(SWEEP).jobs[1].after_ok == (0,)


def test_a_throttled_array_and_its_dependant_run_to_completion() -> None:
    run = _replay(_workload(SWEEP))
    array_id = run.job_id_of[0]
    tasks = [run.records[t] for t in run.tasks_of[array_id]]
    pick = run.records[run.job_id_of[1]]
    assert len(tasks) == 4 and len(run.records) == 5
    assert all(r.start_ms is not None and r.end_ms is not None for r in run.records.values())
    assert _most_at_once(tasks) == 2  # the throttle, and the room to use it
    assert pick.start_ms is not None
    assert pick.start_ms >= max(r.end_ms or 0 for r in tasks)
    assert not run.pending and run.cancelled_waiting == 0 and not run.never_submitted


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_runs_the_array_and_its_dependant(policy: str) -> None:
    result = simulate(_workload(SWEEP), POLICIES[policy](), pass_interval_ms=500)
    assert result.metrics["jobs"] == 5 and result.metrics["jobs_started"] == 5
    assert result.metrics["after_ok"] == {
        "jobs_with_after_ok": 1,
        "cancelled_waiting": 0,
        "never_submitted": 0,
    }


def test_a_dependant_of_an_array_that_fails_is_cancelled_while_it_waits() -> None:
    text = (
        "submit_s,queue,members,gpus_per_member,duration_s,time_limit_s,array,after_ok\n"
        "0,default,1,1,60,30,0-3%2,\n"  # every task hits its time limit
        "0,default,1,1,30,,,2\n"
    )
    run = _replay(_workload(text))
    pick = run.records[run.job_id_of[1]]
    assert pick.start_ms is None and run.cancelled_waiting == 1 and not run.pending


def test_a_job_waited_for_may_be_purged_before_the_dependant_arrives() -> None:
    header = "submit_s,queue,members,gpus_per_member,duration_s,time_limit_s,after_ok\n"
    ok = _replay(_workload(header + "0,default,1,1,10,,\n100,default,1,1,10,,2\n"), 1)
    assert ok.records[ok.job_id_of[1]].end_ms == 110_000
    failed = _replay(_workload(header + "0,default,1,1,10,5,\n100,default,1,1,10,,2\n"), 1)
    assert failed.never_submitted == {1} and len(failed.records) == 1
    array = header.replace("after_ok", "array,after_ok")
    tasks_failed = _replay(
        _workload(array + "0,default,1,1,10,5,0-1,\n100,default,1,1,10,,,2\n"), 1
    )
    assert tasks_failed.never_submitted == {1} and len(tasks_failed.records) == 2
    assert not tasks_failed.state.arrays  # purged with its tasks before line 3 arrived


HEADER = "submit_s,queue,members,gpus_per_member,duration_s,array,after_ok"


@pytest.mark.parametrize(
    ("line", "field", "rule"),
    [
        ("0,default,1,1,10,0-3%0,", "array", "throttle after %"),
        ("0,default,1,1,10,a-b,", "array", "is not an index"),
        ("0,default,1,1,10,0-10000,", "array", "at most 10000 tasks"),
        ("0,default,1,1,10,,two", "after_ok", "line numbers separated by ';'"),
        ("0,default,1,1,10,,2;", "after_ok", "line numbers separated by ';'"),
        ("0,default,1,1,10,,1", "after_ok", "line 1 is not a job line"),
        ("0,default,1,1,10,,9", "after_ok", "line 9 is not a job line"),
        ("0,default,1,1,10,,3", "after_ok", "line 3 is not above this line"),
        ("0,default,1,1,10,,4", "after_ok", "line 4 is not above this line"),
        ("0,default,1,1,10,,2", "after_ok", "line 2 is submitted at 5 s, after this line"),
    ],
)
def test_a_bad_array_or_after_ok_names_the_line_and_column(
    line: str, field: str, rule: str
) -> None:
    text = f"{HEADER}\n5,default,1,1,10,,\n{line}\n5,default,1,1,10,,\n"
    with pytest.raises(TraceError) as info:
        parse_trace(text, source="t.csv")
    assert (info.value.line, info.value.field) == (3, field)
    assert rule in info.value.rule
    assert str(info.value).startswith(f"t.csv line 3: {field}: ")


def test_written_traces_keep_arrays_and_renumber_after_ok() -> None:
    jobs = parse_trace(SWEEP)
    out = io.StringIO()
    write_trace(jobs, out)
    again = parse_trace(out.getvalue())
    assert [j.spec for j in again] == [j.spec for j in jobs]
    assert [j.after_ok for j in again] == [(), (2,)]  # no comment line in the output


def test_synapse_sim_replays_a_trace_with_an_array(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "sweep.csv"
    trace.write_text(SWEEP)
    assert main(["--workload", "trace", "--trace-file", str(trace), "--nodes", "4"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["workload"].startswith("sweep.csv: 2 jobs (1 of them arrays)")
    ours = report["results"]["ours"]
    assert ours["jobs"] == 5 and ours["jobs_started"] == 5
    assert ours["after_ok"]["never_submitted"] == 0
    assert "ours" in captured.err


def test_the_failure_runs_refuse_a_trace_with_after_ok(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "sweep.csv"
    trace.write_text(SWEEP)
    with pytest.raises(SystemExit):
        main(["--workload", "trace", "--trace-file", str(trace), "--gpu-failures"])
    assert "do not replay after_ok" in capsys.readouterr().err
