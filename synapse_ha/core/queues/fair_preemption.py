"""Fair-sharing preemption: a queue below its fair share takes GPUs back from a borrowing
queue above it (DESIGN §8). Pure; integers only; queues in name order.

Reclaim gives a queue back its nominal quota; it never helps a queue that is at or near
its nominal while another borrows far beyond its own (a gang of 16 GPUs for a queue at
60 of 64 cannot reclaim). Fair-sharing preemption does, where the cohort allows it. For a
pending gang of queue ``P`` (a GPU quota in a cohort) and a set of victims, whole gangs of
other queues of its cohort tree, the preemption is allowed when:

* **Switch.** Each victim's queue ``V`` meets ``P`` (their nearest common cohort) in a
  cohort whose record has ``fair_sharing_preemption`` on. Off by default; a cohort name
  no record defines has no switch.
* **Shares where the queues meet.** Shares are compared between the two branches just
  below that cohort (the queue itself when it sits in it, else the cohort of its path
  just below it), each branch's share as the order between queues counts it:
  :func:`~synapse_ha.core.queues.fairshare.share` for a queue,
  :func:`~synapse_ha.core.queues.fairshare.subtree_share` for a cohort, from what every
  queue keeps once the gangs already being preempted have stopped
  (:meth:`~synapse_ha.core.queues.quota.QueueUsage.kept_after_reclaims`).
* **Anti-thrash** (Kueue's ``LessThanOrEqualToFinalShare``). Once every victim has stopped
  and the gang holds its resources, each victim's branch stands at or above the
  preemptor's branch. A queue is never preempted into below the preemptor, and the
  victim's queue cannot preempt back while the shares stand (it would have to end at or
  below the other's share after giving back, yet it stands at or above it before): only
  the decay of past usage, and new arrivals, move the order.
* **Borrowed GPUs only.** Each victim's queue borrows now and keeps at least its nominal
  GPUs once its victims have stopped (what it lost below its nominal, reclaim would take
  back at once).
* **Quota.** The gang fits its queue's quota, borrowing included, once the victims have
  stopped: no gang is stopped for a preemptor that still could not be admitted.

The minimum run time always holds (:mod:`synapse_ha.core.queues.victim_rules`; the
overdue exception is a reclaim's alone). The scheduler searches victims with these rules
(cost and topology as for every kind) and ``apply`` verifies them again from the state
(:func:`fair_share_problem`).
"""

from __future__ import annotations

from collections.abc import Sequence

from synapse_ha.core.cluster_config import Queue
from synapse_ha.core.model import ClusterState, Job, Resources
from synapse_ha.core.queues.cohort_tree import ancestors
from synapse_ha.core.queues.fairshare import SHARE_SCALE, decayed, share, subtree_share
from synapse_ha.core.queues.quota import ZERO, QueueUsage, gang_request, held_request

# A victim as the rules see it: its queue and what its whole gang holds.
Taken = tuple[str, Resources]


