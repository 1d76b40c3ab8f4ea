"""The ``node-cannot-run`` fault kind and the checker's node-fitness rules: the schedule
draws the kind, the nemesis restarts the worker in owner mode and heals it (on a fake
cluster), the soak can play the health kinds alone, and each rule fails on a hand-made
history that breaks it and passes on one that keeps it."""

from __future__ import annotations

import argparse
import json
import random
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from chaos import ledger, nemesis, node_rules, nodefaults, run
from chaos.__main__ import (
    build_parser,
    faults_of,
    parse_faults,
    parse_only_kinds,
    played_kinds,
    skipped_kinds,
)
from chaos.checker import History, check_history, check_run
from chaos.history import (
    AttemptHistory,
    JobHistory,
    MemberRecord,
    UnfitSpan,
    load_history,
    load_job_history,
)
from chaos.net import Backends
from chaos.run import ScenarioResult
from synapse_ha.core.codec.versioned import encode_state
from synapse_ha.core.health.fitness import Unfit
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
from synapse_ha.worker.accounts import (
    RunAsMode,
    RunAsPolicy,
    RunAsRefusal,
    RunAsRefusalCode,
    parse_user_map,
    resolve_member_account,
)
from tests.chaos.test_chaos_checker import HEAL_WALL_MS, clean_history, final_state

BOUND = HEAL_WALL_MS - 5_000  # every attempt of final_state() was bound then
CANNOT = node_rules.NODE_CANNOT_RUN


def kinds(history: History) -> list[str]:
    return [v.kind for v in check_history(history)]


# ------------------------------------------------------------------- the schedule


def test_node_cannot_run_is_in_the_targeted_scenario_and_the_worker_lanes() -> None:
    assert nemesis.NODE_CANNOT_RUN in {s.kind for s in nemesis.targeted_schedule(3)}
    assert nemesis.NODE_CANNOT_RUN in nemesis.WORKER_FAULTS
    assert nemesis.NODE_CANNOT_RUN not in nemesis.CONTROL_FAULTS
    assert set(nemesis.HEALTH_FAULTS) == {nemesis.GPU_XID, nemesis.NODE_CANNOT_RUN}
    lanes = nemesis.random_schedule(4, 600.0, lanes=3)
    drawn = {s.lane for s in lanes if s.kind == nemesis.NODE_CANNOT_RUN}
    assert drawn and 0 not in drawn
    for step in nemesis.targeted_schedule(5):
        if step.kind == nemesis.NODE_CANNOT_RUN:
            assert 4.0 <= step.duration_s <= 6.0


def test_the_ci_rotation_draws_the_kind_a_few_times_without_it_dominating() -> None:
    steps = nemesis.random_schedule(1, 300.0)
    drawn = sum(1 for s in steps if s.kind == nemesis.NODE_CANNOT_RUN)
    assert 0 < drawn < len(steps) // 5


def test_a_health_only_schedule_plays_the_worker_lanes_only() -> None:
    steps = nemesis.random_schedule(9, 120.0, kinds=nemesis.HEALTH_FAULTS, lanes=3)
    assert {s.kind for s in steps} == set(nemesis.HEALTH_FAULTS)
    assert {s.lane for s in steps} == {1, 2}
    assert [s.index for s in steps] == list(range(len(steps)))


# ------------------------------------------------------- the worker's flags for it


def test_owner_mode_is_enough_when_the_owner_has_no_account() -> None:
    flags, account = nodefaults.owner_mode_flags("admin", known=lambda name: False)
    assert flags == ["--run-as", "owner"] and account == "admin"


def test_an_owner_with_an_account_is_mapped_to_one_the_machine_lacks() -> None:
    present = {"admin", nodefaults.ABSENT_ACCOUNTS[0]}
    flags, account = nodefaults.owner_mode_flags("admin", known=present.__contains__)
    assert account == nodefaults.ABSENT_ACCOUNTS[1]
    assert flags == ["--run-as", "owner", f"--user-map=admin={account}"]
    with pytest.raises(ValueError, match="all exist"):
        nodefaults.owner_mode_flags("admin", known=lambda name: True)


@pytest.mark.parametrize("present", [set(), {"admin"}])
def test_the_worker_refuses_the_owner_for_a_reason_of_the_node(present: set[str]) -> None:
    flags, account = nodefaults.owner_mode_flags("admin", known=present.__contains__)
    entries = [f.removeprefix("--user-map=") for f in flags if f.startswith("--user-map=")]
    policy = RunAsPolicy(RunAsMode.OWNER, "w1", "root", user_map=parse_user_map(entries))
    refused = resolve_member_account(policy, "admin", lambda name: None)
    assert isinstance(refused, RunAsRefusal) and refused.code is RunAsRefusalCode.NO_ACCOUNT
    assert f"no account {'for user ' if not entries else ''}{account}" in refused.describe()


