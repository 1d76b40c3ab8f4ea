"""The versioned codec: round trips, canonical bytes, and clear errors."""

from __future__ import annotations

import dataclasses
import enum
import gc
import json
from typing import Any

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import ClusterConfig, Cohort, PreemptionKind, Queue
from synapse_ha.core.codec import versioned as codec
from synapse_ha.core.codec.decode_errors import CodecError
from synapse_ha.core.codec.formats import ADDED_FIELDS
from synapse_ha.core.codec.from_plain import from_plain_compiled
from synapse_ha.core.codec.to_plain import to_plain
from synapse_ha.core.codec.versioned import (
    decode_command,
    decode_result,
    decode_state,
    encode_command,
    encode_result,
    encode_state,
)
from synapse_ha.core.health.fitness import GpuFault, NodeCheck
from synapse_ha.core.identity.access import Role
from synapse_ha.core.model import Attempt, ClusterState, Job, JobSpec, MemberPlacement, NodeStatus
from synapse_ha.core.reasons import Reason, ReasonCode, reason, render
from tests.core.harness import Cluster, job, node

EXAMPLES: list[c.Command] = [
    c.Configure(ClusterConfig(topology_levels=("pod", "rack")), 1),
    c.Barrier("replica-a", 2),
    c.RegisterNode(node("n1", gpus=4, islands=((0, 1), (2, 3)), features=("images",)), 3),
    c.SetNodeStatus("n1", NodeStatus.DRAINING, "kernel upgrade", 4),
    c.MarkNodeDead("n1", "silent", 99, 5),
    c.ReportGpuHealth("n1", (GpuFault(3, "xid-79", "fell off the bus"),), 7, 5),
    c.RepairGpus("n1", (3,), 6, "user:ops"),
    c.RaiseFormat(3, ("r1", "r2", "r3"), 8),
    c.ReportNodeChecks("n1", (NodeCheck("health-check", True, "disk full"),), 6),
    c.MarkNodeDegraded("n1", "node n1: 23% slower than the median of its gang", 6),
    c.SubmitJob(job("x", replicas=3, gpu=2, required="rack", time_limit_s=60, retries=2), "r", 6),
    c.CancelJob("job-000001", "user asked", 7),
    c.RequeueJob("job-000001", "checkpointed", 7, "user:alice"),
    c.ReplaceMembers(
        (c.MemberReplacement("job-000001", 4, MemberPlacement(1, "n2", (2, 3), generation=1)),), 8
    ),
    c.GrowMembers((c.MemberGrowth("job-000001", 4, (MemberPlacement(2, "n3", (0, 1)),)),), 8),
    c.ShrinkMembers("job-000001", 4, 2, "job-000002", 8),
    c.BindPlan(
        (c.GangPlacement("job-000001", 0, (MemberPlacement(0, "n1", (0, 1)),)),),
        (
            (
                "job-000002",
                reason(
                    ReasonCode.RETRY_BACKOFF,
                    reason(ReasonCode.MEMBER_EXITED, rank=1, node="n1", exit_code=3),
                    attempt=1,
                    retry=1,
                    retries=2,
                    backoff_ms=1500,
                ),
            ),
        ),
        8,
    ),
    c.ReportMembers(
        "n1",
        (
            c.MemberEvent("job-000001", 4, 0, c.MemberEventKind.STARTED),
            c.MemberEvent("job-000001", 4, 1, c.MemberEventKind.EXITED, 137, "killed"),
            c.MemberEvent(
                "job-000001", 4, 2, c.MemberEventKind.EXITED, 137, "fenced", c.ExitCause.FENCED
            ),
        ),
        42,
        9,
    ),
    c.FailAttempt(
        "job-000001",
        4,
        reason(ReasonCode.START_TIMEOUT, ranks="0, 1", nodes="n1", timeout_ms=60_000),
        1,
        10,
    ),
    c.ExpireTimeLimit("job-000001", 4, 11),
    c.ExpireDeadline("job-000001", 12),
    c.PurgeFinished(12),
    c.CreateToken(
        "0123456789ab", "alice", Role.USER, "f" * 64, ("train",), 99_000, 13, "user:root"
    ),
    c.RevokeToken("0123456789ab", 14, "user:root"),
    c.SetQueue(
        Queue(
            "team-a", gpu=64, cohort="research", borrowing_limit_gpu=16, priority_classes=("high",)
        ),
        15,
        "user:root",
    ),
    c.DeleteQueue("team-a", 16, "user:root"),
    c.SetCohort(Cohort("team", "org", gpu=4, borrowing_limit_gpu=2), 17, "user:root"),
    c.DeleteCohort("team", 18, "user:root"),
    c.Preempt("job-2", 0, (c.Victim("job-1", 3),), PreemptionKind.RECLAIM, 17),
    c.SetCohort(Cohort("lab", fair_sharing_preemption=True), 19, "user:root"),
    c.Preempt("job-2", 0, (c.Victim("job-1", 3),), PreemptionKind.FAIR_SHARE, 20),
]


