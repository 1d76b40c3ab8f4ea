"""The checker's node-fitness rules (DESIGN §4: "The node's fault is never the job's"),
pure functions of a :class:`~chaos.history.History` and the final replicated state.

``node-fault-failed``
    No job fails because its node could not start a member: an attempt that ended
    ``node_cannot_run`` must have been requeued (attempt state ``requeued``, counted in
    the job's ``requeues``), and no job is FAILED whose failure reason chain holds a node
    fault (``node_cannot_run`` or ``requeued_node_cannot_run``: the job's reason, the
    causes it names, its last attempt's outcome) unless its requeues ran out
    (``failed_max_requeues``, which the ``not-completed`` rule reports anyway). Read from
    the replicas' history of finished jobs (``job_history.json``) and the final state.
``unfit-bind``
    No attempt is bound to a node for an owner while the replicated state held that node
    unfit for that owner. The spans come from the ``node-cannot-run`` faults' records
    (every unfit entry the nemesis saw in the node list while the fault and its heal
    lasted) and the final state's entries: an entry ``(owner, until_ms)`` made by a
    failure at ``until_ms - unfit_backoff`` holds the node unfit strictly after that
    failure and before ``until_ms``. The leader checks the same entry with the same clock
    at the bind (``bound_at_ms`` is the bind's stamp), so no slack is needed; a bind
    stamped at the very millisecond of the failure was applied before it. Binds come
    from the job history (each ended attempt with its nodes and the job's owner) and
    the final state (each job's last attempt). A member placed again (member
    replacement, or an elastic gang's growth: generation 1 and up) was bound later than
    its attempt: in the final state its own ``bound_at_ms`` is its bind. The history
    keeps only an ended attempt's nodes, so a node of it has no known bind, and is not
    judged, when the members that started there were all placed again, or when the gang
    places members after its bind (it replaces lost members or is elastic) and no member
    of generation 0 started there: a member placed on a node that refuses to run it
    never starts.
"""

from __future__ import annotations

from collections import defaultdict

from chaos.history import History, JobHistory, UnfitSpan, Violation
from synapse_ha.core.model import AttemptState, ClusterState, Job, JobState
from synapse_ha.core.reasons import Reason, ReasonCode
from synapse_ha.core.views import host_of

NODE_CANNOT_RUN = ReasonCode.NODE_CANNOT_RUN.value
NODE_FAULT_CODES = frozenset(
    {ReasonCode.NODE_CANNOT_RUN.value, ReasonCode.REQUEUED_NODE_CANNOT_RUN.value}
)
MAX_REQUEUES = ReasonCode.FAILED_MAX_REQUEUES.value


def reason_chain(r: Reason | None) -> list[str]:
    """The codes of ``r`` and every cause below it."""
    out = []
    while r is not None:
        out.append(r.code.value)
        r = r.cause
    return out


def _history_breaches(job: JobHistory) -> list[str]:
    """Why a finished job breaks ``node-fault-failed``, one sentence per breach."""
    out = []
    refused = [a for a in job.attempts if a.outcome_code == NODE_CANNOT_RUN]
    for a in refused:
        if a.state is not AttemptState.REQUEUED:
            out.append(f"attempt {a.number} (token {a.token}) ended node_cannot_run as {a.state}")
    if refused and job.requeues < len(refused):
        out.append(
            f"{len(refused)} attempts ended node_cannot_run but only {job.requeues} requeues"
        )
    last = max(job.attempts, key=lambda a: a.number, default=None)
    chain = [job.reason_code, *([last.outcome_code] if last is not None else [])]
    if job.state is JobState.FAILED and job.reason_code != MAX_REQUEUES:
        faults = sorted(NODE_FAULT_CODES.intersection(chain))
        if faults:
            out.append(f"FAILED ({job.reason_code}) with a node fault in its reason: {faults[0]}")
    return out


def _state_breaches(job: Job) -> list[str]:
    """Why a job of the final state (its last attempt) breaks ``node-fault-failed``."""
    attempt = job.attempt
    out = []
    chain = reason_chain(job.reason)
    if attempt is not None:
        outcome = reason_chain(attempt.outcome)
        chain += outcome
        refused = outcome[:1] == [NODE_CANNOT_RUN]
        if refused and (attempt.state is not AttemptState.REQUEUED or job.requeues < 1):
            out.append(
                f"last attempt {attempt.number} ended node_cannot_run as {attempt.state} "
                f"with {job.requeues} requeues"
            )
    if job.state is JobState.FAILED and job.reason.code is not ReasonCode.FAILED_MAX_REQUEUES:
        faults = sorted(NODE_FAULT_CODES.intersection(chain))
        if faults:
            out.append(f"FAILED ({job.reason.code}) with a node fault in its reason: {faults[0]}")
    return out


