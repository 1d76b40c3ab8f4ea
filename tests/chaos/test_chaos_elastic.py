"""Elastic gangs in the chaos suite: the workload's elastic share, the member's commit
world, the elastic kinds' aim and verdict (chaos/elasticfaults.py) and the checker's rules
(chaos/elastic_rules.py): records in, violations out. A grown rank, a rank given back and
a rank grown again in the same attempt must pass; more than max members at once, two
processes of one rank at once and a succeeded attempt below its min must not."""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from chaos import elasticfaults, ledger, member, nemesis
from chaos.checker import EffectRecord, History, MemberRecord, check_history
from chaos.cluster import ELASTIC_MEMORY_MIB, ChaosCluster
from chaos.elastic_rules import (
    check_below_min,
    check_elastic,
    check_over_max,
    check_rank_regrown,
    grown_and_shrunk,
)
from chaos.history import FaultRecord
from chaos.member_rules import check_duplicate_members, check_gpu_reuse
from chaos.members_seen import SeenMembers
from chaos.sink import FencingSink
from chaos.workload import ELASTIC_ENV, WorkloadConfig, job_spec
from synapse_ha.core.codec.versioned import encode_state
from synapse_ha.core.elastic import ElasticPolicy
from synapse_ha.core.model import AttemptState, ClusterState, JobState, NodeStatus
from synapse_ha.core.spec.validation import check_job_spec
from synapse_ha.rpc.from_proto import spec_from_proto
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.states import node_status_fields
from tests.chaos.test_chaos_checker import MS, clean_history, final_state

JOB, TOKEN = "j1", 3


def process(
    rank: int,
    start_ms: int,
    last_ms: int,
    *,
    pid: int,
    world: int = 2,
    gang: str = "1:3",
    node: str = "w1",
    gpus: tuple[int, ...] = (),
    last: str = "term",
) -> list[MemberRecord]:
    """One process of a rank of elastic j1 (token 3): start, a heartbeat every 100 ms, and
    its last record at ``last_ms`` (``term``: it was stopped; ``effect``: it committed)."""

    def rec(kind: str, at_ms: int) -> MemberRecord:
        return MemberRecord(
            kind, JOB, 1, TOKEN, rank, node, at_ms * MS, pid, gpus=gpus, world=world, elastic=gang
        )

    beats = [rec("heartbeat", t) for t in range(start_ms + 100, last_ms, 100)]
    ending = (
        [rec("effect", last_ms), rec("end", last_ms)] if last == "effect" else [rec(last, last_ms)]
    )
    return [rec("start", start_ms), *beats, *ending]


def elastic_state(fewest: int = 1, most: int = 3) -> ClusterState:
    """The clean history's final state with j1 elastic, ``fewest`` to ``most``."""
    done = JobState.SUCCEEDED
    state = final_state(("j1", "req-1", 3, 1, done), ("j2", "req-2", 6, 2, done))
    job = state.jobs[JOB]
    job.spec = dataclasses.replace(job.spec, replicas=most, elastic=ElasticPolicy(fewest))
    return state


def elastic_history(fewest: int = 1, most: int = 3) -> History:
    """j1 (token 3) elastic: ranks 0 and 1 from 0 ms to their commit at 4,000 ms; rank 2
    grown at 500 ms, given back at 1,200 ms, grown again (a new process) at 1,500 ms and
    committed at 4,000 ms. The members commit with a world of min: rank 0's effect
    completes the job, the others are told done. j2 as in the clean history."""
    history = clean_history()
    history.members = [r for r in history.members if r.job != JOB]
    history.effects = [e for e in history.effects if e.job != JOB]
    gang = f"{fewest}:{most}"
    history.members += [
        *process(0, 0, 4_000, pid=10, gang=gang, last="effect"),
        *process(1, 0, 4_000, pid=11, gang=gang, last="effect"),
        *process(2, 500, 1_200, pid=12, world=3, gang=gang),
        *process(2, 1_500, 4_000, pid=13, world=3, gang=gang, last="effect"),
    ]
    history.effects += [
        EffectRecord(JOB, TOKEN, 0, True, 4_000 * MS),
        EffectRecord(JOB, TOKEN, 1, False, 4_000 * MS + 1, done=True),
        EffectRecord(JOB, TOKEN, 2, False, 4_000 * MS + 2, done=True),
    ]
    state = elastic_state(fewest, most)
    history.replica_states = {r: encode_state(state) for r in ("r1", "r2", "r3")}
    return history


