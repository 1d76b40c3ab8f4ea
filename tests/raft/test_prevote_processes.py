"""Pre-vote and check-quorum on three real replica processes: a follower paused for
longer than the connection timeout rejoins under the same leader in the same term, and a
leader that hears neither follower steps down after one election timeout (not after
``leader_step_down``, set far longer here)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from synapse_ha.core.membership import ReplicaRole
from synapse_ha.local.process import Replica
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.states import replica_role
from tests.integration.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.integration

# Longer than pysyncobj's connection timeout (3.5 s): the leader drops the paused
# follower's connection, which the follower sees as its leader's loss when it resumes.
PAUSE_S = 5.0
# Long enough for a resumed follower to have stood for election, had it done so.
SETTLE_S = 3.0
# The step-down the servers' fencing timeouts assume: far longer than any wait here.
SLOW_STEP_DOWN = ["--leader-step-down", "60s", "--dead-timeout", "90s"]


@pytest.fixture
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("prevote"), extra_args=SLOW_STEP_DOWN)
    try:
        c.start()
        c.serving_leader()
        yield c
    finally:
        for r in c.replicas:
            if r.paused:
                r.resume()
        c.close()


def _status(c: LocalCluster, r: Replica) -> pb.ReplicaStatus:
    return c.local_status(r)


def _follows(c: LocalCluster, follower: Replica, leader: Replica, term: int) -> bool:
    status = _status(c, follower)
    return status.leader_id == leader.replica_id and status.term == term


def test_a_paused_follower_rejoins_without_a_new_term(three: LocalCluster) -> None:
    leader = three.serving_leader()
    term = _status(three, leader).term
    follower = three.followers(leader)[0]
    follower.pause()
    try:
        time.sleep(PAUSE_S)
    finally:
        follower.resume()
    wait_for(
        "the follower to follow the same leader", lambda: _follows(three, follower, leader, term)
    )
    time.sleep(SETTLE_S)
    for r in three.replicas:
        status = _status(three, r)
        assert status.term == term, f"{r.replica_id} is in term {status.term}, not {term}"
        assert status.leader_id == leader.replica_id
    assert replica_role(_status(three, leader)) is ReplicaRole.LEADER


def test_a_leader_that_hears_no_follower_steps_down(three: LocalCluster) -> None:
    leader = three.serving_leader()
    followers = three.followers(leader)
    for f in followers:
        f.pause()
    try:
        wait_for(
            "the cut-off leader to step down",
            lambda: replica_role(_status(three, leader)) is not ReplicaRole.LEADER,
            timeout_s=20.0,
        )
    finally:
        for f in followers:
            f.resume()
    three.serving_leader()
