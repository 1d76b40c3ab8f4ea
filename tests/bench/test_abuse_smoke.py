"""The abuse benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "abuse.py"


@pytest.mark.integration
def test_abuse_smoke_run_measures_a_users_attacks(tmp_path: Path) -> None:
    out = tmp_path / "abuse.json"
    run = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout)
    assert json.loads(out.read_text()) == report
    fat = report["fat_specs"]
    assert fat["outcomes"] == {"LIMIT_EXCEEDED:env_bytes": fat["submissions"]}
    assert set(fat["after"]) == {"r1", "r2", "r3"}
    flood = report["flood"]
    assert set(flood["outcomes"]) <= {"accepted", "LIMIT_EXCEEDED:submit_per_s"}
    assert flood["outcomes"].get("LIMIT_EXCEEDED:submit_per_s", 0) > 0
    assert flood["accepted_within_bucket"]
    assert flood["admin"]["outcomes"] == {"accepted": flood["admin"]["submissions"]}
