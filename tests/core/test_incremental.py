"""The incremental planner makes the plan a full pass makes, after every command.

Two stateful machines apply random command streams to a live state through
:func:`apply_tracked` and take snapshots as the leader does; after every command and
every clock move, :class:`IncrementalPlanner` (kept across the whole run, as the leader
keeps it) and a full :func:`schedule` plan on the same snapshot, and the plans must be
equal: placements, reasons and which of them changed, reservation, preemptions and
``wake_ms``.

* :class:`PlainQueueMachine` concentrates on the cases the planner answers without a
  full pass: one queue, gangs of a few shapes submitted while the cluster is full,
  passes whose reason updates are applied, finishes, cordons, GPU faults, failures
  with back-off, locality waits and clock moves across their deadlines.
* :class:`IncrementalClusterMachine` runs every rule of the general property machine
  (queues with quotas, preemption, dependencies, tokens, purges), on full copies of the
  state (every record compared by value).
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from synapse_ha.core import commands as c
from synapse_ha.core.codec.versioned import decode_command, encode_command
from synapse_ha.core.health.fitness import GpuFault
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, JobSpec, JobState, MemberPlacement, NodeStatus
from synapse_ha.core.reasons import ReasonCode
from synapse_ha.core.scheduler import IncrementalPlanner, Plan, schedule
from synapse_ha.core.snapshot import SnapshotBuilder, apply_tracked, full_copy
from tests.core.harness import job, node
from tests.core.test_properties import ClusterMachine

NODES = [f"n{i}" for i in range(4)]


class _Compared:
    """Plans on snapshots with both planners and compares them."""

    state: ClusterState
    now: int

    def start_comparing(self, copies: bool = False) -> None:
        """``copies``: plan on full copies of the state (every record a new object, as
        the leader tests' fake log makes them) rather than on a snapshot builder's."""
        self.builder = SnapshotBuilder()
        self.copies = copies
        self.planner = IncrementalPlanner()
        self.last: Plan | None = None

    def tracked(self, command: c.Command) -> c.Result:
        if self.copies:
            result = apply(self.state, command)
        else:
            result = apply_tracked(self.state, command, self.builder.changes)
        assert result.code is not c.ResultCode.INTERNAL, result.message
        self.compare()
        return result

    def snapshot(self) -> ClusterState:
        return full_copy(self.state) if self.copies else self.builder.take(self.state)

    def compare(self) -> None:
        snap = self.snapshot()
        full = schedule(snap, self.now)
        incremental = self.planner.plan(snap, self.now)
        assert incremental == full
        self.last = full

    def counted(self) -> Counter[str]:
        for how in self.planner.counts:
            event(f"planned: {how.split(':')[0]}")
        return self.planner.counts


class PlainQueueMachine(_Compared, RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = ClusterState()
        self.now = 1_000
        self.start_comparing()

    def do(self, command: c.Command) -> c.Result:
        return self.tracked(decode_command(encode_command(command)))

    @initialize(
        racks=st.sampled_from(
            [["r1"], ["r1", "r2"], ["r1", "r1", "r2", "r2"], ["r1", "r1", "r2", "r2"]]
        ),
        wait=st.sampled_from([0, 20_000, 20_000]),
        spares=st.sampled_from([0, 0, 1]),
        reservations=st.sampled_from([1, 1, 2, 3]),
    )
    def cluster(self, racks: list[str], wait: int, spares: int = 0, reservations: int = 1) -> None:
        config = self.state.config
        if reservations > 1:  # more than one per pass (core/scheduler/reservation.py): 18
            self.do(c.RaiseFormat(18, (), self.now))
        elif spares:  # hot spares (core/spares.py) need format 14
            self.do(c.RaiseFormat(14, (), self.now))
        wanted = type(config)(
            locality_wait_ms=wait, spares=spares, reservations_per_pass=reservations
        )
        self.do(c.Configure(wanted, self.now))
        for i, rack in enumerate(racks):
            self.do(c.RegisterNode(node(NODES[i], gpus=8, cpu=16, rack=rack), self.now))

    @rule(
        replicas=st.integers(1, 3),
        gpu=st.sampled_from([0, 2, 4, 8]),
        priority=st.sampled_from([0, 0, 0, 1]),
        topology=st.sampled_from([("", ""), ("", "rack"), ("rack", ""), ("host", "")]),
        time_limit=st.sampled_from([0, 30, 30]),
        retries=st.integers(0, 1),
        count=st.integers(1, 3),
    )
    def submit(
        self,
        replicas: int,
        gpu: int,
        priority: int,
        topology: tuple[str, str],
        time_limit: int,
        retries: int,
        count: int,
    ) -> None:
        required, preferred = topology
        spec = job(
            replicas=replicas,
            gpu=gpu,
            cpu=1,
            priority=priority,
            required=required,
            preferred=preferred,
            time_limit_s=time_limit,
            retries=retries,
            backoff_s=5,
        )
        for _ in range(count):
            self.do(c.SubmitJob(spec, f"req-{len(self.state.jobs)}", self.now))

    @rule()
    def scheduling_pass(self) -> None:
        plan = schedule(self.snapshot(), self.now)
        command = plan.command(self.now)
        if command is not None:
            self.do(command)
        for preempt in plan.preempt_commands(self.now):
            self.do(preempt)

    @rule(
        data=st.data(),
        code=st.sampled_from([0, 1]),
        start=st.sampled_from([True, True, False]),
    )
    def member_exits(self, data: st.DataObject, code: int, start: bool) -> None:
        """Every member of a live gang starts, or exits with ``code``."""
        live = sorted(j.job_id for j in self.state.jobs.values() if j.live_attempt())
        if live:
            self.member_exits_of(data.draw(st.sampled_from(live)), code, start)

    def member_exits_of(self, job_id: str, code: int, start: bool = False) -> None:
        attempt = self.state.jobs[job_id].attempt
        assert attempt is not None
        kind = c.MemberEventKind.STARTED if start else c.MemberEventKind.EXITED
        for m in attempt.members:
            event_ = c.MemberEvent(job_id, attempt.fencing_token, m.rank, kind, exit_code=code)
            self.do(c.ReportMembers(m.node_id, (event_,), jitter_seed=3, now_ms=self.now))

    @rule(node_id=st.sampled_from(NODES), status=st.sampled_from(list(NodeStatus)))
    def set_status(self, node_id: str, status: NodeStatus) -> None:
        if status is NodeStatus.DEAD:
            self.do(c.MarkNodeDead(node_id, "", jitter_seed=1, now_ms=self.now))
        else:
            self.do(c.SetNodeStatus(node_id, status, "", self.now))

    @rule(node_id=st.sampled_from(NODES), gpu=st.integers(0, 7))
    def gpu_fault(self, node_id: str, gpu: int) -> None:
        self.do(c.ReportGpuHealth(node_id, (GpuFault(gpu, "xid-79"),), 1, self.now))

    @rule(which=st.integers(1, 30))
    def cancel(self, which: int) -> None:
        self.do(c.CancelJob(f"job-{which:06d}", "user", self.now))

    @rule(ms=st.sampled_from([0, 1, 1_000, 4_999, 5_000, 19_999, 20_000, 40_000]))
    def advance(self, ms: int) -> None:
        self.now += ms

    @invariant()
    def plans_agree(self) -> None:
        self.compare()

    def teardown(self) -> None:
        self.counted()


PlainQueueMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestPlainQueueMachine = PlainQueueMachine.TestCase


class IncrementalClusterMachine(_Compared, ClusterMachine):
    """The general machine's rules read records of the live state across the commands
    they apply, which the live state keeps in place: plans are made on full copies."""

    def __init__(self) -> None:
        super().__init__()
        self.start_comparing(copies=True)

    def do(self, command: c.Command) -> c.Result:
        data = encode_command(command)
        self.log.append(data)
        return self.tracked(decode_command(data))

    @invariant()
    def plans_agree(self) -> None:
        self.compare()

    def teardown(self) -> None:
        self.counted()
        super().teardown()


IncrementalClusterMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestIncrementalClusterMachine = IncrementalClusterMachine.TestCase


def _started(machine: PlainQueueMachine, spec: JobSpec, request: str) -> str:
    """Submit ``spec``, bind it through a pass and start its members."""
    job_id = machine.do(c.SubmitJob(spec, request, machine.now)).job_id
    machine.scheduling_pass()
    attempt = machine.state.jobs[job_id].attempt
    assert attempt is not None
    for m in attempt.members:
        started = c.MemberEvent(job_id, attempt.fencing_token, m.rank, c.MemberEventKind.STARTED)
        machine.do(c.ReportMembers(m.node_id, (started,), now_ms=machine.now))
    return job_id


def test_a_new_submission_that_waits_extends_the_plan_without_a_full_pass() -> None:
    machine = PlainQueueMachine()
    machine.cluster(["r1"], 0)
    spec = job(replicas=1, gpu=8)
    for i in range(4):  # the first fills the node, the rest wait
        machine.do(c.SubmitJob(spec, f"r{i}", machine.now))
    machine.scheduling_pass()
    machine.scheduling_pass()
    counts = machine.planner.counts
    full = counts["full"]
    machine.now += 1_000
    machine.compare()  # nothing changed: kept
    machine.do(c.SubmitJob(spec, "late", machine.now))
    assert counts["full"] == full
    assert counts["kept"] >= 1 and counts["extended"] >= 1
    assert machine.last is not None
    assert len(machine.last.reasons) == 4
    assert all(j.state is JobState.PENDING for j in list(machine.state.jobs.values())[1:])


def test_a_timed_reservation_counts_down_as_the_clock_moves() -> None:
    # The reasons of gangs behind a timed reservation say how far off it starts: kept
    # plans say so at their own time; once it is due a full pass plans again.
    machine = PlainQueueMachine()
    machine.cluster(["r1"], 0)
    _started(machine, job(gpu=8, time_limit_s=30), "running")
    head = machine.do(c.SubmitJob(job(gpu=8), "head", machine.now)).job_id
    behind = machine.do(c.SubmitJob(job(gpu=8), "behind", machine.now)).job_id
    machine.scheduling_pass()
    made = machine.last.reservation if machine.last is not None else None
    assert made is not None and made.start_ms is not None
    counts = machine.planner.counts
    kept, full = counts["kept"], counts["full"]
    machine.now += 1_000
    machine.compare()
    assert machine.last is not None
    assert machine.last.reasons[head].num("start_in_ms") == made.start_ms - machine.now
    assert not machine.last.reasons[behind].has("start_in_ms")  # it would not fit now
    assert dict(machine.last.changed_reasons).keys() == {head}
    assert (counts["kept"], counts["full"]) == (kept + 1, full)
    machine.now = made.start_ms
    machine.compare()
    assert counts["fallback:time"] >= 1 and counts["full"] == full + 1


def _bound_on(machine: PlainQueueMachine, spec: JobSpec, host: str) -> str:
    """Submit ``spec`` (one member of 8 GPUs) and bind it on ``host``."""
    job_id = machine.do(c.SubmitJob(spec, host, machine.now)).job_id
    members = (MemberPlacement(0, host, tuple(range(8))),)
    assert machine.do(c.BindPlan((c.GangPlacement(job_id, 0, members),), (), machine.now)).bound
    return job_id


def test_a_gang_that_may_no_longer_backfill_is_planned_afresh() -> None:
    machine = PlainQueueMachine()
    machine.cluster(["r1", "r1", "r2", "r2"], 60_000)
    _bound_on(machine, job(gpu=8, time_limit_s=30), "n0")  # ends at 31 s
    _bound_on(machine, job(gpu=8), "n2")  # no time limit
    machine.do(c.SubmitJob(job(replicas=3, gpu=8), "head", machine.now))  # reserves
    # Two members: fits across the racks now and would end before the reservation
    # starts, so it waits for one rack (locality) while it may backfill.
    late = machine.do(c.SubmitJob(job(replicas=2, gpu=8, time_limit_s=10), "b", machine.now))
    machine.scheduling_pass()
    made = machine.last.reservation if machine.last is not None else None
    assert made is not None and made.start_ms == 31_000
    assert machine.state.jobs[late.job_id].reason.code is ReasonCode.WAITING_LOCALITY
    machine.now = made.start_ms - 10_000  # the last moment it may backfill
    machine.compare()
    full = machine.planner.counts["full"]
    machine.now += 1
    machine.compare()
    assert machine.planner.counts["full"] == full + 1
    assert machine.last is not None
    assert machine.last.reasons[late.job_id].code is ReasonCode.RESERVED_FOR_OTHER


def test_a_locality_wait_ending_is_planned_afresh() -> None:
    machine = PlainQueueMachine()
    machine.cluster(["r1", "r1", "r2", "r2"], 20_000)
    for host in ("n0", "n2"):  # one host busy in each rack
        filler = machine.do(c.SubmitJob(job(gpu=8), host, machine.now)).job_id
        members = (MemberPlacement(0, host, tuple(range(8))),)
        assert machine.do(c.BindPlan((c.GangPlacement(filler, 0, members),), (), machine.now)).bound
    gang = machine.do(c.SubmitJob(job(replicas=2, gpu=8), "gang", machine.now)).job_id
    machine.scheduling_pass()
    assert machine.last is not None and machine.last.wake_ms == machine.now + 20_000
    machine.now += 19_999
    machine.compare()  # still waiting: the plan stands
    machine.now += 1
    machine.compare()
    assert [p.job_id for p in machine.last.placements] == [gang]


def test_a_back_off_ending_is_planned_afresh() -> None:
    machine = PlainQueueMachine()
    machine.cluster(["r1"], 0)
    failing = _started(machine, job(gpu=8, retries=1, backoff_s=5), "fails")
    machine.member_exits_of(failing, 1)
    machine.scheduling_pass()
    until = machine.state.jobs[failing].retry_not_before_ms  # with jitter
    assert until > machine.now
    machine.now = until - 1
    machine.compare()
    assert machine.last is not None and not machine.last.placements
    machine.now = until
    machine.compare()
    assert machine.last is not None
    assert [p.job_id for p in machine.last.placements] == [failing]
