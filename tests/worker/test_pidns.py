"""Members in PID namespaces of their own, through the real supervisor: a member sees
only its own processes, and everything the supervisor and the agent do to a member (stop,
fence, time limit, exit codes, leftovers, a supervisor killed outright) still holds.
These tests need root (only root makes the namespaces without a user namespace)."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import signal
import time
from pathlib import Path

import pytest

from synapse_ha.core.health.prestart import Prestart
from synapse_ha.worker.pidns import NamespaceError, start
from synapse_ha.worker.shim import NOT_RUNNABLE
from tests.integration.cluster import wait_for
from tests.worker.conftest import MakeExecutor
from tests.worker.helpers import host_pids_with, spec, wait_exit

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="PID namespaces need root")


def marker() -> str:
    """A ``sleep`` duration no other process on the host has in its command line."""
    return f"{30 + secrets.randbelow(10**6) / 10**7:.7f}"


def test_a_member_sees_only_its_own_processes(make_executor: MakeExecutor) -> None:
    executor = make_executor(pid_namespace=True)
    member = executor.start(
        spec('echo "me=$$ parent=$PPID"; ls /proc | grep -c "^[0-9]"; sleep 0.1 & wait')
    )
    assert wait_exit(executor, member.key, 20.0) == (0, "")
    lines = (member.dir / "output.log").read_text().splitlines()
    # The shell is PID 2, its parent the namespace's init; /proc holds the init, the
    # shell, ls and grep, and nothing of the node's.
    assert lines[0] == "me=2 parent=1"
    assert int(lines[1]) <= 5
    record = json.loads((member.dir / "launch.json").read_text())
    assert record["pid_namespace"] is True


def test_a_stopped_member_ends_within_its_grace_and_fencing_leaves_nothing(
    make_executor: MakeExecutor,
) -> None:
    executor = make_executor(pid_namespace=True, stop_grace_s=5.0)
    polite, stubborn = marker(), marker()
    first = executor.start(spec(f"exec sleep {polite}", job_id="polite"))
    wait_for("the member to run", lambda: host_pids_with(polite) or None, 10.0)
    began = time.monotonic()
    executor.stop(first.key)
    assert wait_exit(executor, first.key, 10.0) == (143, "stopped by the worker")
    assert time.monotonic() - began < 2.0  # SIGTERM reached it: no wait for SIGKILL
    # A member that ignores SIGTERM and leaves a process of its own session behind.
    executor.start(
        spec(f"trap '' TERM; setsid sleep {stubborn} & sleep {stubborn}", job_id="stubborn")
    )
    wait_for("the shell and its two sleeps", lambda: len(host_pids_with(stubborn)) == 3, 10.0)
    executor.kill_all("fenced")
    assert not host_pids_with(stubborn)


def test_exit_codes_signals_and_leftovers_are_the_members(make_executor: MakeExecutor) -> None:
    executor = make_executor(pid_namespace=True)
    left = marker()
    cases = {
        "exits": ("exit 3", (3, "")),
        "segv": ("kill -SEGV $$", (139, "killed by signal 11")),
        "missing": (("/nonexistent/program",), (127, NOT_RUNNABLE)),
        "leaves": (f"setsid sleep {left} & exit 0", (0, "")),
    }
    members = {
        name: executor.start(spec(command, job_id=name)).key for name, (command, _) in cases.items()
    }
    exits: dict[str, tuple[int, str]] = {}
    deadline = time.monotonic() + 20.0
    while len(exits) < len(cases) and time.monotonic() < deadline:
        exits.update((key.job_id, (e.exit_code, e.detail)) for key, e in executor.poll())
        time.sleep(0.02)
    assert exits == {name: expected for name, (_, expected) in cases.items()}
    assert set(members) == set(exits)
    # What the member left behind ended with it.
    assert not host_pids_with(left)


def test_a_member_never_outlives_its_supervisor(make_executor: MakeExecutor) -> None:
    executor = make_executor(pid_namespace=True)
    alive = marker()
    member = executor.start(spec(f"sleep {alive}"))
    wait_for("the member to run", lambda: host_pids_with(alive) or None, 10.0)
    assert member.shim is not None
    member.shim.send_signal(signal.SIGKILL)
    wait_for("the member to end with it", lambda: not host_pids_with(alive), 10.0)
    assert wait_exit(executor, member.key, 10.0)[0] == 137  # lost with its supervisor


def test_the_prestart_check_runs_in_a_namespace_too(make_executor: MakeExecutor) -> None:
    executor = make_executor(pid_namespace=True)
    desired = spec("echo member ran")
    check = Prestart(('test "$$" = 2 && test ! -e /proc/3',), True, 10_000)
    desired = dataclasses.replace(desired, spec=dataclasses.replace(desired.spec, prestart=check))
    member = executor.start(desired)
    assert wait_exit(executor, member.key, 20.0) == (0, "")
    assert "member ran" in (member.dir / "output.log").read_text()


def test_a_namespace_that_cannot_be_made_is_said_so(tmp_path: Path) -> None:
    out = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT, 0o600)
    try:

        def never() -> None:
            raise AssertionError("never reached: the namespace fails first")

        # A process without root's rights cannot make the namespaces.
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setresuid(65534, 65534, 65534)
                start(["true"], {}, out, out, never, pid_namespace=True)
            except NamespaceError as exc:
                code = 0 if "no PID namespace of its own" in str(exc) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        os.close(out)
