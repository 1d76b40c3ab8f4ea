"""Terminal safety of synctl's output: the one escaping rule, every table and text
renderer that shows job-, node- or cluster-written text, the log printer (escaped, or
raw bytes with --raw), and the JSON and YAML encoders."""

from __future__ import annotations

import json

import pytest
import yaml

from synapse_ha.cli import history, render, render_cluster, render_jobs, render_nodes, terminal
from synapse_ha.cli.logs import MAX_LINE_BYTES, LinePrinter
from synapse_ha.client.history import event_from_proto, finished_job_from_proto
from synapse_ha.client.jobs import explained_from_proto, job_from_proto
from synapse_ha.client.nodes import node_from_proto
from synapse_ha.client.replicas import status_from_proto
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

# Retitle the window, clear the screen, return to the line start and overwrite it,
# back up over text, ring the bell, a C1 CSI, a line separator, a right-to-left override.
HOSTILE = "ok\x1b]0;pwned\x07\x1b[2J\rFAKE\b\b\x7f\x9b31m\u2028\u202etxt.exe"
ESCAPED = "ok\\x1b]0;pwned\\x07\\x1b[2J\\rFAKE\\b\\b\\x7f\\x9b31m\\u2028\\u202etxt.exe"
ACTIVE = ("\x1b", "\x07", "\r", "\b", "\x7f", "\x9b", "\u2028", "\u202e")


def assert_inert(text: str) -> None:
    """No character a terminal would act on, other than newlines."""
    assert not [c for c in ACTIVE if c in text], repr(text)
    assert all(c == "\n" or c == "\t" or c.isprintable() for c in text), repr(text)


def test_every_control_character_is_shown_escaped() -> None:
    assert terminal.terminal_safe(HOSTILE) == ESCAPED
    assert terminal.terminal_safe("a\nb\tc") == "a\\nb\\tc"
    assert terminal.terminal_safe("a\nb", keep=terminal.MULTILINE) == "a\nb"
    assert terminal.terminal_safe("a\tb\x1b", keep=terminal.LOG_LINE) == "a\tb\\x1b"
    every = "".join(chr(c) for c in (*range(0x20), *range(0x7F, 0xA0)))
    assert_inert(terminal.terminal_safe(every))
    plain = "héllo wörld ✓ 日本 \\x1b"  # printable text and a literal backslash pass as they are
    assert terminal.terminal_safe(plain) == plain
    assert terminal.terminal_safe(terminal.terminal_safe(HOSTILE)) == ESCAPED  # idempotent


def hostile_job() -> pb.Job:
    return pb.Job(
        job_id="job-000001",
        spec=pb.JobSpec(name="train", replicas=1, resources=pb.Resources(gpu=1)),
        state="CANCELLED",
        reason=HOSTILE,
        request_id=HOSTILE,
        owner="alice",
        cancelled_by=HOSTILE,
        attempt=pb.Attempt(
            number=1,
            members=[pb.Member(rank=0, node_id="w1\x1b[2J", state=HOSTILE)],
            preempted_by=HOSTILE,
            preemption="priority",
        ),
    )


def test_job_tables_escape_what_the_job_wrote() -> None:
    doc = render_jobs.job_document(job_from_proto(hostile_job()))
    for text in (render_jobs.job_table(doc, 0), render_jobs.jobs_table([doc], 0)):
        assert_inert(text)
        assert "\\x1b]0;pwned\\x07" in text
    assert ESCAPED in render_jobs.job_table(doc, 0)
    # The jobs table shows the reason's first line only: a carriage return is not a line
    # break there, it is shown.
    assert "\\rFAKE" in render_jobs.jobs_table([doc], 0)


def test_explain_keeps_the_explanations_lines_and_escapes_the_rest() -> None:
    answer = pb.ExplainJobResponse(
        job_id="job-000001", state="PENDING", explanation="line one\nline two\x1b[2J"
    )
    job = hostile_job()
    job.state = "PENDING"
    job.ClearField("attempt")
    text = render_jobs.explain_table(
        render_jobs.explain_document(explained_from_proto(answer), job_from_proto(job), []), 0
    )
    assert_inert(text)
    assert "line one\nline two\\x1b[2J" in text
    failed = render_jobs.explain_document(
        explained_from_proto(pb.ExplainJobResponse(job_id="job-000001", state="FAILED")),
        job_from_proto(hostile_job()),
        [],
    )
    assert ESCAPED in render_jobs.explain_table({**failed, "state": "FAILED"}, 0)