def kinds(history: History) -> list[str]:
    return sorted(v.kind for v in check_history(history))


# ------------------------------------------------------------------------- rules


def test_a_gang_grown_given_back_and_grown_again_is_clean_and_reported() -> None:
    history = elastic_history()
    assert check_history(history) == []
    assert grown_and_shrunk(history) == (["j1/3 rank 2"], ["j1/3 rank 2"])
    # Its output is whole with ranks 0..min-1: for a fixed gang of three, it is not.
    fixed = [replace(r, elastic="") for r in history.members]
    state = elastic_state()
    state.jobs[JOB].spec = dataclasses.replace(state.jobs[JOB].spec, elastic=None)
    history = replace(
        history,
        members=fixed,
        replica_states={r: encode_state(state) for r in ("r1", "r2", "r3")},
    )
    assert "not-completed" in kinds(history)


def test_more_members_than_max_at_once_is_elastic_over_max() -> None:
    history = elastic_history(1, 2)  # rank 2 grown past a max of 2
    found = check_over_max(history)
    assert [v.kind for v in found] == ["elastic-over-max"]
    assert "token 3: 3 members ran at once (max 2) at mono 0.500 s" in found[0].detail
    assert check_over_max(elastic_history(1, 3)) == []
    # A member's last record at the very instant another starts is not "at once".
    history = elastic_history(1, 2)
    history.members = [r for r in history.members if r.rank != 1]
    history.members += process(1, 0, 500, pid=11, gang="1:2")
    assert check_over_max(history) == []


def test_a_rank_grown_again_while_its_old_process_runs_is_rank_twice() -> None:
    history = elastic_history()
    # The given-back process of rank 2 heartbeats on after the new one started.
    history.members += process(2, 1_200, 1_600, pid=12, world=3)[1:]
    found = check_rank_regrown(history)
    assert [v.kind for v in found] == ["rank-twice"]
    assert "rank 2 of token 3 generation 0: pid 12 wrote a record 100 ms after pid 13" in (
        found[0].detail
    )
    assert "rank-twice" in kinds(history)


def test_a_rank_grown_again_is_neither_a_duplicate_member_nor_a_gpu_reuse() -> None:
    history = elastic_history()
    history.members = [r for r in history.members if r.rank != 2]
    history.members += [
        *process(2, 500, 1_200, pid=12, world=3, node="w3", gpus=(1,)),
        *process(2, 1_500, 4_000, pid=13, world=3, node="w3", gpus=(1,), last="effect"),
        # Another job's member on the same GPU between the two processes.
        MemberRecord("start", "j9", 1, 9, 0, "w3", 1_300 * MS, 90, gpus=(1,)),
        MemberRecord("term", "j9", 1, 9, 0, "w3", 1_400 * MS, 90, gpus=(1,)),
    ]
    assert check_duplicate_members(history) == []
    assert check_gpu_reuse(history) == []
    # A fixed gang's member started twice still is a duplicate.
    fixed = replace(history, members=[replace(r, elastic="") for r in history.members])
    assert [v.kind for v in check_duplicate_members(fixed)] == ["duplicate-member"]


def test_a_succeeded_attempt_below_its_min_before_its_commit_is_elastic_below_min() -> None:
    history = elastic_history(2, 3)
    state = elastic_state(2, 3)
    assert check_below_min(history, state) == []  # rank 2 given back: two remain
    # Rank 1 stopped at 1,000 ms while rank 0 worked on to its commit at 4,000 ms: once
    # rank 2 is given back at 1,200 ms, one member is left.
    history.members = [r for r in history.members if r.rank != 1]
    history.members += process(1, 0, 1_000, pid=11, gang="2:3")
    found = check_below_min(history, state)
    assert [v.kind for v in found] == ["elastic-below-min"]
    assert "token 3: 1 members ran (min 2) at mono 1.200 s" in found[0].detail
    # An attempt that did not succeed lost a member: it is not judged.
    attempt = state.jobs[JOB].attempt
    assert attempt is not None
    attempt.state = AttemptState.REQUEUED
    assert check_below_min(history, state) == []
    # Nor the members before min of them first ran at once.
    history = elastic_history(2, 3)
    history.members = [r for r in history.members if r.rank != 1]
    history.members += process(1, 400, 4_000, pid=11, gang="2:3", last="effect")
    assert check_below_min(history, elastic_state(2, 3)) == []


