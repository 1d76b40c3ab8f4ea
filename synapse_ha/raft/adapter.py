"""pysyncobj 0.3.17, adapted: the one module that names pysyncobj's private state and
hooks (anything ``_``-prefixed of pysyncobj, and its module-level ``createJournal``), and
whose :class:`SafeSyncObj` refuses any other pysyncobj release. The rest of the package
works through the public names given here:

* :class:`SafeSyncObj`: ``SyncObj`` with the follower's AppendEntries rules
  (:mod:`synapse_ha.raft.follower_rules`), no forwarding, leader loss, deaf ticks (below),
  the pre-vote hooks of :mod:`synapse_ha.raft.prevote`, and read/set access to the Raft
  state those need (term, role, election deadline, log tail, peers);
* :class:`KeyCheckingTransport`: pysyncobj's TCP transport, whose connection events
  reach the password channel's :class:`~synapse_ha.raft.password_transport.PasswordChannelWatch`;
* :class:`TransportBase`: pysyncobj's transport interface with public names for the
  events a transport reports (:mod:`synapse_ha.raft.tls_transport`);
* :class:`FileJournalState`, :class:`ResizableFileState` and
  :func:`install_journal_factory`: the journal's private state and the factory pysyncobj
  builds it with (:mod:`synapse_ha.raft.journal`).

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
from collections.abc import Callable
from typing import Any

import pysyncobj.syncobj as syncobj_module
from pysyncobj import FAIL_REASON, SyncObj
from pysyncobj import pickle as raft_pickle
from pysyncobj.monotonic import monotonic as raft_clock
from pysyncobj.syncobj import _RAFT_STATE
from pysyncobj.transport import TCPTransport, Transport
from pysyncobj.version import VERSION as PYSYNCOBJ_VERSION

from synapse_ha.raft.follower_rules import conflict_free, leader_loss_delay
from synapse_ha.raft.password_transport import TLS_HANDSHAKE_RECORD, PasswordChannelWatch
from synapse_ha.raft.prevote import PreVoteMixin
from synapse_ha.raft.safe_pickle import TRUNCATED, chunks_problem
from synapse_ha.raft.tick_watch import TickWatch

__all__ = [
    "TESTED_PYSYNCOBJ",
    "FileJournalState",
    "KeyCheckingTransport",
    "ResizableFileState",
    "SafeSyncObj",
    "TransportBase",
    "UntestedPysyncobj",
    "check_pysyncobj_version",
    "conflict_free",
    "install_journal_factory",
    "leader_loss_delay",
]

log_ = logging.getLogger(__name__)
_FOLLOWER = _RAFT_STATE.FOLLOWER
# pysyncobj's role numbers, by the names the rest of the package uses.
_ROLES = {
    _RAFT_STATE.FOLLOWER: "follower",
    _RAFT_STATE.CANDIDATE: "candidate",
    _RAFT_STATE.LEADER: "leader",
}

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

    Every name of pysyncobj's private state the replica reads or sets is read or set here,
    behind the public methods below (:meth:`set_election_deadline`, :meth:`raft_log`,
    :meth:`term` among them), and the constructor refuses a pysyncobj release other than
    :data:`TESTED_PYSYNCOBJ`."""

    _ack_cap: int | None = None  # while a corrected message is handled: highest ack + 1
    # Seconds between the survivors' elections after the leader's connection closed
    # (module docstring); None: wait for the election timeout, as pysyncobj does.
    leader_loss_stagger_s: float | None = None

    def __init__(self, *args: Any, channel_mode: str | None = None, **kwargs: Any) -> None:
        check_pysyncobj_version()
        # Read by the transport, which the base constructor builds.
        self.channel_mode = channel_mode
        self.tick_watch = TickWatch()  # before the base constructor starts the ticks
        kwargs.setdefault("transportClass", KeyCheckingTransport)
        SyncObj.__init__(self, *args, **kwargs)

    def _onTick(self, timeToWait: float = 0.0) -> None:
        """pysyncobj's tick checks the election deadline first and reads messages after;
        the work between two reads (applying a restarted replica's journal, thousands of
        entries in one go; loading a snapshot) can outlast the deadline while the leader's
        messages wait unread in the socket. A follower whose tick took longer than half
        the shortest election timeout therefore gets a fresh timeout from its end, so it
        reads before it judges the leader silent (Raft's timeout measures the leader's
        silence, not this replica's own deafness). A leadership transfer is not held.
        Ticks that start far apart are counted and logged (:mod:`~synapse_ha.raft.tick_watch`)."""
        started = raft_clock()
        stall = self.tick_watch.tick(started, self._SyncObj__conf.raftMinTimeout / 2)
        if stall is not None:
            log_.warning(
                "two ticks of the Raft thread (%s) started %.0f ms apart, over half the "
                "shortest election timeout: the first took %.0f ms (its work, such as "
                "applying entries, a snapshot or a disk write, and its waits for the "
                "interpreter lock), then the thread waited %.0f ms to run again (a process "
                "short of CPU, threads holding the interpreter lock, a garbage "
                "collection); %d more such stalls since the last line",
                self.role(), 1000 * stall.interval_s, 1000 * stall.worked_s,
                1000 * (stall.interval_s - stall.worked_s), stall.unlogged,
            )  # fmt: skip
        self._pre_vote_tick()
        SyncObj._onTick(self, timeToWait)
        ended = raft_clock()
        self.tick_watch.ended(ended)
        if ended - started <= self._SyncObj__conf.raftMinTimeout / 2:
            return
        if self.leads() or self.transfer_in_progress():
            return
        deadline = ended + self.fresh_election_timeout()
        if self.election_deadline() < deadline:
            self.set_election_deadline(deadline)

    def set_election_deadline(self, deadline: float) -> None:
        """Stand for election at ``deadline`` (pysyncobj's clock, :func:`raft_clock`; a
        deadline passed: at the next tick), unless a leader is heard from first."""
        self._SyncObj__raftElectionDeadline = deadline

    def election_deadline(self) -> float:
        deadline: float = self.__dict__["_SyncObj__raftElectionDeadline"]
        return deadline

    def fresh_election_timeout(self) -> float:
        """A new random election timeout (seconds), drawn as pysyncobj draws it."""
        timeout: float = self._SyncObj__generateRaftTimeout()
        return timeout

    def raft_log(self) -> Any:
        """The journal pysyncobj keeps this replica's log in."""
        return self.__dict__.get("_SyncObj__raftLog")

    def last_log_entry(self) -> tuple[int, int]:
        """The index and term of the last entry of the log."""
        last = self._SyncObj__raftLog[-1]
        return int(last[1]), int(last[2])

    def role(self) -> str:
        """``follower``, ``candidate`` or ``leader``."""
        return _ROLES[self._SyncObj__raftState]

    def leads(self) -> bool:
        return bool(self._isLeader())

    def leader_node(self) -> Any:
        """The node this replica knows as leader (None: none known)."""
        return self._getLeader()

    def term(self) -> int:
        return int(self._SyncObj__raftCurrentTerm)

    def self_node(self) -> Any:
        """This replica's node (None on a read-only node)."""
        return self._SyncObj__selfNode

    def other_nodes(self) -> list[Any]:
        return list(self._SyncObj__otherNodes)

    def connected_to_anyone(self) -> bool:
        return bool(self._SyncObj__connectedToAnyone())

    def transfer_in_progress(self) -> bool:
        """Whether a leadership transfer (pysyncobj's ``timeout_now``) is running."""
        return bool(self.__dict__.get("_SyncObj__transferInProgress"))

    def send_to(self, node: Any, message: dict[str, Any]) -> bool:
        """Send ``message`` to ``node`` over this replica's Raft transport; False when
        there is no connection to it to send on."""
        return bool(self.__dict__["_SyncObj__transport"].send(node, message))

    def raft_poller(self) -> Any:
        """The poller the Raft thread waits on (a transport subscribes its descriptors)."""
        return self._poller

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
        if deadline < self.election_deadline():
            self.set_election_deadline(deadline)
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


