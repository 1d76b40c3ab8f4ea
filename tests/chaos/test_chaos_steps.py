"""sbatch jobs in the chaos suite: the workload's batch script, its records, and the three
step rules (chaos/step_rules.py) on hand-made histories."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from chaos import ledger
from chaos.checker import check_history
from chaos.cluster import REPO, ChaosCluster, LedgerTail
from chaos.history import FaultRecord, History, MemberRecord, StepRecord, load_history
from chaos.members_seen import SeenMembers
from chaos.step_rules import check_steps, step_counts
from chaos.workload import WorkloadConfig, batch_script, is_sbatch, sbatch_spec
from synapse_ha.local.allocation import LocalAllocation

MS = 1_000_000  # nanoseconds per millisecond


def task(kind: str, token: int, at_ms: int, step: int = 0, rank: int = 0, **kw: int) -> StepRecord:
    """A record of task ``rank`` of ``step`` of job j1's attempt with ``token`` (attempt
    number = token), written by pid ``100 * token + 10 * step + rank`` on w1 unless told."""
    pid = kw.pop("pid", 100 * token + 10 * step + rank)
    node = "w2" if kw.pop("on_w2", 0) else "w1"
    return StepRecord(kind, "j1", token, token, node, at_ms * MS, pid, step, rank, **kw)


def batch(kind: str, token: int, at_ms: int, pid: int = 0) -> StepRecord:
    return StepRecord(kind, "j1", token, token, "w1", at_ms * MS, pid or 100 * token)


def kinds(history: History) -> list[str]:
    return [v.kind for v in check_steps(history)]


def attempt(token: int, began_ms: int) -> list[StepRecord]:
    """One whole attempt: the script, two steps of two tasks for 1 s, the script's end."""
    return [
        batch("batch-start", token, began_ms),
        *(
            task(kind, token, began_ms + at, step, rank)
            for step in (0, 1)
            for rank in (0, 1)
            for kind, at in (("task-start", 100), ("task-heartbeat", 600), ("task-end", 1_100))
        ),
        batch("batch-end", token, began_ms + 1_500),
    ]


def test_two_attempts_one_after_the_other_keep_every_step_rule() -> None:
    history = History(steps=[*attempt(3, 0), *attempt(4, 2_000)])
    assert kinds(history) == []
    assert step_counts(history) == {"jobs": 1, "batch_runs": 2, "steps": 4, "tasks": 8}


def test_a_batch_script_started_twice_in_one_attempt_is_batch_twice() -> None:
    history = History(steps=[*attempt(3, 0), batch("batch-start", 3, 50, pid=999)])
    found = check_steps(history)
    assert [v.kind for v in found] == ["batch-twice"]
    assert "attempt 3 (token 3) ran 2 times (pids [300, 999])" in found[0].detail


def test_a_task_writing_after_a_newer_attempt_began_outlived_its_lease() -> None:
    late = task("task-heartbeat", 3, 2_150, step=1, rank=1)
    history = History(steps=[*attempt(3, 0), *attempt(4, 2_000), late])
    found = check_steps(history)
    assert [v.kind for v in found] == ["step-outlived", "step-task-twice"]
    assert "task 1 of step 1 of token 3 on w1 (pid 311) wrote 'task-heartbeat' 150 ms" in (
        found[0].detail
    )
    # A newer attempt's commit member counts as its beginning too; so does the batch script.
    member = MemberRecord("start", "j1", 5, 5, 0, "w2", 1_000, 7)
    stale_script = batch("batch-end", 3, 1_500)
    history = History(members=[member], steps=[batch("batch-start", 3, 0), stale_script])
    assert kinds(history) == ["step-outlived"]


