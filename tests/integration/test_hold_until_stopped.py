"""Resources are held until confirmed free (DESIGN §4), on real processes: with
``--hold-until-stopped`` a cancelled gang's GPU stays reserved while its member takes
its time to stop after SIGTERM, and the next gang that needs that GPU is bound only after
the worker has confirmed the member's exit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.codec.versioned import decode_state
from synapse_ha.core.model import ClusterState, JobState
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.states import job_state
from tests.integration.cluster import LocalCluster, one_worker_cluster, wait_for

pytestmark = pytest.mark.integration

# Stops 3 s after SIGTERM: the window in which the old member still runs.
SLOW_TO_STOP = "trap 'sleep 3; exit 143' TERM; while true; do sleep 0.2; done"


def _spec(name: str, command: str) -> pb.JobSpec:
    return pb.JobSpec(
        name=name,
        replicas=1,
        resources=pb.Resources(cpu_milli=100, memory_mib=64, gpu=1),
        shell_command=command,
    )


def _state(cluster: LocalCluster, client: ClusterClient) -> ClusterState:
    leader = cluster.serving_leader()
    return decode_state(client.replica_state(leader.grpc).encoded_state)


@pytest.fixture
def held_cluster() -> Iterator[tuple[LocalCluster, ClusterClient]]:
    flags = ["--mock-gpus", "1", "--no-cgroups", "--stop-grace", "20s"]
    with one_worker_cluster("synapse-hold-", flags, ["--hold-until-stopped"]) as made:
        yield made


def test_the_next_gang_is_bound_only_after_the_old_member_is_confirmed_stopped(
    held_cluster: tuple[LocalCluster, ClusterClient],
) -> None:
    cluster, client = held_cluster
    wait_for(
        "the leader to raise the format and replicate hold_until_stopped",
        lambda: (
            (s := _state(cluster, client)).format_floor == FORMAT and s.config.hold_until_stopped
        ),
        30.0,
    )
    old = client.submit_job(_spec("old", SLOW_TO_STOP), request_id="old").job_id
    wait_for("the old gang to run", lambda: job_state(client.get_job(old)) is JobState.RUNNING)
    client.cancel_job(old, "make room")
    new = client.submit_job(_spec("new", "sleep 1"), request_id="new").job_id

    # While the old member stops, its GPU is held: the new gang waits.
    state = _state(cluster, client)
    attempt = state.jobs[old].attempt
    assert attempt is not None and state.jobs[old].state is JobState.CANCELLED
    if attempt.held:  # not yet confirmed stopped: the node still counts the GPU
        assert state.nodes["w1"].allocated_gpus == {0}
        assert state.jobs[new].state is JobState.PENDING

    def new_bound() -> ClusterState | None:
        s = _state(cluster, client)
        return s if s.jobs[new].attempt is not None else None

    state = wait_for("the new gang to be bound", new_bound, 30.0)
    stopped = state.jobs[old].attempt
    bound = state.jobs[new].attempt
    assert stopped is not None and bound is not None
    finished = stopped.member_status[0].finished_at_ms
    assert finished is not None, "the new gang was bound before the old member's exit"
    assert bound.bound_at_ms >= finished
    assert stopped.held == ()
    assert stopped.ended_at_ms is not None and finished - stopped.ended_at_ms >= 2_000, (
        "the old member stopped at once: the test did not hold anything"
    )
