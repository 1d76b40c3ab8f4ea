"""Property tests: random command sequences keep every invariant after every apply, and
replaying the same commands from empty state gives byte-identical state. The sequences
include queues with quotas in a cohort, priority classes and scheduling passes with
preemption on (topology-aware or blind), whose Preempt commands are applied as the
leader proposes them."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from synapse_ha.core import commands as c
from synapse_ha.core import invariants
from synapse_ha.core.cluster_config import (
    ClusterConfig,
    Cohort,
    Limits,
    PreemptionKind,
    PreemptionMode,
    Queue,
)
from synapse_ha.core.codec.formats import FORMAT, NEW_FIELDS
from synapse_ha.core.codec.from_plain import from_plain_compiled
from synapse_ha.core.codec.versioned import (
    decode_command,
    decode_state,
    encode_command,
    encode_state,
)
from synapse_ha.core.elastic import ElasticPolicy
from synapse_ha.core.identity.access import Role
from synapse_ha.core.machine import apply
from synapse_ha.core.model import (
    ClusterState,
    JobState,
    MemberState,
    NodeStatus,
    unconfirmed_members,
)
from synapse_ha.core.queues.quota import QueueUsage
from synapse_ha.core.reasons import ReasonCode
from synapse_ha.core.scheduler import schedule
from synapse_ha.core.scheduler.elastic import plan_growth, plan_shrink
from synapse_ha.core.spec.member_limits import MEMBER_LIMITS_FORMAT, member_counts, rules_in_force
from synapse_ha.core.views import (
    desired_by_node,
    desired_members,
    due_start_timeouts,
    due_time_limits,
)
from synapse_ha.core.workflows.dependencies import Dependencies
from tests.core.harness import job, node
from tests.core.test_codec_decoders import assert_built_as_by_constructors

NODE_IDS = [f"n{i}" for i in range(6)]
QUEUES = ["default", "qa", "qb", "qc"]  # qc is never created: submissions to it fail


def queue_gpus(state: ClusterState) -> dict[str, int]:
    """GPUs each queue's live attempts hold (preempted ones until they stop): their
    members' (an elastic gang's members it gives back until they are dropped)."""
    used: dict[str, int] = {}
    for j in state.jobs.values():
        attempt = j.live_attempt()
        if attempt is not None:
            held = len(attempt.members) * j.spec.resources.gpu
            used[j.spec.queue] = used.get(j.spec.queue, 0) + held
    return used


def quota_breaches(state: ClusterState, bind: c.BindPlan) -> list[str]:
    """Placements of ``bind`` (applied to ``state`` in order) that take a queue beyond
    its nominal quota plus what it may borrow at that moment: min(its borrowing limit,
    the idle lendable quota of the other queues of its cohort). A gang without GPUs takes
    none of the quota: it may start in a queue that is over it (a lender that took its
    nominal back leaves its borrowers over theirs until they are reclaimed)."""
    used = queue_gpus(state)
    out = []
    for placement in bind.placements:
        spec = state.jobs[placement.job_id].spec
        queue = state.queues.get(spec.queue)
        need = len(placement.members) * spec.resources.gpu
        if queue is not None and queue.gpu is not None:
            lendable = 0
            for other in state.queues.values():
                if other.name == queue.name or not queue.cohort or other.cohort != queue.cohort:
                    continue
                if other.gpu is None:
                    continue
                idle = max(0, other.gpu - used.get(other.name, 0))
                limit = other.lending_limit_gpu
                lendable += idle if limit is None else min(limit, idle)
            borrow = lendable
            if queue.borrowing_limit_gpu is not None:
                borrow = min(borrow, queue.borrowing_limit_gpu)
            flat = not state.cohorts
            if flat and need and used.get(queue.name, 0) + need > queue.gpu + borrow:
                out.append(f"{placement.job_id} takes {queue.name} beyond its quota")
        used[spec.queue] = used.get(spec.queue, 0) + need
        if queue is not None and queue.gpu is not None and need and used[queue.name] > queue.gpu:
            out.extend(f"{placement.job_id}: {b}" for b in tree_breaches(state, queue, used))
    return out


def tree_breaches(state: ClusterState, queue: Queue, used: dict[str, int]) -> list[str]:
    """For a queue that borrows: the subtrees above it that take more beyond their own
    nominal than their borrowing limit allows, or a root that uses more than it has."""
    out = []
    if queue.borrowing_limit_gpu is not None and used[queue.name] - queue.gpu > (
        queue.borrowing_limit_gpu
    ):
        out.append(f"{queue.name} beyond its borrowing limit")
    if not queue.cohort:
        return [*out, f"{queue.name} borrows without a cohort"]
    name, seen = queue.cohort, set()
    while name and name not in seen:
        seen.add(name)
        under = {name}  # the cohort and every cohort below it
        while grown := {n for n, r in state.cohorts.items() if r.parent in under} - under:
            under |= grown
        nominal = sum((state.cohorts[n].gpu or 0) for n in under if n in state.cohorts)
        members = [q for q in state.queues.values() if q.cohort in under and q.gpu is not None]
        nominal += sum(q.gpu or 0 for q in members)
        over = sum(used.get(q.name, 0) for q in members) - nominal
        record = state.cohorts.get(name)
        parent = record.parent if record is not None else ""
        limit = record.borrowing_limit_gpu if record is not None else None
        if not parent and over > 0:
            out.append(f"root {name} uses {over} more than it has")
        elif parent and limit is not None and over > limit:
            out.append(f"{name} takes {over} beyond its nominal, limit {limit}")
        name = parent
    return out


def forget_node(
    preempted: dict[tuple[str, int], dict[int, tuple[str, set[int]]]], node_id: str
) -> None:
    """A node declared dead confirms the preempted gangs on it stopped: their whole
    attempt ends (members on other nodes included) and holds nothing now."""
    for key in [k for k, held in preempted.items() if any(n == node_id for n, _ in held.values())]:
        del preempted[key]


def check_preempted(
    state: ClusterState, preempted: dict[tuple[str, int], dict[int, tuple[str, set[int]]]]
) -> None:
    """A preempted attempt keeps each member's GPUs until that member is confirmed
    stopped (an exit; a node declared dead ends the whole attempt and its record is
    dropped from ``preempted``); once all are, it ends and, unless cancelled meanwhile, the job is
    PENDING again with the outcome PREEMPTED. Records of finished checks are dropped."""
    for key, held in list(preempted.items()):
        job_id, token = key
        j = state.jobs.get(job_id)
        attempt = j.attempt if j is not None else None
        if j is None or attempt is None or attempt.fencing_token != token:
            del preempted[key]
            continue
        if attempt.state.live:
            stopping = {
                r for r, s in enumerate(attempt.member_status) if s.state is not MemberState.EXITED
            }
        else:
            stopping = set(unconfirmed_members(j))
        for rank, (node_id, gpus) in held.items():
            if rank in stopping:
                node_ = state.nodes.get(node_id)
                assert node_ is not None and gpus <= node_.allocated_gpus, (job_id, rank)
        if not attempt.state.live:
            assert attempt.outcome is not None
            if j.state is JobState.PENDING and len(held) == len(attempt.members):
                assert attempt.outcome.code is ReasonCode.PREEMPTED, attempt.outcome
            if not stopping:
                del preempted[key]


def protected_victims(state: ClusterState, preempt: c.Preempt, now: int) -> list[str]:
    """Victims of ``preempt`` still within their minimum run time (the longer of
    their class's and their queue's, from their bind), unless the preemptor is a
    reclaim queued at least ``reclaim_wait_max_ms`` ago."""
    config = state.config
    preemptor = state.jobs[preempt.preemptor]
    waited = now - max(preemptor.submitted_at_ms, preemptor.retry_not_before_ms)
    if preempt.kind is PreemptionKind.RECLAIM and waited >= config.reclaim_wait_max_ms:
        return []
    out = []
    for v in preempt.victims:
        j = state.jobs[v.job_id]
        cls = [p for p in config.priority_classes if p.name == j.spec.priority_class]
        queue = state.queues.get(j.spec.queue)
        least = max(
            cls[0].min_runtime_ms if cls else 0,
            queue.min_runtime_ms if queue is not None else 0,
        )
        assert j.attempt is not None
        if now < j.attempt.bound_at_ms + least:
            out.append(v.job_id)
    return out


def member_cap_breaches(state: ClusterState, bind: c.BindPlan) -> list[str]:
    """Placements of ``bind`` (applied to ``state`` in order) that take their owner past
    a member cap in force: its running members in the cluster, or on one node (counted by
    a scan of every job)."""
    rules = rules_in_force(state)
    running: dict[str, int] = {}
    on_node: dict[tuple[str, str], int] = {}
    for j in state.jobs.values():
        if (attempt := j.live_attempt()) is not None:
            running[j.owner] = running.get(j.owner, 0) + len(attempt.members)
            for m in attempt.members:
                on_node[j.owner, m.node_id] = on_node.get((j.owner, m.node_id), 0) + 1
    out = []
    for placement in bind.placements:
        j = state.jobs[placement.job_id]
        cap, node_cap = rules.caps(state.queues.get(j.spec.queue))
        running[j.owner] = running.get(j.owner, 0) + len(placement.members)
        if running[j.owner] > cap.allowed:
            out.append(f"{placement.job_id} takes {j.owner!r} past {cap.named()}")
        for m in placement.members:
            on_node[j.owner, m.node_id] = on_node.get((j.owner, m.node_id), 0) + 1
            if on_node[j.owner, m.node_id] > node_cap.allowed:
                out.append(f"{placement.job_id} takes {m.node_id} past {node_cap.named()}")
    return out


def member_counts_by_scan(state: ClusterState) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """Each owner's members of live attempts, in all and per node, by looking at every job."""
    total: dict[str, int] = {}
    on_node: dict[str, dict[str, int]] = {}
    for j in state.jobs.values():
        if (attempt := j.live_attempt()) is not None:
            total[j.owner] = total.get(j.owner, 0) + len(attempt.members)
            mine = on_node.setdefault(j.owner, {})
            for m in attempt.members:
                mine[m.node_id] = mine.get(m.node_id, 0) + 1
    return total, on_node


