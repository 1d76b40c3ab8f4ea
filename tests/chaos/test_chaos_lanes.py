"""Lanes: several fault schedules played at once (a soak's composed nemesis). Each lane
keeps to its own targets, the network sets hold the union of the lanes' faults, the
first error stops every lane, and saved runs sum into one summary line."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from chaos import cluster, nemesis, net
from chaos.__main__ import cmd_summary, configs, parse_lanes, saved_result
from chaos.cluster import SUBMIT_INTERVAL_S
from chaos.nemesis import Step
from chaos.run import lane_load, play_lanes
from synapse_ha.core.cluster_config import MAX_REQUEUES_LIMIT


def test_each_lane_draws_its_own_kinds_and_fills_the_duration_alone() -> None:
    steps = nemesis.random_schedule(5, 120.0, lanes=3)
    assert steps == nemesis.random_schedule(5, 120.0, lanes=3)
    assert [s.index for s in steps] == list(range(len(steps)))
    assert nemesis.lanes_of(steps) == 3
    for lane in range(3):
        mine = [s for s in steps if s.lane == lane]
        kinds = nemesis.CONTROL_FAULTS if lane == 0 else nemesis.WORKER_FAULTS
        assert mine and {s.kind for s in mine} <= set(kinds)
        assert sum(s.gap_before_s + s.duration_s for s in mine) <= 120.0
    # Three lanes hold about three times the faults of one.
    assert len(steps) > 2 * len(nemesis.random_schedule(5, 120.0))


def test_one_lane_is_the_classic_schedule() -> None:
    steps = nemesis.random_schedule(9, 90.0, lanes=1)
    assert {s.lane for s in steps} == {0}
    assert {s.kind for s in steps} - set(nemesis.CONTROL_FAULTS)  # worker kinds too
    with pytest.raises(ValueError, match="lanes"):
        nemesis.random_schedule(9, 90.0, lanes=nemesis.MAX_LANES + 1)


def test_a_kind_left_out_is_left_out_of_every_lane() -> None:
    kinds = tuple(k for k in nemesis.ALL_FAULTS if k != nemesis.FREEZE_HOST)
    steps = nemesis.random_schedule(2, 200.0, kinds=kinds, lanes=3)
    assert nemesis.FREEZE_HOST not in {s.kind for s in steps}


def test_worker_lanes_split_the_workers_without_sharing_one() -> None:
    workers = ["w1", "w2", "w3", "w4", "w5"]
    for lanes in range(2, nemesis.MAX_LANES + 1):
        pools = [nemesis.worker_pool(workers, lane, lanes) for lane in range(1, lanes)]
        flat = [w for pool in pools for w in pool]
        assert sorted(flat) == workers, lanes  # every worker in exactly one lane
        assert all(pools), lanes
    assert nemesis.worker_pool(workers, 0, 3) == workers  # loss may pick any
    assert nemesis.worker_pool(workers, 0, 1) == workers


def test_lanes_argument() -> None:
    assert parse_lanes("3") == 3
    for bad in ("0", "x", str(nemesis.MAX_LANES + 1)):
        with pytest.raises(Exception, match="--lanes"):
            parse_lanes(bad)


def test_the_network_sets_hold_every_lanes_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    scripts: list[str] = []
    monkeypatch.setattr(
        net, "run", lambda argv, input_text=None, check=True: scripts.append(input_text or "") or ""
    )
    net._layouts.clear()
    net.set_blocked([("a", "b")], "lane0")
    net.set_blocked([("c", "d")], "lane1")
    assert "a . b, c . d" in scripts[-1]
    net.set_blocked([], "lane0")  # lane 0 heals: lane 1's cut stays
    assert "c . d" in scripts[-1] and "a . b" not in scripts[-1]
    net.set_lossy([("e", "f")], "lane0")
    assert "lossy" in scripts[-1] and "c . d" not in scripts[-1]
    net.heal_network()
    assert scripts[-2].strip() == f"flush set bridge {net.NFT_TABLE} blocked"
    assert scripts[-1].strip() == f"flush set bridge {net.NFT_TABLE} lossy"


@dataclass
class FakePlayer:
    lane: int
    fail_at: int = -1
    played: list[int] = field(default_factory=list)
    entered: threading.Event = field(default_factory=threading.Event)
    wait_for: threading.Event | None = None  # before its step (a fault that lasts)
    failing: threading.Event = field(default_factory=threading.Event)

    def play(self, step: Step) -> dict[str, object]:
        self.entered.set()
        if self.wait_for is not None:
            assert self.wait_for.wait(5.0)
            if self.lane != 0:
                # Lane 0 has failed: its thread ends once it has stopped every lane.
                for failed in [t for t in threading.enumerate() if t.name == "nemesis-lane0"]:
                    failed.join(5.0)
                    assert not failed.is_alive()
        if step.index == self.fail_at:
            self.failing.set()
            raise TimeoutError(f"lane {self.lane} step {step.index}")
        self.played.append(step.index)
        return {}


def _steps(lanes: int, per_lane: int) -> list[Step]:
    return [
        Step(lane * per_lane + i, nemesis.KILL_WORKER, 0.0, 0.0, 0, lane)
        for i in range(per_lane)
        for lane in range(lanes)
    ]


def test_lanes_play_their_own_steps_in_order() -> None:
    steps = _steps(3, 4)
    players = [FakePlayer(lane) for lane in range(3)]
    played = [0, 0, 0]
    play_lanes(players, steps, played)  # type: ignore[arg-type]
    assert played == [4, 4, 4]
    for p in players:
        assert p.played == [s.index for s in steps if s.lane == p.lane]


def test_the_first_error_stops_every_lane_and_is_raised() -> None:
    steps = _steps(2, 50)
    # Lane 0 fails at its third step while lane 1 is in the middle of a fault.
    failing = threading.Event()
    lane1 = FakePlayer(1, wait_for=failing)
    lane0 = FakePlayer(0, fail_at=2, wait_for=lane1.entered, failing=failing)
    played = [0, 0]
    with pytest.raises(TimeoutError, match="lane 0 step 2"):
        play_lanes([lane0, lane1], steps, played)  # type: ignore[list-item]
    assert played[0] == 2
    assert 1 <= played[1] < 50  # finished the fault it was in, then stopped


def _saved(root: Path, name: str, seed: int, faults: int, violations: list[str]) -> Path:
    run_dir = root / f"{name}-seed{seed}"
    run_dir.mkdir(parents=True)
    (run_dir / "meta.json").write_text(
        json.dumps({"scenario": name, "seed": seed, "lanes": 3, "start_ns": 0, "end_ns": 9e9})
    )
    (run_dir / "report.json").write_text(
        json.dumps({"faults": faults, "jobs": 10, "violations": violations, "error": ""})
    )
    with open(run_dir / "faults.jsonl", "w", encoding="utf-8") as f:
        for i in range(faults):
            f.write(json.dumps({"type": "fault", "kind": ["kill-worker", "bridge"][i % 2]}) + "\n")
    return run_dir


def test_saved_runs_sum_into_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _saved(tmp_path / "day1" / "t1", "random", 1000, 30, [])
    _saved(tmp_path / "day2" / "t2", "random", 1001, 12, ["overlap [job-000003]: ran twice"])
    (tmp_path / "day2" / "t2" / "random-seed1002").mkdir()  # cut short: no report
    result = saved_result(tmp_path / "day2" / "t2" / "random-seed1001")
    assert [(v.kind, v.job) for v in result.violations] == [("overlap", "job-000003")]
    assert result.lanes == 3 and not result.passed

    class Args:
        out_dirs = [tmp_path / "day1", tmp_path / "day2"]

    assert cmd_summary(Args()) == 1  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "chaos: 42 faults, 2 kinds, 20 jobs (0 sbatch: 0 steps, 0 tasks), 1 violations" in out
    assert "random=42; 18 s" in out
    assert "random seed 1001: 1 violations" in out
    Args.out_dirs = [tmp_path / "day1"]
    assert cmd_summary(Args()) == 0  # type: ignore[arg-type]


def test_more_lanes_submit_more_slowly_and_wait_longer_at_the_end() -> None:
    (one,) = configs([5], ["random"], 120.0)
    (three,) = configs([5], ["random"], 120.0, lanes=3)
    assert one.submit_interval_s == SUBMIT_INTERVAL_S  # CI's scenarios are unchanged
    assert three.submit_interval_s == 2 * SUBMIT_INTERVAL_S
    assert lane_load(1) == 1 and lane_load(3) == 2


def test_a_scenario_allows_a_requeue_per_fault_of_its_schedule() -> None:
    # Five lanes keep every worker faulted most of the time: a gang can be disrupted far
    # more than 50 times in 15 minutes, and must still finish rather than run out.
    assert cluster.max_requeues([]) == cluster.MIN_REQUEUES
    five = nemesis.random_schedule(2005, 900.0, lanes=5)
    assert cluster.max_requeues(five) == min(MAX_REQUEUES_LIMIT, len(five)) > cluster.MIN_REQUEUES
