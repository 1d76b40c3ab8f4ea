"""Composition roots: the synapse-scheduler and synapse-worker programs.

Importing this package loads gRPC with its fork handlers turned off. Those handlers
(``pthread_atfork``) can freeze a process that forks while other threads use gRPC: the
forking thread holds the interpreter lock inside ``fork()`` and the handler waits for
gRPC's threads, which wait for that lock. A replica forks to write every snapshot
(:mod:`synapse_ha.raft.snapshot_file`), under load, and its child never touches gRPC; with the
handlers on, a replica froze for good (no answer, no Raft heartbeat, not even to SIGTERM)
within seconds of a submission stream. gRPC reads ``GRPC_ENABLE_FORK_SUPPORT`` once, when
it is first imported, so the variable is set for that import only: the programs' children
(members of user jobs among them) inherit the environment as it was.
"""

import os
import sys
import warnings

GRPC_FORK_VARIABLE = "GRPC_ENABLE_FORK_SUPPORT"


def _load_grpc_without_fork_handlers() -> None:
    if "grpc" in sys.modules:
        warnings.warn(
            "grpc was imported before synapse_ha.programs: its fork handlers stay on, and a "
            "replica that forks a snapshot writer may freeze",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    previous = os.environ.get(GRPC_FORK_VARIABLE)
    os.environ[GRPC_FORK_VARIABLE] = "false"
    try:
        import grpc  # noqa: F401
    finally:
        if previous is None:
            del os.environ[GRPC_FORK_VARIABLE]
        else:
            os.environ[GRPC_FORK_VARIABLE] = previous


_load_grpc_without_fork_handlers()
