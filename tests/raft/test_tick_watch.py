"""Ticks of the Raft thread that start far apart are counted, measured and logged: the
cause to look for when a leader lost its term with every replica up."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from pysyncobj import SyncObj

from synapse_ha.local.ports import reserve_ports
from synapse_ha.local.waiting import wait_until
from synapse_ha.raft.replica import RaftReplica, RaftTiming
from synapse_ha.raft.tick_watch import Stall, TickWatch
from tests.integration.cluster import PASSWORD


def test_only_intervals_over_the_bound_are_stalls() -> None:
    watch = TickWatch()
    assert watch.tick(10.0, stall_after_s=0.2) is None  # the first tick has no interval
    assert watch.tick(10.02, stall_after_s=0.2) is None
    assert watch.tick(10.2, stall_after_s=0.2) is None  # 180 ms: under the bound
    assert watch.stalls == 0
    watch.ended(10.25)  # the tick took 50 ms; the next starts 450 ms after its end
    assert watch.tick(10.7, stall_after_s=0.2) == Stall(
        interval_s=pytest.approx(0.5), worked_s=pytest.approx(0.05), unlogged=0
    )
    assert watch.stalls == 1
    assert watch.longest_interval_s == pytest.approx(0.5)


def test_stalls_are_logged_once_per_period_with_the_count_in_between() -> None:
    watch = TickWatch(warn_every_s=10.0)
    now = 0.0
    logged = []
    for _ in range(5):  # a stall every second
        now += 1.0
        logged.append(watch.tick(now, stall_after_s=0.2))
    assert logged[0] is None  # the first tick
    assert logged[1] is not None and logged[1].unlogged == 0
    assert logged[2:] == [None, None, None]  # within 10 s of the line: counted only
    assert watch.stalls == 4
    now += 11.0
    line = watch.tick(now, stall_after_s=0.2)
    assert line is not None and line.unlogged == 3
    assert watch.longest_interval_s == pytest.approx(11.0)


@pytest.mark.integration
def test_a_long_tick_shows_in_the_status_and_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A real replica whose Raft thread does a second of work in one tick (a journal
    replayed, a snapshot decoded; here a sleep)."""
    original = SyncObj._onTick
    slow: list[bool] = []

    def one_slow_tick(self: SyncObj, time_to_wait: float = 0.0) -> None:
        original(self, time_to_wait)
        if not slow:
            slow.append(True)
            time.sleep(1.0)

    monkeypatch.setattr(SyncObj, "_onTick", one_slow_tick)
    ports = reserve_ports(1)
    address = f"127.0.0.1:{ports[0]}"
    caplog.set_level(logging.WARNING, logger="synapse_ha.raft.adapter")
    replica = RaftReplica(
        address, [address], str(tmp_path), PASSWORD, timing=RaftTiming(), secure=True
    )
    try:
        wait_until("the stall to be counted", lambda: replica.status().tick_stalls >= 1, 15.0)
        status = replica.status()
        assert status.tick_stalls == 1
        assert 1.0 <= status.longest_tick_interval_s < 5.0
        lines = [r.getMessage() for r in caplog.records if "Raft thread" in r.getMessage()]
        assert len(lines) == 1 and "ms apart" in lines[0]
        took = int(lines[0].split("the first took ")[1].split(" ms")[0])
        assert took >= 1000  # the work was in the tick, not a wait between two
    finally:
        replica.stop()
        wait_until("the Raft thread to end", lambda: not replica._sync.tick_thread_alive(), 15.0)
