"""The step daemon: what every member of an sbatch job runs (docs/slurm.md, "Job steps").

An sbatch job is an allocation: a gang of nodes, one member each. Every member runs this
program as its command, as the job's owner, under the member's supervision and fencing:

* **The holder** (every member; :mod:`synapse_ha.slurm.holder`) keeps a connection to
  the hub and runs the tasks of job steps on its node, as children of the member: when
  the member is stopped or fenced its tasks go with it, so a step never outlives its
  attempt. It exits 0 only when the hub releases it (the batch script ended); a lost
  connection kills its tasks (their step counts them lost) and it connects again.
* **The hub** (rank 0; :mod:`synapse_ha.slurm.hub`) listens on the attempt's step port
  (:func:`synapse_ha.slurm.wire.step_port`) for holders and ``srun``
  (:mod:`synapse_ha.slurm.srun`), places each step's tasks and relays what they say.
  Every connection proves the job's step secret and the attempt's token first
  (:mod:`synapse_ha.slurm.wire`).
* **The batch script** (rank 0; :mod:`synapse_ha.slurm.batch`) runs once, with the batch
  step's ``SLURM_*`` variables and ``srun`` and ``scontrol`` first on its ``PATH``; its
  output is the member's and is written where ``-o``/``-e`` say (``slurm-%j.out`` by
  default). When it exits the hub releases the holders (the other members exit 0) and
  the member exits with the script's status: the job's result.

    python -m synapse_ha.slurm.stepd [--ntasks N] [--tasks-per-node K] [--output PATTERN]
        [--error PATTERN] [--open-mode append|truncate] [--signal [B:]N@S --time-limit S]
        -- COMMAND...
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from synapse_ha.slurm.batch import LimitSignal, OutputFiles, run_batch
from synapse_ha.slurm.holder import Holder
from synapse_ha.slurm.member import Member


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="stepd", description=__doc__.splitlines()[0])
    parser.add_argument("--ntasks", type=int, default=0, help="the allocation's tasks")
    parser.add_argument("--tasks-per-node", type=int, default=1)
    parser.add_argument("--output", help="the batch script's output file (sbatch -o)")
    parser.add_argument("--error", help="its error file (sbatch -e; default: --output)")
    parser.add_argument("--open-mode", choices=("append", "truncate"), default="truncate")
    parser.add_argument("--signal", help="[B:]NUMBER@SECONDS before --time-limit (sbatch's)")
    parser.add_argument("--time-limit", type=int, help="the job's time limit in seconds")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    member = Member.from_env(os.environ)
    if member.rank != 0:
        asyncio.run(Holder(member).run())
        sys.exit(0)
    if not command:
        parser.error("the batch command is missing after --")
    ntasks = args.ntasks or args.tasks_per_node * len(member.hosts)
    files = OutputFiles(args.output, args.error, args.open_mode == "append")
    warning = LimitSignal.parse(args.signal, args.time_limit)
    code = asyncio.run(run_batch(member, command, ntasks, args.tasks_per_node, files, warning))
    sys.exit(code)


if __name__ == "__main__":
    main()
