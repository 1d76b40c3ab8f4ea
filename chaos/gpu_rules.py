"""The checker's GPU-health rules (DESIGN §4: "GPU health is replicated state", "The
node's fault is never the job's"), pure functions of a :class:`~chaos.history.History`
and the final replicated state.

``unhealthy-start``
    No member starts on a GPU that was unhealthy in the replicated state at its attempt's
    bind time. A member's node and GPUs come from its ``start`` record; its attempt's
    bind time (leader clock) from the replicas' history of finished jobs
    (``job_history.json``, every ended attempt) or the final state (each job's last
    attempt). A member placed again (member replacement, generation 1 and up) was bound
    on its own: its bind is its ``bound_at_ms`` in the final state's attempt while it is
    still that rank's member there, and unknown (not judged) otherwise. The GPU was
    unhealthy from the fault's ``since_ms`` (leader clock, as the nemesis read it from
    the node list) until its repair; the repair's own stamp is not
    returned, so the span ends :data:`REPAIR_SLACK_MS` before the suite sent the repair
    (the replicas' steady clock and the suite's wall clock are the same machine's clock,
    apart from drift since the replica started). A fault still in the final state has no
    end. Binds between the injection and ``since_ms`` are allowed: the leader could not
    know yet (the gang is requeued when the report is applied).
``gpu-fault-failed``
    No job fails because of a node fault: an attempt ended ``gpu_unhealthy`` must have
    been requeued (attempt state ``requeued``, counted in the job's ``requeues``, never
    in its ``retries_used``), and a job whose last attempt ended so is not FAILED unless
    its requeues ran out (``failed_max_requeues``, which the ``not-completed`` rule
    reports anyway). Read from the history of finished jobs and the final state.

What the rules allow, because the ``gpu-xid`` heal restarts the worker and repairs the
GPU: the GPU is bound again after the repair (a bind after the span is fine), and the
restart ends the attempts of every gang on that worker, as ``kill-worker`` does (those are
requeues of other kinds, which no GPU rule looks at).
"""

from __future__ import annotations

from collections import defaultdict

from chaos.history import GpuUnhealthy, History, JobHistory, Violation
from synapse_ha.core.model import AttemptState, ClusterState, JobState
from synapse_ha.core.reasons import ReasonCode
from synapse_ha.core.views import host_of

# How much earlier than the suite's "repair sent" the repair may have been stamped: the
# drift between a replica's steady clock and the suite's wall clock.
REPAIR_SLACK_MS = 500
GPU_UNHEALTHY = ReasonCode.GPU_UNHEALTHY.value


def unhealthy_spans(history: History, state: ClusterState | None) -> list[GpuUnhealthy]:
    """The nemesis's spans and every fault still in the final state (never repaired)."""
    spans = list(history.gpu_unhealthy)
    if state is not None:
        for node in state.nodes.values():
            host = host_of(node.info.address)
            spans += [GpuUnhealthy(host, f.gpu, f.since_ms) for f in node.gpu_faults]
    return spans


def bind_times(history: History, state: ClusterState | None) -> dict[tuple[str, int], int]:
    """(job, fencing token) -> the attempt's bind time (leader clock)."""
    binds = {(j.job, a.token): a.bound_at_ms for j in history.job_history for a in j.attempts}
    if state is not None:
        for job in state.jobs.values():
            if job.attempt is not None:
                binds[(job.job_id, job.attempt.fencing_token)] = job.attempt.bound_at_ms
    return binds


def member_binds(state: ClusterState | None) -> dict[tuple[str, int, int, int], int]:
    """(job, token, rank, generation) -> the bind of each member placed again that the
    final state's last attempts still hold."""
    out: dict[tuple[str, int, int, int], int] = {}
    for job in state.jobs.values() if state is not None else ():
        a = job.attempt
        if a is None:
            continue
        for m, status in zip(a.members, a.member_status, strict=True):
            if m.generation and status.bound_at_ms is not None:
                out[(job.job_id, a.fencing_token, m.rank, m.generation)] = status.bound_at_ms
    return out


