"""Pre-vote and leader stickiness (Raft thesis §9.6, §4.2.3) for
:class:`~synapse_ha.raft.adapter.SafeSyncObj`, which pysyncobj 0.3.17 lacks.

**Pre-vote.** When a follower's (or a candidate's) election deadline passes, it does not
raise its term at once: it sends ``pre_vote`` (the term it would stand in, its last log
index and term, a round number) to the voting members and pushes its deadline out by a
fresh election timeout. A member grants (``pre_vote_reply``) only when it is not the
leader, has not heard from a leader within the shortest election timeout, the proposed
term is not below its own and the candidate's log is at least as up to date as its own
(:func:`grant_pre_vote`); answering changes nothing on the member (term, vote, state,
deadline). With a majority of grants, itself included, the replica's deadline is set to
now and pysyncobj starts the real election (term + 1, ``request_vote``). A member the
request cannot be sent to (no connection: a leader whose process ended) counts as
refusing, so a round is lost as soon as the members it reached refuse. Without a
majority, the round lapses with the deadline: the next one is a new round, and replies to an older
round are ignored. A replica restarted after a long snapshot load, or a follower
rejoining after a partition, therefore no longer deposes a healthy leader: the others
still hear the leader and refuse.

**Stickiness.** A follower that heard from a leader within the shortest election timeout
ignores a ``request_vote`` of a higher term (it neither adopts the term nor votes): a
member that skipped pre-vote (an older release) gets no votes from them while they hear
the leader (the leader itself still adopts a higher term it is sent, as pysyncobj does).
Two exceptions keep the fast paths: a follower whose connection to its leader closed
(the leader-loss path of :mod:`synapse_ha.raft.adapter`) counts the leader as not heard,
so the survivors grant each other at once; a failed round on that path (another survivor
had not yet seen the connection close) is retried after a quarter of the leader-loss
stagger (before the next survivor's turn) instead of a whole election timeout, for two
shortest election timeouts after the loss. And a
leadership transfer (pysyncobj's ``timeout_now``) skips pre-vote: its target sends
``transfer_vote`` (the term it is about to stand in) just before its ``request_vote`` on
the same connection, and the members accept that one request despite their leader.

**Rolling upgrade.** pysyncobj handles a message by its type and ignores a type it does
not know: a replica of an earlier release drops ``pre_vote`` and ``transfer_vote``
without answering and keeps the connection. A replica of this release thus needs grants
from a majority running this release to stand for election; the earlier ones time out
and elect among themselves as before (with a higher term, which the members of this
release accept once they no longer hear the old leader).

:class:`PreVoteMixin` is a base of ``SafeSyncObj`` only, and reads and sets the Raft state
through its public methods (the adapter is the module that names pysyncobj's private
state).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pysyncobj.monotonic import monotonic as raft_clock

log = logging.getLogger(__name__)

PRE_VOTE = "pre_vote"
PRE_VOTE_REPLY = "pre_vote_reply"
TRANSFER_VOTE = "transfer_vote"

WON = "won"
LOST = "lost"
OPEN = "open"
STALE = "stale"


def log_up_to_date(candidate: tuple[int, int], own: tuple[int, int]) -> bool:
    """Whether a log ending at ``candidate`` (index, term) is at least as up to date as
    one ending at ``own`` (Raft §5.4.1: the later last term wins, then the longer log)."""
    return (candidate[1], candidate[0]) >= (own[1], own[0])


def leader_heard_within(last_contact: float | None, now: float, window_s: float) -> bool:
    """Whether a leader was heard (at ``last_contact``, None: not since the leader was
    lost or ever) within ``window_s`` before ``now``."""
    return last_contact is not None and now - last_contact < window_s


def grant_pre_vote(
    *,
    proposed_term: int,
    current_term: int,
    candidate_log: tuple[int, int],
    own_log: tuple[int, int],
    leads: bool,
    leader_recent: bool,
) -> bool:
    """The answer to a ``pre_vote``: grant only when this member neither leads nor heard
    a leader recently, the proposed term is not below its own and the candidate's log
    (index, term) is at least as up to date as its own."""
    if leads or leader_recent or proposed_term < current_term:
        return False
    return log_up_to_date(candidate_log, own_log)


def is_majority(votes: int, voters: int) -> bool:
    """Whether ``votes`` of ``voters`` members (this one included in both) are a
    majority."""
    return votes > voters / 2


@dataclass
class PreVoteRound:
    """One pre-vote round: ``voters`` members in all, this one's grant counted."""

    number: int
    term: int
    voters: int
    granted: set[Any] = field(default_factory=set)
    denied: set[Any] = field(default_factory=set)

    def outcome(self) -> str:
        if is_majority(1 + len(self.granted), self.voters):
            return WON
        if not is_majority(self.voters - len(self.denied), self.voters):
            return LOST
        return OPEN

    def record(self, voter: Any, number: int, term: int, granted: bool) -> str:
        """Count a reply of ``voter``: :data:`STALE` for another round's, else the
        round's outcome (:data:`WON`, :data:`LOST` or :data:`OPEN`)."""
        if number != self.number or term != self.term:
            return STALE
        if voter not in self.granted and voter not in self.denied:
            (self.granted if granted else self.denied).add(voter)
        return self.outcome()


