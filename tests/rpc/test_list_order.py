"""ListJobs pages in submission order: read from the jobs' dictionary as apply keeps it,
and sorted when a state's dictionary is out of that order."""

from __future__ import annotations

from synapse_ha.core import commands as cmd
from synapse_ha.core.machine import apply
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.core.harness import job
from tests.rpc.authed import NOW, Replica, serving_replica


def _pages(replica: Replica, request: pb.ListJobsRequest, who: str) -> list[str]:
    md = [("authorization", f"Bearer {replica.tokens[who]}")]
    listed: list[str] = []
    token = ""
    for _ in range(50):
        request.page_token = token
        answer = replica.scheduler.ListJobs(request, metadata=md)
        listed += [j.job_id for j in answer.jobs]
        token = answer.next_page_token
        if not token:
            return listed
    raise AssertionError("ListJobs never ended its pages")


def test_pages_follow_submission_order_even_from_a_dictionary_out_of_order() -> None:
    with serving_replica() as replica:
        state = replica.backend.state
        for i in range(7):
            spec = job(f"extra-{i}", replicas=1, gpu=0)
            assert apply(state, cmd.SubmitJob(spec, f"order-{i}", NOW, owner="alice")).ok
        in_order = sorted(state.jobs, key=lambda j: state.jobs[j].seq)
        assert list(state.jobs) == in_order  # apply adds jobs in submission order
        pending = pb.ListJobsRequest(states=["pending"], limit=3)
        assert _pages(replica, pending, "admin") == in_order

        # A dictionary out of submission order is listed in submission order all the same.
        shuffled = in_order[3:] + in_order[:3]
        state.jobs = {job_id: state.jobs[job_id] for job_id in shuffled}
        assert _pages(replica, pb.ListJobsRequest(states=["pending"], limit=3), "admin") == in_order
        assert _pages(replica, pb.ListJobsRequest(limit=2), "admin") == in_order
