"""Why a job is where it is, and how an attempt ended, as values.

A :class:`Reason` is a code, typed parameters (sorted ``(name, value)`` pairs, values are
integers or strings) and, for reasons that follow from something else, the ``cause`` that
led to it (an attempt that failed because a member exited, a requeue because a node
died). Code that decides branches on ``code`` and reads parameters with :meth:`Reason.get`;
the sentence a person reads is made once, by :func:`render`, at the edges (gRPC
conversion, CLI, logs).

Two families of codes share the enum:

* *attempt outcomes* (``MEMBER_EXITED``, ``NODE_DEAD``, ``MEMBER_FENCED``, ...): how an
  attempt ended; they appear as ``Attempt.outcome`` and as the ``cause`` of a job reason;
* *job reasons* (``WAITING_CAPACITY``, ``RETRY_BACKOFF``, ``REQUEUED_NODE_DEAD``,
  ``FAILED_EXIT``, ...): the state a job is in and why.

``TEXT`` carries a sentence as is: a reason recorded by a version that had no codes, or
free text given by an operator.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from synapse_ha.core.workflows.windows import time_text

Param = tuple[str, int | str]


class ReasonCode(enum.StrEnum):
    TEXT = "text"

    # -- attempt outcomes (also the causes of job reasons)
    ALL_EXITED_ZERO = "all_exited_zero"  # members
    MEMBER_EXITED = "member_exited"  # rank, node, exit_code, detail
    MEMBER_FENCED = "member_fenced"  # rank, node, exit_code, detail
    MEMBER_LOST = "member_lost"  # rank, node, exit_code, detail
    NODE_DEAD = "node_dead"  # node, detail
    NODE_DRAINED = "node_drained"  # node, detail: an operator drained it (a lost member's cause)
    NODE_DEGRADED = "node_degraded"  # node, detail: found slow (a lost member's cause)
    GPU_UNHEALTHY = "gpu_unhealthy"  # node, gpus, code: a GPU the attempt held failed
    NODE_CANNOT_RUN = "node_cannot_run"  # rank, node, exit_code, detail
    MEMBER_HUNG = "member_hung"  # rank, node, exit_code, timeout_ms, detail
    START_TIMEOUT = "start_timeout"  # ranks, nodes, timeout_ms
    TIME_LIMIT = "time_limit"  # limit_ms
    CANCELLED_BY = "cancelled_by"  # text
    PREEMPTED = "preempted"  # preemptor, kind
    REQUEUE_REQUESTED = "requeue_requested"  # text: a requeue its owner or an operator asked
    # ranks, timeout_ms; cause: lost ranks not placed again within replace.timeout
    REPLACE_TIMEOUT = "replace_timeout"

    # -- pending
    PENDING_FIRST_PASS = "pending_first_pass"
    # members, request, level?, nodes?, room, domain?, images?, unhealthy?, spares?
    WAITING_CAPACITY = "waiting_capacity"
    WAITING_SHAPE = "waiting_shape"  # as WAITING_CAPACITY
    WAITING_LOCALITY = "waiting_locality"  # members, request, level, room?, domain?, wait_ms
    RESERVED_FOR_OTHER = "reserved_for_other"  # members, request, holder, start_in_ms?
    FIRST_IN_LINE_RESERVED = "first_in_line_reserved"  # as WAITING_CAPACITY + start_in_ms?, ahead?
    FITS_NOW = "fits_now"  # nodes
    RETRY_BACKOFF = "retry_backoff"  # attempt, retry, retries, backoff_ms; cause
    WAITING_STOP_CONFIRMED = "waiting_stop_confirmed"  # attempt, count, ranks
    REQUEUED_NODE_DEAD = "requeued_node_dead"  # attempt, requeue, max_requeues; cause
    REQUEUED_FENCED = "requeued_fenced"  # as REQUEUED_NODE_DEAD
    REQUEUED_LOST = "requeued_lost"  # as REQUEUED_NODE_DEAD
    REQUEUED_GPU_UNHEALTHY = "requeued_gpu_unhealthy"  # as REQUEUED_NODE_DEAD
    REQUEUED_NODE_CANNOT_RUN = "requeued_node_cannot_run"  # as REQUEUED_NODE_DEAD
    REQUEUED_REPLACE_TIMEOUT = "requeued_replace_timeout"  # as REQUEUED_NODE_DEAD
    # -- queues and preemption (DESIGN §8)
    REQUEUED_PREEMPTED = "requeued_preempted"  # attempt, preemptor, kind; cause
    REQUEUED_BY_REQUEST = "requeued_by_request"  # attempt; cause (a REQUEUE_REQUESTED)
    WAITING_QUOTA = "waiting_quota"  # queue, used, nominal, borrowing_limit?, borrowable, need
    WAITING_FOR_VICTIMS = "waiting_for_victims"  # count, kind, victims
    PREEMPTING = "preempting"  # preemptor, kind, grace_ms, deadline_ms (a live job's reason)
    WAITING_FOR_PREEMPTOR = "waiting_for_preemptor"  # preemptor, until_ms
    # count, kind, until_ms: from when it may preempt them (core/queues/victim_rules.py)
    WAITING_MIN_RUNTIME = "waiting_min_runtime"
    # start_ms, jobs, count, grace_ms, until_ms: it starts by then without preempting
    # (core/scheduler/pass_preemptions.py), and may preempt from until_ms on
    STARTS_WITHOUT_PREEMPTING = "starts_without_preempting"
    # hosts drained for it (core/scheduler/defrag.py): as WAITING_CAPACITY, jobs, until_ms?
    DEFRAGMENTING = "defragmenting"
    DRAINING_FOR = "draining_for"  # job, until_ms?: a node's reason: held for that gang
    # -- dependencies (core/workflows/dependencies.py)
    DEPENDENCY = "dependency"  # waiting (what it waits for, as text), count
    DEPENDENCY_NEVER_SATISFIED = "dependency_never_satisfied"  # job, kind, state
    # -- a job's window (core/workflows/windows.py)
    BEGIN_TIME = "begin_time"  # at_ms: not considered before then
    DEADLINE = "deadline"  # at_ms: cancelled, still pending at its deadline
    # -- arrays (core/workflows/arrays.py)
    ARRAY_THROTTLE = "array_throttle"  # array, throttle: its array runs that many already
    # -- a gang no set of the cluster's nodes could hold (core/feasibility.py)
    WAITING_FOR_NODES = "waiting_for_nodes"  # members, request, level?, missing
    # -- one owner's members at a cap (core/spec/member_limits.py): limit, allowed, queue?, user,
    # members, and running (the cluster's cap) or nodes (the nodes full to a node's cap)
    WAITING_MEMBER_CAP = "waiting_member_cap"

    # -- holding resources
    BOUND = "bound"  # attempt, hosts
    RUNNING = "running"  # attempt, replaced? (ranks placed again so far)
    REPLACING = "replacing"  # attempt, ranks; cause: lost ranks being placed again
    # attempt, members, size, for_job?: an elastic gang giving back its top ranks
    SHRINKING = "shrinking"

    # -- finished
    SUCCEEDED = "succeeded"  # members
    FAILED_EXIT = "failed_exit"  # attempt, retries; cause
    FAILED_START_TIMEOUT = "failed_start_timeout"  # attempt, retries; cause
    FAILED_ATTEMPT = "failed_attempt"  # attempt, retries; cause (any other failure)
    FAILED_HUNG = "failed_hung"  # attempt, retries; cause (a MEMBER_HUNG outcome)
    FAILED_TIME_LIMIT = "failed_time_limit"  # limit_ms
    FAILED_MAX_REQUEUES = "failed_max_requeues"  # attempt, requeues, max_requeues; cause
    CANCELLED = "cancelled"  # text
    # -- late success reports after a node death (DESIGN §4)
    EARLIER_ATTEMPT_SUCCEEDED = "earlier_attempt_succeeded"  # attempt, fencing_token
    SUCCEEDED_AFTER_NODE_DEATH = "succeeded_after_node_death"  # attempt, fencing_token,
    # members, node: every member of the attempt ended by the node's death had exited 0
    # -- a preempted gang whose every member exited 0 on its own (attempt, preemptor):
    # the exits came before the stop, and were reported after the preemption was decided
    SUCCEEDED_BEFORE_PREEMPTION = "succeeded_before_preemption"


# Disruptions: outcomes the job did not cause. They requeue the gang without touching
# ``retries.max`` (DESIGN §4), each to its own requeue reason.
REQUEUE_CODES: dict[ReasonCode, ReasonCode] = {
    ReasonCode.NODE_DEAD: ReasonCode.REQUEUED_NODE_DEAD,
    ReasonCode.GPU_UNHEALTHY: ReasonCode.REQUEUED_GPU_UNHEALTHY,
    ReasonCode.NODE_CANNOT_RUN: ReasonCode.REQUEUED_NODE_CANNOT_RUN,
    ReasonCode.MEMBER_FENCED: ReasonCode.REQUEUED_FENCED,
    ReasonCode.MEMBER_LOST: ReasonCode.REQUEUED_LOST,
    ReasonCode.REPLACE_TIMEOUT: ReasonCode.REQUEUED_REPLACE_TIMEOUT,
    ReasonCode.PREEMPTED: ReasonCode.REQUEUED_PREEMPTED,
}

# Reasons of a job waiting in the queue; with a cause, the outcome of its last attempt.
WAIT_CODES = frozenset(
    {
        ReasonCode.WAITING_CAPACITY,
        ReasonCode.WAITING_SHAPE,
        ReasonCode.WAITING_LOCALITY,
        ReasonCode.RESERVED_FOR_OTHER,
        ReasonCode.FIRST_IN_LINE_RESERVED,
        ReasonCode.WAITING_STOP_CONFIRMED,
        ReasonCode.FITS_NOW,
        ReasonCode.WAITING_QUOTA,
        ReasonCode.WAITING_FOR_VICTIMS,
        ReasonCode.WAITING_FOR_PREEMPTOR,
        ReasonCode.WAITING_MIN_RUNTIME,
        ReasonCode.STARTS_WITHOUT_PREEMPTING,
        ReasonCode.DEFRAGMENTING,
        ReasonCode.WAITING_FOR_NODES,
        ReasonCode.WAITING_MEMBER_CAP,
    }
)

# Failures: the job's final reason when retries are used up, by the outcome's code.
FAILURE_CODES: dict[ReasonCode, ReasonCode] = {
    ReasonCode.MEMBER_EXITED: ReasonCode.FAILED_EXIT,
    ReasonCode.START_TIMEOUT: ReasonCode.FAILED_START_TIMEOUT,
    ReasonCode.MEMBER_HUNG: ReasonCode.FAILED_HUNG,
}


@dataclass(frozen=True, slots=True)
class Reason:
    """A code with typed parameters and an optional cause. Build with :func:`reason`."""

    code: ReasonCode
    params: tuple[Param, ...] = ()
    cause: Reason | None = None

    def get(self, name: str, default: int | str = "") -> int | str:
        for key, value in self.params:
            if key == name:
                return value
        return default

    def num(self, name: str) -> int:
        value = self.get(name, 0)
        return value if isinstance(value, int) else 0

    def text(self, name: str) -> str:
        return str(self.get(name, ""))

    def has(self, name: str) -> bool:
        return any(key == name for key, _ in self.params)


def reason(code: ReasonCode, cause: Reason | None = None, /, **params: int | str | None) -> Reason:
    """A :class:`Reason` with ``params`` sorted by name; ``None`` values are left out."""
    return Reason(code, tuple(sorted((k, v) for k, v in params.items() if v is not None)), cause)


def text(sentence: str) -> Reason:
    """A reason that is only a sentence (older records, operator text)."""
    return Reason(ReasonCode.TEXT, (("text", sentence),))


PENDING_FIRST_PASS = Reason(ReasonCode.PENDING_FIRST_PASS)


# ------------------------------------------------------------------------ withheld

# Parameters that carry text the job controls (a member's exit detail holds what the
# worker said about its command: its argv, its image, its workdir) or that its owner or
# an operator wrote (a cancel reason, a sentence of an older release). DESIGN §8: only the
# job's owner and operators see them.
_JOB_TEXT: dict[ReasonCode, str] = {
    ReasonCode.TEXT: "text",
    ReasonCode.MEMBER_EXITED: "detail",
    ReasonCode.MEMBER_FENCED: "detail",
    ReasonCode.MEMBER_LOST: "detail",
    ReasonCode.NODE_CANNOT_RUN: "detail",
    ReasonCode.MEMBER_HUNG: "detail",
    ReasonCode.CANCELLED_BY: "text",
    ReasonCode.CANCELLED: "text",
    ReasonCode.REQUEUE_REQUESTED: "text",
}
WITHHELD = "withheld"  # a parameter set on a reason whose job text was withheld


def withheld(r: Reason | None) -> Reason | None:
    """``r`` (and its causes) without the text the job controls, for someone who may not
    manage the job: the code and every other parameter stay, so the sentence still says
    what happened (``rank 0 on n1 exited with code 127 [details withheld]``)."""
    if r is None:
        return None
    cause = withheld(r.cause)
    name = _JOB_TEXT.get(r.code)
    params = r.params
    if name is not None and r.text(name):
        params = tuple(sorted([(k, v) for k, v in r.params if k != name] + [(WITHHELD, 1)]))
    if params is r.params and cause is r.cause:
        return r
    return Reason(r.code, params, cause)


# --------------------------------------------------------------------------- render


def render(r: Reason | None) -> str:
    """The sentence for people. The only place reasons become words."""
    if r is None:
        return ""
    fn = _RENDER.get(r.code)
    sentence = fn(r) if fn is not None else r.code.value
    if r.has(WITHHELD):
        sentence = f"{sentence.rstrip(': ')} [details withheld]".lstrip()
    if r.code in WAIT_CODES and r.cause is not None:
        how = "requeued after a disruption" if r.cause.code in REQUEUE_CODES else "retrying after"
        sentence += f" ({how}: {render(r.cause)})"
    return sentence


def _seconds(ms: int) -> str:
    return f"{ms / 1000:g}s"


def _duration(ms: int) -> str:
    """``30m``, ``2h``, ``1h30m``, ``45s``: whole units where they divide."""
    if ms % 1000:
        return _seconds(ms)
    hours, rest = divmod(ms // 1000, 3600)
    minutes, secs = divmod(rest, 60)
    units = ((hours, "h"), (minutes, "m"), (secs, "s"))
    return "".join(f"{v}{unit}" for v, unit in units if v) or "0s"


def _need(r: Reason) -> str:
    p = dict(r.params)  # one look per parameter: waiting reasons are rendered in every list
    level = p.get("level", "")
    where = f" in one {level}" if level else ""
    if "nodes" in p:  # its node selector (core/node_selector.py)
        where += f" on nodes with {p['nodes']}"
    reserved = f"; a node reserves {p['reserved']} each" if "reserved" in p else ""
    return f"needs {_num(p, 'members')} member(s) x ({p.get('request', '')}{reserved}){where}"


def _have(r: Reason) -> str:
    p = dict(r.params)
    domain = p.get("domain", "")
    room = _num(p, "room")
    have = f"best {domain} has room for {room}" if domain else f"the cluster has room for {room}"
    if "images" in p:
        have += " (only nodes that run container images qualify)"
    if "nodes" in p:
        have += " (only the nodes it selects qualify)"
    if "unhealthy" in p:
        have += (
            f"; {_num(p, 'unhealthy')} unhealthy GPU(s) are left out until repaired "
            "(synctl nodes, column UNHEALTHY)"
        )
    if "spares" in p:
        have += (
            f"; {_num(p, 'spares')} idle node(s) are kept as spares for member replacements "
            "(synctl nodes, column SPARE)"
        )
    return have


def _num(params: dict[str, int | str], name: str) -> int:
    """A parameter as :meth:`Reason.num` reads it: an int, else 0."""
    value = params.get(name, 0)
    return value if isinstance(value, int) else 0


def _in_line(r: Reason) -> str:
    n = r.num("ahead")  # reservations of the same pass before this one
    if n < 2:
        return "in line behind 1 gang that also holds a reservation" if n else "first in line"
    return f"in line behind {n} gangs that also hold reservations"


def _when(r: Reason) -> str:
    if not r.has("start_in_ms"):
        return "until jobs without a time limit end"
    return f"starting in {_duration(r.num('start_in_ms') // 1000 * 1000)}"


def _member(r: Reason, what: str) -> str:
    detail = r.text("detail")
    return f"rank {r.num('rank')} on {r.text('node')} {what} {r.num('exit_code')}" + (
        f": {detail}" if detail else ""
    )


def _hung(r: Reason) -> str:
    """``rank 0 on n1 hung and was stopped, code 143: no progress for 30m (...)``; without
    the worker's detail, the timeout it broke."""
    who = f"rank {r.num('rank')} on {r.text('node')}"
    detail = r.text("detail")
    if detail:
        return f"{who} hung and was stopped, code {r.num('exit_code')}: {detail}"
    return (
        f"{who} hung: no progress for {_duration(r.num('timeout_ms'))} (progress.timeout); "
        f"stopped, code {r.num('exit_code')}"
    )