def test_the_flags_replace_the_launchers_run_as_and_keep_the_rest() -> None:
    argv = ["py", "-m", "w", "--run-as", "agent", "--cpu=8", "--user-map=a=b", "--mock-gpus=4"]
    out = nodefaults.with_flags(argv, ["--run-as", "owner", "--user-map=admin=x"])
    assert out == [
        "py",
        "-m",
        "w",
        "--cpu=8",
        "--mock-gpus=4",
        "--run-as",
        "owner",
        "--user-map=admin=x",
    ]
    assert nodefaults.with_flags(["--user-map", "a=b", "--cpu=8"], []) == ["--cpu=8"]


# ----------------------------------------------------- the nemesis on a fake cluster


@dataclass
class FakeWorker:
    argv: list[str]
    alive: bool = True
    kills: int = 0

    def kill(self) -> None:
        self.alive, self.kills = False, self.kills + 1


@dataclass
class FakeObserver:
    """The leader's node list for w1: unfit entries and a status the test sets."""

    status: pb.NodeStatus = pb.NODE_STATUS_READY
    unfit: list[tuple[str, int]] = field(default_factory=list)
    uncordons: list[str] = field(default_factory=list)
    recordon: int = 0  # how many uncordons a late report of the old agent undoes
    lock: threading.Lock = field(default_factory=threading.Lock)

    def list_nodes(self) -> list[pb.Node]:
        with self.lock:
            entries = [pb.NodeUnfit(owner=o, until_ms=u) for o, u in self.unfit]
            return [pb.Node(node_id="w1", node_status=self.status, unfit=entries)]

    def set_node_status(self, node_id: str, action: str, why: str = "") -> None:
        assert (node_id, action) == ("w1", "uncordon") and why
        with self.lock:
            self.uncordons.append(node_id)
            if self.recordon:
                self.recordon -= 1
            else:
                self.status = pb.NODE_STATUS_READY


@dataclass
class FakeCluster:
    observer: FakeObserver = field(default_factory=FakeObserver)
    workers: dict[str, FakeWorker] = field(
        default_factory=lambda: {"w1": FakeWorker(["worker", "--run-as", "agent", "--cpu=8"])}
    )
    started: list[list[str]] = field(default_factory=list)

    def restart(self, process: FakeWorker) -> None:
        process.alive = True
        self.started.append(list(process.argv))


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodefaults, "SETTLE_S", 0.05)
    monkeypatch.setattr(nodefaults, "POLL_S", 0.005)
    monkeypatch.setattr(nodefaults, "has_account", lambda name: False)


@pytest.mark.usefixtures("quick")
def test_the_fault_restarts_in_owner_mode_watches_and_heals_with_an_uncordon() -> None:
    c = FakeCluster()
    own = list(c.workers["w1"].argv)
    extra: dict[str, object] = {}
    play = nodefaults.play_node_cannot_run
    detail, watch, heal = play(c, "w1", random.Random(1), extra)  # type: ignore[arg-type]
    assert c.started == [["worker", "--cpu=8", "--run-as", "owner"]]
    assert c.workers["w1"].kills == 1 and "no account admin" in detail
    assert extra["unfit_node"] == "w1" and extra["account_absent"] == "admin"
    assert extra["unfit_backoff_ms"] == 2_000
    watch()
    assert extra["unfit_seen"] == [] and extra["cordoned"] is False
    c.observer.unfit = [("admin", 5_000)]
    watch()
    c.observer.unfit = [("admin", 7_000)]
    c.observer.status = pb.NODE_STATUS_CORDONED
    c.observer.recordon = 1  # the old agent's last refusal cordons it once more
    heal()
    assert c.started[-1] == own and c.workers["w1"].argv == own
    assert extra["unfit_seen"] == [["admin", 5_000], ["admin", 7_000]]
    assert (extra["cordoned"], extra["uncordons"], extra["settled"]) == (True, 2, True)
    assert c.observer.status == pb.NODE_STATUS_READY