class PreVoteState:
    """A replica's pre-vote bookkeeping: the open round, whether it was won, when a
    leader was last heard and the transfer elections announced to it."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s  # the shortest election timeout
        self.last_leader_contact: float | None = None
        self.leader_lost = False
        self.lost_at = 0.0
        self.round: PreVoteRound | None = None
        self.won_term: int | None = None
        self._rounds = 0
        self.transfer_terms: dict[Any, int] = {}

    def heard_leader(self, now: float) -> None:
        self.last_leader_contact = now
        self.leader_lost = False
        self.round = None
        self.won_term = None

    def lost_leader(self, now: float) -> None:
        self.last_leader_contact = None
        self.leader_lost = True
        self.lost_at = now

    def retries_soon(self, now: float) -> bool:
        """Whether a lost round is retried after the leader-loss stagger rather than a
        whole election timeout: within two shortest election timeouts of losing the
        leader's connection (the other survivors may not have seen it close yet)."""
        return self.leader_lost and now - self.lost_at < 2 * self.window_s

    def leader_recent(self, now: float) -> bool:
        return leader_heard_within(self.last_leader_contact, now, self.window_s)

    def start_round(self, term: int, voters: int) -> PreVoteRound:
        self._rounds += 1
        self.round = PreVoteRound(self._rounds, term, voters)
        self.won_term = term if self.round.outcome() == WON else None
        return self.round

    def reply(self, voter: Any, message: dict[str, Any]) -> str:
        current = self.round
        if current is None:
            return STALE
        outcome = current.record(
            voter, int(message["round"]), int(message["term"]), bool(message["granted"])
        )
        return self._settle(current, outcome)

    def unreachable(self, voters: list[Any]) -> str:
        """Count ``voters`` the open round's request could not be sent to (no connection
        to them) as refusals: they cannot answer this round. The round's outcome, or
        :data:`STALE` without a round."""
        current = self.round
        if current is None:
            return STALE
        outcome = current.outcome()
        for voter in voters:
            outcome = current.record(voter, current.number, current.term, False)
        return self._settle(current, outcome)

    def _settle(self, current: PreVoteRound, outcome: str) -> str:
        if outcome == WON:
            self.won_term = current.term
            self.round = None
        elif outcome == LOST:
            self.round = None
        return outcome

    def ignores_request_vote(self, voter: Any, term: int, current_term: int, now: float) -> bool:
        """Whether a follower drops a ``request_vote`` for ``term`` (stickiness)."""
        if term <= current_term or not self.leader_recent(now):
            return False
        return self.transfer_terms.get(voter) != term


