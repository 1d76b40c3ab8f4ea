"""GetReplicaState: every replica answers from its own copy, and copies converge."""

from __future__ import annotations

import hashlib

import pytest

from synapse_ha.core import invariants
from synapse_ha.core.codec.versioned import decode_state
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.integration.cluster import LocalCluster, job_spec, register_request, wait_for

pytestmark = pytest.mark.integration


def _states(cluster: LocalCluster) -> dict[str, pb.GetReplicaStateResponse]:
    with cluster.client() as client:
        return {r.replica_id: client.replica_state(r.grpc) for r in cluster.replicas if r.alive}


def test_every_replica_answers_with_its_own_state_and_they_converge(
    fresh_cluster: LocalCluster,
) -> None:
    fresh_cluster.start()
    fresh_cluster.serving_leader()
    with fresh_cluster.client() as client:
        client.register_node(register_request("n1", "127.0.0.1", gpu=8))
        job_id = client.submit_job(job_spec("converge", replicas=2, gpu=2)).job_id

    def converged() -> dict[str, pb.GetReplicaStateResponse] | None:
        states = _states(fresh_cluster)
        digests = {s.state_sha256 for s in states.values()}
        if len(states) == 3 and len(digests) == 1:
            return states
        return None

    states = wait_for("identical replica states", converged, timeout_s=20.0)
    assert sorted(states) == ["r1", "r2", "r3"]
    for replica_id, answer in states.items():
        assert answer.replica_id == replica_id
        assert answer.state_sha256 == hashlib.sha256(answer.encoded_state).hexdigest()
        assert answer.last_applied > 0
        state = decode_state(answer.encoded_state)
        assert invariants.check(state) == []
        assert job_id in state.jobs
        assert "n1" in state.nodes


def test_a_replica_without_a_quorum_still_answers_locally(fresh_cluster: LocalCluster) -> None:
    fresh_cluster.start()
    leader = fresh_cluster.serving_leader()
    with fresh_cluster.client() as client:
        client.register_node(register_request("n1", "127.0.0.1", gpu=4))
    survivor = fresh_cluster.followers(leader)[0]

    def has_node() -> bool:
        with fresh_cluster.client() as client:
            state = decode_state(client.replica_state(survivor.grpc).encoded_state)
        return "n1" in state.nodes

    wait_for("the follower to apply the registration", has_node)
    for r in fresh_cluster.replicas:
        if r is not survivor:
            fresh_cluster.kill(r)
    with fresh_cluster.client() as client:
        answer = client.replica_state(survivor.grpc)
    assert answer.replica_id == survivor.replica_id
    assert "n1" in decode_state(answer.encoded_state).nodes
