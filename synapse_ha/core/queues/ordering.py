"""Where each queue stands in the order a scheduling pass considers queues by (DESIGN §8,
:mod:`synapse_ha.core.scheduler.order`): the one key, :func:`queue_key`, used by the pass
for every choice between queues, and by :func:`queue_standings` for the place of every
queue as a pass would begin, which ``ListQueues`` reports. Pure; integers only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from synapse_ha.core.cluster_config import Queue
from synapse_ha.core.model import ClusterState, Job
from synapse_ha.core.queues.cohort_tree import ancestors
from synapse_ha.core.queues.fairshare import decayed, share, subtree_share
from synapse_ha.core.queues.quota import QueueUsage

# The shares level by level (the cohorts below the root first, the queue's own last);
# whether the queue has a gang waiting (0) or not (1), its head gang's -priority and
# submission order; the queue's name.
QueueKey = tuple[tuple[int, ...], int, int, int, str]


def queue_key(
    state: ClusterState,
    usage: QueueUsage,
    now_ms: int,
    levels: CohortShares | None,
    name: str,
    head: Job | None,
) -> QueueKey:
    """Where queue ``name`` stands in the order between queues, lowest first: its shares
    level by level (``levels``: the cohorts' shares, None without cohort records), then
    its ``head`` gang's priority and submission order (a queue with nothing pending
    after those with a head at equal shares), then its name."""
    queue = state.queues.get(name)
    half_life = state.config.fair_share_half_life_ms
    fair = (
        share(queue, state.queue_history.get(name), usage.used(name), now_ms, half_life)
        if queue is not None
        else 0
    )
    above = levels.shares(queue) if levels is not None and queue is not None else ()
    ahead = (0, -head.spec.priority, head.seq) if head is not None else (1, 0, 0)
    return ((*above, fair), *ahead, name)


@dataclass(frozen=True, slots=True)
class QueueStanding:
    """A queue's place in the order between queues now: its own share (times
    :data:`~synapse_ha.core.queues.fairshare.SHARE_SCALE`), the shares of the cohorts above it
    (outermost first, compared before its own), and its position (1: considered first)."""

    share: int
    cohort_shares: tuple[int, ...]
    position: int


def queue_standings(
    state: ClusterState, usage: QueueUsage, now_ms: int, heads: Mapping[str, Job]
) -> dict[str, QueueStanding]:
    """Every queue of ``state`` with its :class:`QueueStanding`, by the key a pass orders
    queues by (:func:`queue_key`) before it places anything. ``heads``: each queue's
    first pending gang in queue order (none for a queue with nothing pending)."""
    levels = CohortShares(state, usage, now_ms) if state.cohorts else None
    keys = {
        name: queue_key(state, usage, now_ms, levels, name, heads.get(name))
        for name in state.queues
    }
    ordered = sorted(keys, key=keys.__getitem__)
    return {
        name: QueueStanding(keys[name][0][-1], keys[name][0][:-1], position)
        for position, name in enumerate(ordered, 1)
    }


class CohortShares:
    """The shares of the cohorts above a queue, for one pass: the decayed GPU usage of
    every queue is worked out once (it does not change within a pass), what queues hold
    now is read from ``usage``, each cohort's share once per change of it."""

    def __init__(self, state: ClusterState, usage: QueueUsage, now_ms: int) -> None:
        self.state = state
        self.usage = usage
        self.half_life = max(state.config.fair_share_half_life_ms, 1)
        self.past = {
            name: decayed(history, now_ms, self.half_life).gpu_ms
            for name, history in state.queue_history.items()
        }
        self._below: dict[str, tuple[list[str], int]] = {}  # cohort -> its queues, nominal
        self._shares: dict[str, int] = {}  # cohort -> its share at usage ``_version``
        self._version = usage.version

    def shares(self, queue: Queue) -> tuple[int, ...]:
        """The shares of the cohorts from just below the root down to the queue's own,
        outermost first (none for a queue in a root, or in no cohort)."""
        if queue.gpu is None or not queue.cohort:
            return ()
        path = ancestors(queue.cohort, self.state.cohorts)
        return tuple(self._share(c) for c in reversed(path[:-1]))

    def _share(self, cohort: str) -> int:
        if self._version != self.usage.version:
            self._shares.clear()
            self._version = self.usage.version
        known = self._shares.get(cohort)
        if known is not None:
            return known
        below_and_nominal = self._below.get(cohort)
        if below_and_nominal is None:
            tree = self.usage.tree
            below_and_nominal = self._below[cohort] = (
                tree.queues_below(cohort),
                tree.nominal(cohort),
            )
        below, nominal = below_and_nominal
        held = sum(self.usage.used(q).gpu for q in below)
        past = sum(self.past.get(q, 0) for q in below)
        share = self._shares[cohort] = subtree_share(past, held, nominal, self.half_life)
        return share
