"""Raft replicas in this process, on loopback ports, for the tests of elections."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from synapse_ha.local.ports import reserve_ports
from synapse_ha.local.waiting import wait_until
from synapse_ha.raft.replica import RaftReplica, RaftTiming
from tests.integration.cluster import PASSWORD


@contextmanager
def replicas_of(tmp_path: Path, timings: Sequence[RaftTiming]) -> Iterator[list[RaftReplica]]:
    """One replica per timing (data under ``tmp_path``), all stopped on the way out and
    their Raft threads waited for."""
    addresses = [f"127.0.0.1:{p}" for p in reserve_ports(len(timings))]
    replicas: list[RaftReplica] = []
    try:
        for i, (address, timing) in enumerate(zip(addresses, timings, strict=True)):
            data = tmp_path / f"r{i}"
            data.mkdir()
            replicas.append(
                RaftReplica(address, addresses, str(data), PASSWORD, timing=timing, secure=True)
            )
        yield replicas
    finally:
        for replica in replicas:
            replica.stop()
        for replica in replicas:
            sync = replica._sync
            wait_until("the Raft thread to end", lambda: not sync.tick_thread_alive(), 15.0)  # noqa: B023