@pytest.mark.usefixtures("quick")
def test_a_heal_that_cannot_settle_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodefaults, "HEAL_DEADLINE_S", 0.05)
    c = FakeCluster()
    c.observer.status = pb.NODE_STATUS_DEAD  # never comes back
    extra: dict[str, object] = {}
    _, _, heal = nodefaults.play_node_cannot_run(c, "w1", random.Random(1), extra)  # type: ignore[arg-type]
    heal()
    assert extra["settled"] is False


def test_the_end_of_the_run_uncordons_what_is_left() -> None:
    c = FakeCluster()
    c.observer.status = pb.NODE_STATUS_CORDONED
    assert nodefaults.uncordon_all(c) == ["w1"]  # type: ignore[arg-type]
    assert nodefaults.uncordon_all(c) == []  # type: ignore[arg-type]


# --------------------------------------------------------- rule: node-fault-failed


def refused_job(
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
            AttemptHistory(1, 4, state, 10, CANNOT, ("w1", "w2")),
            AttemptHistory(2, 6, AttemptState.SUCCEEDED, 20, "all_exited_zero", ("w2", "w3")),
        ),
        owner="admin",
    )


def test_an_attempt_its_node_could_not_start_must_be_a_requeue() -> None:
    history = clean_history()
    history.job_history = [refused_job()]
    assert check_history(history) == []
    history.job_history = [refused_job(state=AttemptState.FAILED, requeues=0)]
    found = check_history(history)
    assert [(v.kind, v.job) for v in found] == [("node-fault-failed", "j2")] * 2
    assert "ended node_cannot_run as failed" in found[0].detail
    assert "only 0 requeues" in found[1].detail


def test_a_job_failed_with_a_node_fault_in_its_reason_is_flagged_unless_requeues_ran_out() -> None:
    last_refused = refused_job(job_state=JobState.FAILED, reason_code="failed_attempt")
    last_refused = replace(last_refused, attempts=last_refused.attempts[:1])
    history = clean_history()
    history.job_history = [last_refused]
    found = check_history(history)
    assert [v.kind for v in found] == ["node-fault-failed"]
    assert "node_cannot_run" in found[0].detail
    # The job's own reason names the node fault (the last attempt ended otherwise).
    other_end = replace(last_refused.attempts[0], outcome_code="member_exited")
    history.job_history = [
        replace(last_refused, reason_code="requeued_node_cannot_run", attempts=(other_end,))
    ]
    assert kinds(history) == ["node-fault-failed"]
    history.job_history = [replace(last_refused, reason_code="failed_max_requeues")]
    assert check_history(history) == []
    # FAILED for a reason of its own after an earlier requeue is not the node's fault.
    history.job_history = [
        refused_job(job_state=JobState.FAILED, reason_code="failed_exit", requeues=1)
    ]
    assert check_history(history) == []


def _state_with_last_attempt(state: AttemptState, requeues: int, job: JobState) -> ClusterState:
    cluster = final_state(("j1", "req-1", 3, 1, JobState.SUCCEEDED))
    j1 = cluster.jobs["j1"]
    assert j1.attempt is not None
    j1.attempt.state = state
    j1.attempt.outcome = reason(ReasonCode.NODE_CANNOT_RUN, rank=0, node="w1", exit_code=126)
    j1.requeues, j1.state = requeues, job
    j1.reason = reason(ReasonCode.REQUEUED_NODE_CANNOT_RUN, j1.attempt.outcome)
    return cluster


def test_the_final_states_last_attempt_and_reason_chain_are_judged_too() -> None:
    history = History()
    ok = _state_with_last_attempt(AttemptState.REQUEUED, 1, JobState.PENDING)
    assert node_rules.check_node_fault_failures(history, ok) == []
    failed = _state_with_last_attempt(AttemptState.FAILED, 0, JobState.FAILED)
    found = node_rules.check_node_fault_failures(history, failed)
    assert [(v.kind, v.job) for v in found] == [("node-fault-failed", "j1")] * 2
    # The fault deep in the chain: failed_attempt caused by node_cannot_run.
    j1 = failed.jobs["j1"]
    assert j1.attempt is not None
    j1.attempt.state, j1.requeues = AttemptState.REQUEUED, 1
    j1.reason = reason(ReasonCode.FAILED_ATTEMPT, j1.attempt.outcome)
    found = node_rules.check_node_fault_failures(history, failed)
    assert [v.detail for v in found] == [
        "FAILED (failed_attempt) with a node fault in its reason: node_cannot_run"
    ]
    # A job the history knows is judged from the history alone.
    history.job_history = [replace(refused_job(), job="j1")]
    assert node_rules.check_node_fault_failures(history, failed) == []


# --------------------------------------------------------------- rule: unfit-bind


