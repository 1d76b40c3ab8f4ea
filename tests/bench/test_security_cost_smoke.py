"""The security cost benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "security_cost.py"


@pytest.mark.integration
def test_security_cost_smoke_run_measures_both_clusters(tmp_path: Path) -> None:
    out = tmp_path / "security_cost.json"
    run = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout)
    assert json.loads(out.read_text()) == report
    for mode in ("plaintext", "tls_token"):
        side = report[mode]
        assert side["submit"]["submissions"] == 200
        assert side["submit"]["submissions_per_s"] > 0
        assert side["gang_start"]["gangs"] == 5
        assert side["gang_start"]["latency_ms_p99"] >= side["gang_start"]["latency_ms_p50"] > 0
    # The secure cluster knew the caller as the token's user and refused plaintext; the
    # plaintext cluster served an anonymous caller.
    assert report["tls_token"]["jobs_recorded_owner"] == "bench"
    assert report["tls_token"]["plaintext_call_refused"] is True
    assert report["plaintext"]["plaintext_call_refused"] is False
    ratios = report["tls_token_over_plaintext"]
    assert ratios["submissions_per_s"] == pytest.approx(
        report["tls_token"]["submit"]["submissions_per_s"]
        / report["plaintext"]["submit"]["submissions_per_s"],
        rel=0.01,
    )
