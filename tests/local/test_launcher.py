"""The launcher: process groups, logs, a command prefix, bounded waits, and a close that
leaves nothing behind."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from synapse_ha.local.launcher import MARKER_VARIABLE, Launcher
from synapse_ha.local.ports import PortHolder
from synapse_ha.local.process import LaunchError, ProcessExited, processes_with_env
from synapse_ha.local.waiting import WaitTimeout, wait_until

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


def _plain_bind(port: int) -> int:
    """0 when a socket without SO_REUSEADDR can bind ``port``, else the errno."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc.errno or -1
    return 0


def _listener(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def test_held_ports_are_distinct_refused_and_taken_by_nobody_else() -> None:
    holder = PortHolder()
    try:
        ports = holder.reserve(4)
        assert len(set(ports)) == 4
        assert holder.held() == sorted(("127.0.0.1", p) for p in ports)
        for port in ports:
            assert _plain_bind(port) == errno.EADDRINUSE
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
        # Another holder is given other ports.
        other = PortHolder()
        try:
            assert not set(other.reserve(64)) & set(ports)
        finally:
            other.release()
    finally:
        holder.release()
    assert holder.held() == []
    assert all(_plain_bind(port) == 0 for port in ports)


def test_a_program_listens_on_a_held_port_stops_and_listens_again() -> None:
    holder = PortHolder()
    try:
        (port,) = holder.reserve(1)
        for _ in range(2):  # a restart on the same port
            server = _listener(port)
            with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
                accepted, _ = server.accept()
                client.sendall(b"x")
                assert accepted.recv(1) == b"x"
                accepted.close()
            server.close()
            # Stopped: still held, so nothing else takes it before the restart.
            assert _plain_bind(port) == errno.EADDRINUSE
    finally:
        holder.release()


def test_outgoing_connections_never_take_a_held_port_as_their_source() -> None:
    """The restart race itself: while a program is down, every connection made on the
    machine is given some source port; never a held one."""
    holder = PortHolder()
    server = _listener(0)
    connections: list[socket.socket] = []
    try:
        held = set(holder.reserve(32))
        sources: set[int] = set()
        for _ in range(3000):
            client = socket.create_connection(server.getsockname(), timeout=5)
            sources.add(client.getsockname()[1])
            connections.append(client)
            server.accept()[0].close()
            if len(connections) >= 200:
                for c in connections:
                    c.close()
                connections.clear()
        assert len(sources) >= 1000  # many source ports were handed out
        assert not sources & held
    finally:
        for c in connections:
            c.close()
        server.close()
        holder.release()


def test_close_releases_the_launchers_ports(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path / "logs")
    ports = launcher.ports.reserve(2)
    assert all(_plain_bind(p) == errno.EADDRINUSE for p in ports)
    launcher.close()
    assert all(_plain_bind(p) == 0 for p in ports)
