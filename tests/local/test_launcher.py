"""The launcher: process groups, logs, a command prefix, bounded waits, and a close that
leaves nothing behind."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from synapse_ha.local.launcher import (
    MARKER_VARIABLE,
    Launcher,
    LaunchError,
    ProcessExited,
    WaitTimeout,
    free_ports,
    port_in_use,
    processes_with_env,
    wait_until,
)

pytestmark = pytest.mark.integration

# Ignores SIGTERM, starts a child in a session of its own (as the worker's member
# supervisors do), writes the child's pid and waits forever.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         start_new_session=True)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(child.pid))
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""


def gone(pid: int) -> bool:
    """Whether ``pid`` no longer runs (absent, or a zombie waiting for its parent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2 :].split()[0] in ("Z", "X")


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    launched = Launcher(tmp_path / "logs")
    try:
        yield launched
    finally:
        launched.close(grace_s=0.5)
        # Independent of close(), which is under test: nothing marked may survive.
        for pid in processes_with_env(MARKER_VARIABLE, launched.marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_close_kills_a_program_that_ignores_sigterm_and_its_detached_child(
    launcher: Launcher, tmp_path: Path
) -> None:
    pid_file = tmp_path / "child.pid"
    p = launcher.process("stubborn", [sys.executable, "-c", STUBBORN, str(pid_file)])
    child = wait_until(
        "the child's pid", lambda: pid_file.exists() and int(pid_file.read_text()), 30, watch=[p]
    )
    assert p.pid is not None and p.pid in launcher.groups  # it leads a group of its own
    assert sorted(launcher.marked()) == sorted([p.pid, child])

    launcher.close(grace_s=0.2)

    assert not p.alive and p.returncode == -signal.SIGKILL
    assert gone(child)
    assert launcher.marked() == []
    with pytest.raises(LaunchError, match="closed"):
        launcher.start(p)


def test_stop_sends_sigterm_to_the_group_first(launcher: Launcher) -> None:
    script = "trap 'echo bye; exit 0' TERM; echo ready; sleep 600 & wait"
    p = launcher.process("polite", ["sh", "-c", script])
    wait_until("the trap to be set", lambda: "ready" in p.log_tail(), 30, watch=[p])
    p.stop(grace_s=30)
    assert p.returncode == 0
    assert "bye" in p.log_tail()
    assert not p.expect_running


def test_a_watched_process_that_exits_ends_the_wait_with_its_log(launcher: Launcher) -> None:
    p = launcher.process("crasher", ["sh", "-c", "echo cannot bind; exit 3"])
    with pytest.raises(ProcessExited, match="cannot bind") as caught:
        wait_until("something that never comes", lambda: None, 60, watch=[p])
    assert caught.value.returncode == 3


def test_a_wait_is_bounded_and_names_what_it_waited_for() -> None:
    def refuses() -> None:
        raise ConnectionRefusedError("nobody listens")

    with pytest.raises(WaitTimeout, match=r"the answer .*nobody listens"):
        wait_until("the answer", refuses, 0.2, every_s=0.05)


def test_the_prefix_runs_the_program(launcher: Launcher) -> None:
    p = launcher.process("prefixed", ["sh", "-c", "echo flag=$FLAG"], prefix=["env", "FLAG=on"])
    assert p.wait(30)
    assert p.returncode == 0
    assert p.log_tail().strip() == "flag=on"


def test_free_ports_are_distinct_and_free() -> None:
    ports = free_ports(4)
    assert len(set(ports)) == 4
    assert not any(port_in_use(port) for port in ports)