def bound_on(node: str, at: int, owner: str = "admin") -> JobHistory:
    return JobHistory(
        "j3",
        JobState.SUCCEEDED,
        "succeeded",
        0,
        0,
        (AttemptHistory(1, 9, AttemptState.SUCCEEDED, at, "all_exited_zero", (node, "w2")),),
        owner=owner,
    )


def test_an_attempt_bound_to_a_node_unfit_for_its_owner_is_flagged() -> None:
    history = clean_history()
    history.unfit = [UnfitSpan("w1", "admin", BOUND + 2_000, 2_000)]
    history.job_history = [bound_on("w1", BOUND + 1_000)]
    found = check_history(history)
    assert [(v.kind, v.job) for v in found] == [("unfit-bind", "j3")]
    assert "token 9 bound to w1" in found[0].detail and "unfit for admin" in found[0].detail


def test_binds_outside_the_span_or_for_others_are_allowed() -> None:
    history = clean_history()
    history.unfit = [UnfitSpan("w1", "admin", BOUND + 2_000, 2_000)]
    for job in (
        bound_on("w1", BOUND),  # the failure's own millisecond: applied before it
        bound_on("w1", BOUND - 1),
        bound_on("w1", BOUND + 2_000),  # the back-off is over
        bound_on("w1", BOUND + 1_000, owner="bob"),
        bound_on("w3", BOUND + 1_000),
    ):
        history.job_history = [job]
        assert check_history(history) == [], job


def test_the_final_states_unfit_entries_and_last_attempts_are_used() -> None:
    history = clean_history()
    state = final_state(("j1", "req-1", 3, 1, JobState.SUCCEEDED))
    state.jobs["j1"].owner = "admin"
    info = NodeInfo("w2", "10.77.0.22:7070", Resources(8000, 16384, 4), ((0, 1, 2, 3),))
    node = Node(info, NodeStatus.READY, 0, unfit=(Unfit("admin", "no account", BOUND + 10),))
    state.nodes["w2"] = node
    history.replica_states = {r: encode_state(state) for r in ("r1", "r2", "r3")}
    history.submissions = history.submissions[:1]
    history.members = [r for r in history.members if r.job == "j1"]
    history.effects = [e for e in history.effects if e.job == "j1"]
    found = check_history(history)
    assert [(v.kind, v.job) for v in found] == [("unfit-bind", "j1")]
    node.unfit = (Unfit("admin", "no account", BOUND),)
    history.replica_states = {r: encode_state(state) for r in ("r1", "r2", "r3")}
    assert check_history(history) == []


def test_a_node_a_gang_may_have_reached_after_its_bind_is_judged_by_a_first_start() -> None:
    """A gang that places members again (or grows) may have reached a node after its
    bind; the history keeps only the node, so only a start of generation 0 there says
    it was bound with the attempt. A fixed gang's nodes are all judged."""
    state = ClusterState()
    info = NodeInfo("w1", "10.77.0.21:7070", Resources(8000, 16384, 4), ((0, 1, 2, 3),))
    state.nodes["w1"] = Node(info, NodeStatus.READY, 0)
    history = History(unfit=[UnfitSpan("w1", "admin", BOUND + 2_000, 2_000)])

    def start(generation: int) -> MemberRecord:
        return MemberRecord("start", "j3", 1, 9, 0, info.address, 1, 10, generation=generation)

    def flagged() -> list[str]:
        return [v.job for v in node_rules.check_unfit_binds(history, state)]

    fixed = bound_on("w1", BOUND + 1_000)
    for later in (replace(fixed, replaces=True), replace(fixed, gpus=8, min_gpus=4)):
        assert later.places_later
        history.job_history = [later]
        history.members = []
        assert flagged() == []  # its member there may have come later, and been refused
        history.members = [start(1)]
        assert flagged() == []
        history.members = [start(0), start(1)]
        assert flagged() == ["j3"]
    history.job_history, history.members = [fixed], []
    assert not fixed.places_later
    assert flagged() == ["j3"]


# ------------------------------------------------------------------ the saved run


def save_history_of(job: pb.HistoryJob, path: Path) -> None:
    """What ``chaos.run`` saves of a cluster whose history holds ``job`` alone."""

    class Observer:
        def list_history(self, limit: int) -> list[pb.HistoryJob]:
            return [job]

    class Cluster:
        observer = Observer()

    run.save_job_history(Cluster(), path)  # type: ignore[arg-type]


