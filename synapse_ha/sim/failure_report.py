"""One workload under GPU failures, once per fault policy (health-aware, health-blind),
on the same failures; the figures side by side and the health-aware target evaluated.

Target: health-aware loses at least :data:`LOSS_REDUCTION_TARGET` fewer GPU-hours to
hardware faults than health-blind. A target missed is reported with its numbers.
"""

from __future__ import annotations

from typing import Any

from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.sim.engine import Result
from synapse_ha.sim.gpu_failures import (
    LLAMA3_GPU_FAILURES_PER_1000_GPU_DAYS,
    FailureModel,
    FaultPolicy,
    fault_run,
    simulate_failures,
)
from synapse_ha.sim.tables import Column, results_table
from synapse_ha.sim.workload import Workload

LOSS_REDUCTION_TARGET = 0.50
PASS_INTERVAL_WITH_QUEUES_MS = 500  # the leader's scheduling period, as the tenancy runs use


def parse_policies(text: str) -> tuple[FaultPolicy, ...]:
    """``health-aware,health-blind`` as fault policies; ValueError naming the unknown."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    known = {str(p): p for p in FaultPolicy}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ValueError(
            f"failure policies: unknown {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(known)}"
        )
    return tuple(dict.fromkeys(known[n] for n in names))


def run_policies(
    workload: Workload,
    model: FailureModel,
    policies: tuple[FaultPolicy, ...] = tuple(FaultPolicy),
    config: ClusterConfig | None = None,
) -> list[Result]:
    """``workload`` under ``model`` once per policy (passes every 0.5 s for a workload
    with queues, as the tenancy runs; at every event otherwise)."""
    interval = PASS_INTERVAL_WITH_QUEUES_MS if workload.queues else 0
    return [
        simulate_failures(fault_run(workload, model, p, config=config, pass_interval_ms=interval))
        for p in policies
    ]


def report(workload: Workload, model: FailureModel, results: list[Result]) -> dict[str, Any]:
    """The figures per policy and the target, as JSON-ready data."""
    by_policy = {r.policy: r.metrics for r in results}
    out: dict[str, Any] = {
        "workload": workload.notes,
        "failure_model": {
            **model.describe(),
            "llama3_rate_per_1000_gpu_days": LLAMA3_GPU_FAILURES_PER_1000_GPU_DAYS,
        },
        "results": by_policy,
    }
    aware = by_policy.get(str(FaultPolicy.HEALTH_AWARE))
    blind = by_policy.get(str(FaultPolicy.HEALTH_BLIND))
    if aware is not None and blind is not None:
        out["target"] = loss_target(aware["gpu_faults"], blind["gpu_faults"])
    return out


def loss_target(aware: dict[str, Any], blind: dict[str, Any]) -> dict[str, Any]:
    """Health-aware's reduction of the GPU-hours lost to faults against health-blind."""
    lost_aware = aware["gpu_hours_lost_to_faults"]
    lost_blind = blind["gpu_hours_lost_to_faults"]
    reduction = round(1 - lost_aware / lost_blind, 3) if lost_blind else None
    return {
        "name": f"health-aware loses >= {LOSS_REDUCTION_TARGET:.0%} fewer GPU-hours to faults",
        "gpu_hours_lost_health_aware": lost_aware,
        "gpu_hours_lost_health_blind": lost_blind,
        "reduction": reduction,
        "met": reduction is not None and reduction >= LOSS_REDUCTION_TARGET,
    }


def _faults(r: Result) -> dict[str, Any]:
    faults: dict[str, Any] = r.metrics["gpu_faults"]
    return faults


_COLUMNS: tuple[Column, ...] = (
    ("policy", lambda r: r.policy),
    ("failures", lambda r: str(_faults(r)["gpu_failures"])),
    ("killed", lambda r: str(_faults(r)["gangs_killed_by_failures"])),
    ("onto failed", lambda r: str(_faults(r)["placements_onto_failed_gpus"])),
    ("GPU-h lost", lambda r: f"{_faults(r)['gpu_hours_lost_to_faults']:.1f}"),
    ("jobs failed", lambda r: str(_faults(r)["jobs_failed_by_faults"])),
    ("GPU-h out", lambda r: f"{_faults(r)['gpu_hours_out_of_service']:.0f}"),
    ("restart mean", lambda r: f"{_faults(r)['restart_delay_s']['mean']:.0f}s"),
    ("delay mean", lambda r: f"{r.metrics['queue_delay_s']['mean']:.0f}s"),
    ("JCT mean", lambda r: f"{r.metrics['job_completion_s']['mean']:.0f}s"),
    ("alloc", lambda r: f"{r.metrics['gpu_allocation']:.1%}"),
)


def table(results: list[Result]) -> str:
    """The headline figures, one line per policy."""
    lines = results_table(_COLUMNS, results)
    lines.append(
        "killed: gangs running on a GPU when it failed; onto failed: gangs bound on a failed "
        "GPU; GPU-h out: failed GPUs and cordoned nodes x time; jobs failed: for good"
    )
    return "\n".join(lines)
