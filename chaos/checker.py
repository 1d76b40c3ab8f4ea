"""The checker: a pure function from a saved history to the list of violations.

:func:`check_history` takes a :class:`History` (built by :func:`load_history` from a run
directory, or by hand in tests) and reports every broken promise. The rules:

``overlap``
    Attempts of one job are identified by fencing token. Once any member of a newer
    attempt has written its ``start`` record, no member of an older attempt may write any
    record (a member paused past its lease and resumed afterwards counts: it is doing
    work). This is "no two attempts of one job overlap in time".
``stale-effect``
    The sink accepted an effect under a token lower than one it had already seen for that
    job, or an older attempt's member asked for an effect after a newer attempt began.
``token-order``
    Fencing tokens only grow: a job's attempts, ordered by their first record, carry
    strictly increasing tokens and attempt numbers, and no token is shared by two
    (job, attempt) pairs.
``gpu-reuse``
    A GPU is bound to another attempt only after the members holding it are confirmed
    stopped (the fencing rule, which preemption must keep: a victim keeps its GPUs through
    its grace period): on one node, once a member of one attempt has started on a GPU,
    no member of another attempt that started earlier on that GPU writes any record.
``duplicate-member``
    One (job, token, rank) started by two processes: a member was launched twice.
``duplicate-effect`` / ``completed-twice`` / ``not-completed``
    Exactly once, defined at the sink (:mod:`chaos.sink`): a job *completes* under a
    token when every rank 0..N-1 has an accepted effect under that token; the sink then
    treats the job's output as committed and answers later requests with ``done``. Every
    job must complete under exactly one token, and no (job, token, rank) may be accepted
    twice. The job's SUCCEEDED attempt must be the completing one, or a later one whose
    every rank was told ``done`` (a re-run after the completing attempt's success reports
    were lost with its node: at-least-once execution made effectively-once by the
    idempotent commit; the report counts these re-runs). A failed attempt may have
    committed some ranks before it was fenced: that is what the sink's fencing is for,
    and it is not a completion.
``lost``
    An acknowledged (``ok``) submission whose job is absent from the final state, or that
    did not succeed.
``unknown-twice`` / ``failed-ran``
    A submission whose outcome was unknown may have created its job at most once (at most
    one completion); a failed submission never created a job, and nothing of it ran.
``phantom``
    A job in the final state, or a ledger record, for a request nobody submitted.
``divergence`` / ``invariant``
    After healing every replica's encoded state is byte-identical, and passes
    :func:`synapse_ha.core.invariants.check`.
``deadline``
    Every job reached a final state after the heal: the cluster never went
    ``final_stall_ms`` without finishing a job while some were unfinished (from the heal
    to the first finish, and between finishes), and the last finished within
    ``final_deadline_ms`` (the cap) of the heal.
``stale-write``
    The sink accepted an effect under a token lower than that of an attempt of the same
    job which had already started (a ``start`` record earlier than the acceptance), even
    when the sink itself had not yet seen the newer token; or it accepted, after the thaw,
    an effect of an attempt frozen with its host whose node the leader declared dead
    during the freeze (that attempt was failed then) and whose job had a newer attempt
    started by the thaw (the nemesis thaws once every frozen gang has one, bounded). Either
    is the write of a superseded attempt, typically a member of a frozen host resumed
    before anything killed it. A gang with no newer attempt at the thaw is *unfenced*:
    until a newer attempt claims its token, a resource fencing by token cannot refuse the
    resumed member's first writes, and the model allows them (they are bounded by
    ``thaw-overlap``, and exactly-once still holds at completion). An attempt that lived
    on by replacement after the freeze began (a lost rank placed again) was superseded
    only in the members that ran on the frozen host; its other members' writes stand.
``thaw-overlap``
    A member of an attempt frozen with its whole host (``freeze-host``) and superseded
    while frozen wrote a record more than ``THAW_KILL_BOUND_MS`` after the thaw: its
    supervisor, resumed with it, did not stop it in time. Records inside that bound (an
    effect request included) are neither ``overlap`` nor ``stale-effect``: nothing on a
    frozen host can act before the thaw, and what the member does in the first moments
    after it must be fenced at the sink (``stale-write``); the report lists them
    (:func:`thaw_writes`).
``applied-truncated``
    A replica deleted log entries it had already applied (pysyncobj logs "truncating
    already-applied log entries"): its state machine ran commands that the log the
    cluster went on with does not hold, i.e. an entry counted as committed was lost. Raft
    never does this; the replicas' logs are read after the run.
``early-dead``
    A node that was ready when a clock-jump fault began was declared dead during it before
    it can have been silent for the dead timeout (its silence before the jump, as the
    leader reported it, plus the time until the node was seen dead): a wall-clock step made
    the dead timeout fire early.
``unhealthy-start`` / ``gpu-fault-failed``
    GPU health (:mod:`chaos.gpu_rules`): no member starts on a GPU that was unhealthy at its
    attempt's bind time, and an attempt ended by an unhealthy GPU is requeued, never
    failed or counted as a retry.
``node-fault-failed`` / ``unfit-bind``
    Node fitness (:mod:`chaos.node_rules`): no job fails for a member its node could not
    start, and no attempt is bound to a node while it is unfit for the job's owner.
``rejoin-term-change``
    Elections (:mod:`chaos.rejoin_rules`, read from the run directory): a follower that
    comes back after a ``rejoin`` fault does not raise the term of a healthy leader.
``leader-fault-ended-gang``
    Leader faults (:mod:`chaos.leader_rules`): a frozen or cut-off leader, or a follower
    cut off from it (``cut-relay``), ends no gang attempt that was running when the fault
    began (no member fenced, no node dead).
``dependency-early``
    Dependencies (:mod:`chaos.dependency_rules`): no job started before what it waited
    for (a job, or every task of an array) allowed it to.
``array-throttle`` / ``array-tasks``
    Job arrays (:mod:`chaos.array_rules`): no more tasks of a throttled array ran at once
    than its throttle, and every acknowledged array has exactly its tasks
    ``<array>_<index>``. A task is a job for every other rule; an array's submission is
    acknowledged with the array's id, so exactly-once and ``lost`` hold for each task.
``rank-twice`` / ``replaced-before-fenced``
    Member replacement (:mod:`chaos.replace_rules`): no rank ran in two generations at
    once, and the sink took no write of a replaced member once its replacement started.
    A member is (job, token, rank, generation) for ``gpu-reuse``, ``duplicate-member``
    and ``duplicate-effect``; a replacement is the same attempt for every other rule.
``elastic-over-max`` / ``elastic-below-min`` (and ``rank-twice``)
    Elastic gangs (:mod:`chaos.elastic_rules`): an attempt never ran more than ``max``
    members at once, a succeeded one never fewer than ``min`` before its first commit,
    and no two processes of one rank ran at once (a rank given back and grown again).
``batch-twice`` / ``step-outlived`` / ``step-task-twice``
    sbatch jobs (:mod:`chaos.step_rules`): the batch script ran at most once per attempt,
    no step task outlived its attempt's lease, no two copies of a (step, task) at once.
``slow-node-unmarked`` / ``healthy-node-degraded`` / ``degraded-bind``
    Slow nodes (:mod:`chaos.slow_rules`, read from the run directory): a throttled node
    was marked ``degraded``, no other node was, and nothing was bound to a marked node.
``preemption-notice`` / ``fair-share-queue`` / ``fair-share-unborrowed``
    Preemption (:mod:`chaos.fair_rules`): a victim's notice names what the state
    recorded, and a fair-share preemption is between queues meeting in a cohort with the
    switch on and takes only what its victim's queue borrows.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import defaultdict
from pathlib import Path

from chaos import (
    array_rules,
    dependency_rules,
    elastic_rules,
    fair_rules,
    gpu_rules,
    leader_rules,
    member_rules,
    node_rules,
    rejoin_rules,
    replace_rules,
    slow_rules,
    step_rules,
)
from chaos.history import (
    THAW_KILL_BOUND_MS,
    EffectRecord,
    FaultRecord,
    History,
    MemberRecord,
    Submission,
    Violation,
    frozen_attempts,
    in_thaw_window,
    load_history,
    preemptions,
    reruns,
    reruns_after_unfinished,
)
from synapse_ha.core import invariants
from synapse_ha.core.codec.decode_errors import CodecError
from synapse_ha.core.codec.versioned import decode_state
from synapse_ha.core.identity.admission import shown_request_id
from synapse_ha.core.model import ClusterState, JobState
from synapse_ha.core.reasons import ReasonCode, render

Member = replace_rules.Member  # (job, token, rank, generation)

# The records live in chaos.history; callers keep importing them from here.
__all__ = [
    "THAW_KILL_BOUND_MS",
    "EffectRecord",
    "FaultRecord",
    "History",
    "MemberRecord",
    "Submission",
    "Violation",
    "check_history",
    "check_run",
    "load_history",
    "preemptions",
    "reruns",
    "reruns_after_unfinished",
    "thaw_writes",
]


def check_run(run_dir: Path) -> list[Violation]:
    history = load_history(run_dir)
    slow = slow_rules.check_run_dir(run_dir, history, _final_state(history)[0])
    return check_history(history) + rejoin_rules.check_run_dir(run_dir) + slow


# --------------------------------------------------------------------- checking


def check_history(history: History) -> list[Violation]:
    """Every violation in ``history``, in a stable order. Pure: reads nothing else."""
    out: list[Violation] = []
    state, state_problems = _final_state(history)
    out += state_problems
    out += _check_overlap(history)
    out += member_rules.check_gpu_reuse(history)
    out += member_rules.check_duplicate_members(history)
    out += replace_rules.check_replacements(history)
    out += elastic_rules.check_elastic(history, state)
    out += _check_tokens(history)
    out += _check_sink_fencing(history)
    out += _check_stale_writes(history)
    out += _check_early_dead(history)
    out += [Violation("applied-truncated", "", line) for line in history.applied_truncations]
    out += _check_exactly_once(history, state)
    out += gpu_rules.check_unhealthy_starts(history, state)
    out += gpu_rules.check_gpu_fault_failures(history, state)
    out += node_rules.check_node_fault_failures(history, state)
    out += node_rules.check_unfit_binds(history, state)
    out += dependency_rules.check_dependency_order(history, state)
    out += array_rules.check_arrays(history, state)
    out += step_rules.check_steps(history)
    out += leader_rules.check_leader_fault_gangs(history, state)
    out += fair_rules.check_preemptions(history, state)
    out += _check_stalls(history, state)
    return out


def _check_stalls(history: History, state: ClusterState | None) -> list[Violation]:
    """``deadline``: a stretch after the heal longer than ``final_stall_ms`` in which no
    job finished while some were unfinished (a job still unfinished at the end is a
    violation of its own)."""
    if state is None or not history.heal_wall_ms or not history.final_stall_ms:
        return []
    finishes = sorted(
        (job.finished_at_ms, job.job_id)
        for job in state.jobs.values()
        if job.state.finished and job.finished_at_ms > history.heal_wall_ms
    )
    out: list[Violation] = []
    previous = history.heal_wall_ms
    for finished_at_ms, job_id in finishes:
        if finished_at_ms - previous > history.final_stall_ms:
            out.append(
                Violation(
                    "deadline",
                    job_id,
                    f"no job finished from {(previous - history.heal_wall_ms) / 1000:.1f} s "
                    f"to {(finished_at_ms - history.heal_wall_ms) / 1000:.1f} s after the "
                    f"heal (stall bound {history.final_stall_ms / 1000:.0f} s)",
                )
            )
        previous = finished_at_ms
    return out


def _final_state(history: History) -> tuple[ClusterState | None, list[Violation]]:
    out: list[Violation] = []
    if not history.replica_states:
        return None, [Violation("divergence", "", "no replica state was collected")]
    digests = {
        rid: hashlib.sha256(data).hexdigest()[:12] for rid, data in history.replica_states.items()
    }
    if len(set(digests.values())) > 1:
        out.append(Violation("divergence", "", f"replica states differ: {digests}"))
    state: ClusterState | None = None
    for rid in sorted(history.replica_states):
        try:
            decoded = decode_state(history.replica_states[rid])
        except CodecError as exc:
            out.append(Violation("invariant", "", f"replica {rid}: undecodable state: {exc}"))
            continue
        for problem in invariants.check(decoded):
            out.append(Violation("invariant", "", f"replica {rid}: {problem}"))
        if state is None:
            state = decoded
    return state, out


def _attempt_starts(history: History) -> dict[str, dict[int, int]]:
    """job -> token -> time of the attempt's first ``start`` record."""
    starts: dict[str, dict[int, int]] = defaultdict(dict)
    for r in history.members:
        if r.type == "start":
            known = starts[r.job].get(r.token)
            if known is None or r.mono_ns < known:
                starts[r.job][r.token] = r.mono_ns
    return starts


