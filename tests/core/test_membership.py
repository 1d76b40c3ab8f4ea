"""The membership-change rule: one change at a time, and never below a live majority."""

from __future__ import annotations

import pytest

from synapse_ha.core.membership import (
    MembershipCode,
    MemberView,
    check_add,
    check_remove,
    majority,
)


def members(live: str, down: str = "") -> list[MemberView]:
    """Members named by letters: ``live`` ones, then ``down`` ones."""
    out = []
    for name, is_live in [(c, True) for c in live] + [(c, False) for c in down]:
        i = ord(name) - ord("a") + 1
        out.append(MemberView(name, f"10.0.0.{i}:7001", f"10.0.0.{i}:7101", is_live))
    return out


@pytest.mark.parametrize(("n", "need"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3)])
def test_majority(n: int, need: int) -> None:
    assert majority(n) == need


@pytest.mark.parametrize(
    ("live", "down", "code"),
    [
        ("abc", "", None),  # 3 live of 4 after
        ("ab", "c", MembershipCode.WOULD_LOSE_QUORUM),  # 2 live, 4 need 3
        ("abcd", "e", None),  # 4 live, 6 need 4
        ("abc", "de", MembershipCode.WOULD_LOSE_QUORUM),  # 3 live, 6 need 4
        ("a", "", None),  # a cluster of one may only grow by waiting
        ("ab", "", None),
    ],
)
def test_add(live: str, down: str, code: MembershipCode | None) -> None:
    refusal = check_add(members(live, down), "z", "10.0.0.99:7001", "10.0.0.99:7101", False)
    assert (refusal.code if refusal else None) is code


@pytest.mark.parametrize(
    ("target", "live", "down", "code"),
    [
        ("c", "ab", "c", None),  # the dead one, 2 live of 2
        ("b", "ab", "c", MembershipCode.WOULD_LOSE_QUORUM),  # a live one while c is down
        ("a", "abc", "", None),
        ("e", "abc", "de", None),  # 3 live of 4
        ("c", "abc", "de", MembershipCode.WOULD_LOSE_QUORUM),  # 2 live of 4
        ("x", "abc", "", MembershipCode.REPLICA_NOT_FOUND),
        ("a", "a", "", MembershipCode.LAST_REPLICA),
    ],
)
def test_remove(target: str, live: str, down: str, code: MembershipCode | None) -> None:
    refusal = check_remove(members(live, down), target, False)
    assert (refusal.code if refusal else None) is code


def test_one_change_at_a_time() -> None:
    add = check_add(members("abc"), "z", "h:1", "h:2", in_flight=True)
    remove = check_remove(members("abc"), "a", in_flight=True)
    assert add is not None and add.code is MembershipCode.CHANGE_IN_FLIGHT
    assert remove is not None and remove.code is MembershipCode.CHANGE_IN_FLIGHT


@pytest.mark.parametrize(
    ("replica_id", "raft", "grpc"),
    [("a", "h:1", "h:2"), ("z", "10.0.0.1:7001", "h:2"), ("z", "h:1", "10.0.0.2:7101")],
)
def test_an_id_or_address_in_use_is_refused(replica_id: str, raft: str, grpc: str) -> None:
    refusal = check_add(members("abc"), replica_id, raft, grpc, False)
    assert refusal is not None and refusal.code is MembershipCode.REPLICA_EXISTS


def test_refusals_name_the_replicas() -> None:
    refusal = check_remove(members("ab", "c"), "b", False)
    assert refusal is not None
    assert "down or behind: c" in refusal.message and "removing b" in refusal.message
