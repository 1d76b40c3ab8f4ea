"""Slow nodes end to end in process: three members write their pace to their progress
files, their workers' heartbeats carry it (the worker's reading and conversion) to the
real servicers of a replica, its leader loop weighs the gang's windows and marks the
slow member's node degraded at its third; ListNodes (synctl nodes) shows the condition."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.desired import MemberKey
from synapse_ha.core.health.slowness import DEGRADED, PaceReport
from synapse_ha.core.identity import access
from synapse_ha.core.machine import apply
from synapse_ha.core.model import NodeStatus
from synapse_ha.core.replacement import ReplacePolicy
from synapse_ha.core.scheduler import schedule
from synapse_ha.leader.liveness import Liveness
from synapse_ha.leader.loop import LeaderLoop, LoopSettings
from synapse_ha.leader.slow_nodes import SlowNodes, SlowNodeSettings
from synapse_ha.rpc import to_proto
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.worker.pace import PaceWatches
from tests.core.harness import job, node
from tests.rpc.authed import PEER_KEY, Replica, serving_replica
from tests.rpc.stream_client import Client, connect
from tests.rpc.test_relay import relaying

WINDOW_MS = 2_000
NODES = ("p1", "p2", "p3")


class Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def _running_gang(replica: Replica) -> str:
    """A gang of three with ``replace:``, one member on each of p1..p3, running."""
    backend = replica.backend
    with backend.lock:
        state = backend.state
        assert apply(state, cmd.RaiseFormat(FORMAT)).ok
        for n in NODES:
            assert apply(state, cmd.RegisterNode(node(n, gpus=8, rack="r1"), 1)).ok
        spec = dataclasses.replace(
            job("paced", replicas=3, gpu=8, required="rack"), replace=ReplacePolicy(600_000)
        )
        job_id = apply(state, cmd.SubmitJob(spec, "req-paced", 2)).job_id
        plan = schedule(state, 3)
        assert apply(state, cmd.BindPlan(plan.placements, plan.reasons, 3)).ok
        attempt = state.jobs[job_id].attempt
        assert attempt is not None
        assert sorted(m.node_id for m in attempt.members) == list(NODES)
        for m in attempt.members:
            started = cmd.MemberEvent(
                job_id, attempt.fencing_token, m.rank, cmd.MemberEventKind.STARTED
            )
            assert apply(state, cmd.ReportMembers(m.node_id, (started,), 1, 4)).ok
    return job_id


def _heartbeat(replica: Replica, node_id: str, watches: PaceWatches, key: MemberKey) -> None:
    """What the node's agent sends: its running member and that member's pace."""
    running = [
        cmd.MemberEvent(key.job_id, key.fencing_token, key.rank, cmd.MemberEventKind.STARTED)
    ]
    request = to_proto.heartbeat_to_proto(node_id, [], running, [], [], watches.poll([key]))
    peer = [(PEER_KEY, access.worker(node_id).spiffe_id)]
    replica.agent.Heartbeat(request, metadata=peer)


def test_a_slow_member_gets_its_node_marked_degraded_after_three_windows(tmp_path: Path) -> None:
    with serving_replica() as replica:
        job_id = _running_gang(replica)
        attempt = replica.backend.state.jobs[job_id].attempt
        assert attempt is not None
        slow = SlowNodes(SlowNodeSettings(window_ms=WINDOW_MS))
        replica.ctx.paces = slow
        liveness = replica.ctx.liveness
        assert isinstance(liveness, Liveness)
        loop = LeaderLoop(
            replica.backend,
            replica.backend,
            liveness,
            "r1",
            settings=LoopSettings(),
            rng=random.Random(3),
            slow_nodes=slow,
        )
        now = replica.clock[0]
        loop.on_role_change(True, 2, now)
        loop.step(now)
        loop.step(now)  # the barrier commits
        assert loop.ready
        clock = Clock()
        agents = {}  # node -> (its PaceWatches, the member's key, the member's file)
        for m in attempt.members:
            path = tmp_path / f"progress-{m.rank}"
            path.touch()
            watches = PaceWatches(clock, window_s=WINDOW_MS / 1000)
            key = MemberKey(job_id, attempt.fencing_token, m.rank, m.generation)
            watches.watch(key, path)
            agents[m.node_id] = (watches, key, path)
        slow_rank = 1
        slow_node = attempt.members[slow_rank].node_id
        windows_before_mark = 0
        step = 0
        while not slow.marked and windows_before_mark < 8:
            for node_id, (watches, key, path) in agents.items():
                step_ms = 1_000.0 if key.rank == slow_rank else 800.0
                with path.open("a") as f:
                    f.write(f'{{"step": {step}, "step_ms": {step_ms}}}\n')
                _heartbeat(replica, node_id, watches, key)
            step += 1
            if step % 4 == 0:  # four heartbeats per window
                now += WINDOW_MS
                clock.now += WINDOW_MS / 1000
                replica.clock[0] = now
                loop.step(now)
                windows_before_mark += 1
        # The first step opens the gang's clock; windows 0, 1 and 2 are its three strikes.
        assert slow.marked == (slow_node,)
        assert windows_before_mark == 4
        nodes = replica.scheduler.ListNodes(
            pb.ListNodesRequest(),
            metadata=[("authorization", f"Bearer {replica.tokens['operator']}")],
        ).nodes
        shown = next(n for n in nodes if n.node_id == slow_node)
        (condition,) = shown.conditions
        assert condition.name == DEGRADED
        assert condition.message.startswith(f"node {slow_node}: 25% slower than the median")
        assert f"{job_id} window 0 (rank 1, 25%)" in condition.message
        state = replica.backend.state
        assert state.nodes[slow_node].status is NodeStatus.CORDONED
        assert [v.rank for v in state.jobs[job_id].attempt.vacancies] == [slow_rank]  # type: ignore[union-attr]
        others = [n for n in NODES if n != slow_node]
        assert all(state.nodes[n].conditions == () for n in others)


def test_paces_reach_the_leaders_collector_through_a_relaying_follower(
    clients: list[Client],
) -> None:
    with relaying() as pair:
        slow = SlowNodes()
        pair.leader.ctx.paces = slow
        c = connect(pair.streams, "n1", clients)
        pace = pb.MemberPace(
            job_id="job-000001", fencing_token=4, rank=0, step_us=812_500, steps=9, peers="s1"
        )
        beat = pb.Heartbeat(node_id="n1", paces=[pace])
        c.outbox.put(pb.WorkerMessage(seq=1, node_id="n1", heartbeat=beat))
        assert c.receive().ack_seq == 1
        (heard,) = slow.newest("job-000001")
        assert heard.node_id == "n1"
        assert heard.report == PaceReport("job-000001", 4, 0, 812_500, 9, "s1")