def _cause(r: Reason) -> str:
    return render(r.cause) if r.cause is not None else "unknown cause"


def _member_cap(r: Reason) -> str:
    """``user alice runs 10000 member(s) and this gang has 1; limits.running_members_per_user
    allows 10000; ...``: the cap, its value and where it is set."""
    limit, user, allowed = r.text("limit"), r.text("user") or "(no owner)", r.num("allowed")
    named = f"queue {r.text('queue')}'s {limit}" if r.has("queue") else f"limits.{limit}"
    if r.has("nodes"):
        said = (
            f"it would fit but for {named}: at most {allowed} of user {user}'s members on a "
            f"node ({r.num('nodes')} node(s) have that many), too few for its "
            f"{r.num('members')} member(s) where there is room"
        )
    else:
        said = (
            f"user {user} runs {r.num('running')} member(s) and this gang has "
            f"{r.num('members')}; {named} allows {allowed}"
        )
    return f"{said}; it waits for some of them to end"


def _requeued(r: Reason) -> str:
    return (
        f"attempt {r.num('attempt')} ended by a disruption ({_cause(r)}); requeue "
        f"{r.num('requeue')} of {r.num('max_requeues')}, not counted against retries; "
        f"the gang keeps its place in line"
    )


def _text(r: Reason) -> str:
    return r.text("text")


