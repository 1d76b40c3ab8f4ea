"""The scheduler's quality report: workloads run under every policy side by side, the
headline figures of each run in one table, spread over seeds, and the delay CDFs.

A workload without queues runs under the simulator's policies (``ours``, ``naive``,
``fifo-first-fit``), planning at every instant something happens. A workload with queues
runs ours under each preemption mode (``ours/off``, ``ours/blind``, ``ours/topology``),
with fair-sharing preemption on (``ours/fair``), and the two baselines, which know
nothing of quotas, every pass 0.5 s apart as the leader plans. Every figure is the
simulator's own (:mod:`synapse_ha.sim.metrics`, :mod:`synapse_ha.sim.fairness`); this
module only picks, gathers and lays them out.

Victims save on notice (``Workload.save_on_notice_ms``, :mod:`synapse_ha.sim.marks`) in a
workload whose jobs mark checkpoints: a victim marks a checkpoint
:data:`SAVE_ON_NOTICE_MS` after its notice and exits (:func:`saving_on_notice`).

The Alibaba openb v2023 trace runs as the simulator converts it
(:func:`synapse_ha.sim.trace.openb_to_trace`: a pod is a one-member job, its queue its
QoS class) on a sample of the trace's own GPU nodes (:func:`openb_sample`): its pods ask
for up to 120 CPUs, more than the simulator's synthetic hosts have.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.model import NodeInfo
from synapse_ha.sim.engine import Result, simulate
from synapse_ha.sim.policies import POLICIES
from synapse_ha.sim.tenancy import PASS_INTERVAL_MS, run_modes
from synapse_ha.sim.tenants import from_trace
from synapse_ha.sim.trace import TraceJob, load_trace, openb_to_trace
from synapse_ha.sim.workload import Workload, load_openb, synthetic_cluster

BASELINES = ("naive", "fifo-first-fit")
# A job bound within this many seconds of its arrival was bound at once.
AT_ONCE_S = 1.0
# A victim's save after its notice: drawn uniformly between these, ms.
SAVE_ON_NOTICE_MS = (5_000, 20_000)
# Delay quantiles of the CDF reported per policy (the delays of every seed pooled).
CDF_POINTS = (0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 0.99)


def _path(*keys: str) -> Callable[[dict[str, Any]], Any]:
    """A reader of ``metrics[keys[0]][keys[1]]...``; None where a key is missing."""

    def read(metrics: dict[str, Any]) -> Any:
        value: Any = metrics
        for key in keys:
            if not isinstance(value, dict) or key not in value:
                return None
            value = value[key]
        return value

    return read


def _big_gang_max(metrics: dict[str, Any]) -> float | None:
    """The longest wait of a gang of 64 GPUs or more; None when the run had none."""
    big = metrics["queue_delay_big_gangs_s"]
    return big["max"] if big["n"] else None


# The figures of the table: name -> how it is read from a run's metrics. The tenancy
# figures are None for a workload without queues.
FIGURES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "delay_mean_s": _path("queue_delay_s", "mean"),
    "delay_p50_s": _path("queue_delay_s", "p50"),
    "delay_p95_s": _path("queue_delay_s", "p95"),
    "big_gang_max_delay_s": _big_gang_max,
    "jain_backlogged": _path("tenancy", "jain_backlogged"),
    "gpu_hours_lost": _path("tenancy", "gpu_hours_lost"),
    "gpu_hours_lost_per_preemptor_placed": _path("tenancy", "gpu_hours_lost_per_preemptor_placed"),
    "quota_back_p95_s": _path("tenancy", "quota_back_s", "p95"),
    "preemptors_with_topology_in_one_rack": _path(
        "tenancy", "preemptors_with_topology_in_one_rack"
    ),
    "gpu_allocation": _path("gpu_allocation"),
}


def saving_on_notice(
    workload: Workload, bounds: tuple[int, int] | None = SAVE_ON_NOTICE_MS
) -> Workload:
    """``workload`` with its victims saving on notice within ``bounds`` when some of its
    jobs mark checkpoints (None: never); as it is otherwise."""
    if not any(j.checkpoint_ms for j in workload.jobs):
        return workload
    return dataclasses.replace(workload, save_on_notice_ms=bounds)


def run_policies(workload: Workload, config: ClusterConfig | None = None) -> list[Result]:
    """``workload`` under every policy (see the module docstring); each result's policy
    is the row's name."""
    base = config or ClusterConfig(retention_ms=0)
    if not workload.queues:
        return [simulate(workload, POLICIES[name](), config=base) for name in POLICIES]
    results = run_modes(workload, config=base, pass_interval_ms=PASS_INTERVAL_MS, fair=True)
    for result in results:
        result.policy = f"ours/{result.policy}"
    for name in BASELINES:
        results.append(
            simulate(workload, POLICIES[name](), config=base, pass_interval_ms=PASS_INTERVAL_MS)
        )
    return results


