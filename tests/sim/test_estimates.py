"""Run-time estimates in the simulator (synapse_ha.sim.estimates): a scripted workload
where only a queue default lets a short job backfill, and the ``--estimates`` flag."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from synapse_ha.core.cluster_config import ClusterConfig, PreemptionMode, Queue
from synapse_ha.sim.cli import main
from synapse_ha.sim.estimates import (
    HISTORY_RETENTION_MS,
    keeping_history,
    parse_estimates,
    report,
    run_estimates,
    table,
    with_estimates,
)
from synapse_ha.sim.workload import SimJob, Workload, synthetic_cluster
from tests.core.harness import job


def _workload() -> Workload:
    """Two 8-GPU hosts. ``hold`` (8 GPUs, time limit 1,000 s) and ``half`` (4 GPUs, 500 s,
    no limit) run; ``big`` (2 x 8 GPUs, first in line) waits for both; ``small`` (4 GPUs,
    100 s, no limit) arrives after it. Without estimates ``half``'s end is unknown, so the
    reservation has no start and ``small`` waits for ``big``; with a 600 s default the
    reservation starts at 1,000 s and ``small`` (expected 600 s) backfills at once."""
    q = "q"
    jobs = (
        SimJob(0, job("hold", gpu=8, time_limit_s=1_000, queue=q), 1_000_000, "u"),
        SimJob(0, job("half", gpu=4, queue=q), 500_000, "u"),
        SimJob(1_000, job("big", replicas=2, gpu=8, priority=10, queue=q), 100_000, "u"),
        SimJob(2_000, job("small", gpu=4, queue=q), 100_000, "u"),
    )
    return Workload("scripted", synthetic_cluster(2), jobs, "scripted", queues=(Queue(q),))


def _delay(result_metrics: dict[str, object]) -> float:
    delays = result_metrics["queue_delay_s"]
    assert isinstance(delays, dict)
    return float(delays["mean"])


def test_a_queue_default_lets_the_short_job_backfill_and_none_does_not() -> None:
    results = run_estimates(_workload(), ("none", "default"), default_ms=600_000)
    none, default = (r.metrics for r in results)
    assert [r.policy for r in results] == ["none", "default"]
    assert none["jobs_started"] == default["jobs_started"] == 4
    # small waits ~1,098 s without (for big, which waited for hold), 0 s with.
    assert _delay(default) < _delay(none) - 250
    figures = report(results, 600_000, PreemptionMode.TOPOLOGY)
    assert figures["over_none"]["default"]["mean"] < 1.0
    assert "default" in table(results)


def test_learned_estimates_keep_the_history_and_the_queue_fields_are_set() -> None:
    w = _workload()
    learned = with_estimates(w, "learned", 600_000)
    assert learned.queues == (Queue("q", default_time_limit_ms=600_000, learned_estimates=True),)
    assert with_estimates(w, "none", 600_000) is w
    with pytest.raises(ValueError, match="unknown estimate variant"):
        with_estimates(w, "psychic", 600_000)
    (result,) = run_estimates(w, ("learned",), default_ms=600_000)
    assert result.metrics["jobs_started"] == 4


def test_the_estimates_flag_prints_the_variants_side_by_side(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--workload", "multi-tenant", "--hours", "0.5", "--nodes", "8", "--estimates"]
    assert main([*args, "--default-time-limit", "3600"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert list(doc["variants"]) == ["none", "default", "learned", "oracle"]
    assert doc["default_time_limit_s"] == 3600 and doc["preemption"] == "topology"
    assert err.splitlines()[0].split()[:3] == ["estimates", "alloc", "delay"]
    with pytest.raises(SystemExit):
        main([*args, "--default-time-limit", "-1"])


def test_the_oracle_gives_every_job_without_a_limit_its_own_run_time() -> None:
    w = _workload()
    limits = [j.spec.time_limit_ms for j in with_estimates(w, "oracle", 1).jobs]
    assert limits == [1_000_000, 501_000, 101_000, 101_000]
    (result,) = run_estimates(w, ("oracle",))
    assert result.metrics["jobs_started"] == 4
    assert sorted(result.delays_s) == [0.0, 0.0, 0.0, 999.0]  # only big waits


def test_a_workload_without_queues_sets_the_built_in_one() -> None:
    w = replace(_workload(), jobs=tuple(replace(j, spec=replace(j.spec, queue="default"))
                                        for j in _workload().jobs), queues=())  # fmt: skip
    assert with_estimates(w, "default", 1).queues == (Queue("default", default_time_limit_ms=1),)
    none, default = run_estimates(w, ("none", "default"), default_ms=600_000)
    assert sorted(default.delays_s) == [0.0, 0.0, 0.0, 999.0]
    assert _delay(default.metrics) < _delay(none.metrics) - 250


def test_an_estimates_option_is_parsed_and_a_bad_one_names_the_rule() -> None:
    assert parse_estimates("none") == ("none", 0)
    assert parse_estimates("learned") == ("learned", 0)
    assert parse_estimates("learned:3600") == ("learned", 3_600_000)
    assert parse_estimates("default:485") == ("default", 485_000)
    for bad, rule in (
        ("psychic", "none, learned, learned:S or default:S"),
        ("none:5", "none, learned, learned:S or default:S"),
        ("default", "none, learned, learned:S or default:S"),
        ("default:0", "S in default:S must be seconds from 1 to 366 days"),
        ("default:x", "S in default:S must be seconds"),
        ("learned:400d", "S in learned:S must be seconds"),
        ("default:40000000", "from 1 to 366 days"),
    ):
        with pytest.raises(ValueError, match=rule):
            parse_estimates(bad)


def test_learned_estimates_keep_finished_jobs_and_the_others_do_not() -> None:
    base = ClusterConfig(retention_ms=0)
    assert keeping_history(base, "learned").retention_ms == HISTORY_RETENTION_MS
    assert keeping_history(base, "default") is base
    longer = ClusterConfig(retention_ms=2 * HISTORY_RETENTION_MS)
    assert keeping_history(longer, "learned").retention_ms == 2 * HISTORY_RETENTION_MS