def _unhealthy_at(span: GpuUnhealthy, at_ms: int) -> bool:
    end = span.repair_sent_ms - REPAIR_SLACK_MS if span.repair_sent_ms else None
    return span.since_ms <= at_ms and (end is None or at_ms < end)


def check_unhealthy_starts(history: History, state: ClusterState | None) -> list[Violation]:
    """``unhealthy-start`` (see the module docstring)."""
    by_gpu: dict[tuple[str, int], list[GpuUnhealthy]] = defaultdict(list)
    for span in unhealthy_spans(history, state):
        by_gpu[(span.node, span.gpu)].append(span)
    if not by_gpu:
        return []
    binds, replaced = bind_times(history, state), member_binds(state)
    out: list[Violation] = []
    reported: set[tuple[str, int, int, int]] = set()
    for r in sorted(history.members, key=lambda r: r.mono_ns):
        bound = replaced.get(r.member) if r.generation else binds.get((r.job, r.token))
        if r.type != "start" or bound is None:
            continue
        host = host_of(r.node)
        for gpu in r.gpus:
            key = (r.job, r.token, r.rank, gpu)
            hit = next((s for s in by_gpu.get((host, gpu), ()) if _unhealthy_at(s, bound)), None)
            if hit is None or key in reported:
                continue
            reported.add(key)
            repaired = "never repaired"
            if hit.repair_sent_ms:
                repaired = f"repair sent at {hit.repair_sent_ms}"
            out.append(
                Violation(
                    "unhealthy-start",
                    r.job,
                    f"rank {r.rank} of token {r.token} started on GPU {gpu} of {host}, bound "
                    f"at {bound} while the GPU was unhealthy (since {hit.since_ms}, "
                    f"{repaired})",
                )
            )
    return out


def _job_failures(job: JobHistory) -> list[str]:
    """Why a finished job breaks ``gpu-fault-failed``, one sentence per breach."""
    out = []
    sick = [a for a in job.attempts if a.outcome_code == GPU_UNHEALTHY]
    for a in sick:
        if a.state is not AttemptState.REQUEUED:
            out.append(f"attempt {a.number} (token {a.token}) ended gpu_unhealthy as {a.state}")
    if sick and job.requeues < len(sick):
        out.append(f"{len(sick)} attempts ended gpu_unhealthy but only {job.requeues} requeues")
    last = max(job.attempts, key=lambda a: a.number, default=None)
    if (
        last is not None
        and last.outcome_code == GPU_UNHEALTHY
        and job.state is JobState.FAILED
        and job.reason_code != ReasonCode.FAILED_MAX_REQUEUES.value
    ):
        out.append(f"FAILED ({job.reason_code}) after its last attempt ended gpu_unhealthy")
    return out


def check_gpu_fault_failures(history: History, state: ClusterState | None) -> list[Violation]:
    """``gpu-fault-failed`` (see the module docstring)."""
    jobs = {j.job: j for j in history.job_history}
    out: list[Violation] = []
    for job_id in sorted(jobs):
        out += [Violation("gpu-fault-failed", job_id, why) for why in _job_failures(jobs[job_id])]
    for job in sorted(state.jobs.values(), key=lambda j: j.job_id) if state else []:
        attempt = job.attempt
        if job.job_id in jobs or attempt is None or attempt.outcome is None:
            continue
        if attempt.outcome.code is not ReasonCode.GPU_UNHEALTHY:
            continue
        reason_code = job.reason.code if job.state is JobState.FAILED else None
        if attempt.state is not AttemptState.REQUEUED or job.requeues < 1:
            out.append(
                Violation(
                    "gpu-fault-failed",
                    job.job_id,
                    f"last attempt {attempt.number} ended gpu_unhealthy as {attempt.state} "
                    f"with {job.requeues} requeues",
                )
            )
        elif reason_code not in (None, ReasonCode.FAILED_MAX_REQUEUES):
            out.append(
                Violation(
                    "gpu-fault-failed",
                    job.job_id,
                    f"FAILED ({reason_code}) after its last attempt ended gpu_unhealthy",
                )
            )
    return out
