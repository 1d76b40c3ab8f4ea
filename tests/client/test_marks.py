"""``synapse_ha.client.checkpoint``, ``resume_step`` and ``preempt_notice``: a gang
member's checkpoint marks and its preemption notice, and nothing at all outside a member."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from synapse_ha.client import checkpoint, preempt_notice, resume_step
from synapse_ha.worker.checkpoint_files import last_line, parse_step


def test_outside_a_member_nothing_is_written() -> None:
    assert checkpoint(5, environ={}) is False
    assert resume_step(environ={}) is None


def test_each_mark_is_a_line_the_worker_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    path.touch()
    env = {"SYNAPSE_CHECKPOINT_FILE": str(path)}
    assert checkpoint(1200, environ=env) is True
    assert parse_step(last_line(path.read_bytes())) == 1200
    assert checkpoint(environ=env) is True
    assert path.read_text() == "step 1200\ncheckpoint\n"
    assert parse_step(last_line(path.read_bytes())) is None


@pytest.mark.parametrize("step", [-1, 1.5, True, "12"])
def test_a_step_that_is_not_a_non_negative_integer_is_refused(step: object, tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    path.touch()
    with pytest.raises(ValueError, match="step must be a non-negative integer"):
        checkpoint(step, environ={"SYNAPSE_CHECKPOINT_FILE": str(path)})  # type: ignore[arg-type]
    assert path.read_text() == ""


def test_a_missing_file_or_a_link_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        checkpoint(3, environ={"SYNAPSE_CHECKPOINT_FILE": str(tmp_path / "gone")})
    target = tmp_path / "target"
    target.touch()
    os.symlink(target, tmp_path / "link")
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        checkpoint(3, environ={"SYNAPSE_CHECKPOINT_FILE": str(tmp_path / "link")})
    assert target.read_text() == ""


def test_the_resume_step_is_read_as_a_number() -> None:
    assert resume_step(environ={"SYNAPSE_RESUME_STEP": "1200"}) == 1200
    assert resume_step(environ={"SYNAPSE_RESUME_STEP": " 7\n"}) == 7
    assert resume_step(environ={"SYNAPSE_RESUME_STEP": "soon"}) is None


def test_the_preempt_notice_is_none_until_the_worker_writes_it(tmp_path: Path) -> None:
    path = tmp_path / "preempt.json"
    env = {"SYNAPSE_PREEMPT_FILE": str(path)}
    assert preempt_notice(environ={}) is None
    assert preempt_notice(environ=env) is None  # not preempted: the file does not exist
    path.write_text('{"kind": "priority", "preem')  # torn: never read as a notice
    assert preempt_notice(environ=env) is None
    path.write_text('["not", "a", "notice"]')
    assert preempt_notice(environ=env) is None
    doc = {"kind": "priority", "preemptor": "job-000007", "grace_ms": 5000, "checkpoint": True}
    path.write_text(json.dumps(doc))
    assert preempt_notice(environ=env) == doc
