"""The agent loop: register, heartbeat, reconcile members, fence itself.

:class:`Agent` is a step function over injected parts (control plane, executor, clock),
in the manner of an HA loop: the composition root calls :meth:`Agent.step` every few tens
of milliseconds, tests call it with a fake clock and fakes. Each step returns one sentence
saying what it did.

Rules it keeps (DESIGN §4 and the heartbeat contract in ``control.proto``):

* Heartbeats go out every ``heartbeat_interval`` (as the leader says), and sooner when a
  member started or exited, so reports reach the leader without waiting a whole period,
  or when the leader nudged this node because it bound members here. Early heartbeats
  keep at least ``MIN_REPORT_GAP_S`` between them.
* Reports (STARTED, EXITED) are kept, in order, until a reply acknowledges them, and are
  resent until then; an acknowledged exit is marked on disk and never reported again.
  A registration carries them too, committed before it: a node back from dead has its
  members' exits counted before anything new is placed on it.
* Desired state is applied idempotently by (job_id, fencing_token, rank, generation): a
  key that ever started on this node is never started again (also after an agent
  restart); a member not in the desired list, or one whose token is lower than the
  highest seen for its job, is stopped; a member whose token is lower than one seen for
  its job is never started, and a newer attempt's member starts only once this node runs
  nothing of an older one. Likewise a rank placed here again (a higher generation) starts
  only once its lower generation is gone from this node: never two at once.
* A running member whose desired record shows a higher membership count than it was
  told of is told (:meth:`Executor.tell_membership`): never stopped or restarted for it.
* Self-fencing: when no reply from a leader has arrived for ``lease_ttl`` (measured from
  when the last acknowledged request was sent) every member is killed and nothing starts
  until a reply to a later request arrives; the fenced exits are reported then. The
  per-member supervisors enforce the same deadline on their own (the lease file).
* NOT_FOUND (node unknown) or node status ``dead``: kill every member, register again.
* A desired member marked preempted is stopped gracefully: its ``$SYNAPSE_PREEMPT_FILE``
  is written, then SIGTERM, then SIGKILL after the grace the leader gave; its exit is
  reported as usual (a disruption). One not started here yet is never run: it is
  recorded with an immediate exit, so that the leader learns it is stopped.
* Every heartbeat names every GPU this node finds unhealthy (``gpu_faults``, from the
  GPU health monitor, :mod:`synapse_ha.worker.gpu_health`); a heartbeat goes out early
  when that list changed, so the leader requeues the gang on a failed GPU at once.
* Every heartbeat carries the latest result of each node check (``checks``: the
  health-check program, :mod:`synapse_ha.worker.health_check`), early when one changed.
* Members' paces (:mod:`synapse_ha.worker.pace`): every heartbeat carries the median time
  per step of each running member that writes its pace to ``$SYNAPSE_PROGRESS_FILE``,
  which the leader weighs to find slow nodes.
* Checkpoint marks (:mod:`synapse_ha.worker.checkpoint_files`): when a heartbeat goes out, a
  running member whose ``$SYNAPSE_CHECKPOINT_FILE`` changed gets a CHECKPOINT report (its
  newest mark; an older one not yet acknowledged is replaced), and a member that exited
  gets one, when its file changed, just before its EXITED report, so that the mark it
  wrote before it ended reaches the leader before the end of its attempt.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from synapse_ha.client.cluster import ClusterClient, ClusterUnavailable
from synapse_ha.core.commands import ExitCause, MemberEvent, MemberEventKind
from synapse_ha.core.desired import DesiredMember, MemberKey
from synapse_ha.core.health.fitness import GpuFault, NodeCheck
from synapse_ha.core.health.slowness import PaceReport
from synapse_ha.core.model import NodeStatus
from synapse_ha.rpc import from_proto, states, to_proto
from synapse_ha.rpc.errors import Reason, failure_of
from synapse_ha.rpc.from_proto import Wanted
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.worker.checkpoint_files import Mark
from synapse_ha.worker.lease import Lease, LeaseFile, LeaseState
from synapse_ha.worker.member_dirs import MemberExit
from synapse_ha.worker.members import PreemptNotice

log = logging.getLogger("synapse.worker.agent")

MIN_REPORT_GAP_S = 0.02  # an early heartbeat for fresh reports waits at least this long
# Between registration calls that found no leader (each one already tries every replica
# for up to a heartbeat interval): short, so that a worker whose leader froze finds the
# new one well within its lease.
REGISTER_RETRY_S = 0.1


class NotRegistered(Exception):
    """The leader does not know this node (NOT_FOUND)."""


class ControlPlaneUnreachable(Exception):
    """No leader answered in time."""


class StreamEnded(Exception):
    """The heartbeat stream to the leader ended or went silent: register again (leader
    discovery) without forgetting the members; the lease keeps running meanwhile."""


class ControlPlane(Protocol):
    def register(self, request: pb.RegisterNodeRequest) -> pb.RegisterNodeResponse: ...

    def heartbeat(self, request: pb.HeartbeatRequest, timeout_s: float) -> pb.HeartbeatResponse:
        """Raises :class:`NotRegistered` or :class:`ControlPlaneUnreachable`."""
        ...


class Started(Protocol):
    """A member as :meth:`Executor.start` left it: ``exit`` is set when it could not
    start at all."""

    @property
    def exit(self) -> MemberExit | None: ...


class Executor(Protocol):
    known: set[MemberKey]
    highest_token: dict[str, int]

    def start(self, desired: DesiredMember, preempted: PreemptNotice | None = None) -> Started: ...
    def stop(self, key: MemberKey) -> None: ...
    def preempt(self, key: MemberKey, notice: PreemptNotice) -> None: ...
    def poll(self) -> list[tuple[MemberKey, MemberExit]]: ...
    def running(self) -> list[MemberKey]: ...
    def gpus_held(self) -> dict[MemberKey, tuple[int, ...]]: ...
    def kill_all(self, detail: str) -> list[tuple[MemberKey, MemberExit]]: ...
    def mark_reported(self, key: MemberKey) -> None: ...
    def tell_membership(self, desired: DesiredMember) -> bool: ...


class GrpcControlPlane:
    """The control plane through :class:`ClusterClient` (leader discovery, redirects)."""

    def __init__(self, client: ClusterClient) -> None:
        self.client = client

    def register(self, request: pb.RegisterNodeRequest) -> pb.RegisterNodeResponse:
        try:
            return self.client.register_node(request)
        except ClusterUnavailable as exc:
            raise ControlPlaneUnreachable(str(exc)) from None
        except grpc.RpcError as exc:
            raise ControlPlaneUnreachable(f"{exc.code()}: {exc.details()}") from None

    def heartbeat(self, request: pb.HeartbeatRequest, timeout_s: float) -> pb.HeartbeatResponse:
        try:
            return self.client.heartbeat(request, timeout_s=timeout_s)
        except ClusterUnavailable as exc:
            raise ControlPlaneUnreachable(str(exc)) from None
        except grpc.RpcError as exc:
            if failure_of(exc).reason is Reason.NODE_NOT_FOUND:
                raise NotRegistered(str(exc.details())) from None
            raise ControlPlaneUnreachable(f"{exc.code()}: {exc.details()}") from None


def _report(
    key: MemberKey,
    kind: MemberEventKind,
    exit_: MemberExit | None = None,
    *,
    fenced: bool = False,
) -> MemberEvent:
    """A report for the control plane. An exit the worker caused is FENCED (``fenced``:
    the lease was lost or the leader forgot this node) or LOST (any other disruption); a
    member this node could not start is NODE_CANNOT_RUN; a member its supervisor stopped
    for making no progress is HUNG. Only PROGRAM and HUNG exits count against the job's
    retries."""
    cause = ExitCause.PROGRAM
    if exit_ is None:
        return MemberEvent(key.job_id, key.fencing_token, key.rank, kind, generation=key.generation)
    if fenced:
        cause = ExitCause.FENCED
    elif exit_.node_fault:
        cause = ExitCause.NODE_CANNOT_RUN
    elif exit_.disrupted:
        cause = ExitCause.LOST
    elif exit_.hung:
        cause = ExitCause.HUNG
    return MemberEvent(
        key.job_id,
        key.fencing_token,
        key.rank,
        kind,
        exit_.exit_code,
        exit_.detail,
        cause,
        generation=key.generation,
    )


def _mark_report(key: MemberKey, mark: Mark) -> MemberEvent:
    """A member's newest checkpoint mark, for the control plane."""
    return MemberEvent(
        key.job_id,
        key.fencing_token,
        key.rank,
        MemberEventKind.CHECKPOINT,
        step=mark.step,
        mark_seq=mark.seq,
        generation=key.generation,
    )


