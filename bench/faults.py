"""Leader faults for the failover benchmark: ``kill`` (kill -9: its sockets close),
``freeze`` (SIGSTOP: nothing closes, nothing answers) and ``partition`` (nftables rules in
the root namespace drop loopback TCP to and from the replica both ways: nothing closes).

A partition drops every loopback TCP packet the replica's process sends (its process
is moved into a cgroup v2 group of its own, matched by ``socket cgroupv2``), and every
one sent to its Raft, gRPC and heartbeat-stream listening ports or to the local ports of
the connections it held when the partition began. Its sockets stay open: nothing tells
the others it is gone. The table and the group are named ``synapse_bench_<pid>``; they
are removed by the code that adds them (``try``/``finally``), and :func:`sweep` removes
any left behind by an earlier run.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
from pathlib import Path

from synapse_ha.local.process import Replica

TABLE_PREFIX = "synapse_bench"
CGROUP_ROOT = Path("/sys/fs/cgroup")  # nftables names cgroup v2 groups below it


def _cgroup2_mount() -> Path:
    """Where the cgroup v2 hierarchy is mounted: /sys/fs/cgroup itself on a host with
    cgroup v2 alone, /sys/fs/cgroup/unified on a hybrid one."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup2":
                return Path(fields[1])
    return CGROUP_ROOT


CGROUP2 = _cgroup2_mount()
FAULTS = ("kill", "freeze", "partition")


def _nft(script: str) -> None:
    subprocess.run(["nft", "-f", "-"], input=script, text=True, check=True, capture_output=True)


def sweep() -> list[str]:
    """Remove every table this benchmark may have left behind; their names."""
    out = subprocess.run(["nft", "list", "tables"], text=True, capture_output=True, check=False)
    removed = []
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2].startswith(TABLE_PREFIX):
            subprocess.run(["nft", "delete", "table", parts[1], parts[2]], check=False)
            removed.append(parts[2])
    for group in CGROUP2.glob(f"{TABLE_PREFIX}_*"):
        _release(group)
        removed.append(str(group))
    return removed


def listening_ports(replica: Replica) -> set[int]:
    """The replica's Raft and gRPC ports, and its heartbeat-stream port from its log."""
    ports = {int(replica.raft.rpartition(":")[2]), int(replica.grpc.rpartition(":")[2])}
    log = Path(replica.log_path).read_text(errors="replace") if replica.log_path else ""
    streams = re.findall(r"heartbeat streams at \S+:(\d+)", log)
    if streams:
        ports.add(int(streams[-1]))
    return ports


def connection_ports(pid: int) -> set[int]:
    """Local ports of the TCP connections process ``pid`` holds."""
    out = subprocess.run(["ss", "-tnpH"], text=True, capture_output=True, check=False).stdout
    ports = set()
    for line in out.splitlines():
        if f"pid={pid}," in line:
            local = line.split()[3]
            ports.add(int(local.rpartition(":")[2]))
    return ports


class Partition:
    """Cut ``replica`` off (loopback TCP both ways) until :meth:`heal`."""

    def __init__(self, replica: Replica) -> None:
        assert replica.process is not None
        self.pid = replica.process.pid
        self.name = f"{TABLE_PREFIX}_{self.pid}"
        self.group = CGROUP2 / self.name
        # The group as nftables names it: its path below /sys/fs/cgroup.
        self.nft_path = str(self.group.relative_to(CGROUP_ROOT))
        self.ports = listening_ports(replica) | connection_ports(self.pid)

    def start(self) -> None:
        self.group.mkdir(exist_ok=True)
        (self.group / "cgroup.procs").write_text(str(self.pid))
        body = ", ".join(str(p) for p in sorted(self.ports))
        _nft(
            f"table inet {self.name} {{\n"
            "  chain out { type filter hook output priority -10; policy accept;\n"
            f'    oifname "lo" socket cgroupv2 level 1 "{self.nft_path}" drop\n'
            f'    oifname "lo" tcp dport {{ {body} }} drop\n'
            "  }\n"
            "}\n"
        )

    def heal(self) -> None:
        subprocess.run(["nft", "delete", "table", "inet", self.name], check=False)
        _release(self.group)


def _release(group: Path) -> None:
    """Move the processes of ``group`` back to the root group and remove it."""
    if not group.exists():
        return
    for pid in (group / "cgroup.procs").read_text().split():
        with contextlib.suppress(OSError):
            (CGROUP2 / "cgroup.procs").write_text(pid)
    with contextlib.suppress(OSError):
        group.rmdir()


class Fault:
    """One fault of ``kind`` on ``replica``: :meth:`begin`, then :meth:`end` (always)."""

    def __init__(self, kind: str, replica: Replica) -> None:
        if kind not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}, got {kind!r}")
        self.kind = kind
        self.replica = replica
        self._partition: Partition | None = None

    def begin(self) -> None:
        if self.kind == "kill":
            self.replica.kill(signal.SIGKILL)
        elif self.kind == "freeze":
            self.replica.pause()
        else:
            self._partition = Partition(self.replica)
            self._partition.start()

    def end(self) -> None:
        """Undo the fault: resume or heal (a killed replica is restarted by the caller)."""
        if self.kind == "freeze":
            self.replica.resume()
        elif self._partition is not None:
            self._partition.heal()
            self._partition = None