def live_by_scan(state: ClusterState) -> set[str]:
    """The ids of the jobs holding resources, found by looking at every job."""
    return {job_id for job_id, j in state.jobs.items() if j.state.holds_resources}


def node_index_by_scan(state: ClusterState) -> dict[str, tuple[str, ...]]:
    """Per node, the jobs whose current attempt has a member there, unless the job is
    finished and every member of that attempt is known to have stopped, found by looking
    at every job."""
    found: dict[str, list[str]] = {}
    for job_id in sorted(state.jobs):
        job = state.jobs[job_id]
        if job.attempt is None:
            continue
        stopped = all(s.state is MemberState.EXITED for s in job.attempt.member_status)
        if job.state.finished and stopped:
            continue
        for node_id in sorted({m.node_id for m in job.attempt.members}):
            found.setdefault(node_id, []).append(job_id)
    return {node_id: tuple(ids) for node_id, ids in found.items()}


class DependentSubmissions(RuleBasedStateMachine):
    """The rule both machines share: jobs that wait for other jobs."""

    state: ClusterState
    now: int
    saw_dependency_wait = False
    saw_member_cap = False

    def do(self, command: c.Command) -> c.Result:
        raise NotImplementedError

    @rule(
        data=st.data(),
        kind=st.sampled_from(["after_ok", "after_any", "after_not_ok", "after"]),
        request=st.integers(0, 30),
        gpu=st.sampled_from([0, 4, 8]),
    )
    def submit_dependent(self, data: st.DataObject, kind: str, request: int, gpu: int) -> None:
        """A job waiting for another: mostly one that exists (and may never meet it)."""
        known = sorted(self.state.jobs) or ["job-000001"]
        other = data.draw(st.sampled_from([*known, "job-999999"]))
        deps = Dependencies(**{kind: (other,)})
        spec = dataclasses.replace(job(gpu=gpu), dependencies=deps)
        if self.state.format_floor < 4:
            self.do(c.RaiseFormat(4))
        result = self.do(c.SubmitJob(spec, f"dep-{request}", self.now))
        if result.ok and self.state.jobs[result.job_id].waiting_for:
            self.saw_dependency_wait = True

    @invariant()
    def a_queues_charged_gpus_are_its_attempts_members(self) -> None:
        charged = QueueUsage.of(self.state)
        for name, gpus in queue_gpus(self.state).items():
            assert charged.used(name).gpu == gpus, name

    @invariant()
    def the_live_index_is_the_jobs_holding_resources(self) -> None:
        # Built at the first check, then kept by apply through every later command.
        assert self.state.live_ids() == live_by_scan(self.state)

    @invariant()
    def the_member_counts_are_the_live_attempts_members(self) -> None:
        # Built at the first check, then kept by apply through binds, exits, requeues,
        # preemptions and cancels.
        counts = member_counts(self.state)
        assert (counts.total, counts.on_node) == member_counts_by_scan(self.state)

    @rule(
        floor_cpu=st.sampled_from([0, 100, 4_000]),
        floor_memory=st.sampled_from([0, 64, 8_192]),
        overhead=st.sampled_from([0, 4, 2_048]),
        running=st.sampled_from([1, 3, 10_000]),
        per_node=st.sampled_from([1, 2, 128]),
        raise_first=st.booleans(),
    )
    def member_limits(
        self,
        floor_cpu: int,
        floor_memory: int,
        overhead: int,
        running: int,
        per_node: int,
        raise_first: bool,
    ) -> None:
        """Floors and caps on members, changed while gangs run (refused below format 10
        unless they are the defaults)."""
        if raise_first and self.state.format_floor < FORMAT:
            assert self.do(c.RaiseFormat(FORMAT, ("r1", "r2", "r3"), self.now)).ok
        limits = replace(
            self.state.config.limits,
            member_min_cpu_milli=floor_cpu,
            member_min_memory_mib=floor_memory,
            member_overhead_memory_mib=overhead,
            running_members_per_user=running,
            members_per_node_per_user=per_node,
        )
        result = self.do(c.Configure(replace(self.state.config, limits=limits), self.now))
        usual = all(getattr(limits, name) == getattr(Limits(), name) for name in NEW_FIELDS[Limits])
        assert result.ok is (usual or self.state.format_floor >= MEMBER_LIMITS_FORMAT)

    @rule(
        name=st.sampled_from(["qa", "qb"]),
        running=st.sampled_from([None, 2]),
        per_node=st.sampled_from([None, 1, 3]),
    )
    def queue_member_caps(self, name: str, running: int | None, per_node: int | None) -> None:
        """A queue's own member caps, replacing the cluster's for its gangs."""
        queue = self.state.queues.get(name)
        if queue is None:
            return
        wanted = replace(
            queue, running_members_per_user=running, members_per_node_per_user=per_node
        )
        result = self.do(c.SetQueue(wanted, self.now, "user:root"))
        usual = running is None and per_node is None
        assert result.ok is (usual or self.state.format_floor >= MEMBER_LIMITS_FORMAT)

    @invariant()
    def each_node_desires_what_a_scan_of_every_job_finds(self) -> None:
        # The node index is built at the first check, then kept by apply.
        assert node_index_by_scan(self.state) == self.state.node_index()
        wanted = desired_by_node(self.state)
        for node_id in sorted({*self.state.nodes, *wanted}):
            assert desired_members(self.state, node_id) == wanted.get(node_id, [])


