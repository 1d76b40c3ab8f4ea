"""Real synapse-worker processes on 127.0.0.1 for integration tests and benchmarks.

Each worker runs in its own process group; :meth:`LocalWorkers.close` kills every group
it started, and any member left behind (via the member pid records), so a failing test
never leaks processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from synapse_ha.worker.members import kill_recorded_process, read_json


@dataclass
class WorkerProcess:
    node_id: str
    data_dir: Path
    log_path: Path
    args: list[str]
    process: subprocess.Popen[bytes] | None = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class LocalWorkers:
    root: Path
    schedulers: list[str]
    workers: list[WorkerProcess] = field(default_factory=list)

    def start(self, node_id: str, *extra: str) -> WorkerProcess:
        data = self.root / node_id
        worker = WorkerProcess(
            node_id=node_id,
            data_dir=data,
            log_path=self.root / f"{node_id}.log",
            args=[
                sys.executable,
                "-m",
                "synapse_ha.programs.worker",
                "--scheduler",
                ",".join(self.schedulers),
                "--node-id",
                node_id,
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                str(data),
                "--no-cgroups",
                "--stop-grace",
                "1s",
                "--fence-grace",
                "200ms",
                *extra,
            ],
        )
        self.workers.append(worker)
        self.launch(worker)
        return worker

    def launch(self, worker: WorkerProcess) -> None:
        log = open(worker.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            worker.process = subprocess.Popen(
                worker.args,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()

    def kill(self, worker: WorkerProcess, sig: int = signal.SIGKILL) -> None:
        """Signal the agent process only (not its members' supervisors)."""
        if worker.process is not None and worker.process.poll() is None:
            os.kill(worker.process.pid, sig)
        if sig in (signal.SIGKILL, signal.SIGTERM) and worker.process is not None:
            worker.process.wait(timeout=30)

    def close(self) -> None:
        for w in self.workers:
            if w.process is not None and w.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(w.process.pid, signal.SIGKILL)
                w.process.wait(timeout=10)
            members = w.data_dir / "members"
            for record in members.glob("*/*/shim.json") if members.exists() else ():
                kill_recorded_process(read_json(record))
                kill_recorded_process(read_json(record.with_name("member.json")))

    def logs(self) -> str:
        parts = []
        for w in self.workers:
            text = w.log_path.read_text(errors="replace") if w.log_path.exists() else ""
            parts.append(f"----- {w.node_id} -----\n{text[-3000:]}")
        return "\n".join(parts)
