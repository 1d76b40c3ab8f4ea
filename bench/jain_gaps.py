"""Where Jain's index among backlogged queues falls short of 1, and which gangs hold it
there: the multi-tenant workload of ``bench/tenancy.py`` under topology-aware preemption,
one run per seed, through the real scheduler and ``apply``.

Jain's index is the one the tenancy benchmark reports (``synapse_ha.sim.fairness``): the
shares (GPUs held / nominal) of the queues with pending jobs, averaged over the time at
least two of them wait. Its shortfall, ``1 - index`` weighted by time, is split by what
the backlogged queues looked like at the instant:

* ``below_nominal_reclaimable``: a backlogged queue was below its nominal by at least its
  smallest pending gang, and the others of the cohort borrowed that many GPUs: a
  reclaim could have served it (it waited for victims to stop, or for the next pass);
* ``below_nominal_unreclaimable``: such a queue, but less borrowed than that gang needs,
  or not where it fits: it waits for running gangs to end;
* ``below_nominal_gang_too_big``: a backlogged queue below its nominal whose every
  pending gang is bigger than what is missing to its nominal (its shares stays below
  1 by design: a gang never takes a queue past nominal through reclaim);
* ``unequal_borrowing``: every backlogged queue held at least its nominal, some more
  than others. Quotas and reclaim are satisfied; only preempting borrowers above their
  nominal to level the shares (fair-sharing preemption) would raise the index.

Two further splits of the same shortfall: ``by_phase`` (while jobs still arrive, and
after the last arrival, when the queues drain what is left), and ``gang_too_big_by_cause``
for the ``below_nominal_gang_too_big`` instants: ``cohort_full`` (the cohort's unused
nominal GPUs are fewer than what the smallest such gang would borrow beyond its queue's
nominal: only preempting borrowers can serve it) or ``no_room`` (the quota would admit it:
it waits for a place, a whole rack for a whole-rack gang).

For each category, the gangs of queues above the backlogged queues' mean share that
held the most GPU-time while it applied (job id, queue, GPUs, topology, when bound), and
the queues below that mean the longest, each with its smallest pending gang and the GPUs
it misses to its nominal.
``series``: every 10 minutes, each queue's share, the backlogged queues and the index.

Prints JSON (``--out`` also writes it); ``--smoke`` runs a tiny version in seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synapse_ha.core.cluster_config import ClusterConfig, PreemptionMode
from synapse_ha.core.queues.quota import gang_request
from synapse_ha.sim.engine import GRACE_MS, AfterOkRun, Pacing, Run, build_cluster
from synapse_ha.sim.fairness import jain
from synapse_ha.sim.policies import Ours
from synapse_ha.sim.tenancy import PASS_INTERVAL_MS
from synapse_ha.sim.tenants import multi_tenant

# An instant's start, index, category, the gangs of queues above the mean share (job
# id, GPUs), the queues below it (name, smallest pending gang, GPUs to nominal), its
# phase and, for a gang too big, its cause.
_Open = tuple[int, float, str, list[tuple[str, int]], list[tuple[str, int, int]], str, str]
CATEGORIES = (
    "below_nominal_reclaimable",
    "below_nominal_unreclaimable",
    "below_nominal_gang_too_big",
    "unequal_borrowing",
)
PHASES = ("while_arriving", "after_the_last_arrival")
TOO_BIG_CAUSES = ("cohort_full", "no_room")
SERIES_EVERY_MS = 600_000
TOP_GANGS = 8


class DiagnosedRun(Run):
    """A simulation that also attributes each instant's Jain shortfall."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.shortfall: defaultdict[str, float] = defaultdict(float)  # category -> (1 - index) x ms
        self.time_in: Counter[str] = Counter()  # category -> ms
        self.index_area = 0.0
        self.index_ms = 0
        self.gang_excess: dict[str, Counter[str]] = defaultdict(Counter)  # category -> job
        self.gang_info: dict[str, dict[str, Any]] = {}
        # category -> (queue, its smallest pending gang, GPUs it misses to nominal) -> ms
        self.waiting: dict[str, Counter[tuple[str, int, int]]] = defaultdict(Counter)
        self.series: list[dict[str, Any]] = []
        self.by_phase: defaultdict[str, float] = defaultdict(float)  # phase -> (1 - index) x ms
        self.too_big: defaultdict[str, float] = defaultdict(float)  # cause -> (1 - index) x ms
        self.arrivals_end_ms = max((j.arrival_ms for j in self.workload.jobs), default=0)
        self._next_sample = 0
        self._open: _Open | None = None

    def _observe(self, pending_count: int) -> None:
        super()._observe(pending_count)
        now = self.now
        if self._open is not None:
            self._close(now)
        smallest: dict[str, int] = {}
        for job_id in self.pending:
            rec = self.records[job_id]
            if rec.queue in self.nominal and rec.gpus < smallest.get(rec.queue, rec.gpus + 1):
                smallest[rec.queue] = rec.gpus
        shares = {q: self.usage[q] / n for q, n in self.nominal.items()}
        if now >= self._next_sample:
            self._next_sample = now + SERIES_EVERY_MS
            index = jain([shares[q] for q in sorted(smallest)]) if len(smallest) >= 2 else None
            self.series.append(
                {
                    "h": round(now / 3_600_000, 3),
                    "jain": round(index, 3) if index is not None else None,
                    "shares": {q: round(s, 3) for q, s in sorted(shares.items())},
                    "backlogged": sorted(smallest),
                }
            )
        if len(smallest) < 2:
            self._open = None
            return
        index = jain([shares[q] for q in sorted(smallest)])
        if index is None:
            self._open = None
            return
        category = self._category(smallest, shares)
        held = {q: shares[q] for q in smallest}
        mean = statistics.fmean(held.values())
        over = {q for q, s in held.items() if s > mean}
        under = [
            (q, smallest[q], self.nominal[q] - self.usage[q])
            for q in sorted(held)
            if held[q] < mean
        ]
        gangs = []
        for job in self.state.live_jobs():
            attempt = job.live_attempt()
            if attempt is None or job.spec.queue not in over:
                continue
            gpus = gang_request(job.spec).gpu
            gangs.append((job.job_id, gpus))
            if job.job_id not in self.gang_info:
                self.gang_info[job.job_id] = {
                    "queue": job.spec.queue,
                    "gpus": gpus,
                    "topology": job.spec.topology_required or job.spec.topology_preferred,
                    "bound_h": round(attempt.bound_at_ms / 3_600_000, 3),
                    "priority_class": job.spec.priority_class,
                }
        phase = PHASES[0] if now < self.arrivals_end_ms else PHASES[1]
        cause = self._too_big_cause(smallest, shares) if category == CATEGORIES[2] else ""
        self._open = (now, index, category, gangs, under, phase, cause)

    def _category(self, smallest: dict[str, int], shares: dict[str, float]) -> str:
        below = [q for q in sorted(smallest) if shares[q] < 1.0]
        if not below:
            return "unequal_borrowing"
        starved = [q for q in below if self.usage[q] + smallest[q] <= self.nominal[q]]
        if not starved:
            return "below_nominal_gang_too_big"
        return (
            "below_nominal_reclaimable"
            if self._reclaimable(starved, smallest)
            else "below_nominal_unreclaimable"
        )

    def _too_big_cause(self, smallest: dict[str, int], shares: dict[str, float]) -> str:
        """Whether the cohort's unused nominal GPUs are fewer than what the smallest gang
        of every queue below its nominal would borrow (``cohort_full``), or not."""
        unused = sum(self.nominal.values()) - sum(self.usage[q] for q in self.nominal)
        beyond = [
            self.usage[q] + smallest[q] - self.nominal[q] for q in smallest if shares[q] < 1.0
        ]
        return TOO_BIG_CAUSES[0] if all(b > unused for b in beyond) else TOO_BIG_CAUSES[1]

    def _close(self, now: int) -> None:
        assert self._open is not None
        since, index, category, gangs, under, phase, cause = self._open
        dt = now - since
        self._open = None
        if dt <= 0:
            return
        self.index_area += index * dt
        self.index_ms += dt
        self.shortfall[category] += (1.0 - index) * dt
        self.time_in[category] += dt
        self.by_phase[phase] += (1.0 - index) * dt
        if cause:
            self.too_big[cause] += (1.0 - index) * dt
        excess = self.gang_excess[category]
        for job_id, gpus in gangs:
            excess[job_id] += gpus * dt
        for key in under:
            self.waiting[category][key] += dt

    def diagnosis(self) -> dict[str, Any]:
        """The figures, once the run is over (its last instant closed)."""
        if self._open is not None:
            self._close(self.last_t)
        total = sum(self.shortfall.values()) or 1.0
        index = self.index_area / self.index_ms if self.index_ms else None
        out: dict[str, Any] = {
            "jain_backlogged": round(index, 4) if index is not None else None,
            "hours_with_two_backlogged": round(self.index_ms / 3_600_000, 2),
            "by_phase": {p: round(self.by_phase[p] / total, 4) for p in PHASES},
            "gang_too_big_by_cause": {c: round(self.too_big[c] / total, 4) for c in TOO_BIG_CAUSES},
            "categories": {},
        }
        for cat in CATEGORIES:
            ms = self.time_in[cat]
            top = self.gang_excess[cat].most_common(TOP_GANGS)
            out["categories"][cat] = {
                "share_of_shortfall": round(self.shortfall[cat] / total, 4),
                "hours": round(ms / 3_600_000, 2),
                "mean_index": round(1 - self.shortfall[cat] / ms, 4) if ms else None,
                "index_without_it": _without(self, cat),
                "gangs_over_the_mean": [
                    {"job": job_id, "gpu_h_held": round(v / 3_600_000, 1)} | self.gang_info[job_id]
                    for job_id, v in top
                ],
                "queues_under_the_mean": [
                    {
                        "queue": queue,
                        "smallest_pending_gpus": gang,
                        "gpus_to_nominal": missing,
                        "hours": round(ms / 3_600_000, 2),
                    }
                    for (queue, gang, missing), ms in self.waiting[cat].most_common(TOP_GANGS)
                ],
            }
        return out


