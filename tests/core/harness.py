"""A scheduler harness: small builders and a cluster that applies commands with checks.

No network, no clock: time is an integer the test advances.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field

from synapse_ha.core import commands as c
from synapse_ha.core import invariants
from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, JobSpec, JobState, NodeInfo, Resources, RetryPolicy
from synapse_ha.core.scheduler import Plan, schedule

_ids = itertools.count(1)


def node_address(node_id: str) -> str:
    """A made-up address that depends on ``node_id`` only: a stable digest, not
    ``hash()``, whose value for a string changes with PYTHONHASHSEED."""
    digest = hashlib.sha256(node_id.encode()).digest()
    return f"10.0.0.{int.from_bytes(digest[:4], 'big') % 250 + 1}"


def node(
    name: str | None = None,
    *,
    gpus: int = 8,
    cpu: int = 64,
    memory_gib: int = 512,
    zone: str = "z1",
    block: str = "b1",
    rack: str = "r1",
    islands: tuple[tuple[int, ...], ...] = (),
    features: tuple[str, ...] = (),
) -> NodeInfo:
    node_id = name or f"n{next(_ids)}"
    return NodeInfo(
        node_id=node_id,
        address=node_address(node_id),
        capacity=Resources(cpu * 1000, memory_gib * 1024, gpus),
        gpu_islands=islands,
        topology=(("block", block), ("rack", rack), ("zone", zone)),
        features=features,
    )


def job(
    name: str = "train",
    *,
    replicas: int = 1,
    gpu: int = 0,
    cpu: float = 1,
    memory_gib: int = 1,
    priority: int = 0,
    required: str = "",
    preferred: str = "",
    time_limit_s: int = 0,
    retries: int = 0,
    backoff_s: int = 10,
    image: str = "",
    queue: str = "default",
    priority_class: str = "",
    wait_for_nodes: bool = False,
) -> JobSpec:
    return JobSpec(
        name=name,
        replicas=replicas,
        resources=Resources(int(cpu * 1000), memory_gib * 1024, gpu),
        command=("echo $RANK",),
        priority=priority,
        topology_required=required,
        topology_preferred=preferred,
        time_limit_ms=time_limit_s * 1000,
        retries=RetryPolicy(max_retries=retries, backoff_ms=backoff_s * 1000),
        image=image,
        queue=queue,
        priority_class=priority_class,
        wait_for_nodes=wait_for_nodes,
    )


@dataclass
class Cluster:
    """Applies commands, checking every invariant after each one."""

    state: ClusterState = field(default_factory=ClusterState)
    now: int = 1_000
    log: list[c.Command] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Every replica of a test cluster runs this release: it reads the newest format.
        if self.state.format_floor < FORMAT:
            self.do(c.RaiseFormat(FORMAT))
        if self.state.config != ClusterConfig():
            self.do(c.Configure(self.state.config))

    def do(self, command: c.Command) -> c.Result:
        result = apply(self.state, command)
        self.log.append(command)
        problems = invariants.check(self.state)
        assert not problems, problems
        assert result.code is not c.ResultCode.INTERNAL, result.message
        return result

    def add(self, *infos: NodeInfo) -> None:
        for info in infos:
            assert self.do(c.RegisterNode(info, self.now)).ok

    def submit(self, spec: JobSpec) -> str:
        result = self.do(c.SubmitJob(spec, f"req-{next(_ids)}", self.now))
        assert result.ok, result.message
        return result.job_id

    def plan(self) -> Plan:
        return schedule(self.state, self.now)

    def run_pass(self) -> Plan:
        """One scheduling pass, bound through apply like the leader does."""
        plan = self.plan()
        command = plan.command(self.now)
        if command is not None:
            result = self.do(command)
            assert not result.rejected, result.rejected
        return plan

    def start_all(self, job_id: str) -> None:
        attempt = self.state.jobs[job_id].attempt
        assert attempt is not None
        for m in attempt.members:
            event = c.MemberEvent(job_id, attempt.fencing_token, m.rank, c.MemberEventKind.STARTED)
            self.do(c.ReportMembers(m.node_id, (event,), now_ms=self.now))

    def exit_member(self, job_id: str, rank: int, code: int, seed: int = 7) -> c.Result:
        attempt = self.state.jobs[job_id].attempt
        assert attempt is not None
        node_id = attempt.members[rank].node_id
        event = c.MemberEvent(
            job_id, attempt.fencing_token, rank, c.MemberEventKind.EXITED, exit_code=code
        )
        return self.do(c.ReportMembers(node_id, (event,), jitter_seed=seed, now_ms=self.now))

    def state_of(self, job_id: str) -> JobState:
        return self.state.jobs[job_id].state

    def nodes_of(self, job_id: str) -> list[str]:
        attempt = self.state.jobs[job_id].attempt
        assert attempt is not None
        return [m.node_id for m in attempt.members]

    def racks_of(self, job_id: str) -> set[str]:
        return {dict(self.state.nodes[n].info.topology)["rack"] for n in self.nodes_of(job_id)}
