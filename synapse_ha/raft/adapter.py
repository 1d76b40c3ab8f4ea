"""pysyncobj 0.3.17, adapted: the module that reads or sets pysyncobj's private state
(``SyncObj``'s in :class:`SafeSyncObj` and its pre-vote base in
:mod:`synapse_ha.raft.prevote`, ``FileJournal``'s in :class:`FileJournalState`, the
password channel's connections in :mod:`synapse_ha.raft.password_transport`), and whose
:class:`SafeSyncObj` refuses any other pysyncobj release.

**Raft's AppendEntries rules on the follower side**, which pysyncobj 0.3.17 bends.

A follower that receives ``append_entries`` (previous index ``P``, entries ``E``) must,
by the Raft paper (Figure 2, receiver rules 3-5):

* delete its own entries only from the first one that *conflicts* with ``E`` (same index,
  different term), and append the entries of ``E`` it does not have;
* set its commit index to ``min(leaderCommit, index of the last new entry)``.

pysyncobj instead deletes every entry after ``P`` whenever its log is longer, conflict or
not (its commit rule, capped by the end of the log, is right only because of that). A
leader whose ``next_node_idx`` for a follower is lowered by a late reply re-sends from
there, and a message limited by the batch size can cover less than the follower already
acknowledged: the follower drops the rest. The leader still counts the acknowledgement
(its match index never goes down) and commits an entry that only it holds. When the
leader is then paused or killed, the follower that dropped the entry and the third
replica elect a leader without it: a command a client was told is committed is lost, and
the old leader, which applied it, logs "truncating already-applied log entries" when it
rejoins (seen in the chaos suite after a paused leader).

:class:`SafeSyncObj` corrects the message before pysyncobj's handler sees it, so the
handler's own steps produce what the rules demand:

* the leading entries of ``E`` that the log already holds (same index and term) are
  dropped from the message and ``P`` moves past them: the handler deletes from the first
  conflicting or missing entry only;
* when the log holds all of ``E`` (a re-send), the message becomes a heartbeat at the end
  of the log: nothing is deleted and appended again; its commit index is capped at
  ``P + len(E)`` (entries beyond may be of an older term the leader does not have), and
  the acknowledgement sent back is capped at ``P + len(E) + 1``: the follower vouches only
  for what the leader sent.

A large entry arrives in chunks (``transmission``); the chunks are joined here once the
last one arrives so the same rules apply. pysyncobj marks a chunk as the last by
comparing the offset with the command's length rather than the pickled entry's, so a
chunk before the real last one can carry the mark: such a chunk does not decode and is
kept as a middle chunk.

**No forwarding.** pysyncobj forwards a command proposed on a replica that is not the
leader to the leader it knows (``apply_command``), and it decides so when it drains its
queue, not when the command was proposed. A leader that was paused, or lost its term
while its leader loop was deciding, therefore has decisions it took on its own view (a
node "silent for 5 s" only because this replica was stopped) committed by the new
leader. Every command here is meant for the replica it was proposed on while it leads
(the servers answer NOT_LEADER elsewhere), so :class:`SafeSyncObj` refuses instead: a
queued command on a replica that does not lead fails with ``REQUEST_DENIED`` (not
appended anywhere), and an ``apply_command`` from another replica is refused the same
way.

**Leader loss.** A follower whose connection to its leader closes (the leader's process
ended: the kernel closed its sockets) does not wait out its election timeout: the
surviving members, in address order, stand for election one ``leader_loss_stagger_s``
apart (the first at once), and a follower that hears from a new leader or grants a vote
first goes back to its normal timeout. Staggering by address, not at random, keeps two
followers from splitting the vote. Raft's safety does not depend on when elections
start; the cost of a connection that closes under a live leader is one election, which
its timeout would mostly have started anyway (a closed connection is reopened only
after pysyncobj's retry period, longer than the shortest election timeout).

**Deaf ticks.** pysyncobj's tick checks the election deadline before it reads the
socket. A follower whose tick did long work (a restarted replica loading its snapshot and
applying its journal, thousands of entries in one tick; a process paused and resumed)
would find its deadline passed with the leader's messages still unread, and stand for
election while the leader is healthy. After a tick longer than half the shortest
election timeout a follower therefore draws a fresh timeout from the tick's end.

**Pre-vote and check-quorum.** pysyncobj has neither; :mod:`synapse_ha.raft.prevote`
(a base class of :class:`SafeSyncObj`, hooked into the tick, the message handler and the
leader-loss path) adds pre-vote and leader stickiness: a follower whose election timeout
passes raises its term only once a majority would vote for it, and members that hear
their leader refuse, so a restarted or rejoining follower no longer deposes a healthy
leader. A leader that hears no majority for one election timeout steps down
(pysyncobj's ``leaderFallbackTimeout``, set by the replica). Rolling upgrade: a replica
of an earlier release ignores ``pre_vote`` (pysyncobj skips an unknown message type and
keeps the connection), so a replica of this release can win an election only once a
majority runs this release; the earlier ones elect among themselves as before.

**Peers that cannot talk say so**: :mod:`synapse_ha.raft.password_transport` (the
password channel's transport, which names peers without this replica's key or on the
TLS channel).
"""

