"""Resources are held until confirmed free (DESIGN §4): with
``ClusterConfig.hold_until_stopped`` an ended attempt's member keeps its GPUs reserved on
its node until its exit is reported or its node is declared dead, so the next gang is
never bound to a GPU whose old member may still be stopping."""

from __future__ import annotations

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.model import ClusterState, JobState, Resources
from tests.core.harness import Cluster, job, node


def cluster(hold: bool, nodes: int = 2) -> Cluster:
    cl = Cluster(state=ClusterState(config=ClusterConfig(hold_until_stopped=hold)))
    assert cl.state.config.hold_until_stopped is hold
    cl.add(*(node(f"n{i}", gpus=8) for i in range(1, nodes + 1)))
    return cl


def running_gang(cl: Cluster, name: str = "a", replicas: int = 2) -> str:
    job_id = cl.submit(job(name, replicas=replicas, gpu=8))
    cl.run_pass()
    assert cl.state_of(job_id) is JobState.SCHEDULED
    cl.start_all(job_id)
    return job_id


def gpus_in_use(cl: Cluster, node_id: str) -> int:
    return cl.state.nodes[node_id].allocated.gpu


def test_without_the_switch_an_ended_attempt_frees_everything_at_once() -> None:
    cl = cluster(hold=False)
    a = running_gang(cl)
    assert cl.exit_member(a, 0, 1).ok  # rank 0 fails; rank 1 is still running
    assert cl.state_of(a) is JobState.FAILED
    assert gpus_in_use(cl, "n1") == gpus_in_use(cl, "n2") == 0
    assert cl.state.jobs[a].attempt.held == ()  # type: ignore[union-attr]


def test_a_member_not_confirmed_stopped_keeps_its_gpus_until_its_exit_is_reported() -> None:
    cl = cluster(hold=True)
    a = running_gang(cl)
    assert cl.exit_member(a, 0, 1).ok
    attempt = cl.state.jobs[a].attempt
    assert attempt is not None and cl.state_of(a) is JobState.FAILED
    assert attempt.held == (1,)
    assert gpus_in_use(cl, "n1") == 0  # rank 0 exited: its share is free
    assert gpus_in_use(cl, "n2") == 8
    assert cl.state.nodes["n2"].allocated_gpus == set(range(8))

    b = cl.submit(job("b", replicas=2, gpu=8))
    cl.run_pass()
    assert cl.state_of(b) is JobState.PENDING, "bound to a GPU whose member is still stopping"

    assert cl.exit_member(a, 1, 143).ok  # the worker confirms rank 1 stopped
    assert attempt.held == ()
    assert gpus_in_use(cl, "n2") == 0
    cl.run_pass()
    assert cl.state_of(b) is JobState.SCHEDULED


def test_a_node_declared_dead_frees_what_its_members_held() -> None:
    cl = cluster(hold=True)
    a = running_gang(cl)
    assert cl.exit_member(a, 0, 1).ok
    assert cl.do(c.MarkNodeDead("n2", "no heartbeat", 3, cl.now)).ok
    attempt = cl.state.jobs[a].attempt
    assert attempt is not None and attempt.held == ()
    assert cl.state.nodes["n2"].allocated == Resources()


def test_a_dead_node_keeps_the_hold_on_the_living_nodes_until_their_members_stop() -> None:
    cl = cluster(hold=True, nodes=3)
    a = running_gang(cl, replicas=3)
    assert cl.do(c.MarkNodeDead("n1", "no heartbeat", 3, cl.now)).ok
    assert cl.state_of(a) is JobState.PENDING  # requeued as a disruption
    attempt = cl.state.jobs[a].attempt
    assert attempt is not None
    assert attempt.held == (1, 2)  # ranks 1 and 2 on n2, n3: still stopping
    assert gpus_in_use(cl, "n2") == gpus_in_use(cl, "n3") == 8

    cl.add(node("n4", gpus=8), node("n5", gpus=8), node("n6", gpus=8))
    b = cl.submit(job("b", replicas=3, gpu=8))
    cl.run_pass()
    placed = cl.state.jobs[b].attempt
    assert placed is not None and cl.state_of(b) is JobState.SCHEDULED
    assert not {"n2", "n3"} & set(cl.nodes_of(b)), "placed on a node whose members still stop"

    for rank in (1, 2):
        assert cl.exit_member(a, rank, 143).ok
    assert attempt.held == ()
    assert gpus_in_use(cl, "n2") == gpus_in_use(cl, "n3") == 0


def test_a_cancelled_job_is_kept_while_it_holds_and_purged_once_free() -> None:
    cl = cluster(hold=True)
    a = running_gang(cl)
    assert cl.do(c.CancelJob(a, now_ms=cl.now)).ok
    attempt = cl.state.jobs[a].attempt
    assert attempt is not None and attempt.held == (0, 1)
    late = cl.now + cl.state.config.retention_ms + 1
    assert cl.do(c.PurgeFinished(late)).ok
    assert a in cl.state.jobs, "purged while its members still held GPUs"
    cl.now = late
    for rank in (0, 1):
        assert cl.exit_member(a, rank, 143).ok
    assert cl.do(c.PurgeFinished(late + 1)).ok
    assert a not in cl.state.jobs
    assert gpus_in_use(cl, "n1") == gpus_in_use(cl, "n2") == 0


def test_turning_the_switch_off_keeps_the_holds_already_taken() -> None:
    cl = cluster(hold=True)
    a = running_gang(cl)
    assert cl.exit_member(a, 0, 1).ok
    assert cl.do(c.Configure(ClusterConfig(hold_until_stopped=False))).ok
    attempt = cl.state.jobs[a].attempt
    assert attempt is not None and attempt.held == (1,)  # freed by its exit, as promised
    assert cl.exit_member(a, 1, 0).ok
    assert attempt.held == () and gpus_in_use(cl, "n2") == 0
