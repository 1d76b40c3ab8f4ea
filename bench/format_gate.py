"""What the format gate costs each apply: ``format_needed`` walks every command before
it is applied (core/codec/formats.py), on every replica.

Commands: a job submission with a full spec, a bind plan of ``gangs`` gangs of 8
members with a pending reason each, and a report of 64 member events. For each, the
median time of ``format_needed`` and, for scale, of ``encode_command`` (which walks the
same values to write the log entry) over ``rounds`` rounds.

Prints JSON; the target is a gate below 20% of the encoding's cost for each command.
``--smoke`` runs a tiny version in a second.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synapse_ha.core import commands as c
from synapse_ha.core.codec.formats import format_needed
from synapse_ha.core.codec.versioned import encode_command
from synapse_ha.core.model import JobSpec, MemberPlacement, Resources, RetryPolicy
from synapse_ha.core.reasons import ReasonCode, reason


def submission() -> c.SubmitJob:
    spec = JobSpec(
        name="llama-pretrain",
        replicas=64,
        resources=Resources(96_000, 1_024 * 1_024, 8),
        command=("torchrun", "--nproc-per-node=8", "train.py", "--config", "llama3.yaml"),
        shell=False,
        env=tuple((f"VAR_{i}", "x" * 32) for i in range(16)),
        workdir="/home/alice/llama",
        priority=10,
        topology_required="rack",
        time_limit_ms=86_400_000,
        retries=RetryPolicy(3, 10_000, 600_000),
        queue="research",
    )
    return c.SubmitJob(spec, "alice/req-1", 1_000, "alice")


def bind_plan(gangs: int) -> c.BindPlan:
    placements = tuple(
        c.GangPlacement(
            f"job-{g:06d}",
            1,
            tuple(MemberPlacement(r, f"node-{g * 8 + r}", tuple(range(8))) for r in range(8)),
        )
        for g in range(gangs)
    )
    why = reason(ReasonCode.WAITING_CAPACITY, members=8, request="8 GPU", room=3)
    reasons = tuple((f"job-{gangs + g:06d}", why) for g in range(gangs))
    return c.BindPlan(placements, reasons, 1_000)


def reports() -> c.ReportMembers:
    events = tuple(
        c.MemberEvent(f"job-{i:06d}", 7, 0, c.MemberEventKind.EXITED, exit_code=0)
        for i in range(64)
    )
    return c.ReportMembers("node-1", events, 3, 1_000)


def median_us(fn: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2_000)
    parser.add_argument("--gangs", type=int, default=64)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    rounds, gangs = (50, 4) if args.smoke else (args.rounds, args.gangs)
    commands: dict[str, c.Command] = {
        "submit_job": submission(),
        f"bind_plan_{gangs}_gangs": bind_plan(gangs),
        "report_64_exits": reports(),
    }
    figures = {}
    for name, command in commands.items():
        gate = median_us(lambda command=command: format_needed(command), rounds)
        encode = median_us(lambda command=command: encode_command(command), rounds)
        figures[name] = {
            "format_needed_us": round(gate, 1),
            "encode_us": round(encode, 1),
            "share_of_encoding": round(gate / encode, 3),
        }
    print(
        json.dumps(
            {
                "benchmark": "format_gate",
                "rounds": rounds,
                "commands": figures,
                "target": {"share_of_encoding_max": 0.2},
                "meets_target": all(f["share_of_encoding"] <= 0.2 for f in figures.values()),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
