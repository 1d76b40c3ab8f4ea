"""Members' pace read from their progress files (worker/pace.py): new lines only, a
bounded read per look, malformed lines ignored, the median over the window."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from synapse_ha.core.desired import MemberKey
from synapse_ha.core.health.slowness import PaceReport
from synapse_ha.worker import pace
from synapse_ha.worker.pace import PaceWatches, parse_pace

KEY = MemberKey("job-000001", 7, 2)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def watched(tmp_path: Path, window_s: float = 300.0) -> tuple[PaceWatches, Path, Clock]:
    path = tmp_path / "progress"
    path.touch()
    clock = Clock()
    watches = PaceWatches(clock, window_s)
    watches.watch(KEY, path)
    return watches, path, clock


def append(path: Path, text: str | bytes) -> None:
    with path.open("ab") as f:
        f.write(text.encode() if isinstance(text, str) else text)


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        (b'{"step": 120, "step_ms": 812.5}', (812_500, "")),
        (b'{"step_ms": 3, "peers": "stage-2"}', (3_000, "stage-2")),
        (b'{"step_ms": 0.0001}', (1, "")),
        (b"", None),
        (b"step 120", None),
        (b"{not json", None),
        (b"[1, 2]", None),
        (b'{"step": 1}', None),
        (b'{"step_ms": "812"}', None),
        (b'{"step_ms": true}', None),
        (b'{"step_ms": 0}', None),
        (b'{"step_ms": -5}', None),
        (b'{"step_ms": 1e300}', None),
        (b'{"step_ms": NaN}', None),
        (b'{"step_ms": 5, "step": -1}', None),
        (b'{"step_ms": 5, "step": 1.5}', None),
        (b'{"step_ms": 5, "peers": 3}', None),
        (b'{"step_ms": 5, "peers": "' + b"x" * 40 + b'"}', None),
        (b'\xff\xfe{"step_ms": 5}', None),
    ],
)
def test_a_pace_line_and_what_is_not_one(line: bytes, parsed: tuple[int, str] | None) -> None:
    assert parse_pace(line) == parsed


def test_the_median_of_the_lines_in_the_window_is_reported(tmp_path: Path) -> None:
    watches, path, clock = watched(tmp_path, window_s=60)
    assert watches.poll([KEY]) == []  # touched only: nothing to report
    append(path, '{"step": 1, "step_ms": 800}\n{"step": 2, "step_ms": 900}\n')
    append(path, 'garbage\n{"step": 3, "step_ms": 5000}\n{"step":4,"step_ms":810}\n')
    assert watches.poll([KEY]) == [PaceReport("job-000001", 7, 2, 810_000, 4)]
    clock.now += 61  # the window moved past them; nothing new
    assert watches.poll([KEY]) == []
    append(path, '{"step": 5, "step_ms": 700, "peers": "stage-1"}\n')
    assert watches.poll([KEY]) == [PaceReport("job-000001", 7, 2, 700_000, 1, "stage-1")]


def test_only_new_complete_lines_are_read_and_a_partial_one_waits(tmp_path: Path) -> None:
    watches, path, _ = watched(tmp_path)
    append(path, '{"step_ms": 100}\n{"step_ms": 2')
    assert watches.poll([KEY])[0].steps == 1
    append(path, "00}\n")
    (report,) = watches.poll([KEY])
    assert (report.steps, report.step_us) == (2, 100_000)  # 100 and 200: the lower middle


def test_a_far_ahead_member_is_read_from_its_newest_bytes_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pace, "READ_BYTES", 200)
    watches, path, _ = watched(tmp_path)
    append(path, "".join(f'{{"step": {i}, "step_ms": 500}}\n' for i in range(1000)))
    append(path, '{"step": 1000, "step_ms": 900}\n')
    (report,) = watches.poll([KEY])
    assert report.steps < 10  # at most 200 bytes read, whatever the backlog
    assert report.step_us == 500_000


def test_a_long_line_without_an_end_is_skipped(tmp_path: Path) -> None:
    watches, path, _ = watched(tmp_path)
    append(path, b"x" * (pace.MAX_LINE + 10))
    assert watches.poll([KEY]) == []
    append(path, b'yyy\n{"step_ms": 40}\n')
    assert watches.poll([KEY]) == [PaceReport("job-000001", 7, 2, 40_000, 1)]


def test_a_rewritten_gone_or_replaced_file_is_no_crash(tmp_path: Path) -> None:
    watches, path, _ = watched(tmp_path)
    append(path, '{"step_ms": 40}\n{"step_ms": 40}\n')
    assert watches.poll([KEY])[0].steps == 2
    path.write_text('{"step_ms": 60}\n')  # truncated and written again
    assert watches.poll([KEY])[0].steps == 3
    path.unlink()
    assert watches.poll([KEY])[0].steps == 3  # what was seen stays for the window
    os.symlink("/etc/hostname", path)
    assert watches.poll([KEY])[0].steps == 3  # a link is never followed
    watches.forget(KEY)
    assert watches.poll([KEY]) == []
