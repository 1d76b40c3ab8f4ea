"""The replacement kinds and what feeds the replacement rules: the workload's replace
gangs, the members' generation in their records and at the sink (which fences a replaced
generation), the observer's view of ranks placed again, and the two kinds played on a
fake cluster."""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from chaos import ledger, member, nemesis, replacefaults
from chaos.cluster import REPLACE_CPU_MILLI, WORKER_CPUS
from chaos.members_seen import SeenMembers
from chaos.sink import FencingSink
from chaos.workload import REPLACE_EXTRA_MS, REPLACE_TIMEOUT_MS, job_spec
from tests.chaos.test_chaos_arrays import config

# ------------------------------------------------------------------- the schedule


def test_the_kinds_are_worker_kinds_played_once_in_the_targeted_scenario() -> None:
    t = nemesis.FaultTimeouts()
    for kind in nemesis.REPLACE_FAULTS:
        assert kind in nemesis.WORKER_FAULTS and kind not in nemesis.CONTROL_FAULTS
    steps = nemesis.targeted_schedule(2, t)
    assert sum(s.kind in nemesis.REPLACE_FAULTS for s in steps) == 2
    killed = next(s for s in steps if s.kind == nemesis.KILL_REPLACE_WORKER)
    assert killed.duration_s > t.dead_timeout_s  # the node must be declared dead


# ------------------------------------------------------------------------ workload


def test_a_share_of_the_single_gangs_ask_for_replacement() -> None:
    cfg = config(replace_share=0.3, array_share=0.2, replace_cpu_milli=4_500)
    rng = random.Random(4)
    specs = [job_spec(cfg, rng, i) for i in range(300)]
    replacing = [s for s in specs if s.HasField("replace")]
    singles = [s for s in specs if not s.array]
    assert 0.2 < len(replacing) / len(singles) < 0.4
    assert not any(s.array for s in replacing)
    for s in replacing:
        assert (s.replicas, s.resources.gpu) == (2, 1)  # of 2-3 members, 1-2 GPUs each
        assert (s.replace.timeout_ms, s.replace.signal) == (REPLACE_TIMEOUT_MS, "SIGUSR1")
        assert s.resources.cpu_milli == 4_500  # never two of their members on one node
        low, high = cfg.member_ms
        assert low + REPLACE_EXTRA_MS <= int(s.argv.args[-1]) <= high + REPLACE_EXTRA_MS
        assert {(e.name, e.value) for e in s.env} >= {("CHAOS_REPLACE", "1")}
    others = [s for s in specs if not s.HasField("replace")]
    assert not any(e.name == "CHAOS_REPLACE" for s in others for e in s.env)
    assert {s.resources.cpu_milli for s in others} == {500}
    assert REPLACE_CPU_MILLI * 2 > WORKER_CPUS * 1000  # the cluster's share: one a node
    assert not any(s.HasField("replace") for s in (job_spec(config(), rng, i) for i in range(50)))


# -------------------------------------------------------------- member and sink


