"""Records a supervisor writes after its member started (``member.json``, ``exit.json``)
use room taken before the start, so a disk that fills up meanwhile cannot lose them."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from synapse_ha.worker import records
from tests.disks import needs_root, small_tmpfs


def test_a_reserved_record_appears_whole_under_its_name(tmp_path: Path) -> None:
    path = tmp_path / "exit.json"
    records.reserve(path)
    assert not path.exists()
    records.write_reserved(path, {"exit_code": 0, "detail": ""})
    assert json.loads(path.read_text()) == {"exit_code": 0, "detail": ""}
    assert not (tmp_path / "exit.json.reserved").exists()


def test_without_room_taken_it_is_an_ordinary_atomic_write(tmp_path: Path) -> None:
    path = tmp_path / "member.json"
    records.write_reserved(path, {"pid": 7})
    assert json.loads(path.read_text()) == {"pid": 7}
    too_big = {"detail": "x" * (records.RESERVED_BYTES + 1)}
    records.reserve(path)
    records.write_reserved(path, too_big)  # does not fit the room: written as usual
    assert json.loads(path.read_text()) == too_big


def fill_disk(path: Path) -> None:
    """Take every free byte of the file system ``path`` is on."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)


@needs_root
def test_a_full_disk_takes_no_reserved_record(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk", "256k") as disk:
        records.reserve(disk / "exit.json")
        fill_disk(disk / "fill")
        with pytest.raises(OSError, match="No space"):
            records.write_json_atomic(disk / "other.json", {"detail": "y" * 3000})
        records.write_reserved(disk / "exit.json", {"exit_code": 0, "detail": "z" * 3000})
        assert json.loads((disk / "exit.json").read_text())["exit_code"] == 0
