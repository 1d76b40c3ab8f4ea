"""examples/replace_resume.py as a member of a replacing gang runs it: told of a new
membership (a line in its membership file, then SIGUSR1), it goes back to the gang's
newest checkpoint and carries on, without being restarted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "replace_resume.py"


def test_a_member_told_of_a_new_membership_goes_back_to_the_gangs_checkpoint(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "rank-1.step-20").write_text("state\n")  # rank 1 (lost) saved up to 20
    membership = tmp_path / "membership"
    membership.write_text(json.dumps({"membership": 0, "member_hosts": ["a", "b"]}) + "\n")
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "2",
        "SYNAPSE_MEMBERSHIP_FILE": str(membership),
        "SYNAPSE_CHECKPOINT_FILE": str(tmp_path / "marks"),
    }
    argv = [sys.executable, str(EXAMPLE), "--steps", "60", "--every", "10", "--step-s", "0.02"]
    proc = subprocess.Popen([*argv, "--dir", str(ckpt)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (ckpt / "rank-0.step-30").exists():
            assert time.monotonic() < deadline, "the member never reached step 30"
            time.sleep(0.02)
        with membership.open("a") as f:
            f.write(json.dumps({"membership": 1, "member_hosts": ["a", "c"]}) + "\n")
        proc.send_signal(signal.SIGUSR1)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert "membership 1, hosts ['a', 'c']; back to step 20" in out
    assert "done at step 60" in out
    assert "step 10" in (tmp_path / "marks").read_text()
