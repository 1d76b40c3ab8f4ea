"""The snapshot decode benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "snapshot_decode.py"


def test_snapshot_decode_benchmark_smoke_run_reports_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["smoke"] is True and report["jobs"] == 2_000
    assert report["encoded_state_mb"] > 0
    for key in ("read_snapshot_file_s", "decode_state_stdlib_s", "from_plain_s"):
        assert report[key] > 0
    assert {"stdlib", "msgspec"} <= set(report["parse_s"])
