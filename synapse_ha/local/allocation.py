"""An sbatch allocation's step daemons on loopback, without a cluster: each started as a
worker starts a member (the member variables of DESIGN §5, the job's step secret), for
the step tests and the srun benchmark.

The daemons are real processes on real sockets; only the scheduler and the workers are
left out, so what is measured and checked is the step machinery itself.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from synapse_ha.slurm.wire import STEP_PORT_OFFSET

SECRET = "ab" * 32
TOKEN = 7
# How long the other members get to exit after the first (the hub releases them when the
# batch script ends); then they are stopped, as the cluster stops a failed attempt's.
RELEASE_S = 10.0


@dataclass
class Ran:
    """Each member's exit status and output, in rank order."""

    codes: list[int]
    outputs: list[str]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class LocalAllocation:
    """Start allocations under ``root``; :meth:`close` kills what is still running."""

    root: Path
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def run(
        self,
        script: str,
        *,
        nodes: int = 2,
        tasks_per_node: int = 1,
        gpus: Sequence[str] = ("0,1", "2,3"),
        timeout_s: float = 60.0,
        stepd: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> Ran:
        """Run ``script`` (``/bin/sh``) as the batch script of a ``nodes``-node
        allocation, with the step daemon's options ``stepd`` and the variables ``env``
        besides the members'; wait (bounded) for the first member to exit, then for the
        others (stopped after :data:`RELEASE_S`: their code is then -15)."""
        hub_port = _free_port()
        logs = [self.root / f"member-{len(self.started) + r}.log" for r in range(nodes)]
        for rank in range(nodes):
            member_env = {
                **(env or {}),
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": str(self.root),
                "SYNAPSE_JOB_ID": "job-000042",
                "RANK": str(rank),
                "WORLD_SIZE": str(nodes),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(hub_port - STEP_PORT_OFFSET),
                "SYNAPSE_FENCING_TOKEN": str(TOKEN),
                "SYNAPSE_MEMBER_HOSTS": ",".join(["127.0.0.1"] * nodes),
                "SYNAPSE_STEP_SECRET": SECRET,
                "SYNAPSE_SBATCH_NAME": "steps",
                "CUDA_VISIBLE_DEVICES": gpus[rank % len(gpus)],
            }
            command = [
                sys.executable, "-m", "synapse_ha.slurm.stepd",
                "--tasks-per-node", str(tasks_per_node), *stepd, "--",
                "/bin/sh", "-c", script, "steps.sh",
            ]  # fmt: skip
            with open(logs[rank], "wb") as log:
                self.started.append(
                    subprocess.Popen(
                        command,
                        env=member_env,
                        cwd=self.root,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        members = self.started[-nodes:]
        codes = [members[0].wait(timeout_s)]
        for p in members[1:]:  # released by the hub; or stopped, as the cluster would
            try:
                codes.append(p.wait(RELEASE_S))
            except subprocess.TimeoutExpired:
                p.terminate()
                codes.append(p.wait(10))
        return Ran(codes, [log.read_text() for log in logs])

    def close(self) -> None:
        for p in self.started:
            if p.poll() is None:
                p.kill()
                p.wait(10)
