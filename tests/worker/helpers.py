"""Shared helpers for the worker tests: fake clock, processes, FIFOs."""

from __future__ import annotations

import os
import select
import time
from pathlib import Path

from synapse_ha.core.desired import DesiredMember, LaunchSpec, MemberKey
from synapse_ha.core.model import JobSpec, Resources
from synapse_ha.worker import pidns
from synapse_ha.worker.members import MemberExecutor


class FakeClock:
    """Monotonic seconds that only move when a test advances them."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def desired_member(
    job_spec: JobSpec,
    *,
    job_id: str = "job-1",
    token: int = 1,
    host: str = "127.0.0.1",
    **overrides: object,
) -> DesiredMember:
    """The leader's view of rank 0 of a one-member gang of ``job_spec`` on ``host``."""
    fields: dict[str, object] = {
        "job_id": job_id,
        "attempt": 1,
        "fencing_token": token,
        "rank": 0,
        "world_size": 1,
        "local_rank": 0,
        "local_world_size": 1,
        "gpus": (),
        "master_addr": host,
        "master_port": 29500,
        "member_hosts": (host,),
        "spec": LaunchSpec.of(job_spec),
    }
    fields.update(overrides)
    return DesiredMember(**fields)  # type: ignore[arg-type]


_LAUNCH_FIELDS = frozenset(
    {"shell", "env", "workdir", "time_limit_ms", "image", "progress_timeout_ms", "progress_source"}
)
_RESOURCE_FIELDS = frozenset({"cpu_milli", "memory_mib"})


def spec(
    command: str | tuple[str, ...],
    *,
    job_id: str = "job-1",
    token: int = 1,
    rank: int = 0,
    attempt: int = 1,
    world_size: int = 1,
    **overrides: object,
) -> DesiredMember:
    """A desired member running ``command`` (a string under ``/bin/sh -c``, a tuple as
    an argv); ``overrides`` name fields of the member, of its launch spec or of its
    resources (``cpu_milli``, ``memory_mib``)."""
    launch: dict[str, object] = {
        "command": (command,) if isinstance(command, str) else command,
        "shell": isinstance(command, str),
    }
    launch.update({k: v for k, v in overrides.items() if k in _LAUNCH_FIELDS})
    resources = {k: v for k, v in overrides.items() if k in _RESOURCE_FIELDS}
    fields: dict[str, object] = {
        "job_id": job_id,
        "attempt": attempt,
        "fencing_token": token,
        "rank": rank,
        "world_size": world_size,
        "local_rank": 0,
        "local_world_size": 1,
        "gpus": (),
        "master_addr": "127.0.0.1",
        "master_port": 29500,
        "member_hosts": ("127.0.0.1",) * world_size,
        "spec": LaunchSpec(**launch, resources=Resources(**resources)),  # type: ignore[arg-type]
    }
    fields.update(
        {k: v for k, v in overrides.items() if k not in _LAUNCH_FIELDS | _RESOURCE_FIELDS}
    )
    return DesiredMember(**fields)  # type: ignore[arg-type]


def process_gone(pid: int) -> bool:
    """No such process, or only a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2 :].split()[0] in ("Z", "X")


def host_pids_with(text: str) -> list[int]:
    """Pids of the host's processes whose command line holds ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def host_pid(said: str) -> int:
    """The pid on this machine of the running process that said ``said`` (a line of
    :data:`ECHO_PID`; a bare pid is this namespace's). Fails when it is gone."""
    pid = pidns.host_pid(said)
    assert pid is not None, f"no process said {said.strip()!r} any more"
    return pid


class Fifo:
    """A named pipe members write lines to; the test blocks on it with a deadline
    (opened read-write so that it never reports end-of-file between writers)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        os.mkfifo(path)
        self.fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        self.buffer = b""

    def read_line(self, timeout_s: float = 10.0) -> str:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"nothing written to {self.path} within {timeout_s}s")
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if ready:
                self.buffer += os.read(self.fd, 4096)
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode()

    def close(self) -> None:
        os.close(self.fd)


def wait_gone(pids: list[int], bound_s: float) -> float:
    """Seconds until every pid is gone; fails once ``bound_s`` has passed."""
    start = time.monotonic()
    while not all(process_gone(p) for p in pids):
        if time.monotonic() - start > bound_s:
            raise AssertionError(f"processes {pids} still alive after {bound_s}s")
        time.sleep(0.02)
    return time.monotonic() - start


def wait_exit(executor: MemberExecutor, key: MemberKey, timeout_s: float) -> tuple[int, str]:
    """Poll ``executor`` until the member ``key`` has exited: its exit code and detail.
    Bounded by ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for done, exit_ in executor.poll():
            if done == key:
                return exit_.exit_code, exit_.detail
        time.sleep(0.02)
    raise AssertionError(f"{key} did not finish within {timeout_s} s")