def test_a_member_names_its_generation_and_reads_its_membership(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = {"membership": 2, "member_hosts": ["10.0.0.21", "10.0.0.23"], "generation": 1}
    (tmp_path / "membership").write_text(json.dumps({}) + "\n" + json.dumps(line) + "\n")
    env = {
        "SYNAPSE_JOB_ID": "j1",
        "SYNAPSE_ATTEMPT": "1",
        "SYNAPSE_FENCING_TOKEN": "3",
        "RANK": "1",
        "SYNAPSE_MEMBER_HOSTS": "10.0.0.21,10.0.0.23",
        "SYNAPSE_MEMBER_GENERATION": "1",
        "SYNAPSE_MEMBERSHIP_FILE": str(tmp_path / "membership"),
        "CHAOS_REPLACE": "1",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    me = member.identity()
    assert (me["rank"], me["node"], me["generation"], me["replace"]) == (1, "10.0.0.23", 1, True)
    assert member.membership_now() == {"membership": 2, "member_hosts": line["member_hosts"]}
    monkeypatch.delenv("SYNAPSE_MEMBER_GENERATION")
    monkeypatch.delenv("CHAOS_REPLACE")
    assert (member.identity()["generation"], member.identity()["replace"]) == (0, False)


def test_the_sink_refuses_a_replaced_generation_once_its_successor_claimed(
    tmp_path: Path,
) -> None:
    with ledger.Appender(tmp_path / "effects.jsonl") as out:
        sink = FencingSink(out)
        ask: dict[str, Any] = {"job": "j1", "token": 3, "world": 2}
        assert sink.decide({**ask, "rank": 0, "generation": 0})["accepted"]
        sink.decide({**ask, "op": "claim", "rank": 1, "generation": 1})
        assert not sink.decide({**ask, "rank": 1, "generation": 0})["accepted"]
        assert sink.decide({**ask, "rank": 1, "generation": 1})["accepted"]
    records = list(ledger.read_records(tmp_path / "effects.jsonl"))
    assert [(r["type"], r["rank"], r["generation"], r.get("accepted")) for r in records] == [
        ("effect", 0, 0, True),
        ("claim", 1, 1, None),
        ("effect", 1, 0, False),
        ("effect", 1, 1, True),
    ]


# ------------------------------------------------------------------- the observer


def start(
    job: str, token: int, rank: int, gen: int, gpus: str, replace: bool = True, for_s: float = 60
) -> dict[str, object]:
    """A member's start record: it plans to work for ``for_s``."""
    return {"type": "start", "job": job, "token": token, "rank": rank, "generation": gen,
            "gpus": gpus, "replace": replace,
            "until_ns": ledger.now_ns() + int(for_s * 1e9)}  # fmt: skip


def test_the_observer_finds_replace_members_and_their_successors() -> None:
    seen = SeenMembers()
    now = ledger.now_ns()
    seen.saw(start("j1", 3, 0, 0, "0"), "w1", now)
    seen.saw(start("j1", 3, 1, 0, "1,2"), "w2", now)
    seen.saw(start("j2", 4, 0, 0, "3", replace=False), "w2", now)
    seen.saw(start("j2", 4, 1, 0, "3", replace=False), "w3", now)
    seen.saw(start("j3", 5, 0, 0, "0"), "w4", now)  # its other rank runs on w4 too
    seen.saw(start("j3", 5, 1, 0, "1"), "w4", now)
    found = seen.replace_members("w2", now)
    assert [(k, m.gpus) for k, m in found] == [(("j1", 3, 1, 0), frozenset({1, 2}))]
    assert seen.replace_members("w4", now) == []  # losing w4 would leave j3 nothing
    assert not seen.newer_generation(("j1", 3, 1, 0))
    seen.saw(start("j1", 3, 1, 1, "0"), "w3", now + 1)
    assert seen.newer_generation(("j1", 3, 1, 0))
    assert seen.replace_members("w2", now) == []  # replaced: no longer a target
    assert sorted(seen.on("w3", now)) == [("j1", 3, 1, 1), ("j2", 4, 1, 0)]


# ------------------------------------------------------- the kinds on a fake cluster


@dataclass
class FakeProcess:
    alive: bool = True
    kills: int = 0

    def kill(self) -> None:
        self.alive, self.kills = False, self.kills + 1


class FakeObserver:
    def list_nodes(self) -> list[object]:
        return []  # no fault reported yet


@dataclass
class FakeCluster:
    dir: Path
    observer: FakeObserver = field(default_factory=FakeObserver)
    members_seen: SeenMembers = field(default_factory=SeenMembers)
    newest_token: dict[str, int] = field(default_factory=dict)
    workers: dict[str, FakeProcess] = field(
        default_factory=lambda: {w: FakeProcess() for w in ("w1", "w2", "w3")}
    )
    restarts: int = 0

    def restart(self, process: FakeProcess) -> None:
        process.alive = True
        self.restarts += 1

    def address(self, name: str) -> str:
        return "10.77.0.22"

    def gpu_fault_file(self, worker: str) -> Path:
        return self.dir / f"{worker}.gpu-faults"


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replacefaults, "TARGET_WAIT_S", 0.05)
    monkeypatch.setattr(replacefaults, "REPLACED_WAIT_S", 0.1)
    monkeypatch.setattr(replacefaults, "POLL_S", 0.005)


def gang(c: FakeCluster) -> None:
    now = ledger.now_ns()
    c.members_seen.saw(start("j1", 3, 0, 0, "0"), "w1", now)
    c.members_seen.saw(start("j1", 3, 1, 0, "1,2"), "w2", now)
    c.members_seen.saw(start("j2", 4, 0, 0, "3", replace=False), "w3", now)


@pytest.mark.usefixtures("quick")
def test_kill_replace_worker_kills_the_replace_members_agent_and_waits_for_its_successor(
    tmp_path: Path,
) -> None:
    c = FakeCluster(tmp_path)
    gang(c)
    extra: dict[str, object] = {}
    targets, detail, watch, heal, hold = replacefaults.play(
        c,  # type: ignore[arg-type]
        nemesis.KILL_REPLACE_WORKER,
        ["w2", "w3"],
        ["w3"],
        7,
        extra,
    )
    assert targets == ["w2"] and watch is None
    assert c.workers["w2"].kills == 1 and "j1/t3 rank 1 g0" in detail
    assert "nothing took the place of j1/t3 rank 1 g0" in hold()  # bounded
    c.members_seen.saw(start("j1", 3, 1, 1, "0"), "w3", ledger.now_ns())
    assert "j1/t3 rank 1 g0 -> g1" in hold()
    assert (extra["replaced"], extra["not_replaced"]) == (["j1/t3 rank 1 g0 -> g1"], [])
    heal()
    assert c.workers["w2"].alive and c.restarts == 1


@pytest.mark.usefixtures("quick")
def test_gpu_xid_replace_faults_a_gpu_the_member_holds_and_a_requeue_counts(
    tmp_path: Path,
) -> None:
    c = FakeCluster(tmp_path)
    gang(c)
    for pick in range(6):
        (tmp_path / "w2.gpu-faults").write_text("")
        extra: dict[str, object] = {}
        targets, _, watch, _, hold = replacefaults.play(
            c,  # type: ignore[arg-type]
            nemesis.GPU_XID_REPLACE,
            ["w2", "w3"],
            ["w3"],
            pick,
            extra,
        )
        assert targets == ["w2"] and watch is not None and c.workers["w2"].kills == 0
        gpu, _ = (tmp_path / "w2.gpu-faults").read_text().split(" xid ")
        assert int(gpu) in (1, 2) and extra["gpu"] == int(gpu)
        assert extra["replace_members"] == ["j1/t3 rank 1 g0"]
    c.newest_token["j1"] = 8  # the gang was requeued whole instead
    assert "j1/t3 rank 1 g0 -> requeued" in hold()


@pytest.mark.usefixtures("quick")
def test_without_a_replace_gang_the_fault_falls_on_a_busy_worker(tmp_path: Path) -> None:
    c = FakeCluster(tmp_path)
    extra: dict[str, object] = {}
    targets, _, _, heal, hold = replacefaults.play(
        c,  # type: ignore[arg-type]
        nemesis.KILL_REPLACE_WORKER,
        ["w1", "w2"],
        ["w1"],
        0,
        extra,
    )
    assert targets == ["w1"] and extra["replace_members"] == []
    assert hold() == "no member of a replace gang was hit"
    heal()
    assert os.path.isdir(tmp_path)


def test_a_gang_whose_other_members_are_done_is_no_target() -> None:
    seen = SeenMembers()
    now = ledger.now_ns()
    seen.saw(start("j1", 3, 0, 0, "0", for_s=1.5), "w1", now)
    seen.saw(start("j1", 3, 1, 0, "1"), "w2", now)
    assert [k for k, _ in seen.replace_members("w2", now)] == [("j1", 3, 1, 0)]
    # Rank 0 ends within 2 s: w2 killed, its rank could not be placed again in time.
    assert seen.replace_members("w2", now, lasting_ns=now + int(2e9)) == []
    # Rank 0 committed its effect: losing w2 would leave no member at work.
    seen.saw({"type": "effect", "job": "j1", "token": 3, "rank": 0}, "w1", now + 1)
    assert seen.replace_members("w2", now) == []
