"""The ``gpu-xid`` fault kind and the checker's GPU-health rules: the schedule draws the
kind, the nemesis writes what the worker reads and repairs what the state holds (on a
fake cluster), and each rule fails on a hand-made history that breaks it and passes on
one that keeps it."""

from __future__ import annotations

import json
import random
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from chaos import gpu_rules, gpufaults, ledger, nemesis, run
from chaos.checker import History, check_history, check_run
from chaos.history import AttemptHistory, GpuUnhealthy, JobHistory, load_history
from synapse_ha.core.codec.versioned import encode_state
from synapse_ha.core.health.fitness import GpuFault
from synapse_ha.core.model import (
    AttemptState,
    ClusterState,
    JobState,
    Node,
    NodeInfo,
    NodeStatus,
    Resources,
)
from synapse_ha.core.reasons import ReasonCode, reason
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.worker.gpu_health import HealthRecord, MockFaultFile
from synapse_ha.worker.xid import XidTable
from tests.chaos.test_chaos_checker import HEAL_WALL_MS, clean_history, final_state

BOUND = HEAL_WALL_MS - 5_000  # every attempt of final_state() was bound then


def kinds(history: History) -> list[str]:
    return [v.kind for v in check_history(history)]


# ------------------------------------------------------------------- the schedule


def test_gpu_xid_is_in_the_targeted_scenario_and_the_worker_lanes() -> None:
    assert nemesis.GPU_XID in {s.kind for s in nemesis.targeted_schedule(3)}
    assert nemesis.GPU_XID in nemesis.WORKER_FAULTS
    assert nemesis.GPU_XID not in nemesis.CONTROL_FAULTS
    lanes = nemesis.random_schedule(4, 600.0, lanes=3)
    drawn = {s.lane for s in lanes if s.kind == nemesis.GPU_XID}
    assert drawn and 0 not in drawn
    for step in nemesis.targeted_schedule(5):
        if step.kind == nemesis.GPU_XID:
            assert 3.0 <= step.duration_s <= 5.0


def test_every_xid_drawn_is_fatal_in_the_workers_table_and_parses_as_it_reads() -> None:
    assert set(gpufaults.FATAL_XIDS) <= XidTable().unhealthy()


def test_the_line_appended_is_read_by_the_workers_mock_fault_file(tmp_path: Path) -> None:
    path = tmp_path / "w1.gpu-faults"
    path.touch()
    record = HealthRecord(4, XidTable())
    reader = MockFaultFile(path, record)
    gpufaults.append_line(path, gpufaults.xid_line(2, 79))
    assert reader.read_new() == 1
    assert [(f.gpu, f.code) for f in record.faults()] == [(2, "xid-79")]


def test_the_gpu_is_one_a_gang_holds_and_not_already_unhealthy() -> None:
    rng = random.Random(1)
    assert {gpufaults.choose_gpu({1, 3}, {3}, 4, rng) for _ in range(20)} == {1}
    assert {gpufaults.choose_gpu({3}, {3}, 4, rng) for _ in range(40)} == {0, 1, 2}
    assert gpufaults.choose_gpu(set(), {0, 1, 2, 3}, 4, rng) in range(4)
    picks = [gpufaults.choose_gpu({0, 1, 2}, set(), 4, random.Random(7)) for _ in range(3)]
    assert len(set(picks)) == 1  # seeded
    with pytest.raises(ValueError, match="gpus"):
        gpufaults.choose_gpu(set(), set(), 0, rng)


# ----------------------------------------------------- the nemesis on a fake cluster


@dataclass
class FakeProcess:
    alive: bool = True
    kills: int = 0

    def kill(self) -> None:
        self.alive, self.kills = False, self.kills + 1


