"""A replica whose Raft channel is mutual TLS, run as a process of its own by
tests/security/test_raft_tls.py (so that a test can kill it with SIGKILL).

``python -m tests.security.raft_tls_member ADDRESS PEERS DATA CA CERT KEY STATUS``:
PEERS is every member's Raft address, comma-separated. While it leads, the replica
proposes one barrier after another; every 20 ms it writes its status as JSON to STATUS
(replaced atomically): whether it leads, its term and how many of its proposals were
committed. It ends when its standard input closes (its parent ended) or after
:data:`LIFETIME_S`.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from synapse_ha.core import commands as cmd
from synapse_ha.raft.replica import RaftReplica
from synapse_ha.security.tls import TlsFiles

LIFETIME_S = 120.0


def main(argv: list[str]) -> None:
    address, peers, data, ca, cert, key, status = argv
    files = TlsFiles(ca=Path(ca), cert=Path(cert), key=Path(key))
    replica = RaftReplica(address, peers.split(","), data, "", secure=True, raft_tls=files)
    stdin_closed = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()
        stdin_closed.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    committed = 0
    deadline = time.monotonic() + LIFETIME_S
    try:
        while not stdin_closed.is_set() and time.monotonic() < deadline:
            if replica.is_leader():
                try:
                    if replica.propose(cmd.Barrier(f"b{committed}")).result(2.0).ok:
                        committed += 1
                except Exception:  # leadership moved, a timeout: try again
                    pass
            report = {"leader": replica.is_leader(), "term": replica.term(), "committed": committed}
            staged = f"{status}.new"
            Path(staged).write_text(json.dumps(report))
            os.replace(staged, status)
            stdin_closed.wait(0.02)
    finally:
        replica.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
