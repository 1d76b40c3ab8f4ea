"""Hang detection (``progress:``): a member that stops touching its progress file (or
writing its log) for the job's timeout is stopped by its supervisor and reported hung;
one that keeps making progress runs on."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from synapse_ha.core.commands import ExitCause, MemberEventKind
from synapse_ha.core.desired import MemberKey
from synapse_ha.core.health.progress import Progress
from synapse_ha.core.model import JobSpec, Resources
from synapse_ha.rpc.from_proto import desired_from_proto
from synapse_ha.rpc.to_proto import desired_to_proto
from synapse_ha.worker.agent import _report
from synapse_ha.worker.environment import PROGRESS_FILE_ENV
from synapse_ha.worker.member_dirs import MemberExit
from synapse_ha.worker.members import Member, MemberExecutor
from synapse_ha.worker.progress import ProgressWatch, duration_text
from tests.worker.conftest import MakeExecutor
from tests.worker.helpers import Fifo, desired_member, process_gone, spec

TOUCH_THEN_STOP = (
    'for i in 1 2 3 4 5; do touch "$SYNAPSE_PROGRESS_FILE"; sleep 0.1; done; '
    "sleep 300 & echo $! > {fifo}; wait"
)
KEEP_TOUCHING = 'for i in $(seq 40); do touch "$SYNAPSE_PROGRESS_FILE"; sleep 0.1; done; exit 0'
STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


def finish(executor: MemberExecutor, member: Member, timeout_s: float = 20.0) -> MemberExit:
    assert member.shim is not None
    member.shim.wait(timeout=timeout_s)
    executor.poll()
    assert member.exit is not None
    return member.exit


# -------------------------------------------------------------- real members


def test_a_member_that_stops_touching_its_progress_file_is_stopped_and_reported_hung(
    make_executor: MakeExecutor, fifo: Fifo
) -> None:
    executor = make_executor()
    member = executor.start(spec(TOUCH_THEN_STOP.format(fifo=fifo.path), progress_timeout_ms=1000))
    child = int(fifo.read_line())
    exit_ = finish(executor, member)
    assert exit_.hung and not exit_.disrupted
    assert exit_.exit_code == 143  # SIGTERM through the usual stop path
    assert re.fullmatch(
        rf"no progress for 1s \(progress file not touched since {STAMP}\)", exit_.detail
    )
    assert process_gone(child)  # the whole process group is gone
    report = _report(member.key, MemberEventKind.EXITED, exit_)
    assert report.cause is ExitCause.HUNG
    assert report.detail == exit_.detail


def test_a_member_that_keeps_touching_its_progress_file_runs_to_its_end(
    make_executor: MakeExecutor,
) -> None:
    executor = make_executor()
    member = executor.start(spec(KEEP_TOUCHING, progress_timeout_ms=2000))
    exit_ = finish(executor, member)
    assert (exit_.exit_code, exit_.hung, exit_.detail) == (0, False, "")
    assert _report(member.key, MemberEventKind.EXITED, exit_).cause is ExitCause.PROGRAM


def test_with_source_log_a_member_whose_log_stops_growing_is_hung(
    make_executor: MakeExecutor,
) -> None:
    executor = make_executor()
    command = "for i in 1 2 3; do echo step $i; sleep 0.1; done; exec sleep 300"
    member = executor.start(spec(command, progress_timeout_ms=1000, progress_source="log"))
    exit_ = finish(executor, member)
    assert exit_.hung
    assert re.fullmatch(
        rf"no progress for 1s \(output log not written since {STAMP}\)", exit_.detail
    )
    assert "step 3" in (member.dir / "output.log").read_text()


def test_every_member_has_a_progress_file_watched_only_with_hang_detection(
    make_executor: MakeExecutor, tmp_path: Path
) -> None:
    executor = make_executor()
    out = tmp_path / "seen"
    var = f"${PROGRESS_FILE_ENV}"
    command = (
        f'echo "${{{PROGRESS_FILE_ENV}:-none}}" > {out}; '
        f'test -f "{var}" && wc -c < "{var}" >> {out}; true'
    )
    watched = executor.start(spec(command, progress_timeout_ms=60_000))
    finish(executor, watched)
    path, size = out.read_text().split()
    assert Path(path) == watched.dir / "progress"
    assert size == "0"  # created empty at start
    # Without hang detection the file is there too (for the member's pace), unwatched.
    plain = executor.start(spec(command, rank=1))
    finish(executor, plain)
    path, size = out.read_text().split()
    assert Path(path) == plain.dir / "progress" and size == "0"
    assert "progress_path" not in json.loads((plain.dir / "launch.json").read_text())


# ----------------------------------------------------------- the watch itself


def test_the_watch_counts_from_the_start_and_from_each_touch(tmp_path: Path) -> None:
    path = tmp_path / "progress"
    path.touch()
    os.utime(path, (1_000, 1_000))  # created before the member started
    watch = ProgressWatch(str(path), "file", 10_000, started_monotonic=0.0, started_wall=2_000.0)
    assert watch.hung(10.0) is None  # 10s since the start: not more than the timeout
    assert watch.hung(10.5) is None  # not looked at again before the interval passed
    detail = watch.hung(11.0)
    assert detail is not None
    assert detail.startswith(
        "no progress for 10s (progress file not touched since the member started"
    )
    watch = ProgressWatch(str(path), "file", 10_000, started_monotonic=0.0, started_wall=2_000.0)
    os.utime(path, (2_005, 2_005))  # touched: progress seen at the next look
    assert watch.hung(5.0) is None
    assert watch.hung(15.0) is None  # 10s since that look
    assert watch.hung(16.0) == (
        "no progress for 10s (progress file not touched since 1970-01-01T00:33:25Z)"
    )


def test_the_watch_looks_at_most_once_per_interval(tmp_path: Path) -> None:
    path = tmp_path / "progress"
    path.touch()
    watch = ProgressWatch(str(path), "file", 60_000, started_monotonic=0.0, started_wall=0.0)
    assert watch.interval_s == 1.0
    assert watch.hung(61.0) is not None
    assert watch.hung(61.5) is None  # not looked at again before the interval passed
    assert ProgressWatch(str(path), "file", 2_000, 0.0, 0.0).interval_s == 0.2


def test_a_launch_record_without_a_timeout_asks_for_no_watch() -> None:
    assert ProgressWatch.of_launch({"progress_timeout_ms": 0}, 0.0, 0.0) is None
    assert ProgressWatch.of_launch({}, 0.0, 0.0) is None


def test_timeouts_read_as_in_the_spec() -> None:
    texts = [duration_text(ms) for ms in (10_000, 1_800_000, 5_400_000, 7_200_000, 1_500)]
    assert texts == ["10s", "30m", "1h30m", "2h", "1.5s"]


# ----------------------------------------------------------------- the wire


def test_the_desired_member_carries_the_hang_detection_to_the_worker() -> None:
    job = JobSpec(
        name="t",
        replicas=1,
        resources=Resources(),
        command=("x",),
        progress=Progress(1_800_000, "log"),
    )
    desired = desired_member(job)
    msg = desired_to_proto(desired)
    assert (msg.progress_timeout_ms, msg.progress_source) == (1_800_000, "log")
    back = desired_from_proto(msg)
    assert (back.spec.progress_timeout_ms, back.spec.progress_source) == (1_800_000, "log")
    assert back.key == MemberKey("job-1", 1, 0)
    plain = desired_from_proto(
        desired_to_proto(desired_member(job.__class__("t", 1, Resources(), ("x",))))
    )
    assert plain.spec.progress_timeout_ms == 0
