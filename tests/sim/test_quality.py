"""The quality report's pieces: the delay CDF, the figures read from a run, the spread
over seeds, the table and the openb node sample."""

from __future__ import annotations

from pathlib import Path

import pytest

from synapse_ha.core.model import NodeInfo
from synapse_ha.sim.engine import simulate
from synapse_ha.sim.policies import Ours
from synapse_ha.sim.quality import (
    delay_cdf,
    figures,
    markdown,
    openb_sample,
    run_policies,
    spread,
    summarise,
)
from synapse_ha.sim.tenants import multi_tenant
from synapse_ha.sim.workload import load_openb, synthetic

OPENB = Path(__file__).resolve().parents[3] / "shared" / "data" / "alibaba-openb-v2023"


def test_the_delay_cdf_takes_nearest_ranks() -> None:
    cdf = delay_cdf([0.0, 0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0])
    assert cdf["n"] == 10 and cdf["no_wait"] == 0.2
    assert (cdf["p10"], cdf["p25"], cdf["p50"], cdf["p90"], cdf["p99"]) == (0, 10, 30, 70, 80)
    assert cdf["max"] == 80
    assert delay_cdf([]) == {"n": 0}


def test_the_spread_is_over_the_seeds_that_had_a_figure() -> None:
    assert spread([1.0, 3.0]) == {"n": 2, "mean": 2.0, "min": 1.0, "max": 3.0}
    assert spread([]) == {"n": 0, "mean": None, "min": None, "max": None}


def test_the_figures_are_the_simulators_own() -> None:
    result = simulate(synthetic(seed=3, jobs=60, nodes=64), Ours())
    m = result.metrics
    got = figures(result)
    assert got["delay_mean_s"] == m["queue_delay_s"]["mean"]
    assert got["delay_p95_s"] == m["queue_delay_s"]["p95"]
    assert got["gpu_allocation"] == m["gpu_allocation"]
    assert got["jain_backlogged"] is None  # no queues
    big = m["queue_delay_big_gangs_s"]
    assert got["big_gang_max_delay_s"] == (big["max"] if big["n"] else None)


def test_a_workload_with_queues_runs_every_mode_and_both_baselines() -> None:
    workload = multi_tenant(seed=2, hours=0.5, hosts=16)
    results = run_policies(workload)
    names = [r.policy for r in results]
    assert names == [
        "ours/off",
        "ours/blind",
        "ours/topology",
        "ours/fair",
        "naive",
        "fifo-first-fit",
    ]
    summary = summarise([results])
    assert list(summary) == names
    off = summary["ours/off"]
    assert off["figures"]["gpu_hours_lost"] == {"n": 1, "mean": 0.0, "min": 0.0, "max": 0.0}
    assert off["delay_cdf_s"]["n"] == len(results[0].delays_s)
    table = markdown({"multi-tenant": {"workload": "w", "seeds": "seed 1", "policies": summary}})
    assert sum(1 for line in table.splitlines() if line.startswith("| multi-tenant |")) == 6
    assert "- multi-tenant (seed 1): w" in table


def test_the_table_shows_the_range_over_seeds_and_a_dash_for_none() -> None:
    figure = {"n": 2, "mean": 1500.0, "min": 1000.0, "max": 2000.0}
    empty = {"n": 0, "mean": None, "min": None, "max": None}
    policies = {
        "ours": {
            "figures": {
                "delay_mean_s": figure,
                "delay_p50_s": empty,
                "delay_p95_s": empty,
                "big_gang_max_delay_s": empty,
                "jain_backlogged": empty,
                "gpu_hours_lost": empty,
                "gpu_hours_lost_per_preemptor_placed": empty,
                "quota_back_p95_s": empty,
                "preemptors_with_topology_in_one_rack": empty,
                "gpu_allocation": {"n": 2, "mean": 0.5, "min": 0.5, "max": 0.5},
            }
        }
    }
    row = markdown({"w": {"workload": "", "seeds": "", "policies": policies}}).splitlines()[2]
    assert row == "| w | ours | 1,500 (1,000-2,000) | - | - | - | - | - | - | - | - | 50.0% |"


@pytest.mark.skipif(not OPENB.is_dir(), reason="the openb trace is not on this machine")
def test_the_openb_sample_keeps_every_node_shape() -> None:
    every = load_openb(OPENB, limit=0).nodes
    sample = openb_sample(OPENB, 100)

    assert {_shape(n) for n in sample} == {_shape(n) for n in every}
    assert len(sample) < len(every) // 10
    assert openb_sample(OPENB, 1) == tuple(sorted(every, key=lambda n: (_shape(n), n.node_id)))
    with pytest.raises(ValueError, match="every: at least 1"):
        openb_sample(OPENB, 0)


def _shape(node: NodeInfo) -> tuple[int, int, int, str]:
    cap = node.capacity
    return (cap.cpu_milli, cap.memory_mib, cap.gpu, node.gpu_model)
