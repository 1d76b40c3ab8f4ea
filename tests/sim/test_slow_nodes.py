"""Slow nodes in the simulator (sim/slow_nodes.py): seeded onsets and blips, a gang's
lockstep pace, the detector's evaluation and its targets."""

from __future__ import annotations

from typing import Any

import pytest

from synapse_ha.core.health.slowness import SlownessRule
from synapse_ha.sim.slow_nodes import (
    MS_PER_DAY,
    PaceNoise,
    SlowNodeModel,
    blip_in_window,
    draw_blips,
    draw_slow_spells,
    evaluate,
    evaluate_once,
    figures,
    gang_pace,
    judge_targets,
)

NODES = [f"node-{i:05d}" for i in range(40)]
QUIET = PaceNoise(node_sigma=0, window_sigma=0, blips_per_node_day=0)


def test_onsets_are_seeded_per_node_in_range_and_in_time_order() -> None:
    model = SlowNodeModel(per_1000_node_days=500, slowdown_min=0.2, slowdown_max=0.3, seed=4)
    spells = draw_slow_spells(NODES, model, 10 * MS_PER_DAY)
    assert len(spells) > 20
    assert list(spells) == sorted(spells)
    assert all(0.2 <= s.slowdown <= 0.3 and 0 <= s.from_ms < 10 * MS_PER_DAY for s in spells)
    assert spells == draw_slow_spells(reversed(NODES), model, 10 * MS_PER_DAY)
    # A node's onsets do not depend on which other nodes are drawn.
    alone = draw_slow_spells(NODES[:1], model, 10 * MS_PER_DAY)
    assert alone == tuple(s for s in spells if s.node_id == NODES[0])
    other_seed = draw_slow_spells(NODES, SlowNodeModel(per_1000_node_days=500, seed=5), MS_PER_DAY)
    assert other_seed != tuple(s for s in spells if s.from_ms < MS_PER_DAY)
    assert draw_slow_spells(NODES, SlowNodeModel(per_1000_node_days=0), MS_PER_DAY) == ()


def test_a_lockstep_gang_runs_at_its_slowest_members_pace() -> None:
    assert gang_pace({"b": 0.25, "c": 0.4, "z": 0.9}, ["a", "b", "c"]) == 1.4
    assert gang_pace({}, ["a", "b"]) == 1.0
    assert gang_pace({"a": 0.5}, []) == 1.0


def test_a_blip_moves_a_windows_median_only_when_it_covers_more_than_half() -> None:
    longest = 900_000
    blips = [(100_000, 500_000, 0.3)]  # 400 s of a 600 s window from 0
    assert blip_in_window(blips, 0, 600_000, longest) == 0.3
    assert blip_in_window(blips, 300_000, 600_000, longest) == 0.0  # 200 s of it
    assert blip_in_window([(0, 300_000, 0.3)], 0, 600_000, longest) == 0.0  # exactly half
    two = [(0, 200_000, 0.2), (300_000, 450_000, 0.4)]  # 350 s together
    assert blip_in_window(two, 0, 600_000, longest) == 0.4
    assert blip_in_window([], 0, 600_000, longest) == 0.0
    drawn = draw_blips(NODES[:3], PaceNoise(blips_per_node_day=50), MS_PER_DAY, seed=1)
    for node_blips in drawn.values():
        assert node_blips == sorted(node_blips)
        assert all(30_000 <= end - start <= 900_000 for start, end, _ in node_blips)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (SlowNodeModel(per_1000_node_days=-1), "per_1000_node_days"),
        (SlowNodeModel(slowdown_min=0.5, slowdown_max=0.2), "slowdown_min, slowdown_max"),
        (SlowNodeModel(duty=0), "duty: more than 0"),
        (SlowNodeModel(repair_ms=0), "repair_ms"),
        (PaceNoise(window_sigma=2), "window_sigma: between 0 and 1"),
        (PaceNoise(blip_min_ms=10, blip_max_ms=5), "blip_min_ms, blip_max_ms"),
        (PaceNoise(blip_slowdown_min=-1), "blip_slowdown_min"),
    ],
)
def test_a_model_out_of_range_is_refused_naming_the_field(
    bad: SlowNodeModel | PaceNoise, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        bad.check()


def test_without_slow_nodes_or_noise_nothing_is_marked_or_lost() -> None:
    run = evaluate_once(24, 1.0, SlowNodeModel(per_1000_node_days=0), QUIET, SlownessRule())
    fig = figures([run])
    assert fig["gang_windows"] > 100
    assert (fig["false_marks"], fig["slow_spells"], fig["gpu_hours_lost_to_slow_nodes"]) == (
        0,
        0,
        0,
    )
    assert fig["healthy_nodes"] == 24
    assert fig["recall_within_3_gangs"] is None


def _evaluated(seed: int) -> dict[str, Any]:
    model = SlowNodeModel(per_1000_node_days=300, seed=seed)
    return evaluate(24, 1.0, model, QUIET, SlownessRule(), seeds=(seed,))


def test_slow_nodes_are_marked_within_three_gangs_and_cost_less_than_undetected() -> None:
    result = _evaluated(2)
    fig = result["figures"]
    assert fig["slow_spells_counted"] >= 3
    assert fig["marked_within_3_gangs"] == fig["slow_spells_counted"]
    # Without noise a slow member strikes every window: marked at its third.
    assert fig["windows_at_mark_p50"] == 3
    assert fig["false_marks"] == 0
    assert fig["gpu_hours_lost_to_slow_nodes"] < fig["gpu_hours_lost_without_detector"]
    assert 0 < fig["gpu_hours_lost_after_the_mark"] < fig["gpu_hours_lost_to_slow_nodes"]
    assert all(t["met"] for t in result["targets"].values())
    # Seeded: the same run gives the same figures.
    assert _evaluated(2)["figures"] == fig


def test_the_targets_are_judged_on_their_shares() -> None:
    met = judge_targets({"recall_within_3_gangs": 0.9, "healthy_marked_share": 0.01})
    assert [t["met"] for t in met.values()] == [True, True]
    missed = judge_targets({"recall_within_3_gangs": 0.89, "healthy_marked_share": 0.011})
    assert [t["met"] for t in missed.values()] == [False, False]
    unknown = judge_targets({"recall_within_3_gangs": None, "healthy_marked_share": None})
    assert [t["met"] for t in unknown.values()] == [False, False]
