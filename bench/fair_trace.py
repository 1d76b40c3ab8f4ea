"""What fair-sharing preemption does on a trace, preemption by preemption, against
topology-aware preemption alone: the Alibaba openb v2023 trace (as ``bench/quality.py``
runs it, ``synapse_ha.sim.quality.openb_workload``) under ``topology`` and ``fair``
(topology with ``fair_sharing_preemption`` on in the cohort), and ``off`` for the delays,
through the real scheduler and ``apply``, a pass every 0.5 s.

Per policy, for every preemption ``apply`` accepted: its kind, the preemptor's queue and
GPUs, each victim's queue, GPUs and run time since its bind, and the two queues' shares
before and after (as the fair-sharing rule counts them, decayed usage included, and by
what they hold now alone, GPUs over nominal). Summed up: preemptions and victims by kind
and by (victim queue, preemptor queue), the victims' run time at their notice, GPU-hours
lost, victims preempted more than once (thrash), preemptors placed, how often a victim's
queue ends below the preemptor's by what they hold, how many preemptors' quota admitted
them already (they waited for room, not quota), each queue's delay by gang size, and
its pending job-hours by reason (the code a pending gang gives, its first wait apart
from its waits after a preemption): who waits behind the preemptions, and why.
Per policy, too, the pass's reservation for its first gang that cannot be placed (and how
many reservations the passes kept in all, with the GPUs of every gang that held one): how
many passes held one and with a start (``untimed``: no start, the gangs it waits for
have no estimated end), how often it moved (the same gang reserved other nodes than at
the pass before), and what the pass placed on its nodes and why it could (backfill: its
estimate ends before the start; a preemptor taking what its victims freed; others:
gangs ahead of it in the pass's order), and the victims preempted from them.

``--reservations K`` keeps a reservation for each of the first K gangs of a pass that
cannot be placed (``ClusterConfig.reservations_per_pass``; the record above is then of the
first); ``--limit`` keeps only the first pods of the trace; ``--format N`` runs on a cluster
that reads format N (default: this release's newest), to compare a format's rules with
the one before; ``--estimates`` gives the trace's queues run-time estimates
(``bench/quality.py --trace-estimates``: none, learned, learned:S, default:S).

Prints JSON (``--out`` also writes it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import ClusterConfig, PreemptionMode
from synapse_ha.core.commands import BindPlan
from synapse_ha.core.model import ZERO as ZERO_RESOURCES
from synapse_ha.core.model import ClusterState, Resources
from synapse_ha.core.queues.estimates import Estimates
from synapse_ha.core.queues.fair_preemption import FairShares
from synapse_ha.core.queues.fairshare import SHARE_SCALE
from synapse_ha.core.queues.quota import QueueUsage, gang_request, held_request
from synapse_ha.core.scheduler import schedule
from synapse_ha.core.scheduler.plan import Plan
from synapse_ha.core.scheduler.reservation import may_backfill
from synapse_ha.sim.engine import GRACE_MS, Pacing, Run, build_cluster
from synapse_ha.sim.estimates import (
    keeping_history,
    parse_estimates,
    with_estimates,
    with_reservations,
)
from synapse_ha.sim.policies import Ours
from synapse_ha.sim.quality import SAVE_ON_NOTICE_MS, openb_workload, saving_on_notice
from synapse_ha.sim.tenancy import FAIR, PASS_INTERVAL_MS, with_fair_sharing
from synapse_ha.sim.workload import Workload

OPENB = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "alibaba-openb-v2023"
POLICIES = ("off", "topology", FAIR)


class Watching(Ours):
    """Ours, keeping what each pass did with its reservation's nodes."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.last: tuple[str, frozenset[str]] | None = None  # the holder and its nodes
        self.holders: dict[str, int] = {}  # holder -> GPUs it asks for
        self.moved_by_holder: Counter[str] = Counter()
        self.all_holders: dict[str, int] = {}  # holder of any reservation -> GPUs

    def plan(self, state: ClusterState, now_ms: int) -> BindPlan | None:
        result = schedule(state, now_ms, cache=self.cache)
        self.wake_ms = result.wake_ms
        self.preempts = tuple(result.preempt_commands(now_ms))
        self.shrinks = tuple(result.shrink_commands())
        self._watch(state, now_ms, result)
        return result.command(now_ms)

    def _watch(self, state: ClusterState, now_ms: int, plan: Plan) -> None:
        made, counts = plan.reservation, self.counts
        counts["reservations"] += len(plan.reservations)
        for other in plan.reservations:
            self.all_holders[other.job_id] = gang_request(state.jobs[other.job_id].spec).gpu
        if made is None:
            self.last = None
            return
        counts["passes_with_a_reservation"] += 1
        counts["untimed" if made.start_ms is None else "timed"] += 1
        holder = state.jobs[made.job_id]
        self.holders[made.job_id] = gang_request(holder.spec).gpu
        if self.last is not None and self.last[0] == made.job_id and self.last[1] != made.nodes:
            counts["moved"] += 1
            self.moved_by_holder[made.job_id] += 1
        self.last = (made.job_id, made.nodes)
        estimates = Estimates(state)
        preemptors = {
            v.attempt.preempted_by
            for v in state.jobs.values()
            if v.attempt is not None and v.attempt.preempted_by
        }
        for placement in plan.placements:
            if not any(m.node_id in made.nodes for m in placement.members):
                continue
            job = state.jobs[placement.job_id]
            if placement.job_id in preemptors:
                why = "preemptor"
            elif may_backfill(estimates, job, made, now_ms):
                why = "backfill"
            else:
                why = "ahead_in_order"
            counts[f"placed_on_reserved_nodes: {why}"] += 1
        for p in plan.preemptions:
            for v in p.victims:
                attempt = state.jobs[v.job_id].attempt
                if attempt is not None and any(m.node_id in made.nodes for m in attempt.members):
                    counts[f"victims_on_reserved_nodes: {p.kind}"] += 1

    def summary(self) -> dict[str, Any]:
        moved = self.moved_by_holder
        return {
            **dict(sorted(self.counts.items())),
            "holders": len(self.holders),
            "holders_by_gpus": dict(sorted(Counter(self.holders.values()).items())),
            "holders_of_any_reservation_by_gpus": dict(
                sorted(Counter(self.all_holders.values()).items())
            ),
            "holders_that_moved": len(moved),
            "most_moves_of_one_holder": max(moved.values(), default=0),
        }