from __future__ import annotations

import logging
import queue
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj
from pysyncobj import pickle as raft_pickle
from pysyncobj.monotonic import monotonic as raft_clock
from pysyncobj.syncobj import _RAFT_STATE
from pysyncobj.version import VERSION as PYSYNCOBJ_VERSION

from synapse_ha.raft.password_transport import KeyCheckingTransport
from synapse_ha.raft.prevote import PreVoteMixin
from synapse_ha.raft.safe_pickle import TRUNCATED, chunks_problem

log_ = logging.getLogger(__name__)
_FOLLOWER = _RAFT_STATE.FOLLOWER

# The pysyncobj release this module adapts: its overrides and the private names it
# reads are that release's. Another release may have moved any of them.
TESTED_PYSYNCOBJ = "0.3.17"


class UntestedPysyncobj(RuntimeError):
    """The installed pysyncobj is not the release this adapter was written against."""


def check_pysyncobj_version(installed: str | None = None) -> None:
    """Raise :class:`UntestedPysyncobj` unless pysyncobj is :data:`TESTED_PYSYNCOBJ`
    (``installed``: the version to judge, by default the installed one)."""
    version = installed if installed is not None else PYSYNCOBJ_VERSION
    if version != TESTED_PYSYNCOBJ:
        raise UntestedPysyncobj(
            f"pysyncobj {version} is installed; this replica adapts pysyncobj "
            f"{TESTED_PYSYNCOBJ} (its private state and handlers) and refuses to run on "
            f"another release: install pysyncobj=={TESTED_PYSYNCOBJ}"
        )


