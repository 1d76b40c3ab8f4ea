"""Checkpoint marks from inside a gang member (docs/python.md, "Checkpoints").

:func:`checkpoint` appends a line (``step N``, or ``checkpoint`` without a step) to the
member's ``$SYNAPSE_CHECKPOINT_FILE`` and forces it to disk; the member's worker reports
it as the member's newest mark. :func:`resume_step` reads ``$SYNAPSE_RESUME_STEP``: the
step of the gang's newest mark of an earlier attempt. :func:`preempt_notice` reads the
notice a preempted member finds in ``$SYNAPSE_PREEMPT_FILE``. Outside a member they do
nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from synapse_ha.core.workflows.checkpoints import (
    CHECKPOINT_FILE_ENV,
    PREEMPT_FILE_ENV,
    RESUME_STEP_ENV,
)


def checkpoint(step: int | None = None, *, environ: Mapping[str, str] | None = None) -> bool:
    """Mark a checkpoint of this member, at ``step`` (a non-negative integer) or without
    one. Call it once the checkpoint is saved (every member of the gang marks; the gang's
    mark is the oldest of its members' newest). True when the mark was written; False
    outside a gang member (no ``$SYNAPSE_CHECKPOINT_FILE``), where it does nothing.
    Raises ValueError for a step that is not a non-negative integer, OSError when the
    file cannot be written."""
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    path = (os.environ if environ is None else environ).get(CHECKPOINT_FILE_ENV, "")
    if not path:
        return False
    line = "checkpoint\n" if step is None else f"step {step}\n"
    # Appended in one write and forced to disk: the worker reads the file's last line.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def resume_step(*, environ: Mapping[str, str] | None = None) -> int | None:
    """The step this member's gang resumes from (``$SYNAPSE_RESUME_STEP``: the step of
    its newest mark of an earlier attempt), or None (a first attempt, no mark with a
    step, or not a gang member)."""
    text = (os.environ if environ is None else environ).get(RESUME_STEP_ENV, "").strip()
    return int(text) if text.isdigit() else None


def preempt_notice(*, environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The notice of this member's preemption, or None while it is not preempted (and
    outside a gang member): ``{"kind": "reclaim" | "priority" | "fair_share", "preemptor": job id,
    "grace_ms": time left before SIGKILL when it was written, "checkpoint": True}``. Its
    worker writes it before SIGTERM, so a SIGTERM handler that finds it knows the gang is
    being preempted (not cancelled), is asked to save and mark a checkpoint, and will be
    requeued. A notice that cannot be read whole counts as none."""
    path = (os.environ if environ is None else environ).get(PREEMPT_FILE_ENV, "")
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            notice = json.load(f)
    except (OSError, ValueError):
        return None
    return notice if isinstance(notice, dict) else None
