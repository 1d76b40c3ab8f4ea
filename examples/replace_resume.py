"""A gang member that takes a replaced peer in its stride: it runs steps, saves and marks
a checkpoint every few, and when its gang's membership changes (a lost peer placed again
on another node, ``on_node_failure: replace``), it reads the new hosts from its
membership file, goes back to the gang's newest checkpoint and carries on. A replacement
member starts at ``$SYNAPSE_RESUME_STEP`` (docs/failures.md).

    on_node_failure: replace
    membership_signal: SIGUSR1
    command: ["python", "examples/replace_resume.py", "--steps", "5000", "--every", "100",
              "--dir", "/shared/ckpt/my-run"]

The signal only sets a flag: the loop looks at it between steps (a real job would rebuild
its ``torch.distributed`` process group from ``member_hosts`` there). Every ``--every``
steps each member writes ``rank-R.step-S`` under ``--dir`` (shared by the gang's nodes)
and marks the checkpoint; the gang's newest checkpoint is the newest step every rank
wrote.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

changed = False


def _on_membership(signum: int, frame: object) -> None:
    global changed
    changed = True


def last_membership() -> dict[str, object]:
    """The last line of ``$SYNAPSE_MEMBERSHIP_FILE``: the gang as it is now."""
    path = os.environ.get("SYNAPSE_MEMBERSHIP_FILE", "")
    lines = Path(path).read_text().splitlines() if path else []
    return json.loads(lines[-1]) if lines else {}


def gang_checkpoint(folder: Path, world: int) -> int:
    """The newest step every one of ``world`` ranks saved (0: none yet)."""
    saved: dict[int, set[int]] = {}
    for path in folder.glob("rank-*.step-*"):
        rank, step = (int(part.split("-")[1]) for part in path.name.split("."))
        saved.setdefault(step, set()).add(rank)
    whole = [step for step, ranks in saved.items() if len(ranks) == world]
    return max(whole, default=0)


def mark(step: int) -> None:
    path = os.environ.get("SYNAPSE_CHECKPOINT_FILE", "")
    if path:
        with open(path, "a") as f:
            f.write(f"step {step}\n")


def main() -> int:
    global changed
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--step-s", type=float, default=0.01)
    parser.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args()
    signal.signal(signal.SIGUSR1, _on_membership)  # before the first look at the file
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    args.dir.mkdir(parents=True, exist_ok=True)
    step = int(os.environ.get("SYNAPSE_RESUME_STEP", "0") or 0)
    print(f"rank {rank}: starting at step {step}", flush=True)
    while step < args.steps:
        if changed:
            changed = False
            gang = last_membership()
            step = gang_checkpoint(args.dir, world)
            print(
                f"rank {rank}: membership {gang.get('membership')}, hosts "
                f"{gang.get('member_hosts')}; back to step {step}",
                flush=True,
            )
        time.sleep(args.step_s)
        step += 1
        if step % args.every == 0:
            (args.dir / f"rank-{rank}.step-{step}").write_text("state\n")
            mark(step)
    print(f"rank {rank}: done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