@dataclass
class FakeObserver:
    """The leader's node list: a fault the worker reports appears (since_ms = now)."""

    faults: dict[int, int] = field(default_factory=dict)  # gpu -> since_ms
    repairs: list[list[int]] = field(default_factory=list)
    resurface: int = 0  # how many repairs a report still in flight undoes
    lock: threading.Lock = field(default_factory=threading.Lock)

    def list_nodes(self) -> list[pb.Node]:
        with self.lock:
            faults = [pb.GpuFault(gpu=g, code="xid-79", since_ms=s) for g, s in self.faults.items()]
        return [pb.Node(node_id="w1", gpu_faults=faults), pb.Node(node_id="w2")]

    def repair_gpus(self, node_id: str, gpus: list[int]) -> pb.RepairGpusResponse:
        assert node_id == "w1"
        with self.lock:
            self.repairs.append(list(gpus))
            for g in gpus:
                self.faults.pop(g, None)
                if self.resurface:
                    self.resurface -= 1
                    self.faults[g] = gpufaults.wall_ms() + 1
        return pb.RepairGpusResponse()


@dataclass
class FakeCluster:
    dir: Path
    observer: FakeObserver = field(default_factory=FakeObserver)
    workers: dict[str, FakeProcess] = field(default_factory=lambda: {"w1": FakeProcess()})
    restarts: int = 0

    def held_gpus(self, worker: str) -> set[int]:
        return {1, 2}

    def address(self, name: str) -> str:
        return "10.77.0.21"

    def gpu_fault_file(self, worker: str) -> Path:
        return self.dir / f"{worker}.gpu-faults"

    def restart(self, process: FakeProcess) -> None:
        process.alive = True
        self.restarts += 1


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpufaults, "SETTLE_S", 0.05)
    monkeypatch.setattr(gpufaults, "POLL_S", 0.005)


@pytest.mark.usefixtures("quick")
def test_the_fault_is_written_watched_and_healed_by_restart_and_repair(tmp_path: Path) -> None:
    c = FakeCluster(tmp_path)
    extra: dict[str, object] = {}
    detail, watch, heal = gpufaults.play_gpu_xid(c, "w1", random.Random(3), extra)  # type: ignore[arg-type]
    gpu = extra["gpu"]
    assert gpu in (1, 2) and extra["xid"] in gpufaults.FATAL_XIDS
    assert c.gpu_fault_file("w1").read_text() == f"{gpu} xid {extra['xid']}\n"
    assert f"GPU {gpu} xid" in detail and "held by gangs" in detail
    watch()
    assert extra["gpu_unhealthy_ms"] == []  # the worker has not reported it yet
    assert isinstance(gpu, int)
    c.observer.faults[gpu] = 1_000
    watch()
    watch()
    c.observer.resurface = 1  # the killed agent's last report lands after the repair
    heal()
    assert c.workers["w1"].kills == 1 and c.restarts == 1
    assert extra["repaired"] is True and c.observer.faults == {}
    spans = extra["gpu_unhealthy_ms"]
    assert isinstance(spans, list) and len(spans) == 2 and spans[0][0] == 1_000
    assert all(0 < s[1] <= s[2] for s in spans)
    assert c.observer.repairs == [[gpu], [gpu]]


@pytest.mark.usefixtures("quick")
def test_the_end_of_the_run_repairs_what_is_left(tmp_path: Path) -> None:
    c = FakeCluster(tmp_path)
    c.observer.faults = {0: 500, 3: 700}
    done = gpufaults.repair_all(c)  # type: ignore[arg-type]
    assert [(r["gpu"], r["repaired"], r["gpu_unhealthy_ms"][0][0]) for r in done] == [  # type: ignore[index]
        (0, True, 500),
        (3, True, 700),
    ]
    assert c.restarts == 1 and c.observer.faults == {}
    assert gpufaults.repair_all(c) == []  # type: ignore[arg-type]


# ------------------------------------------------------------ rule: unhealthy-start


def on_gpu(history: History, job: str, token: int, rank: int, gpus: tuple[int, ...]) -> None:
    """The start records of (job, token, rank) name ``gpus`` on node w1."""
    history.members = [
        replace(r, node="w1", gpus=gpus)
        if (r.job, r.token, r.rank, r.type) == (job, token, rank, "start")
        else r
        for r in history.members
    ]