class SafeSyncObj(PreVoteMixin, SyncObj):  # type: ignore[misc]
    """pysyncobj's ``SyncObj`` with the follower's AppendEntries rules of the Raft paper,
    pre-vote (:class:`~synapse_ha.raft.prevote.PreVoteMixin`, on once
    :meth:`enable_pre_vote` is called), no forwarding of commands to the leader, and a
    transport that names peers without this replica's key. ``channel_mode`` names this
    replica's security mode in that sentence (None: not named).

    Every name of pysyncobj's private state the replica reads or sets is read or set here
    or in the modules the module docstring names (:meth:`delay_election`,
    :meth:`raft_log` among them), and the constructor refuses a
    pysyncobj release other than :data:`TESTED_PYSYNCOBJ`."""

    _ack_cap: int | None = None  # while a corrected message is handled: highest ack + 1
    # Seconds between the survivors' elections after the leader's connection closed
    # (module docstring); None: wait for the election timeout, as pysyncobj does.
    leader_loss_stagger_s: float | None = None

    def __init__(self, *args: Any, channel_mode: str | None = None, **kwargs: Any) -> None:
        check_pysyncobj_version()
        # Read by the transport, which the base constructor builds.
        self.channel_mode = channel_mode
        kwargs.setdefault("transportClass", KeyCheckingTransport)
        SyncObj.__init__(self, *args, **kwargs)

    def _onTick(self, timeToWait: float = 0.0) -> None:
        """pysyncobj's tick checks the election deadline first and reads messages after;
        the work between two reads (applying a restarted replica's journal, thousands of
        entries in one go; loading a snapshot) can outlast the deadline while the leader's
        messages wait unread in the socket. A follower whose tick took longer than half
        the shortest election timeout therefore gets a fresh timeout from its end, so it
        reads before it judges the leader silent (Raft's timeout measures the leader's
        silence, not this replica's own deafness). A leadership transfer is not held."""
        started = raft_clock()
        self._pre_vote_tick()
        SyncObj._onTick(self, timeToWait)
        ended = raft_clock()
        if ended - started <= self._SyncObj__conf.raftMinTimeout / 2:
            return
        if self._isLeader() or self.__dict__.get("_SyncObj__transferInProgress"):
            return
        deadline = ended + self._SyncObj__generateRaftTimeout()
        current: float = self.__dict__["_SyncObj__raftElectionDeadline"]
        if current < deadline:
            self._SyncObj__raftElectionDeadline = deadline

    def delay_election(self, deadline: float) -> None:
        """Stand for election no sooner than ``deadline`` (pysyncobj's clock,
        :func:`raft_clock`), unless a leader is heard from first."""
        self._SyncObj__raftElectionDeadline = deadline

    def raft_log(self) -> Any:
        """The journal pysyncobj keeps this replica's log in."""
        return self.__dict__.get("_SyncObj__raftLog")

    def quorum_contact_within(self, seconds: float) -> bool:
        """Whether this replica leads and its Raft thread has heard a majority (itself
        included) within ``seconds``. pysyncobj checks the same on its own thread and
        steps down; a Raft thread that stands still (a full disk, a long stall) cannot,
        and the servers ask this instead of the role alone. Safe from any thread."""
        if not self._isLeader():
            return False
        others = list(self._SyncObj__otherNodes)
        heard = dict(self._SyncObj__lastResponseTime)
        since = raft_clock() - seconds
        count = 1 + sum(1 for node in others if heard.get(node, 0.0) > since)
        return count > (len(others) + 1) / 2

    def _checkCommandsToApply(self) -> None:
        if not self._isLeader():
            self._refuse_queued_commands()
        SyncObj._checkCommandsToApply(self)

    def _refuse_queued_commands(self) -> None:
        """Fail every queued command: this replica does not lead, and its commands are
        never forwarded (module docstring)."""
        commands = self._SyncObj__commandsQueue
        while True:
            try:
                _command, callback = commands.get_nowait()
            except queue.Empty:
                return
            self._SyncObj__callErrCallback(FAIL_REASON.REQUEST_DENIED, callback)

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:
        if isinstance(message, dict) and message.get("type") == "apply_command":
            # A command forwarded by another replica (an older release, or a replica that
            # stopped leading with commands queued): refused, never appended.
            if "request_id" in message:
                self._SyncObj__callErrCallback(
                    FAIL_REASON.REQUEST_DENIED, (node, message["request_id"])
                )
            return
        if self._pre_vote_message(node, message):
            return
        cap: int | None = None
        if (
            isinstance(message, dict)
            and message.get("type") == "append_entries"
            and "prevLogIdx" in message
            and message.get("term", -1) >= self._SyncObj__raftCurrentTerm
        ):
            joined = self._join_transmission(node, message)
            if joined is None:
                return
            message, cap = conflict_free(self._SyncObj__raftLog, joined)
            self._report_applied_conflict(node, message)
        self._ack_cap = cap
        try:
            SyncObj._SyncObj__onMessageReceived(self, node, message)
        finally:
            self._ack_cap = None

    def _SyncObj__onNodeDisconnected(self, node: Any) -> None:
        lost_leader = (
            node is not None
            and node == self._SyncObj__raftLeader
            and self._SyncObj__raftState == _FOLLOWER
        )
        SyncObj._SyncObj__onNodeDisconnected(self, node)
        if lost_leader and self.pre_vote is not None:
            self.pre_vote.lost_leader(raft_clock())
        stagger = self.leader_loss_stagger_s
        if not lost_leader or stagger is None or self._SyncObj__selfNode is None:
            return
        members = [self._SyncObj__selfNode.address]
        members += [other.address for other in self._SyncObj__otherNodes]
        delay = leader_loss_delay(self._SyncObj__selfNode.address, members, node.address, stagger)
        deadline = raft_clock() + delay
        current: float = self.__dict__["_SyncObj__raftElectionDeadline"]
        if deadline < current:
            self._SyncObj__raftElectionDeadline = deadline
            log_.info(
                "lost the connection to leader %s: standing for election in %.0f ms",
                node.address,
                delay * 1000,
            )

    def _SyncObj__sendNextNodeIdx(
        self,
        node: Any,
        reset: bool = False,
        nextNodeIdx: int | None = None,
        success: bool = False,
    ) -> None:
        cap = self._ack_cap
        if success and cap is not None and nextNodeIdx is not None and nextNodeIdx > cap:
            nextNodeIdx = cap
        SyncObj._SyncObj__sendNextNodeIdx(self, node, reset, nextNodeIdx, success)

    def _report_applied_conflict(self, node: Any, message: dict[str, Any]) -> None:
        """Log the evidence when ``message`` is about to delete an entry this replica has
        applied (pysyncobj then logs only the index)."""
        if message.get("transmission") is not None or not message.get("entries"):
            return
        log = self._SyncObj__raftLog
        applied = int(self._SyncObj__raftLastApplied)
        prev = int(message["prevLogIdx"])
        if len(log) == 0 or prev + 1 > applied:
            return
        first, last = int(log[0][1]), int(log[-1][1])
        if not first <= prev <= last or int(log[prev - first][2]) != message["prevLogTerm"]:
            return
        if prev + 1 > last:
            return
        ours = [(int(e[1]), int(e[2])) for e in (log[i - first] for i in range(prev + 1, last + 1))]
        theirs = [(int(e[1]), int(e[2])) for e in message["entries"]]
        log_.critical(
            "append_entries from %s (term %s, commit %s) conflicts with applied entries: "
            "prev %d/%s; ours (index, term) %s; theirs %s; our term %s, commit %s, applied %d",
            getattr(node, "id", node),
            message.get("term"),
            message.get("commit_index"),
            prev,
            message["prevLogTerm"],
            ours[:12],
            theirs[:12],
            self._SyncObj__raftCurrentTerm,
            self._SyncObj__raftCommitIndex,
            applied,
        )

    def _join_transmission(self, node: Any, message: dict[str, Any]) -> dict[str, Any] | None:
        """A whole message for a chunked entry once its last chunk arrives; the message
        itself for the other chunks and for unchunked messages; None when a chunk marked
        last did not complete the entry (it was answered as a middle chunk)."""
        if message.get("transmission") != "finish":
            return message
        received: Any = self.__dict__.get("_SyncObj__recvTransmission", b"")
        if not isinstance(received, bytes):
            received = b""  # pysyncobj starts from "" before any first chunk
        data = received + message["data"]
        problem = chunks_problem(data) if isinstance(data, bytes) else "not bytes"
        if problem == TRUNCATED:
            # Marked last too early (see the module docstring): keep collecting.
            self._SyncObj__recvTransmission = data
            self._SyncObj__sendNextNodeIdx(node, success=False, reset=False)
            return None
        if problem is not None:
            # Bytes from a peer that would import or call (or are no entry): never loaded.
            log_.warning("a chunked Raft entry from %s refused: %s", node.address, problem)
            self._SyncObj__recvTransmission = ""
            return None
        entry = raft_pickle.loads(data)
        self._SyncObj__recvTransmission = ""
        whole = {k: v for k, v in message.items() if k not in ("transmission", "data")}
        whole["entries"] = [entry]
        return whole


