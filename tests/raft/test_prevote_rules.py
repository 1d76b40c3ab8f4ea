"""The pre-vote decisions (:mod:`synapse_ha.raft.prevote`): when a member grants, how a
round counts replies, and which vote requests a follower ignores."""

from __future__ import annotations

import pytest
from pysyncobj.monotonic import monotonic as raft_clock

from synapse_ha.raft.prevote import (
    LOST,
    OPEN,
    PRE_VOTE_REPLY,
    STALE,
    WON,
    PreVoteMixin,
    PreVoteRound,
    PreVoteState,
    grant_pre_vote,
    is_majority,
    leader_heard_within,
    log_up_to_date,
)


def _won(state: PreVoteState) -> int | None:
    return state.won_term


def _grant(**changes: object) -> bool:
    args: dict[str, object] = {
        "proposed_term": 5,
        "current_term": 4,
        "candidate_log": (10, 4),
        "own_log": (10, 4),
        "leads": False,
        "leader_recent": False,
    }
    args.update(changes)
    return grant_pre_vote(**args)  # type: ignore[arg-type]


def test_a_member_without_a_leader_grants_an_up_to_date_candidate() -> None:
    assert _grant()
    assert _grant(candidate_log=(11, 4))
    assert _grant(candidate_log=(3, 5), own_log=(10, 4))  # a later last term wins


def test_a_member_refuses_a_candidate_whose_log_is_behind() -> None:
    assert not _grant(candidate_log=(9, 4))
    assert not _grant(candidate_log=(20, 3), own_log=(10, 4))


def test_a_member_that_heard_a_leader_or_leads_refuses() -> None:
    assert not _grant(leader_recent=True)
    assert not _grant(leads=True)


def test_a_member_refuses_a_term_below_its_own() -> None:
    assert not _grant(proposed_term=3, current_term=4)
    assert _grant(proposed_term=4, current_term=4)


def test_log_order_and_leader_window() -> None:
    assert log_up_to_date((5, 2), (5, 2))
    assert not log_up_to_date((4, 2), (5, 2))
    assert leader_heard_within(10.0, 10.3, 0.4)
    assert not leader_heard_within(10.0, 10.4, 0.4)
    assert not leader_heard_within(None, 10.0, 0.4)


@pytest.mark.parametrize(
    ("votes", "voters", "majority"),
    [
        (1, 1, True),
        (1, 2, False),
        (2, 2, True),
        (1, 3, False),
        (2, 3, True),
        (2, 4, False),
        (3, 5, True),
    ],
)
def test_majority_counts_this_member(votes: int, voters: int, majority: bool) -> None:
    assert is_majority(votes, voters) is majority


def test_a_round_is_won_with_a_majority_of_grants() -> None:
    round_ = PreVoteRound(number=1, term=5, voters=5)
    assert round_.record("a", 1, 5, True) == OPEN
    assert round_.record("a", 1, 5, True) == OPEN  # a repeated reply counts once
    assert round_.record("b", 1, 5, True) == WON


def test_a_round_is_lost_once_a_majority_cannot_grant() -> None:
    round_ = PreVoteRound(number=1, term=5, voters=3)
    assert round_.record("a", 1, 5, False) == OPEN
    assert round_.record("b", 1, 5, False) == LOST


def test_replies_to_another_round_are_stale() -> None:
    state = PreVoteState(window_s=0.4)
    first = state.start_round(term=5, voters=3)
    second = state.start_round(term=5, voters=3)
    old = {"round": first.number, "term": 5, "granted": True}
    assert state.reply("a", old) == STALE
    assert state.reply("a", {"round": second.number, "term": 4, "granted": True}) == STALE
    assert _won(state) is None
    assert state.reply("a", {"round": second.number, "term": 5, "granted": True}) == WON
    assert _won(state) == 5
    assert state.reply("b", {"round": second.number, "term": 5, "granted": True}) == STALE


def test_a_single_voter_wins_at_once() -> None:
    state = PreVoteState(window_s=0.4)
    state.start_round(term=2, voters=1)
    assert state.won_term == 2