def test_a_member_bound_while_its_gpu_was_unhealthy_is_flagged() -> None:
    history = clean_history()
    on_gpu(history, "j1", 3, 0, (0, 2))
    history.gpu_unhealthy = [GpuUnhealthy("w1", 2, BOUND - 1_000, BOUND + 3_000)]
    found = check_history(history)
    assert [(v.kind, v.job) for v in found] == [("unhealthy-start", "j1")]
    assert "GPU 2 of w1" in found[0].detail and "rank 0 of token 3" in found[0].detail
    # Never repaired (still in the final state) counts the same.
    history.gpu_unhealthy = [GpuUnhealthy("w1", 2, BOUND)]
    assert kinds(history) == ["unhealthy-start"]


def test_binds_before_the_report_or_after_the_repair_are_allowed() -> None:
    history = clean_history()
    on_gpu(history, "j1", 3, 0, (2,))
    later = GpuUnhealthy("w1", 2, BOUND + 1, BOUND + 3_000)  # reported after the bind
    repaired = GpuUnhealthy("w1", 2, BOUND - 9_000, BOUND - 100 + gpu_rules.REPAIR_SLACK_MS)
    other_gpu = GpuUnhealthy("w1", 1, BOUND - 1_000)
    other_node = GpuUnhealthy("w2", 2, BOUND - 1_000)
    history.gpu_unhealthy = [later, repaired, other_gpu, other_node]
    assert check_history(history) == []
    # The repair's own stamp is later than its sending: a bind within the slack of the
    # sending is not judged, one before it is.
    history.gpu_unhealthy = [replace(repaired, repair_sent_ms=BOUND + 10)]
    assert check_history(history) == []
    history.gpu_unhealthy = [
        replace(repaired, repair_sent_ms=BOUND + 1 + gpu_rules.REPAIR_SLACK_MS)
    ]
    assert kinds(history) == ["unhealthy-start"]


def test_a_fault_still_in_the_final_state_and_older_attempts_binds_are_used() -> None:
    history = clean_history()
    state = final_state(
        ("j1", "req-1", 3, 1, JobState.SUCCEEDED), ("j2", "req-2", 6, 2, JobState.SUCCEEDED)
    )
    info = NodeInfo("n1", "w1:7070", Resources(8000, 16384, 4), ((0, 1, 2, 3),))
    state.nodes["n1"] = Node(info, NodeStatus.READY, 0, gpu_faults=(GpuFault(3, "xid-79", "", 10),))
    history.replica_states = {r: encode_state(state) for r in ("r1", "r2", "r3")}
    assert check_history(history) == []
    # j2's first attempt (token 4) is not in the final state; the history has its bind.
    on_gpu(history, "j2", 4, 0, (3,))
    assert check_history(history) == []  # no bind known: not judged
    history.job_history = [
        JobHistory(
            "j2",
            JobState.SUCCEEDED,
            "succeeded",
            1,
            0,
            (AttemptHistory(1, 4, AttemptState.REQUEUED, 20, "node_dead"),),
        )
    ]
    found = check_history(history)
    assert [(v.kind, v.job) for v in found] == [("unhealthy-start", "j2")]
    assert "never repaired" in found[0].detail


# ----------------------------------------------------------- rule: gpu-fault-failed


def sick_job(
    state: AttemptState = AttemptState.REQUEUED,
    requeues: int = 1,
    job_state: JobState = JobState.SUCCEEDED,
    reason_code: str = "succeeded",
) -> JobHistory:
    return JobHistory(
        "j2",
        job_state,
        reason_code,
        requeues,
        0,
        (
            AttemptHistory(1, 4, state, 10, gpu_rules.GPU_UNHEALTHY),
            AttemptHistory(2, 6, AttemptState.SUCCEEDED, 20, "all_exited_zero"),
        ),
    )


def test_an_attempt_ended_by_an_unhealthy_gpu_must_be_a_requeue() -> None:
    history = clean_history()
    history.job_history = [sick_job()]
    assert check_history(history) == []
    history.job_history = [sick_job(state=AttemptState.FAILED, requeues=0)]
    found = check_history(history)
    assert [(v.kind, v.job) for v in found] == [("gpu-fault-failed", "j2")] * 2
    assert "ended gpu_unhealthy as failed" in found[0].detail
    assert "only 0 requeues" in found[1].detail


