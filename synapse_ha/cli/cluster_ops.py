"""``synctl cluster add-replica | remove-replica | snapshot save | snapshot check``.

Membership changes and backups, for admins. Each is one call to the leader (found by the
client); refusals come back with a reason (``CHANGE_IN_FLIGHT``, ``WOULD_LOSE_QUORUM``,
``REPLICA_EXISTS``, ``REPLICA_NOT_FOUND``, ``LAST_REPLICA``; docs/errors.md) and end the
command with its sentence and exit code 1 (4 for an unknown replica).

A backup is written to a temporary file next to FILE and renamed into place once its
size and SHA-256 are checked, so FILE is either the whole backup or untouched.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from synapse_ha.cli.app import CommandFailed, Settings, emit, note, output_option, with_settings
from synapse_ha.cli.defaults import ExitCode
from synapse_ha.cli.render import table
from synapse_ha.client import replicas
from synapse_ha.client.replicas import ReplicaMember
from synapse_ha.core.codec.backup import BackupError, decode_backup, encode_backup

# Membership changes wait for their commit; a backup may be large.
CHANGE_TIMEOUT_S = 30.0
SNAPSHOT_TIMEOUT_S = 300.0


def members_document(members: Sequence[ReplicaMember]) -> dict[str, Any]:
    return {
        "members": [
            {
                "id": m.replica_id,
                "raft_address": m.raft_address,
                "grpc_address": m.grpc_address,
                "live": m.live,
            }
            for m in members
        ]
    }


def members_table(doc: dict[str, Any]) -> str:
    rows = [
        [m["id"], m["raft_address"], m["grpc_address"], "yes" if m["live"] else "no"]
        for m in doc["members"]
    ]
    return table(rows, ["REPLICA", "RAFT", "GRPC", "LIVE"])


@click.command("add-replica")
@click.argument("replica_id")
@click.argument("raft_address")
@click.argument("grpc_address")
@output_option
@with_settings
def add_replica(settings: Settings, replica_id: str, raft_address: str, grpc_address: str) -> None:
    """Add replica REPLICA_ID, whose Raft listens on RAFT_ADDRESS and gRPC API on
    GRPC_ADDRESS (host:port each). One change at a time; refused when the cluster
    would not keep a live majority. Then start the new replica with --join (any
    order works: it catches up from the leader).

    \b
    Example:
      synctl ca issue replica r4 --host 10.0.0.4
      synctl cluster add-replica r4 10.0.0.4:7001 10.0.0.4:7101
    """
    answer = replicas.add_replica(
        settings.client(),
        replica_id,
        raft_address,
        grpc_address,
        timeout_s=max(settings.timeout, 10.0),
    )
    note(f"added {replica_id}; start it with --join if it is not running yet")
    document = members_document(answer)
    emit(settings, document, lambda: members_table(document))


@click.command("remove-replica")
@click.argument("replica_id")
@output_option
@with_settings
def remove_replica(settings: Settings, replica_id: str) -> None:
    """Remove replica REPLICA_ID from the cluster, then stop it. Removing a replica
    that is down is always allowed while a majority of the others is live; removing
    a live one while another is down is refused. Removing the leader first moves
    leadership to another replica.

    \b
    Example:
      synctl cluster remove-replica r1
    """
    answer = replicas.remove_replica(
        settings.client(), replica_id, timeout_s=max(settings.timeout, 10.0)
    )
    note(f"removed {replica_id}; stop its synapse-scheduler process now")
    document = members_document(answer)
    emit(settings, document, lambda: members_table(document))


@click.group("snapshot")
def snapshot() -> None:
    """Back up the cluster state, and check a backup file.

    \b
    Example:
      synctl cluster snapshot save backup.snap
      synctl cluster snapshot check backup.snap
    """


@snapshot.command("save")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@output_option
@with_settings
def snapshot_save(settings: Settings, file: Path) -> None:
    """Save a consistent copy of the leader's state to FILE, with its Raft index and
    a SHA-256 checksum in the file's header. Restore it with
    `synapse-scheduler --restore FILE` on the first replica of a new cluster.

    \b
    Example:
      synctl cluster snapshot save /var/backups/synapse-$(date +%F).snap
    """
    try:
        head, data = replicas.save_snapshot(
            settings.client(), timeout_s=max(settings.timeout, SNAPSHOT_TIMEOUT_S)
        )
    except ValueError as exc:
        raise CommandFailed(ExitCode.JOB_FAILED, str(exc), "CORRUPT_TRANSFER") from None
    content = encode_backup(data, head.raft_index, head.raft_term, head.replica_id)
    _write_atomically(file, content)
    document = {
        "file": str(file),
        "raft_index": head.raft_index,
        "raft_term": head.raft_term,
        "replica": head.replica_id,
        "bytes": head.total_bytes,
        "sha256": head.sha256,
    }
    emit(settings, document, lambda: _saved_line(document))


@snapshot.command("check")
@click.argument("file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@output_option
@with_settings
def snapshot_check(settings: Settings, file: Path) -> None:
    """Check that FILE is an intact backup this release can restore (no cluster is
    contacted).

    \b
    Example:
      synctl cluster snapshot check backup.snap
    """
    try:
        backup = decode_backup(file.read_bytes())
    except BackupError as exc:
        raise CommandFailed(ExitCode.JOB_FAILED, f"{file}: {exc}", "CORRUPT_BACKUP") from None
    header = backup.header
    document = {
        "file": str(file),
        "raft_index": header.raft_index,
        "raft_term": header.raft_term,
        "replica": header.replica_id,
        "bytes": header.size,
        "sha256": header.sha256,
        "jobs": len(backup.state.jobs),
        "nodes": len(backup.state.nodes),
    }
    emit(
        settings,
        document,
        lambda: (
            f"{_saved_line(document)}; intact: {document['jobs']} jobs, {document['nodes']} nodes"
        ),
    )


def add_cluster_commands(group: click.Group) -> None:
    """Attach the subcommands to the ``synctl cluster`` group."""
    for command in (add_replica, remove_replica, snapshot):
        group.add_command(command)


def _saved_line(doc: dict[str, Any]) -> str:
    return (
        f"{doc['file']}: raft index {doc['raft_index']} (term {doc['raft_term']}) from "
        f"{doc['replica']}, {doc['bytes']} bytes, sha256 {doc['sha256']}"
    )


def _write_atomically(path: Path, content: bytes) -> None:
    tmp = path.with_name(f".{path.name}.partial")
    with open(tmp, "wb") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
