"""Attack: one user swamps a node with tiny tasks.

A plain user submits an array of 300 tasks asking ``{gpu: 0, cpu: 1m, memory: 1Mi}``.
Without floors and caps all 300 land on one 32-CPU node at once: 300 supervisors and
their memory on a node whose accounting says it is nearly empty. Each test is the attack
through the state machine and the scheduler (as the leader plans and binds); it asserts
that the node's accounting holds the members to the cluster's floor and each member's
supervisor, that the user's members are held to the caps, and that every task left
waiting says which limit holds it and its value. The cluster's limits are the defaults
unless a test says otherwise (core/spec/member_limits.py).
"""

from __future__ import annotations

import dataclasses

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import Limits, Queue
from synapse_ha.core.model import JobSpec, MemberPlacement, Resources
from synapse_ha.core.reasons import render
from tests.core.harness import Cluster, job, node

TASKS = 300
TINY = Resources(cpu_milli=1, memory_mib=1, gpu=0)


def tiny_array(queue: str = "default") -> JobSpec:
    spec = dataclasses.replace(job("swamp", queue=queue), resources=TINY)
    return dataclasses.replace(spec, array=f"0-{TASKS - 1}")


def swamp(cl: Cluster, spec: JobSpec, owner: str = "mallory") -> list[str]:
    """Submit the array as ``owner`` and schedule until nothing more binds; its tasks."""
    result = cl.do(c.SubmitJob(spec, f"swamp-{owner}", cl.now, owner=owner))
    assert result.ok, result.message
    for _ in range(5):
        if not cl.run_pass().placements:
            break
    return cl.state.arrays[result.job_id].task_ids()


def split(cl: Cluster, tasks: list[str]) -> tuple[list[str], list[str]]:
    running = [t for t in tasks if cl.state.jobs[t].state.holds_resources]
    waiting = [t for t in tasks if t not in running]
    return running, waiting


def test_a_tiny_array_is_held_to_the_per_node_cap_with_a_reason() -> None:
    """The issue's node: 32 CPUs. The floor alone would let 320 members of 100m in; the
    cap on one user's members per node holds the array to it, and the node reserves the
    floor and the supervisor for every member it runs."""
    cl = Cluster()
    cl.add(node("n1", gpus=0, cpu=32, memory_gib=128))
    tasks = swamp(cl, tiny_array())
    running, waiting = split(cl, tasks)
    assert len(running) < TASKS, "every task of the array runs on the one node"
    limits = Limits()
    cap = limits.members_per_node_per_user
    assert len(running) == cap
    allocated = cl.state.nodes["n1"].allocated
    assert allocated.cpu_milli == cap * limits.member_min_cpu_milli
    floor = limits.member_min_memory_mib + limits.member_overhead_memory_mib
    assert allocated.memory_mib == cap * floor
    for task in waiting:
        why = cl.state.jobs[task].reason
        assert str(why.code) == "waiting_member_cap"
        said = render(why)
        assert f"limits.members_per_node_per_user: at most {cap}" in said, said
        assert "user mallory" in said
    # Another user still gets the node: the cap is per user.
    others = swamp(cl, dataclasses.replace(tiny_array(), array="0-9"), owner="alice")
    assert len(split(cl, others)[0]) == 10


def test_the_floor_and_the_supervisor_bound_how_many_tiny_members_a_node_takes() -> None:
    """A node with room for 60 members at the floor (4 GiB at 64 MiB and 4 MiB for the
    supervisor each) takes 60 tiny members, not 300; the others wait for capacity and say
    what a node reserves for each."""
    cl = Cluster()
    cl.add(node("n1", gpus=0, cpu=32, memory_gib=4))
    tasks = swamp(cl, tiny_array())
    running, waiting = split(cl, tasks)
    assert len(running) < TASKS, "every task of the array runs on the one node"
    limits = Limits()
    per_member = limits.member_min_memory_mib + limits.member_overhead_memory_mib
    assert len(running) == 4 * 1024 // per_member < limits.members_per_node_per_user
    node_ = cl.state.nodes["n1"]
    assert node_.allocated.fits_in(node_.info.capacity)
    said = render(cl.state.jobs[waiting[0]].reason)
    assert f"a node reserves 0 GPU, 0.1 CPU, {per_member} MiB each" in said, said
    # What the member asked is still what it is limited to: its spec is unchanged.
    assert cl.state.jobs[running[0]].spec.resources == TINY


def test_a_queue_caps_a_users_running_members_task_by_task_across_nodes() -> None:
    """The cap on one user's running members counts an array's tasks one by one, over the
    whole cluster; a queue's own cap replaces the cluster's for its gangs. Tasks that end
    make room for as many others."""
    cl = Cluster()
    cl.add(*(node(f"n{i}", gpus=0, cpu=32, memory_gib=128) for i in range(4)))
    cap = 50
    batch = Queue("batch", running_members_per_user=cap)
    assert cl.do(c.SetQueue(batch, cl.now, "user:root")).ok
    tasks = swamp(cl, tiny_array(queue="batch"))
    running, waiting = split(cl, tasks)
    assert len(running) == cap
    said = render(cl.state.jobs[waiting[0]].reason)
    assert f"user mallory runs {cap} member(s)" in said, said
    assert f"queue batch's running_members_per_user allows {cap}" in said
    for task in running[:10]:
        cl.start_all(task)
        assert cl.exit_member(task, 0, 0).ok
    cl.run_pass()
    running, _ = split(cl, tasks)
    assert len(running) == cap


def test_a_bind_past_a_cap_is_refused_at_apply_as_a_value() -> None:
    """A plan made on an older state (or by a faulty leader) that would take a user past
    the cap is refused gang by gang when applied; nothing of the refused gang is bound."""
    cl = Cluster()
    cl.add(node("n1", gpus=0, cpu=32, memory_gib=128))
    limits = dataclasses.replace(cl.state.config.limits, running_members_per_user=2)
    assert cl.do(c.Configure(dataclasses.replace(cl.state.config, limits=limits), cl.now)).ok
    spec = dataclasses.replace(tiny_array(), array="0-2")
    result = cl.do(c.SubmitJob(spec, "three", cl.now, owner="mallory"))
    tasks = cl.state.arrays[result.job_id].task_ids()
    plan = c.BindPlan(
        tuple(c.GangPlacement(t, 0, (MemberPlacement(0, "n1", ()),)) for t in tasks),
        (),
        cl.now,
    )
    bound = cl.do(plan)
    assert bound.bound == tuple(tasks[:2])
    assert [(r.job_id, str(r.code)) for r in bound.rejected] == [(tasks[2], "member_cap")]
    assert "limits.running_members_per_user allows 2" in bound.rejected[0].message
    assert not cl.state.jobs[tasks[2]].state.holds_resources
