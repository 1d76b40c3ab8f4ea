"""Leader faults for the failover benchmark: ``kill`` (kill -9: its sockets close),
``freeze`` (SIGSTOP: nothing closes, nothing answers) and ``partition`` (nftables rules in
the root namespace drop loopback TCP to and from the replica both ways: nothing closes).

A partition drops every loopback TCP packet from or to one of the replica's ports: its
Raft, gRPC and heartbeat-stream listening ports, and the local ports of the connections
it opened itself (found with ``ss``, refreshed while the partition lasts); and every new
connection to the other replicas' Raft ports (theirs to each other are already open), so
that the cut-off replica cannot reach them again through a connection it opens anew.
The table is named ``synapse_bench_<pid>``; it is removed by the code that adds it
(``try``/``finally``), and :func:`sweep` removes any left behind by an earlier run.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import threading
from pathlib import Path

from synapse_ha.local.process import Replica

TABLE_PREFIX = "synapse_bench"
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

    def __init__(self, replica: Replica, others: list[Replica]) -> None:
        assert replica.process is not None
        self.raft_ports = {int(r.raft.rpartition(":")[2]) for r in others}
        self.pid = replica.process.pid
        self.table = f"{TABLE_PREFIX}_{self.pid}"
        self.ports = listening_ports(replica)
        self._stop = threading.Event()
        self._refresher = threading.Thread(target=self._refresh, daemon=True)

    def start(self) -> None:
        self.ports |= connection_ports(self.pid)
        body = ", ".join(str(p) for p in sorted(self.ports))
        raft = ", ".join(str(p) for p in sorted(self.raft_ports))
        _nft(
            f"table inet {self.table} {{\n"
            f"  set ports {{ type inet_service; elements = {{ {body} }} }}\n"
            "  chain out { type filter hook output priority -10; policy accept;\n"
            '    oifname "lo" tcp sport @ports drop\n'
            '    oifname "lo" tcp dport @ports drop\n'
            f'    oifname "lo" tcp dport {{ {raft} }} tcp flags & (syn | ack) == syn drop\n'
            "  }\n"
            "}\n"
        )
        self._refresher.start()

    def _refresh(self) -> None:
        while not self._stop.wait(0.05):
            new = connection_ports(self.pid) - self.ports
            if new:
                self.ports |= new
                body = ", ".join(str(p) for p in sorted(new))
                with contextlib.suppress(subprocess.CalledProcessError):
                    _nft(f"add element inet {self.table} ports {{ {body} }}\n")

    def heal(self) -> None:
        self._stop.set()
        if self._refresher.is_alive():
            self._refresher.join(timeout=5)
        subprocess.run(["nft", "delete", "table", "inet", self.table], check=False)


class Fault:
    """One fault of ``kind`` on ``replica``: :meth:`begin`, then :meth:`end` (always)."""

    def __init__(self, kind: str, replica: Replica, others: list[Replica]) -> None:
        if kind not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}, got {kind!r}")
        self.kind = kind
        self.replica = replica
        self.others = others
        self._partition: Partition | None = None

    def begin(self) -> None:
        if self.kind == "kill":
            self.replica.kill(signal.SIGKILL)
        elif self.kind == "freeze":
            self.replica.pause()
        else:
            self._partition = Partition(self.replica, self.others)
            self._partition.start()

    def end(self) -> None:
        """Undo the fault: resume or heal (a killed replica is restarted by the caller)."""
        if self.kind == "freeze":
            self.replica.resume()
        elif self._partition is not None:
            self._partition.heal()
            self._partition = None