class ClusterMachine(DependentSubmissions):
    def __init__(self) -> None:
        super().__init__()
        self.state = ClusterState()
        self.log: list[bytes] = []
        self.now = 0
        self.last_token = 0
        self.tokens: dict[str, int] = {}
        self.saw_requeue = False
        self.saw_max_requeues = False
        self.created_tokens: set[str] = set()
        self.saw_preemption = False
        self.saw_hold = False
        self.saw_held_ranks = False
        self.saw_dependency_wait = False
        self.saw_cohort_tree = False
        # Preempted attempts (job, token) -> rank -> (node, GPUs) when preempted.
        self.preempted: dict[tuple[str, int], dict[int, tuple[str, set[int]]]] = {}
        # Every step a checkpoint mark of each job carried, and whether a gang marked.
        self.marked_steps: dict[str, set[int]] = {}
        self.saw_gang_mark = False

    def do(self, command: c.Command) -> c.Result:
        data = encode_command(command)
        decoded = decode_command(data)
        assert decoded == command
        self.log.append(data)
        result = apply(self.state, decoded)
        assert result.code is not c.ResultCode.INTERNAL, result.message
        return result

    @initialize(racks=st.lists(st.sampled_from(["r1", "r2"]), min_size=0, max_size=3))
    def some_nodes(self, racks: list[str]) -> None:
        """Start most runs with a few ready nodes, so that gangs bind (and get disrupted)."""
        for i, rack in enumerate(racks):
            self.do(c.RegisterNode(node(NODE_IDS[i], gpus=8, cpu=16, rack=rack), self.now))

    @initialize(quotas=st.lists(st.sampled_from([None, 4, 8, 16]), min_size=2, max_size=2))
    def some_queues(self, quotas: list[int | None]) -> None:
        """Start with queues qa and qb, in cohort c1 when they have a quota."""
        for name, gpu in zip(["qa", "qb"], quotas, strict=True):
            queue = Queue(name, gpu=gpu, cohort="c1" if gpu is not None else "")
            assert self.do(c.SetQueue(queue, self.now)).ok

    @rule(
        queue=st.sampled_from(["default", "qa", "qb"]),
        gpu=st.sampled_from([4, 8]),
        replicas=st.integers(1, 2),
        request=st.integers(0, 30),
    )
    def submit_urgent(self, queue: str, gpu: int, replicas: int, request: int) -> None:
        """A gang of the class that preempts, large enough to need victims."""
        spec = job(replicas=replicas, gpu=gpu, queue=queue, priority_class="high")
        self.do(c.SubmitJob(spec, f"urgent-{request}", self.now))

    @rule(
        node_id=st.sampled_from(NODE_IDS),
        gpus=st.sampled_from([0, 2, 4, 8]),
        rack=st.sampled_from(["r1", "r2", "r3"]),
        paired=st.booleans(),
    )
    def register(self, node_id: str, gpus: int, rack: str, paired: bool) -> None:
        islands = tuple((i, i + 1) for i in range(0, gpus, 2)) if paired else ()
        self.do(
            c.RegisterNode(node(node_id, gpus=gpus, cpu=16, rack=rack, islands=islands), self.now)
        )

    @rule(
        replicas=st.integers(1, 5),
        gpu=st.sampled_from([0, 1, 2, 4, 8]),
        cpu=st.sampled_from([0.5, 1, 4]),
        priority=st.integers(0, 2),
        required=st.sampled_from(["", "rack", "host", "zone"]),
        time_limit=st.sampled_from([0, 5, 60]),
        retries=st.integers(0, 2),
        request=st.integers(0, 30),
        queue=st.sampled_from(QUEUES),
        priority_class=st.sampled_from(["", "", "low", "normal", "high"]),
        fewest=st.sampled_from([0, 0, 0, 1, 2]),
    )
    def submit(
        self,
        replicas: int,
        gpu: int,
        cpu: float,
        priority: int,
        required: str,
        time_limit: int,
        retries: int,
        request: int,
        queue: str,
        priority_class: str,
        fewest: int,
    ) -> None:
        spec = job(
            replicas=replicas,
            gpu=gpu,
            cpu=cpu,
            priority=priority,
            required=required,
            time_limit_s=time_limit,
            retries=retries,
            backoff_s=2,
            queue=queue,
            priority_class=priority_class,
        )
        if 0 < fewest < replicas:  # an elastic gang (core/elastic.py)
            spec = replace(spec, elastic=ElasticPolicy(fewest))
        self.do(c.SubmitJob(spec, f"req-{request}", self.now))

    @rule()
    def resize_elastic_gangs(self) -> None:
        """The leader's shrinks and growth, as it proposes them: a fresh plan applies."""
        for shrink in plan_shrink(self.state, self.now):
            result = self.do(shrink)
            assert result.ok, result.message
            event("an elastic gang shrank")
        growth = plan_growth(self.state, self.now)
        if growth is not None:
            result = self.do(growth)
            assert result.ok and not result.rejected, result
            event("an elastic gang grew")
        for held in self.state.jobs.values():
            attempt, spec = held.live_attempt(), held.spec
            if attempt is not None and spec.elastic is not None:
                assert spec.elastic.min_replicas <= len(attempt.members) <= spec.replicas

    @rule()
    def scheduling_pass(self) -> None:
        plan = schedule(self.state, self.now)
        # Recalling answers per gang shape within the pass changes nothing in the plan.
        assert schedule(self.state, self.now, recall=False) == plan
        held = [w for w in plan.reasons.values() if w.code is ReasonCode.WAITING_MEMBER_CAP]
        self.saw_member_cap |= bool(held)
        command = plan.command(self.now)
        if command is not None:
            breaches = quota_breaches(self.state, command)
            breaches += member_cap_breaches(self.state, command)
            result = self.do(command)
            # A fresh plan on the current state is never stale.
            assert result.rejected == (), result.rejected
            assert not breaches, breaches
        # The leader proposes the pass's shrinks, then its preemptions, after its bind:
        # each is accepted.
        for shrink in plan.shrink_commands():
            result = self.do(shrink)
            assert result.ok, result.message
            event("a preemptor shrank an elastic gang")
        for preempt in plan.preempt_commands(self.now):
            protected = protected_victims(self.state, preempt, self.now)
            result = self.do(preempt)
            assert result.ok, result.message
            assert not protected, protected
            self.saw_preemption = True
            for victim in preempt.victims:
                attempt = self.state.jobs[victim.job_id].attempt
                assert attempt is not None and attempt.preempted_by == preempt.preemptor
                self.preempted[(victim.job_id, victim.fencing_token)] = {
                    m.rank: (m.node_id, set(m.gpus)) for m in attempt.members
                }

    @rule(
        name=st.sampled_from(["qa", "qb"]),
        gpu=st.sampled_from([None, 0, 4, 8, 16]),
        cohort=st.sampled_from(["", "c1", "c1", "c2"]),
        borrowing=st.sampled_from([None, 0, 4]),
        lending=st.sampled_from([None, 0, 4]),
        classes=st.sampled_from([(), ("high",), ("low", "normal")]),
        min_runtime=st.sampled_from([0, 0, 5_000, 70_000]),
    )
    def set_queue(
        self,
        name: str,
        gpu: int | None,
        cohort: str,
        borrowing: int | None,
        lending: int | None,
        classes: tuple[str, ...],
        min_runtime: int,
    ) -> None:
        queue = Queue(
            name,
            gpu=gpu,
            cohort=cohort,
            borrowing_limit_gpu=borrowing,
            lending_limit_gpu=lending,
            priority_classes=classes,
            min_runtime_ms=min_runtime,
        )
        self.do(c.SetQueue(queue, self.now, "user:root"))

    @rule(
        low=st.sampled_from([0, 1_000, 70_000]),
        normal=st.sampled_from([0, 5_000]),
        reclaim_wait=st.sampled_from([0, 5_000, 600_000]),
    )
    def min_runtimes(self, low: int, normal: int, reclaim_wait: int) -> None:
        """Minimum run times of the classes that can be victims, and the reclaim wait."""
        minimums = {"low": low, "normal": normal}
        classes = tuple(
            replace(p, min_runtime_ms=minimums.get(p.name, 0))
            for p in self.state.config.priority_classes
        )
        wanted = replace(
            self.state.config, priority_classes=classes, reclaim_wait_max_ms=reclaim_wait
        )
        result = self.do(c.Configure(wanted, self.now))
        needs_6 = low or normal or reclaim_wait != ClusterConfig().reclaim_wait_max_ms
        assert result.ok is (not needs_6 or self.state.format_floor >= 6), result.message

    @rule(
        name=st.sampled_from(["c1", "c2", "org"]),
        parent=st.sampled_from(["", "", "org", "c1"]),
        gpu=st.sampled_from([None, 0, 4]),
        borrowing=st.sampled_from([None, 0, 4]),
        lending=st.sampled_from([None, 0, 4]),
    )
    def set_cohort(
        self, name: str, parent: str, gpu: int | None, borrowing: int | None, lending: int | None
    ) -> None:
        """A cohort record of the cohort tree (format 7), valid or not."""
        cohort = Cohort(name, parent, gpu, borrowing, lending)
        result = self.do(c.SetCohort(cohort, self.now, "user:root"))
        if self.state.format_floor < 7:
            assert result.code is c.ResultCode.CONFLICT, result.message
        elif parent in (name, "") or parent in self.state.cohorts:
            self.saw_cohort_tree |= result.ok and bool(parent)

    @rule(name=st.sampled_from(["c1", "c2", "org"]))
    def delete_cohort(self, name: str) -> None:
        self.do(c.DeleteCohort(name, self.now, "user:root"))

    @rule(name=st.sampled_from(["qa", "qb"]))
    def delete_queue(self, name: str) -> None:
        self.do(c.DeleteQueue(name, self.now, "user:root"))

    @rule(mode=st.sampled_from(list(PreemptionMode)))
    def preemption_mode(self, mode: PreemptionMode) -> None:
        assert self.do(c.Configure(replace(self.state.config, preemption=mode), self.now)).ok

    @rule()
    def raise_format(self) -> None:
        assert self.do(c.RaiseFormat(FORMAT, ("r1", "r2", "r3"), self.now)).ok
        assert self.state.format_floor == FORMAT

    @rule(on=st.booleans())
    def hold_until_stopped(self, on: bool) -> None:
        wanted = replace(self.state.config, hold_until_stopped=on)
        result = self.do(c.Configure(wanted, self.now))
        needed = NEW_FIELDS[ClusterConfig]["hold_until_stopped"]
        allowed = not on or self.state.format_floor >= needed
        assert result.ok is allowed, result.message
        if on and allowed:
            self.saw_hold = True

    @rule(
        data=st.data(),
        exit_code=st.sampled_from([None, 0, 0, 1, 137]),
        seed=st.integers(0, 9),
        cause=st.sampled_from(list(c.ExitCause)),
    )
    @precondition(lambda self: any(j.state.holds_resources for j in self.state.jobs.values()))
    def report(
        self, data: st.DataObject, exit_code: int | None, seed: int, cause: c.ExitCause
    ) -> None:
        live = sorted(j.job_id for j in self.state.jobs.values() if j.state.holds_resources)
        job_id = data.draw(st.sampled_from(live))
        attempt = self.state.jobs[job_id].attempt
        assert attempt is not None
        member = data.draw(st.sampled_from(attempt.members))
        stale = data.draw(st.booleans())
        token = attempt.fencing_token - (1 if stale else 0)
        if exit_code is None:
            event = c.MemberEvent(job_id, token, member.rank, c.MemberEventKind.STARTED)
        else:
            event = c.MemberEvent(
                job_id, token, member.rank, c.MemberEventKind.EXITED, exit_code, "", cause
            )
        self.do(c.ReportMembers(member.node_id, (event,), seed, self.now))

    @rule(
        data=st.data(),
        step=st.one_of(st.none(), st.integers(0, 50)),
        seq=st.integers(1, 4),
    )
    @precondition(lambda self: any(j.attempt is not None for j in self.state.jobs.values()))
    def mark(self, data: st.DataObject, step: int | None, seq: int) -> None:
        """A member marks a checkpoint (reported at least once, maybe stale or late)."""
        bound = sorted(j.job_id for j in self.state.jobs.values() if j.attempt is not None)
        job = self.state.jobs[data.draw(st.sampled_from(bound))]
        attempt = job.attempt
        assert attempt is not None
        if self.state.format_floor < FORMAT and data.draw(st.booleans()):
            self.raise_format()  # marks are refused until every replica reads them
        whole_gang = data.draw(st.booleans())
        members = attempt.members if whole_gang else [data.draw(st.sampled_from(attempt.members))]
        token = attempt.fencing_token - data.draw(st.sampled_from([0, 0, 1]))
        for member in members:
            kind = c.MemberEventKind.CHECKPOINT
            event = c.MemberEvent(job.job_id, token, member.rank, kind, step=step, mark_seq=seq)
            result = self.do(c.ReportMembers(member.node_id, (event,), 0, self.now))
            assert result.ok is (self.state.format_floor >= 5), result.message
            if result.ok and step is not None:
                self.marked_steps.setdefault(job.job_id, set()).add(step)
        if attempt.mark() is not None:
            self.saw_gang_mark = True

    @invariant()
    def jobs_resume_only_from_a_marked_step(self) -> None:
        for job_id, j in self.state.jobs.items():
            if j.resume_step is not None:
                assert j.resume_step in self.marked_steps.get(job_id, set())
            attempt = j.attempt
            if attempt is not None and attempt.ended_at_ms is None and j.resume_step is not None:
                assert all(
                    d.resume_step == j.resume_step
                    for d in desired_by_node(self.state).get(attempt.members[0].node_id, [])
                    if d.job_id == job_id
                )

    @rule(data=st.data(), cause=st.sampled_from([c.ExitCause.FENCED, c.ExitCause.LOST]))
    @precondition(lambda self: any(j.state.holds_resources for j in self.state.jobs.values()))
    def disrupt(self, data: st.DataObject, cause: c.ExitCause) -> None:
        """A worker reports a member it killed (fenced or lost): the gang requeues."""
        live = sorted(j.job_id for j in self.state.jobs.values() if j.state.holds_resources)
        job_id = data.draw(st.sampled_from(live))
        attempt = self.state.jobs[job_id].attempt
        assert attempt is not None
        # A member that already exited cannot be killed again; a live attempt always
        # has one that has not.
        running = [
            m
            for m, s in zip(attempt.members, attempt.member_status, strict=True)
            if s.state is not MemberState.EXITED
        ]
        member = data.draw(st.sampled_from(running))
        event = c.MemberEvent(
            job_id, attempt.fencing_token, member.rank, c.MemberEventKind.EXITED, 137, "", cause
        )
        preempting = bool(attempt.preempted_by)
        self.do(c.ReportMembers(member.node_id, (event,), 0, self.now))
        # A gang being preempted ends as its preemption says (once every member stopped
        # or its grace ran out); any other gang requeues at once.
        if not preempting:
            assert not self.state.jobs[job_id].state.holds_resources

    @rule(data=st.data())
    @precondition(lambda self: any(unconfirmed_members(j) for j in self.state.jobs.values()))
    def confirm_stopped(self, data: st.DataObject) -> None:
        """A worker reports a member of an ended attempt stopped (so it may bind again)."""
        waiting = sorted(j.job_id for j in self.state.jobs.values() if unconfirmed_members(j))
        job_id = data.draw(st.sampled_from(waiting))
        attempt = self.state.jobs[job_id].attempt
        assert attempt is not None
        rank = data.draw(st.sampled_from(unconfirmed_members(self.state.jobs[job_id])))
        event = c.MemberEvent(job_id, attempt.fencing_token, rank, c.MemberEventKind.EXITED, 143)
        result = self.do(c.ReportMembers(attempt.members[rank].node_id, (event,), 0, self.now))
        assert result.accepted_events == 1

    @rule(data=st.data(), seed=st.integers(0, 9))
    @precondition(lambda self: any(j.state.holds_resources for j in self.state.jobs.values()))
    def node_dies_before_exits_commit(self, data: st.DataObject, seed: int) -> None:
        """A node of a live gang is declared dead; then some of that attempt's members
        report their exits late (as a worker does after registering again)."""
        live = sorted(j.job_id for j in self.state.jobs.values() if j.state.holds_resources)
        job = self.state.jobs[data.draw(st.sampled_from(live))]
        attempt = job.attempt
        assert attempt is not None
        node_id = data.draw(st.sampled_from(sorted({m.node_id for m in attempt.members})))
        if not self.do(c.MarkNodeDead(node_id, "silent", seed, self.now)).ok:
            return
        forget_node(self.preempted, node_id)
        for _ in range(data.draw(st.integers(0, len(attempt.members)))):
            # Read afresh: a command may replace a record (copy-on-write, SnapshotMachine).
            if self.state.jobs[job.job_id].lost_attempt is None:
                break
            self.late_report(
                data,
                data.draw(st.sampled_from([0, 0, 0, 1])),
                data.draw(st.sampled_from([c.ExitCause.PROGRAM] * 3 + [c.ExitCause.FENCED])),
            )

    @rule(
        data=st.data(),
        exit_code=st.sampled_from([0, 0, 0, 1]),
        cause=st.sampled_from([c.ExitCause.PROGRAM, c.ExitCause.PROGRAM, c.ExitCause.FENCED]),
    )
    @precondition(lambda self: any(j.lost_attempt for j in self.state.jobs.values()))
    def late_report(self, data: st.DataObject, exit_code: int, cause: c.ExitCause) -> None:
        """A member of an attempt ended by its node's death reports its exit late: all
        ranks exiting 0 by their own program end the job SUCCEEDED, anything else keeps
        the requeue."""
        lost_jobs = sorted(j.job_id for j in self.state.jobs.values() if j.lost_attempt)
        job = self.state.jobs[data.draw(st.sampled_from(lost_jobs))]
        lost = job.lost_attempt
        assert lost is not None
        rank = data.draw(st.integers(0, len(lost.nodes) - 1))
        late = c.MemberEvent(
            job.job_id, lost.fencing_token, rank, c.MemberEventKind.EXITED, exit_code, "", cause
        )
        self.do(c.ReportMembers(lost.nodes[rank], (late,), 0, self.now))
        job = self.state.jobs[job.job_id]  # afresh: the command may have replaced it
        success = exit_code == 0 and cause is c.ExitCause.PROGRAM
        completes = success and set(lost.exited_zero) | {rank} == set(range(len(lost.nodes)))
        assert (job.state is JobState.SUCCEEDED) == completes
        event("late report completes a lost attempt" if completes else "late report")
        if not success:
            assert job.lost_attempt is None

    @rule(max_requeues=st.integers(0, 3), start_timeout_s=st.sampled_from([1, 5, 60]))
    def configure(self, max_requeues: int, start_timeout_s: int) -> None:
        config = replace(
            self.state.config, max_requeues=max_requeues, start_timeout_ms=start_timeout_s * 1000
        )
        assert self.do(c.Configure(config, self.now)).ok

    @rule()
    def start_timeouts(self) -> None:
        for command in due_start_timeouts(self.state, self.now):
            assert self.do(command).ok

    @rule(node_id=st.sampled_from(NODE_IDS), seed=st.integers(0, 9))
    def mark_dead(self, node_id: str, seed: int) -> None:
        if self.do(c.MarkNodeDead(node_id, "silent", seed, self.now)).ok:
            forget_node(self.preempted, node_id)

    @rule(
        node_id=st.sampled_from(NODE_IDS),
        status=st.sampled_from([NodeStatus.READY, NodeStatus.CORDONED, NodeStatus.DRAINING]),
    )
    def set_status(self, node_id: str, status: NodeStatus) -> None:
        self.do(c.SetNodeStatus(node_id, status, "", self.now))

    @rule(which=st.integers(0, 40))
    def cancel(self, which: int) -> None:
        self.do(c.CancelJob(f"job-{which:06d}", "user", self.now))

    @rule(ms=st.sampled_from([1, 1_000, 5_000, 70_000]))
    def advance(self, ms: int) -> None:
        self.now += ms

    @rule()
    def expire(self) -> None:
        for command in due_time_limits(self.state, self.now):
            assert self.do(command).ok

    @rule()
    def purge(self) -> None:
        self.do(c.PurgeFinished(self.now))

    @rule(which=st.integers(0, 3), ttl=st.sampled_from([0, 1_000, 60_000]))
    def create_token(self, which: int, ttl: int) -> None:
        token_id = f"{which:012x}"
        result = self.do(
            c.CreateToken(
                token_id,
                f"user{which}",
                Role.USER,
                f"{which:064x}",
                expires_at_ms=self.now + ttl if ttl else 0,
                now_ms=self.now,
                actor="user:root",
            )
        )
        assert result.ok is (token_id not in self.created_tokens)
        self.created_tokens.add(token_id)

    @rule(which=st.integers(0, 3))
    def revoke_token(self, which: int) -> None:
        token_id = f"{which:012x}"
        result = self.do(c.RevokeToken(token_id, self.now, "user:root"))
        assert result.ok is (token_id in self.created_tokens)
        if result.ok:
            assert self.state.tokens[token_id].revoked_at_ms > 0

    @invariant()
    def invariants_hold(self) -> None:
        problems = invariants.check(self.state)
        assert not problems, problems

    @invariant()
    def no_job_placed_before_its_dependencies_were_met(self) -> None:
        for j in self.state.jobs.values():
            if j.attempt is None or j.spec.dependencies is None:
                continue
            for kind, other_id in j.spec.dependencies.pairs():
                other = self.state.jobs.get(other_id)
                if other is None or kind == "after":  # purged; or met once, for good
                    continue
                assert other.state.finished, (j.job_id, kind, other_id, other.state)
                ok = other.state is JobState.SUCCEEDED
                assert ok if kind == "afterok" else (kind == "afterany" or not ok)

    @invariant()
    def held_ranks_seen(self) -> None:
        if any(j.attempt is not None and j.attempt.held for j in self.state.jobs.values()):
            self.saw_held_ranks = True

    @invariant()
    def preempted_keep_their_gpus(self) -> None:
        check_preempted(self.state, self.preempted)

    @invariant()
    def tokens_only_grow(self) -> None:
        assert self.state.last_fencing_token >= self.last_token
        self.last_token = self.state.last_fencing_token
        for job_id, j in self.state.jobs.items():
            assert j.fencing_token >= self.tokens.get(job_id, 0)
            self.tokens[job_id] = j.fencing_token
            if j.state is JobState.RUNNING:
                assert j.attempt is not None and j.attempt.started_at_ms is not None
            if j.state is JobState.FAILED and j.reason.code is ReasonCode.FAILED_MAX_REQUEUES:
                why = j.reason
                assert j.requeues == why.num("requeues") >= why.num("max_requeues")
                self.saw_max_requeues = True
            if j.requeues:
                self.saw_requeue = True

    def teardown(self) -> None:
        if self.saw_gang_mark:
            event("a whole gang marked a checkpoint")
        if self.saw_requeue:
            event("a job was requeued")
        if self.saw_max_requeues:
            event("a job failed at max_requeues")
        if self.saw_preemption:
            event("a gang was preempted")
        if self.saw_hold:
            event("ended attempts held their resources until confirmed stopped")
        if self.saw_held_ranks:
            event("an ended attempt held ranks")
        if self.saw_dependency_wait:
            event("a job waited for a dependency")
        if self.saw_cohort_tree:
            event("a cohort had a parent")
        if self.saw_member_cap:
            event("a gang waited at a member cap")
        replayed = ClusterState()
        for data in self.log:
            apply(replayed, decode_command(data))
        encoded = encode_state(self.state)
        assert encode_state(replayed) == encoded
        assert decode_state(encoded) == self.state
        # The compact (positional) layout holds the same state.
        compact = replace(self.state, config=replace(self.state.config, compact_state=True))
        compact_encoded = encode_state(compact)
        assert decode_state(compact_encoded) == compact
        # The compiled decoders alone decode both layouts whole (no value was left to the
        # generic path), and build what the constructors build.
        for state, data in ((self.state, encoded), (compact, compact_encoded)):
            built = from_plain_compiled(ClusterState, json.loads(data)["state"])
            assert built == state
            assert_built_as_by_constructors(built)
        assert len(compact_encoded) < len(encoded)


ClusterMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestClusterMachine = ClusterMachine.TestCase


class PreemptionMachine(DependentSubmissions):
    """Queues, classes and preemption, concentrated: a fixed set of ready nodes in two
    racks, queues qa and qb in one cohort, gangs of every class, passes with preemption
    on, stop confirmations and node deaths. The invariants of :class:`ClusterMachine`
    hold after every command, plus: quotas are respected at every bind, every Preempt a
    fresh plan proposes is accepted, a preempted attempt keeps its GPUs until each
    member is confirmed stopped, and replay gives byte-identical state."""

    def __init__(self) -> None:
        super().__init__()
        self.state = ClusterState()
        self.log: list[bytes] = []
        self.now = 0
        self.preempted: dict[tuple[str, int], dict[int, tuple[str, set[int]]]] = {}
        self.saw_preemption = False
        self.saw_requeue = False
        self.saw_cousin_reclaim = False

    def do(self, command: c.Command) -> c.Result:
        data = encode_command(command)
        self.log.append(data)
        result = apply(self.state, decode_command(data))
        assert result.code is not c.ResultCode.INTERNAL, result.message
        return result

    @initialize(
        quotas=st.lists(st.sampled_from([4, 8, 16]), min_size=2, max_size=2),
        borrowing=st.sampled_from([None, 0, 4]),
        mode=st.sampled_from([PreemptionMode.TOPOLOGY, PreemptionMode.BLIND]),
        low_min=st.sampled_from([0, 0, 30_000, 120_000]),
        reclaim_wait=st.sampled_from([0, 60_000, 600_000]),
        tree=st.booleans(),
    )
    def cluster(
        self,
        quotas: list[int],
        borrowing: int | None,
        mode: PreemptionMode,
        low_min: int,
        reclaim_wait: int,
        tree: bool,
    ) -> None:
        assert self.do(c.RaiseFormat(FORMAT, ("r1", "r2", "r3"), self.now)).ok
        for i in range(4):
            info = node(NODE_IDS[i], gpus=8, cpu=64, rack=f"r{i // 2}")
            self.do(c.RegisterNode(info, self.now))
        for name, gpu in zip(["qa", "qb"], quotas, strict=True):
            limit = None if tree else borrowing  # with the tree, c1's own limits bind
            queue = Queue(name, gpu=gpu, cohort="c1", borrowing_limit_gpu=limit)
            assert self.do(c.SetQueue(queue, self.now)).ok
        if tree:  # org -> c1 (qa, qb), c2 (qc): a cohort tree two levels deep
            for record in (Cohort("org"), Cohort("c1", "org"), Cohort("c2", "org")):
                assert self.do(c.SetCohort(record, self.now)).ok
            assert self.do(c.SetQueue(Queue("qc", gpu=8, cohort="c2"), self.now)).ok
        classes = tuple(
            replace(p, min_runtime_ms=low_min) if p.name == "low" else p
            for p in self.state.config.priority_classes
        )
        wanted = replace(
            self.state.config,
            preemption=mode,
            priority_classes=classes,
            reclaim_wait_max_ms=reclaim_wait,
        )
        assert self.do(c.Configure(wanted, self.now)).ok
        # Low-priority gangs fill most of the cluster, so later gangs need victims; with
        # the tree, c1's queues borrow c2's idle GPUs through org (a cousin's to reclaim).
        fill = [("default", 8, 2), ("qa", 4, 1), ("qb", 2, 2), ("qa", 2, 1)]
        if tree:
            fill = [*fill[1:], ("qa", 8, 1), ("qb", 4, 1)]
        for i, (queue, gpu, replicas) in enumerate(fill):
            spec = job(replicas=replicas, gpu=gpu, queue=queue, priority_class="low")
            assert self.do(c.SubmitJob(spec, f"fill-{i}", self.now)).ok
        self.scheduling_pass()

    @rule(
        queue=st.sampled_from(["default", "qa", "qb", "qa", "qb", "qc"]),
        priority_class=st.sampled_from(["", "low", "normal", "high", "high"]),
        gpu=st.sampled_from([1, 2, 4, 8, 8]),
        replicas=st.integers(1, 4),
        required=st.sampled_from(["", "", "rack", "host"]),
        time_limit=st.sampled_from([0, 60]),
        request=st.integers(0, 30),
    )
    def submit(
        self,
        queue: str,
        priority_class: str,
        gpu: int,
        replicas: int,
        required: str,
        time_limit: int,
        request: int,
    ) -> None:
        spec = job(
            replicas=replicas,
            gpu=gpu,
            queue=queue,
            priority_class=priority_class,
            required=required,
            time_limit_s=time_limit,
        )
        self.do(c.SubmitJob(spec, f"req-{request}", self.now))

    @rule()
    def scheduling_pass(self) -> None:
        plan = schedule(self.state, self.now)
        # Recalling answers per gang shape within the pass changes nothing in the plan.
        assert schedule(self.state, self.now, recall=False) == plan
        held = [w for w in plan.reasons.values() if w.code is ReasonCode.WAITING_MEMBER_CAP]
        self.saw_member_cap |= bool(held)
        command = plan.command(self.now)
        if command is not None:
            breaches = quota_breaches(self.state, command)
            breaches += member_cap_breaches(self.state, command)
            result = self.do(command)
            assert result.rejected == (), result.rejected
            assert not breaches, breaches
        for preempt in plan.preempt_commands(self.now):
            protected = protected_victims(self.state, preempt, self.now)
            result = self.do(preempt)
            assert result.ok, result.message
            assert not protected, protected
            self.saw_preemption = True
            mine = self.state.queues[self.state.jobs[preempt.preemptor].spec.queue].cohort
            for victim in preempt.victims:
                theirs = self.state.queues[self.state.jobs[victim.job_id].spec.queue].cohort
                self.saw_cousin_reclaim |= theirs != mine
                attempt = self.state.jobs[victim.job_id].attempt
                assert attempt is not None and attempt.preempted_by == preempt.preemptor
                self.preempted[(victim.job_id, victim.fencing_token)] = {
                    m.rank: (m.node_id, set(m.gpus)) for m in attempt.members
                }

    @rule(gpu=st.sampled_from([2, 4, 8]), request=st.integers(0, 30))
    @precondition(lambda self: "qc" in self.state.queues)
    def submit_to_c2(self, gpu: int, request: int) -> None:
        """A gang of c2 within its nominal: it may reclaim what c1 borrows through org."""
        spec = job(gpu=gpu, queue="qc", priority_class="normal")
        self.do(c.SubmitJob(spec, f"c2-{request}", self.now))

    @rule(data=st.data(), code=st.sampled_from([0, 1, 143]))
    @precondition(lambda self: any(j.live_attempt() for j in self.state.jobs.values()))
    def member_exits(self, data: st.DataObject, code: int) -> None:
        """A member of a live attempt exits (a preempted one: a stop confirmation)."""
        live = sorted(j.job_id for j in self.state.jobs.values() if j.live_attempt())
        job_id = data.draw(st.sampled_from(live))
        attempt = self.state.jobs[job_id].attempt
        assert attempt is not None
        running = [
            m
            for m, s in zip(attempt.members, attempt.member_status, strict=True)
            if s.state is not MemberState.EXITED
        ]
        if not running:
            return
        member = data.draw(st.sampled_from(running))
        event = c.MemberEvent(
            job_id, attempt.fencing_token, member.rank, c.MemberEventKind.EXITED, code
        )
        self.do(c.ReportMembers(member.node_id, (event,), 0, self.now))

    @rule(data=st.data())
    @precondition(lambda self: any(unconfirmed_members(j) for j in self.state.jobs.values()))
    def confirm_stopped(self, data: st.DataObject) -> None:
        waiting = sorted(j.job_id for j in self.state.jobs.values() if unconfirmed_members(j))
        job_id = data.draw(st.sampled_from(waiting))
        attempt = self.state.jobs[job_id].attempt
        assert attempt is not None
        rank = data.draw(st.sampled_from(unconfirmed_members(self.state.jobs[job_id])))
        event = c.MemberEvent(job_id, attempt.fencing_token, rank, c.MemberEventKind.EXITED, 143)
        self.do(c.ReportMembers(attempt.members[rank].node_id, (event,), 0, self.now))

    @rule(node_id=st.sampled_from(NODE_IDS[:4]))
    def node_dies_and_returns(self, node_id: str) -> None:
        if self.do(c.MarkNodeDead(node_id, "silent", 0, self.now)).ok:
            forget_node(self.preempted, node_id)
        info = node(node_id, gpus=8, cpu=64, rack=f"r{NODE_IDS.index(node_id) // 2}")
        self.do(c.RegisterNode(info, self.now))

    @rule(which=st.integers(1, 30))
    def cancel(self, which: int) -> None:
        self.do(c.CancelJob(f"job-{which:06d}", "user", self.now))

    @rule(ms=st.sampled_from([1_000, 30_000, 70_000]))
    def advance(self, ms: int) -> None:
        self.now += ms
        for command in due_time_limits(self.state, self.now):
            assert self.do(command).ok

    @rule(
        name=st.sampled_from(["qa", "qb"]),
        gpu=st.sampled_from([0, 4, 8, 16]),
        lending=st.sampled_from([None, 0, 4]),
    )
    def set_queue(self, name: str, gpu: int, lending: int | None) -> None:
        self.do(c.SetQueue(Queue(name, gpu=gpu, cohort="c1", lending_limit_gpu=lending)))

    @rule(
        name=st.sampled_from(["c1", "c2"]),
        gpu=st.sampled_from([None, 0, 4]),
        borrowing=st.sampled_from([None, 0, 2, 8]),
        lending=st.sampled_from([None, 0, 4]),
    )
    @precondition(lambda self: "org" in self.state.cohorts)
    def set_cohort(
        self, name: str, gpu: int | None, borrowing: int | None, lending: int | None
    ) -> None:
        """Limits at the middle level of the tree change (as an admin may at any time)."""
        assert self.do(c.SetCohort(Cohort(name, "org", gpu, borrowing, lending))).ok

    @invariant()
    def invariants_hold(self) -> None:
        problems = invariants.check(self.state)
        assert not problems, problems
        if any(j.requeues for j in self.state.jobs.values()):
            self.saw_requeue = True

    @invariant()
    def preempted_keep_their_gpus(self) -> None:
        check_preempted(self.state, self.preempted)

    def teardown(self) -> None:
        if self.saw_preemption:
            event("a gang was preempted")
        if self.saw_requeue:
            event("a job was requeued")
        if self.saw_cousin_reclaim:
            event("a reclaim took a gang of another cohort of the tree")
        if self.saw_member_cap:
            event("a gang waited at a member cap")
        replayed = ClusterState()
        for data in self.log:
            apply(replayed, decode_command(data))
        assert encode_state(replayed) == encode_state(self.state)


PreemptionMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestPreemptionMachine = PreemptionMachine.TestCase