class ResizableFileState:
    """pysyncobj's ``ResizableFile`` private state: the shared mapping of the journal file
    and the open file under it."""

    def __init__(self, resizable: Any) -> None:
        self._resizable = resizable

    @property
    def mapping(self) -> Any:
        return self._resizable._ResizableFile__mm

    def fileno(self) -> int:
        return int(self._resizable._ResizableFile__f.fileno())

    def close(self) -> None:
        """Unmap and close the file (pysyncobj's ``_destroy``)."""
        self._resizable._destroy()


def install_journal_factory(create: Callable[[str], Any | None]) -> bool:
    """Have pysyncobj build its journals with ``create`` (given the journal path; None:
    pysyncobj's own journal). pysyncobj calls the ``createJournal`` it imported into
    :mod:`pysyncobj.syncobj`: that name is replaced, once per process. False: something
    else replaced it first (nothing is installed)."""
    current = syncobj_module.createJournal
    if getattr(current, "synapse_factory", None) is create:
        return True
    if current is not _original_create_journal:
        return False

    def create_journal(journalFile: str | None = None) -> Any:
        if journalFile is not None:
            journal = create(journalFile)
            if journal is not None:
                return journal
        return _original_create_journal(journalFile)

    create_journal.synapse_factory = create  # type: ignore[attr-defined]
    syncobj_module.createJournal = create_journal
    return True