def _without(run: DiagnosedRun, cat: str) -> float | None:
    """The index were every instant of ``cat`` at 1 (what fixing it alone would give)."""
    if not run.index_ms:
        return None
    return round(1 - (sum(run.shortfall.values()) - run.shortfall[cat]) / run.index_ms, 4)


def diagnose(seed: int, hours: float, hosts: int) -> dict[str, Any]:
    workload = multi_tenant(seed=seed, hours=hours, hosts=hosts)
    config = ClusterConfig(retention_ms=0, preemption=PreemptionMode.TOPOLOGY)
    state = build_cluster(workload, config)
    run_type = AfterOkRun if any(j.after_ok for j in workload.jobs) else Run
    assert run_type is Run, "the multi-tenant workload has no dependencies"
    run = DiagnosedRun(workload, Ours(), state, Pacing(GRACE_MS, PASS_INTERVAL_MS))
    run.run()
    out = run.diagnosis()
    assert run.meter is not None
    out["jain_backlogged_tenancy_meter"] = run.meter.finish(run.last_t)["jain_backlogged"]
    out["seed"] = seed
    out["nominal_gpus"] = dict(sorted(run.nominal.items()))
    out["series"] = run.series
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--hours", type=float, default=12.0)
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--smoke", action="store_true", help="one seed, one hour, 16 hosts")
    args = parser.parse_args()
    if args.smoke:
        args.seeds, args.hours, args.hosts = 1, 1.0, 16
    runs = [diagnose(seed, args.hours, args.hosts) for seed in range(1, args.seeds + 1)]
    summary = {
        cat: round(statistics.fmean(r["categories"][cat]["share_of_shortfall"] for r in runs), 4)
        for cat in CATEGORIES
    }
    result = {
        "bench": "jain_gaps",
        "hours": args.hours,
        "hosts": args.hosts,
        "mean_share_of_shortfall": summary,
        "runs": runs,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