def thaw_writes(history: History) -> list[str]:
    """Records frozen members wrote inside the thaw window while a newer attempt of their
    job had already started (``job/token rank r: type``); the report lists them."""
    thaws = frozen_attempts(history)
    starts = _attempt_starts(history)
    return sorted(
        f"{r.job}/{r.token} rank {r.rank}: {r.type}"
        for r in history.members
        if in_thaw_window(r, thaws)
        and any(t > r.token and at <= r.mono_ns for t, at in starts.get(r.job, {}).items())
    )


def _check_overlap(history: History) -> list[Violation]:
    out: list[Violation] = []
    starts = _attempt_starts(history)
    thaws = frozen_attempts(history)
    reported: set[tuple[str, int, int]] = set()
    for r in sorted(history.members, key=lambda r: r.mono_ns):
        for newer_token, started in starts.get(r.job, {}).items():
            if newer_token <= r.token or r.mono_ns < started:
                continue
            if in_thaw_window(r, thaws):
                continue
            key = (r.job, r.token, newer_token)
            if key in reported:
                continue
            reported.add(key)
            kind = "stale-effect" if r.type == "effect" else "overlap"
            if kind == "overlap" and (r.job, r.token) in thaws:
                kind = "thaw-overlap"
            out.append(
                Violation(
                    kind,
                    r.job,
                    f"rank {r.rank} of token {r.token} on {r.node} (pid {r.pid}) wrote "
                    f"'{r.type}' {(r.mono_ns - started) / 1e6:.0f} ms after attempt with "
                    f"token {newer_token} started",
                )
            )
    return out