def figures(result: Result) -> dict[str, Any]:
    """The table's figures of one run, and the share of its jobs bound at once (within
    :data:`AT_ONCE_S` of their arrival: at the next pass)."""
    out = {name: read(result.metrics) for name, read in FIGURES.items()}
    delays = result.delays_s
    at_once = sum(1 for d in delays if d <= AT_ONCE_S)
    out["bound_at_once"] = at_once / len(delays) if delays else None
    return out


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Mean, minimum and maximum of ``values`` over the seeds that had one, with ``n``
    those seeds (all None for none)."""
    if not values:
        return {"n": 0, "mean": None, "min": None, "max": None}
    return {
        "n": len(values),
        "mean": round(statistics.fmean(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


def delay_cdf(delays_s: Sequence[float]) -> dict[str, Any]:
    """The queueing delays' CDF: the share bound at once (no wait), the quantiles of
    :data:`CDF_POINTS` (nearest rank) and the maximum, seconds."""
    if not delays_s:
        return {"n": 0}
    ordered = sorted(delays_s)
    out: dict[str, Any] = {
        "n": len(ordered),
        "no_wait": round(sum(1 for d in ordered if d == 0) / len(ordered), 4),
    }
    for p in CDF_POINTS:
        rank = max(math.ceil(p * len(ordered)) - 1, 0)
        out[f"p{round(p * 100)}"] = round(ordered[rank], 1)
    out["max"] = round(ordered[-1], 1)
    return out


def summarise(per_seed: Sequence[Sequence[Result]]) -> dict[str, Any]:
    """Per policy, in the order run: each figure's spread over the seeds, each seed's
    figures, and the delay CDF of every seed's jobs pooled."""
    names = [r.policy for r in per_seed[0]]
    out: dict[str, Any] = {}
    for name in names:
        runs = [r for results in per_seed for r in results if r.policy == name]
        rows = [figures(r) for r in runs]
        out[name] = {
            "figures": {
                figure: spread([row[figure] for row in rows if row[figure] is not None])
                for figure in rows[0]
            },
            "per_seed": rows,
            "delay_cdf_s": delay_cdf([d for r in runs for d in r.delays_s]),
        }
    return out


# The Markdown table's columns: header, figure, how a value is shown.
_COLUMNS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("delay mean (s)", "delay_mean_s", lambda v: f"{v:,.0f}"),
    ("p50 (s)", "delay_p50_s", lambda v: f"{v:,.0f}"),
    ("p95 (s)", "delay_p95_s", lambda v: f"{v:,.0f}"),
    ("big-gang max (s)", "big_gang_max_delay_s", lambda v: f"{v:,.0f}"),
    ("Jain", "jain_backlogged", lambda v: f"{v:.3f}"),
    ("GPU-h lost", "gpu_hours_lost", lambda v: f"{v:,.1f}"),
    ("lost/placed", "gpu_hours_lost_per_preemptor_placed", lambda v: f"{v:,.2f}"),
    ("quota back p95 (s)", "quota_back_p95_s", lambda v: f"{v:,.0f}"),
    ("preemptors in 1 rack", "preemptors_with_topology_in_one_rack", lambda v: f"{v:.0%}"),
    ("alloc", "gpu_allocation", lambda v: f"{v:.1%}"),
)


def _cell(spread_: dict[str, Any], shown: Callable[[float], str]) -> str:
    """A figure's mean, with its range over the seeds when they differ."""
    if spread_["mean"] is None:
        return "-"
    if spread_["n"] == 1 or spread_["min"] == spread_["max"]:
        return shown(spread_["mean"])
    return f"{shown(spread_['mean'])} ({shown(spread_['min'])}-{shown(spread_['max'])})"