def test_every_command_type_has_an_example() -> None:
    assert {type(e) for e in EXAMPLES} == set(c.COMMAND_TYPES)


@pytest.mark.parametrize("command", EXAMPLES, ids=lambda e: type(e).__name__)
def test_command_round_trip(command: c.Command) -> None:
    data = encode_command(command)
    assert decode_command(data) == command
    assert encode_command(decode_command(data)) == data
    # The compiled decoders alone decode it whole (codec_compiled).
    assert from_plain_compiled(type(command), json.loads(data)["body"]) == command


def test_state_round_trip_and_canonical_bytes() -> None:
    cl = Cluster()
    cl.add(node("b", gpus=8, rack="r2"), node("a", gpus=8, rack="r1"))
    j = cl.submit(job(replicas=2, gpu=4))
    cl.submit(job("waits", replicas=9, gpu=8, wait_for_nodes=True))
    cl.run_pass()
    cl.start_all(j)
    data = encode_state(cl.state)
    restored = decode_state(data)
    assert restored == cl.state
    assert encode_state(restored) == data
    # Insertion order does not matter: the same content gives the same bytes.
    restored.nodes = dict(reversed(list(restored.nodes.items())))
    assert encode_state(restored) == data


def _plain_by_definition(value: object) -> object:
    """What ``to_plain`` means, written as a plain recursive walk (no per-type encoders)."""
    if isinstance(value, enum.Enum):
        return value.value
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        added = ADDED_FIELDS.get(type(value), {})
        out = {}
        for f in dataclasses.fields(value):
            if not f.init:
                continue
            item = getattr(value, f.name)
            if f.name in added:
                default = (
                    f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
                )
                if item == default:
                    continue
            out[f.name] = _plain_by_definition(item)
        return out
    if isinstance(value, (tuple, list)):
        return [_plain_by_definition(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(_plain_by_definition(v) for v in value)  # type: ignore[type-var]
    assert isinstance(value, dict)
    return {str(k): _plain_by_definition(v) for k, v in value.items()}


def test_the_per_type_encoders_give_what_the_definition_gives() -> None:
    cl = Cluster()
    cl.add(node("b", gpus=8, rack="r2", islands=((0, 1, 2, 3), (4, 5, 6, 7))), node("a"))
    j = cl.submit(job(replicas=2, gpu=4, required="rack", retries=1))
    cl.submit(
        job("waits", replicas=9, gpu=8, wait_for_nodes=True, queue="default", priority_class="high")
    )
    cl.run_pass()
    cl.start_all(j)
    cl.exit_member(j, 0, 3, seed=1)
    names = frozenset({"zeta", "alpha", "mid", "beta", "omega", "kappa"})
    values: list[object] = [*EXAMPLES, cl.state, c.ok("fine", job_id="job-000001"), names]
    for value in values:
        assert to_plain(value) == _plain_by_definition(value), type(value).__name__
    assert to_plain(names) == sorted(names)
    with pytest.raises(CodecError, match="cannot encode a value of type complex"):
        to_plain(1j)


def named(cls: type, values: list[Any]) -> dict[str, Any]:
    """A compact (positional) value with its field names."""
    return dict(zip([f.name for f in dataclasses.fields(cls)], values, strict=False))


def a_running_and_a_waiting_job() -> Cluster:
    """Two nodes, a running gang and a gang that waits (with retries set)."""
    cl = Cluster()
    cl.add(node("b", gpus=8, rack="r2"), node("a", gpus=8, rack="r1"))
    j = cl.submit(job(replicas=2, gpu=4))
    cl.submit(job("waits", replicas=2, gpu=8, retries=2))
    cl.run_pass()
    cl.start_all(j)
    return cl


def test_a_compact_state_leaves_out_defaults_and_still_round_trips() -> None:
    cl = a_running_and_a_waiting_job()
    full = encode_state(cl.state)
    cl.state.config = dataclasses.replace(cl.state.config, compact_state=True)
    compact = encode_state(cl.state)
    assert len(compact) < 0.5 * len(full)
    restored = decode_state(compact)
    assert restored == cl.state
    assert encode_state(restored) == compact  # canonical: the same state, the same bytes
    body = named(ClusterState, json.loads(compact)["state"])
    assert named(ClusterConfig, body["config"])["compact_state"] is True
    waits = next(
        named(Job, v) for v in body["jobs"].values() if named(JobSpec, v[1])["name"] == "waits"
    )
    spec = named(JobSpec, waits["spec"])
    assert "image" not in spec and "queue" not in spec  # trailing defaults: left out
    assert spec["retries"] == [2]  # max_retries, then the defaults left out
    assert "attempt" not in waits  # waiting: no attempt, nor anything after it
    running = next(named(Job, v) for v in body["jobs"].values() if v[1][0] != "waits")
    attempt = named(Attempt, running["attempt"])
    # A default before a field that holds none is written.
    assert attempt["ended_at_ms"] is None and attempt["state"] == "running"
    # Off again, the state is written in full, as the previous release reads it.
    restored.config = dataclasses.replace(restored.config, compact_state=False)
    assert encode_state(restored) == full


@pytest.mark.parametrize(
    ("field", "bad", "message"),
    [
        ("name", 5, "state.jobs.{job}.spec.name: expected a string, got int"),
        ("replicas", True, "state.jobs.{job}.spec.replicas: expected an integer, got bool"),
        ("replicas", None, "state.jobs.{job}.spec.replicas: expected an integer, got NoneType"),
        (
            "resources",
            [1, "x", 0],
            "state.jobs.{job}.spec.resources.memory_mib: expected an integer, got str",
        ),
    ],
)
def test_a_compact_record_of_the_wrong_type_names_its_field(
    field: str, bad: Any, message: str
) -> None:
    """The compact layout's inlined decoder hands a value that fails a test to the
    generic one, which names the field and the rule."""
    cl = a_running_and_a_waiting_job()
    cl.state.config = dataclasses.replace(cl.state.config, compact_state=True)
    envelope = json.loads(encode_state(cl.state))

    def at(cls: type, name: str) -> int:
        return [f.name for f in dataclasses.fields(cls)].index(name)

    jobs = envelope["state"][at(ClusterState, "jobs")]
    job_id = next(iter(jobs))
    jobs[job_id][at(Job, "spec")][at(JobSpec, field)] = bad
    with pytest.raises(CodecError) as error:
        decode_state(json.dumps(envelope).encode())
    assert str(error.value).startswith(message.format(job=job_id))


def test_result_round_trip() -> None:
    result = c.Result(
        c.ResultCode.OK,
        "bound",
        bound=("job-1",),
        rejected=(c.Rejection("job-2", c.RejectCode.GPU_IN_USE, "x"),),
        stopped=("job-3",),
        purged=("job-4",),
    )
    assert decode_result(encode_result(result)) == result


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"not json", "not valid JSON"),
        (b"[]", "envelope"),
        (b'{"v": 3, "type": "Barrier", "body": {}}', "version 3"),
        (b'{"v": 1, "type": "DropTables", "body": {}}', "unknown command type 'DropTables'"),
        (b'{"v": 1, "type": "Barrier", "body": {"leader_id": 5}}', "Barrier.leader_id"),
        (b'{"v": 1, "type": "Barrier", "body": {"evil": 1}}', "unknown field 'evil'"),
        (b'{"v": 1, "type": "CancelJob", "body": {}}', "job_id"),
        (
            b'{"v":1,"type":"SetNodeStatus","body":{"node_id":"n","status":"gone"}}',
            "SetNodeStatus.status: 'gone' is not one of",
        ),
        (b'{"v": 1, "type": "Barrier", "body": {"now_ms": true}}', "expected an integer"),
    ],
)
def test_malformed_commands_name_the_problem(payload: bytes, message: str) -> None:
    with pytest.raises(CodecError, match=None) as info:
        decode_command(payload)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("path", "bad", "message"),
    [
        (("spec", "name"), 5, "SubmitJob.spec.name: expected a string, got int"),
        (("spec", "replicas"), True, "SubmitJob.spec.replicas: expected an integer, got bool"),
        (("spec", "resources", "gpu"), "8", "SubmitJob.spec.resources.gpu: expected an integer"),
        (("spec", "retries", "surprise"), 1, "SubmitJob.spec.retries: unknown field 'surprise'"),
        (("request_id",), None, "SubmitJob.request_id: expected a string, got NoneType"),
    ],
)
def test_a_named_field_of_the_wrong_type_names_its_path(
    path: tuple[str, ...], bad: Any, message: str
) -> None:
    """The named layout's inlined decoder hands a value that fails a test, or a key it
    does not know, to the generic one, which names the field and the rule."""
    envelope = json.loads(encode_command(c.SubmitJob(job("j"), "r1", 5)))
    holder = envelope["body"]
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = bad
    with pytest.raises(CodecError) as error:
        decode_command(json.dumps(envelope).encode())
    assert str(error.value).startswith(message)


