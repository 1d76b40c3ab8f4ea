"""A job's own stop grace (``stop_grace:``, core/spec/fields.py), end to end: the document,
the rule, the format that carries it, the API's and the heartbeat's messages, and the
worker that gives a stopped member that long between SIGTERM and SIGKILL, and synctl."""

from __future__ import annotations

import time

import pytest

from synapse_ha.cli import render_jobs
from synapse_ha.client.jobs import job_from_proto
from synapse_ha.core import commands as cmd
from synapse_ha.core.codec import formats
from synapse_ha.core.desired import LaunchSpec
from synapse_ha.core.spec.document import SpecError, parse_job_spec
from synapse_ha.core.spec.validation import check_job_spec
from synapse_ha.rpc.from_proto import desired_from_proto, spec_from_proto
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.to_proto import desired_to_proto, spec_to_proto
from tests.worker.conftest import MakeExecutor
from tests.worker.helpers import Fifo, desired_member, process_gone

DOC = {"name": "train", "replicas": 1, "command": "true"}


def test_a_document_states_it_and_the_rule_bounds_it() -> None:
    assert parse_job_spec({**DOC, "stop_grace": "2m"}).spec.stop_grace_ms == 120_000
    assert parse_job_spec(DOC).spec.stop_grace_ms == 0  # the node's
    with pytest.raises(SpecError, match=r"stop_grace: must be between 0 \(the node's\) and 1h"):
        parse_job_spec({**DOC, "stop_grace": "61m"})
    with pytest.raises(SpecError, match="stop_grace: 'soon' is not a duration"):
        parse_job_spec({**DOC, "stop_grace": "soon"})
    # A spec from the API meets the same rule.
    too_long = spec_to_proto(parse_job_spec(DOC).spec)
    too_long.stop_grace_ms = 2 * 3600 * 1000
    assert [v.field for v in check_job_spec(spec_from_proto(too_long), None)] == ["stop_grace"]


def test_it_needs_its_format_only_when_set() -> None:
    plain = parse_job_spec(DOC).spec
    graced = parse_job_spec({**DOC, "stop_grace": "30s"}).spec
    assert formats.format_needed(cmd.SubmitJob(plain, "r1")) < 11
    assert formats.format_needed(cmd.SubmitJob(graced, "r1")) == 11


def test_it_reaches_the_worker_and_a_member_ignoring_sigterm_is_killed_after_it(
    make_executor: MakeExecutor, fifo: Fifo
) -> None:
    doc = {**DOC, "command": f"trap '' TERM; echo $$ > {fifo.path}; sleep 300 & wait"}
    job = parse_job_spec({**doc, "stop_grace": "300ms"}).spec
    assert spec_from_proto(spec_to_proto(job)) == job
    wire = desired_to_proto(desired_member(job))
    assert wire.stop_grace_ms == 300
    desired = desired_from_proto(wire)
    assert desired.spec == LaunchSpec.of(job)
    executor = make_executor(stop_grace_s=60.0)  # the node's grace: a minute
    member = executor.start(desired)
    pid = int(fifo.read_line())
    started = time.monotonic()
    executor.stop(member.key)
    assert member.shim is not None
    member.shim.wait(timeout=20)
    executor.poll()
    assert member.exit is not None and member.exit.exit_code == 137  # SIGKILL after 300ms
    assert time.monotonic() - started < 20
    assert process_gone(pid)


def test_synctl_shows_it() -> None:
    job = parse_job_spec({**DOC, "stop_grace": "2m"}).spec
    doc = render_jobs.job_document(job_from_proto(pb.Job(job_id="job-1", spec=spec_to_proto(job))))
    assert doc["stop_grace_ms"] == 120_000
    assert "STOP GRACE:    2m" in render_jobs.job_table(doc, now_ms=0)
    plain = render_jobs.job_document(
        job_from_proto(pb.Job(job_id="job-2", spec=spec_to_proto(parse_job_spec(DOC).spec)))
    )
    assert plain["stop_grace_ms"] == 0
    assert "STOP GRACE:    -" in render_jobs.job_table(plain, now_ms=0)  # the node's