def test_hearing_a_leader_ends_the_round() -> None:
    state = PreVoteState(window_s=0.4)
    number = state.start_round(term=5, voters=3).number
    state.heard_leader(100.0)
    assert state.reply("a", {"round": number, "term": 5, "granted": True}) == STALE
    assert state.won_term is None


def test_a_follower_that_heard_its_leader_ignores_higher_terms() -> None:
    state = PreVoteState(window_s=0.4)
    assert not state.ignores_request_vote("a", 6, 5, now=100.0)  # no leader heard yet
    state.heard_leader(100.0)
    assert state.ignores_request_vote("a", 6, 5, now=100.2)
    assert not state.ignores_request_vote("a", 5, 5, now=100.2)  # not a higher term
    assert not state.ignores_request_vote("a", 6, 5, now=100.5)  # the leader is silent


def test_a_lost_leader_counts_as_not_heard() -> None:
    state = PreVoteState(window_s=0.4)
    state.heard_leader(100.0)
    state.lost_leader(100.05)
    assert state.leader_lost
    assert state.retries_soon(100.1)
    assert not state.retries_soon(100.9)  # two shortest election timeouts later
    assert not state.leader_recent(100.1)
    assert not state.ignores_request_vote("a", 6, 5, now=100.1)


def test_an_announced_transfer_election_is_accepted() -> None:
    state = PreVoteState(window_s=0.4)
    state.heard_leader(100.0)
    state.transfer_terms["a"] = 6
    assert not state.ignores_request_vote("a", 6, 5, now=100.1)
    assert state.ignores_request_vote("b", 6, 5, now=100.1)
    assert state.ignores_request_vote("a", 7, 5, now=100.1)


def test_an_unreachable_voter_counts_as_refusing() -> None:
    state = PreVoteState(window_s=0.4)
    state.start_round(term=5, voters=3)
    assert state.unreachable(["dead"]) == OPEN  # the third member may still grant
    number = state.round.number if state.round is not None else -1
    assert state.reply("b", {"round": number, "term": 5, "granted": False}) == LOST
    assert state.round is None
    assert state.unreachable(["dead"]) == STALE  # no round open


class _Member(PreVoteMixin):
    """A follower whose Raft state the mixin reads and sets through the adapter's public
    methods; ``reachable`` are the members a message can be sent to."""

    def __init__(self, reachable: set[str]) -> None:
        self.reachable = reachable
        self.sent: list[tuple[str, dict[str, object]]] = []
        self.deadline = 0.0
        self.enable_pre_vote(window_s=0.4)
        self.leader_loss_stagger_s = 0.1

    def self_node(self) -> str:
        return "me"

    def role(self) -> str:
        return "follower"

    def election_deadline(self) -> float:
        return self.deadline

    def set_election_deadline(self, deadline: float) -> None:
        self.deadline = deadline

    def fresh_election_timeout(self) -> float:
        return 60.0

    def connected_to_anyone(self) -> bool:
        return bool(self.reachable)

    def term(self) -> int:
        return 4

    def other_nodes(self) -> list[str]:
        return ["leader", "peer"]

    def transfer_in_progress(self) -> bool:
        return False

    def last_log_entry(self) -> tuple[int, int]:
        return (10, 4)

    def send_to(self, node: str, message: dict[str, object]) -> bool:
        if node not in self.reachable:
            return False
        self.sent.append((node, message))
        return True


def test_after_losing_the_leader_a_refused_round_is_retried_soon() -> None:
    member = _Member(reachable={"peer"})
    assert member.pre_vote is not None
    member.pre_vote.lost_leader(raft_clock())
    member._pre_vote_tick()
    assert [node for node, _ in member.sent] == ["peer"]
    assert member.deadline > raft_clock() + 30  # waiting out a fresh election timeout
    (_, request), reply = member.sent[0], {"type": PRE_VOTE_REPLY, "granted": False}
    reply.update(term=request["term"], round=request["round"])
    # The peer had not yet seen the leader's connection close: it refuses. The leader
    # never answers; counted as refusing, the round is lost and retried in 25 ms.
    assert member._pre_vote_message("peer", reply)
    assert member.deadline < raft_clock() + 0.1