def test_a_job_failed_after_its_gpu_went_bad_is_flagged_unless_requeues_ran_out() -> None:
    last_sick = sick_job(job_state=JobState.FAILED, reason_code="failed_retries")
    last_sick = replace(last_sick, attempts=last_sick.attempts[:1])
    history = clean_history()
    history.job_history = [last_sick]
    assert kinds(history) == ["gpu-fault-failed"]
    history.job_history = [replace(last_sick, reason_code="failed_max_requeues")]
    assert check_history(history) == []


def _state_with_last_attempt(state: AttemptState, requeues: int, job: JobState) -> ClusterState:
    cluster = final_state(("j1", "req-1", 3, 1, JobState.SUCCEEDED))
    j1 = cluster.jobs["j1"]
    assert j1.attempt is not None
    j1.attempt.state = state
    j1.attempt.outcome = reason(ReasonCode.GPU_UNHEALTHY, node="w1", gpus="0", code="xid-79")
    j1.requeues, j1.state = requeues, job
    j1.reason = reason(ReasonCode.REQUEUED_GPU_UNHEALTHY)
    return cluster


def test_the_final_states_last_attempt_is_judged_too() -> None:
    history = History()
    ok = _state_with_last_attempt(AttemptState.REQUEUED, 1, JobState.PENDING)
    assert gpu_rules.check_gpu_fault_failures(history, ok) == []
    failed = _state_with_last_attempt(AttemptState.FAILED, 0, JobState.FAILED)
    found = gpu_rules.check_gpu_fault_failures(history, failed)
    assert [(v.kind, v.job) for v in found] == [("gpu-fault-failed", "j1")]
    # A job the history knows is judged from the history alone.
    history.job_history = [replace(sick_job(), job="j1")]
    assert gpu_rules.check_gpu_fault_failures(history, failed) == []


# ------------------------------------------------------------------ the saved run


def test_the_run_saves_and_the_checker_reads_spans_and_the_job_history(tmp_path: Path) -> None:
    attempt = pb.HistoryAttempt(
        number=1,
        fencing_token=4,
        state="requeued",
        attempt_state=pb.ATTEMPT_STATE_REQUEUED,
        bound_at_ms=BOUND,
        outcome_code=gpu_rules.GPU_UNHEALTHY,
    )
    job = pb.HistoryJob(
        job_id="j2",
        state="SUCCEEDED",
        job_state=pb.JOB_STATE_SUCCEEDED,
        reason_code="succeeded",
        requeues=0,
        attempt_list=[attempt],
    )

    class Observer:
        def list_history(self, limit: int) -> list[pb.HistoryJob]:
            assert limit == run.HISTORY_LIMIT
            return [job]

    class Cluster:
        observer = Observer()

    run.save_job_history(Cluster(), tmp_path / "job_history.json")  # type: ignore[arg-type]
    span = {"gpu_node_address": "w1", "gpu": 1, "gpu_unhealthy_ms": [[100, 900, 950]]}
    with ledger.Appender(tmp_path / ledger.FAULTS) as out:
        out.append({"type": "fault", "kind": "gpu-xid", "start_ns": 1, "end_ns": 2, **span})
        out.append({"type": "fault", "kind": "kill-worker", "start_ns": 3, "end_ns": 4})
    repair = {**span, "gpu": 3, "gpu_unhealthy_ms": [[200, 0, 0]]}
    (tmp_path / "meta.json").write_text(json.dumps({"gpu_repairs": [repair]}))
    history = load_history(tmp_path)
    assert history.gpu_unhealthy == [GpuUnhealthy("w1", 3, 200), GpuUnhealthy("w1", 1, 100, 900)]
    (loaded,) = history.job_history
    assert loaded.attempts == (
        AttemptHistory(1, 4, AttemptState.REQUEUED, BOUND, gpu_rules.GPU_UNHEALTHY),
    )
    # requeued, yet not counted in the job's requeues
    assert [v.kind for v in check_run(tmp_path) if v.kind.startswith("gpu")] == ["gpu-fault-failed"]
