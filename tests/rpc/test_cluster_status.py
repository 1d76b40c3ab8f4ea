"""GetClusterStatus: the job counts it reports, against the state it reads."""

from __future__ import annotations

from synapse_ha.core import commands as cmd
from synapse_ha.core.machine import apply
from synapse_ha.core.model import JobState
from synapse_ha.core.scheduler import schedule
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.core.harness import job
from tests.rpc.authed import NOW, serving_replica


def test_the_status_counts_jobs_pending_and_holding_resources() -> None:
    with serving_replica() as replica:
        state = replica.backend.state
        with replica.backend.lock:
            # Two 1-GPU jobs are queued already; three 2-GPU ones join them on two
            # 2-GPU nodes: one pass binds some, the rest wait, one is cancelled.
            for i in range(3):
                assert apply(state, cmd.SubmitJob(job(f"big{i}", gpu=2), f"big{i}", NOW)).ok
            bind = schedule(state, NOW).command(NOW)
            assert bind is not None and apply(state, bind).ok
            waiting = [j.job_id for j in state.jobs.values() if j.state is JobState.PENDING]
            assert apply(state, cmd.CancelJob(waiting[0], NOW)).ok
            held = {JobState.SCHEDULED, JobState.RUNNING}
            pending = [j for j in state.jobs.values() if j.state is JobState.PENDING]
            holding = [j for j in state.jobs.values() if j.state in held]
        assert pending and holding and len(pending) + len(holding) < len(state.jobs)
        answer = replica.scheduler.GetClusterStatus(
            pb.GetClusterStatusRequest(local_only=True),
            metadata=[("authorization", f"Bearer {replica.tokens['admin']}")],
        )
        assert (answer.jobs, answer.pending_jobs, answer.running_jobs) == (
            len(state.jobs),
            len(pending),
            len(holding),
        )
        assert answer.nodes == 2
