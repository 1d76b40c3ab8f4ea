"""What a scheduling pass decides: the plan and the reservations of the first gangs in line."""

from __future__ import annotations

from dataclasses import dataclass, field

from synapse_ha.core.cluster_config import PreemptionKind
from synapse_ha.core.commands import BindPlan, GangPlacement, Preempt, ShrinkMembers, Victim
from synapse_ha.core.model import ClusterState
from synapse_ha.core.reasons import Reason


@dataclass(frozen=True, slots=True)
class Reservation:
    job_id: str
    start_ms: int | None  # None: only once jobs without a time limit end
    nodes: frozenset[str]


@dataclass(frozen=True, slots=True)
class Drain:
    """Nodes a pass holds for ``job_id``, whose free GPUs are scattered
    (:mod:`synapse_ha.core.scheduler.defrag`): they take no new gang but one estimated to
    end by ``done_ms``, when the last gang on them (``waits_for``) is estimated to end
    (None: a gang there has no estimate; then none)."""

    job_id: str
    nodes: frozenset[str]
    done_ms: int | None
    waits_for: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Preemption:
    """One preemption a pass decided: ``victims`` (whole gangs, each with the fencing
    token of its live attempt) stop and the elastic gangs of ``shrinks`` give back their
    top ranks so that ``preemptor`` can be placed."""

    preemptor: str
    attempts_made: int  # the preemptor's, as the planner saw it
    victims: tuple[Victim, ...]
    kind: PreemptionKind
    shrinks: tuple[ShrinkMembers, ...] = ()

    def command(self, now_ms: int) -> Preempt:
        return Preempt(self.preemptor, self.attempts_made, self.victims, self.kind, now_ms)


@dataclass(slots=True)
class Plan:
    """What one scheduling pass decided."""

    placements: list[GangPlacement] = field(default_factory=list)
    reasons: dict[str, Reason] = field(default_factory=dict)  # every unplaced pending job
    changed_reasons: list[tuple[str, Reason]] = field(default_factory=list)
    # The reservations of the pass's first gangs that cannot be placed, in queue order
    # (core/scheduler/reservation.py): at most ``ClusterConfig.reservations_per_pass``.
    reservations: list[Reservation] = field(default_factory=list)
    # The earliest later time at which time alone may change a decision (a locality
    # wait ending); a caller that plans only on events should plan again then.
    wake_ms: int | None = None
    # Preemptions to begin, in the order the pass decided them (DESIGN §8).
    preemptions: list[Preemption] = field(default_factory=list)
    # Nodes held for gangs whose free GPUs are scattered, in the order decided.
    drains: list[Drain] = field(default_factory=list)

    @property
    def reservation(self) -> Reservation | None:
        """The first reservation of the pass: its first gang in line that cannot be placed."""
        return self.reservations[0] if self.reservations else None

    def preempt_commands(self, now_ms: int) -> list[Preempt]:
        """One :class:`Preempt` per preemption of this plan with whole victims, to propose
        after the bind (and after :meth:`shrink_commands`)."""
        return [p.command(now_ms) for p in self.preemptions if p.victims]

    def shrink_commands(self) -> list[ShrinkMembers]:
        """The shrinks of this plan's preemptions, to propose after the bind."""
        return [s for p in self.preemptions for s in p.shrinks]

    def command(self, now_ms: int) -> BindPlan | None:
        """The command to propose, or None when the pass changes nothing."""
        if not self.placements and not self.changed_reasons:
            return None
        return BindPlan(
            placements=tuple(self.placements),
            reasons=tuple(self.changed_reasons),
            now_ms=now_ms,
        )


def with_causes(state: ClusterState, plan: Plan) -> Plan:
    """The plan with its reasons' causes and the reasons that changed. A gang queued
    again after an attempt ended says how that attempt ended (a disruption that requeued
    it, or a failure being retried)."""
    for job_id, why in plan.reasons.items():
        last = state.jobs[job_id].attempt
        if why.cause is None and last is not None and last.outcome is not None:
            plan.reasons[job_id] = Reason(why.code, why.params, last.outcome)
    plan.changed_reasons = [
        (job_id, why)
        for job_id, why in sorted(plan.reasons.items())
        if state.jobs[job_id].reason != why
    ]
    return plan
