"""A training loop that saves a checkpoint every few steps, marks it, and resumes from the
gang's newest mark when the scheduler restarts it (docs/checkpoints.md).

Run it as the command of a job (every member runs it; each saves its own part):

    command: ["python", "examples/pytorch_checkpoint.py", "--steps", "2000",
              "--every", "100", "--dir", "/shared/ckpt/my-run"]
    retries: {max: 3}

Every ``--every`` steps each member saves its state for that step (``torch.save`` when
PyTorch is installed, else a small JSON file) under ``--dir``, calls
``synapse_ha.client.checkpoint(step)``, and waits until every member of the gang has
done so (a barrier: ``torch.distributed.barrier()`` in a real job; here files in
``--dir``, which must then be shared by the gang's nodes). The scheduler keeps each
member's newest mark; the gang's mark is the oldest of them. When an attempt fails or is
requeued, the next attempt's members get ``$SYNAPSE_RESUME_STEP`` and load the state
saved at that step.

When the gang is preempted, each member gets SIGTERM after its worker has written the
notice ``synapse_ha.client.preempt_notice()`` reads: the loop finishes its step, saves and
marks it, and exits, so the gang loses nothing since (the grace period ends as soon as
every member has exited). In a real job the members agree on that step first (an
``all_reduce`` of a stop flag each step); here each saves the step it reached and, on a
restart, loads its newest state at or before the gang's resume step.

``--crash-at STEP`` makes a first attempt (one that does not resume) exit with code 1 at
that step, to see a restart resume.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from synapse_ha.client import checkpoint, preempt_notice, resume_step

try:
    import torch
except ImportError:  # the loop runs without PyTorch: its state is a JSON file
    torch = None


def _state_path(directory: Path, step: int, rank: str) -> Path:
    suffix = "pt" if torch is not None else "json"
    return directory / f"step-{step}.rank-{rank}.{suffix}"


def new_state() -> dict[str, Any]:
    """The model and the optimizer: a tiny linear model with PyTorch, a number without."""
    if torch is None:
        return {"weight": 0.0}
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    return {"model": model, "optimizer": optimizer}


def train_step(state: dict[str, Any], step: int) -> None:
    if torch is None:
        state["weight"] += 0.001 * step
        return
    model, optimizer = state["model"], state["optimizer"]
    x = torch.randn(8, 4)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def save(state: dict[str, Any], path: Path, step: int) -> None:
    """Write the state for ``step`` to a temporary file, then move it in place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(path.suffix + ".partial")
    if torch is None:
        partial.write_text(json.dumps({"step": step, **state}))
    else:
        torch.save(
            {
                "step": step,
                "model": state["model"].state_dict(),
                "optimizer": state["optimizer"].state_dict(),
            },
            partial,
        )
    os.replace(partial, path)


def load(state: dict[str, Any], path: Path) -> None:
    if torch is None:
        state.update({k: v for k, v in json.loads(path.read_text()).items() if k != "step"})
        return
    saved = torch.load(path)
    state["model"].load_state_dict(saved["model"])
    state["optimizer"].load_state_dict(saved["optimizer"])


def barrier(directory: Path, step: int, rank: str, timeout_s: float = 300.0) -> None:
    """Wait until every member of the gang has saved and marked ``step``."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    (directory / f"step-{step}.rank-{rank}.marked").touch()
    deadline = time.monotonic() + timeout_s
    while any(not (directory / f"step-{step}.rank-{r}.marked").exists() for r in range(world)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the gang did not all mark step {step} within {timeout_s}s")
        time.sleep(0.05)


def newest_saved(directory: Path, rank: str, at_most: int) -> int | None:
    """The newest step at or before ``at_most`` this member saved a state for."""
    steps = []
    for path in directory.glob(f"step-*.rank-{rank}.*"):
        step = path.name.split(".")[0].removeprefix("step-")
        if step.isdigit() and int(step) <= at_most and not path.name.endswith(".partial"):
            steps.append(int(step))
    return max(steps, default=None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="train up to this step")
    parser.add_argument("--every", type=int, default=100, help="save and mark every N steps")
    parser.add_argument("--dir", default="checkpoints", help="where the states are saved")
    parser.add_argument("--crash-at", type=int, default=0, help="a first attempt fails here")
    parser.add_argument("--step-s", type=float, default=0.0, help="sleep this long per step")
    args = parser.parse_args(argv)
    rank = os.environ.get("RANK", "0")
    directory = Path(args.dir)
    state = new_state()
    start = resume_step()
    step = 0
    saved = newest_saved(directory, rank, start) if start is not None else None
    if saved is not None:
        load(state, _state_path(directory, saved, rank))
        step = saved
        print(f"rank {rank}: resuming from step {saved} (the gang's mark: {start})", flush=True)
    elif start is not None:
        print(f"rank {rank}: no state saved at step {start}; starting over", flush=True)
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    while step < args.steps:
        step += 1
        train_step(state, step)
        time.sleep(args.step_s)
        if stopping:
            if preempt_notice() is None:
                return 143  # cancelled or stopped: nothing to keep
            save(state, _state_path(directory, step, rank), step)
            checkpoint(step)
            print(f"rank {rank}: preempted; saved and marked step {step}", flush=True)
            return 143
        if step % args.every == 0:
            save(state, _state_path(directory, step, rank), step)
            marked = checkpoint(step)
            barrier(directory, step, rank)
            print(f"rank {rank}: saved step {step}{' and marked it' if marked else ''}", flush=True)
        if start is None and step == args.crash_at:
            print(f"rank {rank}: crashing at step {step}", flush=True)
            return 1
    print(f"rank {rank}: done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
