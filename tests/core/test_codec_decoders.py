"""Decoding with per-type decoders worked out once: nested errors still name the exact
path and the rule, and a decoded value is rebuilt afresh every time."""

from __future__ import annotations

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.codec import decode_command, encode_command
from synapse_ha.core.codec_errors import CodecError
from synapse_ha.core.model import JobSpec, Resources


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (
            b'{"v":2,"type":"BindPlan","body":{"placements":[{"job_id":"j","attempts_made":0,'
            b'"members":[{"rank":0,"node_id":"n","gpus":[0,"x"]}]}],"reasons":[]}}',
            "BindPlan.placements[0].members[0].gpus[1]: expected an integer, got str",
        ),
        (
            b'{"v":2,"type":"BindPlan","body":{"placements":[],"reasons":[["j"]]}}',
            "BindPlan.reasons[0]: expected 2 items, got 1",
        ),
        (
            b'{"v":2,"type":"BindPlan","body":{"placements":{},"reasons":[]}}',
            "BindPlan.placements: expected a list, got dict",
        ),
        (
            b'{"v":2,"type":"BindPlan","body":{"placements":[5],"reasons":[]}}',
            "BindPlan.placements[0]: expected an object, got int",
        ),
        (
            b'{"v":2,"type":"SubmitJob","body":{"spec":{"name":"x","env":[["A",1]]},'
            b'"request_id":"r","now_ms":1,"owner":"a"}}',
            "SubmitJob.spec.env[0][1]: expected a string, got int",
        ),
        (
            b'{"v":2,"type":"SubmitJob","body":{"spec":null,"request_id":"r","now_ms":1,'
            b'"owner":"a"}}',
            "SubmitJob.spec: expected an object, got NoneType",
        ),
        (
            b'{"v":2,"type":"ReportMembers","body":{"node_id":"n","events":[{"job_id":"j",'
            b'"fencing_token":3,"rank":0,"kind":"bogus","exit_code":1,"detail":""}]}}',
            "ReportMembers.events[0].kind: 'bogus' is not one of started, exited, checkpoint",
        ),
    ],
)
def test_nested_errors_name_the_path_and_the_rule(payload: bytes, message: str) -> None:
    with pytest.raises(CodecError) as info:
        decode_command(payload)
    assert str(info.value) == message


def test_each_decode_builds_new_equal_values() -> None:
    spec = JobSpec(
        name="x", command=("true",), replicas=2, resources=Resources(cpu_milli=10, gpu=1)
    )
    encoded = encode_command(c.SubmitJob(spec=spec, request_id="r", now_ms=1, owner="a"))
    first, second = decode_command(encoded), decode_command(encoded)
    assert first == second
    assert isinstance(first, c.SubmitJob) and isinstance(second, c.SubmitJob)
    assert first.spec == spec and first.spec is not second.spec
    # A malformed command after good ones still fails, and good ones still decode after it.
    with pytest.raises(CodecError):
        decode_command(encoded.replace(b'"replicas":2', b'"replicas":"2"'))
    assert decode_command(encoded) == first
