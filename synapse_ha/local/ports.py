"""Loopback ports held for the programs the launcher starts.

Ports for programs that will listen on them are *held* (:class:`PortHolder`): a socket
bound to the port but not listening stays open until the holder releases it. A program
binds the port beside it (``SO_REUSEADDR``, which gRPC, pysyncobj and the HTTP servers
set), and while the program is stopped for a restart no other socket can take the port:
neither another bind nor the kernel's choice of a source port for an outgoing connection,
which skips ports that are bound. A port merely probed free and closed again would be a
port in the ephemeral range, free for any connection to take until the restarted program
binds it.
"""

from __future__ import annotations

import errno
import socket
import threading
from collections.abc import Iterable

HOST = "127.0.0.1"


class PortHolder:
    """Loopback ports held for programs that will listen on them.

    :meth:`reserve` binds a socket with ``SO_REUSEADDR`` to port 0 of the host and keeps
    it open without listening. The kernel gives it a port no other socket is bound to,
    and while it is open:

    * a program that binds the port with ``SO_REUSEADDR`` (gRPC servers, pysyncobj's
      Raft server, Python's HTTP servers) can listen on it, stop, and listen again;
    * no other bind without that option and no bind to port 0 gets it, and no outgoing
      connection is given it as its source port: the kernel skips bound ports when it
      picks one. A stopped replica's port cannot be taken before its restart;
    * a connection to it is refused (nothing listens), as to a closed port.

    :meth:`release` closes the sockets. Thread-safe.
    """

    def __init__(self) -> None:
        self._held: dict[tuple[str, int], socket.socket] = {}
        self._lock = threading.Lock()

    def reserve(self, n: int, host: str = HOST) -> list[int]:
        """``n`` distinct ports on ``host``, held until :meth:`release`."""
        taken: list[socket.socket] = []
        try:
            for _ in range(n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                taken.append(s)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((host, 0))
        except BaseException:
            for s in taken:
                s.close()
            raise
        ports = [s.getsockname()[1] for s in taken]
        with self._lock:
            for port, s in zip(ports, taken, strict=True):
                self._held[(host, port)] = s
        return ports

    def reserve_preferred(self, preferred: int, host: str = HOST) -> int:
        """``preferred`` held as by :meth:`reserve` when nothing else has it (so that a
        program's address stays the same from one run to the next), else a free port
        (0 asks for a free port at once). Never the port of something listening."""
        if preferred:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((host, preferred))
            except OSError as exc:
                s.close()
                if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                    raise
            else:
                with self._lock:
                    if (host, preferred) not in self._held:
                        self._held[(host, preferred)] = s
                        return preferred
                s.close()  # held here already, for another program
        return self.reserve(1, host)[0]

    def held(self) -> list[tuple[str, int]]:
        with self._lock:
            return sorted(self._held)

    def release(self, ports: Iterable[int] | None = None, host: str = HOST) -> None:
        """Stop holding ``ports`` of ``host`` (every port held, when None)."""
        with self._lock:
            keys = list(self._held) if ports is None else [(host, p) for p in ports]
            for key in keys:
                s = self._held.pop(key, None)
                if s is not None:
                    s.close()


# Ports asked for without a launcher: held for the life of this process.
_PROCESS_PORTS = PortHolder()


def reserve_ports(n: int, host: str = HOST) -> list[int]:
    """``n`` distinct ports on ``host`` held for the life of this process: nothing but a
    program binding them with ``SO_REUSEADDR`` can use them, and a connection to one is
    refused until a program listens on it. See :class:`PortHolder`; a
    :class:`~synapse_ha.local.launcher.Launcher`'s ports are released when it closes."""
    return _PROCESS_PORTS.reserve(n, host)


def port_in_use(port: int, host: str = HOST) -> bool:
    """Whether something listens on (or holds) ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False
