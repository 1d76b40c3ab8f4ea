"""Hang detection of a job's members (DESIGN §6, ``progress:``): the job's setting.

A job with ``progress: {timeout: 30m}`` asks every worker that runs one of its members to
watch that member's progress: its ``$SYNAPSE_PROGRESS_FILE`` (``source: file``, the
default), which the member touches whenever it makes progress, or its output log
(``source: log``), which grows as it prints. A member whose last progress (the newest of
its start and that file's modification time) is older than ``timeout`` is hung: its
worker stops its process group and reports the exit with cause ``hung``, a failure of the
program that counts against ``retries.max`` (:mod:`synapse_ha.core.machine.reports`).

The limits are rules of :mod:`synapse_ha.core.spec.validation`; this module holds the value.
"""

from __future__ import annotations

from dataclasses import dataclass

# Where a member's progress is read from.
SOURCE_FILE = "file"  # the modification time of $SYNAPSE_PROGRESS_FILE
SOURCE_LOG = "log"  # the modification time of the member's output log
SOURCES = (SOURCE_FILE, SOURCE_LOG)


@dataclass(frozen=True, slots=True)
class Progress:
    """How long a member may go without progress (``timeout_ms``), and where its
    progress is read from (``source``: one of :data:`SOURCES`)."""

    timeout_ms: int
    source: str = SOURCE_FILE