def markdown(workloads: dict[str, dict[str, Any]]) -> str:
    """One Markdown table: a row per workload and policy (mean over the seeds, the range
    in brackets), then each workload's notes."""
    header = ("workload", "policy", *(c[0] for c in _COLUMNS))
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, part in workloads.items():
        for policy, summary in part["policies"].items():
            cells = [_cell(summary["figures"][f], shown) for _, f, shown in _COLUMNS]
            lines.append("| " + " | ".join((name, policy, *cells)) + " |")
    lines.append("")
    for name, part in workloads.items():
        lines.append(f"- {name} ({part['seeds']}): {part['workload']}")
    return "\n".join(lines) + "\n"


def openb_sample(folder: Path, every: int) -> tuple[NodeInfo, ...]:
    """A sample of the openb GPU nodes keeping the trace's mix: of each node shape (CPU,
    memory, GPUs, GPU model), in the node list's order, the first and then one node in
    ``every`` (so every shape, the largest included, is in the sample)."""
    if every < 1:
        raise ValueError(f"every: at least 1, got {every}")
    shapes: dict[tuple[int, int, int, str], list[NodeInfo]] = {}
    for node in load_openb(folder, limit=0).nodes:
        cap = node.capacity
        shapes.setdefault((cap.cpu_milli, cap.memory_mib, cap.gpu, node.gpu_model), []).append(node)
    return tuple(n for shape in sorted(shapes) for n in shapes[shape][::every])


def openb_workload(
    folder: Path,
    every: int,
    speedup: float = 1.0,
    limit: int | None = None,
    checkpoint_s: float | None = None,
) -> Workload:
    """The openb pods (the first ``limit``) converted to trace jobs, arriving ``speedup``
    times faster than in the trace, on :func:`openb_sample` of its nodes; every QoS class
    a queue with an equal share of the sample's GPUs. With ``checkpoint_s``, every pod
    marks a checkpoint that often (the trace has none)."""
    nodes = openb_sample(folder, every)
    jobs = _checkpointing(_faster(openb_to_trace(folder, limit=limit), speedup), checkpoint_s)
    workload = from_trace(jobs, nodes, name="openb")
    marks = f"; checkpoints every {checkpoint_s:g} s" if checkpoint_s else "; no checkpoints"
    notes = (
        f"{workload.notes} (one in {every} of each node shape of the trace's, "
        f"{workload.total_gpus} GPUs); pods sharing a GPU get a whole one; "
        f"arrivals {speedup:g}x the trace's pace{marks}"
    )
    return dataclasses.replace(workload, notes=notes)


def trace_file_workload(
    path: Path, hosts: int, speedup: float = 1.0, checkpoint_s: float | None = None
) -> Workload:
    """A trace file in the simulator's format on ``hosts`` 8-GPU hosts (8 to a rack, 4
    racks to a block), as ``synapse-sim --workload trace`` runs it; with ``checkpoint_s``,
    every job without a ``checkpoint_s`` of its own marks a checkpoint that often."""
    jobs = _checkpointing(_faster(load_trace(path), speedup), checkpoint_s)
    return from_trace(jobs, synthetic_cluster(hosts), name=path.name)


def _checkpointing(jobs: list[TraceJob], checkpoint_s: float | None) -> list[TraceJob]:
    """``jobs`` with those without a checkpoint interval marking every ``checkpoint_s``
    seconds of run time (None: as they are); at least 1 s."""
    if checkpoint_s is None:
        return jobs
    if not 1 <= checkpoint_s < math.inf:
        raise ValueError(f"checkpoint interval: at least 1 second, got {checkpoint_s}")
    every = round(checkpoint_s * 1000)
    return [j if j.checkpoint_ms else dataclasses.replace(j, checkpoint_ms=every) for j in jobs]


def _faster(jobs: list[TraceJob], speedup: float) -> list[TraceJob]:
    """``jobs`` with every submission time divided by ``speedup`` (run times kept)."""
    if not 0 < speedup < math.inf:
        raise ValueError(f"speedup: a number above 0, got {speedup}")
    if speedup == 1:
        return jobs
    return [dataclasses.replace(j, submit_ms=round(j.submit_ms / speedup)) for j in jobs]
