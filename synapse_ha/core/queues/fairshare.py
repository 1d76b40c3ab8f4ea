"""Fair share between queues: decayed usage and dominant-resource share (DESIGN §8).

Integer arithmetic only: the decayed usage is replicated (``ClusterState.queue_history``),
so every replica must compute the same bytes. ``2 ** (-elapsed / half_life)`` is taken
as whole halvings (a shift) times a fixed-point factor for the remaining fraction, built
from integer square roots of 2 (``math.isqrt``), never from floats.

A queue's **share** (what the scheduler orders the queues of a cohort by, ascending) is
its dominant resource's ``(decayed GPU-ms / half_life + GPUs held now) / nominal``, the
same for CPU and memory where the queue has such a quota: usage measured in "resources
held on average over one half-life", against what the queue is entitled to. A cohort of
the cohort tree has a share too (:func:`subtree_share`): the same over its queues' GPUs.
"""

from __future__ import annotations

import math

from synapse_ha.core.cluster_config import Queue, QueueHistory
from synapse_ha.core.model import ClusterState, Resources

_BITS = 30
_ONE = 1 << _BITS
_FRACTION_BITS = 16
# _ROOTS[j] = 2 ** (-1 / 2 ** (j + 1)) in fixed point, by repeated integer square roots.
_ROOTS: list[int] = []
_root = _ONE // 2  # 2 ** -1
for _ in range(_FRACTION_BITS):
    _root = math.isqrt(_root * _ONE)
    _ROOTS.append(_root)
del _root

SHARE_SCALE = 1_000_000  # a share of 1.0 (using exactly the entitlement)


def decay(value: int, elapsed_ms: int, half_life_ms: int) -> int:
    """``value * 2 ** (-elapsed_ms / half_life_ms)``, rounded down, integers only."""
    if value <= 0 or elapsed_ms <= 0:
        return max(value, 0)
    halvings, rest = divmod(elapsed_ms, max(half_life_ms, 1))
    if halvings >= 64:
        return 0
    value >>= halvings
    fraction = (rest << _FRACTION_BITS) // max(half_life_ms, 1)  # 0 .. 2**16 - 1
    factor = _ONE
    for j in range(_FRACTION_BITS):
        if fraction & (1 << (_FRACTION_BITS - 1 - j)):
            factor = factor * _ROOTS[j] >> _BITS
    return value * factor >> _BITS


def decayed(history: QueueHistory, now_ms: int, half_life_ms: int) -> QueueHistory:
    """``history`` as of ``now_ms``."""
    elapsed = now_ms - history.at_ms
    return QueueHistory(
        decay(history.gpu_ms, elapsed, half_life_ms),
        decay(history.cpu_milli_ms, elapsed, half_life_ms),
        decay(history.memory_mib_ms, elapsed, half_life_ms),
        max(now_ms, history.at_ms),
    )


def add_usage(
    history: QueueHistory | None, held: Resources, duration_ms: int, now_ms: int, half_life_ms: int
) -> QueueHistory:
    """``history`` decayed to ``now_ms`` plus ``held`` for ``duration_ms`` (an attempt
    that just ended). The ended attempt's own usage is added undecayed."""
    base = decayed(history or QueueHistory(at_ms=now_ms), now_ms, half_life_ms)
    d = max(duration_ms, 0)
    return QueueHistory(
        base.gpu_ms + held.gpu * d,
        base.cpu_milli_ms + held.cpu_milli * d,
        base.memory_mib_ms + held.memory_mib * d,
        base.at_ms,
    )


def share(
    queue: Queue, history: QueueHistory | None, held: Resources, now_ms: int, half_life_ms: int
) -> int:
    """The queue's dominant-resource share times :data:`SHARE_SCALE`; 0 for a queue
    without a GPU quota (it takes no part in fair share)."""
    if queue.gpu is None:
        return 0
    h = max(half_life_ms, 1)
    past = decayed(history, now_ms, h) if history is not None else QueueHistory()
    best = 0
    for nominal, used_ms, now_held in (
        (queue.gpu, past.gpu_ms, held.gpu),
        (queue.cpu_milli, past.cpu_milli_ms, held.cpu_milli),
        (queue.memory_mib, past.memory_mib_ms, held.memory_mib),
    ):
        if nominal is None:
            continue
        best = max(best, (used_ms + now_held * h) * SHARE_SCALE // (max(nominal, 1) * h))
    return best


def subtree_share(past_gpu_ms: int, held_gpu: int, nominal_gpu: int, half_life_ms: int) -> int:
    """The share of a subtree of the cohort tree times :data:`SHARE_SCALE`: its queues'
    decayed GPU-ms (``past_gpu_ms``) over one half-life plus the GPUs they hold now,
    against its nominal GPUs (its own and everything below it). Cohorts have GPU quotas
    only, so GPUs are the dominant resource at that level."""
    h = max(half_life_ms, 1)
    return (past_gpu_ms + held_gpu * h) * SHARE_SCALE // (max(nominal_gpu, 1) * h)


def history_of(state: ClusterState, queue: str) -> QueueHistory | None:
    return state.queue_history.get(queue)