def _check_tokens(history: History) -> list[Violation]:
    out: list[Violation] = []
    owner: dict[int, tuple[str, int]] = {}
    first: dict[tuple[str, int], tuple[int, int]] = {}  # (job, token) -> (first ns, attempt)
    for r in history.members:
        pair = owner.setdefault(r.token, (r.job, r.attempt))
        if pair != (r.job, r.attempt):
            out.append(
                Violation(
                    "token-order",
                    r.job,
                    f"token {r.token} used by {pair[0]} attempt {pair[1]} and by "
                    f"{r.job} attempt {r.attempt}",
                )
            )
        seen = first.get((r.job, r.token))
        if seen is None or r.mono_ns < seen[0]:
            first[(r.job, r.token)] = (r.mono_ns, r.attempt)
    by_job: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for (job, token), (ns, attempt) in first.items():
        by_job[job].append((ns, token, attempt))
    for job_id, attempts in sorted(by_job.items()):
        attempts.sort()
        for (_, t0, a0), (_, t1, a1) in itertools.pairwise(attempts):
            if t1 <= t0 or a1 <= a0:
                out.append(
                    Violation(
                        "token-order",
                        job_id,
                        f"attempt {a1} (token {t1}) began after attempt {a0} (token {t0})",
                    )
                )
    return out


