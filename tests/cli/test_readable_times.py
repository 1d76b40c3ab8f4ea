"""Times and durations people read in ``status``, ``jobs``, ``history`` and ``events``,
and the ISO-8601 strings JSON carries next to the milliseconds."""

from __future__ import annotations

import datetime
import re

from synapse_ha.cli import history, render_jobs
from synapse_ha.client.history import event_from_proto, finished_job_from_proto
from synapse_ha.client.jobs import job_from_proto
from synapse_ha.rpc import readable
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

UTC = datetime.UTC
CET = datetime.timezone(datetime.timedelta(hours=1), "CET")
NOW = 1_795_885_981_589  # 2026-11-28 17:13:01.589 UTC
EPOCH_MS = re.compile(r"\b\d{13}\b")


def test_times_read_in_the_given_zone_and_iso_in_utc() -> None:
    assert readable.local_time(NOW, UTC) == "2026-11-28 17:13:01 UTC"
    assert readable.local_time(NOW, CET) == "2026-11-28 18:13:01 CET"
    assert readable.iso(NOW) == "2026-11-28T17:13:01.589Z"
    assert readable.iso(0) is None and readable.local_time(None) == "-"


def test_short_times_drop_what_now_shares() -> None:
    assert readable.short_time(NOW - 60_000, NOW, UTC) == "17:12:01"
    assert readable.short_time(NOW - 86_400_000, NOW, UTC) == "Nov 27 17:13"
    assert readable.short_time(NOW - 400 * 86_400_000, NOW, UTC) == "2025-10-24"
    # The day is the zone's: 23:43 UTC on the 27th is the 28th in CET.
    late = NOW - 17 * 3_600_000 - 30 * 60_000  # 2026-11-27 23:43:01 UTC
    assert readable.short_time(late, NOW, UTC) == "Nov 27 23:43"
    assert readable.short_time(late, NOW, CET) == "00:43:01"


def test_durations_keep_two_units() -> None:
    assert readable.clock(450) == "0.4s"
    assert readable.clock(47_900) == "47s"
    assert readable.clock(527_000) == "8m47s"
    assert readable.clock(2 * 3_600_000 + 5 * 60_000 + 59_000) == "2h05m"
    assert readable.clock(3 * 86_400_000 + 4 * 3_600_000) == "3d04h"
    assert readable.clock(None) == "-"
    assert readable.relative(NOW + 527_000, NOW) == "in 8m47s"
    assert readable.relative(NOW - 527_000, NOW) == "8m47s ago"


def test_a_job_waits_runs_and_has_time_left() -> None:
    waiting = readable.job_durations(
        submitted_ms=NOW - 90_000, started_ms=None, ended_ms=None, time_limit_ms=0, now_ms=NOW
    )
    assert waiting == {"wait_ms": 90_000, "elapsed_ms": None, "time_left_ms": None}
    running = readable.job_durations(
        submitted_ms=NOW - 90_000,
        started_ms=NOW - 60_000,
        ended_ms=None,
        time_limit_ms=3_600_000,
        now_ms=NOW,
    )
    assert running == {"wait_ms": 30_000, "elapsed_ms": 60_000, "time_left_ms": 3_540_000}
    ended = readable.job_durations(
        submitted_ms=NOW - 90_000,
        started_ms=NOW - 60_000,
        ended_ms=NOW - 10_000,
        time_limit_ms=3_600_000,
        now_ms=NOW,
    )
    assert ended == {"wait_ms": 30_000, "elapsed_ms": 50_000, "time_left_ms": None}


def running_job() -> pb.Job:
    return pb.Job(
        job_id="job-000007",
        spec=pb.JobSpec(name="train", replicas=1, time_limit_ms=3_600_000, shell_command="x"),
        state="RUNNING",
        job_state=pb.JOB_STATE_RUNNING,
        submitted_at_ms=NOW - 600_000,
        attempt=pb.Attempt(number=1, bound_at_ms=NOW - 500_000, started_at_ms=NOW - 473_000),
    )


def test_status_and_jobs_show_start_elapsed_and_time_left() -> None:
    doc = render_jobs.job_document(job_from_proto(running_job()), NOW)
    assert doc["started_at_ms"] == NOW - 473_000
    assert doc["started_at"] == readable.iso(NOW - 473_000)
    assert doc["submitted_at"] == readable.iso(NOW - 600_000)
    assert (doc["wait_ms"], doc["elapsed_ms"], doc["time_left_ms"]) == (
        127_000,
        473_000,
        3_127_000,
    )
    status = render_jobs.job_table(doc, NOW)
    assert "ELAPSED:       7m53s" in status
    assert "TIME LEFT:     52m07s of 1h00m" in status
    assert "WAITED:        2m07s" in status
    assert "(7m53s ago)" in status
    line = render_jobs.jobs_table([doc], NOW).splitlines()
    assert line[0].split()[6:10] == ["SUBMITTED", "WAIT", "ELAPSED", "LEFT"]
    assert line[1].split()[7:10] == ["2m07s", "7m53s", "52m07s"]
    assert not EPOCH_MS.search(status) and not EPOCH_MS.search("\n".join(line))


def test_a_job_waiting_again_waits_since_its_submission() -> None:
    job = running_job()
    job.state, job.job_state = "PENDING", pb.JOB_STATE_PENDING
    job.attempt.ended_at_ms = NOW - 5_000
    doc = render_jobs.job_document(job_from_proto(job), NOW)
    assert (doc["wait_ms"], doc["elapsed_ms"], doc["started_at_ms"]) == (600_000, None, None)
    assert "WAITING:       10m00s" in render_jobs.job_table(doc, NOW)


def test_history_names_the_id_as_jobs_does_and_reads_its_times() -> None:
    job = pb.HistoryJob(
        job_id="job-1",
        name="n",
        owner="alice",
        job_state=pb.JOB_STATE_SUCCEEDED,
        submitted_at_ms=NOW - 700_000,
        started_at_ms=NOW - 640_000,
        finished_at_ms=NOW - 100_000,
        attempt_list=[
            pb.HistoryAttempt(number=1, bound_at_ms=NOW - 640_000, ended_at_ms=NOW - 100_000)
        ],
    )
    doc = history.history_document(finished_job_from_proto(job))
    assert doc["id"] == doc["job_id"] == "job-1"  # job_id kept for existing scripts
    assert doc["finished_at"] == readable.iso(NOW - 100_000)
    assert doc["attempt_list"][0]["bound_at"] == readable.iso(NOW - 640_000)
    assert (doc["wait_ms"], doc["elapsed_ms"]) == (60_000, 540_000)
    text = history.history_table([doc], NOW)
    header, row = text.splitlines()
    assert header.split()[0] == "ID" and "ELAPSED" in header
    assert "1m00s" in row.split() and "9m00s" in row.split()
    assert not EPOCH_MS.search(text)


def test_events_have_a_header_over_their_columns() -> None:
    doc = history.event_document(
        event_from_proto(pb.Event(index=7, kind="bound", time_ms=NOW, job_id="job-1"))
    )
    header, line = history.event_header(), history.event_line(doc)
    assert header.split() == ["INDEX", "TIME", "KIND", "SUBJECT", "DETAIL"]
    assert line.index("bound") == header.index("KIND")
    assert line.index("job-1") == header.index("SUBJECT")
