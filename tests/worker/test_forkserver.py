"""Supervisors forked from the fork server, with real processes: members start, report
their exits and are fenced as with supervisors started one interpreter each, and nothing
(member, supervisor, fork server) outlives an agent killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from synapse_ha.worker.forkserver import ForkedSupervisor
from synapse_ha.worker.lease import LeaseFile
from synapse_ha.worker.member_dirs import MemberExit
from synapse_ha.worker.members import ExecutorSettings, Member, MemberExecutor
from tests.worker.helpers import Fifo, process_gone, spec, wait_gone

LEASE_TTL_S = 4.0  # DESIGN §4's default: nothing may outlive a lost lease longer


@pytest.fixture
def executor(tmp_path: Path) -> Iterator[MemberExecutor]:
    lease = LeaseFile(tmp_path / "lease")
    lease.write(time.monotonic() + 3600)
    made = MemberExecutor(
        tmp_path, lease.path, ExecutorSettings(fence_grace_s=0.2, fork_server=True)
    )
    try:
        yield made
    finally:
        made.kill_all("test teardown")
        made.close()


def finish(executor: MemberExecutor, member: Member, timeout_s: float = 10.0) -> MemberExit:
    assert member.shim is not None
    member.shim.wait(timeout=timeout_s)
    executor.poll()
    assert member.exit is not None, f"no exit for {member.key}"
    return member.exit


def fork_server_pid(member: Member) -> int:
    launch = json.loads((member.dir / "launch.json").read_text())
    return int(launch["parent_pid"])


def test_a_forked_supervisor_runs_the_member_and_reports_its_exit(
    executor: MemberExecutor,
) -> None:
    members = [executor.start(spec(f"exit {rank + 3}", rank=rank)) for rank in range(3)]
    for rank, member in enumerate(members):
        assert isinstance(member.shim, ForkedSupervisor)
        exit_ = finish(executor, member)
        assert exit_.exit_code == rank + 3
        assert not exit_.disrupted
    # The supervisors are the fork server's children, not the agent's.
    assert fork_server_pid(members[0]) != os.getpid()
    assert all(fork_server_pid(m) == fork_server_pid(members[0]) for m in members)
    record = json.loads((members[0].dir / "shim.json").read_text())
    assert record["pid"] == members[0].shim.pid  # type: ignore[union-attr]


def test_a_forked_member_is_fenced_when_its_lease_passes(
    executor: MemberExecutor, fifo: Fifo
) -> None:
    member = executor.start(spec(f"echo $$ > {fifo.path}; exec sleep 300"))
    pid = int(fifo.read_line())
    LeaseFile(executor.lease_path).write(time.monotonic() - 1)
    exit_ = finish(executor, member)
    assert exit_.exit_code in (137, 143)  # SIGTERM, then SIGKILL after the fence grace
    assert "lease expired" in exit_.detail
    assert exit_.disrupted
    assert process_gone(pid)


def test_a_forked_member_is_fenced_when_the_fork_server_dies(
    executor: MemberExecutor, fifo: Fifo
) -> None:
    member = executor.start(spec(f"echo $$ > {fifo.path}; exec sleep 300"))
    pid = int(fifo.read_line())
    os.kill(fork_server_pid(member), signal.SIGKILL)
    exit_ = finish(executor, member)
    assert exit_.exit_code in (137, 143)
    assert "went away" in exit_.detail
    assert exit_.disrupted
    assert process_gone(pid)
    # A new fork server takes over for the next member.
    after = executor.start(spec("exit 0", rank=1))
    assert finish(executor, after).exit_code == 0
    assert fork_server_pid(after) != fork_server_pid(member)


def test_a_stop_request_reaches_a_forked_supervisor(executor: MemberExecutor, fifo: Fifo) -> None:
    member = executor.start(spec(f"trap 'exit 0' TERM; echo $$ > {fifo.path}; sleep 300 & wait"))
    fifo.read_line()
    executor.stop(member.key)
    exit_ = finish(executor, member)
    assert exit_.exit_code == 143  # stopped by the worker never counts as success


def test_a_request_the_fork_server_never_answers_ends_as_lost(
    executor: MemberExecutor, tmp_path: Path
) -> None:
    fork_server = executor.fork_server_pid
    assert fork_server is not None
    os.kill(fork_server, signal.SIGSTOP)  # the request waits in its pipe, unread
    ran = tmp_path / "ran"
    member = executor.start(spec(f"touch {ran}"))
    os.kill(fork_server, signal.SIGKILL)
    exit_ = finish(executor, member)
    assert exit_.exit_code == 137
    assert exit_.detail.startswith("lost")
    assert exit_.disrupted
    assert not ran.exists()
    assert executor.fork_server_pid not in (None, fork_server)  # a new one serves


# --------------------------------------------------- agent killed with SIGKILL

AGENT = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from synapse_ha.worker.lease import LeaseFile
    from synapse_ha.worker.members import ExecutorSettings, MemberExecutor
    from tests.worker.helpers import spec

    data, command = Path(sys.argv[1]), sys.argv[2]
    lease = LeaseFile(data / "lease")
    lease.write(time.monotonic() + 3600)  # valid: only the agent's death may end them
    executor = MemberExecutor(
        data, lease.path, ExecutorSettings(fence_grace_s=0.2, fork_server=True)
    )
    if command:
        for rank in range(2):
            executor.start(spec(command, rank=rank))
    print(json.dumps({"fork_server": executor.fork_server_pid}), flush=True)
    sys.stdin.read()  # until killed
    """
)


@pytest.fixture
def agent_process(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    try:
        yield started
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()


def start_agent(
    started: list[subprocess.Popen[str]], data: Path, command: str
) -> tuple[subprocess.Popen[str], int]:
    data.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(data), command],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    started.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "the agent process did not start"
    return proc, int(json.loads(line)["fork_server"])


def supervisor_pids(data: Path) -> list[int]:
    return [
        int(json.loads(p.read_text())["pid"]) for p in sorted(data.glob("members/*/*/shim.json"))
    ]


def test_nothing_outlives_an_agent_killed_while_members_run(
    tmp_path: Path, fifo: Fifo, agent_process: list[subprocess.Popen[str]]
) -> None:
    data = tmp_path / "node"
    agent, fork_server = start_agent(
        agent_process, data, f"sleep 300 & echo $$ $! > {fifo.path}; wait"
    )
    members = [int(p) for _ in range(2) for p in fifo.read_line().split()]
    supervisors = supervisor_pids(data)
    assert len(supervisors) == 2
    assert not any(process_gone(p) for p in [fork_server, *supervisors, *members])
    agent.kill()
    agent.wait(timeout=10)
    wait_gone([fork_server, *supervisors, *members], LEASE_TTL_S)
    exits = [json.loads(p.read_text()) for p in sorted(data.glob("members/*/*/exit.json"))]
    assert len(exits) == 2
    assert all(e["exit_code"] in (137, 143) and e["disrupted"] for e in exits)
    assert all("went away" in e["detail"] for e in exits)


def test_an_idle_fork_server_does_not_outlive_its_agent(
    tmp_path: Path, agent_process: list[subprocess.Popen[str]]
) -> None:
    agent, fork_server = start_agent(agent_process, tmp_path / "node", "")
    assert not process_gone(fork_server)
    agent.kill()
    agent.wait(timeout=10)
    wait_gone([fork_server], LEASE_TTL_S)
