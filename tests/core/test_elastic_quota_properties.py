"""Property test of elastic gangs under queue quotas (core/elastic.py,
core/scheduler/shrink_victims.py): random elastic and fixed gangs in two queues of a
cohort, scheduling passes whose binds, shrinks and preemptions are applied as the leader
proposes them, growth and room shrinks, member exits and time. After every step every
invariant holds, a queue's charged GPUs equal its live attempts' members, a fresh plan's
commands are all accepted, and a queue within its nominal is never taken below it by a
reclaim's shrinks."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from synapse_ha.core import commands as c
from synapse_ha.core import invariants
from synapse_ha.core.cluster_config import ClusterConfig, PreemptionMode, PriorityClass, Queue
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.elastic import ElasticPolicy
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, JobState, MemberState
from synapse_ha.core.queues.quota import QueueUsage
from synapse_ha.core.scheduler import schedule
from synapse_ha.core.scheduler.elastic import plan_growth, plan_shrink
from tests.core.harness import job, node

NODES = ["n0", "n1", "n2", "n3"]  # 32 GPUs: the two queues' nominal quotas


class ElasticQuotas(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = ClusterState()
        self.now = 1_000
        self.n = 0

    def do(self, command: c.Command) -> c.Result:
        result = apply(self.state, command)
        assert result.code is not c.ResultCode.INTERNAL, result.message
        return result

    @initialize(a=st.sampled_from([8, 16, 24]), borrowing=st.sampled_from([None, 0, 8]))
    def cluster(self, a: int, borrowing: int | None) -> None:
        assert self.do(c.RaiseFormat(FORMAT)).ok
        config = ClusterConfig(
            preemption=PreemptionMode.TOPOLOGY,
            locality_wait_ms=0,
            priority_classes=(
                PriorityClass("low", 0),
                PriorityClass("high", 10, preempts=True),
            ),
        )
        assert self.do(c.Configure(config)).ok
        for i, node_id in enumerate(NODES):
            info = node(node_id, gpus=8, rack=f"r{i % 2}")
            assert self.do(c.RegisterNode(info, self.now)).ok
        for name, gpu in (("a", a), ("b", 32 - a)):
            queue = Queue(name, gpu=gpu, cohort="lab", borrowing_limit_gpu=borrowing)
            assert self.do(c.SetQueue(queue, self.now)).ok

    @rule(
        queue=st.sampled_from(["a", "b"]),
        replicas=st.integers(1, 4),
        fewest=st.sampled_from([0, 1, 2]),
        cls=st.sampled_from(["low", "high"]),
        priority=st.integers(0, 5),
    )
    def submit(self, queue: str, replicas: int, fewest: int, cls: str, priority: int) -> None:
        spec = job(f"g{self.n}", queue=queue, gpu=8, replicas=replicas, priority=priority)
        spec = dataclasses.replace(spec, priority_class=cls)
        if 0 < fewest < replicas:
            spec = dataclasses.replace(spec, elastic=ElasticPolicy(fewest))
        self.n += 1
        assert self.do(c.SubmitJob(spec, f"r{self.n}", self.now)).ok

    @rule()
    def scheduling_pass(self) -> None:
        plan = schedule(self.state, self.now)
        bind = plan.command(self.now)
        if bind is not None:
            result = self.do(bind)
            assert result.rejected == (), result.rejected
        for shrink in plan.shrink_commands():
            result = self.do(shrink)
            assert result.ok, result.message
            event("a preemptor shrank an elastic gang")
            if plan.preempt_commands(self.now):
                event("one preemptor shrank one gang and preempted another")
        for preempt in plan.preempt_commands(self.now):
            result = self.do(preempt)
            assert result.ok, result.message

    @rule()
    def resize(self) -> None:
        for shrink in plan_shrink(self.state, self.now):
            assert self.do(shrink).ok
        growth = plan_growth(self.state, self.now)
        if growth is not None:
            result = self.do(growth)
            assert result.ok and not result.rejected, result
            event("an elastic gang grew")

    @rule(data=st.data(), code=st.sampled_from([0, 143]))
    def member_exits(self, data: st.DataObject, code: int) -> None:
        """A member of a live attempt reports: started, or exited (0 or killed)."""
        live = self.state.live_jobs()
        if not live:
            return
        held = data.draw(st.sampled_from(live))
        attempt = held.attempt
        assert attempt is not None
        rank = data.draw(st.integers(0, len(attempt.members) - 1))
        member = attempt.members[rank]
        status = attempt.member_status[rank]
        kind = (
            c.MemberEventKind.STARTED
            if status.state is MemberState.BOUND and code == 0
            else c.MemberEventKind.EXITED
        )
        reported = c.MemberEvent(
            held.job_id,
            attempt.fencing_token,
            rank,
            kind,
            exit_code=code if kind is c.MemberEventKind.EXITED else None,
            generation=member.generation,
        )
        self.do(c.ReportMembers(member.node_id, (reported,), now_ms=self.now))

    @rule()
    def pending_gangs_give_up(self) -> None:
        """Every pending gang is cancelled (room and quota nobody waits for appear)."""
        for j in list(self.state.jobs.values()):
            if j.state is JobState.PENDING:
                assert self.do(c.CancelJob(j.job_id, now_ms=self.now)).ok

    @rule()
    def members_start(self) -> None:
        """Every bound member of a live attempt reports it started."""
        for held in self.state.live_jobs():
            attempt = held.attempt
            assert attempt is not None
            for member, status in zip(attempt.members, attempt.member_status, strict=True):
                if status.state is MemberState.BOUND:
                    started = c.MemberEvent(
                        held.job_id,
                        attempt.fencing_token,
                        member.rank,
                        c.MemberEventKind.STARTED,
                        generation=member.generation,
                    )
                    self.do(c.ReportMembers(member.node_id, (started,), now_ms=self.now))

    @rule(ms=st.sampled_from([1_000, 60_000, 3_600_000]))
    def advance(self, ms: int) -> None:
        self.now += ms

    @invariant()
    def invariants_hold(self) -> None:
        problems = invariants.check(self.state)
        assert not problems, problems

    @invariant()
    def a_queues_charged_gpus_are_its_attempts_members(self) -> None:
        charged = QueueUsage.of(self.state)
        for name in ("a", "b"):
            members = sum(
                len(attempt.members) * j.spec.resources.gpu
                for j in self.state.jobs.values()
                if j.spec.queue == name and (attempt := j.live_attempt()) is not None
            )
            assert charged.used(name).gpu == members, name

    @invariant()
    def elastic_gangs_stay_between_min_and_max(self) -> None:
        for j in self.state.live_jobs():
            attempt, elastic = j.attempt, j.spec.elastic
            if attempt is not None and elastic is not None:
                assert elastic.min_replicas <= len(attempt.members) <= j.spec.replicas


ElasticQuotas.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestElasticQuotas = ElasticQuotas.TestCase