def _all_exited_zero(r: Reason) -> str:
    return f"all {r.num('members')} members exited 0"


def _time_limit(r: Reason) -> str:
    return f"time limit of {r.num('limit_ms') // 1000}s exceeded"


def _failed(r: Reason) -> str:
    return f"attempt {r.num('attempt')} failed ({_cause(r)}); {r.num('retries')} retries used"


_RENDER: dict[ReasonCode, Callable[[Reason], str]] = {
    ReasonCode.TEXT: _text,
    ReasonCode.ALL_EXITED_ZERO: _all_exited_zero,
    ReasonCode.MEMBER_EXITED: lambda r: _member(r, "exited with code"),
    ReasonCode.MEMBER_FENCED: lambda r: _member(
        r, "was stopped by fencing (its worker lost its lease), code"
    ),
    ReasonCode.MEMBER_LOST: lambda r: _member(r, "was lost by its worker, code"),
    ReasonCode.NODE_CANNOT_RUN: lambda r: _member(r, "could not be started by its node, code"),
    ReasonCode.MEMBER_HUNG: lambda r: _hung(r),
    ReasonCode.NODE_DEAD: lambda r: (
        f"node {r.text('node')} was declared dead"
        + (f" ({r.text('detail')})" if r.text("detail") else "")
    ),
    ReasonCode.NODE_DRAINED: lambda r: (
        f"node {r.text('node')} was drained"
        + (f" ({r.text('detail')})" if r.text("detail") else "")
    ),
    ReasonCode.NODE_DEGRADED: lambda r: (
        f"node {r.text('node')} was found slow"
        + (f" ({r.text('detail')})" if r.text("detail") else "")
    ),
    ReasonCode.GPU_UNHEALTHY: lambda r: (
        f"GPU(s) {r.text('gpus')} of node {r.text('node')} turned unhealthy ({r.text('code')})"
    ),
    ReasonCode.START_TIMEOUT: lambda r: (
        f"rank(s) {r.text('ranks')} on {r.text('nodes')} not running "
        f"{_seconds(r.num('timeout_ms'))} after bind (start_timeout_ms)"
    ),
    ReasonCode.TIME_LIMIT: _time_limit,
    ReasonCode.CANCELLED_BY: lambda r: f"cancelled: {r.text('text')}",
    ReasonCode.REQUEUE_REQUESTED: lambda r: f"requeued on request: {r.text('text')}",
    ReasonCode.PENDING_FIRST_PASS: lambda r: "waiting for the next scheduling pass",
    ReasonCode.WAITING_CAPACITY: lambda r: (
        f"{_need(r)}; {_have(r)}; it waits for capacity to free or for nodes to join"
    ),
    ReasonCode.WAITING_FOR_NODES: lambda r: f"waits for nodes to join: {r.text('missing')}",
    ReasonCode.WAITING_MEMBER_CAP: _member_cap,
    ReasonCode.WAITING_SHAPE: lambda r: (
        f"{_need(r)}; {_have(r)}, but not in a shape the gang can use; it waits for capacity"
    ),
    ReasonCode.WAITING_LOCALITY: lambda r: (
        f"{_need(r)}; it would fit across {r.text('wait_level')}s now, but it waits for one "
        f"{r.text('wait_level')} with room"
        + (f" (best {r.text('domain')} has room for {r.num('room')})" if r.text("domain") else "")
        + f", for up to {r.num('wait_ms') / 1000:.0f}s after it was queued "
        f"(locality_wait_ms), then takes the tightest fit across {r.text('wait_level')}s"
    ),
    ReasonCode.RESERVED_FOR_OTHER: lambda r: (
        f"{_need(r)}; it would fit, but the nodes are reserved for {r.text('holder')} "
        f"{_when(r)}; a time_limit ending before then would let it backfill"
    ),
    ReasonCode.FIRST_IN_LINE_RESERVED: lambda r: (
        f"{_need(r)}; {_have(r)}; {_in_line(r)}, capacity reserved {_when(r)}"
    ),
    ReasonCode.FITS_NOW: lambda r: (
        f"placed on {r.text('nodes')} by the latest scheduling pass; waiting for the bind to commit"
    ),
    ReasonCode.RETRY_BACKOFF: lambda r: (
        f"attempt {r.num('attempt')} failed ({_cause(r)}); retry {r.num('retry')} of "
        f"{r.num('retries')} after a {r.num('backoff_ms') / 1000:.1f}s back-off"
    ),
    ReasonCode.WAITING_STOP_CONFIRMED: lambda r: (
        f"waiting for {r.num('count')} member(s) of attempt {r.num('attempt')} "
        f"to be confirmed stopped before the next attempt (ranks {r.text('ranks')})"
    ),
    # Every disruption's requeue but a preemption's (below) says the same.
    **dict.fromkeys(REQUEUE_CODES.values(), _requeued),
    ReasonCode.BOUND: lambda r: (
        f"attempt {r.num('attempt')} bound to {r.num('hosts')} node(s); "
        f"waiting for members to start"
    ),
    ReasonCode.RUNNING: lambda r: (
        f"attempt {r.num('attempt')} running"
        + (f" with {r.num('members')} of {r.num('most')} members" if r.has("most") else "")
        + (f" ({r.num('replaced')} member(s) placed again)" if r.has("replaced") else "")
    ),
    ReasonCode.SHRINKING: lambda r: (
        f"attempt {r.num('attempt')} running; shrinking from {r.num('members')} to "
        f"{r.num('size')} members"
        + (f" to make room for {r.text('for_job')}" if r.has("for_job") else "")
    ),
    ReasonCode.REPLACING: lambda r: (
        f"attempt {r.num('attempt')} running; rank(s) {r.text('ranks')} lost ({_cause(r)}), "
        f"being placed again while the other members run on"
    ),
    ReasonCode.REPLACE_TIMEOUT: lambda r: (
        f"rank(s) {r.text('ranks')} not placed again within {_seconds(r.num('timeout_ms'))} "
        f"(replace.timeout) after they were lost ({_cause(r)})"
    ),
    ReasonCode.SUCCEEDED: _all_exited_zero,
    ReasonCode.FAILED_EXIT: _failed,
    ReasonCode.FAILED_START_TIMEOUT: lambda r: (
        f"attempt {r.num('attempt')} failed to start ({_cause(r)}); {r.num('retries')} retries used"
    ),
    ReasonCode.FAILED_ATTEMPT: _failed,
    ReasonCode.FAILED_HUNG: lambda r: (
        f"attempt {r.num('attempt')} failed: a member hung ({_cause(r)}); "
        f"{r.num('retries')} retries used"
    ),
    ReasonCode.FAILED_TIME_LIMIT: _time_limit,
    ReasonCode.FAILED_MAX_REQUEUES: lambda r: (
        f"attempt {r.num('attempt')} ended by a disruption ({_cause(r)}) after "
        f"{r.num('requeues')} requeue(s); max_requeues ({r.num('max_requeues')}) reached, "
        f"so the job failed"
    ),
    ReasonCode.CANCELLED: _text,
    ReasonCode.PREEMPTED: lambda r: f"preempted by {r.text('preemptor')} ({_kind(r)})",
    ReasonCode.REQUEUED_BY_REQUEST: lambda r: (
        f"attempt {r.num('attempt')} was stopped to be requeued ({_cause(r)}); "
        f"not counted against retries or max_requeues; the gang keeps its place in line"
    ),
    ReasonCode.REQUEUED_PREEMPTED: lambda r: (
        f"attempt {r.num('attempt')} was preempted by {r.text('preemptor')} ({_kind(r)}); "
        f"requeued, not counted against retries or max_requeues; "
        f"the gang keeps its place in line"
    ),
    ReasonCode.WAITING_QUOTA: lambda r: (
        f"queue {r.text('queue')} uses {r.num('used')}/{r.num('nominal')} GPUs, "
        + (
            f"borrowing limit {r.num('borrowing_limit')}"
            if r.has("borrowing_limit")
            else "no borrowing limit"
        )
        + f", {r.num('borrowable')} idle GPU(s) of its cohort to borrow; "
        f"this gang needs {r.num('need')}"
    ),
    ReasonCode.WAITING_FOR_VICTIMS: lambda r: (
        f"waiting for {r.num('count')} preempted gang(s) to stop ({_kind(r)}): "
        f"{r.text('victims')}; their GPUs are kept for this gang"
    ),
    ReasonCode.WAITING_FOR_PREEMPTOR: lambda r: (
        f"preempted by {r.text('preemptor')}, which takes the GPUs it freed first; "
        "this gang waits until it has been placed (or a short while has passed)"
    ),
    ReasonCode.WAITING_MIN_RUNTIME: lambda r: (
        f"no room yet: {r.num('count')} gang(s) it may preempt ({_kind(r)}) are within "
        f"their minimum run time; it may preempt from {time_text(r.num('until_ms'))} on, "
        "if it still needs to"
    ),
    ReasonCode.STARTS_WITHOUT_PREEMPTING: lambda r: (
        f"no room yet; it starts by ~{time_text(r.num('start_ms'))}, when {r.text('jobs')} "
        f"end(s) (their time limits or estimates), which is no later than gangs preempted "
        f"for it would stop (a grace of {_seconds(r.num('grace_ms'))}), so it preempts "
        f"nobody; should they run on, it may preempt from {time_text(r.num('until_ms'))}"
    ),
    ReasonCode.DEFRAGMENTING: lambda r: (
        f"{_need(r)}; the free GPUs add up to enough but are scattered: waiting for "
        f"{r.num('count')} host(s) to drain ({r.text('hosts')}): {_drained_when(r)}; "
        "only gangs that end before then start there"
    ),
    ReasonCode.DRAINING_FOR: lambda r: (
        f"draining for {r.text('job')} (defragmentation): no new gangs here but those that "
        + (f"end before ~{time_text(r.num('until_ms'))}" if r.has("until_ms") else "none")
    ),
    ReasonCode.DEPENDENCY: lambda r: f"waiting for {r.text('waiting')}",
    ReasonCode.BEGIN_TIME: lambda r: f"not considered before {time_text(r.num('at_ms'))} (begin)",
    ReasonCode.DEADLINE: lambda r: (
        f"cancelled: still pending at its deadline, {time_text(r.num('at_ms'))}"
    ),
    ReasonCode.ARRAY_THROTTLE: lambda r: (
        f"waiting for a slot of array {r.text('array')}: at most {r.num('throttle')} of its "
        f"tasks run at once (its %{r.num('throttle')} throttle)"
    ),
    ReasonCode.DEPENDENCY_NEVER_SATISFIED: lambda r: (
        f"cancelled: its dependency {r.text('kind')} on {r.text('job')} can never be met "
        f"({r.text('job')} {r.text('state')})"
    ),
    ReasonCode.PREEMPTING: lambda r: (
        f"being preempted by {r.text('preemptor')} ({_kind(r)}); its members got SIGTERM "
        f"and are killed after a grace period of {_seconds(r.num('grace_ms'))}; "
        f"it will be requeued, keeping its place in line"
    ),
    ReasonCode.EARLIER_ATTEMPT_SUCCEEDED: lambda r: (
        f"stopped: attempt {r.num('attempt')} (token {r.num('fencing_token')}) had already "
        f"succeeded; its members' exits were reported after its node was declared dead"
    ),
    ReasonCode.SUCCEEDED_AFTER_NODE_DEATH: lambda r: (
        f"all {r.num('members')} members of attempt {r.num('attempt')} (token "
        f"{r.num('fencing_token')}) exited 0; node {r.text('node')} had been declared dead "
        f"before their exits were reported, so no further attempt runs"
    ),
    ReasonCode.SUCCEEDED_BEFORE_PREEMPTION: lambda r: (
        f"all {r.num('members')} members of attempt {r.num('attempt')} exited 0 by "
        f"themselves before {r.text('preemptor')}'s preemption stopped them; their exits "
        f"were reported after it was decided, so the job succeeded and is not requeued"
    ),
}


def _drained_when(r: Reason) -> str:
    known = f"end(s) ~{time_text(r.num('until_ms'))}" if r.has("until_ms") else "have no estimate"
    return f"{r.text('jobs')} {known}"


def _kind(r: Reason) -> str:
    kind = r.text("kind")
    return {
        "reclaim": "reclaim: its queue takes back quota lent to a borrowing queue",
        "priority": "priority: a higher priority class of the same queue",
        "fair_share": "fair share: a queue below its fair share takes from a borrowing "
        "queue above it",
    }.get(kind, kind)


def ranks_text(ranks: list[int], limit: int = 8) -> str:
    """``0, 1, 2`` — at most ``limit`` ranks, then ``...``."""
    shown = ", ".join(map(str, ranks[:limit]))
    return shown + (", ..." if len(ranks) > limit else "")