def test_records_of_an_attempt_frozen_with_its_host_are_excused_until_the_thaw_bound() -> None:
    freeze = FaultRecord("freeze-host", ("w2",), 500 * MS, 3_000 * MS, frozen_node="w2")
    frozen = [
        task("task-start", 3, 100, on_w2=1),
        task("task-heartbeat", 3, 3_400, on_w2=1),  # after the thaw, within the bound
    ]
    newer = [batch("batch-start", 4, 2_000), task("task-start", 4, 2_100)]
    assert kinds(History(steps=[*frozen, *newer], faults=[freeze])) == []
    beyond = task("task-heartbeat", 3, 4_100, on_w2=1)
    assert kinds(History(steps=[*frozen, *newer, beyond], faults=[freeze])) == [
        "step-outlived",
        "step-task-twice",
    ]
    # Not on the frozen host: not excused.
    elsewhere = task("task-heartbeat", 3, 3_400)
    assert kinds(History(steps=[*frozen, *newer, elsewhere], faults=[freeze])) == [
        "step-outlived",
        "step-task-twice",
    ]


def test_two_copies_of_one_step_task_alive_at_once_is_step_task_twice() -> None:
    first = [task("task-start", 3, 100), task("task-end", 3, 1_000)]
    again = [task("task-start", 3, 900, pid=77), task("task-end", 3, 1_800, pid=77)]
    found = check_steps(History(steps=[*first, *again]))
    assert [v.kind for v in found] == ["step-task-twice"]
    assert "ran as pid 300 (token 3) and pid 77 (token 3) at once for 100 ms" in found[0].detail
    after = [task("task-start", 3, 1_100, pid=77), task("task-end", 3, 1_800, pid=77)]
    assert kinds(History(steps=[*first, *after])) == []
    # One pid in two PID namespaces is two processes.
    other_ns = [task("task-start", 3, 500, pid_ns=9), task("task-end", 3, 700, pid_ns=9)]
    assert kinds(History(steps=[*first, *other_ns])) == ["step-task-twice"]


def test_the_checker_runs_the_step_rules_on_a_saved_run(tmp_path: Path) -> None:
    with ledger.Appender(tmp_path / ledger.STEPS) as out:
        for r in [*attempt(3, 0), batch("batch-start", 3, 20, pid=999)]:
            record = {
                "type": r.type,
                "job": r.job,
                "attempt": r.attempt,
                "token": r.token,
                "node": r.node,
                "mono_ns": r.mono_ns,
                "pid": r.pid,
            }
            out.append(record if r.step < 0 else {**record, "step": r.step, "task": r.task})
    history = load_history(tmp_path)
    assert step_counts(history) == {"jobs": 1, "batch_runs": 1, "steps": 2, "tasks": 4}
    assert "batch-twice" in {v.kind for v in check_history(history)}


def config(run_dir: Path, sink: str = "127.0.0.1:1", share: float = 0.0) -> WorkloadConfig:
    return WorkloadConfig(
        seed=1,
        replicas=[],
        submissions=str(run_dir / ledger.SUBMISSIONS),
        ledger=str(run_dir / ledger.LEDGER),
        sink=sink,
        stop_file="",
        python=sys.executable,
        pythonpath=str(REPO),
        steps=str(run_dir / ledger.STEPS),
        queue_gpus=8,
        sbatch_share=share,
    )


def test_the_workload_submits_a_two_node_allocation_translated_as_sbatch_does(
    tmp_path: Path,
) -> None:
    rng = random.Random(3)
    untouched = rng.getstate()
    assert not is_sbatch(config(tmp_path), rng)
    assert rng.getstate() == untouched  # no share: nothing drawn, the same jobs as before
    spec = sbatch_spec(config(tmp_path), random.Random(3), 7)
    assert (spec.name, spec.replicas, spec.resources.gpu) == ("chaos-1-7", 2, 1)
    assert spec.queue in ("team-a", "team-b") and spec.retries.max == 100
    assert ("PYTHONPATH", str(REPO)) in [(e.name, e.value) for e in spec.env]
    assert spec.workdir == str(tmp_path)
    args = list(spec.argv.args)
    script = args[args.index("-c", 3) + 1]
    assert "-m synapse_ha.slurm.stepd" in args[2]
    assert script.count(" &\n") == 3 and 'wait "$commit"; status=$?' in script
    assert "-m chaos.member" in script


