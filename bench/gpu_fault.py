"""GPU fault to requeue on loopback: how long from a GPU failing to the scheduler acting.

Starts 3 scheduler replicas and 2 to 4 ``synapse-worker`` agents with mock GPUs on
127.0.0.1, each reading its own ``--mock-gpu-faults`` file, at the production heartbeat
interval (1 s). One-GPU gangs running ``sleep`` fill some of the GPUs; then, one at a
time, a fault (``<gpu> xid 79``) is appended to the file of the worker running one of
them, naming the GPU that gang holds, and two instants are taken from just before the
append (polling every 10 ms):

* ``recorded``: the node's ``gpu_faults`` (ListNodes) names the GPU;
* ``requeued``: the gang's ``requeues`` has grown (GetJob).

The worker reads its file every 200 ms and sends a heartbeat as soon as its list of
unhealthy GPUs changes; the leader records the fault and requeues the gang in one
command. Targets: p50 <= 5 s and max <= 15 s for both. Each requeued gang must then run
again on another GPU (``replaced_off_the_gpu`` counts those that did within 20 s).

Prints one JSON object; writes it to bench/results/gpu_fault.json unless ``--smoke``
(2 workers, 2 faults: a test runs it).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loopback import loopback_cluster, percentile, wait_for
from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.model import JobState
from synapse_ha.local.waiting import WaitTimeout
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.states import job_state

RESULT = Path(__file__).resolve().parent / "results" / "gpu_fault.json"
TARGET_P50_MS = 5000
TARGET_MAX_MS = 15000
HEARTBEAT = "1s"
POLL_S = 0.01


def _running(client: ClusterClient, job_id: str, attempt: int = 1) -> pb.Job | None:
    job = client.get_job(job_id)
    live = job_state(job) is JobState.RUNNING and job.attempt.number >= attempt
    return job if live and job.attempt.members else None


def _wait_running(client: ClusterClient, job_id: str) -> pb.Job:
    return wait_for(f"{job_id} to run", lambda: _running(client, job_id), timeout_s=60)


def _names_gpu(client: ClusterClient, node_id: str, gpu: int) -> bool:
    nodes = [n for n in client.list_nodes() if n.node_id == node_id]
    return bool(nodes) and any(f.gpu == gpu for f in nodes[0].gpu_faults)


def inject(client: ClusterClient, faults: dict[str, Path], job: pb.Job) -> tuple[float, float]:
    """Fail the GPU ``job``'s member holds; (recorded, requeued) in ms from the append."""
    member = job.attempt.members[0]
    gpu = member.gpus[0]
    started = time.monotonic()
    with faults[member.node_id].open("a") as f:
        f.write(f"{gpu} xid 79\n")
    recorded = requeued = 0.0
    deadline = started + 60
    while not (recorded and requeued):
        if time.monotonic() > deadline:
            raise RuntimeError(f"GPU {gpu} of {member.node_id}: no requeue within 60 s")
        if not recorded and _names_gpu(client, member.node_id, gpu):
            recorded = (time.monotonic() - started) * 1000
        if not requeued and client.get_job(job.job_id).requeues > job.requeues:
            requeued = (time.monotonic() - started) * 1000
        time.sleep(POLL_S)
    return recorded, requeued


def _moved(client: ClusterClient, job: pb.Job) -> bool:
    """The requeued gang runs again, on another GPU."""
    member = job.attempt.members[0]
    try:
        again = wait_for(
            "the gang to run again",
            lambda: _running(client, job.job_id, job.attempt.number + 1),
            timeout_s=20,
        )
    except WaitTimeout:
        return False
    moved = again.attempt.members[0]
    return (moved.node_id, list(moved.gpus)) != (member.node_id, list(member.gpus))


def measure(n_faults: int, n_workers: int, gpus: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="synapse-bench-") as tmp:
        root = Path(tmp)
        faults = {f"w{i + 1}": root / f"faults-w{i + 1}" for i in range(n_workers)}
        capacity = ["--mock-gpus", str(gpus), "--cpu", "64", "--memory", "256Gi"]
        nodes = [(n, [*capacity, "--mock-gpu-faults", str(path)]) for n, path in faults.items()]
        with loopback_cluster(root, HEARTBEAT, nodes) as client:
            spec = pb.JobSpec(
                name="holds-a-gpu",
                replicas=1,
                resources=pb.Resources(cpu_milli=100, memory_mib=64, gpu=1),
                shell_command="sleep 3600",
            )
            job_ids = [client.submit_job(spec).job_id for _ in range(n_faults)]
            jobs = [_wait_running(client, j) for j in job_ids]
            timings = [inject(client, faults, job) for job in jobs]
            moved = sum(_moved(client, job) for job in jobs)
    recorded = [t[0] for t in timings]
    requeued = [t[1] for t in timings]
    return {
        "recorded_ms_p50": round(percentile(recorded, 0.5), 1),
        "recorded_ms_max": round(max(recorded), 1),
        "requeued_ms_p50": round(percentile(requeued, 0.5), 1),
        "requeued_ms_max": round(max(requeued), 1),
        "replaced_off_the_gpu": moved,
    }


def run(n_faults: int, n_workers: int, gpus: int) -> dict[str, object]:
    if not 2 <= n_workers <= 4:
        raise SystemExit("--workers: 2 to 4")
    if not 1 <= n_faults <= n_workers * gpus // 2:
        raise SystemExit(f"--faults: 1 to {n_workers * gpus // 2} (half the GPUs)")
    figures = measure(n_faults, n_workers, gpus)
    worst_p50 = max(figures["recorded_ms_p50"], figures["requeued_ms_p50"])
    worst_max = max(figures["recorded_ms_max"], figures["requeued_ms_max"])
    return {
        "benchmark": "gpu_fault",
        "replicas": 3,
        "workers": n_workers,
        "gpus_per_worker": gpus,
        "faults": n_faults,
        "heartbeat_interval": HEARTBEAT,
        **figures,
        "target": {"p50_ms": TARGET_P50_MS, "max_ms": TARGET_MAX_MS},
        "meets_target": worst_p50 <= TARGET_P50_MS and worst_max <= TARGET_MAX_MS,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="2 faults on 2 workers")
    p.add_argument("--faults", type=int, default=10)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--gpus", type=int, default=8, help="mock GPUs per worker")
    args = p.parse_args()
    report = run(2, 2, 4) if args.smoke else run(args.faults, args.workers, args.gpus)
    text = json.dumps(report, indent=2)
    print(text)
    if not args.smoke:
        RESULT.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