def test_records_of_a_frozen_attempt_within_the_thaw_bound_do_not_count() -> None:
    history = elastic_history(1, 2)
    history.members = [r for r in history.members if r.pid != 13]  # rank 2 grown once
    assert [v.kind for v in check_elastic(history, elastic_state(1, 2))] == ["elastic-over-max"]
    history.faults.append(
        FaultRecord(
            "freeze-host", ("w1",), 400 * MS, 1_100 * MS, frozen=((JOB, TOKEN),), frozen_node="w1"
        )
    )
    # Every member ran on w1: its third member, 500 to 1,200 ms, falls in the window.
    assert check_elastic(history, elastic_state(1, 2)) == []


# ---------------------------------------------------------------- workload and member


def config(share: float) -> WorkloadConfig:
    return WorkloadConfig(
        seed=1,
        replicas=[],
        submissions="",
        ledger="l",
        sink="s:1",
        stop_file="",
        python="py",
        pythonpath="/repo",
        queue_gpus=8,
        array_share=0.15,
        replace_share=0.2,
        elastic_share=share,
        elastic_memory_mib=9 * 1024,
    )


def test_the_workload_draws_small_elastic_gangs_of_the_lowest_class() -> None:
    rng = random.Random(7)
    specs = [job_spec(config(0.5), rng, i) for i in range(300)]
    elastic = [s for s in specs if s.HasField("elastic")]
    assert len(elastic) > 30
    for s in elastic:
        assert 1 <= s.elastic.min_replicas < s.replicas <= 3
        assert s.resources.gpu == 1 and s.elastic.signal == "SIGUSR1"
        assert s.resources.memory_mib == 9 * 1024
        assert s.priority_class == "low" and not s.array and not s.HasField("replace")
        env = {e.name: e.value for e in s.env}
        assert env[ELASTIC_ENV] == f"{s.elastic.min_replicas}:{s.replicas}"
    assert {(s.elastic.min_replicas, s.replicas) for s in elastic} == {(1, 2), (1, 3), (2, 3)}
    assert {s.resources.memory_mib for s in specs if not s.HasField("elastic")} == {256}
    rng = random.Random(7)
    assert not any(job_spec(config(0.0), rng, i).HasField("elastic") for i in range(300))


