"""A core harness whose every command also goes through a history tracker, as the
replica's apply observer does it (the per-command touched records of core.snapshot)."""

from __future__ import annotations

from dataclasses import dataclass, field

from synapse_ha.core import commands as c
from synapse_ha.core import invariants
from synapse_ha.core.snapshot import Changes, apply_tracked
from synapse_ha.history.tracker import (
    AppliedCommand,
    AttemptRecord,
    Event,
    JobRecord,
    Step,
    Tracker,
)
from tests.core.harness import Cluster


@dataclass
class ObservedCluster(Cluster):
    tracker: Tracker = field(default_factory=Tracker)
    events: list[Event] = field(default_factory=list)
    attempts: list[AttemptRecord] = field(default_factory=list)
    jobs: list[JobRecord] = field(default_factory=list)
    # Pass None for the touched records: the tracker compares everything it knows.
    everything: bool = False

    def do(self, command: c.Command) -> c.Result:
        touched = Changes()
        result = apply_tracked(self.state, command, touched)
        self.log.append(command)
        assert not invariants.check(self.state)
        assert result.code is not c.ResultCode.INTERNAL, result.message
        ids = None if self.everything else touched.jobs
        nodes = None if self.everything else touched.nodes
        self.take(self.tracker.step(AppliedCommand(command, result, self.state, ids, nodes)))
        return result

    def take(self, step: Step) -> None:
        self.events.extend(step.events)
        self.attempts.extend(step.attempts)
        self.jobs.extend(step.jobs)

    def kinds(self, job_id: str) -> list[str]:
        return [str(e.kind) for e in self.events if e.job_id == job_id]
