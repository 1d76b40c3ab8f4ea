"""The follower's AppendEntries rules (synapse_ha.raft.adapter): a re-sent, shorter
message deletes nothing the follower acknowledged, and a follower vouches only for what
the leader sent; and no replica forwards a command to the leader. Each case runs against
pysyncobj's own SyncObj too, to show the bug the correction exists for."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
from pysyncobj import pickle as raft_pickle
from pysyncobj.syncobj import _RAFT_STATE

from synapse_ha.local.ports import reserve_ports
from synapse_ha.raft.adapter import (
    TESTED_PYSYNCOBJ,
    SafeSyncObj,
    UntestedPysyncobj,
    check_pysyncobj_version,
    conflict_free,
)

Entry = tuple[bytes, int, int]


class Follower:
    """A SyncObj that never ticks: messages are handed to its handler directly and what it
    sends back is recorded."""

    def __init__(self, cls: type[SyncObj], log: list[Entry], term: int) -> None:
        me, peer = (f"127.0.0.1:{p}" for p in reserve_ports(2))
        self.obj = cls(me, [peer], conf=SyncObjConf(autoTick=False))
        self.sent: list[dict[str, Any]] = []
        self.obj._SyncObj__transport.send = lambda node, message: self.sent.append(message)
        journal = self.obj._SyncObj__raftLog
        journal.clear()
        for entry in log:
            journal.add(*entry)
        self.obj._SyncObj__raftCurrentTerm = term
        self.leader = next(iter(self.obj._SyncObj__otherNodes))

    def receive(self, message: dict[str, Any]) -> None:
        self.obj._SyncObj__onMessageReceived(self.leader, {"type": "append_entries", **message})

    def log(self) -> list[tuple[int, int]]:
        journal = self.obj._SyncObj__raftLog
        return [(journal[i][1], journal[i][2]) for i in range(len(journal))]

    @property
    def commit_index(self) -> int:
        return int(self.obj._SyncObj__raftCommitIndex)

    def acks(self) -> list[tuple[int, bool]]:
        return [
            (m["next_node_idx"], m["success"]) for m in self.sent if m["type"] == "next_node_idx"
        ]

    def close(self) -> None:
        self.obj.destroy()


def entry(index: int, term: int) -> Entry:
    return (b"\x01command-%d" % index, index, term)


@pytest.fixture
def follower() -> Iterator[Any]:
    made: list[Follower] = []

    def make(cls: type[SyncObj], log: list[Entry], term: int) -> Follower:
        made.append(Follower(cls, log, term))
        return made[-1]

    yield make
    for f in made:
        f.close()


ACKED = [entry(1, 0), entry(2, 1), entry(3, 1), entry(4, 1)]


def test_a_shorter_resend_deletes_nothing_the_follower_acknowledged(follower: Any) -> None:
    f = follower(SafeSyncObj, ACKED, term=1)
    # The leader's next index for this follower went back to 2 (a late reply), and the
    # re-sent message carries entry 2 only.
    f.receive(
        {"term": 1, "commit_index": 1, "prevLogIdx": 1, "prevLogTerm": 0, "entries": [entry(2, 1)]}
    )
    assert f.log() == [(1, 0), (2, 1), (3, 1), (4, 1)]
    assert f.acks() == [(3, True)]  # it vouches for what it was sent, no more


def test_pysyncobj_alone_deletes_acknowledged_entries_on_a_shorter_resend(follower: Any) -> None:
    f = follower(SyncObj, ACKED, term=1)
    f.receive(
        {"term": 1, "commit_index": 1, "prevLogIdx": 1, "prevLogTerm": 0, "entries": [entry(2, 1)]}
    )
    assert f.log() == [(1, 0), (2, 1)]  # entries 3 and 4, acknowledged before, are gone


def test_an_exact_resend_deletes_nothing(follower: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    f = follower(SafeSyncObj, ACKED, term=1)
    journal = f.obj._SyncObj__raftLog
    deleted: list[int] = []
    real = journal.deleteEntriesFrom
    monkeypatch.setattr(journal, "deleteEntriesFrom", lambda i: (deleted.append(i), real(i)))
    f.receive(
        {
            "term": 1,
            "commit_index": 4,
            "prevLogIdx": 1,
            "prevLogTerm": 0,
            "entries": [entry(2, 1), entry(3, 1), entry(4, 1)],
        }
    )
    assert deleted == []  # pysyncobj alone deletes 2..4 and appends them again
    assert f.log() == [(1, 0), (2, 1), (3, 1), (4, 1)]
    assert (f.commit_index, f.acks()) == (4, [(5, True)])


def test_a_heartbeat_behind_the_log_deletes_nothing_and_commits_only_what_it_covers(
    follower: Any,
) -> None:
    # Entries 3 and 4 are of an older term the new leader may not have.
    f = follower(SafeSyncObj, [entry(1, 0), entry(2, 1), entry(3, 2), entry(4, 2)], term=3)
    f.receive({"term": 3, "commit_index": 4, "prevLogIdx": 2, "prevLogTerm": 1, "entries": []})
    assert f.log() == [(1, 0), (2, 1), (3, 2), (4, 2)]
    assert f.commit_index == 2
    assert f.acks() == [(3, True)]


def test_a_conflicting_entry_deletes_from_the_conflict_on(follower: Any) -> None:
    f = follower(SafeSyncObj, [entry(1, 0), entry(2, 1), entry(3, 2), entry(4, 2)], term=3)
    f.receive(
        {
            "term": 3,
            "commit_index": 3,
            "prevLogIdx": 1,
            "prevLogTerm": 0,
            "entries": [entry(2, 1), entry(3, 3)],
        }
    )
    assert f.log() == [(1, 0), (2, 1), (3, 3)]
    assert f.commit_index == 3
    assert f.acks() == [(4, True)]


def test_new_entries_after_held_ones_are_appended(follower: Any) -> None:
    f = follower(SafeSyncObj, ACKED[:3], term=1)
    f.receive(
        {
            "term": 1,
            "commit_index": 4,
            "prevLogIdx": 1,
            "prevLogTerm": 0,
            "entries": [entry(2, 1), entry(3, 1), entry(4, 1), entry(5, 1)],
        }
    )
    assert f.log() == [(1, 0), (2, 1), (3, 1), (4, 1), (5, 1)]
    assert f.commit_index == 4
    assert f.acks() == [(6, True)]


def test_a_message_whose_previous_entry_differs_is_rejected(follower: Any) -> None:
    f = follower(SafeSyncObj, ACKED, term=2)
    f.receive({"term": 2, "commit_index": 4, "prevLogIdx": 3, "prevLogTerm": 2, "entries": []})
    assert f.log() == [(1, 0), (2, 1), (3, 1), (4, 1)]
    assert f.acks() == [(3, False)]


def test_a_chunked_entry_marked_last_too_early_is_still_received_whole(follower: Any) -> None:
    f = follower(SafeSyncObj, ACKED[:2], term=1)
    big = (b"\x01" + b"x" * 200, 3, 1)
    data = raft_pickle.dumps(big)
    chunks = [data[i : i + 64] for i in range(0, len(data), 64)]
    marks = ["start"] + ["process"] * (len(chunks) - 3) + ["finish", "finish"]
    for mark, chunk in zip(marks, chunks, strict=True):
        f.receive(
            {
                "term": 1,
                "commit_index": 2,
                "prevLogIdx": 2,
                "prevLogTerm": 1,
                "transmission": mark,
                "data": chunk,
            }
        )
    assert f.log() == [(1, 0), (2, 1), (3, 1)]
    assert f.obj._SyncObj__raftLog[2][0] == big[0]
    assert f.acks()[-1] == (4, True)
    assert all(not ok for _, ok in f.acks()[:-1])


@pytest.mark.parametrize(
    ("entries", "prev", "kept", "cap"),
    [
        ([], 4, [], 3),  # a heartbeat behind a longer log: moved to its end, ack capped
        ([entry(3, 1)], 4, [], 4),
        ([entry(3, 1), entry(4, 1)], 4, [], 5),  # an exact re-send: nothing deleted
        ([entry(3, 1), entry(4, 1), entry(5, 1)], 4, [entry(5, 1)], None),
        ([entry(3, 9)], 2, [entry(3, 9)], None),  # a conflict right away: unchanged
    ],
)
def test_conflict_free_rewrites(
    entries: list[Entry], prev: int, kept: list[Entry], cap: int | None
) -> None:
    message = {"prevLogIdx": 2, "prevLogTerm": 1, "entries": entries, "commit_index": 9}
    fixed, got_cap = conflict_free(ACKED, message)
    assert (fixed["prevLogIdx"], fixed["entries"], got_cap) == (prev, kept, cap)
    assert fixed["commit_index"] == (9 if cap is None else cap - 1)


# ---------------------------------------------------------------- no forwarding


def queued_on_a_deposed_leader(f: Follower) -> list[tuple[object, int]]:
    """A command proposed while this replica led, drained after it learned of a newer
    leader (a paused leader resumed): what becomes of it."""
    outcome: list[tuple[object, int]] = []
    f.obj._applyCommand(
        b"\x01mark-node-dead", lambda result, error: outcome.append((result, error))
    )
    f.obj._SyncObj__raftLeader = f.leader  # stepped down; the new leader is known
    f.obj._checkCommandsToApply()
    return outcome


def test_a_command_queued_on_a_replica_that_no_longer_leads_is_refused(follower: Any) -> None:
    f = follower(SafeSyncObj, ACKED, 3)
    assert queued_on_a_deposed_leader(f) == [(None, FAIL_REASON.REQUEST_DENIED)]
    assert [m for m in f.sent if m["type"] == "apply_command"] == []


def test_pysyncobj_alone_forwards_it_to_the_new_leader(follower: Any) -> None:
    f = follower(SyncObj, ACKED, 3)
    assert queued_on_a_deposed_leader(f) == []  # waiting for the leader's answer
    (forwarded,) = [m for m in f.sent if m["type"] == "apply_command"]
    assert forwarded["command"] == b"\x01mark-node-dead"


@pytest.mark.parametrize("cls", [SafeSyncObj, SyncObj])
def test_a_leader_appends_a_forwarded_command_only_without_the_correction(
    follower: Any, cls: type[SyncObj]
) -> None:
    f = follower(cls, ACKED, 3)
    f.obj._SyncObj__raftState = _RAFT_STATE.LEADER
    f.obj._SyncObj__raftLeader = f.obj._SyncObj__selfNode
    f.obj._SyncObj__onMessageReceived(
        f.leader, {"type": "apply_command", "command": b"\x01stale", "request_id": 9}
    )
    f.obj._checkCommandsToApply()
    appended = [e for e in f.log() if e[0] > len(ACKED)]
    replies = [m for m in f.sent if m["type"] == "apply_command_response"]
    if cls is SafeSyncObj:
        assert appended == []
        assert replies == [
            {"type": "apply_command_response", "request_id": 9, "error": FAIL_REASON.REQUEST_DENIED}
        ]
    else:
        assert appended == [(len(ACKED) + 1, 3)]
        assert replies[0]["log_idx"] == len(ACKED) + 1


def test_the_leader_still_appends_its_own_commands(follower: Any) -> None:
    f = follower(SafeSyncObj, ACKED, 3)
    f.obj._SyncObj__raftState = _RAFT_STATE.LEADER
    f.obj._SyncObj__raftLeader = f.obj._SyncObj__selfNode
    f.obj._applyCommand(b"\x01bind", lambda result, error: None)
    f.obj._checkCommandsToApply()
    assert f.log()[-1] == (len(ACKED) + 1, 3)


def test_a_pysyncobj_release_other_than_the_adapted_one_is_refused() -> None:
    check_pysyncobj_version(TESTED_PYSYNCOBJ)
    with pytest.raises(UntestedPysyncobj, match=r"pysyncobj 0\.3\.18 is installed.*==0\.3\.17"):
        check_pysyncobj_version("0.3.18")
    # The installed release is the adapted one (pyproject pins it).
    check_pysyncobj_version()
