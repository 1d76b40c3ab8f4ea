"""Online membership changes on real processes: add, remove, replace, and refusals."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.codec.versioned import decode_state
from synapse_ha.rpc.errors import Reason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.integration.cluster import (
    LocalCluster,
    Replica,
    job_spec,
    membership_change,
    register_request,
    wait_for,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    # Compacting often: a replica added later catches up from a snapshot, not the log.
    c = LocalCluster(tmp_path, extra_args=["--compaction-entries", "20"])
    try:
        c.start()
        c.serving_leader()
        yield c
    finally:
        c.close()


def _refusal(call: object) -> Reason:
    assert callable(call)
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return failure_of(caught.value).reason


def _same_state(cluster: LocalCluster, replicas: list[Replica]) -> str | None:
    """The one state digest of ``replicas`` when they all agree, else None."""
    with cluster.client() as client:
        digests = {client.replica_state(r.grpc).state_sha256 for r in replicas}
    return digests.pop() if len(digests) == 1 else None


def _member_ids(answer: pb.MembershipResponse) -> list[str]:
    return sorted(m.replica_id for m in answer.members)


def test_add_a_replica_then_remove_the_first_and_writes_still_commit(
    cluster: LocalCluster,
) -> None:
    with cluster.client(timeout_s=30.0) as client:
        client.register_node(register_request("n1", "127.0.0.1", gpu=8))
        jobs = [client.submit_job(job_spec(f"before-{i}")).job_id for i in range(30)]
        r4 = cluster.add_replica("r4")
        answer = membership_change(lambda: client.add_replica("r4", r4.raft, r4.grpc))
        assert _member_ids(answer) == ["r1", "r2", "r3", "r4"]
        cluster.start(r4)
        # The new replica catches up: the very same encoded state as the others.
        members = [cluster.replica(i) for i in ("r1", "r2", "r3", "r4")]
        wait_for("r4 caught up", lambda: _same_state(cluster, members), timeout_s=60.0)
        state = decode_state(client.replica_state(r4.grpc).encoded_state)
        assert set(jobs) <= set(state.jobs) and "n1" in state.nodes

        # A second replica with the same id or address is refused with its reason.
        assert (
            _refusal(lambda: client.add_replica("r4", "127.0.0.1:1", "127.0.0.1:2"))
            is Reason.REPLICA_EXISTS
        )
        assert _refusal(lambda: client.remove_replica("r9")) is Reason.REPLICA_NOT_FOUND

        # Remove r1 (whoever leads: a leader hands over first), then stop it.
        answer = membership_change(lambda: client.remove_replica("r1"))
        assert _member_ids(answer) == ["r2", "r3", "r4"]
        cluster.replica("r1").stop()

        after = client.submit_job(job_spec("after-remove")).job_id
        rest = [cluster.replica(i) for i in ("r2", "r3", "r4")]
        wait_for("the rest converge", lambda: _same_state(cluster, rest), timeout_s=30.0)
        assert after in decode_state(client.replica_state(r4.grpc).encoded_state).jobs

        # The replica list clients learn follows the membership.
        status = client.cluster_status()
        assert sorted(r.replica_id for r in status.replicas) == ["r2", "r3", "r4"]
        assert r4.grpc in {r.grpc_address for r in status.replicas}

    # A client that knows only the original replicas (r1 now gone) still finds the leader.
    old_list = [cluster.replica(i).grpc for i in ("r1", "r2", "r3")]
    with ClusterClient(
        old_list, timeout_s=30.0, channel_factory=cluster.transport.channel
    ) as old_client:
        assert old_client.get_job(after).job_id == after


def test_replace_a_dead_replica_with_two_commands(cluster: LocalCluster) -> None:
    leader = cluster.serving_leader()
    dead, alive = cluster.followers(leader)
    with cluster.client(timeout_s=30.0) as client:
        client.register_node(register_request("n1", "127.0.0.1", gpu=8))
        cluster.kill(dead)
        r4 = cluster.add_replica("r4")
        # With one replica down, adding a fourth (needs 3 live of 4) or removing a live
        # one (needs 2 live of 2) would leave no quorum: refused, with the reason.
        assert (
            _refusal(lambda: client.add_replica("r4", r4.raft, r4.grpc)) is Reason.WOULD_LOSE_QUORUM
        )
        assert _refusal(lambda: client.remove_replica(alive.replica_id)) is Reason.WOULD_LOSE_QUORUM
        # The documented replacement: remove the dead one, add the new one.
        removed = membership_change(lambda: client.remove_replica(dead.replica_id))
        assert dead.replica_id not in _member_ids(removed)
        assert "r4" in _member_ids(
            membership_change(lambda: client.add_replica("r4", r4.raft, r4.grpc))
        )
        cluster.start(r4)
        job = client.submit_job(job_spec("after-replace")).job_id
        members = [leader, alive, r4]
        wait_for("r4 caught up", lambda: _same_state(cluster, members), timeout_s=60.0)
        assert job in decode_state(client.replica_state(r4.grpc).encoded_state).jobs
