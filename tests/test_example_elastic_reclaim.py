"""An elastic gang gives quota back to a reclaim on real processes (one replica, three
workers of one mock GPU each; core/scheduler/shrink_victims.py): queue b's elastic gang
borrows queue a's idle GPU; when a gang of queue a needs its nominal GPU back, the leader
shrinks the elastic gang by its top rank rather than preempt it whole, the rank given
back is stopped by its worker, the others keep running, and a's gang starts on the
freed node."""

from __future__ import annotations

import sys

import pytest

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.spec.document import parse_job_spec
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.to_proto import spec_to_proto
from tests.integration.cluster import wait_for
from tests.test_example_elastic import EXAMPLE, MEMBER, member_dirs, one, running, said
from tests.worker.one_replica import OneReplica

pytestmark = pytest.mark.integration
__all__ = ["one"]  # the fixture, used by name

SLEEPER = ["sleep", "600"]


def submit(client: ClusterClient, name: str, command: list[str], queue: str, **more: object) -> str:
    """A job of ``queue`` as its spec file would give it."""
    doc = {"name": name, "replicas": 1, "resources": MEMBER, "command": command, "queue": queue}
    doc.update(more)
    return client.submit_job(spec_to_proto(parse_job_spec(doc).spec)).job_id


def test_a_reclaim_shrinks_an_elastic_borrower_rather_than_preempt_it_whole(
    one: OneReplica,
) -> None:
    client, workers = one.client, one.workers
    client.set_queue(pb.Queue(name="a", gpu=1, cohort="lab"))
    client.set_queue(pb.Queue(name="b", gpu=2, cohort="lab", max_priority=5))
    argv = [sys.executable, str(EXAMPLE), "--steps", "0", "--step-s", "0.02"]
    gang = submit(client, "elastic", argv, "b", replicas={"min": 1, "max": 3}, priority=5)
    job = running(client, gang, 3)  # b's 2 GPUs and a's idle one
    top = job.attempt.members[2].node_id
    said(workers, gang, 2, "rank 2: started")
    needy = submit(client, "needy", SLEEPER, "a")
    # a takes its nominal GPU back: the gang gives back its top rank, not itself whole.
    assert running(client, needy, 1).attempt.members[0].node_id == top
    job = running(client, gang, 2)
    assert job.attempt.number == 1 and job.attempts_made == 1
    said(workers, gang, 2, "rank 2: stopped at step")
    for rank in (0, 1):
        (member_dir,) = member_dirs(workers, gang, rank)
        assert not (member_dir / "exit.json").exists()
        said(workers, gang, rank, f"rank {rank}: membership 1: world size 2")
    wait_for("the gang still running", lambda: client.get_job(gang).state == "RUNNING")
    for job_id in (needy, gang):
        client.cancel_job(job_id)
