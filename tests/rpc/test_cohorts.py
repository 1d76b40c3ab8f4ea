"""The cohort tree over the API: SetCohort / DeleteCohort (admins only, checked before
proposing, refused below format 7) and the tree in ListQueues.

Against an in-process replica with the real servicers and auth interceptor
(tests/rpc/authed.py)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from synapse_ha.core import commands as cmd
from synapse_ha.core.cluster_config import Cohort
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.rpc.errors import ErrorReason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.rpc.authed import NOW, Replica, serving_replica
from tests.rpc.test_queues import _md, _refused, _set


@pytest.fixture
def replica() -> Iterator[Replica]:
    with serving_replica() as started:
        yield started


def _raise_format(replica: Replica) -> None:
    assert replica.backend.propose(cmd.RaiseFormat(FORMAT, ("r1",), NOW)).result().ok


def _set_cohort(replica: Replica, cohort: pb.Cohort, who: str = "admin") -> pb.SetCohortResponse:
    answer: pb.SetCohortResponse = replica.scheduler.SetCohort(
        pb.SetCohortRequest(cohort=cohort), metadata=_md(replica, who)
    )
    return answer


def test_an_admin_builds_a_tree_and_lists_it(replica: Replica) -> None:
    _raise_format(replica)
    assert _set_cohort(replica, pb.Cohort(name="org", gpu=2)).created
    made = _set_cohort(replica, pb.Cohort(name="team", parent="org", borrowing_limit_gpu=4))
    assert made.created
    assert not _set_cohort(replica, pb.Cohort(name="team", parent="org")).created
    assert replica.backend.state.cohorts["team"] == Cohort("team", "org")  # all replaced
    _set(replica, pb.Queue(name="a", gpu=8, cohort="team"))
    _set(replica, pb.Queue(name="b", gpu=4, cohort="lab"))

    listed = replica.scheduler.ListQueues(pb.ListQueuesRequest(), metadata=_md(replica, "alice"))
    by_name = {c.cohort.name: c for c in listed.cohorts}
    assert sorted(by_name) == ["lab", "org", "team"]
    assert by_name["org"].defined and by_name["org"].nominal_gpu == 10
    assert by_name["org"].cohort.gpu == 2 and not by_name["org"].cohort.parent
    assert by_name["team"].cohort.parent == "org" and by_name["team"].nominal_gpu == 8
    assert not by_name["team"].cohort.HasField("borrowing_limit_gpu")
    assert not by_name["lab"].defined and by_name["lab"].nominal_gpu == 4

    refused = failure_of(
        _refused(
            lambda: replica.scheduler.DeleteCohort(
                pb.DeleteCohortRequest(name="org"), metadata=_md(replica, "admin")
            )
        )
    )
    assert refused.code is grpc.StatusCode.FAILED_PRECONDITION, refused
    assert "parent of team" in refused.message
    for name in ("team", "org"):
        replica.scheduler.DeleteCohort(
            pb.DeleteCohortRequest(name=name), metadata=_md(replica, "admin")
        )
    assert replica.backend.state.cohorts == {}
    unknown = failure_of(
        _refused(
            lambda: replica.scheduler.DeleteCohort(
                pb.DeleteCohortRequest(name="org"), metadata=_md(replica, "admin")
            )
        )
    )
    assert unknown.reason is ErrorReason.COHORT_NOT_FOUND and unknown.metadata["cohort"] == "org"


def test_cohorts_are_checked_before_proposing_and_need_format_7(replica: Replica) -> None:
    early = failure_of(_refused(lambda: _set_cohort(replica, pb.Cohort(name="org"))))
    assert early.code is grpc.StatusCode.FAILED_PRECONDITION, early
    assert "needs format 7" in early.message
    _raise_format(replica)
    bad = pb.Cohort(name="Org_X", parent="nowhere", lending_limit_gpu=-1)
    failure = failure_of(_refused(lambda: _set_cohort(replica, bad)))
    assert failure.reason is ErrorReason.INVALID_FIELD
    assert [v.field for v in failure.violations] == ["name", "parent", "lending_limit_gpu"]
    assert replica.backend.state.cohorts == {}


@pytest.mark.parametrize("who", ["alice", "operator"])
def test_only_admins_change_cohorts(replica: Replica, who: str) -> None:
    _raise_format(replica)
    for call in (
        lambda: _set_cohort(replica, pb.Cohort(name="org"), who),
        lambda: replica.scheduler.DeleteCohort(
            pb.DeleteCohortRequest(name="org"), metadata=_md(replica, who)
        ),
    ):
        failure = failure_of(_refused(call))
        assert failure.code is grpc.StatusCode.PERMISSION_DENIED, failure
    assert replica.backend.state.cohorts == {}