class TracedRun(Run):
    """A simulation that records every accepted preemption with the shares around it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.preemptions: list[dict[str, Any]] = []
        self.times_preempted: Counter[str] = Counter()
        self.history: defaultdict[str, list[tuple[float, str, str, float]]] = defaultdict(list)
        # (queue, first wait or after a preemption, reason code) -> pending job-seconds
        self.waits: Counter[tuple[str, str, str]] = Counter()

    def _advance(self, now: int, pending_count: int) -> None:
        dt = (now - self.last_t) / 1000
        if dt > 0:
            for job_id in self.pending:
                job = self.state.jobs[job_id]
                again = "requeued" if job.attempts_made else "first"
                size = f"{gang_request(job.spec).gpu}gpu"
                self.waits[(f"{job.spec.queue} {size}", again, str(job.reason.code))] += dt
        super()._advance(now, pending_count)

    def _preempt(self, preempt: c.Preempt) -> None:
        state, now = self.state, self.now
        preemptor = state.jobs.get(preempt.preemptor)
        victims = [state.jobs[v.job_id] for v in preempt.victims if v.job_id in state.jobs]
        before = self._shares(preempt.preemptor, [])
        quota_free = self._fits_quota_now(preempt.preemptor)
        taken = [
            (
                j.spec.queue,
                held_request(j, j.attempt, counting_leaving=False) if j.attempt else ZERO_RESOURCES,
            )
            for j in victims
        ]
        after = self._shares(preempt.preemptor, taken)
        ran = [now - j.attempt.bound_at_ms if j.attempt else 0 for j in victims]
        rejected = self.tally.preempt_rejected
        super()._preempt(preempt)
        if self.tally.preempt_rejected != rejected or preemptor is None:
            return
        for j, t in zip(victims, ran, strict=True):
            self.times_preempted[j.job_id] += 1
            self.history[j.job_id].append(
                (now / 1000, str(preempt.kind), preemptor.spec.queue, t / 1000)
            )
        self.preemptions.append(
            {
                "at_s": now / 1000,
                "kind": str(preempt.kind),
                "preemptor": preempt.preemptor,
                "preemptor_queue": preemptor.spec.queue,
                "preemptor_gpus": gang_request(preemptor.spec).gpu,
                "preemptor_fit_its_quota_before": quota_free,
                "victims": [
                    {"job": j.job_id, "queue": j.spec.queue, "gpus": r.gpu, "ran_s": t / 1000}
                    for j, (_, r), t in zip(victims, taken, ran, strict=True)
                ],
                "shares_before": before,
                "shares_after": after,
            }
        )

    def _fits_quota_now(self, preemptor_id: str) -> bool:
        """Whether the preemptor's queue admitted the gang, borrowing included, before any
        victim stopped (the gang waited for room, not for quota)."""
        job = self.state.jobs[preemptor_id]
        keeps = QueueUsage.kept_after_reclaims(self.state, besides=preemptor_id)
        return keeps.shortfall(job.spec.queue, gang_request(job.spec)) is None

    def _shares(self, preemptor_id: str, taken: list[tuple[str, Resources]]) -> dict[str, Any]:
        """Each queue's share as the fair-sharing rule counts it (decayed usage and what it
        keeps) and by what it keeps alone, with ``taken`` stopped and the preemptor
        placed (none taken: as it stands)."""
        state = self.state
        job = state.jobs[preemptor_id]
        keeps = QueueUsage.kept_after_reclaims(state, besides=preemptor_id)
        fair = FairShares(state, keeps, self.now, job.spec.queue, gang_request(job.spec))
        delta: dict[str, Resources] = {}
        for queue, held in taken:
            delta[queue] = delta.get(queue, ZERO_RESOURCES) - held
        if taken:
            delta[job.spec.queue] = delta.get(job.spec.queue, ZERO_RESOURCES) + fair.request
        out: dict[str, Any] = {}
        for name, queue in sorted(state.queues.items()):
            if not queue.gpu:
                continue
            held = keeps.used(name).gpu + delta.get(name, ZERO_RESOURCES).gpu
            out[name] = {
                "rule": round(fair.branch_share(name, delta) / SHARE_SCALE, 3),
                "held": round(held / queue.gpu, 3),
            }
        return out


def _quantiles(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {
        "n": len(values),
        "mean": round(statistics.fmean(values), 1),
        "p50": round(ordered[len(ordered) // 2], 1),
        "p90": round(ordered[int(len(ordered) * 0.9)], 1),
        "max": round(ordered[-1], 1),
    }


def breakdown(run: TracedRun, result_metrics: dict[str, Any]) -> dict[str, Any]:
    """The summary of one traced run."""
    by_kind: Counter[str] = Counter()
    quota_free: Counter[str] = Counter()
    pairs: Counter[str] = Counter()
    ran: defaultdict[str, list[float]] = defaultdict(list)
    lost_h: Counter[str] = Counter()
    below_by_held = below_by_rule = fair_victims = 0
    for p in run.preemptions:
        by_kind[p["kind"]] += 1
        quota_free[p["kind"]] += p["preemptor_fit_its_quota_before"]
        for v in p["victims"]:
            pairs[f"{p['kind']}: {v['queue']} for {p['preemptor_queue']}"] += 1
            ran[p["kind"]].append(v["ran_s"])
            lost_h[p["kind"]] += v["gpus"] * v["ran_s"] / 3600
            if p["kind"] != "fair_share":
                continue
            fair_victims += 1
            after, ours = p["shares_after"], p["preemptor_queue"]
            below_by_held += after[v["queue"]]["held"] < after[ours]["held"]
            below_by_rule += after[v["queue"]]["rule"] < after[ours]["rule"]
    records = run.records
    placed = Counter(
        p["kind"]
        for p in run.preemptions
        if records[p["preemptor"]].preemptor_wait_ms is not None
        and records[p["preemptor"]].preempting_since_ms is not None
    )
    delays: defaultdict[str, list[float]] = defaultdict(list)
    for rec in records.values():
        if rec.start_ms is not None:
            delays[f"{rec.queue} {rec.gpus}gpu"].append((rec.start_ms - rec.arrival_ms) / 1000)
    again = [n for n in run.times_preempted.values() if n > 1]
    waits = {
        f"{q} {a}: {r}": round(t / 3600, 1)
        for (q, a, r), t in sorted(run.waits.items(), key=lambda kv: -kv[1])
        if t >= 3600
    }
    tenancy = result_metrics.get("tenancy", {})
    policy = run.policy
    return {
        "reservation": policy.summary() if isinstance(policy, Watching) else None,
        "delay_s": _quantiles([d for ds in delays.values() for d in ds]),
        "pending_job_hours_by_queue_and_reason": waits,
        "delay_s_by_queue": {q: _quantiles(ds) for q, ds in sorted(delays.items())},
        "jain_backlogged": tenancy.get("jain_backlogged"),
        "gpu_hours_lost": tenancy.get("gpu_hours_lost"),
        "gpu_hours_lost_per_preemptor_placed": tenancy.get("gpu_hours_lost_per_preemptor_placed"),
        "preemptions_by_kind": dict(by_kind),
        "preemptors_placed_by_kind": dict(placed),
        "preemptions_whose_gang_fit_its_quota_before": dict(quota_free),
        "victims_by_pair": dict(pairs.most_common()),
        "victim_ran_s_by_kind": {k: _quantiles(v) for k, v in sorted(ran.items())},
        "victim_gpu_hours_run_by_kind": {k: round(v, 1) for k, v in sorted(lost_h.items())},
        "victims_preempted_more_than_once": len(again),
        "most_preemptions_of_one_job": max(again, default=1 if run.times_preempted else 0),
        "fair_share_victims": fair_victims,
        "fair_share_victim_queue_below_preemptor_by_held": below_by_held,
        "fair_share_victim_queue_below_preemptor_by_rule": below_by_rule,
        "most_preempted": {job: run.history[job] for job, _ in run.times_preempted.most_common(3)},
        "fair_share_examples": [p for p in run.preemptions if p["kind"] == "fair_share"][:5],
    }


def run_policy(
    workload: Workload,
    policy: str,
    floor: int | None = None,
    variant: str = "none",
    reservations: int = 1,
) -> dict[str, Any]:
    """One traced run; ``floor``: the format the cluster reads (default: this release's);
    ``variant``: the workload's estimates (``learned`` keeps finished jobs a day);
    ``reservations``: per pass."""
    mode = PreemptionMode.OFF if policy == "off" else PreemptionMode.TOPOLOGY
    load = with_fair_sharing(workload) if policy == FAIR else workload
    config = keeping_history(ClusterConfig(retention_ms=0, preemption=mode), variant)
    config = with_reservations(config, reservations)
    state = build_cluster(load, config)
    if floor is not None:
        state.format_floor = floor
    run = TracedRun(load, Watching(), state, Pacing(GRACE_MS, PASS_INTERVAL_MS))
    started = time.perf_counter()
    run.run()
    wall = time.perf_counter() - started
    out = breakdown(run, run.result(wall).metrics)
    out["wall_s"] = round(wall, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--openb", type=Path, default=OPENB, help="folder of the openb CSV files")
    parser.add_argument("--every", type=int, default=100, help="one node in this many per shape")
    parser.add_argument("--limit", type=int, default=None, help="the first N pods only")
    parser.add_argument(
        "--speedup", type=float, default=5.0, help="arrivals this many times faster"
    )
    parser.add_argument("--checkpoint-interval", type=float, default=None, metavar="S")
    parser.add_argument("--policies", default=",".join(POLICIES), help="of %(default)s")
    parser.add_argument(
        "--format", type=int, default=None, help="the format the cluster reads (default: newest)"
    )
    parser.add_argument(
        "--estimates",
        default="none",
        help="run-time estimates of the trace's queues: none, learned, learned:S, default:S",
    )
    parser.add_argument(
        "--reservations", type=int, default=1, metavar="K", help="reservations per pass"
    )
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        parser.error(f"--policies: unknown {', '.join(unknown) or '(none given)'}; of {POLICIES}")
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit: at least 1, got {args.limit}")
    if not 0 < args.speedup < float("inf"):
        parser.error(f"--speedup: a number above 0, got {args.speedup}")
    try:
        variant, default_ms = parse_estimates(args.estimates)
    except ValueError as exc:
        parser.error(f"--estimates: {exc}")
    try:
        with_reservations(ClusterConfig(), args.reservations)
    except ValueError as exc:
        parser.error(f"--reservations: {exc}")
    workload = saving_on_notice(
        openb_workload(args.openb, args.every, args.speedup, args.limit, args.checkpoint_interval),
        SAVE_ON_NOTICE_MS,
    )
    workload = with_estimates(workload, variant, default_ms)
    result = {
        "bench": "fair_trace",
        "workload": workload.notes,
        "format": args.format,
        "estimates": args.estimates,
        "reservations": args.reservations,
        "policies": {
            p: run_policy(workload, p, args.format, variant, args.reservations) for p in policies
        },
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
