"""The leader's side of member replacement (core/replacement.py): each housekeeping step
it proposes the lost ranks of running gangs that can be placed again
(:func:`~synapse_ha.core.scheduler.replacement.plan_replacements`), one proposal in flight
at a time, and requeues whole the gangs whose lost ranks waited past their
``replace.timeout``; the nodes of a committed replacement are nudged to heartbeat at once,
so the new member starts and the others hear of it without waiting a heartbeat."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from random import Random

from synapse_ha.core import commands as cmd
from synapse_ha.core.model import ClusterState
from synapse_ha.core.reasons import render
from synapse_ha.core.scheduler.replacement import plan_replacements
from synapse_ha.core.views import due_replacement_timeouts
from synapse_ha.leader.in_flight import InFlight, propose_per_job

Start = Callable[[cmd.Command, int], InFlight]


class Replacing:
    """Proposals of replacements and replacement timeouts. One driver thread."""

    def __init__(self, start: Start, rng: Random) -> None:
        self._start = start
        self._rng = rng
        self._proposal: InFlight | None = None
        self._nodes: tuple[str, ...] = ()
        self._timeouts: dict[str, InFlight] = {}

    def step(self, state: ClusterState, now_ms: int) -> tuple[list[str], tuple[str, ...]]:
        """What was proposed (sentences), and the nodes to nudge: those of a replacement
        that committed since the last step."""
        said: list[str] = []
        nudge: tuple[str, ...] = ()
        proposal = self._proposal
        if proposal is not None:
            if not proposal.settled(now_ms):
                return said, nudge
            self._proposal = None
            result = proposal.result()
            if result is not None and result.replacing:
                nudge = self._nodes
        if not _any_vacancy(state):
            return said, nudge  # the usual case: one look at each live job, no sort
        due = (
            replace(c, jitter_seed=self._rng.getrandbits(63))
            for c in due_replacement_timeouts(state, now_ms)
            if c.job_id not in self._timeouts
        )
        said += propose_per_job(
            self._timeouts,
            due,
            now_ms,
            self._start,
            lambda c: f"requeueing {c.job_id}: " + render(c.reason),
        )
        command = plan_replacements(state, now_ms)
        if command is not None:
            self._proposal = self._start(command, now_ms)
            self._nodes = _nodes_of(state, command)
            ranks = ", ".join(
                f"{r.job_id} rank {r.member.rank} on {r.member.node_id}"
                for r in command.replacements
            )
            said.append(f"placing lost members again: {ranks}")
        return said, nudge


def _any_vacancy(state: ClusterState) -> bool:
    """Whether a live job has a lost rank."""
    jobs = state.jobs
    for job_id in state.live_ids():
        attempt = jobs[job_id].attempt
        if attempt is not None and attempt.vacancies:
            return True
    return False


def _nodes_of(state: ClusterState, command: cmd.ReplaceMembers) -> tuple[str, ...]:
    """Every node of the gangs a replacement changes: the new member's and the others'."""
    nodes: set[str] = set()
    for r in command.replacements:
        job = state.jobs.get(r.job_id)
        if job is not None and job.attempt is not None:
            nodes.update(m.node_id for m in job.attempt.members)
        nodes.add(r.member.node_id)
    return tuple(sorted(nodes))