class FairShares:
    """The fair-sharing preemption rules for one pending gang of ``queue`` asking for
    ``request``, against ``keeps`` (what each queue keeps once the gangs being preempted
    have stopped, plus the claims of the gangs waiting for them), at ``now_ms``. Reads
    ``keeps`` as it is when asked; never changes it."""

    def __init__(
        self, state: ClusterState, keeps: QueueUsage, now_ms: int, queue: str, request: Resources
    ) -> None:
        self.state = state
        self.keeps = keeps
        self.now_ms = now_ms
        self.queue = queue
        self.request = request
        self.half_life = max(state.config.fair_share_half_life_ms, 1)
        own = state.queues[queue]
        self.path = ancestors(own.cohort, state.cohorts)  # the preemptor's, nearest first
        self._past: dict[str, int] = {}  # queue -> decayed GPU-ms, for subtree shares

    @classmethod
    def for_gang(
        cls, state: ClusterState, keeps: QueueUsage, now_ms: int, queue: str, request: Resources
    ) -> FairShares | None:
        """The rules for a gang of ``queue``, or None when no cohort on the queue's way to
        its root has ``fair_sharing_preemption`` on (or the queue has no quota in a
        cohort): then the gang may not preempt by fair share at all."""
        own = state.queues.get(queue)
        if own is None or own.gpu is None or not own.cohort:
            return None
        for name in ancestors(own.cohort, state.cohorts):
            record = state.cohorts.get(name)
            if record is not None and record.fair_sharing_preemption:
                return cls(state, keeps, now_ms, queue, request)
        return None

    # ---------------------------------------------------------------- who may lose

    def meeting(self, other: str) -> tuple[str, str, str] | None:
        """Where queue ``other`` meets the preemptor's queue: (their nearest common
        cohort, the preemptor's branch below it, ``other``'s branch below it), a branch
        being a queue name or a cohort name; None for a queue of another tree or without
        a quota in a cohort."""
        q = self.state.queues.get(other)
        if q is None or q.gpu is None or not q.cohort or other == self.queue:
            return None
        theirs = ancestors(q.cohort, self.state.cohorts)
        common = next((c for c in self.path if c in theirs), None)
        if common is None:
            return None
        return common, _below(self.queue, self.path, common), _below(other, theirs, common)

    def open_to(self, other: str) -> str:
        """Why gangs of queue ``other`` may not be victims of this gang at all; "" if
        they may (it meets the preemptor's queue in a cohort with the switch on, and
        borrows now)."""
        met = self.meeting(other)
        if met is None:
            return f"queue {other} is not another queue of the cohort tree of {self.queue}"
        record = self.state.cohorts.get(met[0])
        if record is None or not record.fair_sharing_preemption:
            return (
                f"queue {other} meets {self.queue} in cohort {met[0]}, which does not have "
                f"fair_sharing_preemption on"
            )
        if self.keeps.borrowed(other) <= 0:
            return (
                f"queue {other} borrows nothing: fair-sharing preemption takes only borrowed GPUs"
            )
        return ""

    # ---------------------------------------------------------------- the rule

    def problem(self, victims: Sequence[Taken]) -> str:
        """Why preempting ``victims`` breaks the nominal floor or the anti-thrash rule;
        "" if it does not. Each victim's queue must already pass :meth:`open_to`."""
        lost: dict[str, Resources] = {}
        for queue, held in victims:
            lost[queue] = lost.get(queue, ZERO) + held
        delta = {q: ZERO - r for q, r in lost.items()}
        delta[self.queue] = delta.get(self.queue, ZERO) + self.request
        for name in sorted(lost):
            nominal = self.state.queues[name].gpu or 0
            if self.keeps.used(name).gpu - lost[name].gpu < nominal:
                return (
                    f"queue {name} would fall below its nominal quota: fair-sharing "
                    f"preemption takes only what a queue borrows"
                )
            met = self.meeting(name)
            assert met is not None
            _, ours, theirs = met
            after_ours = self.branch_share(ours, delta)
            after_theirs = self.branch_share(theirs, delta)
            if after_theirs < after_ours:
                return (
                    f"{_named(theirs, self.state)} would end at share "
                    f"{_ppm(after_theirs)}, below {_named(ours, self.state)} at "
                    f"{_ppm(after_ours)}: a fair-sharing preemption leaves the victim's "
                    f"side at or above the preemptor's share"
                )
        return ""

    def quota_problem(self, victims: Sequence[Taken]) -> str:
        """Why the gang would still not fit its queue's quota once ``victims`` have
        stopped; "" if it would."""
        usage = QueueUsage(self.state.queues, dict(self.keeps.usage), self.state.cohorts)
        for queue, held in victims:
            usage.remove(queue, held)
        short = usage.shortfall(self.queue, self.request)
        if short is None:
            return ""
        return (
            f"queue {self.queue} would still not fit the gang's {short.need} "
            f"{short.resource} once the victims have stopped (it uses {short.used}, may "
            f"borrow {short.borrowable} more)"
        )

    # ---------------------------------------------------------------- shares

    def branch_share(self, branch: str, delta: dict[str, Resources]) -> int:
        """The share of ``branch`` (a queue's name, or a cohort's) with each queue's
        usage changed by ``delta``, times :data:`~synapse_ha.core.queues.fairshare.SHARE_SCALE`."""
        if not branch.startswith(_COHORT_MARK):
            return self._queue_share(self.state.queues[branch], delta.get(branch, ZERO))
        cohort = branch.removeprefix(_COHORT_MARK)
        tree = self.keeps.tree
        below = tree.queues_below(cohort)
        held = sum(self.keeps.used(q).gpu + delta.get(q, ZERO).gpu for q in below)
        past = sum(self._past_gpu_ms(q) for q in below)
        return subtree_share(past, held, tree.nominal(cohort), self.half_life)

    def _queue_share(self, queue: Queue, change: Resources) -> int:
        history = self.state.queue_history.get(queue.name)
        held = self.keeps.used(queue.name) + change
        return share(queue, history, held, self.now_ms, self.half_life)

    def _past_gpu_ms(self, queue: str) -> int:
        known = self._past.get(queue)
        if known is None:
            history = self.state.queue_history.get(queue)
            known = decayed(history, self.now_ms, self.half_life).gpu_ms if history else 0
            self._past[queue] = known
        return known


# A branch that is a cohort is named with this mark, so that a cohort and a queue of the
# same name stay apart.
_COHORT_MARK = "cohort:"


def _below(queue: str, path: list[str], common: str) -> str:
    """The branch of ``queue`` (whose cohorts, nearest first, are ``path``) just below
    cohort ``common``: the queue itself when it sits in ``common``, else the cohort."""
    at = path.index(common)
    return queue if at == 0 else _COHORT_MARK + path[at - 1]


def _named(branch: str, state: ClusterState) -> str:
    if branch.startswith(_COHORT_MARK):
        return f"cohort {branch.removeprefix(_COHORT_MARK)}"
    return f"queue {branch}"


def _ppm(value: int) -> str:
    """A share times SHARE_SCALE as a decimal (1.000000: the entitlement)."""
    return f"{value / SHARE_SCALE:.3f}"


def fair_share_problem(state: ClusterState, preemptor: Job, victims: list[Job], now_ms: int) -> str:
    """Why a fair-sharing preemption of ``victims`` for ``preemptor`` at ``now_ms``
    breaks the rules of this module; "" if it does not (``apply``'s verification)."""
    spec = preemptor.spec
    keeps = QueueUsage.kept_after_reclaims(state, besides=preemptor.job_id)
    fair = FairShares.for_gang(state, keeps, now_ms, spec.queue, gang_request(spec))
    if fair is None:
        return (
            f"queue {spec.queue} is in no cohort with fair_sharing_preemption on: it cannot "
            f"preempt by fair share"
        )
    for job in victims:
        why = fair.open_to(job.spec.queue)
        if why:
            return f"victim {job.job_id}: {why}"
    taken = [
        (
            job.spec.queue,
            gang_request(job.spec)
            if job.attempt is None
            else held_request(job, job.attempt, counting_leaving=False),
        )
        for job in victims
    ]
    return fair.problem(taken) or fair.quota_problem(taken)
