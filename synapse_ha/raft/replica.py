"""One replica of the replicated cluster state, over pysyncobj.

:class:`RaftReplica` builds the consumer
(:class:`~synapse_ha.raft.replicated_state.ReplicatedState`) first and the ``SyncObj``
second (so a restored snapshot is never overwritten by a late constructor), and turns
pysyncobj's callbacks into :class:`Proposal` futures that gRPC handlers wait on with a
deadline. Its parts, each in a module of its own: the Raft channel's key and the data
directory's mode (:mod:`~synapse_ha.raft.channel`), the group-committed proposals
(:mod:`~synapse_ha.raft.proposals`), the status (:mod:`~synapse_ha.raft.status`) and the
membership changes (:mod:`~synapse_ha.raft.membership`).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pysyncobj import SyncObjConf
from pysyncobj.monotonic import monotonic as raft_clock
from pysyncobj.node import TCPNode

from synapse_ha.core import commands as cmd
from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.membership import MembershipRefusal, MemberView
from synapse_ha.core.model import ClusterState
from synapse_ha.raft import journal as durable_journal
from synapse_ha.raft.adapter import SafeSyncObj
from synapse_ha.raft.channel import (
    data_dir_mode_problem,
    raft_key,
    raft_password_problem,
    record_mode,
)
from synapse_ha.raft.membership import MembershipChanges, tcp_node
from synapse_ha.raft.proposals import ProposalBatcher
from synapse_ha.raft.replicated_state import ApplyObserver, ReplicatedState
from synapse_ha.raft.snapshot_file import SnapshotMember
from synapse_ha.raft.status import LEADER_STATE, RaftStatus, read_status
from synapse_ha.raft.tls_transport import tls_transport_class
from synapse_ha.security.tls import TlsFiles

log = logging.getLogger(__name__)

JOURNAL_FILE = "raft.journal"
DUMP_FILE = "raft.dump"
# Election timeout of a joining replica until it has heard from a leader.
_JOIN_ELECTION_TIMEOUT_S = 1.0e6


@dataclass(frozen=True, slots=True)
class RaftTiming:
    """Raft timers in seconds. The defaults were measured on loopback to give sub-second
    failover without spurious elections on a loaded two-core machine (bench/failover.py).

    ``tick_period_s``: how long the Raft thread waits for a message before it looks at
    its timers again (pysyncobj's ``autoTickPeriod``); a follower notices a silent
    leader at most this late after its election timeout.
    ``restart_election_delay_s``: a replica restarted on an existing data directory
    stands for election no sooner than this after it started, so the leader has
    reconnected to it (within ``connection_retry_s``) before it looks for one; a whole
    cluster restarted at once elects its first leader this much later. Loading the
    snapshot and replaying the journal can take longer than the delay; after such a long
    tick a follower draws a fresh election timeout
    (:class:`~synapse_ha.raft.adapter.SafeSyncObj`).
    ``leader_loss_stagger_s``: when a follower's connection to its leader closes (the
    leader's process ended), the survivors stand for election in address order this far
    apart, the first at once, instead of waiting for their election timeouts
    (:mod:`synapse_ha.raft.adapter`); None waits for the timeouts.
    ``pre_vote``: a replica whose election timeout passed first asks the members whether
    they would vote for it, and stands only with a majority; a follower that heard its
    leader within ``election_min_s`` refuses, and ignores higher-term vote requests
    (:mod:`synapse_ha.raft.prevote`): a restarted or rejoining follower does not depose
    a healthy leader. False: pysyncobj's elections.
    Check-quorum: a leader that heard no majority for ``election_max_s`` steps down
    (pysyncobj's ``leaderFallbackTimeout``) and stops serving
    (:meth:`RaftReplica.leads_with_quorum`). ``leader_step_down_s`` is the bound the
    cluster's fencing timeouts assume for that (``dead_timeout`` > ``lease_ttl`` +
    ``leader_step_down``): it must be at least ``election_max_s``."""

    election_min_s: float = 0.4
    election_max_s: float = 0.8
    append_entries_period_s: float = 0.05
    leader_step_down_s: float = 2.0
    connection_retry_s: float = 0.5
    log_compaction_min_entries: int = 20_000
    log_compaction_min_time_s: float = 300.0
    tick_period_s: float = 0.02
    restart_election_delay_s: float = 2.0
    leader_loss_stagger_s: float | None = 0.1
    pre_vote: bool = True

    @property
    def check_quorum_s(self) -> float:
        """How long a leader goes without hearing a majority before it steps down."""
        return self.election_max_s


class RaftReplica:
    """A replica: the consumer plus its ``SyncObj``.

    ``on_role_change(is_leader, term)`` runs on the Raft thread whenever this replica
    becomes or stops being leader; it must return quickly and never raise.

    ``directory`` maps raft addresses to ``(replica_id, grpc_address)``; each member
    carries them, and a member added online carries those given to :meth:`add_member`,
    so every replica knows every member's gRPC address (:meth:`members`). ``join``: this
    replica is new to a running cluster; it starts no election until it has heard from
    a leader (it would only disturb the members with its empty log).
    """

    def __init__(
        self,
        self_address: str,
        peer_addresses: list[str],
        data_dir: str,
        password: str,
        timing: RaftTiming | None = None,
        on_role_change: Callable[[bool, int], None] | None = None,
        on_applied: Callable[[], None] | None = None,
        directory: Mapping[str, tuple[str, str]] | None = None,
        join: bool = False,
        observer: ApplyObserver | None = None,
        fsync: bool = False,
        *,
        secure: bool,
        raft_tls: TlsFiles | None = None,
    ) -> None:
        """``secure``: whether this replica serves mutual TLS (False: ``--insecure``); it
        chooses the Raft key (:func:`~synapse_ha.raft.channel.raft_key`). ``raft_tls``:
        the replica's TLS files when its Raft channel is mutual TLS
        (:mod:`~synapse_ha.raft.tls_transport`; ``secure`` only), which needs no
        ``password``; None: pysyncobj's channel, encrypted with the password. Raises
        ``ValueError`` with the rule for a weak ``password``
        (:func:`~synapse_ha.raft.channel.raft_password_problem`), and for an insecure
        replica on a secure cluster's data directory
        (:func:`~synapse_ha.raft.channel.data_dir_mode_problem`)."""
        timing = timing or RaftTiming()
        if raft_tls is not None and not secure:
            raise ValueError("a Raft channel over TLS needs a secure replica")
        problem = data_dir_mode_problem(data_dir, secure)
        if raft_tls is None:
            problem = raft_password_problem(password) or problem
        if problem is not None:
            raise ValueError(problem)
        record_mode(data_dir, secure)
        self.self_address = self_address
        self._on_role_change = on_role_change
        self._timing = timing
        # Serving as leader (leads_with_quorum): the window within which the Raft thread
        # must have ticked and heard a majority, and when a stalled thread may serve again.
        self._serving_window_s = min(timing.leader_step_down_s, 0.75 * timing.election_min_s)
        self._ticked_at = raft_clock()
        self._serving_after = 0.0
        self.machine = ReplicatedState(on_applied, observer)
        self.machine.dump_path = os.path.join(data_dir, DUMP_FILE)
        self_node, other_nodes = _member_nodes(self_address, peer_addresses, directory or {})
        self.machine.default_members = (self_node, *other_nodes)
        self._joining = join
        restarted = any(
            os.path.exists(os.path.join(data_dir, name)) for name in (JOURNAL_FILE, DUMP_FILE)
        )
        key = None if raft_tls is not None else raft_key(password, secure)
        conf = self._sync_conf(data_dir, key)
        self._proposals = ProposalBatcher(
            self.machine.apply_commands, batch_forget_s=2 * timing.leader_step_down_s
        )
        # Our journal (synapse_ha.raft.journal): compaction a crash cannot tear, and in
        # fsync mode every journal change on stable storage before pysyncobj sends the
        # answer or counts the vote that relies on it.
        durable_journal.register(conf.journalFile, conf.fullDumpFile, fsync=fsync)
        self.fsync = fsync
        channel: dict[str, Any] = {}
        if raft_tls is not None:
            channel["transportClass"] = tls_transport_class(raft_tls)
        self._sync = SafeSyncObj(
            self_node,
            other_nodes,
            conf=conf,
            consumers=[self.machine],
            channel_mode="secure (TLS)" if secure else "insecure (--insecure)",
            **channel,
        )
        durable_journal.check_installed(self._sync, fsync=fsync)
        self._membership = MembershipChanges(self._sync, self_address)
        self._hold_first_election(conf, join, restarted=restarted and bool(other_nodes))
        if timing.pre_vote:
            self._sync.enable_pre_vote(timing.election_min_s)
        self._sync.addOnTickCallback(self._on_tick)
        self._proposals.start()

    def _sync_conf(self, data_dir: str, key: str | None) -> SyncObjConf:
        """pysyncobj's configuration: this replica's files, hooks and timers."""
        timing = self._timing
        return SyncObjConf(
            password=key,
            bindAddress=self.self_address,
            journalFile=os.path.join(data_dir, JOURNAL_FILE),
            fullDumpFile=os.path.join(data_dir, DUMP_FILE),
            serializer=self.machine.start_dump,
            serializeChecker=self.machine.dump_progress,
            deserializer=self.machine.read_dump,
            appendEntriesUseBatch=False,
            leaderFallbackTimeout=timing.check_quorum_s,
            raftMinTimeout=timing.election_min_s,
            raftMaxTimeout=timing.election_max_s,
            appendEntriesPeriod=timing.append_entries_period_s,
            connectionTimeout=max(3.5, timing.election_max_s),
            connectionRetryTime=timing.connection_retry_s,
            logCompactionMinEntries=timing.log_compaction_min_entries,
            logCompactionMinTime=timing.log_compaction_min_time_s,
            dynamicMembershipChange=True,
            onStateChanged=self._state_changed,
            commandsQueueSize=100_000,
            autoTickPeriod=timing.tick_period_s,
        )

    def _hold_first_election(self, conf: SyncObjConf, join: bool, restarted: bool) -> None:
        """Keep a joining replica, and one ``restarted`` among peers, from standing for
        election too early; the others stand at once when their leader's process ends."""
        timing = self._timing
        if join:
            # No election before a leader has been heard from (see _finish_join). Set after
            # the constructor, which checks the timeouts against the connection timeout;
            # the first deadline is pushed out too (it was drawn with the normal ones).
            conf.raftMinTimeout = _JOIN_ELECTION_TIMEOUT_S
            conf.raftMaxTimeout = 2 * _JOIN_ELECTION_TIMEOUT_S
            self._sync.set_election_deadline(raft_clock() + _JOIN_ELECTION_TIMEOUT_S)
        elif restarted:
            # No election before the leader had time to reconnect (see RaftTiming).
            # pysyncobj's deadlines are on its own clock (CLOCK_MONOTONIC_RAW).
            self._sync.set_election_deadline(raft_clock() + timing.restart_election_delay_s)
        if not join:
            self._sync.leader_loss_stagger_s = timing.leader_loss_stagger_s

    # ---------------------------------------------------------------- proposals

    def propose(self, command: cmd.Command) -> Future[cmd.Result]:
        """Append ``command`` to the log. The future resolves with the apply result on
        this replica, or with :class:`ProposalError`. It may never resolve when
        leadership moves mid-flight: callers wait with a deadline and treat a timeout as
        an unknown outcome.

        Proposals are group-committed: while a few entries replicate, new proposals
        queue and leave together as the next entry, in proposal order
        (:class:`~synapse_ha.raft.proposals.ProposalBatcher`)."""
        return self._proposals.propose(command)

    # ------------------------------------------------------------------- status

    def status(self) -> RaftStatus:
        return read_status(self._sync)

    def is_leader(self) -> bool:
        return bool(self._sync.leads())

    def leads_with_quorum(self) -> bool:
        """Leads, and it heard a majority within the serving
        window (three quarters of the shortest election timeout, at most
        ``leader_step_down_s``). The followers of a leader they stopped hearing elect
        another no sooner than an election timeout later, so a leader that serves only
        within that window never answers from a replaced term: a leader cut off from
        its followers stops serving before they can elect, and one whose process or
        Raft thread stood still while it led (frozen, a full disk, a long stall) serves
        nothing until a majority answered what it sent after the stall: the answers
        that waited in its sockets meanwhile do not count, and those that come later
        carry the newer term, if there is one, which ends its leadership."""
        now = raft_clock()
        window = min(self._serving_window_s, now - self._serving_after)
        if window <= 0:
            return False
        return bool(self._sync.quorum_contact_within(window))

    def follows_live_leader(self) -> bool:
        """Follows a leader it heard within the shortest election timeout (pre-vote's
        record of leader contact; without pre-vote: it knows a leader)."""
        if self.is_leader():
            return False
        pre_vote = self._sync.pre_vote
        if pre_vote is None:
            return bool(self.leader_address())
        return bool(pre_vote.leader_recent(raft_clock()))

    def leader_address(self) -> str:
        leader = self._sync.leader_node()
        return str(leader.address) if leader is not None else ""

    def term(self) -> int:
        return self._sync.term()

    # -------------------------------------------------------------- local state

    def cluster_config(self) -> ClusterConfig:
        """The replicated configuration; an immutable value, read without the lock."""
        return self.machine.state.config

    def snapshot(self) -> ClusterState:
        """An immutable snapshot of the local state; see :meth:`ReplicatedState.snapshot`."""
        return self.machine.snapshot()

    @contextmanager
    def reading(self) -> Iterator[ClusterState]:
        """The live local state, locked against applies for the duration of the block.
        Only for work that must see one exact applied state and is O(1) or a single
        encode (a state digest), or that reads a few records on a hot path (the applied
        index a write answers with, a submission's admission checks), where a snapshot's
        copy of the record dictionaries (O(jobs) after every commit) costs more than the
        read; everything else reads a :meth:`snapshot`."""
        with self.machine.lock:
            yield self.machine.state

    # --------------------------------------------------------------- membership

    def members(self) -> list[MemberView]:
        """Every member, this replica included; see :meth:`MembershipChanges.members
        <synapse_ha.raft.membership.MembershipChanges.members>`."""
        return self._membership.members()

    def member_addresses(self) -> list[SnapshotMember]:
        """The members (this replica included), without asking who is live."""
        return self._membership.member_addresses()

    def change_in_flight(self) -> bool:
        return self._membership.change_in_flight()

    def add_member(
        self, replica_id: str, raft_address: str, grpc_address: str
    ) -> MembershipRefusal | Future[None]:
        """Start adding a replica (on the leader); see :meth:`MembershipChanges.add_member
        <synapse_ha.raft.membership.MembershipChanges.add_member>`."""
        return self._membership.add_member(replica_id, raft_address, grpc_address)

    def remove_member(self, replica_id: str) -> MembershipRefusal | Future[None]:
        """Start removing a replica (on the leader); see
        :meth:`MembershipChanges.remove_member
        <synapse_ha.raft.membership.MembershipChanges.remove_member>`."""
        return self._membership.remove_member(replica_id)

    # --------------------------------------------------------------- Raft thread

    def _on_tick(self) -> None:
        """Runs on the Raft thread at every tick (before it reads what arrived)."""
        now = raft_clock()
        stalled = now - self._ticked_at > self._serving_window_s
        if stalled and self._sync.otherNodes and self._sync.leads():
            # The thread stood still while leading: the answers this tick reads may
            # come from before a newer leader was elected. Serve again once a majority
            # answered after them (from the next tick on).
            self._serving_after = math.inf
        elif self._serving_after == math.inf:
            self._serving_after = now
        self._ticked_at = now
        self._membership.run_raft_thread_calls()
        if self._joining and self._sync.leader_node() is not None:
            self._finish_join()

    def _finish_join(self) -> None:
        """A joining replica heard from a leader: from now on it times out and stands for
        election like any member (the next append from the leader resets its deadline)."""
        self._joining = False
        conf = self._sync.conf
        conf.raftMinTimeout = self._timing.election_min_s
        conf.raftMaxTimeout = self._timing.election_max_s
        self._sync.leader_loss_stagger_s = self._timing.leader_loss_stagger_s
        log.info("joined: heard from leader %s", self.leader_address())

    def stop(self) -> None:
        self._proposals.stop()
        # A Raft thread waiting for disk space gives up so that it can stop.
        durable_journal.check_installed(self._sync, fsync=self.fsync).closing.set()
        self._sync.destroy()
        self.machine.stop_dump()

    def _state_changed(self, old: int, new: int) -> None:
        if self._on_role_change is None:
            return
        was_leader, is_leader = old == LEADER_STATE, new == LEADER_STATE
        if was_leader == is_leader:
            return
        try:
            self._on_role_change(is_leader, self._sync.term())
        except Exception:
            log.exception("role change listener failed")


def _member_nodes(
    self_address: str, peer_addresses: list[str], directory: Mapping[str, tuple[str, str]]
) -> tuple[TCPNode, list[TCPNode]]:
    """This replica's node and its peers' (each once, itself left out), carrying the
    replica id and gRPC address ``directory`` gives each raft address."""

    def node(address: str) -> TCPNode:
        replica_id, grpc = directory.get(address, (address, ""))
        return tcp_node(address, replica_id, grpc)

    others = [node(p) for p in dict.fromkeys(peer_addresses) if p != self_address]
    return node(self_address), others