def test_an_elastic_member_commits_with_a_world_of_min(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "SYNAPSE_JOB_ID": "j1",
        "SYNAPSE_ATTEMPT": "1",
        "SYNAPSE_FENCING_TOKEN": "3",
        "RANK": "2",
        "WORLD_SIZE": "3",
        "SYNAPSE_MEMBER_HOSTS": "a,b,c",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    me = member.identity()
    assert "elastic" not in me and member.commit_world(me) == 3
    monkeypatch.setenv("CHAOS_ELASTIC", "2:3")
    me = member.identity()
    assert me["elastic"] == "2:3" and member.commit_world(me) == 2


def test_the_sink_commits_an_elastic_gang_once_its_ranks_below_min_did(tmp_path: Path) -> None:
    with ledger.Appender(tmp_path / "effects.jsonl") as out:
        sink = FencingSink(out)
        ask: dict[str, Any] = {"job": "j1", "token": 3, "world": 1}
        # Rank 1, above a min of 1, commits first: the output is not whole yet.
        assert sink.decide({**ask, "rank": 1}) == {"accepted": True, "done": False, "highest": 3}
        assert sink.decide({**ask, "rank": 0})["accepted"]
        assert sink.decide({**ask, "rank": 2})["done"]


# --------------------------------------------------------------------- the kinds


def seen(records: list[dict[str, Any]]) -> SeenMembers:
    out = SeenMembers()
    for r in records:
        out.saw(r, str(r["node"]), int(r["at"]))
    return out


def test_the_kinds_aim_at_running_gangs_below_max_or_above_min(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = 10**12
    monkeypatch.setattr(elasticfaults.ledger, "now_ns", lambda: now)
    late = now + 9 * 10**9

    def start(job: str, rank: int, gang: str, until: int = late) -> dict[str, Any]:
        base = {"job": job, "token": 1, "rank": rank, "node": "w1", "at": now}
        return {**base, "type": "start", "elastic": gang, "until_ns": until}

    members = seen(
        [
            start("a", 0, "1:2"),  # one of 1-2: may grow
            start("b", 0, "1:3"),  # two of 1-3: may grow or shrink
            start("b", 1, "1:3"),
            start("c", 0, "1:2", until=now + 10**9),  # ends too soon for either
            start("c", 1, "1:2", until=now + 10**9),
            {"job": "d", "token": 1, "rank": 0, "node": "w1", "at": now, "type": "start"},
        ]
    )
    c = cast(ChaosCluster, SimpleNamespace(members_seen=members))
    assert elasticfaults.running_elastic(c, 4.0) == {("a", 1): (1, 2, 1), ("b", 1): (1, 3, 2)}
    assert elasticfaults.choose(c, nemesis.ELASTIC_GROW, 0, 0.0) == (("a", 1), (1, 2, 1))
    assert elasticfaults.choose(c, nemesis.ELASTIC_GROW, 1, 0.0) == (("b", 1), (1, 3, 2))
    assert elasticfaults.choose(c, nemesis.ELASTIC_SHRINK, 5, 0.0) == (("b", 1), (1, 3, 2))
    members.saw({"job": "b", "token": 1, "rank": 1, "type": "end"}, "w1", now)
    assert elasticfaults.choose(c, nemesis.ELASTIC_SHRINK, 0, 0.0) is None


def test_a_resize_is_seen_in_the_state_and_a_kind_that_never_made_one_fails_the_run(
    tmp_path: Path,
) -> None:
    def job(job_id: str, token: int, members: int) -> Any:
        attempt = SimpleNamespace(fencing_token=token, members=[0] * members)
        spec = SimpleNamespace(HasField=lambda name: name == "elastic")
        return SimpleNamespace(job_id=job_id, attempt=attempt, spec=spec, HasField=lambda n: True)

    answers = [[job("a", 1, 1), job("b", 1, 3)], [job("a", 1, 2), job("b", 1, 2)]]
    observer = SimpleNamespace(list_jobs=lambda **filters: answers.pop(0))
    resizes = elasticfaults.Resizes(cast(ChaosCluster, SimpleNamespace(observer=observer)))
    resizes.look()
    assert resizes.changed(nemesis.ELASTIC_GROW) == []
    resizes.look()
    assert resizes.changed(nemesis.ELASTIC_GROW) == ["a/t1 1 -> 2"]
    assert resizes.changed(nemesis.ELASTIC_SHRINK) == ["b/t1 3 -> 2"]

    def faults(path: Path, *records: dict[str, Any]) -> Path:
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        return path

    grew = {"kind": "elastic-grow", "elastic_changed": True}
    still = {"kind": "elastic-shrink", "elastic_changed": False}
    one = faults(tmp_path / "one.jsonl", grew, still, {"kind": "kill-leader"})
    assert elasticfaults.unchanged_kinds([one]) == [
        "elastic-shrink: played 1 times, no gang resized"
    ]
    two = faults(tmp_path / "two.jsonl", {**still, "elastic_changed": True})
    assert elasticfaults.unchanged_kinds([one, two, tmp_path / "absent.jsonl"]) == []


class FakeObserver:
    """The observer's calls the elastic kinds make: running jobs (one elastic gang of
    ``sizes[i]`` members at the i-th look, the last size after), nodes and submissions."""

    def __init__(self, sizes: list[int], job_id: str = "b") -> None:
        self.sizes = sizes
        self.job_id = job_id
        self.submitted: list[Any] = []

    def list_jobs(self, **filters: Any) -> list[Any]:
        n = self.sizes.pop(0) if len(self.sizes) > 1 else self.sizes[0]
        attempt = SimpleNamespace(fencing_token=1, members=[0] * n)
        spec = SimpleNamespace(HasField=lambda name: name == "elastic")
        has = lambda _: True  # noqa: E731
        return [SimpleNamespace(job_id=self.job_id, attempt=attempt, spec=spec, HasField=has)]

    def list_nodes(self) -> list[Any]:
        def node(name: str, used_mib: int, status: NodeStatus = NodeStatus.READY) -> Any:
            return pb.Node(
                node_id=name,
                capacity=pb.Resources(gpu=4, memory_mib=16 * 1024),
                allocated=pb.Resources(memory_mib=used_mib),
                **node_status_fields(status),
            )

        # w1 holds an elastic member, w2 room for one more, w3 room but dead.
        return [node("w1", 9 * 1024 + 4 + 260), node("w2", 520), node("w3", 0, NodeStatus.DEAD)]

    def get_job(self, job_id: str, allow_stale: bool = False) -> Any:
        return SimpleNamespace(reason_code="first_in_line_reserved")

    def submit_job(self, spec: Any, request_id: str, timeout_s: float) -> Any:
        self.submitted.append(spec)
        return SimpleNamespace(job_id="job-000900")


@pytest.mark.parametrize(
    ("kind", "sizes", "changed"),
    [
        (nemesis.ELASTIC_GROW, [2, 2, 3], True),  # below max of 3: grows
        (nemesis.ELASTIC_GROW, [2], False),
        (nemesis.ELASTIC_GROW, [3, 3, 2, 3], True),  # at max: shrunk first, grows back
        (nemesis.ELASTIC_SHRINK, [3, 3, 1], True),
    ],
)
def test_a_kind_plays_on_a_fake_cluster_and_says_whether_its_gang_resized(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, sizes: list[int], changed: bool
) -> None:
    now = 10**12
    monkeypatch.setattr(elasticfaults.ledger, "now_ns", lambda: now)
    monkeypatch.setattr(elasticfaults, "RESIZED_WAIT_S", 0.5)
    monkeypatch.setattr(elasticfaults, "GROW_FIND_S", 0.0)
    monkeypatch.setattr(elasticfaults, "POLL_S", 0.01)
    members = SeenMembers()
    for rank in range(sizes[0]):
        start = {"job": "b", "token": 1, "rank": rank, "type": "start", "gpus": str(rank)}
        node = "10.0.0.21" if rank < 2 else "10.0.0.22"
        members.saw({**start, "elastic": "1:3", "until_ns": now + 9 * 10**9}, node, now)
    paused: list[str] = []
    submitter = SimpleNamespace(
        pause=lambda: paused.append("pause"), resume=lambda: paused.append("resume")
    )
    observer = FakeObserver(list(sizes))
    c = SimpleNamespace(
        members_seen=members,
        observer=observer,
        submitter=submitter,
        dir=tmp_path,
        cfg=SimpleNamespace(seed=1),
        sink_address="10.0.0.1:7900",
        node_by_address={"10.0.0.21": "w1", "10.0.0.22": "w2"},
    )
    extra: dict[str, object] = {}
    targets, detail, watch, heal, hold = elasticfaults.play(
        cast(ChaosCluster, c), kind, 4, 0, extra
    )
    assert targets == ["b"] and extra["elastic_gang"] == "b/t1"
    watch()
    said = hold()
    heal()
    assert extra["elastic_changed"] is changed
    if kind == nemesis.ELASTIC_GROW:
        assert paused == ["pause", "resume"] and "submitter stopped" in detail
        assert said.endswith("b/t1 2 -> 3") if changed else said.endswith("no gang resized")
    else:
        assert paused == [] and said.endswith("b/t1 3 -> 1")
    if sizes[0] < 3:
        assert observer.submitted == [] and "elastic_waiting" not in extra
        return
    # One member more than the ready nodes have room for (w2), each of an elastic member's
    # memory and no GPU.
    (spec,) = observer.submitted
    resources = (spec.resources.memory_mib, spec.resources.gpu)
    assert (spec.replicas, resources, spec.priority_class) == (2, (ELASTIC_MEMORY_MIB, 0), "normal")
    assert not spec.HasField("nodes") and spec.name == "chaos-1-elastic-4"
    assert extra["elastic_waiting"] == "job-000900"
    assert extra["elastic_waiting_reasons"] == ["first_in_line_reserved"]
    lines = (tmp_path / "submissions.jsonl").read_text().splitlines()
    assert [json.loads(line)["type"] for line in lines] == ["begin", "ok"]


# ------------------------------------------------------------- the fault's own gang


def test_the_kinds_resize_gangs_below_max_above_min_or_either() -> None:
    assert elasticfaults.resizable(nemesis.ELASTIC_GROW, (1, 3, 2))
    assert not elasticfaults.resizable(nemesis.ELASTIC_GROW, (1, 3, 3))
    assert elasticfaults.resizable(nemesis.ELASTIC_SHRINK, (1, 3, 2))
    assert not elasticfaults.resizable(nemesis.ELASTIC_SHRINK, (1, 3, 1))
    assert elasticfaults.resizable("", (1, 3, 1)) and elasticfaults.resizable("", (1, 3, 3))


def own_cluster(tmp_path: Path, observer: Any, members: SeenMembers) -> ChaosCluster:
    submitter = SimpleNamespace(pause=lambda: None, resume=lambda: None)
    c = SimpleNamespace(
        members_seen=members,
        observer=observer,
        submitter=submitter,
        dir=tmp_path,
        cfg=SimpleNamespace(seed=1),
        sink_address="10.0.0.1:7900",
    )
    return cast(ChaosCluster, c)


def test_the_own_gang_is_an_elastic_gang_as_the_workloads_of_class_low(tmp_path: Path) -> None:
    spec = elasticfaults.own_gang(own_cluster(tmp_path, None, SeenMembers()), 4)
    assert (spec.elastic.min_replicas, spec.replicas) == (1, 3)
    assert spec.elastic.signal == "SIGUSR1" and spec.priority_class == "low"
    assert (spec.resources.gpu, spec.resources.memory_mib) == (1, ELASTIC_MEMORY_MIB)
    assert spec.name == "chaos-1-elastic-4-own" and not spec.queue
    env = {e.name: e.value for e in spec.env}
    assert env[ELASTIC_ENV] == "1:3"
    assert spec.argv.args[-3:] == [str(tmp_path / ledger.LEDGER), "10.0.0.1:7900", "8000"]
    # Long enough to be chosen once it runs, shrunk and grown back.
    assert elasticfaults.OWN_MS > elasticfaults.LASTING_S * 1000
    # A job spec the cluster takes.
    assert check_job_spec(spec_from_proto(spec), topology_levels=None) == []


class OwnGangObserver(FakeObserver):
    """A cluster whose workload runs no elastic gang: the fault's own gang (the first
    submission, job-000800) starts ``started`` members at once, the state giving it
    ``placed``; the waiting gang is job-000900."""

    def __init__(self, sizes: list[int], members: SeenMembers, started: int, placed: int):
        super().__init__(sizes, job_id="job-000800")
        self.members, self.started, self.placed = members, started, placed

    def submit_job(self, spec: Any, request_id: str, timeout_s: float) -> Any:
        self.submitted.append(spec)
        if not spec.HasField("elastic"):
            return SimpleNamespace(job_id="job-000900")
        now = elasticfaults.ledger.now_ns()
        for rank in range(self.started):
            start = {"job": "job-000800", "token": 1, "rank": rank, "type": "start"}
            record = {**start, "elastic": "1:3", "until_ns": now + 8 * 10**9}
            self.members.saw(record, f"w{rank + 1}", now)
        return SimpleNamespace(job_id="job-000800")

    def get_job(self, job_id: str, allow_stale: bool = False) -> Any:
        attempt = SimpleNamespace(members=[0] * self.placed)
        has = lambda name: name == "attempt"  # noqa: E731
        return SimpleNamespace(reason_code="pending_first_pass", attempt=attempt, HasField=has)


@pytest.mark.parametrize(
    ("kind", "started", "placed", "sizes", "waiting", "said"),
    [
        # No gang above min: its own runs 3 of 1-3, shrunk for the waiting gang.
        (nemesis.ELASTIC_SHRINK, 3, 3, [3, 3, 2], True, "job-000800/t1 3 -> 2"),
        # No gang at all to grow: its own at max (two of three running yet) shrunk first.
        (nemesis.ELASTIC_GROW, 2, 3, [3, 3, 2, 3], True, "job-000800/t1 2 -> 3"),
        # Its own placed below max: grown, no waiting gang.
        (nemesis.ELASTIC_GROW, 2, 2, [2, 2, 3], False, "job-000800/t1 2 -> 3"),
    ],
)
def test_without_a_gang_to_resize_the_kind_submits_its_own_and_resizes_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    started: int,
    placed: int,
    sizes: list[int],
    waiting: bool,
    said: str,
) -> None:
    monkeypatch.setattr(elasticfaults, "FIND_S", 0.0)
    monkeypatch.setattr(elasticfaults, "GROW_FIND_S", 0.0)
    monkeypatch.setattr(elasticfaults, "ROOM_WAIT_S", 0.0)
    monkeypatch.setattr(elasticfaults, "RESIZED_WAIT_S", 0.5)
    monkeypatch.setattr(elasticfaults, "POLL_S", 0.01)
    members = SeenMembers()
    observer = OwnGangObserver(list(sizes), members, started, placed)
    extra: dict[str, object] = {}
    c = own_cluster(tmp_path, observer, members)
    targets, detail, watch, heal, hold = elasticfaults.play(c, kind, 4, 0, extra)
    assert targets == ["job-000800"] and extra["elastic_gang"] == "job-000800/t1"
    assert extra["elastic_own"] == "job-000800"
    assert f"job-000800/t1 runs {started} of 1-3 members" in detail
    watch()
    assert hold().endswith(said)
    heal()
    assert extra["elastic_changed"] is True
    own, *rest = observer.submitted
    assert own.name == "chaos-1-elastic-4-own" and own.HasField("elastic")
    assert [s.name for s in rest] == (["chaos-1-elastic-4"] if waiting else [])
    assert ("shrinking it first" in detail) is (waiting and kind == nemesis.ELASTIC_GROW)
    # Recorded as the workload's are, so that the checker holds it to every rule.
    records = [
        json.loads(line) for line in (tmp_path / ledger.SUBMISSIONS).read_text().splitlines()
    ]
    ok = [r for r in records if r["type"] == "ok"]
    assert ok[0] == {**ok[0], "job_id": "job-000800", "elastic": [1, 3]}
    assert len(ok) == 1 + waiting


def test_an_own_gang_that_never_runs_above_min_is_said_and_nothing_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(elasticfaults, "FIND_S", 0.0)
    monkeypatch.setattr(elasticfaults, "ROOM_WAIT_S", 0.0)
    monkeypatch.setattr(elasticfaults, "OWN_START_WAIT_S", 0.05)
    monkeypatch.setattr(elasticfaults, "POLL_S", 0.01)
    members = SeenMembers()
    observer = OwnGangObserver([1], members, started=1, placed=1)
    c = own_cluster(tmp_path, observer, members)
    parts: list[str] = []
    chosen = elasticfaults.find_target(c, nemesis.ELASTIC_SHRINK, 4, 0, {}, parts)
    assert chosen == (None, False) and len(observer.submitted) == 1
    # Submitted after the wait for room for two members: the nodes have room for one (w2).
    assert parts == [
        "no elastic gang above min: submitted job-000800 (3 members of 1 GPU, min 1, class low; "
        "1 nodes with room after 0.0 s)",
        "none running above min within 0 s",
    ]
    # A workload's gang above min is taken first: nothing more is submitted.
    now = elasticfaults.ledger.now_ns()
    for rank in (0, 1):
        start = {"job": "w", "token": 2, "rank": rank, "type": "start", "elastic": "1:2"}
        members.saw({**start, "until_ns": now + 9 * 10**9}, f"w{rank + 1}", now)
    parts = []
    chosen = elasticfaults.find_target(c, nemesis.ELASTIC_SHRINK, 5, 0, {}, parts)
    assert chosen == ((("w", 2), (1, 2, 2)), True) and len(observer.submitted) == 1
    assert parts == ["w/t2 runs 2 of 1-2 members"]


def test_a_node_has_room_for_an_elastic_member_when_ready_with_its_memory_and_gpus() -> None:
    def node(used_mib: int, used_gpus: int, status: NodeStatus = NodeStatus.READY) -> pb.Node:
        return pb.Node(
            capacity=pb.Resources(gpu=4, memory_mib=16 * 1024),
            allocated=pb.Resources(memory_mib=used_mib, gpu=used_gpus),
            **node_status_fields(status),
        )

    free = 16 * 1024 - ELASTIC_MEMORY_MIB - elasticfaults.RESERVE_MIB  # what may be used
    nodes = [node(free, 3), node(free + 1, 0), node(0, 4), node(0, 0, NodeStatus.CORDONED)]
    assert elasticfaults.elastic_room(nodes, gpu=1) == 1
    assert elasticfaults.elastic_room(nodes, gpu=0) == 2
    assert elasticfaults.elastic_room([*nodes, node(0, 0)], gpu=1) == 2
    # The fault submits its own gang as soon as two nodes have room: one look, no wait.
    looks: list[int] = []

    def list_nodes() -> list[pb.Node]:
        looks.append(1)
        return [*nodes, node(0, 0)]

    c = own_cluster(Path("."), SimpleNamespace(list_nodes=list_nodes), SeenMembers())
    assert elasticfaults.wait_for_room(c, 0.5) == 2 and len(looks) == 1