def leader_loss_delay(self_address: str, members: list[str], lost: str, stagger_s: float) -> float:
    """Seconds until the member ``self_address`` stands for election after losing its
    connection to the leader ``lost``: the other ``members`` take turns in address order,
    ``stagger_s`` apart, the first at once."""
    survivors = sorted({m for m in members if m != lost})
    return survivors.index(self_address) * stagger_s


def conflict_free(log: Any, message: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """``message`` rewritten so that pysyncobj's handler applies the Raft rules to ``log``
    (a sequence of ``(command, index, term)``), and the cap on the acknowledgement (None:
    no cap). A message whose previous entry the log does not hold is left alone: the
    handler rejects it."""
    if message.get("transmission") is not None:
        return message, None  # a first or middle chunk: nothing to apply yet
    prev = int(message["prevLogIdx"])
    entries = list(message.get("entries") or [])
    if len(log) == 0:
        return message, None
    first = int(log[0][1])
    last = int(log[-1][1])
    if prev < first or prev > last or int(log[prev - first][2]) != message["prevLogTerm"]:
        return message, None
    held = 0
    for entry in entries:
        index, term = int(entry[1]), int(entry[2])
        if index > last or int(log[index - first][2]) != term:
            break
        held += 1
    if held < len(entries):
        if held == 0:
            return message, None
        kept = entries[held - 1]
        return {
            **message,
            "prevLogIdx": int(kept[1]),
            "prevLogTerm": int(kept[2]),
            "entries": entries[held:],
        }, None
    end = prev + len(entries)
    if last == end and not entries:
        return message, None  # a heartbeat at the end of the log
    return {
        **message,
        "prevLogIdx": last,
        "prevLogTerm": int(log[-1][2]),
        "entries": [],
        "commit_index": min(int(message["commit_index"]), end),
    }, end + 1


class FileJournalState:
    """pysyncobj's ``FileJournal`` private state, read and set for the journal that
    subclasses it (:mod:`synapse_ha.raft.journal`): the mapped file, the offset of the
    next record, the entries in memory and the term/vote/commit-index storer."""

    def __init__(self, journal: Any) -> None:
        self._journal = journal

    @property
    def file(self) -> Any:
        return self._journal.__dict__["_FileJournal__journalFile"]

    @file.setter
    def file(self, value: Any) -> None:
        self._journal.__dict__["_FileJournal__journalFile"] = value

    @property
    def offset(self) -> int:
        return int(self._journal.__dict__["_FileJournal__currentOffset"])

    @offset.setter
    def offset(self, value: int) -> None:
        self._journal.__dict__["_FileJournal__currentOffset"] = value

    @property
    def entries(self) -> list[Any]:
        entries: list[Any] = self._journal.__dict__["_FileJournal__journal"]
        return entries

    @entries.setter
    def entries(self, value: list[Any]) -> None:
        self._journal.__dict__["_FileJournal__journal"] = value

    @property
    def meta_storer(self) -> Any:
        return self._journal.__dict__.get("_FileJournal__metaStorer")

    @meta_storer.setter
    def meta_storer(self, value: Any) -> None:
        self._journal.__dict__["_FileJournal__metaStorer"] = value

    def default_header(self) -> bytes:
        header: bytes = self._journal._FileJournal__getDefaultHeader()
        return header