def _start_sink(run_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    sink = subprocess.Popen(
        [sys.executable, "-m", "chaos.sink", address, str(run_dir / ledger.EFFECTS)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    host, _, port = address.rpartition(":")
    for _ in range(100):
        try:
            socket.create_connection((host, int(port)), timeout=0.2).close()
            return sink, address
        except OSError:
            time.sleep(0.05)
    return sink, address  # the run below then fails on its commit


def test_the_batch_script_runs_as_an_allocation_and_every_task_records_itself(
    tmp_path: Path,
) -> None:
    sink, address = _start_sink(tmp_path)
    local = LocalAllocation(tmp_path)
    try:
        script = batch_script(config(tmp_path, address), "chaos-1-1", "", "", (300, 400, 100))
        ran = local.run(script, env={"SYNAPSE_ATTEMPT": "1", "PYTHONPATH": str(REPO)})
    finally:
        local.close()
        sink.terminate()
        sink.wait(10)
    assert ran.codes == [0, 0], ran.outputs
    history = load_history(tmp_path)
    assert step_counts(history) == {"jobs": 1, "batch_runs": 1, "steps": 2, "tasks": 6}
    assert check_steps(history) == []
    # The background steps are numbered in the order their sruns reached the hub.
    ended: dict[int, set[int]] = defaultdict(set)
    for r in history.steps:
        if r.type == "task-end":
            ended[r.step].add(r.task)
    assert sorted(map(sorted, ended.values())) == [[0, 1], [0, 1, 2, 3]]
    assert set(ended) < {0, 1, 2}
    assert {(r.job, r.attempt, r.token) for r in history.steps} == {("job-000042", 1, 7)}
    ends = [r for r in ledger.read_records(tmp_path / ledger.STEPS) if r["type"] == "batch-end"]
    assert [e["statuses"] for e in ends] == [[0, 0, 0]]
    committed = {(e.rank, e.accepted) for e in history.effects}
    assert committed == {(0, True), (1, True)}


def test_the_observer_sees_sbatch_attempts_on_their_hosts(tmp_path: Path) -> None:
    """The nemesis picks busy hosts, their GPUs and the gangs a freeze must see fenced from
    the observer's tail of the ledgers: step tasks and batch scripts count as members."""
    cluster = ChaosCluster.__new__(ChaosCluster)
    cluster.ledger_tail = LedgerTail(tmp_path / ledger.LEDGER)
    cluster.steps_tail = LedgerTail(tmp_path / ledger.STEPS)
    cluster.node_by_address = {"10.0.0.21": "w1", "10.0.0.22": "w2"}
    cluster.last_beat, cluster.last_start, cluster.newest_token = {}, {}, {}
    cluster.gpus_seen, cluster.last_seen = {}, {}
    cluster.members_seen = SeenMembers()
    now = ledger.now_ns()
    with ledger.Appender(tmp_path / ledger.STEPS) as out:
        base = {"job": "j1", "attempt": 2, "token": 5, "mono_ns": now}
        out.append({"type": "batch-start", **base, "node": "10.0.0.21", "gpus": "1"})
        out.append({"type": "task-start", **base, "node": "10.0.0.22", "gpus": "3", "step": 0})
    cluster._read_ledger()
    assert cluster.running_gangs() == ["j1/t5@w1", "j1/t5@w2"]
    assert (cluster.held_gpus("w1"), cluster.held_gpus("w2")) == ({1}, {3})
    # The attempt counts as newer for a freeze's wait once a member of its commit step has
    # started (and claimed its token at the sink), not at its script's start: a member
    # frozen and thawed before the claim would find the sink still taking its token.
    assert cluster.newest_token == {}
    with ledger.Appender(tmp_path / ledger.LEDGER) as out:
        out.append({"type": "start", **base, "node": "10.0.0.21", "gpus": "1", "rank": 0})
    cluster._read_ledger()
    assert cluster.newest_token == {"j1": 5}
