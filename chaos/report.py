"""The run report: ``report.json`` and ``timeline.png`` in the run directory.

The timeline has two panels on one CLOCK_MONOTONIC axis (seconds since the scenario
started): which replica led (and which were down or paused), and one row per job with a
bar per attempt (from its first to its last ledger record), coloured by attempt, over
shaded fault windows labelled with the fault kind.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from chaos import ledger
from chaos.checker import (
    History,
    Violation,
    load_history,
    preemptions,
    reruns,
    reruns_after_unfinished,
    thaw_writes,
)
from chaos.elastic_rules import grown_and_shrunk
from chaos.fair_rules import preemption_counts
from chaos.replace_rules import replaced_ranks
from chaos.step_rules import step_counts
from synapse_ha.core.codec.decode_errors import CodecError
from synapse_ha.core.codec.versioned import decode_state


def write_report(
    run_dir: Path, violations: list[Violation], faults: int, jobs: int
) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads((run_dir / "meta.json").read_text(encoding="utf-8"))
    submissions: dict[str, int] = defaultdict(int)
    arrays: dict[str, int] = defaultdict(int)  # array submissions by outcome
    sbatch: dict[str, int] = defaultdict(int)  # sbatch submissions by outcome
    for r in ledger.read_records(run_dir / ledger.SUBMISSIONS):
        if r["type"] != "begin":
            submissions[str(r["type"])] += 1
            if r.get("array"):
                arrays[str(r["type"])] += 1
            if r.get("sbatch"):
                sbatch[str(r["type"])] += 1
    effects = [
        e
        for e in ledger.read_records(run_dir / ledger.EFFECTS)
        if e.get("type", "effect") == "effect"
    ]
    report = {
        "scenario": meta.get("scenario"),
        "seed": meta.get("seed"),
        "backends": meta.get("backends"),
        "timeouts": meta.get("timeouts"),
        "unsafe_no_self_fencing": meta.get("unsafe_no_self_fencing", False),
        "faults": faults,
        "fault_log": [
            {k: r[k] for k in ("step", "kind", "targets", "detail", "hit")}
            | {"seconds": round((r["end_ns"] - r["start_ns"]) / 1e9, 2)}
            for r in ledger.read_records(run_dir / ledger.FAULTS)
        ],
        "jobs": jobs,
        "submissions": dict(submissions),
        "array_submissions": dict(arrays),
        "sbatch_submissions": dict(sbatch),
        "sbatch": step_counts(load_history(run_dir)),
        "effects": {
            "accepted": sum(1 for e in effects if e["accepted"]),
            "rejected_stale_token": sum(
                1 for e in effects if not e["accepted"] and not e.get("done")
            ),
            "already_committed": sum(1 for e in effects if e.get("done")),
        },
        "reruns_after_lost_success_reports": reruns(load_history(run_dir)),
        "reruns_after_unfinished_attempts": reruns_after_unfinished(load_history(run_dir)),
        "preempted_attempts": preemptions(load_history(run_dir)),
        # Preempted attempts of each kind, as the state recorded them (chaos/fair_rules.py).
        "preemptions": preemption_counts(load_history(run_dir)),
        "writes_after_thaw_within_bound": thaw_writes(load_history(run_dir)),
        "most_attempts": most_attempts(load_history(run_dir)),
        "replace_submissions": sum(
            1
            for r in ledger.read_records(run_dir / ledger.SUBMISSIONS)
            if r.get("replace") and r["type"] == "ok"
        ),
        "replaced_ranks": replaced_ranks(load_history(run_dir)),
        "elastic_submissions": sum(
            1
            for r in ledger.read_records(run_dir / ledger.SUBMISSIONS)
            if r.get("elastic") and r["type"] == "ok"
        ),
        # Ranks of elastic gangs that started after their attempt's first members, and
        # members above min stopped while their attempt worked on.
        "elastic_grown_ranks": grown_and_shrunk(load_history(run_dir))[0],
        "elastic_given_back_ranks": grown_and_shrunk(load_history(run_dir))[1],
        "memberships_told": sum(
            1 for r in ledger.read_records(run_dir / ledger.LEDGER) if r["type"] == "membership"
        ),
        "quiesce": meta.get("quiesce", ""),
        "error": meta.get("error", ""),
        "violations": [str(v) for v in violations],
    }
    (run_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    draw_timeline(run_dir, meta)
    return report


def most_attempts(history: History, top: int = 5) -> list[str]:
    """``job: N attempts`` for the jobs that needed the most attempts (retries, requeues
    and preemptions): a job bound and preempted over and over shows up here."""
    if not history.replica_states:
        return []
    try:
        state = decode_state(history.replica_states[sorted(history.replica_states)[0]])
    except CodecError:
        return []
    jobs = sorted(state.jobs.values(), key=lambda j: (-j.attempts_made, j.job_id))
    return [f"{j.job_id}: {j.attempts_made} attempts" for j in jobs[:top] if j.attempts_made > 1]


def draw_timeline(run_dir: Path, meta: dict[str, Any]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = int(meta.get("start_ns") or 0)

    def secs(ns: int) -> float:
        return (ns - t0) / 1e9

    attempts: dict[str, dict[int, list[int]]] = defaultdict(dict)
    for r in ledger.read_records(run_dir / ledger.LEDGER):
        span = attempts[str(r["job"])].setdefault(int(r["token"]), [r["mono_ns"], r["mono_ns"]])
        span[0] = min(span[0], r["mono_ns"])
        span[1] = max(span[1], r["mono_ns"])
    faults = list(ledger.read_records(run_dir / ledger.FAULTS))
    roles = list(ledger.read_records(run_dir / ledger.LEADERS))
    jobs = sorted(attempts, key=lambda j: min(s[0] for s in attempts[j].values()))
    fig, (top, bottom) = plt.subplots(
        2,
        1,
        sharex=True,
        figsize=(14, 3 + 0.18 * max(10, len(jobs))),
        gridspec_kw={"height_ratios": [1, max(3, len(jobs) // 6)]},
    )
    replicas = sorted({str(r["replica"]) for r in roles})
    colours = {"leader": "tab:green", "follower": "lightgrey", "candidate": "gold"}
    end = secs(int(meta.get("end_ns") or t0))
    for i, name in enumerate(replicas):
        mine = [r for r in roles if r["replica"] == name]
        for k, a in enumerate(mine):
            stop = secs(int(mine[k + 1]["mono_ns"])) if k + 1 < len(mine) else end
            colour = colours.get(str(a["role"]), "tab:red")
            top.barh(i, stop - secs(int(a["mono_ns"])), left=secs(int(a["mono_ns"])), color=colour)
    top.set_yticks(range(len(replicas)), replicas)
    top.set_title("replica roles (green leader, grey follower, gold candidate, red down/paused)")
    palette = ["tab:blue", "tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:cyan"]
    for row, job in enumerate(jobs):
        for k, (_, (first, last)) in enumerate(sorted(attempts[job].items())):
            bottom.barh(
                row,
                max(0.05, secs(last) - secs(first)),
                left=secs(first),
                color=palette[k % len(palette)],
                height=0.8,
            )
    bottom.set_yticks(range(len(jobs)), jobs, fontsize=5)
    bottom.set_xlabel("seconds since the scenario started")
    bottom.set_title("attempts per job (one colour per attempt)")
    for f in faults:
        for ax in (top, bottom):
            ax.axvspan(secs(f["start_ns"]), secs(f["end_ns"]), color="red", alpha=0.08)
        bottom.text(
            secs(f["start_ns"]),
            len(jobs) - 0.5,
            str(f["kind"]),
            rotation=90,
            fontsize=6,
            va="top",
            color="darkred",
        )
    fig.tight_layout()
    path = run_dir / "timeline.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
