"""A requeue its owner asks for (``scontrol requeue``, ``synctl cancel --requeue``): the
live attempt stops, the job waits again in its place, uses neither a retry nor a
disruption requeue, and its next attempt waits for every member to be confirmed
stopped (the fencing rule)."""

from __future__ import annotations

from synapse_ha.core import commands as c
from synapse_ha.core.codec.versioned import decode_command, encode_command
from synapse_ha.core.model import AttemptState, JobState
from synapse_ha.core.reasons import ReasonCode, render
from tests.core.harness import Cluster, job, node
from tests.core.test_disruptions import confirm_stopped, two_node_gang


def test_a_running_gang_is_requeued_in_place_and_rebinds_only_once_stopped() -> None:
    cl, j = two_node_gang(retries=0)
    cl.start_all(j)
    old = cl.state.jobs[j].attempt
    assert old is not None
    result = cl.do(c.RequeueJob(j, "checkpointed before the time limit", now_ms=cl.now))
    assert result.ok, result.message
    record = cl.state.jobs[j]
    assert record.state is JobState.PENDING
    assert (record.requeues, record.retries_used) == (0, 0)
    assert old.state is AttemptState.REQUEUED
    assert old.outcome is not None and old.outcome.code is ReasonCode.REQUEUE_REQUESTED
    assert record.reason.code is ReasonCode.REQUEUED_BY_REQUEST
    assert "checkpointed before the time limit" in render(record.reason)
    cl.run_pass()  # its members are not confirmed stopped yet
    assert cl.state_of(j) is JobState.PENDING
    confirm_stopped(cl, j)
    cl.run_pass()
    assert cl.state_of(j) is JobState.SCHEDULED
    assert cl.state.jobs[j].fencing_token > old.fencing_token


def test_requeues_by_request_never_exhaust_max_requeues() -> None:
    cl, j = two_node_gang(retries=0)
    for _ in range(cl.state.config.max_requeues + 2):
        cl.start_all(j)
        assert cl.do(c.RequeueJob(j, now_ms=cl.now)).ok
        confirm_stopped(cl, j)
        cl.run_pass()
    assert cl.state_of(j) is JobState.SCHEDULED


def test_what_holds_no_nodes_is_refused_and_left_as_it_was() -> None:
    cl = Cluster()
    cl.add(node("n1", gpus=8), node("n2", gpus=8))
    pending = cl.submit(job(replicas=2, gpu=8))  # no pass yet: pending
    before = encode_command(c.RequeueJob(pending))
    refused = cl.do(c.RequeueJob(pending, now_ms=cl.now))
    assert refused.code is c.ResultCode.CONFLICT
    assert "holds no nodes" in refused.message
    assert cl.state_of(pending) is JobState.PENDING
    assert cl.do(c.RequeueJob("job-999999")).code is c.ResultCode.NOT_FOUND
    cl.run_pass()
    cl.start_all(pending)
    cl.exit_member(pending, 0, 0)
    cl.exit_member(pending, 1, 0)
    done = pending
    assert cl.state_of(done) is JobState.SUCCEEDED
    refused = cl.do(c.RequeueJob(done, now_ms=cl.now))
    assert refused.code is c.ResultCode.CONFLICT and "submit it again" in refused.message
    assert decode_command(before) == c.RequeueJob(pending)


def test_a_requeue_needs_the_format_every_replica_of_this_release_reads() -> None:
    from synapse_ha.core.codec.formats import format_needed

    assert format_needed(c.RequeueJob("job-000001")) == 13  # an older replica cannot apply it
    assert format_needed(c.CancelJob("job-000001")) < 13
