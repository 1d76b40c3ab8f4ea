"""The figures of one simulated run, from its per-job records and running sums.

Metrics, per policy:

* ``gpu_allocation``: time-weighted share of GPUs bound to gangs, first arrival to last
  event.
* ``queue_delay_s``: arrival until bound; ``queue_delay_big_gangs_s`` the same for gangs
  of at least 64 GPUs, ``queue_delay_rack_fitting_gangs_s`` for the rack-fitting gangs
  below (those a locality wait may hold back). ``job_completion_s``: arrival until the job ended.
* Locality, for multi-member gangs: ``multi_node_in_one_rack``/``_block`` is the share of
  gangs spread over several hosts that stayed in one rack/block.
  ``rack_fitting_gangs_in_one_rack`` judges against rack *size*: of the gangs no larger
  than the largest rack, the share placed in one rack (a gang bound while every rack was
  partly busy counts as a miss). ``gangs_with_rack_room_at_bind_in_one_rack`` judges
  against *free* capacity: of the gangs bound while some rack had room for all their
  members (ignoring reservations), the share placed in one rack.
* ``fragmentation_gpus``: time-weighted free GPUs on nodes whose free GPUs are fewer than
  the smallest per-member GPU request among waiting jobs (counted while jobs wait).
* ``scheduler_cpu_ms_per_decision``: process CPU time inside the policy divided by the
  number of pending jobs it considered, summed over passes.

A workload with queues adds ``tenancy`` (see :mod:`synapse_ha.sim.fairness`).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from synapse_ha.core.model import ClusterState, JobState
from synapse_ha.core.reasons import render
from synapse_ha.sim.fairness import Loss, TenancyMeter, gpu_hours_lost, summary

BIG_GANG_GPUS = 64


@dataclass(slots=True)
class JobRecord:
    """What the simulation saw of one job: its size, when it waited, ran and ended, and
    where its last attempt was placed."""

    arrival_ms: int
    gpus: int
    members: int
    duration_ms: int
    start_ms: int | None = None
    end_ms: int | None = None
    racks: int = 0
    blocks: int = 0
    hosts: int = 0
    fits_one_rack: bool = False  # the gang is no larger than the largest rack
    rack_had_room: bool = False  # some rack had room for the whole gang when it was bound
    queue: str = ""
    topology: bool = False  # the spec names a required or preferred topology level
    starts: int = 0  # attempts bound (more than one when preempted and placed again)
    preempting_since_ms: int | None = None  # when it first made victims, as a preemptor
    preemptor_wait_ms: int | None = None  # first victims chosen until it was bound


@dataclass(slots=True)
class Tally:
    """Running sums of one simulation: time-weighted areas, the policy's cost, and what
    preemption did."""

    alloc_area: float = 0.0  # GPUs bound x ms
    frag_area: float = 0.0  # unusable free GPUs x ms, while jobs wait
    queue_area: float = 0.0  # pending jobs x ms
    cpu_in_policy: float = 0.0  # process CPU seconds inside the policy
    decisions: int = 0  # pending jobs considered, summed over passes
    passes: int = 0
    preempt_commands: int = 0
    preempt_rejected: int = 0
    victims_by_kind: Counter[str] = field(default_factory=Counter)
    losses: list[Loss] = field(default_factory=list)  # one per victim, when it stopped
    marks: int = 0  # checkpoint marks of attempts (each of all their members)


def run_metrics(
    state: ClusterState,
    records: dict[str, JobRecord],
    tally: Tally,
    total_gpus: int,
    end_ms: int,
    wall_s: float,
) -> dict[str, Any]:
    """The headline figures of a run that ended at ``end_ms`` (its last event)."""
    span = max(end_ms - min((r.arrival_ms for r in records.values()), default=0), 1)
    done = [r for r in records.values() if r.start_ms is not None]
    could_rack = [r for r in done if r.members > 1 and r.fits_one_rack]
    jct = [(r.end_ms - r.arrival_ms) / 1000 for r in done if r.end_ms is not None]
    multi = [r for r in done if r.members > 1 and r.hosts > 1]
    rack_had_room = [r for r in done if r.rack_had_room]
    return {
        "jobs": len(records),
        "jobs_started": len(done),
        "gpu_allocation": round(tally.alloc_area / (total_gpus * span), 4),
        "queue_delay_s": _summary(queue_delays(done)),
        "queue_delay_big_gangs_s": _summary(
            queue_delays(r for r in done if r.gpus >= BIG_GANG_GPUS)
        ),
        "queue_delay_rack_fitting_gangs_s": _summary(queue_delays(could_rack)),
        "job_completion_s": _summary(jct),
        "mean_queue_length": round(tally.queue_area / span, 2),
        "multi_node_gangs": len(multi),
        "multi_node_in_one_rack": _share(sum(1 for r in multi if r.racks == 1), len(multi)),
        "multi_node_in_one_block": _share(sum(1 for r in multi if r.blocks == 1), len(multi)),
        "rack_fitting_gangs": len(could_rack),
        "rack_fitting_gangs_in_one_rack": _share(
            sum(1 for r in could_rack if r.racks == 1), len(could_rack)
        ),
        "gangs_with_rack_room_at_bind": len(rack_had_room),
        "gangs_with_rack_room_at_bind_in_one_rack": _share(
            sum(1 for r in rack_had_room if r.racks == 1), len(rack_had_room)
        ),
        "fragmentation_gpus": round(tally.frag_area / span, 2),
        "scheduler_cpu_ms_per_decision": round(
            1000 * tally.cpu_in_policy / max(tally.decisions, 1), 4
        ),
        "scheduling_passes": tally.passes,
        "wall_s": round(wall_s, 2),
        "never_started": sorted(
            f"{j.job_id}: {render(j.reason)}"
            for j in state.jobs.values()
            if j.state is JobState.PENDING
        )[:5],
    }


def queue_delays(records: Iterable[JobRecord]) -> list[float]:
    """Seconds from arrival to first bind of each record that was bound, in order."""
    return [(r.start_ms - r.arrival_ms) / 1000 for r in records if r.start_ms is not None]


def tenancy_metrics(
    meter: TenancyMeter, end_ms: int, records: dict[str, JobRecord], tally: Tally
) -> dict[str, Any]:
    """Multi-tenancy figures (see :mod:`synapse_ha.sim.fairness`)."""
    out = meter.finish(end_ms)
    delays: dict[str, list[float]] = {}
    for r in records.values():
        if r.start_ms is not None:
            delays.setdefault(r.queue, []).append((r.start_ms - r.arrival_ms) / 1000)
    preemptors = [r for r in records.values() if r.preempting_since_ms is not None]
    placed = [r for r in preemptors if r.preemptor_wait_ms is not None]
    with_topology = [r for r in placed if r.topology and r.members > 1 and r.fits_one_rack]
    victims_by_kind = tally.victims_by_kind
    out.update(
        {
            "preemptions": sum(victims_by_kind.values()),
            "preemptions_by_kind": dict(sorted(victims_by_kind.items())),
            "preempt_commands": tally.preempt_commands,
            "preempt_commands_rejected": tally.preempt_rejected,
            "requeued_jobs": sum(1 for r in records.values() if r.starts > 1),
            "gpu_hours_lost": round(gpu_hours_lost(tally.losses), 3),
            "gpu_hours_lost_per_preemptor_placed": (
                round(gpu_hours_lost(tally.losses) / len(placed), 3) if placed else None
            ),
            "gpu_hours_lost_without_marks": round(
                sum(loss.gpu_hours_since_bind for loss in tally.losses), 3
            ),
            "victims_stopped": len(tally.losses),
            "victims_stopped_with_a_mark": sum(
                1 for loss in tally.losses if loss.ran_ms is not None and loss.lost_ms < loss.ran_ms
            ),
            "checkpoint_marks": tally.marks,
            "preemptors": len(preemptors),
            "preemptors_placed": len(placed),
            "preemptor_wait_s": summary(
                [r.preemptor_wait_ms / 1000 for r in placed if r.preemptor_wait_ms is not None]
            ),
            "preemptors_with_topology": len(with_topology),
            "preemptors_with_topology_in_one_rack": _share(
                sum(1 for r in with_topology if r.racks == 1), len(with_topology)
            ),
            "queue_delay_by_queue_s": {q: summary(d) for q, d in sorted(delays.items())},
        }
    )
    return out


def _pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def _summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0, "mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}
    return {
        "n": len(values),
        "mean": round(statistics.fmean(values), 1),
        "p50": round(_pct(values, 0.50), 1),
        "p95": round(_pct(values, 0.95), 1),
        "p99": round(_pct(values, 0.99), 1),
        "max": round(max(values), 1),
    }


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None
