"""Tenancy metrics on hand-made cases with known answers."""

from __future__ import annotations

import pytest

from synapse_ha.core.cluster_config import Queue
from synapse_ha.sim.fairness import Loss, TenancyMeter, gpu_hours_lost, jain


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1.0, 1.0, 1.0], 1.0),
        ([1.0, 0.0, 0.0], 1 / 3),
        ([2.0, 1.0], 0.9),
        ([0.5, 0.5, 1.0, 0.0], 2 / 3),
    ],
)
def test_jain_of_known_shares(values: list[float], expected: float) -> None:
    assert jain(values) == pytest.approx(expected)


def test_jain_is_undefined_for_nothing() -> None:
    assert jain([]) is None
    assert jain([0.0, 0.0]) is None


def test_gpu_hours_lost_of_a_known_preemption() -> None:
    # A 16-GPU gang that ran 30 minutes and a 4-GPU one that ran 90 minutes.
    losses = [Loss(16, 1_800_000), Loss(4, 5_400_000)]
    assert losses[0].gpu_hours == 8.0
    assert gpu_hours_lost(losses) == pytest.approx(14.0)


def test_meter_averages_jain_over_time_with_two_backlogged_queues() -> None:
    meter = TenancyMeter([Queue("a", gpu=10), Queue("b", gpu=10), Queue("default")])
    # 0-1 s: a holds its quota, b nothing (Jain 0.5); b is starved.
    meter.observe(0, {"a": 10}, {"a", "b", "default"}, {"b"})
    # 1-3 s: both hold half (Jain 1); b is no longer starved.
    meter.observe(1_000, {"a": 5, "b": 5}, {"a", "b"}, set())
    # 3-4 s: only a is backlogged: no Jain figure for that time.
    meter.observe(3_000, {"a": 5, "b": 5}, {"a"}, set())
    out = meter.finish(4_000)
    assert out["jain_backlogged"] == pytest.approx((0.5 * 1 + 1.0 * 2) / 3, abs=1e-4)
    assert out["jain_backlogged_h"] == pytest.approx(3 / 3600, abs=1e-3)
    assert set(out["queues"]) == {"a", "b"}  # no quota, no share
    assert out["queues"]["b"]["quota_back_s"]["max"] == 1.0
    assert out["queues"]["a"]["quota_back_s"]["n"] == 0
    assert out["queues"]["a"]["mean_share"] == pytest.approx((10 * 1 + 5 * 3) / 10 / 4)
    assert out["queues"]["b"]["mean_share_while_backlogged"] == pytest.approx(
        (0 * 1 + 0.5 * 2) / 3, abs=1e-4
    )


def test_a_starved_episode_still_open_ends_with_the_run() -> None:
    meter = TenancyMeter([Queue("a", gpu=8)])
    meter.observe(0, {}, {"a"}, set())
    meter.observe(2_000, {}, {"a"}, {"a"})
    out = meter.finish(7_000)
    assert out["quota_back_s"] == {"n": 1, "mean": 5.0, "p95": 5.0, "max": 5.0}


def test_episodes_reclaim_could_end_are_reported_apart() -> None:
    meter = TenancyMeter([Queue("a", gpu=8), Queue("b", gpu=8)])
    # a starved 0-4 s, never reclaimable (nothing borrowed); b starved 1-3 s, reclaimable
    # from 2 s on (its cohort then borrowed enough).
    meter.observe(0, {}, {"a"}, {"a"})
    meter.observe(1_000, {}, {"a", "b"}, {"a", "b"})
    meter.observe(2_000, {}, {"a", "b"}, {"a", "b"}, {"b"})
    meter.observe(3_000, {}, {"a"}, {"a"})
    meter.observe(4_000, {}, set(), set())
    meter.observe(5_000, {}, {"b"}, {"b"}, {"b"})  # open at the end: reclaimable
    out = meter.finish(6_000)
    assert out["quota_back_s"] == {"n": 3, "mean": 2.3, "p95": 4.0, "max": 4.0}
    assert out["quota_back_reclaimable_s"] == {"n": 2, "mean": 1.5, "p95": 2.0, "max": 2.0}
    assert out["queues"]["a"]["quota_back_reclaimable_s"]["n"] == 0
    assert out["queues"]["b"]["quota_back_reclaimable_s"]["n"] == 2
