"""A synapse_ha cluster on 127.0.0.1 for the start-latency benchmarks.

Three scheduler replicas and mock-GPU ``synapse-worker`` agents, started and torn down
together; members of the measured gangs write the wall-clock time they started to a file
(``date +%s.%N``), read back with :func:`read_stamps`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.model import JobState
from synapse_ha.local.launcher import Launcher
from synapse_ha.local.replicas import LocalReplicas
from synapse_ha.local.waiting import RPC_ERRORS, wait_until
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.states import job_state

T = TypeVar("T")


def wait_for(
    what: str, probe: Callable[[], T | None], timeout_s: float = 15.0, every_s: float = 0.05
) -> T:
    """Call ``probe`` until it returns something other than None/False; bounded."""
    return wait_until(what, probe, timeout_s, every_s=every_s, retry_on=RPC_ERRORS)


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of ``values`` (0 <= q <= 1)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def read_stamps(paths: list[Path], deadline: float) -> list[float]:
    """Every member's start time, once all have written theirs; bounded by ``deadline``."""
    while True:
        try:
            return [float(p.read_text()) for p in paths]
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise RuntimeError(f"members did not start in time: {paths[0].name}...") from None
            time.sleep(0.002)


def gang_start_latencies(client: ClusterClient, out: Path, gangs: int, members: int) -> list[float]:
    """Submit ``gangs`` gangs of ``members`` one-GPU members one after another; for each,
    the milliseconds from just before SubmitJob until its last member's process wrote its
    start time (into ``out``). Each gang finishes before the next is submitted."""
    latencies: list[float] = []
    for g in range(gangs):
        spec = pb.JobSpec(
            name=f"gang-{g}",
            replicas=members,
            resources=pb.Resources(cpu_milli=1000, memory_mib=1024, gpu=1),
            shell_command=f"date +%s.%N > {out}/$SYNAPSE_JOB_ID-$RANK",
        )
        submitted = time.time()
        job_id = client.submit_job(spec).job_id
        paths = [out / f"{job_id}-{r}" for r in range(members)]
        stamps = read_stamps(paths, time.monotonic() + 30)
        latencies.append((max(stamps) - submitted) * 1000)
        wait_for(
            f"{job_id} to finish",
            lambda j=job_id: job_state(client.get_job(j)) is JobState.SUCCEEDED,  # type: ignore[misc]
            timeout_s=30,
            every_s=0.01,
        )
    return latencies


@contextlib.contextmanager
def loopback_cluster(
    root: Path, heartbeat: str, workers: Sequence[tuple[str, Sequence[str]]]
) -> Iterator[ClusterClient]:
    """Start 3 replicas and one agent per ``(node_id, extra_args)``; yield a client.

    Returns once every agent has registered; stops every process on the way out.
    """
    launcher = Launcher(root / "logs")
    cluster = LocalReplicas(
        root / "cluster",
        extra_args=["--heartbeat-interval", heartbeat, "--log-level", "WARNING"],
        launcher=launcher,
    )
    try:
        cluster.start()
        cluster.serving_leader()
        for node_id, args in workers:
            launcher.start(
                launcher.worker(
                    cluster.grpc_addresses,
                    node_id,
                    root / "workers" / node_id,
                    extra=[
                        "--no-cgroups",
                        "--stop-grace",
                        "1s",
                        "--fence-grace",
                        "200ms",
                        *args,
                        "--log-level",
                        "WARNING",
                    ],
                )
            )
        with cluster.client() as client:
            wait_for(
                "workers to register",
                lambda: len(client.list_nodes()) == len(workers),
                timeout_s=60,
            )
            yield client
    finally:
        launcher.close()
