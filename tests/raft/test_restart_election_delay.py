"""A replica restarted on an existing data directory stands for election only after
``restart_election_delay_s`` (the leader has reconnected to it by then, so it hears the
leader before it looks for one); a fresh one, or one alone in its cluster, uses its
normal election timeout."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pysyncobj import SyncObj
from pysyncobj.monotonic import monotonic as raft_clock

from synapse_ha.local.ports import reserve_ports
from synapse_ha.local.waiting import wait_until
from synapse_ha.raft.replica import RaftReplica, RaftTiming
from tests.integration.cluster import PASSWORD

pytestmark = pytest.mark.integration

TIMING = RaftTiming(restart_election_delay_s=30.0)


def _first_deadline_in(data_dir: Path, peers: int) -> float:
    """Seconds from now until the replica's first election deadline; the other members
    are not running, so it never stands for election here."""
    ports = reserve_ports(peers)
    addresses = [f"127.0.0.1:{p}" for p in ports]
    replica = RaftReplica(
        addresses[0], addresses, str(data_dir), PASSWORD, timing=TIMING, secure=True
    )
    try:
        deadline: float = replica._sync._SyncObj__raftElectionDeadline
        return deadline - raft_clock()
    finally:
        replica.stop()
        # Its files and sockets are closed by the Raft thread on its way out; the next
        # start in the same directory must not race it.
        wait_until("the Raft thread to end", lambda: not replica._sync.tick_thread_alive(), 15.0)


def test_a_restarted_replica_waits_before_its_first_election(tmp_path: Path) -> None:
    assert _first_deadline_in(tmp_path, peers=3) <= TIMING.election_max_s
    assert (tmp_path / "raft.journal").exists()
    assert _first_deadline_in(tmp_path, peers=3) > TIMING.restart_election_delay_s - 5


def test_a_replica_alone_in_its_cluster_does_not_wait(tmp_path: Path) -> None:
    assert _first_deadline_in(tmp_path, peers=1) <= TIMING.election_max_s
    assert _first_deadline_in(tmp_path, peers=1) <= TIMING.election_max_s


def test_a_slow_snapshot_load_does_not_use_up_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pysyncobj loads the snapshot on the Raft thread's first tick and checks the election
    deadline right after: a load longer than the restart delay must not start an election
    before the leader's waiting messages are read."""
    timing = RaftTiming(restart_election_delay_s=0.3)
    loaded: list[float] = []

    def slow_load(self: object, clearJournal: bool) -> None:  # pysyncobj passes it by name
        time.sleep(1.0)  # the fault: a large state decoding (the file itself is not read)
        loaded.append(raft_clock())  # pysyncobj's clock, not time.monotonic

    monkeypatch.setattr(SyncObj, "_SyncObj__loadDumpFile", slow_load)
    ports = reserve_ports(3)
    addresses = [f"127.0.0.1:{p}" for p in ports]
    first = RaftReplica(
        addresses[0], addresses, str(tmp_path), PASSWORD, timing=timing, secure=True
    )
    first.stop()
    wait_until("the Raft thread to end", lambda: not first._sync.tick_thread_alive(), 15.0)
    (tmp_path / "raft.dump").write_bytes(b"a snapshot")  # makes the first tick load it
    replica = RaftReplica(
        addresses[0], addresses, str(tmp_path), PASSWORD, timing=timing, secure=True
    )
    try:
        wait_until("the snapshot to load", lambda: bool(loaded), 15.0)
        wait_until(
            "the tick to end",
            lambda: replica._sync._SyncObj__raftElectionDeadline > loaded[0],
            15.0,
        )
        deadline: float = replica._sync._SyncObj__raftElectionDeadline
        assert deadline >= loaded[0] + timing.election_min_s - 0.05
    finally:
        replica.stop()
        wait_until("the Raft thread to end", lambda: not replica._sync.tick_thread_alive(), 15.0)


def test_a_long_tick_gives_a_follower_a_fresh_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replaying a journal of thousands of entries happens in one tick, between two reads
    of the socket: the deadline is pushed past the end of such a tick."""
    timing = RaftTiming(restart_election_delay_s=0.0)
    original = SyncObj._onTick
    long_ticks: list[float] = []

    def slow_first_tick(self: SyncObj, time_to_wait: float = 0.0) -> None:
        original(self, time_to_wait)
        if not long_ticks:
            time.sleep(0.5)  # the fault: a journal replayed in one tick
            long_ticks.append(raft_clock())

    monkeypatch.setattr(SyncObj, "_onTick", slow_first_tick)
    ports = reserve_ports(3)
    addresses = [f"127.0.0.1:{p}" for p in ports]
    replica = RaftReplica(
        addresses[0], addresses, str(tmp_path), PASSWORD, timing=timing, secure=True
    )
    try:
        wait_until("a long tick", lambda: bool(long_ticks), 15.0)
        wait_until(
            "the tick to end",
            lambda: replica._sync._SyncObj__raftElectionDeadline > long_ticks[-1],
            15.0,
        )
        deadline: float = replica._sync._SyncObj__raftElectionDeadline
        assert deadline >= long_ticks[-1] + timing.election_min_s - 0.05
    finally:
        replica.stop()
        wait_until("the Raft thread to end", lambda: not replica._sync.tick_thread_alive(), 15.0)
