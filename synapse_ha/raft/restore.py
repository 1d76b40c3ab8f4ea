"""Restoring a backup: the snapshot a new one-replica cluster starts from.

The restored replica loads the snapshot at start and, alone, leads at once; the members
added to it afterwards receive this snapshot from it.
"""

from __future__ import annotations

import os

from synapse_ha.core.model import ClusterState
from synapse_ha.raft.snapshot_file import LogEntry, SnapshotMember, write_snapshot


class RestoreError(Exception):
    """A data directory a backup cannot be restored into; the message says why."""


# The command byte of a Raft no-op entry (pysyncobj's _COMMAND_TYPE.NO_OP).
_NO_OP_ENTRY = b"\x01"


def seed_restored_state(
    data_dir: str, state: ClusterState, raft_index: int, me: SnapshotMember
) -> None:
    """Write the snapshot a new one-replica cluster starts from: ``state`` as of
    ``raft_index``, with ``me`` as its only member. The data directory must hold no
    journal and no snapshot. The replica loads it at start and, alone, leads at once;
    the members added to it afterwards receive this snapshot from it (their logs hold
    nothing this old)."""
    journal = os.path.join(data_dir, "raft.journal")
    dump = os.path.join(data_dir, "raft.dump")
    used = [p for p in (journal, dump) if os.path.exists(p)]
    if used:
        raise RestoreError(
            f"{data_dir} already holds a replica's data ({', '.join(used)}); restore into "
            "an empty data directory"
        )
    os.makedirs(data_dir, exist_ok=True)
    # Index at least 3: a fresh member's log holds index 1 only, so the leader must send
    # it the snapshot rather than entries.
    index = max(raft_index, 3)
    entries: tuple[LogEntry, LogEntry] = ((_NO_OP_ENTRY, index, 0), (_NO_OP_ENTRY, index - 1, 0))
    write_snapshot(dump, state, entries, [me])
