"""The simulator's fair-sharing policy: topology-aware preemption with
``fair_sharing_preemption`` on in every cohort of the workload."""

from __future__ import annotations

from synapse_ha.core.cluster_config import Cohort, PreemptionMode, Queue
from synapse_ha.sim.tenancy import FAIR, report, run_modes, with_fair_sharing
from synapse_ha.sim.tenants import multi_tenant
from synapse_ha.sim.workload import SimJob, Workload, synthetic_cluster
from tests.core.harness import job


def test_every_cohort_gets_the_switch_and_a_record_where_it_had_none() -> None:
    flat = with_fair_sharing(multi_tenant(seed=1, hours=1))
    assert flat.cohorts == (Cohort("research", fair_sharing_preemption=True),)
    tree = multi_tenant(seed=1, hours=1, organisations=2)
    switched = with_fair_sharing(tree)
    assert [r.name for r in switched.cohorts] == [r.name for r in tree.cohorts]
    assert all(r.fair_sharing_preemption for r in switched.cohorts)
    assert switched.jobs == tree.jobs and switched.queues == tree.queues


def _borrower_workload() -> Workload:
    # Four 8-GPU hosts; queues a and b of 8 GPUs each in cohort c, which has 16 of its
    # own. b runs three whole-host jobs (16 borrowed), a one; a's second arrives at 600 s:
    # a is at its nominal (no reclaim), below b's share.
    nodes = synthetic_cluster(4, hosts_per_rack=4)
    queues = (Queue("a", gpu=8, cohort="c"), Queue("b", gpu=8, cohort="c"))
    long = 20_000_000
    jobs = (
        SimJob(0, job("a1", gpu=8, queue="a"), long),
        *(SimJob(1_000 * i, job(f"b{i}", gpu=8, queue="b"), long) for i in (1, 2, 3)),
        SimJob(600_000, job("a2", gpu=8, queue="a"), 100_000),
    )
    return Workload(
        "borrower", nodes, jobs, "borrower", queues=queues, cohorts=(Cohort("c", gpu=16),)
    )


def test_the_fair_policy_preempts_a_borrower_above_the_queues_share() -> None:
    w = _borrower_workload()
    results = run_modes(w, (PreemptionMode.TOPOLOGY,), fair=True)
    assert [r.policy for r in results] == ["topology", FAIR]
    out = report(w, results)
    assert out["modes"]["topology"]["preemptions"] == 0
    fair = out["modes"][FAIR]
    assert fair["preemptions_by_kind"] == {"fair_share": 1}
    assert fair["preempt_commands_rejected"] == 0
    assert fair["jobs_started"] == len(w.jobs)