def test_an_absent_named_field_takes_its_default_and_a_fresh_container() -> None:
    """Fields left out of the named layout decode to their defaults, each container its
    own (two decodes share no dictionary), and a required one left out is an error."""
    first = decode_state(b'{"v": 2, "state": {}}')
    second = decode_state(b'{"v": 2, "state": {}}')
    assert first == ClusterState()
    assert first.jobs is not second.jobs and first.queues is not second.queues
    assert decode_command(b'{"v": 2, "type": "CancelJob", "body": {"job_id": "j"}}') == (
        c.CancelJob("j")
    )
    with pytest.raises(CodecError, match="job_id"):
        decode_command(b'{"v": 2, "type": "CancelJob", "body": {"now_ms": 1}}')


def test_envelope_is_versioned_json() -> None:
    envelope = json.loads(encode_command(c.Barrier("a", 1)))
    assert envelope == {"v": 2, "type": "Barrier", "body": {"leader_id": "a", "now_ms": 1}}


def test_version_1_commands_decode_with_their_sentences_as_text_reasons() -> None:
    bind = b'{"v":1,"type":"BindPlan","body":{"placements":[],"reasons":[["job-1","needs 2"]]}}'
    decoded = decode_command(bind)
    assert isinstance(decoded, c.BindPlan)
    assert decoded.reasons == (("job-1", Reason(ReasonCode.TEXT, (("text", "needs 2"),))),)
    assert render(decoded.reasons[0][1]) == "needs 2"
    fail = b'{"v":1,"type":"FailAttempt","body":{"job_id":"j","fencing_token":3,"reason":"x"}}'
    decoded_fail = decode_command(fail)
    assert isinstance(decoded_fail, c.FailAttempt) and render(decoded_fail.reason) == "x"
    # A version 1 report carries no cause: it is the member's own exit.
    report = (
        b'{"v":1,"type":"ReportMembers","body":{"node_id":"n","events":[{"job_id":"j",'
        b'"fencing_token":3,"rank":0,"kind":"exited","exit_code":1,"detail":""}]}}'
    )
    decoded_report = decode_command(report)
    assert isinstance(decoded_report, c.ReportMembers)
    assert decoded_report.events[0].cause is c.ExitCause.PROGRAM


