"""The ``slow-node`` kind and the checker's slow-node rules: the schedule draws the kind,
a paced member writes pace lines the worker reads, the workload's paced gangs, the
watch of ``degraded`` marks (on a fake cluster), and each rule fails on a made-up
history that breaks it and passes on one that keeps it."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from chaos import ledger, member, nemesis, slow_rules, slowfaults, workload
from chaos.history import History
from chaos.members_seen import SeenMember
from chaos.slow_rules import NEVER, Mark, Throttle, check_binds, check_marks, check_unmarked
from chaos.steptask import pid_namespace, start_ticks
from synapse_ha.local.waiting import wait_until
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.worker.pace import parse_pace

S = 1_000_000_000  # ns


# ------------------------------------------------------------------- the schedule


def test_the_kind_is_in_every_schedule_and_lasts_past_a_few_windows() -> None:
    assert nemesis.SLOW_NODE in nemesis.ALL_FAULTS
    assert nemesis.SLOW_NODE in nemesis.CONTROL_FAULTS  # aims at any worker
    kinds = [s.kind for s in nemesis.targeted_schedule(1)]
    assert kinds.count(nemesis.SLOW_NODE) == 1
    low = nemesis.duration_for(nemesis.SLOW_NODE, random.Random(0), nemesis.FaultTimeouts())
    assert low >= 2 * nemesis.SLOW_NODE_WINDOW_S
    # Three windows (three strikes) fit well within the wait for the mark.
    assert 3 * nemesis.SLOW_NODE_WINDOW_S < slowfaults.MARK_WAIT_S / 2
    # A throttled step (1 % of a core) is far past the cluster's threshold.
    throttled = slowfaults.PERIOD_US / slowfaults.QUOTA_US
    assert throttled > 10 * (1 + nemesis.SLOW_NODE_THRESHOLD_PCT / 100)


# ------------------------------------------------------------------- the member


def test_a_paced_member_writes_lines_the_worker_reads(tmp_path: Path) -> None:
    path = tmp_path / "progress"
    pacer = member.Pacer(str(path))
    pacer.times = [3.0, 1.0, 2.0, 50.0]
    pacer.step = 4
    pacer.write_line()
    pacer.times = [0.0]
    pacer.write_line()
    lines = path.read_bytes().splitlines()
    assert [json.loads(x) for x in lines] == [
        {"step": 4, "step_ms": 1.0},  # the fastest: a preempted step is slow by no fault
        {"step": 4, "step_ms": 0.001},  # never 0: the worker ignores a pace of 0
    ]
    assert [parse_pace(x) for x in lines] == [(1000, ""), (1, "")]
    assert pacer.times == []


def test_a_paced_member_steps_until_told(tmp_path: Path) -> None:
    pacer = member.Pacer(str(tmp_path / "progress"))
    pacer.next_line = 0.0  # a line after the first step
    pacer.run_until(0.0)  # already past: no step
    assert pacer.step == 0
    pacer.run_until(time.monotonic() + 0.001)
    assert pacer.step == 1
    (line,) = (tmp_path / "progress").read_bytes().splitlines()
    assert parse_pace(line) is not None


# ------------------------------------------------------------------ the workload


def test_paced_gangs_run_on_different_nodes_and_report_their_pace() -> None:
    spec = workload.paced_spec("chaos-1-slow-3", "py", "/repo", "/l", "sink:1", 4_500)
    assert spec.replicas == workload.PACED_SIZE >= 2
    assert spec.resources.gpu == 1 and spec.resources.cpu_milli == 4_500
    assert {(e.name, e.value) for e in spec.env} >= {(workload.PACE_ENV, "1")}
    assert workload.PACE_ENV == member.PACE_ENV
    assert spec.argv.args[-1] == str(workload.PACED_MS)


def test_the_submission_of_a_paced_gang_says_so(tmp_path: Path) -> None:
    class Client:
        def submit_job(self, spec: pb.JobSpec, request_id: str, timeout_s: float) -> object:
            return SimpleNamespace(job_id="job-000007")

    spec = workload.paced_spec("n", "py", "/repo", "/l", "sink:1", 0)
    with ledger.Appender(tmp_path / "s.jsonl") as out:
        assert workload.submit_one(Client(), spec, out, 1.0) == ("ok", "job-000007")  # type: ignore[arg-type]
    records = list(ledger.read_records(tmp_path / "s.jsonl"))
    assert [r.get("paced") for r in records] == [True, True]


def test_no_paced_share_draws_nothing() -> None:
    cfg = workload.WorkloadConfig(1, [], "", "", "", "", "py", "/repo")
    rng = random.Random(5)
    assert not workload.is_paced(cfg, rng)
    assert rng.random() == random.Random(5).random()


# ------------------------------------------------------------------ the throttle


def test_the_cgroup_backend_is_used_only_where_it_can_be(tmp_path: Path) -> None:
    said = slowfaults.cgroup_problem(tmp_path / "absent")
    assert said.startswith("cgroup v1 cpu controller not writable here")


# ---------------------------------------------------------------------- the watch


def node(node_id: str, *conditions: pb.NodeCondition, status: str = "cordoned") -> pb.Node:
    return pb.Node(node_id=node_id, status=status, conditions=list(conditions))


def test_the_watch_records_each_mark_once_and_when_it_is_gone(tmp_path: Path) -> None:
    slow = pb.NodeCondition(name="degraded", message="slow", since_ms=7)
    answers = [
        [node("w1", status="ready"), node("w2", status="ready")],
        [node("w1", slow)],
        [node("w1", slow)],
        [node("w1", slow, status="ready")],  # made ready again: about to be cleared
        [node("w1", slow, status="ready")],
        [node("w1", pb.NodeCondition(name="gpu-clocks", message="held", since_ms=8))],
    ]
    observer = SimpleNamespace(list_nodes=lambda: answers.pop(0))
    watch = slowfaults.MarkWatch(SimpleNamespace(observer=observer, dir=tmp_path))  # type: ignore[arg-type]
    for _ in range(6):
        watch.look()
    watch.out.close()
    records = list(ledger.read_records(tmp_path / slowfaults.MARKS))
    assert [(r["type"], r["node"], r["since_ms"]) for r in records] == [
        ("degraded", "w1", 7),
        ("ready", "w1", 7),
        ("cleared", "w1", 7),
    ]
    (mark,) = slow_rules.load_marks(tmp_path / slowfaults.MARKS)
    assert mark.node == "w1" and mark.cleared_ns >= mark.ready_ns >= mark.seen_ns > 0


# ---------------------------------------------------------------------- the rules

THROTTLE = Throttle(4, "w1", "job-9/t3 rank 1", 100 * S, 120 * S, 108 * S, 114 * S)


def test_a_throttle_that_saw_no_mark_is_a_violation() -> None:
    assert check_unmarked([THROTTLE]) == []
    unmarked = Throttle(4, "w1", "job-9/t3 rank 1", 100 * S, 120 * S)
    (v,) = check_unmarked([unmarked])
    assert (v.kind, v.job) == ("slow-node-unmarked", "job-9")
    assert "throttled job-9/t3 rank 1 on w1" in v.detail


def test_a_mark_names_a_node_throttled_at_the_time() -> None:
    ok = Mark("w1", 50_000, 108 * S, 115 * S)
    assert check_marks([ok], [THROTTLE]) == []
    healthy = Mark("w2", 50_000, 108 * S)  # another node, during the throttle
    before = Mark("w1", 40_000, 90 * S)  # the right node, before the throttle
    after = Mark("w1", 90_000, 140 * S)  # the right node, well after the heal
    found = check_marks([ok, healthy, before, after], [THROTTLE])
    assert [v.kind for v in found] == ["healthy-node-degraded"] * 3
    assert [v.detail.split()[1] for v in found] == ["w2", "w1", "w1"]
    assert check_marks([healthy], []) != []
    evidence = Mark("w2", 50_000, 108 * S, message="slower than its peers by 31 %")
    (v,) = check_marks([evidence], [THROTTLE])
    assert v.detail.endswith(": slower than its peers by 31 %")


def test_nothing_is_bound_to_a_node_while_it_is_marked() -> None:
    # Marked at leader time 50_000 and seen at 108 s; uncordoned 6 s later (114 s).
    mark = Mark("w1", 50_000, 108 * S, 115 * S)
    binds = [
        ("job-1", 3, "admin", 49_000, "w1"),  # before the mark
        ("job-2", 4, "admin", 50_500, "w1"),  # within the slack: planned before it
        ("job-3", 5, "admin", 53_000, "w1"),  # while marked
        ("job-4", 6, "admin", 53_000, "w2"),  # another node
        ("job-5", 7, "admin", 56_500, "w1"),  # after the uncordon
    ]
    (v,) = check_binds([mark], [THROTTLE], binds)
    assert (v.kind, v.job) == ("degraded-bind", "job-3")
    assert "bound to w1 at 53000, 3000 ms after" in v.detail
    # A mark never lifted holds to the end; one seen gone or its node seen ready (another
    # heal, or the end of the run, uncordoned it) ends a little before it was seen so.
    never = Mark("w2", 50_000, 108 * S)
    assert [v.job for v in check_binds([never], [], binds)] == ["job-4"]
    gone = Mark("w2", 50_000, 108 * S, cleared_ns=112 * S)  # lifted by 110 s: 52_000
    assert check_binds([gone], [], binds) == []
    ready = Mark("w2", 50_000, 108 * S, ready_ns=113 * S)  # lifted by 112.5 s: 54_500
    assert [v.job for v in check_binds([ready], [], binds)] == ["job-4"]
    ready = Mark("w2", 50_000, 108 * S, ready_ns=111 * S)  # lifted by 110.5 s: 52_500
    assert check_binds([ready], [], binds) == []
    assert NEVER > 10**15


def test_the_rules_over_a_saved_run(tmp_path: Path) -> None:
    with ledger.Appender(tmp_path / ledger.FAULTS) as out:
        out.append({"type": "fault", "kind": "kill-worker", "step": 0, "end_ns": 1})
        out.append(
            {
                "type": "fault",
                "kind": nemesis.SLOW_NODE,
                "step": 1,
                "slow_found": False,
                "slow_node": "",
                "end_ns": 2,
            }
        )
        out.append(
            {
                "type": "fault",
                "kind": nemesis.SLOW_NODE,
                "step": 2,
                "slow_found": True,
                "slow_node": "w1",
                "slow_member": "job-9/t3 rank 1",
                "slow_started_ns": 100 * S,
                "slow_marked_ns": 0,
                "end_ns": 120 * S,
            }
        )
    with ledger.Appender(tmp_path / slowfaults.MARKS) as out:
        out.append({"type": "degraded", "node": "w3", "since_ms": 5, "seen_ns": 109 * S})
    (throttle,) = slow_rules.load_throttles(tmp_path / ledger.FAULTS)
    assert (throttle.step, throttle.node, throttle.uncordon_ns) == (2, "w1", NEVER)
    found = slow_rules.check_run_dir(tmp_path, History(), None)
    assert sorted(v.kind for v in found) == ["healthy-node-degraded", "slow-node-unmarked"]


@pytest.mark.parametrize("marks", [[], [Mark("w1", 50_000, 108 * S)]])
def test_a_clean_run_breaks_no_rule(marks: list[Mark]) -> None:
    assert check_marks(marks, [THROTTLE]) == []
    assert check_binds(marks, [THROTTLE], [("job-1", 3, "admin", 49_000, "w1")]) == []


def test_faults_that_found_no_paced_gang_are_said(tmp_path: Path) -> None:
    with ledger.Appender(tmp_path / ledger.FAULTS) as out:
        out.append({"kind": nemesis.SLOW_NODE, "slow_found": True})
        out.append({"kind": nemesis.SLOW_NODE, "slow_found": False})
        out.append({"kind": nemesis.KILL_WORKER})
    said = slowfaults.unfound([tmp_path / ledger.FAULTS, tmp_path / "absent.jsonl"])
    assert said == ["slow-node: 1 of 2 faults found no paced gang"]
    assert slowfaults.unfound([tmp_path / "absent.jsonl"]) == []


def test_a_members_process_is_found_in_its_own_pid_namespace(tmp_path: Path) -> None:
    me = os.getpid()
    ticks = start_ticks(me)
    here = SeenMember("w1", 0, process=(me, pid_namespace(), ticks))
    assert slowfaults.host_pid(here) == me
    assert slowfaults.host_pid(SeenMember("w1", 0, process=(me, pid_namespace(), ticks + 1))) == 0
    # Started by a worker in a PID namespace of its own, where it is pid 2.
    (tmp_path / str(me) / "ns").mkdir(parents=True)
    (tmp_path / str(me) / "ns" / "pid").symlink_to("pid:[77]")
    (tmp_path / str(me) / "status").write_text(f"Name:\tpython\nNSpid:\t{me}\t2\n")
    (tmp_path / "self").mkdir()
    inside = SeenMember("w1", 0, process=(2, 77, ticks))
    assert slowfaults.host_pid(inside, tmp_path) == me
    assert slowfaults.host_pid(SeenMember("w1", 0, process=(2, 78, ticks)), tmp_path) == 0
    assert slowfaults.host_pid(SeenMember("w1", 0, process=(3, 77, ticks)), tmp_path) == 0


def test_a_paced_member_finishes_its_work_on_sigusr2(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "SYNAPSE_JOB_ID": "job-1",
        "SYNAPSE_ATTEMPT": "1",
        "SYNAPSE_FENCING_TOKEN": "3",
        "RANK": "0",
        member.PACE_ENV: "1",
        "SYNAPSE_PROGRESS_FILE": str(tmp_path / "progress"),
        "PYTHONPATH": str(Path(member.__file__).resolve().parent.parent),
    }
    ledger_path = tmp_path / "ledger.jsonl"
    argv = [sys.executable, "-m", "chaos.member", str(ledger_path), "127.0.0.1:9", "600000"]
    process = subprocess.Popen(argv, env=env)
    try:

        def beat() -> bool | None:
            assert process.poll() is None
            return any(r["type"] == "heartbeat" for r in ledger.read_records(ledger_path)) or None

        wait_until("the member's first heartbeat record", beat, 30.0, every_s=0.05)
        process.send_signal(signal.SIGUSR2)
        assert process.wait(timeout=60) == 4  # its commit found no sink here
    finally:
        process.kill()
    types = [r["type"] for r in ledger.read_records(ledger_path)]
    assert types[0] == "start" and types[-2:] == ["effect", "end"]
    assert all(r.get("paced") for r in ledger.read_records(ledger_path))
