"""What a chaos sbatch job runs besides its commit (:mod:`chaos.member`):

    python -P chaos/steptask.py task STEPS_LEDGER MS     # a task of a job step (srun)
    python -P chaos/steptask.py batch start|end STEPS_LEDGER [STATUS...]

Standard library only, and started by its path: a job runs eight of these, and the
``chaos`` package's import of gRPC (:mod:`chaos`) would cost each of them about 0.2 s of
CPU on the suite's two cores. Each record is one ``os.write`` to a file opened with
``O_APPEND``, as :class:`chaos.ledger.Appender` writes.

A **task** reads its identity from the step's environment (``SYNAPSE_JOB_ID``,
``SYNAPSE_ATTEMPT``, ``SYNAPSE_FENCING_TOKEN`` exported by the batch script,
``SLURM_STEP_ID``, ``SLURM_PROCID``, ``SLURM_NODEID`` and ``SLURM_STEP_NODELIST``), appends
``task-start``, a ``task-heartbeat`` every 100 ms for MS milliseconds and ``task-end`` to
the steps ledger, and exits 0; SIGTERM writes ``task-term`` and exits 143.

The **batch script** records itself with ``batch start`` first and ``batch end STATUS...``
last (the exit statuses of its steps): the recorder names the script by its parent's
pid, PID namespace and start time, so two runs of the script within one attempt are two
processes. Records carry ``job``, ``attempt``, ``token``, ``node``, ``pid``, ``pid_ns``,
``start_ticks``, ``gpus`` and ``mono_ns``; a task's also ``step`` and ``task``. The suite's
observer reads them as it reads the members' (which hosts run which attempts, on which
GPUs), so faults aimed at busy hosts hit sbatch jobs too.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

HEARTBEAT_S = 0.1
USAGE = (
    "usage: python -P chaos/steptask.py task STEPS_LEDGER MS\n"
    "       python -P chaos/steptask.py batch start|end STEPS_LEDGER [STATUS...]"
)


def append(fd: int, record: dict[str, Any]) -> None:
    """One record, one write (chaos.ledger's format)."""
    data = (json.dumps(record, separators=(",", ":"), sort_keys=True) + "\n").encode()
    if os.write(fd, data) != len(data):
        raise OSError("short append to the steps ledger")


def open_ledger(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def pid_namespace() -> int:
    """The inode number of this process's PID namespace (0: unknown). With the pid and
    its start time it names the process on its machine: a worker may start each member in
    a PID namespace of its own, where every member's pid is 2 (and a namespace's number is
    used again once it is gone)."""
    try:
        link = os.readlink("/proc/self/ns/pid")  # pid:[4026532281]
    except OSError:
        return 0
    inode = link.partition("[")[2].rstrip("]")
    return int(inode) if inode.isdigit() else 0


def start_ticks(pid: int) -> int:
    """When process ``pid`` started, in clock ticks since boot (0: unknown)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else 0


def attempt_identity(pid: int) -> dict[str, Any]:
    """The attempt's fields and the process ``pid`` as the records name it."""
    return {
        "job": os.environ["SYNAPSE_JOB_ID"],
        "attempt": int(os.environ["SYNAPSE_ATTEMPT"]),
        "token": int(os.environ["SYNAPSE_FENCING_TOKEN"]),
        "pid": pid,
        "pid_ns": pid_namespace(),
        "start_ticks": start_ticks(pid),
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
    }


def task_identity() -> dict[str, Any]:
    nodes = os.environ.get("SLURM_STEP_NODELIST", "").split(",")
    index = int(os.environ.get("SLURM_NODEID", "0"))
    return {
        **attempt_identity(os.getpid()),
        "step": int(os.environ["SLURM_STEP_ID"]),
        "task": int(os.environ["SLURM_PROCID"]),
        "node": nodes[index] if index < len(nodes) else "",
    }


def run_task(path: Path, duration_ms: int) -> int:
    me = task_identity()
    fd = open_ledger(path)

    def record(kind: str) -> None:
        append(fd, {"type": kind, **me, "mono_ns": time.monotonic_ns()})

    def on_term(signum: int, frame: object) -> None:
        record("task-term")
        os._exit(143)

    signal.signal(signal.SIGTERM, on_term)
    record("task-start")
    end_at = time.monotonic() + duration_ms / 1000
    while time.monotonic() < end_at:
        time.sleep(min(HEARTBEAT_S, max(0.0, end_at - time.monotonic())))
        record("task-heartbeat")
    record("task-end")
    return 0


def record_batch(path: Path, kind: str, statuses: list[str]) -> int:
    """A ``batch-start`` or ``batch-end`` record of the batch script (this process's
    parent)."""
    hosts = os.environ.get("SYNAPSE_MEMBER_HOSTS", "").split(",")
    record: dict[str, Any] = {
        "type": f"batch-{kind}",
        **attempt_identity(os.getppid()),
        "node": hosts[0],
        "mono_ns": time.monotonic_ns(),
    }
    if kind == "end":
        record["statuses"] = [int(s) for s in statuses if s.lstrip("-").isdigit()]
    fd = open_ledger(path)
    try:
        append(fd, record)
    finally:
        os.close(fd)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 3 and args[0] == "task" and args[2].isdigit():
        return run_task(Path(args[1]), int(args[2]))
    if len(args) >= 3 and args[0] == "batch" and args[1] in ("start", "end"):
        return record_batch(Path(args[2]), args[1], args[3:])
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
