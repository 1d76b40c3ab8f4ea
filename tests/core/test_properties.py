"""Property tests: random command sequences keep every invariant after every apply, and
replaying the same commands from empty state gives byte-identical state."""

from __future__ import annotations

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
from synapse_ha.core.access import Role
from synapse_ha.core.codec import decode_command, decode_state, encode_command, encode_state
from synapse_ha.core.machine import apply
from synapse_ha.core.model import (
    ClusterState,
    JobState,
    MemberState,
    NodeStatus,
    unconfirmed_members,
)
from synapse_ha.core.reasons import ReasonCode
from synapse_ha.core.scheduler import schedule
from synapse_ha.core.views import due_start_timeouts, due_time_limits
from tests.core.harness import job, node

NODE_IDS = [f"n{i}" for i in range(6)]


class ClusterMachine(RuleBasedStateMachine):
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
        )
        self.do(c.SubmitJob(spec, f"req-{request}", self.now))

    @rule()
    def scheduling_pass(self) -> None:
        plan = schedule(self.state, self.now)
        command = plan.command(self.now)
        if command is not None:
            result = self.do(command)
            # A fresh plan on the current state is never stale.
            assert result.rejected == (), result.rejected

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
        self.do(c.ReportMembers(member.node_id, (event,), 0, self.now))
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
        self.do(c.MarkNodeDead(node_id, "silent", seed, self.now))

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
        if self.saw_requeue:
            event("a job was requeued")
        if self.saw_max_requeues:
            event("a job failed at max_requeues")
        replayed = ClusterState()
        for data in self.log:
            apply(replayed, decode_command(data))
        encoded = encode_state(self.state)
        assert encode_state(replayed) == encoded
        assert decode_state(encoded) == self.state


ClusterMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestClusterMachine = ClusterMachine.TestCase
