"""The cluster state machine: one ``apply(state, command)`` for every change.

Every replica applies the same commands in the same order and reaches byte-identical
state. ``apply`` validates a command completely before it changes anything, never reads
a clock (time comes in the command, clamped so it never runs backwards), draws
randomness only from seeds carried in the command, and never raises: a bad or stale
command becomes an error :class:`Result`, and an unexpected exception becomes an
``INTERNAL`` result so that a bug cannot wedge the replicated log.

One module per aggregate, each with the handlers of its commands (``HANDLERS``):
:mod:`.config`, :mod:`.nodes`, :mod:`.jobs`, :mod:`.binding` (plan verification),
:mod:`.reports` (member reports), :mod:`.apply_preemption`, :mod:`.apply_health`,
:mod:`.apply_node_checks`, :mod:`.apply_degraded` (a node found slow),
:mod:`.tokens_queues`; and :mod:`.attempts`, how an attempt ends, which they share. An
``apply_`` module is the state-machine side of the rules module of the same subject in
:mod:`synapse_ha.core` (``apply_health`` applies :mod:`synapse_ha.core.health.fitness`,
``apply_degraded`` :mod:`synapse_ha.core.health.slowness`, ``apply_dependencies``
:mod:`synapse_ha.core.workflows.dependencies`, ``apply_checkpoints``
:mod:`synapse_ha.core.workflows.checkpoints`, ``apply_node_checks``
:mod:`synapse_ha.core.health.node_checks`, ``apply_preemption``
:mod:`synapse_ha.core.queues.victim_rules`). Each handler is declared with what its command may
touch (:mod:`.changes`), from which snapshots are built.
"""

from __future__ import annotations

from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.formats import format_needed, format_refusal
from synapse_ha.core.commands import Result, ResultCode, error
from synapse_ha.core.machine import (
    apply_degraded,
    apply_health,
    apply_node_checks,
    apply_preemption,
    binding,
    config,
    elastic,
    jobs,
    nodes,
    replacement,
    reports,
    tokens_queues,
)
from synapse_ha.core.machine.attempts import retry_delay_ms
from synapse_ha.core.machine.binding import verify_placement
from synapse_ha.core.machine.changes import Handling
from synapse_ha.core.machine.config import orphaned_levels
from synapse_ha.core.machine.reports import EXIT_STOPPED
from synapse_ha.core.model import ClusterState

__all__ = [
    "EXIT_STOPPED",
    "HANDLERS",
    "apply",
    "orphaned_levels",
    "retry_delay_ms",
    "verify_placement",
]

# Every command type, to the handling its aggregate declares.
HANDLERS: dict[type, Handling] = {
    **config.HANDLERS,
    **nodes.HANDLERS,
    **jobs.HANDLERS,
    **binding.HANDLERS,
    **reports.HANDLERS,
    **replacement.HANDLERS,
    **elastic.HANDLERS,
    **tokens_queues.HANDLERS,
    **apply_preemption.HANDLERS,
    **apply_health.HANDLERS,
    **apply_node_checks.HANDLERS,
    **apply_degraded.HANDLERS,
}


def apply(state: ClusterState, command: cmd.Command) -> Result:
    """Apply ``command`` to ``state`` in place and say what happened. Never raises."""
    handler = HANDLERS.get(type(command))
    if handler is None:
        return error(ResultCode.INVALID, f"unknown command type {type(command).__name__}")
    try:
        if type(command) is not cmd.RaiseFormat:
            need = format_needed(command)
            if need > state.format_floor:
                return error(ResultCode.CONFLICT, format_refusal(need, state.format_floor))
        now = max(command.now_ms, state.last_time_ms)
        result = handler.apply(state, command, now)
    except Exception as exc:  # a bug; the log must keep moving on every replica alike
        return error(ResultCode.INTERNAL, f"{type(command).__name__}: {exc!r}")
    state.applied_commands += 1
    state.last_time_ms = now
    return result
