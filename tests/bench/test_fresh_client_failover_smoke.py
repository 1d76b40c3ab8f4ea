"""The fresh-client failover benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "fresh_client_failover.py"


def test_fresh_client_failover_smoke_run_reports_its_figures(tmp_path: Path) -> None:
    out_file = tmp_path / "fresh.json"
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--client", "python", "--out", str(out_file)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert json.loads(out_file.read_text()) == report
    assert report["smoke"] is True
    assert report["healthy"]["calls"] == 20
    assert report["healthy"]["rpcs_per_call"] >= 1
    assert sorted(report["faults"]) == ["freeze", "kill", "none"]
    for kind, figures in report["faults"].items():
        assert figures["runs"] == 1, kind
        assert figures["to_write_s_max"] >= figures["to_write_s_p50"] > 0, kind
        assert figures["client_s_p50"] > 0, kind
