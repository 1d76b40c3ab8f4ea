"""One workload under three run-time estimates, side by side: ``none`` (only
a job's ``time_limit`` counts, as before), ``default`` (every queue's
``default_time_limit_ms``, Slurm's DefaultTime) and ``learned`` (every queue's
``learned_estimates``, the default when a job has fewer than 5 alike runs), and
``oracle``, the bound: every job without a time limit given one a second past its own
run time, as if each user knew it. Estimates feed reservations and backfill only
(:mod:`synapse_ha.core.queues.estimates`); a job is never stopped at one. Every variant
runs the real scheduler and ``apply``; only the queues (or, for ``oracle``, the limits)
differ, and for ``learned`` the finished jobs are kept a day (its history) rather than
purged at once.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from synapse_ha.core.cluster_config import (
    DEFAULT_QUEUE,
    MAX_DEFAULT_TIME_LIMIT_MS,
    MAX_RESERVATIONS_PER_PASS,
    ClusterConfig,
    PreemptionMode,
    Queue,
)
from synapse_ha.sim.engine import Result, simulate
from synapse_ha.sim.policies import Ours
from synapse_ha.sim.tables import Column, results_table
from synapse_ha.sim.tenancy import PASS_INTERVAL_MS
from synapse_ha.sim.workload import Workload

VARIANTS = ("none", "default", "learned", "oracle")
DEFAULT_TIME_LIMIT_MS = 4 * 3_600_000  # the multi-tenant workload's longest run
HISTORY_RETENTION_MS = 24 * 3_600_000  # how long ``learned`` keeps finished jobs


def with_estimates(workload: Workload, variant: str, default_ms: int) -> Workload:
    """``workload`` with every queue set for ``variant`` (module doc); a workload without
    queues gets the built-in ``default`` queue so set."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown estimate variant {variant!r}; choose from {VARIANTS}")
    if variant == "none":
        return workload
    if variant == "oracle":
        jobs = tuple(
            j
            if j.spec.time_limit_ms
            else replace(j, spec=replace(j.spec, time_limit_ms=j.duration_ms + 1_000))
            for j in workload.jobs
        )
        return replace(workload, jobs=jobs)
    learned = variant == "learned"
    queues = tuple(
        replace(q, default_time_limit_ms=default_ms, learned_estimates=learned)
        for q in workload.queues or (Queue(DEFAULT_QUEUE),)  # none: the built-in one
    )
    return replace(workload, queues=queues)


def parse_estimates(text: str) -> tuple[str, int]:
    """A workload option's estimates as ``(variant, default_ms)``: ``none``, ``learned``
    (learned only, no default), ``learned:S`` (learned, else a default of S seconds) or
    ``default:S``; ValueError naming the rule otherwise."""
    variant, _, seconds = text.strip().partition(":")
    if variant == "none" and not seconds:
        return "none", 0
    if variant == "learned" and not seconds:
        return "learned", 0
    if variant in ("learned", "default") and seconds:
        try:
            ms = round(float(seconds) * 1000)
        except ValueError:
            ms = -1
        if 1_000 <= ms <= MAX_DEFAULT_TIME_LIMIT_MS:
            return variant, ms
        raise ValueError(
            f"estimates: S in {variant}:S must be seconds from 1 to 366 days, got {seconds!r}"
        )
    raise ValueError(f"estimates: none, learned, learned:S or default:S, got {text!r}")


def keeping_history(config: ClusterConfig, variant: str) -> ClusterConfig:
    """``config`` keeping finished jobs :data:`HISTORY_RETENTION_MS` (or its own retention
    when longer) for ``learned``, whose estimates are made from them; as it is else."""
    if variant != "learned":
        return config
    return replace(config, retention_ms=max(config.retention_ms, HISTORY_RETENTION_MS))


def with_reservations(config: ClusterConfig, count: int) -> ClusterConfig:
    """``config`` keeping ``count`` reservations per pass (``--reservations``:
    ``ClusterConfig.reservations_per_pass``, which backfill is judged against); a
    ValueError naming the rule when it is out of range."""
    if not 1 <= count <= MAX_RESERVATIONS_PER_PASS:
        raise ValueError(f"from 1 to {MAX_RESERVATIONS_PER_PASS} per pass, got {count}")
    return replace(config, reservations_per_pass=count)


def run_estimates(
    workload: Workload,
    variants: tuple[str, ...] = VARIANTS,
    default_ms: int = DEFAULT_TIME_LIMIT_MS,
    mode: PreemptionMode = PreemptionMode.TOPOLOGY,
    config: ClusterConfig | None = None,
    pass_interval_ms: int = PASS_INTERVAL_MS,
) -> list[Result]:
    """``workload`` under each of ``variants`` in preemption ``mode``; each result's
    policy is the variant's name."""
    base = replace(config or ClusterConfig(retention_ms=0), preemption=mode)
    results = []
    for variant in variants:
        result = simulate(
            with_estimates(workload, variant, default_ms),
            Ours(),
            config=keeping_history(base, variant),
            pass_interval_ms=pass_interval_ms,
        )
        result.policy = variant
        results.append(result)
    return results


def report(results: list[Result], default_ms: int, mode: PreemptionMode) -> dict[str, Any]:
    """The delays side by side, and each variant's against ``none`` when it ran."""
    delays = {r.policy: _delays(r) for r in results}
    out: dict[str, Any] = {
        "default_time_limit_s": default_ms / 1000,
        "preemption": str(mode),
        "variants": delays,
    }
    if "none" in delays:
        base = delays["none"]
        out["over_none"] = {
            name: {k: round(d[k] / base[k], 3) if base[k] else None for k in ("mean", "p50")}
            for name, d in delays.items()
        }
    return out


def _delays(r: Result) -> dict[str, Any]:
    m = r.metrics
    delay = m["queue_delay_s"]
    big = m["queue_delay_big_gangs_s"]
    return {
        "mean": delay["mean"],
        "p50": delay["p50"],
        "p95": delay["p95"],
        "big_gang_mean": big["mean"],
        "gpu_allocation": m["gpu_allocation"],
        "jobs_started": m["jobs_started"],
        "wall_s": m["wall_s"],
    }


_COLUMNS: tuple[Column, ...] = (
    ("estimates", lambda r: r.policy),
    ("alloc", lambda r: f"{r.metrics['gpu_allocation']:.1%}"),
    ("delay mean", lambda r: f"{r.metrics['queue_delay_s']['mean']:.0f}s"),
    ("median", lambda r: f"{r.metrics['queue_delay_s']['p50']:.0f}s"),
    ("p95", lambda r: f"{r.metrics['queue_delay_s']['p95']:.0f}s"),
    ("big gangs mean", lambda r: f"{r.metrics['queue_delay_big_gangs_s']['mean']:.0f}s"),
)


def table(results: list[Result]) -> str:
    """The side-by-side delays as a fixed-width table."""
    return "\n".join(results_table(_COLUMNS, results))
