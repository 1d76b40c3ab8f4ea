"""RaftReplica's membership changes on a real one-replica pysyncobj cluster (loopback):
one change at a time, and the member list the replica reports."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from synapse_ha.core.membership import MembershipCode, MembershipRefusal
from synapse_ha.local.ports import reserve_ports
from synapse_ha.local.waiting import wait_until
from synapse_ha.raft.replica import RaftReplica
from tests.integration.cluster import PASSWORD

pytestmark = pytest.mark.integration


@pytest.fixture
def spare_port() -> int:
    (port,) = reserve_ports(1)
    return port


@pytest.fixture
def alone(tmp_path: Path) -> Iterator[RaftReplica]:
    raft_port, grpc_port = reserve_ports(2)
    me = f"127.0.0.1:{raft_port}"
    replica = RaftReplica(
        me,
        [me],
        str(tmp_path),
        PASSWORD,
        secure=True,
        directory={me: ("r1", f"127.0.0.1:{grpc_port}")},
    )
    try:
        wait_until("r1 leads alone", replica.is_leader, 15.0, every_s=0.02)
        yield replica
    finally:
        replica.stop()


def test_members_carry_their_id_and_grpc_address(alone: RaftReplica) -> None:
    (member,) = alone.members()
    assert (member.replica_id, member.raft, member.live) == ("r1", alone.self_address, True)
    assert member.grpc.startswith("127.0.0.1:")


def test_a_second_change_waits_for_the_first(alone: RaftReplica, spare_port: int) -> None:
    # A cluster of one may grow; the new member never starts, so the change stays in
    # flight (a cluster of two needs both to commit).
    first = alone.add_member("r2", f"127.0.0.1:{spare_port}", "127.0.0.1:1")
    assert not isinstance(first, MembershipRefusal)
    second = alone.add_member("r3", "127.0.0.1:2", "127.0.0.1:3")
    assert isinstance(second, MembershipRefusal)
    assert second.code is MembershipCode.CHANGE_IN_FLIGHT
    removal = alone.remove_member("r2")
    assert isinstance(removal, MembershipRefusal)
    assert removal.code is MembershipCode.CHANGE_IN_FLIGHT
    assert alone.change_in_flight()
    # The leader takes the new member into account as soon as the entry is appended.
    wait_until(
        "r2 among the members",
        lambda: sorted(m.replica_id for m in alone.member_addresses()) == ["r1", "r2"],
        10.0,
        every_s=0.02,
    )