def _check_sink_fencing(history: History) -> list[Violation]:
    out: list[Violation] = []
    highest: dict[str, int] = {}
    for e in history.effects:
        top = highest.get(e.job, 0)
        if e.accepted and e.token < top:
            out.append(
                Violation(
                    "stale-effect",
                    e.job,
                    f"sink accepted rank {e.rank} under token {e.token} after token {top}",
                )
            )
        highest[e.job] = max(top, e.token)
    return out


def _check_stale_writes(history: History) -> list[Violation]:
    starts = _attempt_starts(history)
    # (job, token) frozen on a node declared dead during the freeze -> the freeze.
    superseded = {
        (job, token): f
        for f in history.faults
        if f.kind == "freeze-host" and f.declared_dead_ns
        for job, token in f.frozen
        if (job, token) not in f.unfenced
    }
    # An attempt that lived on by replacement was superseded only in its frozen members.
    went_on, ran_on = replace_rules.went_on_after(history), replace_rules.nodes_of(history)
    out: list[Violation] = []
    for e in history.effects:
        if not e.accepted:
            continue
        newer = sorted(
            t for t, at in starts.get(e.job, {}).items() if t > e.token and at < e.mono_ns
        )
        freeze = superseded.get((e.job, e.token))
        replaced = went_on.get((e.job, e.token), ())
        if freeze is not None and any(at > freeze.start_ns for at in replaced):
            member = (e.job, e.token, e.rank, e.generation)
            freeze = freeze if freeze.frozen_node in ran_on.get(member, ()) else None
        if not newer and freeze is not None and e.mono_ns >= freeze.end_ns:
            out.append(
                Violation(
                    "stale-write",
                    e.job,
                    f"sink accepted rank {e.rank} under token {e.token} after the thaw of "
                    "its host, which the leader had declared dead while it was frozen",
                )
            )
        if newer:
            out.append(
                Violation(
                    "stale-write",
                    e.job,
                    f"sink accepted rank {e.rank} under token {e.token} after the attempt "
                    f"with token {newer[-1]} had started",
                )
            )
    return out


