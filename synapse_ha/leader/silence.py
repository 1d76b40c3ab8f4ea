"""When the leader holds off declaring nodes dead: a mass silence.

The reaper (:meth:`~synapse_ha.leader.loop.LeaderLoop.step`) declares a node dead once the
leader has not heard it for ``dead_timeout``: it reads the silence as the node's. When
most nodes fall silent together, the likelier cause is on the leader's side: a leader too
busy to read its heartbeats in time (a storm of submissions or binds: heartbeats wait in
its queues past their deadlines), or a cut between it and the workers. Declaring them dead
then requeues every gang on them, which stops work that runs fine and adds more work to
the leader that could not keep up: the storm feeds itself. Kubernetes' node lifecycle
controller makes the same call (no evictions in a zone where every node is unready).

Holding is safe: a dead node's gangs are requeued later, never started twice, and a
worker that hears no leader fences its own members after its lease (DESIGN §4). It costs
only time: while the hold lasts, a node that really died is not declared.

The rule (:func:`hold_reason`): with at least ``min_nodes`` nodes not declared dead, when
more than ``fraction`` of them have been unheard for over half of ``dead_timeout``, no
node is declared dead. The hold ends once enough of them are heard again; those still
silent past ``dead_timeout`` are declared then.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_SILENCE_HOLD", "SilenceHold", "hold_reason"]


@dataclass(frozen=True, slots=True)
class SilenceHold:
    """``fraction`` of the nodes not declared dead, unheard for over half of
    ``dead_timeout``, above which the reaper declares none; not below ``min_nodes``
    nodes (in a small cluster, most nodes silent may well be most nodes down)."""

    fraction: float = 0.5
    min_nodes: int = 8


DEFAULT_SILENCE_HOLD = SilenceHold()


def hold_reason(late: int, alive: int, dead_timeout_ms: int, hold: SilenceHold) -> str:
    """Why no node is declared dead now, or "" when the reaper may declare: ``late`` of
    the ``alive`` nodes (those not declared dead) have been unheard for over half of
    ``dead_timeout_ms``."""
    if alive < hold.min_nodes or late <= hold.fraction * alive:
        return ""
    return (
        f"holding node deaths: {late} of {alive} nodes unheard for over "
        f"{dead_timeout_ms // 2} ms at once, more than {hold.fraction:.0%} of them; a silence "
        "that wide says more about this leader or its network than about the nodes"
    )
