"""A three-step pipeline on a synapse cluster: preprocess, then train, then evaluate,
submitted at once as three jobs chained by dependencies — the shape of an Airflow or
Prefect task that hands the whole chain to the cluster instead of polling between steps.

The cluster starts each step as soon as the one before it succeeded (``afterok``); when a
step fails for good, the steps after it are cancelled with reason
``dependency_never_satisfied``. Each step's request id is derived from the run's name,
so running the pipeline again with the same ``--run`` (after a crash of the
orchestrator, say) finds the jobs already submitted instead of starting them twice.

    python examples/pipeline.py --run nightly-2026-11-27 --follow

The cluster and credentials come from the environment, as for synctl
(``SYNAPSE_CLUSTER``, ``SYNAPSE_TOKEN``, ``SYNAPSE_CA``/``SYNAPSE_CERT``/``SYNAPSE_KEY``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from synapse_ha.client import Cluster, Job, JobState, SynapseError


def step(name: str, replicas: int, script: str) -> dict[str, Any]:
    """One step's job spec: ``replicas`` CPU members running ``script``."""
    return {
        "name": name,
        "replicas": replicas,
        "resources": {"gpu": 0, "cpu": "500m", "memory": "256Mi"},
        "command": script,
        "time_limit": "10m",
        "retries": {"max": 1, "backoff": "5s"},
    }


STEPS = [
    step("preprocess", 1, 'echo "shards written"'),
    step("train", 2, 'echo "rank $RANK of $WORLD_SIZE trained"'),
    step("evaluate", 1, 'echo "accuracy 0.93"'),
]


def run(cluster: Cluster, run_name: str, follow: bool) -> int:
    jobs: list[Job] = []
    for spec in STEPS:
        previous = jobs[-1:]  # the step before, if any: this one starts after it succeeded
        job = cluster.submit(spec, request_id=f"{run_name}-{spec['name']}", after_ok=previous)
        print(f"{spec['name']}: {job.id}" + ("" if job.created else " (already submitted)"))
        jobs.append(job)
    for spec, job in zip(STEPS, jobs, strict=True):
        if follow:
            for line in job.logs(follow=True):
                print(f"  {spec['name']} {line}")
        info = job.wait()
        if info.state is not JobState.SUCCEEDED:
            print(f"{spec['name']} {info.state}: {info.reason}", file=sys.stderr)
            return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="the run's name (makes it idempotent)")
    parser.add_argument("--follow", action="store_true", help="print each step's output")
    args = parser.parse_args()
    try:
        with Cluster.from_env() as cluster:
            return run(cluster, args.run, args.follow)
    except SynapseError as err:
        print(f"pipeline stopped: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
