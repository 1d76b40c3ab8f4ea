"""Member replacement on real processes (bench/replacement.py's smoke run): a worker of a
running 2-member gang with ``on_node_failure: replace`` is killed with SIGKILL; its rank
runs again on the idle worker with the next generation, the other member is never
restarted (same pid) and is told of the new membership (SIGUSR1, then it copies
``$SYNAPSE_MEMBERSHIP_FILE``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "replacement.py"


def test_a_killed_worker_costs_its_gang_one_member_placed_again() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert (report["smoke"], report["members"], report["kills"]) == (True, 2, 1)
    (took,) = report["kill_to_running_again_s"]
    # Not before the node could be declared dead (its members fenced themselves first).
    assert took >= report["dead_timeout_s"]
    assert report["survivors_never_restarted"] is True
    assert report["survivors_told"] is True
