"""The openb fair-sharing trace's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "fair_trace.py"
# 300 pods arriving 50x faster on one in 1,000 nodes of each shape: a few fair-share
# preemptions within a minute.
SMALL = ("--limit", "300", "--every", "1000", "--speedup", "50")
OPENB = Path(__file__).resolve().parents[3] / "shared" / "data" / "alibaba-openb-v2023"


@pytest.mark.skipif(not OPENB.is_dir(), reason="the openb trace is not on this machine")
def test_a_small_run_records_the_fair_share_preemptions_and_the_waits() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), *SMALL, "--policies", "topology,fair"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    topology, fair = report["policies"]["topology"], report["policies"]["fair"]
    assert "fair_share" not in topology["preemptions_by_kind"]
    assert fair["preemptions_by_kind"]["fair_share"] == fair["fair_share_victims"] > 0
    assert fair["fair_share_victim_queue_below_preemptor_by_rule"] == 0
    for example in fair["fair_share_examples"]:
        ours = example["shares_after"][example["preemptor_queue"]]["rule"]
        for victim in example["victims"]:
            assert example["shares_after"][victim["queue"]]["rule"] >= ours
    assert fair["pending_job_hours_by_queue_and_reason"] is not None
    assert sum(q["n"] for q in fair["delay_s_by_queue"].values()) == 300
    reserved = fair["reservation"]
    assert reserved["passes_with_a_reservation"] == reserved.get("timed", 0) + reserved["untimed"]
    assert sum(reserved["holders_by_gpus"].values()) == reserved["holders"] > 0


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (("--policies", "nope"), "--policies: unknown nope"),
        (("--estimates", "default:0"), "--estimates: estimates: S in default:S"),
        (("--reservations", "17"), "--reservations: from 1 to 16 per pass, got 17"),
    ],
)
def test_bad_options_are_refused_naming_them(option: tuple[str, str], said: str) -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), *option], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and said in out.stderr