def test_node_and_cluster_tables_escape_what_nodes_and_replicas_report() -> None:
    node = pb.Node(
        node_id="w1",
        address="10.0.0.1:7070\x1b]0;x\x07",
        status="ready",
        members_run_as="agent:\rroot",
        topology=[pb.TopologyLabel(level="rack", value="r1\b\b")],
    )
    nodes = render_nodes.nodes_table([render_nodes.node_document(node_from_proto(node))])
    assert_inert(nodes)
    assert "\\x1b]0;x\\x07" in nodes and "agent:\\rroot" in nodes and "r1\\b\\b" in nodes
    status = pb.GetClusterStatusResponse(
        leader_id="r1\x1b[2J",
        replicas=[pb.ReplicaStatus(replica_id="r1", role="leader", error=HOSTILE)],
    )
    cluster = render_cluster.cluster_table(
        render_cluster.cluster_document(status_from_proto(status))
    )
    assert_inert(cluster)
    assert ESCAPED in cluster and "r1\\x1b[2J" in cluster


def test_event_lines_escape_details_and_names() -> None:
    event = pb.Event(
        index=7, kind="cancelled", time_ms=1, job_id="job-1", nodes=["w1\r"], detail=HOSTILE
    )
    line = history.event_line(history.event_document(event_from_proto(event)))
    assert_inert(line)
    assert ESCAPED in line and "on w1\\r" in line


def test_the_history_table_escapes_each_cell() -> None:
    job = pb.HistoryJob(
        job_id="job-1", name="n", owner="o\x1b[2J", nodes=["w\r1"], job_state=pb.JOB_STATE_FAILED
    )
    text = history.history_table([history.history_document(finished_job_from_proto(job))], now_ms=1)
    assert_inert(text)
    assert "o\\x1b[2J" in text and "w\\r1" in text


def test_structured_output_is_escaped_by_its_encoder() -> None:
    doc = render_jobs.job_document(job_from_proto(hostile_job()))
    for output in ("json", "yaml"):
        text = render.structured(doc, output)
        assert_inert(text)
        loaded = json.loads(text) if output == "json" else yaml.safe_load(text)
        assert loaded["reason"] == HOSTILE  # escaped, not altered


class Lines:
    def __init__(self) -> None:
        self.written: list[str | bytes] = []

    def __call__(self, item: str | bytes) -> None:
        self.written.append(item)


def test_log_lines_are_escaped_keeping_tabs() -> None:
    out = Lines()
    printer = LinePrinter(out, prefixed=True)
    printer.feed(0, b"step 1\tloss 0.5\n" + HOSTILE.encode()[:7])
    printer.feed(0, HOSTILE.encode()[7:] + b"\nno newline \xe2\x9c")
    printer.feed(0, b"\x93 at the end")
    printer.flush(0)
    assert out.written == [
        "[rank 0] step 1\tloss 0.5",
        "[rank 0] " + ESCAPED,
        "[rank 0] no newline \u2713 at the end",  # a character split across two chunks
    ]


def test_raw_log_lines_are_the_members_bytes() -> None:
    out = Lines()
    printer = LinePrinter(out, prefixed=False, raw=True)
    printer.feed(1, HOSTILE.encode() + b"\n\xff\xfe")
    printer.flush(1)
    assert out.written == [HOSTILE.encode(), b"\xff\xfe"]


@pytest.mark.parametrize("raw", [False, True])
def test_a_line_without_an_end_is_written_in_pieces(raw: bool) -> None:
    out = Lines()
    printer = LinePrinter(out, prefixed=False, raw=raw)
    printer.feed(0, b"x" * (2 * MAX_LINE_BYTES + 1))
    assert [len(piece) for piece in out.written] == [MAX_LINE_BYTES, MAX_LINE_BYTES]
    printer.flush(0)
    assert len(out.written[-1]) == 1