class PreVoteMixin:
    """The pre-vote hooks of :class:`~synapse_ha.raft.adapter.SafeSyncObj` (module
    docstring). ``pre_vote`` None: pysyncobj's elections, unchanged."""

    pre_vote: PreVoteState | None = None
    leader_loss_stagger_s: float | None = None

    def enable_pre_vote(self, window_s: float) -> None:
        """Pre-vote and stickiness, with ``window_s`` (the shortest election timeout) as
        the time a leader counts as recently heard."""
        self.pre_vote = PreVoteState(window_s)

    def _pre_vote_tick(self) -> None:
        """Before pysyncobj's tick: a passed election deadline starts a pre-vote round
        instead of an election, unless the round before was won (or a transfer runs)."""
        state: PreVoteState | None = self.pre_vote
        sync: Any = self
        if state is None or sync.self_node() is None:
            return
        if sync.role() not in ("follower", "candidate"):
            return
        now = raft_clock()
        if sync.election_deadline() >= now or not sync.connected_to_anyone():
            return
        term = sync.term() + 1
        others = sync.other_nodes()
        if sync.transfer_in_progress():
            self._send_all(others, {"type": TRANSFER_VOTE, "term": term})
            return
        if state.won_term == term:
            state.won_term = None
            return  # pysyncobj stands for election in this tick
        voters = len(others) + 1
        opened = state.start_round(term, voters)
        if state.won_term == term:
            state.won_term = None
            return  # a single voter
        sync.set_election_deadline(now + sync.fresh_election_timeout())
        last_index, last_term = sync.last_log_entry()
        unsent = self._send_all(
            others,
            {
                "type": PRE_VOTE,
                "term": term,
                "round": opened.number,
                "last_log_index": last_index,
                "last_log_term": last_term,
            },
        )
        # A member this replica has no connection to (the leader whose process just
        # ended) never answers: counted as a refusal, a round the others refuse is lost
        # now and retried soon, instead of lapsing with a whole election timeout.
        if unsent and state.unreachable(unsent) == LOST:
            self._retry_soon(state, now)

    def _send_all(self, nodes: list[Any], message: dict[str, Any]) -> list[Any]:
        """Send ``message`` to each of ``nodes``; the nodes it could not be sent to."""
        sync: Any = self
        return [node for node in nodes if not sync.send_to(node, dict(message))]

    def _retry_soon(self, state: PreVoteState, now: float) -> None:
        """After a lost round, shortly after losing the leader: the next round in a
        quarter of the leader-loss stagger (module docstring)."""
        if state.retries_soon(now) and self.leader_loss_stagger_s is not None:
            sync: Any = self
            sync.set_election_deadline(now + self.leader_loss_stagger_s / 4)

    def _pre_vote_message(self, node: Any, message: Any) -> bool:
        """Handle the pre-vote messages and stickiness; True: ``message`` is consumed
        (pysyncobj does not see it)."""
        state: PreVoteState | None = self.pre_vote
        if state is None or not isinstance(message, dict):
            return False
        sync: Any = self
        kind = message.get("type")
        now = raft_clock()
        current = sync.term()
        if kind == "append_entries" and message.get("term", -1) >= current:
            state.heard_leader(now)
        elif kind == PRE_VOTE:
            self._answer_pre_vote(node, message, state, now)
            return True
        elif kind == PRE_VOTE_REPLY:
            self._count_pre_vote(node, message, state, now)
            return True
        elif kind == TRANSFER_VOTE:
            state.transfer_terms[node] = int(message["term"])
            return True
        elif kind == "request_vote" and sync.role() == "follower":
            return state.ignores_request_vote(node, int(message["term"]), current, now)
        return False

    def _answer_pre_vote(
        self, node: Any, message: dict[str, Any], state: PreVoteState, now: float
    ) -> None:
        sync: Any = self
        granted = grant_pre_vote(
            proposed_term=int(message["term"]),
            current_term=sync.term(),
            candidate_log=(int(message["last_log_index"]), int(message["last_log_term"])),
            own_log=sync.last_log_entry(),
            leads=sync.role() == "leader",
            leader_recent=state.leader_recent(now),
        )
        sync.send_to(
            node,
            {
                "type": PRE_VOTE_REPLY,
                "term": message["term"],
                "round": message["round"],
                "granted": granted,
            },
        )

    def _count_pre_vote(
        self, node: Any, message: dict[str, Any], state: PreVoteState, now: float
    ) -> None:
        sync: Any = self
        outcome = state.reply(node, message)
        if outcome == WON:
            sync.set_election_deadline(0.0)
            log.info("pre-vote for term %s won: standing for election", message["term"])
        elif outcome == LOST:
            self._retry_soon(state, now)
