"""Relayed heartbeats on a real cluster (``--relay-heartbeats``): workers stream their
heartbeats to followers, which forward them to the leader, and a running gang survives
a frozen follower and a frozen leader (no member killed, same attempt, no node declared
dead)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.local.process import Replica
from tests.integration.cluster import LocalCluster, pausable_cluster, wait_for
from tests.integration.test_frozen_leader import RunningGang
from tests.worker.test_integration_worker import start_workers
from tests.worker.workers import LocalWorkers, workers_of

pytestmark = pytest.mark.integration

FREEZE_S = 6.0  # past the lease (4 s): a worker left on the frozen replica would fence
STREAM_AT = re.compile(r"heartbeat streams at (\S+)")
ANY_STREAM = re.compile(r"heartbeats on a stream to .+? at (\S+)")
RELAYED_TO = re.compile(r"heartbeats on a stream to a follower that relays them at (\S+)")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with pausable_cluster(tmp_path / "cluster", ["--relay-heartbeats"]) as c:
        yield c


@pytest.fixture
def workers(cluster: LocalCluster, tmp_path: Path) -> Iterator[LocalWorkers]:
    with workers_of(cluster, tmp_path / "workers") as w:
        yield w


def _stream_owner(cluster: LocalCluster, address: str) -> Replica:
    for r in cluster.replicas:
        found = STREAM_AT.search(r.log_path.read_text(errors="replace"))
        if found and found.group(1) == address:
            return r
    raise AssertionError(f"no replica serves streams at {address}")


def _relayed_addresses(workers: LocalWorkers) -> list[str] | None:
    """The followers' stream addresses the workers said they use, once there are two."""
    found: list[str] = RELAYED_TO.findall(workers.logs())
    return found if len(found) >= 2 else None


def test_a_gang_on_relayed_streams_survives_a_frozen_follower_and_a_frozen_leader(
    cluster: LocalCluster, workers: LocalWorkers, tmp_path: Path
) -> None:
    with cluster.client(timeout_s=30.0) as client:
        wait_for(
            "every replica to read format 8",
            lambda: client.cluster_status().format_floor == FORMAT,
            30,
        )
        start_workers(workers, client, 2)
        running = RunningGang.start(client, "relayed", tmp_path / "out")
    # The workers registered while the followers announced themselves, or re-register
    # once they have: each ends on a follower's stream.
    relayed = wait_for(
        "both workers on followers' streams",
        lambda: _relayed_addresses(workers),
        30,
    )
    leader = cluster.serving_leader()
    holders = [_stream_owner(cluster, a) for a in relayed]
    assert all(h is not leader for h in holders)
    # A follower holding streams freezes: its workers move to another replica's stream.
    follower = holders[0]
    follower.pause()
    try:
        time.sleep(FREEZE_S)
    finally:
        follower.resume()
    for worker in workers.workers:
        now_at = ANY_STREAM.findall(worker.log_path.read_text(errors="replace"))[-1]
        assert _stream_owner(cluster, now_at) is not follower, f"{worker.node_id} stayed"
    # The leader freezes: the followers relay to the new one.
    old = cluster.serving_leader()
    old.pause()
    try:
        new = cluster.serving_leader(timeout_s=30)
        assert new is not old
        time.sleep(FREEZE_S)
    finally:
        old.resume()
    running.assert_survived(cluster, workers)
