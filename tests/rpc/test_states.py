"""States, statuses and roles on the wire: typed fields, their text twins, and answers
from an earlier release that has only the text."""

from __future__ import annotations

import ast
import enum
from pathlib import Path

import pytest

from synapse_ha.core.identity.access import Role
from synapse_ha.core.membership import ReplicaRole
from synapse_ha.core.model import AttemptState, JobState, MemberState, NodeStatus
from synapse_ha.rpc import states
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

PAIRS: list[tuple[type[enum.Enum], object, str]] = [
    (JobState, pb.JobState, "JOB_STATE_"),
    (AttemptState, pb.AttemptState, "ATTEMPT_STATE_"),
    (MemberState, pb.MemberState, "MEMBER_STATE_"),
    (NodeStatus, pb.NodeStatus, "NODE_STATUS_"),
    (ReplicaRole, pb.ReplicaRole, "REPLICA_ROLE_"),
    (Role, pb.UserRole, "USER_ROLE_"),
]


@pytest.mark.parametrize(("core", "wire", "prefix"), PAIRS, ids=lambda p: getattr(p, "__name__", p))
def test_each_core_enum_and_its_proto_enum_name_the_same_values(
    core: type[enum.Enum], wire: object, prefix: str
) -> None:
    names = {name for name, _ in wire.items()}  # type: ignore[attr-defined]
    assert names == {prefix + "UNSPECIFIED"} | {prefix + m.name for m in core}


def test_the_text_twins_keep_the_field_numbers_earlier_releases_read() -> None:
    earlier = {
        pb.Job: ("state", 4),
        pb.Member: ("state", 4),
        pb.Node: ("status", 3),
        pb.ReplicaStatus: ("role", 4),
        pb.TokenInfo: ("role", 3),
        pb.CreateTokenRequest: ("role", 2),
        pb.CancelJobResponse: ("state", 1),
        pb.ExplainJobResponse: ("state", 2),
        pb.NodeStatusResponse: ("status", 1),
        pb.RegisterNodeResponse: ("status", 1),
        pb.HeartbeatResponse: ("node_status_name", 5),
        pb.LeaderMessage: ("node_status_name", 5),
        pb.HistoryJob: ("state", 5),
        pb.HistoryAttempt: ("state", 3),
    }
    for message, (name, number) in earlier.items():
        field = message.DESCRIPTOR.fields_by_name[name]
        assert (field.number, field.type) == (number, field.TYPE_STRING), message.__name__


def test_writers_fill_both_fields_and_readers_take_the_typed_one() -> None:
    job = pb.Job(**states.job_state_fields(JobState.RUNNING))
    assert (job.state, job.job_state) == ("RUNNING", pb.JOB_STATE_RUNNING)
    assert states.job_state(job) is JobState.RUNNING
    # The typed field wins over a text that disagrees.
    job.state = "PENDING"
    assert states.job_state(job) is JobState.RUNNING
    answer = pb.HeartbeatResponse(**states.lease_status_fields(NodeStatus.DEAD))
    assert (answer.node_status_name, answer.node_status) == ("dead", pb.NODE_STATUS_DEAD)
    assert states.lease_status(answer) is NodeStatus.DEAD
    member = pb.Member(**states.member_state_fields(MemberState.EXITED))
    assert states.member_state(member) is MemberState.EXITED
    token = pb.TokenInfo(**states.user_role_fields(Role.OPERATOR))
    assert (token.role, states.user_role(token)) == ("operator", Role.OPERATOR)
    replica = pb.ReplicaStatus(**states.replica_role_fields(ReplicaRole.UNREACHABLE))
    assert states.replica_role(replica) is ReplicaRole.UNREACHABLE
    history = pb.HistoryAttempt(**states.attempt_state_fields(AttemptState.REQUEUED))
    assert states.attempt_state(history) is AttemptState.REQUEUED


