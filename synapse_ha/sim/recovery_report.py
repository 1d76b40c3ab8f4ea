"""One workload under GPU failures, once per failure policy (requeue, replace,
replace+spares, elastic, elastic+spares), on the same failures: the figures side by side
and the targets.

Targets (judged on ``replace+spares``, every policy's figure shown beside it): ETTR of
gangs of 64+ GPUs at least :data:`ETTR_TARGET` (mean over those gangs), and restart
delay p50 at most :data:`RESTART_P50_TARGET_S`. A target missed is reported with its
numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.sim.engine import Result
from synapse_ha.sim.gpu_failures import LLAMA3_GPU_FAILURES_PER_1000_GPU_DAYS, FailureModel
from synapse_ha.sim.recovery import Recovery, RecoveryModel, recovery_run
from synapse_ha.sim.tables import results_table
from synapse_ha.sim.workload import Workload

ETTR_TARGET = 0.97
RESTART_P50_TARGET_S = 60.0
JUDGED_ON = Recovery.REPLACE_SPARES
PASS_INTERVAL_MS = 500  # the leader's scheduling period


def parse_recoveries(text: str) -> tuple[Recovery, ...]:
    """``requeue,replace,replace+spares,elastic,elastic+spares`` as failure policies, in
    the order given; ValueError naming the unknown."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    known = {str(p): p for p in Recovery}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ValueError(
            f"--recovery: unknown {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(known)}"
        )
    return tuple(dict.fromkeys(known[n] for n in names))


def run_recoveries(
    workload: Workload,
    model: FailureModel,
    recoveries: tuple[Recovery, ...] = tuple(Recovery),
    recovery_model: RecoveryModel | None = None,
    config: ClusterConfig | None = None,
    pass_interval_ms: int = PASS_INTERVAL_MS,
) -> list[Result]:
    """``workload`` under ``model``'s failures once per failure policy, the planner
    passing every ``pass_interval_ms`` (the leader's period by default)."""
    out = []
    for recovery in recoveries:
        run = recovery_run(
            workload,
            model,
            recovery,
            recovery_model,
            config=config,
            pass_interval_ms=pass_interval_ms,
        )
        run.run()
        result = run.result(0.0)
        result.policy = str(recovery)
        out.append(result)
    return out


def report(
    workload: Workload,
    model: FailureModel,
    recovery_model: RecoveryModel,
    results: list[Result],
) -> dict[str, Any]:
    """The figures per policy and the targets, as JSON-ready data."""
    by_policy = {r.policy: r.metrics for r in results}
    return {
        "workload": workload.notes,
        "failure_model": {
            **model.describe(),
            "llama3_rate_per_1000_gpu_days": LLAMA3_GPU_FAILURES_PER_1000_GPU_DAYS,
        },
        "recovery_model": recovery_model.describe(),
        "figures": {p: m["recovery"] for p, m in by_policy.items()},
        "targets": targets({p: m["recovery"] for p, m in by_policy.items()}),
        "results": by_policy,
    }


def targets(figures: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The targets, judged on ``replace+spares`` (None when it did not run), with every
    policy's figure beside."""
    judged = figures.get(str(JUDGED_ON))
    ettr = {p: f["ettr"]["gangs_64_plus"]["mean"] for p, f in figures.items()}
    p50 = {p: f["restart_delay_s"]["p50"] for p, f in figures.items()}
    ettr_met = p50_met = None
    if judged is not None:
        value = judged["ettr"]["gangs_64_plus"]["mean"]
        ettr_met = value is not None and value >= ETTR_TARGET
        delay = judged["restart_delay_s"]["p50"]
        p50_met = delay is None or delay <= RESTART_P50_TARGET_S
    return {
        "ettr_gangs_64_plus": {
            "rule": f"mean ETTR of gangs of 64+ GPUs >= {ETTR_TARGET:.0%} with {JUDGED_ON}",
            "by_policy": ettr,
            "met": ettr_met,
        },
        "restart_delay_p50": {
            "rule": f"restart delay p50 <= {RESTART_P50_TARGET_S:g} s with {JUDGED_ON}",
            "by_policy_s": p50,
            "met": p50_met,
        },
    }


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}s"


Figures = dict[str, Any]
_COLUMNS: tuple[tuple[str, Callable[[Figures], str]], ...] = (
    ("policy", lambda f: str(f["policy"])),
    ("failures", lambda f: str(f["gpu_failures"])),
    ("hit", lambda f: str(f["gangs_hit"])),
    ("ETTR 64+", lambda f: _share(f["ettr"]["gangs_64_plus"]["mean"])),
    ("p50", lambda f: _share(f["ettr"]["gangs_64_plus"]["p50"])),
    ("ETTR all", lambda f: _share(f["ettr"]["all"]["mean"])),
    ("ETTR hit", lambda f: _share(f["ettr"]["hit"]["mean"])),
    ("goodput GPU-h", lambda f: f"{f['goodput_gpu_hours']:.0f}"),
    ("lost GPU-h", lambda f: f"{f['gpu_hours_lost']:.1f}"),
    ("restart p50", lambda f: _seconds(f["restart_delay_s"]["p50"])),
    ("p99", lambda f: _seconds(f["restart_delay_s"]["p99"])),
    ("replaced", lambda f: f"{f['ranks_replaced']} ({f['ranks_replaced_on_spares']} spares)"),
    ("timeouts", lambda f: str(f["replace_timeouts"])),
    ("spares idle GPU-h", lambda f: f"{f['spares_idle_gpu_hours']:.0f}"),
    ("resizes up/down", lambda f: f"{f['elastic']['grows']}/{f['elastic']['shrinks']}"),
    ("resize GPU-h", lambda f: f"{f['gpu_hours_lost_to_resizes']:.1f}"),
    ("queue delay mean", lambda f: _seconds(f["queue_delay_s"]["mean"])),
)


def table(figures: list[Figures]) -> str:
    """The headline figures (:func:`~synapse_ha.sim.recovery.figures`), one line per
    policy."""
    lines = results_table(_COLUMNS, figures)
    lines.append(
        "ETTR: useful run time / wall time from first start to end, mean (and p50) per job; "
        "hit: jobs a failure hit; restart: failure until the gang runs at full size again"
    )
    lines.append(
        "elastic: gangs of min..max members, useful work at their size / max; every resize "
        "restarts a gang from its checkpoint (resize GPU-h: that cost, part of lost GPU-h)"
    )
    return "\n".join(lines)
