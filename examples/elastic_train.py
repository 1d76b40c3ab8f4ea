"""A member of an elastic gang (``replicas: {min, max}``, docs/failures.md) that follows
its gang's size while it runs, never restarted for it.

    replicas: {min: 2, max: 4}
    membership_signal: SIGUSR1
    command: ["python", "examples/elastic_train.py", "--steps", "5000"]

It says the rank and world size it started with (``$RANK``, ``$WORLD_SIZE``: the gang's
size when this member started), then runs steps, taking every ``WORLD_SIZE``-th batch
from its ``RANK``-th. Each time the gang grows or shrinks, its worker appends a line to
``$SYNAPSE_MEMBERSHIP_FILE`` and sends the signal: the handler only sets a flag, and
between two steps the loop reads every line it has not read yet, says each one and
takes its share of the batches by the newest ``world_size`` (a real job would rebuild
its ``torch.distributed`` process group from ``member_hosts`` there, then load the
newest checkpoint). A member that starts late reads the lines written before it looked.

A member the gang gives back (a rank above the new size) gets SIGTERM from its worker:
it finishes its step and exits. ``--steps 0`` runs until then.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

told = False  # a membership line was written since the loop last looked
stopping = False


def _on_membership(signum: int, frame: object) -> None:
    global told
    told = True


def _on_stop(signum: int, frame: object) -> None:
    global stopping
    stopping = True


def membership_lines() -> list[dict[str, object]]:
    """Every line of ``$SYNAPSE_MEMBERSHIP_FILE``, oldest first."""
    path = os.environ.get("SYNAPSE_MEMBERSHIP_FILE", "")
    if not path:
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main() -> int:
    global told
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000, help="0: until stopped")
    parser.add_argument("--step-s", type=float, default=0.01)
    parser.add_argument("--signal", default="SIGUSR1", help="the job's membership_signal")
    args = parser.parse_args()
    # Before the first look at the file: a change is then either read or signalled.
    signal.signal(signal.Signals[args.signal], _on_membership)
    signal.signal(signal.SIGTERM, _on_stop)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    print(f"rank {rank}: started with WORLD_SIZE={world} (pid {os.getpid()})", flush=True)
    read = 1  # the file's first line is the gang this member started in
    step, batch = 0, rank  # this member's next batch: rank, rank + W, rank + 2W, ...
    told = True  # catch up with any line written before the handler was in place
    while not stopping and (args.steps == 0 or step < args.steps):
        if told:
            told = False
            lines = membership_lines()
            for line in lines[read:]:
                world = int(str(line["world_size"]))
                print(
                    f"rank {rank}: membership {line['membership']}: world size {world}, "
                    f"hosts {line['member_hosts']}",
                    flush=True,
                )
            read = max(read, len(lines))
        time.sleep(args.step_s)  # a step on ``batch``
        batch += world
        step += 1
    print(f"rank {rank}: {'stopped' if stopping else 'done'} at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
