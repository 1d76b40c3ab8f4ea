"""The failure policies' figures (:mod:`synapse_ha.sim.recovery`): what each job's
effective training time ratio was, the work that counted and the work lost by cause, the
restart delays, replacements, elastic gangs' resizes and the spares' idle time, from one
run or merged over seeds (:class:`Outcome`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from synapse_ha.sim.metrics import BIG_GANG_GPUS, _pct

MS_PER_HOUR = 3_600_000


@dataclass(slots=True)
class LossTally:
    """GPU x ms held by gangs that did not count, by cause."""

    work: int = 0  # run since the last checkpoint, thrown away by a failure
    overhead: int = 0  # restart overhead after a failure
    waiting: int = 0  # survivors' GPUs while their lost rank waited to be placed again
    abandoned: int = 0  # checkpointed work of jobs a failure ended for good
    # Of work and overhead: what elastic gangs' resizes cost (not a failure); not in total.
    resizing: int = 0

    @property
    def total(self) -> int:
        return self.work + self.overhead + self.waiting + self.abandoned


@dataclass(slots=True)
class Outcome:
    """What one or more runs of a policy measured, merged over seeds by :meth:`add`.

    ``jobs``: per job that ran, (GPUs, whether a failure hit it, its useful run time,
    its wall time from its first start to its end), in ms; ``delays_s``: restart delays."""

    policy: str
    jobs: list[tuple[int, bool, int, int]] = field(default_factory=list)
    delays_s: list[float] = field(default_factory=list)
    waits_s: list[float] = field(default_factory=list)  # each job's submission to first bind
    lost: LossTally = field(default_factory=LossTally)
    failures: int = 0
    held_gpu_ms: int = 0
    jobs_failed: int = 0
    replaced: int = 0  # ranks placed again
    replaced_on_spares: int = 0
    replace_timeouts: int = 0  # gangs requeued whole: a lost rank not placed in time
    spare_gpu_ms: int = 0  # GPUs of the nodes kept as spares x time
    grown: int = 0  # elastic gangs' growths
    shrunk: int = 0  # elastic gangs' shrinks
    members_added: int = 0
    members_given_back: int = 0
    started_small: int = 0  # binds of an elastic gang with fewer members than its max
    runs: int = 0

    def add(self, other: Outcome) -> None:
        """Merge ``other`` (the same policy, another seed) into this one."""
        self.jobs += other.jobs
        self.delays_s += other.delays_s
        self.waits_s += other.waits_s
        for name in ("work", "overhead", "waiting", "abandoned", "resizing"):
            setattr(self.lost, name, getattr(self.lost, name) + getattr(other.lost, name))
        self.failures += other.failures
        self.held_gpu_ms += other.held_gpu_ms
        self.jobs_failed += other.jobs_failed
        self.replaced += other.replaced
        self.replaced_on_spares += other.replaced_on_spares
        self.replace_timeouts += other.replace_timeouts
        self.spare_gpu_ms += other.spare_gpu_ms
        self.grown += other.grown
        self.shrunk += other.shrunk
        self.members_added += other.members_added
        self.members_given_back += other.members_given_back
        self.started_small += other.started_small
        self.runs += other.runs


def figures(o: Outcome) -> dict[str, Any]:
    """The figures of an outcome, JSON-ready.

    * ``ettr``: effective training time ratio of each job that ran, its useful run time
      over its wall time from its first start to its end; n, mean, p50 and min over
      gangs of :data:`BIG_GANG_GPUS`+ GPUs (``gangs_64_plus``), over every job
      (``all``) and over the jobs a failure hit (``hit``), and weighted by GPUs x wall
      time (``gpu_weighted``).
    * ``goodput_gpu_hours``: GPUs x run time of the jobs that succeeded;
      ``gpu_hours_held``: GPUs x time held by every job; ``goodput_share_of_held``.
    * ``gpu_hours_lost``: held, not counted (held less goodput), by cause (``..._work``
      since the last checkpoint, ``..._restart_overhead``,
      ``..._waiting_for_replacement``, ``..._checkpointed_in_failed_jobs``: the work
      kept by jobs a failure then ended for good, ``max_requeues`` reached).
    * ``restart_delay_s``: from a failure ending or interrupting a gang until it runs
      again at full size (its next bind, or its lost rank placed again), n, mean, p50,
      p99 and max; the restart overhead comes after it. ``queue_delay_s``: each job's
      submission to its first bind (what spares cost the jobs that may not use them).
    * ``ranks_replaced`` (``..._on_spares``: onto a node that was a spare),
      ``replace_timeouts``: gangs requeued whole because a lost rank was not placed
      again within the timeout; ``spares_idle_gpu_hours``: GPUs of the nodes kept as
      spares x time (the price of spares: nothing else may run there).
    * ``elastic``: elastic gangs' binds with fewer members than their max
      (``starts_below_max``), their growths and shrinks, the members they added and gave
      back; ``gpu_hours_lost_to_resizes``: of the work and overhead lost, what those
      resizes cost (each restarts the gang from its checkpoint), not a failure.
    """
    ratios = [(g, hit, min(u / w, 1.0) if w > 0 else 1.0) for g, hit, u, w in o.jobs]
    wall_area = sum(g * w for g, _, _, w in o.jobs)
    goodput = sum(g * u for g, _, u, _ in o.jobs)
    lost = o.lost
    return {
        "policy": o.policy,
        "runs": o.runs,
        "gpu_failures": o.failures,
        "gangs_hit": sum(1 for _, hit, _ in ratios if hit),
        "ettr": {
            "gangs_64_plus": _ratios([r for g, _, r in ratios if g >= BIG_GANG_GPUS]),
            "all": _ratios([r for _, _, r in ratios]),
            "hit": _ratios([r for _, hit, r in ratios if hit]),
            "gpu_weighted": round(goodput / wall_area, 5) if wall_area else None,
        },
        "goodput_gpu_hours": _hours(goodput),
        "gpu_hours_held": _hours(o.held_gpu_ms),
        "goodput_share_of_held": (round(goodput / o.held_gpu_ms, 5) if o.held_gpu_ms else None),
        "gpu_hours_lost": _hours(lost.total),
        "gpu_hours_lost_work": _hours(lost.work),
        "gpu_hours_lost_restart_overhead": _hours(lost.overhead),
        "gpu_hours_lost_waiting_for_replacement": _hours(lost.waiting),
        "gpu_hours_lost_checkpointed_in_failed_jobs": _hours(lost.abandoned),
        "restart_delay_s": _delays(o.delays_s),
        "queue_delay_s": _delays(o.waits_s),
        "ranks_replaced": o.replaced,
        "ranks_replaced_on_spares": o.replaced_on_spares,
        "replace_timeouts": o.replace_timeouts,
        "spares_idle_gpu_hours": _hours(o.spare_gpu_ms),
        "elastic": {
            "starts_below_max": o.started_small,
            "grows": o.grown,
            "shrinks": o.shrunk,
            "members_added": o.members_added,
            "members_given_back": o.members_given_back,
        },
        "gpu_hours_lost_to_resizes": _hours(lost.resizing),
        "jobs_failed_by_faults": o.jobs_failed,
    }


def _hours(gpu_ms: float) -> float:
    return round(gpu_ms / MS_PER_HOUR, 3)


def _ratios(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "mean": None, "p50": None, "min": None}
    return {
        "n": len(values),
        "mean": round(sum(values) / len(values), 5),
        "p50": round(_pct(values, 0.5), 5),
        "min": round(min(values), 5),
    }


def _delays(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "mean": None, "p50": None, "p99": None, "max": None}
    return {
        "n": len(values),
        "mean": round(sum(values) / len(values), 1),
        "p50": round(_pct(values, 0.5), 1),
        "p99": round(_pct(values, 0.99), 1),
        "max": round(max(values), 1),
    }