def check_node_fault_failures(history: History, state: ClusterState | None) -> list[Violation]:
    """``node-fault-failed`` (see the module docstring)."""
    jobs = {j.job: j for j in history.job_history}
    breaches = [(job_id, why) for job_id in sorted(jobs) for why in _history_breaches(jobs[job_id])]
    for job in sorted(state.jobs.values(), key=lambda j: j.job_id) if state else []:
        if job.job_id not in jobs:
            breaches += [(job.job_id, why) for why in _state_breaches(job)]
    return [Violation("node-fault-failed", job_id, why) for job_id, why in breaches]


def unfit_spans(history: History, state: ClusterState | None) -> list[UnfitSpan]:
    """The nemesis's spans and the final state's unfit entries."""
    spans = list(history.unfit)
    if state is not None:
        backoff = state.config.unfit_backoff_ms
        for node in state.nodes.values():
            spans += [UnfitSpan(node.node_id, u.owner, u.until_ms, backoff) for u in node.unfit]
    return spans


def started_generations(
    history: History, state: ClusterState | None
) -> dict[tuple[str, int, str], set[int]]:
    """(job, token, node) -> the generations of the attempt's members that started there
    (0: bound with the attempt; 1 and up: placed there later)."""
    if state is None:
        return {}
    node_of = {host_of(n.info.address): n.node_id for n in state.nodes.values()}
    generations: dict[tuple[str, int, str], set[int]] = defaultdict(set)
    for r in history.members:
        if r.type == "start" and host_of(r.node) in node_of:
            generations[(r.job, r.token, node_of[host_of(r.node)])].add(r.generation)
    return generations


def binds(history: History, state: ClusterState | None) -> list[tuple[str, int, str, int, str]]:
    """(job, fencing token, owner, bind time, node) of every attempt known, once each; a
    member placed again has its own bind. An ended attempt's node is known to have been
    bound with the attempt unless its members may have come later: those that started
    there were all placed again, or the gang places members after its bind (it replaces
    lost members or is elastic) and none of generation 0 started there."""
    out: dict[tuple[str, int, str], tuple[str, int]] = {}
    started = started_generations(history, state)
    for j in history.job_history:
        for a in j.attempts:
            for node in a.nodes:
                gens = started.get((j.job, a.token, node), set())
                if (gens and min(gens) > 0) or (j.places_later and 0 not in gens):
                    continue
                out[(j.job, a.token, node)] = (j.owner, a.bound_at_ms)
    for job in state.jobs.values() if state is not None else ():
        if job.attempt is not None:
            for m, status in zip(job.attempt.members, job.attempt.member_status, strict=True):
                key = (job.job_id, job.attempt.fencing_token, m.node_id)
                bound = job.attempt.bound_at_ms
                if m.generation and status.bound_at_ms is not None:
                    bound = status.bound_at_ms
                if key not in out or m.generation == 0:
                    out[key] = (job.owner, bound)
    return sorted((job, token, owner, at, node) for (job, token, node), (owner, at) in out.items())


def check_unfit_binds(history: History, state: ClusterState | None) -> list[Violation]:
    """``unfit-bind`` (see the module docstring)."""
    by_node: dict[tuple[str, str], list[UnfitSpan]] = defaultdict(list)
    for span in unfit_spans(history, state):
        by_node[(span.node, span.owner)].append(span)
    if not by_node:
        return []
    out: list[Violation] = []
    for job, token, owner, bound, node in binds(history, state):
        spans = by_node.get((node, owner), ())
        hit = next((s for s in spans if s.since_ms < bound < s.until_ms), None)
        if hit is None:
            continue
        out.append(
            Violation(
                "unfit-bind",
                job,
                f"token {token} bound to {node} at {bound} while the node was unfit for "
                f"{owner or 'its owner'} (from {hit.since_ms} until {hit.until_ms})",
            )
        )
    return out
