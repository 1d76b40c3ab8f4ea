"""The suite's leftover check (tests/conftest.py), run in a pytest session of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import leftovers
from tests.leftovers import SESSION_VARIABLE, session_processes

REPO = Path(__file__).resolve().parents[1]

LEAKS = """
import subprocess, sys, threading, time
import pytest

def test_leaves_a_process():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                     start_new_session=True)

def test_clean():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_leaves_a_thread():
    stop = threading.Event()
    # Non-daemon: the interpreter would wait for it at exit; it ends on its own later,
    # after the check (which waits SYNAPSE_TEST_SETTLE_S, 1 s here).
    threading.Thread(target=stop.wait, args=(4,), name="forgotten-worker").start()

def test_after_the_thread():
    pass
"""

MODULE_FIXTURES = """
import subprocess, sys
import pytest

@pytest.fixture(scope="module")
def server():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield p
    p.kill()
    p.wait()

def test_first(server):
    assert server.poll() is None

def test_second_without_the_fixture():
    pass

def test_third(server):
    assert server.poll() is None
"""

FORGETFUL_MODULE_FIXTURE = """
import subprocess, sys
import pytest

@pytest.fixture(scope="module")
def server():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])

def test_one(server):
    pass

def test_two(server):
    pass
"""


def test_the_check_names_and_kills_what_a_test_leaves_running(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("from tests.conftest import *  # noqa: F403\n")
    pytester.makepyfile(
        test_leaks=LEAKS,
        test_module_fixtures=MODULE_FIXTURES,
        test_forgetful=FORGETFUL_MODULE_FIXTURE,
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "SYNAPSE_TEST_SETTLE_S": "1",
    }
    # A session of its own (not pytester.runpytest_subprocess: its output is the point).
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-v"],
        cwd=pytester.path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    # The process: an error of the test that left it, naming it.
    assert "ERROR at teardown of test_leaves_a_process" in out, out
    assert "sleep(120)" in out
    assert "started during test_leaks.py::test_leaves_a_process" in out
    # The thread: named, with the test after which it was first seen.
    assert "ERROR at teardown of test_leaves_a_thread" in out
    assert "thread 'forgotten-worker'" in out
    assert "started during test_leaks.py::test_leaves_a_thread" in out
    # A module fixture's process is its own until the module ends; one left running
    # then is an error of the module's last test, named with the test it started under.
    assert "ERROR at teardown of test_two" in out
    assert "started during test_forgetful.py::test_one" in out
    for clean in ("test_clean", "test_after_the_thread", "test_first", "test_third"):
        assert f"::{clean} PASSED" in out
        assert f"ERROR at teardown of {clean}" not in out
    assert "test_second_without_the_fixture PASSED" in out
    assert out.count("ERROR at teardown of") == 3  # these three tests, no other
    # What the inner session left, its check killed: nothing of it runs now (its
    # processes carry this session's id too).
    assert not session_processes(os.environ[SESSION_VARIABLE].split(":")[-1])


# Two files for a session of two xdist workers (one file each): the first holds a process
# in a module fixture while the second's tests end, and are checked, on the other worker.
HOLDS_A_PROCESS = """
import pathlib, subprocess, sys, time
import pytest

@pytest.fixture(scope="module")
def server():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield p
    p.kill()
    p.wait()

def test_holds_its_process_while_the_other_worker_checks(server):
    pathlib.Path("{sync}/held").touch()
    deadline = time.monotonic() + 60
    while not pathlib.Path("{sync}/checked").exists():
        assert time.monotonic() < deadline, "the other worker never ran"
        time.sleep(0.02)
    assert server.poll() is None

def test_still_holds_it(server):
    assert server.poll() is None
"""

ENDS_WHILE_THE_OTHER_HOLDS = """
import pathlib, time

def test_ends_while_the_other_worker_holds_a_process():
    deadline = time.monotonic() + 60
    while not pathlib.Path("{sync}/held").exists():
        assert time.monotonic() < deadline, "the other worker never started its process"
        time.sleep(0.02)

def test_after_the_check():  # the test before it has been checked by now
    pathlib.Path("{sync}/checked").touch()
"""


def test_under_xdist_each_worker_checks_only_its_own_processes(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("from tests.conftest import *  # noqa: F403\n")
    sync = pytester.mkdir("sync")
    pytester.makepyfile(
        test_holder=HOLDS_A_PROCESS.format(sync=sync),
        test_quick=ENDS_WHILE_THE_OTHER_HOLDS.format(sync=sync),
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "SYNAPSE_TEST_SETTLE_S": "1"}
    # One file on each of two workers.
    xdist = ["-n", "2", "--dist", "loadfile"]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", *xdist],
        cwd=pytester.path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = run.stdout + run.stderr
    # The second worker's check found no process of its own; the first worker's process
    # (its session id is the worker's, not the other's) was neither reported nor killed.
    assert run.returncode == 0, out
    assert "2 workers [4 items]" in out, out
    assert "4 passed" in out, out
    assert "left running" not in out, out


def test_a_young_process_in_the_middle_of_exec_is_read_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A process just exec'd shows an empty environment until the kernel lays out the new
    # one: read once, it would be missed, and the test that started it would pass.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        environ = f"{SESSION_VARIABLE}=leftover-probe\0".encode()
        reads: list[str] = []
        real = leftovers._read

        def laid_out_late(path: str) -> bytes | None:
            if path == f"/proc/{child.pid}/environ":
                reads.append(path)
                return b"" if len(reads) < 3 else environ
            return real(path)

        monkeypatch.setattr(leftovers, "_read", laid_out_late)
        found = session_processes("leftover-probe")
        assert list(found) == [child.pid]
        assert len(reads) == 3
    finally:
        child.kill()
        child.wait()


def test_a_process_without_an_environment_is_given_up_on_soon() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env={})
    try:
        # Read again for a moment only: a program may run with an empty environment.
        assert leftovers._environ(str(child.pid)) == b""
        assert child.pid not in session_processes("leftover-probe")
    finally:
        child.kill()
        child.wait()
