"""Elastic gangs (DESIGN §4): ``replicas: {min: 4, max: 8}`` in the job spec.

An elastic gang's spec keeps ``replicas`` at its ``max`` and carries an
:class:`ElasticPolicy` with its ``min``. Its attempt holds between ``min`` and ``max``
members, ranks ``0..n-1`` with no gap:

* **It starts smaller.** The scheduling pass places the whole ``max`` when it fits, else
  ``min`` members when they fit (before it would preempt anyone for the gang).
* **It grows when room appears.** While no pending gang waits for room, the leader adds
  ranks ``n, n+1, ...`` one node at a time on free nodes of the gang's required topology
  domain (:func:`~synapse_ha.core.scheduler.elastic.plan_growth`, verified at apply as a
  replacement is). Hot spares are kept for replacements, never taken by growth.
* **It shrinks rather than wait or be preempted whole.** Its members above ``min`` are
  the first a waiting gang of the same or a higher priority takes back: the leader asks
  for the gang's top ranks (:class:`~synapse_ha.core.commands.ShrinkMembers`); the worker
  stops them, and once each is reported stopped (or its node declared dead) its share of
  the node is freed and the gang's size falls. A reclaim, or a higher class of its
  queue, that may preempt it whole shrinks it instead when that costs no more GPU-time
  (:mod:`synapse_ha.core.scheduler.shrink_victims`).

The surviving members are told of every change as of a replacement: a line in their
``$SYNAPSE_MEMBERSHIP_FILE`` (with ``world_size`` and the hosts) and the policy's signal.
A new member's ``WORLD_SIZE`` is the gang's size when it starts.

The queue's quota is charged for the members the attempt holds (those given back count
until the attempt drops them), not ``max``
(:func:`~synapse_ha.core.queues.quota.held_request`): a pending elastic gang is admitted at
its ``min`` and starts with no more members than the quota admits; growth stays within
the quota (planned and verified at apply). That is from format 16 on
(:data:`~synapse_ha.core.queues.quota.MEMBERS_CHARGED_FORMAT`); a cluster whose floor is
15 charges an elastic gang for its ``max`` from the start, as releases of format 15 do.

A lost member follows ``on_node_failure`` as in a fixed gang (requeue, or replace the
rank).
"""

from __future__ import annotations

from dataclasses import dataclass

from synapse_ha.core.replacement import DEFAULT_MEMBERSHIP_SIGNAL, MEMBERSHIP_SIGNALS


@dataclass(frozen=True, slots=True)
class ElasticPolicy:
    """``replicas: {min: ..., max: ...}``: the fewest members the gang runs with
    (``min_replicas``; the spec's ``replicas`` is the most) and the signal its members get
    once the new membership is written to their ``$SYNAPSE_MEMBERSHIP_FILE`` ("" for
    none)."""

    min_replicas: int
    signal: str = DEFAULT_MEMBERSHIP_SIGNAL


def elastic_problems(policy: ElasticPolicy | None, replicas: int) -> list[tuple[str, str]]:
    """``(field, rule)`` for each rule ``policy`` breaks with ``replicas`` as its max."""
    if policy is None:
        return []
    problems = []
    if not 1 <= policy.min_replicas < replicas:
        problems.append(
            (
                "replicas.min",
                f"must be at least 1 and below replicas.max ({replicas}), "
                f"got {policy.min_replicas}; a fixed gang is replicas: N",
            )
        )
    if policy.signal not in MEMBERSHIP_SIGNALS:
        named = ", ".join(s for s in MEMBERSHIP_SIGNALS if s)
        problems.append(("membership_signal", f"must be one of {named} or none"))
    return problems