def _check_early_dead(history: History) -> list[Violation]:
    out: list[Violation] = []
    for f in history.faults:
        if f.kind not in ("clock-jump-forward", "clock-jump-back"):
            continue
        bounds = dict(f.silence_bound_ms)
        for node in f.declared_dead:
            bound = bounds.get(node)
            if bound is not None and bound >= f.dead_timeout_ms > 0:
                continue  # it may really have been silent that long
            silent = "" if bound is None else f" after at most {bound} ms of silence"
            out.append(
                Violation(
                    "early-dead",
                    "",
                    f"node {node} was declared dead during {f.kind} on "
                    f"{', '.join(f.targets)}{silent}",
                )
            )
    return out


def _check_exactly_once(history: History, state: ClusterState | None) -> list[Violation]:
    out: list[Violation] = []
    accepted: dict[str, dict[int, dict[int, int]]] = defaultdict(lambda: defaultdict(dict))
    # A rank placed again (generation 1 and up) re-runs and commits again: one acceptance
    # per generation.
    per_member: dict[Member, int] = defaultdict(int)
    for e in history.effects:
        if not e.accepted:
            continue
        ranks = accepted[e.job][e.token]
        ranks[e.rank] = ranks.get(e.rank, 0) + 1
        per_member[(e.job, e.token, e.rank, e.generation)] += 1
    for (job_id, token, rank, gen), count in sorted(per_member.items()):
        if count > 1:
            of = f" generation {gen}" if gen else ""
            out.append(
                Violation(
                    "duplicate-effect",
                    job_id,
                    f"rank {rank} under token {token}{of} was accepted {count} times",
                )
            )
    if state is None:
        return out

    def completions(job_id: str, world: int) -> list[int]:
        return sorted(
            token
            for token, ranks in accepted.get(job_id, {}).items()
            if all(r in ranks for r in range(world))
        )

    by_request = {s.request_id: s for s in history.submissions}
    for job in sorted(state.jobs.values(), key=lambda j: j.seq):
        # The cluster keeps a request id scoped by its owner; the ledger has it as given.
        submission = by_request.get(shown_request_id(job.owner, job.request_id))
        # An elastic gang's output is whole once its ranks 0..min-1 committed (its members
        # commit with a world of min, chaos/member.py), whatever it grew to.
        world = job.spec.replicas if job.spec.elastic is None else job.spec.elastic.min_replicas
        done = completions(job.job_id, world)
        if submission is None:
            out.append(
                Violation("phantom", job.job_id, f"request {job.request_id} was never submitted")
            )
            continue
        if submission.outcome == "failed":
            out.append(Violation("failed-ran", job.job_id, "a failed submission created a job"))
            continue
        # A task was acknowledged as its array.
        acknowledged_as = job.array_id or job.job_id
        if (
            submission.outcome == "ok"
            and submission.job_id
            and submission.job_id != acknowledged_as
        ):
            out.append(
                Violation(
                    "phantom",
                    job.job_id,
                    f"request {job.request_id} was acknowledged as {submission.job_id}",
                )
            )
        if len(done) > 1:
            kind = "completed-twice" if submission.outcome == "ok" else "unknown-twice"
            out.append(Violation(kind, job.job_id, f"completed under tokens {done}"))
        if job.state is not JobState.SUCCEEDED:
            if job.state.finished:
                out.append(
                    Violation(
                        "not-completed", job.job_id, f"ended {job.state}: {render(job.reason)}"
                    )
                )
            else:
                out.append(
                    Violation(
                        "deadline",
                        job.job_id,
                        f"still {job.state} at the end of the run ({render(job.reason)})",
                    )
                )
            continue
        token = job.fencing_token
        if job.reason.code is ReasonCode.SUCCEEDED_AFTER_NODE_DEATH:
            # The attempt its node's death had ended succeeded after all (late exit
            # reports); a newer attempt, if any, was stopped: completions count under the
            # token of the attempt that succeeded.
            token = job.reason.num("fencing_token")
        told_done = {
            e.rank for e in history.effects if e.job == job.job_id and e.token == token and e.done
        }
        rerun_ok = len(done) == 1 and done[0] < token and told_done >= set(range(world))
        if done != [token] and not rerun_ok:
            out.append(
                Violation(
                    "not-completed",
                    job.job_id,
                    f"SUCCEEDED under token {token} but the sink saw completions under {done}",
                )
            )
        if history.heal_wall_ms and job.finished_at_ms > (
            history.heal_wall_ms + history.final_deadline_ms
        ):
            out.append(
                Violation(
                    "deadline",
                    job.job_id,
                    f"finished {(job.finished_at_ms - history.heal_wall_ms) / 1000:.1f} s "
                    f"after the heal (deadline {history.final_deadline_ms / 1000:.0f} s)",
                )
            )
    known_jobs = set(state.jobs)
    for s in history.submissions:
        if s.outcome == "ok" and s.job_id not in known_jobs and s.job_id not in state.arrays:
            out.append(Violation("lost", s.job_id, f"acknowledged request {s.request_id} is gone"))
    for job_id in sorted({r.job for r in history.members} - known_jobs):
        out.append(Violation("phantom", job_id, "members ran for a job the cluster never had"))
    for job_id in sorted(set(accepted) - known_jobs):
        out.append(Violation("phantom", job_id, "the sink saw effects of an unknown job"))
    return out
