"""The heartbeat fan-in benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "heartbeat_fanin.py"


def test_heartbeat_fanin_smoke_run_reports_every_transport_and_a_death() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["stream_address"].startswith("127.0.0.1:")
    assert {r["mode"] for r in report["runs"]} == {"unary", "stream", "relay"}
    for run in report["runs"]:
        assert run["heartbeats"] > 0
        assert run["errors"] == 0
        assert run["leader_cpu_us_per_heartbeat"] > 0
    relayed = next(r for r in report["runs"] if r["mode"] == "relay")
    # The followers held the streams: the leader's own address named none of them.
    assert report["stream_address"] not in relayed["streams_per_replica"]
    assert len(relayed["streams_per_replica"]) == 2
    # The smoke run times one death, on a relayed stream: declared dead by the reaper,
    # never before dead_timeout after the last heartbeat was sent (the leader stamped it
    # heard when the follower received it, later than that).
    death = report["death_relayed"]
    assert death["last_heartbeat_sent_to_dead_s"] >= death["dead_timeout_s"]
