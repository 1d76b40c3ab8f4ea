"""An elastic gang whose kept members all exited 0 while the ranks it gave back still ran
succeeds once the last of those stops (its report, or its node declared dead); a
replica of a release before format 17 left it running forever."""

from __future__ import annotations

from synapse_ha.core import commands as c
from synapse_ha.core.machine.reports import SHRUNK_SUCCEEDS_FORMAT
from synapse_ha.core.model import AttemptState, JobState, MemberState
from synapse_ha.core.reasons import ReasonCode
from tests.core.harness import Cluster, job
from tests.core.test_elastic import elastic, racks, report, start


def shrunk_while_finishing(cluster: Cluster) -> str:
    """A gang of 3 (min 2) shrunk to 2 while rank 2 runs; ranks 0 and 1 then exit 0."""
    job_id = start(cluster, elastic(job(replicas=3, gpu=8), 2))
    attempt = cluster.state.jobs[job_id].attempt
    assert attempt is not None
    report(cluster, job_id, 0, c.MemberEventKind.EXITED)
    shrunk = cluster.do(c.ShrinkMembers(job_id, attempt.fencing_token, 2, "", cluster.now))
    assert shrunk.ok, shrunk.message
    report(cluster, job_id, 1, c.MemberEventKind.EXITED)
    assert cluster.state_of(job_id) is JobState.RUNNING  # rank 2 still runs
    return job_id


def test_the_gang_succeeds_when_the_rank_it_gave_back_reports_itself_stopped() -> None:
    cluster = racks()
    job_id = shrunk_while_finishing(cluster)
    report(cluster, job_id, 2, c.MemberEventKind.EXITED)
    job_ = cluster.state.jobs[job_id]
    assert job_.state is JobState.SUCCEEDED, job_.reason
    assert job_.attempt is not None and job_.attempt.state is AttemptState.SUCCEEDED
    assert len(job_.attempt.members) == 2
    assert job_.reason.code is ReasonCode.SUCCEEDED
    # Its GPUs are free: every node the gang used holds nothing.
    assert all(not n.allocated_gpus for n in cluster.state.nodes.values())


def test_the_gang_succeeds_when_the_node_of_the_rank_it_gave_back_is_declared_dead() -> None:
    cluster = racks()
    job_id = shrunk_while_finishing(cluster)
    attempt = cluster.state.jobs[job_id].attempt
    assert attempt is not None
    cluster.now += 20_000
    cluster.do(c.MarkNodeDead(attempt.members[2].node_id, "silent", 1, cluster.now))
    assert cluster.state_of(job_id) is JobState.SUCCEEDED, cluster.state.jobs[job_id].reason


def test_a_kept_member_still_running_keeps_the_gang_running() -> None:
    cluster = racks()
    job_id = start(cluster, elastic(job(replicas=3, gpu=8), 2))
    attempt = cluster.state.jobs[job_id].attempt
    assert attempt is not None
    report(cluster, job_id, 0, c.MemberEventKind.EXITED)
    assert cluster.do(c.ShrinkMembers(job_id, attempt.fencing_token, 2, "", cluster.now)).ok
    report(cluster, job_id, 2, c.MemberEventKind.EXITED)
    assert cluster.state_of(job_id) is JobState.RUNNING
    assert attempt.member_status[1].state is not MemberState.EXITED
    report(cluster, job_id, 1, c.MemberEventKind.EXITED)
    assert cluster.state_of(job_id) is JobState.SUCCEEDED


def test_below_format_17_the_gang_stays_running_as_earlier_releases_leave_it() -> None:
    cluster = racks()
    cluster.state.format_floor = SHRUNK_SUCCEEDS_FORMAT - 1
    job_id = shrunk_while_finishing(cluster)
    report(cluster, job_id, 2, c.MemberEventKind.EXITED)
    assert cluster.state_of(job_id) is JobState.RUNNING