def _key_of(report: MemberEvent) -> MemberKey:
    return MemberKey(report.job_id, report.fencing_token, report.rank, report.generation)


def _no_marks(keys: Sequence[MemberKey]) -> Sequence[tuple[MemberKey, Mark]]:
    return ()


def _no_paces(keys: Sequence[MemberKey]) -> Sequence[PaceReport]:
    return ()


@dataclass(frozen=True, slots=True)
class AgentTimings:
    """Used until the leader says otherwise (its replies carry the cluster's values)."""

    heartbeat_interval_s: float = 1.0
    lease_ttl_s: float = 4.0


class Agent:
    def __init__(
        self,
        registration: pb.RegisterNodeRequest,
        control: ControlPlane,
        executor: Executor,
        clock: Callable[[], float],
        lease_file: LeaseFile | None = None,
        timings: AgentTimings | None = None,
        *,
        self_fencing: bool = True,
        gpu_faults: Callable[[], Sequence[GpuFault]] = tuple,
        node_checks: Callable[[], Sequence[NodeCheck]] = tuple,
        checkpoint_marks: Callable[
            [Sequence[MemberKey]], Sequence[tuple[MemberKey, Mark]]
        ] = _no_marks,
        member_paces: Callable[[Sequence[MemberKey]], Sequence[PaceReport]] = _no_paces,
    ) -> None:
        """``self_fencing=False`` exists only so the chaos suite can prove it catches a
        build without self-fencing (see ``synapse_ha.programs.worker``); never in production.
        ``gpu_faults`` says which GPUs are unhealthy now (any thread may change its answer;
        it must not block); ``node_checks`` the latest result of each node check (the
        health-check program, :mod:`synapse_ha.worker.health_check`), likewise;
        ``checkpoint_marks`` the new checkpoint mark of each of the members it is given
        whose file changed since it was last asked (the executor's ``marks``);
        ``member_paces`` the pace each member it is given reported lately (the executor's
        ``paces``, :mod:`synapse_ha.worker.pace`)."""
        self.checkpoint_marks = checkpoint_marks
        self.member_paces = member_paces
        self.self_fencing = self_fencing
        self.gpu_faults = gpu_faults
        self.faults_sent: tuple[GpuFault, ...] = ()
        self.node_checks = node_checks
        self.checks_sent: tuple[NodeCheck, ...] = ()
        self.registration = registration
        self.node_id = registration.node_id
        self.control = control
        self.executor = executor
        self.clock = clock
        self.timings = timings or AgentTimings()
        self.interval_s = self.timings.heartbeat_interval_s
        self.lease = Lease(self.timings.lease_ttl_s, clock)
        self.lease_file = lease_file
        self.registered = False
        self.pending: list[MemberEvent] = []
        self.next_heartbeat_at = 0.0
        self.next_register_at = 0.0
        self.last_sent_at = -1.0
        self.fresh_reports = False
        self.nudged = False
        self.desired_seen: set[MemberKey] = set()
        self._pushed: list[Wanted] | None = None
        self.lease_unwritable = ""  # why the lease file could not be written, if so
        self._revoke_lease_file()

    # ------------------------------------------------------------------ entry

    def add_recovered(self, exits: Sequence[tuple[MemberKey, MemberExit]]) -> None:
        """Exits found at start-up (a previous life's members) to report."""
        for key, exit_ in exits:
            self.pending.append(_report(key, MemberEventKind.EXITED, exit_))
        self.fresh_reports = bool(exits) or self.fresh_reports

    def nudge(self, node_id: str) -> bool:
        """The leader asks for a heartbeat now. Called from another thread; it only sets a
        flag the next :meth:`step` reads. False when the nudge names another node."""
        if node_id != self.node_id:
            return False
        self.nudged = True
        return True

    def push(self, desired: Sequence[pb.DesiredMember]) -> None:
        """The leader pushed this node's new desired list on its heartbeat stream. Called
        from another thread; the next :meth:`step` applies it if the lease is held."""
        self._pushed = from_proto.desired_list_from_proto(desired)

    def step(self) -> str:
        """One pass: collect exits, fence if the lease ran out, register or heartbeat when
        due. Returns a sentence describing what happened ("" when nothing did)."""
        said: list[str] = []
        self._collect_exits()
        if self.self_fencing and self.lease.must_fence():
            said.append(self._fence("fenced: no heartbeat reply from a leader for lease_ttl"))
        now = self.clock()
        if not self.registered:
            if now < self.next_register_at:
                return "; ".join(said)
            registered, sentence = self._register()
            said.append(sentence)
            if not registered:
                return "; ".join(said)
            now = self.clock()
        due = now >= self.next_heartbeat_at
        fresh = self.fresh_reports or self.nudged or self._fresh_faults()
        early = fresh and now >= self.last_sent_at + MIN_REPORT_GAP_S
        if due or early:
            said.append(self._heartbeat())
        pushed, self._pushed = self._pushed, None
        if pushed is not None and self.registered and self.lease.held():
            # A push renews nothing: it is applied only under a lease an acknowledgement
            # of this node's own heartbeat granted (see worker/stream.py).
            applied = self._apply(pushed, may_start=not self.lease_unwritable)
            said.append(f"pushed: {applied}" if applied else "")
        return "; ".join(s for s in said if s)

    def next_wakeup_in(self) -> float:
        """Seconds until the loop has something to do by the clock."""
        now = self.clock()
        targets = [self.next_heartbeat_at if self.registered else self.next_register_at]
        if self.registered and (self.fresh_reports or self.nudged or self._fresh_faults()):
            targets.append(self.last_sent_at + MIN_REPORT_GAP_S)
        if self.self_fencing and self.lease.state is LeaseState.HELD:
            targets.append(self.lease.valid_until)
        return max(0.0, min(targets) - now)

    def shutdown(self, stop: Callable[[], list[tuple[MemberKey, MemberExit]]]) -> str:
        """Graceful exit: ``stop`` ends every member; their exits are reported with one
        last heartbeat when a leader answers."""
        exits = stop()
        for key, exit_ in exits:
            self.pending.append(_report(key, MemberEventKind.EXITED, exit_))
        if self.registered and self.pending:
            self._heartbeat(apply_desired=False)
        return f"stopped {len(exits)} member(s)"

    # --------------------------------------------------------------- internals

    def _fresh_faults(self) -> bool:
        """Whether the unhealthy GPUs or the checks changed since the last heartbeat."""
        if tuple(self.node_checks()) != self.checks_sent:
            return True
        return tuple(self.gpu_faults()) != self.faults_sent

    def _collect_exits(self) -> None:
        exits = self.executor.poll()
        if exits:
            # Read after the exit was collected: every mark the member wrote is seen,
            # and so is every mark of its gang's members here so far.
            jobs = {key.job_id for key, _ in exits}
            gang = [key for key in self.executor.running() if key.job_id in jobs]
            self._add_marks([key for key, _ in exits] + gang)
        for key, exit_ in exits:
            self.pending.append(_report(key, MemberEventKind.EXITED, exit_))
            self.fresh_reports = True
            log.info("member %s exited with %d %s", key, exit_.exit_code, exit_.detail)

    def _add_marks(self, keys: Sequence[MemberKey]) -> None:
        """Queue the new checkpoint mark of each of ``keys`` whose file changed, in place
        of a mark of the same member not yet acknowledged (only the newest counts)."""
        marks = self.checkpoint_marks(keys)
        if not marks:
            return
        replaced = {key for key, _ in marks}
        self.pending = [
            r
            for r in self.pending
            if r.kind is not MemberEventKind.CHECKPOINT or _key_of(r) not in replaced
        ]
        self.pending.extend(_mark_report(key, mark) for key, mark in marks)

    def _write_lease_file(self, deadline: float) -> str:
        """Write the lease deadline the supervisors read; on a full (or failing) disk say
        why instead of raising. The supervisors then keep the deadline written before and
        fence their members when it passes, so a member still never outlives its lease;
        the agent starts nothing until a write succeeds again."""
        if self.lease_file is None:
            return ""
        try:
            self.lease_file.write(deadline)
        except OSError as exc:
            if not self.lease_unwritable:
                log.error("cannot write the lease file %s: %s", self.lease_file.path, exc)
            self.lease_unwritable = f"the lease file cannot be written ({exc.strerror})"
            return f"{self.lease_unwritable}: starting nothing; members stop at the old deadline"
        if self.lease_unwritable:
            log.warning("the lease file %s is written again", self.lease_file.path)
            self.lease_unwritable = ""
        return ""

    def _revoke_lease_file(self) -> None:
        """Tell the supervisors the lease is gone. When the file cannot be written they
        keep the last deadline written, which has passed or is about to (the agent revokes
        when it fences or forgets its members, and kills them itself)."""
        self._write_lease_file(0.0)

    def _fence(self, detail: str) -> str:
        self._revoke_lease_file()
        exits = self.executor.kill_all(detail)
        for key, exit_ in exits:
            self.pending.append(_report(key, MemberEventKind.EXITED, exit_, fenced=True))
        self.lease.fence()
        log.warning("%s; killed %d member(s)", detail, len(exits))
        return f"{detail}; killed {len(exits)} member(s)"

    def _register(self) -> tuple[bool, str]:
        reports = list(self.pending)
        request = self.registration
        if reports:
            # Committed before the registration: a late exit 0 is counted before the
            # node, back from dead, can be given a new attempt of the same job.
            request = pb.RegisterNodeRequest()
            request.CopyFrom(self.registration)
            request.reports.extend(to_proto.member_event_to_proto(r) for r in reports)
        try:
            answer = self.control.register(request)
        except ControlPlaneUnreachable as exc:
            self.next_register_at = self.clock() + REGISTER_RETRY_S
            return False, f"could not register: {exc}"
        self._acknowledged(reports, answer.acked_reports)
        self.registered = True
        if answer.heartbeat_interval_ms > 0:
            self.interval_s = answer.heartbeat_interval_ms / 1000
        if answer.lease_ttl_ms > 0:
            self.lease.ttl_s = answer.lease_ttl_ms / 1000
        self.next_heartbeat_at = self.clock()
        status = states.node_status(answer)
        log.info("registered as %s (status %s)", self.node_id, status)
        return True, f"registered (status {status})"

    def _heartbeat(self, apply_desired: bool = True) -> str:
        self._add_marks(self.executor.running())
        reports = list(self.pending)
        running = [_report(k, MemberEventKind.STARTED) for k in self.executor.running()]
        faults = tuple(self.gpu_faults())
        checks = tuple(self.node_checks())
        paces = self.member_paces(self.executor.running())
        request = to_proto.heartbeat_to_proto(self.node_id, reports, running, faults, checks, paces)
        self.faults_sent = faults
        self.checks_sent = checks
        sent_at = self.clock()
        self.last_sent_at = sent_at
        self.fresh_reports = False
        self.nudged = False
        self.next_heartbeat_at = sent_at + self.interval_s
        try:
            answer = self.control.heartbeat(request, timeout_s=max(0.2, self.interval_s))
        except NotRegistered as exc:
            self.registered = False
            return self._forgotten(f"the leader does not know this node ({exc})")
        except ControlPlaneUnreachable as exc:
            return f"no heartbeat reply: {exc}"
        except StreamEnded as exc:
            self.registered = False
            self.next_register_at = self.clock()
            return f"{exc}; registering again"
        # A push received before this reply is older than the reply's list: drop it.
        self._pushed = None
        self._acknowledged(reports, answer.acked_reports)
        if answer.heartbeat_interval_ms > 0:
            self.interval_s = answer.heartbeat_interval_ms / 1000
        if states.lease_status(answer) is NodeStatus.DEAD:
            self.registered = False
            return self._forgotten("the leader declared this node dead")
        was_fenced = self.lease.state is LeaseState.FENCED
        ttl = answer.lease_ttl_ms / 1000 if answer.lease_ttl_ms > 0 else None
        if not self.lease.renew(sent_at, ttl):
            return "heartbeat reply came too late to renew the lease"
        unwritten = self._write_lease_file(self.lease.valid_until)
        said = "lease renewed after fencing" if was_fenced else ""
        if not apply_desired:
            return "; ".join(s for s in (said, unwritten) if s)
        applied = self._apply(
            from_proto.desired_list_from_proto(answer.desired), may_start=not unwritten
        )
        return "; ".join(s for s in (said, unwritten, applied) if s)

    def _acknowledged(self, reports: list[MemberEvent], acked: int) -> None:
        """The first ``acked`` of ``reports`` (the head of :attr:`pending` when they were
        sent) were committed: an acknowledged exit is marked on disk, never reported
        again."""
        acked = max(0, min(acked, len(reports)))
        for report in reports[:acked]:
            if report.kind is MemberEventKind.EXITED:
                self.executor.mark_reported(_key_of(report))
        del self.pending[:acked]

    def _forgotten(self, why: str) -> str:
        """The leader forgot this node or declared it dead: kill every member and register
        again. Exits that happened before are collected first, so they are reported as
        the members' own (an exit 0 the leader has not committed yet still lets the job
        succeed, DESIGN §4) rather than as fenced; every report not yet acknowledged stays
        pending and goes out with the first heartbeat after registering."""
        self._collect_exits()
        self.next_register_at = self.clock()
        self._revoke_lease_file()
        exits = self.executor.kill_all(f"killed: {why}")
        for key, exit_ in exits:
            self.pending.append(_report(key, MemberEventKind.EXITED, exit_, fenced=True))
        if self.lease.state is LeaseState.HELD:
            self.lease.fence()
        return f"{why}; killed {len(exits)} member(s); registering again"

    def _apply(self, desired: Sequence[Wanted], may_start: bool = True) -> str:
        """Reconcile with the leader's desired list (idempotent). Without ``may_start``
        (the lease file cannot be written) members are stopped and preempted as asked but
        none is started."""
        highest = self.executor.highest_token
        for d, _ in desired:
            if d.fencing_token > highest.get(d.job_id, 0):
                highest[d.job_id] = d.fencing_token
        wanted: dict[MemberKey, Wanted] = {}
        for d, preempting in desired:
            if d.fencing_token >= highest.get(d.job_id, 0):
                wanted[d.key] = (d, preempting)
        counts: Counter[str] = Counter()
        self._reconcile_running(wanted, counts)
        running = self.executor.running()
        # GPUs of every member still running here, also those being stopped: a GPU is
        # given to a new member only once its holder's whole process tree is gone.
        busy_gpus = {g for gpus in self.executor.gpus_held().values() for g in gpus}
        for key, (d, preempting) in wanted.items():
            if key in self.executor.known or not may_start:
                continue
            if preempting is not None:
                # Preempted before it started here: it never runs, and its (immediate)
                # exit confirms to the leader that it is stopped.
                try:
                    self.executor.start(d, PreemptNotice(*preempting))
                except (OSError, ValueError) as exc:
                    log.error("could not record %s as stopped: %s", key, exc)
                    continue
                self.pending.append(_report(key, MemberEventKind.STARTED))
                self.fresh_reports = True
                continue
            if any(r.job_id == key.job_id and r.fencing_token < key.fencing_token for r in running):
                # An older attempt of this job is still stopping here; start the new
                # member once it is gone, never alongside it.
                continue
            if any(r[:3] == key[:3] for r in running):
                # Another generation of this rank is still stopping here (its GPUs failed
                # and the rank was placed again on others of this node): start this one
                # once it is gone, never alongside it.
                counts["rank_held"] += 1
                continue
            if busy_gpus.intersection(d.gpus):
                # The leader released these GPUs when the attempt holding them ended, but
                # its member here is still stopping: start once it is gone (its exit is
                # reported at once, and the next reply repeats this member).
                counts["waiting"] += 1
                continue
            try:
                member = self.executor.start(d)
            except (OSError, ValueError) as exc:
                log.error("could not start %s: %s", key, exc)
                continue
            self.fresh_reports = True
            if member.exit is not None and member.exit.node_fault:
                counts["refused"] += 1  # never started: its exit (the node's fault) says so
                continue
            self.pending.append(_report(key, MemberEventKind.STARTED))
            counts["started"] += 1
        return ", ".join(text.format(counts[name]) for name, text in _APPLIED if counts[name])

    def _reconcile_running(self, wanted: dict[MemberKey, Wanted], counts: Counter[str]) -> None:
        """Stop the running members no longer wanted, preempt those whose gang is being
        preempted, and tell the others of a new membership (a record with membership 0,
        every job without member replacement, costs nothing)."""
        for key in self.executor.running():
            if key not in wanted:
                self.executor.stop(key)
                counts["stopped"] += 1
            elif (preempting := wanted[key][1]) is not None:
                self.executor.preempt(key, PreemptNotice(*preempting))
                counts["preempted"] += 1
            elif wanted[key][0].membership and self.executor.tell_membership(wanted[key][0]):
                counts["told"] += 1


# What :meth:`Agent._apply` says it did, in this order.
_APPLIED = (
    ("started", "started {} member(s)"),
    ("stopped", "stopped {} member(s) no longer desired"),
    ("preempted", "{} member(s) being preempted"),
    ("told", "told {} member(s) of a new membership"),
    ("waiting", "{} member(s) waiting for GPUs a stopping member still holds"),
    ("rank_held", "{} member(s) waiting for their rank's other generation to end"),
    ("refused", "could not start {} member(s) (the node's fault)"),
)