def test_version_1_state_decodes_with_derived_attempt_state_and_retries() -> None:
    cl = Cluster()
    cl.add(node("a", gpus=8))
    j = cl.submit(job(replicas=1, gpu=4, retries=2, backoff_s=0))
    cl.run_pass()
    cl.start_all(j)
    cl.exit_member(j, 0, 1)  # retry 1 of 2 pending
    plain = json.loads(encode_state(cl.state))
    # Make it look like version 1: sentences, no attempt state, no counters.
    record = plain["state"]["jobs"][j]
    record["reason"] = render(cl.state.jobs[j].reason)
    record["attempt"]["outcome"] = "failed: rank 0 exited with code 1"
    for name in ("retries_used", "requeues"):
        del record[name]
    del record["attempt"]["state"]
    v1 = json.dumps({"v": 1, "state": plain["state"]}).encode()
    restored = decode_state(v1)
    again = restored.jobs[j]
    assert again.reason.code is ReasonCode.TEXT
    assert render(again.reason) == render(cl.state.jobs[j].reason)
    assert again.attempt is not None and again.attempt.state is cl.state.jobs[j].attempt.state  # type: ignore[union-attr]
    assert again.retries_used == 1 and again.requeues == 0


# ------------------------------------------------- format versions (rolling upgrades)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b'{"v": 3, "type": "Barrier", "body": {}}', "format version 3 is newer"),
        (b'{"v": 2, "type": "AddQueue", "body": {}}', "unknown command type 'AddQueue'"),
        (b'{"v": 2, "type": "Barrier", "body": {"queue": "a"}}', "unknown field 'queue'"),
    ],
)
def test_what_a_newer_release_wrote_is_refused_as_unreadable(payload: bytes, message: str) -> None:
    from synapse_ha.core.codec.decode_errors import UnreadableFormat

    with pytest.raises(UnreadableFormat) as info:
        decode_command(payload)
    assert message in str(info.value) and "upgrade this replica" in str(info.value)