_original_create_journal = syncobj_module.createJournal


class TransportBase(Transport):  # type: ignore[misc]
    """pysyncobj's transport interface, with public names for what a transport reports
    to the Raft thread."""

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        Transport.__init__(self, syncObj, selfNode, otherNodes)

    def deliver(self, node: Any, message: Any) -> None:
        """Hand ``message`` from ``node`` to pysyncobj's handler (it may raise on a message
        it cannot take)."""
        self._onMessageReceived(node, message)

    def node_connected(self, node: Any) -> None:
        self._onNodeConnected(node)

    def node_disconnected(self, node: Any) -> None:
        self._onNodeDisconnected(node)


def _incoming_host(conn: Any) -> str:
    """The host an accepted connection comes from ("" once closed)."""
    sock = conn._TcpConnection__socket
    try:
        return str(sock.getpeername()[0]) if sock is not None else ""
    except OSError:  # already closed
        return ""


def _check_first_bytes(conn: Any, length: int, refuses: Callable[[bytes], bool]) -> None:
    """Before pysyncobj parses what an accepted connection sends, show its first
    ``length`` bytes to ``refuses``: True closes the connection; otherwise pysyncobj's
    parser takes over, unchecked from then on."""
    parse = conn._TcpConnection__processParseMessage

    def first_bytes_checked() -> Any:
        start = conn._TcpConnection__readBuffer[:length]
        if len(start) < length:
            return parse()
        conn._TcpConnection__processParseMessage = parse
        if refuses(bytes(start)):
            conn.disconnect()
            return None
        return parse()

    conn._TcpConnection__processParseMessage = first_bytes_checked


class KeyCheckingTransport(TCPTransport):  # type: ignore[misc]
    """pysyncobj's TCP transport (the password channel), whose connection events go to a
    :class:`~synapse_ha.raft.password_transport.PasswordChannelWatch` (``watch``), which
    says why a peer without this replica's key cannot be reached. The sentence's mode is
    the :class:`SafeSyncObj`'s ``channel_mode``."""

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        self.watch = PasswordChannelWatch(syncObj.channel_mode)
        TCPTransport.__init__(self, syncObj, selfNode, otherNodes)

    def addNode(self, node: Any) -> None:
        TCPTransport.addNode(self, node)
        conn = self._connections.get(node)
        if conn is not None:
            self.watch.outgoing_added(conn, node.address)

    def _onNewIncomingConnection(self, conn: Any) -> None:
        TCPTransport._onNewIncomingConnection(self, conn)
        refuses = self.watch.incoming(conn, _incoming_host(conn))
        if refuses is not None:
            _check_first_bytes(conn, len(TLS_HANDSHAKE_RECORD), refuses)

    def _onOutgoingConnected(self, conn: Any) -> None:
        self.watch.outgoing_connecting(conn)
        TCPTransport._onOutgoingConnected(self, conn)

    def _onOutgoingMessageReceived(self, conn: Any, message: Any) -> None:
        self.watch.outgoing_answered(conn)
        TCPTransport._onOutgoingMessageReceived(self, conn, message)

    def _onMessageReceived(self, node: Any, message: Any) -> None:
        if self.watch.accepts(node, message):
            TCPTransport._onMessageReceived(self, node, message)

    def _onDisconnected(self, conn: Any) -> None:
        node = self._connToNode(conn)
        self.watch.disconnected(conn, node.address if node is not None else None)
        TCPTransport._onDisconnected(self, conn)