def test_the_run_saves_and_the_checker_reads_owners_nodes_and_unfit_spans(
    tmp_path: Path,
) -> None:
    attempt = pb.HistoryAttempt(
        number=1,
        fencing_token=4,
        state="requeued",
        attempt_state=pb.ATTEMPT_STATE_REQUEUED,
        bound_at_ms=BOUND,
        outcome_code=CANNOT,
        nodes=["w1", "w2"],
    )
    job = pb.HistoryJob(
        job_id="j2",
        owner="admin",
        state="SUCCEEDED",
        job_state=pb.JOB_STATE_SUCCEEDED,
        reason_code="succeeded",
        requeues=1,
        attempt_list=[attempt],
    )

    save_history_of(job, tmp_path / "job_history.json")
    record = {"unfit_node": "w1", "unfit_backoff_ms": 2_000, "unfit_seen": [["admin", BOUND + 1]]}
    with ledger.Appender(tmp_path / ledger.FAULTS) as out:
        out.append(
            {"type": "fault", "kind": "node-cannot-run", "start_ns": 1, "end_ns": 2, **record}
        )
        out.append({"type": "fault", "kind": "kill-worker", "start_ns": 3, "end_ns": 4})
    (tmp_path / "meta.json").write_text(json.dumps({}))
    history = load_history(tmp_path)
    assert history.unfit == [UnfitSpan("w1", "admin", BOUND + 1, 2_000)]
    (loaded,) = history.job_history
    assert loaded.owner == "admin" and not loaded.replaces
    assert loaded.attempts == (
        AttemptHistory(1, 4, AttemptState.REQUEUED, BOUND, CANNOT, ("w1", "w2")),
    )
    assert [v.kind for v in check_run(tmp_path) if v.kind == "unfit-bind"] == ["unfit-bind"]


def test_the_saved_history_says_which_gangs_place_lost_members_again(tmp_path: Path) -> None:
    job = pb.HistoryJob(job_id="j5", owner="admin", state="SUCCEEDED", reason_code="succeeded")
    job.spec.replicas, job.spec.resources.gpu = 2, 1
    job.spec.replace.SetInParent()

    save_history_of(job, tmp_path / "job_history.json")
    (loaded,) = load_job_history(tmp_path / "job_history.json")
    assert loaded.replaces and loaded.places_later
    assert (loaded.gpus, loaded.min_gpus) == (2, 2)


# ----------------------------------------------------------- the health-only soak


def test_kinds_and_faults_options_parse_and_refuse_bad_values() -> None:
    assert parse_only_kinds("gpu-xid, node-cannot-run") == ["gpu-xid", "node-cannot-run"]
    with pytest.raises(argparse.ArgumentTypeError, match="--kinds: 'nope' is not one of"):
        parse_only_kinds("nope")
    with pytest.raises(argparse.ArgumentTypeError, match="--kinds: name at least one"):
        parse_only_kinds(" , ")
    assert parse_faults("100") == 100
    for bad in ("-1", "many"):
        with pytest.raises(argparse.ArgumentTypeError, match="--faults"):
            parse_faults(bad)
    args = build_parser().parse_args(
        ["soak", "--minutes", "30", "--kinds", "gpu-xid,node-cannot-run", "--faults", "100"]
    )
    assert args.kinds == ["gpu-xid", "node-cannot-run"] and args.faults == 100
    assert build_parser().parse_args(["run"]).kinds == []


def test_only_the_kinds_asked_for_are_played_and_listed_as_skipped() -> None:
    backends = Backends("nftables", "none", "none", freezer_skip="no freezer")
    skip = skipped_kinds(backends, ["gpu-xid"], ["gpu-xid", "node-cannot-run"])
    assert skip == {"gpu-xid": "--skip-kinds"}  # freeze-host was not asked for
    assert played_kinds(skip, ["gpu-xid", "node-cannot-run"]) == ("node-cannot-run",)
    assert played_kinds({}, []) == nemesis.ALL_FAULTS
    assert nemesis.FREEZE_HOST in skipped_kinds(backends, [], [])


def test_the_soak_counts_the_faults_of_the_kinds_it_plays(tmp_path: Path) -> None:
    with ledger.Appender(tmp_path / ledger.FAULTS) as out:
        for kind in ("gpu-xid", "node-cannot-run", "node-cannot-run", "kill-worker"):
            out.append({"type": "fault", "kind": kind})
    result = ScenarioResult("random", 1, tmp_path, 4, 0, [], expect_violations=False)
    assert faults_of([result, result], nemesis.HEALTH_FAULTS) == 6