def test_an_answer_of_an_earlier_release_is_read_from_its_text() -> None:
    # Bytes as an earlier release writes them: only the string fields.
    old_job = pb.Job.FromString(pb.Job(job_id="job-000001", state="SUCCEEDED").SerializeToString())
    assert states.job_state(old_job) is JobState.SUCCEEDED
    old_answer = pb.HeartbeatResponse(node_status_name="dead", lease_ttl_ms=4000)
    assert states.lease_status(pb.HeartbeatResponse.FromString(old_answer.SerializeToString())) is (
        NodeStatus.DEAD
    )
    assert states.node_status(pb.Node(status="cordoned")) is NodeStatus.CORDONED
    assert states.replica_role(pb.ReplicaStatus(role="follower")) is ReplicaRole.FOLLOWER
    assert states.replica_role(pb.ReplicaStatus(role="unknown")) is None


def test_a_value_no_release_writes_is_an_error_not_a_guess() -> None:
    with pytest.raises(ValueError, match="unknown JobState number 99"):
        states.job_state(pb.Job(job_state=99))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="DONE"):
        states.job_state(pb.Job(state="DONE"))


def test_requests_carry_text_for_the_rule_set_to_check() -> None:
    request = pb.ListJobsRequest(**states.job_state_filter([JobState.PENDING, JobState.FAILED]))
    assert states.job_state_filter_of(request) == ["PENDING", "FAILED"]
    earlier = pb.ListJobsRequest(states=["running"])
    assert states.job_state_filter_of(earlier) == ["running"]
    odd = pb.ListJobsRequest(job_states=[42])  # type: ignore[list-item]
    assert states.job_state_filter_of(odd) == ["job state number 42"]
    typed = pb.CreateTokenRequest(**states.user_role_fields(Role.ADMIN))
    assert states.requested_user_role(typed) == "admin"
    assert states.requested_user_role(pb.CreateTokenRequest(role="root")) == "root"


# --------------------------------------------------------- no literal comparisons

_PACKAGE = Path(__file__).resolve().parents[2] / "synapse_ha"
_STATE_WORDS = {
    str(m)
    for e in (JobState, AttemptState, MemberState, NodeStatus, ReplicaRole, Role)
    for m in e  # type: ignore[attr-defined]
} | {m.name for m in JobState}
_STATE_FIELDS = {"state", "status", "role", "node_status", "job_state", "outcome"}


def _names_a_state(node: ast.expr) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr in _STATE_FIELDS
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return node.slice.value in _STATE_FIELDS
    return False


def _literals(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [
            e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
        ]
    return []


def literal_state_comparisons(source: str) -> list[int]:
    """Lines where a state, status or role is compared with a string literal."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if any(_names_a_state(s) for s in sides) and any(
            word in _STATE_WORDS for s in sides for word in _literals(s)
        ):
            found.append(node.lineno)
    return found


def test_the_scan_finds_a_literal_comparison() -> None:
    assert literal_state_comparisons('if job.state == "PENDING": pass') == [1]
    assert literal_state_comparisons('x = answer.node_status in ("dead", "ready")') == [1]
    assert literal_state_comparisons('ok = doc["state"] != "SUCCEEDED"') == [1]
    assert literal_state_comparisons("if states.job_state(job) is JobState.PENDING: pass") == []


def test_no_module_compares_a_state_with_a_string() -> None:
    offenders = []
    for path in sorted(_PACKAGE.rglob("*.py")):
        if "gen" in path.relative_to(_PACKAGE).parts:
            continue
        for line in literal_state_comparisons(path.read_text()):
            offenders.append(f"{path.relative_to(_PACKAGE.parent)}:{line}")
    assert offenders == []


def test_what_is_shown_never_fails_on_an_answer_this_release_cannot_read() -> None:
    hostile = "ok\x1b]0;pwned\x07"
    assert states.shown_member_state(pb.Member(state=hostile)) == hostile  # escaped later
    assert states.shown_job_state(pb.ExplainJobResponse()) == ""
    assert states.shown_job_state(pb.Job(job_state=77)) == "unknown (77)"  # type: ignore[arg-type]
    running = pb.Job(**states.job_state_fields(JobState.RUNNING))
    assert states.shown_job_state(running) == "RUNNING"
    assert states.shown_node_status(pb.Node(status="dead")) == "dead"
