"""A narrated scheduling demonstration on the deterministic core (no processes).

Run with ``make demo``. It builds a small two-rack cluster in memory, submits gangs and
shows each decision the real state machine and scheduler make.
"""

from __future__ import annotations

from synapse_ha.core import commands as c
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, JobSpec, NodeInfo, Resources
from synapse_ha.core.scheduler import explain, schedule


def _node(name: str, rack: str) -> NodeInfo:
    return NodeInfo(
        node_id=name,
        address=f"{name}.local",
        capacity=Resources(64_000, 512 * 1024, 8),
        gpu_islands=((0, 1, 2, 3), (4, 5, 6, 7)),
        topology=(("block", "b1"), ("rack", rack), ("zone", "z1")),
    )


def _spec(name: str, replicas: int, gpu: int, **extra: object) -> JobSpec:
    return JobSpec(
        name=name,
        replicas=replicas,
        resources=Resources(8_000, 64 * 1024, gpu),
        command=("torchrun --nnodes=$NNODES --node-rank=$NODE_RANK train.py",),
        **extra,  # type: ignore[arg-type]
    )


class _Demo:
    def __init__(self) -> None:
        self.state = ClusterState()
        self.now = 0

    def do(self, command: c.Command) -> c.Result:
        result = apply(self.state, command)
        if not result.ok:
            raise SystemExit(f"unexpected: {result.message}")
        return result

    def schedule(self) -> None:
        self.now += 1_000
        command = schedule(self.state, self.now).command(self.now)
        if command is not None:
            result = self.do(command)
            for job_id in result.bound:
                print(f"  bound   {job_id}: {explain(self.state, job_id, self.now)}")
        for job in self.state.pending_jobs():
            print(f"  pending {job.job_id}: {job.reason}")


def main() -> None:
    demo = _Demo()
    print("1. Three 8-GPU hosts in rack r1, one in rack r2.")
    for name, rack in (("a1", "r1"), ("a2", "r1"), ("a3", "r1"), ("b1", "r2")):
        demo.do(c.RegisterNode(_node(name, rack), demo.now))
    print("2. A 4 x 8-GPU gang that must sit in one rack waits, with its reason:")
    big = demo.do(c.SubmitJob(_spec("pretrain", 4, 8, topology_required="rack"), "req-1")).job_id
    demo.schedule()
    print("3. A fourth host joins rack r1; the whole gang binds in one command:")
    demo.do(c.RegisterNode(_node("a4", "r1"), demo.now))
    demo.schedule()
    print("4. A 2-GPU job lands on one NVLink island of the free host:")
    demo.do(c.SubmitJob(_spec("finetune", 1, 2), "req-2"))
    demo.schedule()
    print(f"5. Rank 2 of {big} exits 1: the whole gang stops (no retries left):")
    attempt = demo.state.jobs[big].attempt
    assert attempt is not None
    event = c.MemberEvent(big, attempt.fencing_token, 2, c.MemberEventKind.EXITED, 1)
    demo.do(c.ReportMembers(attempt.members[2].node_id, (event,), now_ms=demo.now))
    print(f"  {big}: {demo.state.jobs[big].state.value}: {demo.state.jobs[big].reason}")


if __name__ == "__main__":
    main()