def test_a_state_of_a_newer_format_is_refused_as_unreadable() -> None:
    from synapse_ha.core.codec.decode_errors import UnreadableFormat
    from synapse_ha.core.codec.versioned import decode_state

    with pytest.raises(UnreadableFormat, match="format version 9 is newer"):
        decode_state(b'{"v": 9, "state": {}}')


def test_fields_added_since_the_previous_release_are_written_only_when_used() -> None:
    """A command or state that uses no new feature encodes as the previous release wrote
    it (so a replica of that release applies it); one that uses one carries the field."""
    plain = job("p", gpu=1)
    body = json.loads(encode_command(c.SubmitJob(plain, "r-1")))["body"]["spec"]
    assert "queue" not in body and "priority_class" not in body
    queued = dataclasses.replace(plain, queue="team-a", priority_class="high")
    body = json.loads(encode_command(c.SubmitJob(queued, "r-2")))["body"]["spec"]
    assert (body["queue"], body["priority_class"]) == ("team-a", "high")
    assert decode_command(encode_command(c.SubmitJob(queued, "r-2"))).spec == queued

    cluster = Cluster()
    cluster.do(c.RegisterNode(node("n1")))
    state = json.loads(encode_state(cluster.state))["state"]
    assert "queues" not in state and "queue_history" not in state
    assert "preemption" not in state["config"]
    cluster.do(c.SetQueue(Queue("team-a", gpu=8)))
    state = json.loads(encode_state(cluster.state))["state"]
    assert sorted(state["queues"]) == ["default", "team-a"]
    assert decode_state(encode_state(cluster.state)) == cluster.state


def test_a_state_is_coded_with_the_collector_paused_and_left_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cl = a_running_and_a_waiting_job()
    during: list[bool] = []
    for name in ("_dumps", "_loads"):
        real = getattr(codec, name)

        def watched(*args: Any, real: Any = real) -> Any:
            during.append(gc.isenabled())
            return real(*args)

        monkeypatch.setattr(codec, name, watched)
    assert gc.isenabled()
    data = encode_state(cl.state)
    with pytest.raises(CodecError):
        decode_state(data[:-1])
    assert gc.isenabled()  # restored, also after a refusal
    assert during == [False, False]
    gc.disable()
    try:
        assert decode_state(data) == cl.state
        assert not gc.isenabled()  # left off, as it was
    finally:
        gc.enable()


def test_a_state_parsed_by_another_parser_decodes_alike_and_its_refusals_are_reparsed() -> None:
    cl = a_running_and_a_waiting_job()
    data = encode_state(cl.state)
    parsed: list[bytes] = []

    def parse(raw: bytes) -> Any:
        parsed.append(raw)
        return json.loads(raw)

    assert decode_state(data, parse) == decode_state(data) == cl.state
    assert parsed == [data]

    def refuse(raw: bytes) -> Any:
        raise ValueError("not for me")

    assert decode_state(data, refuse) == cl.state  # parsed again by the core
    with pytest.raises(CodecError, match=r"^state: not valid JSON"):
        decode_state(data[:-1], refuse)
