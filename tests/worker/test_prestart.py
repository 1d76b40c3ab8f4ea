"""A job's pre-start check, run by the member's supervisor before the member: exit 0
starts the member; a failure or a timeout never runs it and is the node's fault, with
the check's first output line; a stop cuts it short."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from synapse_ha.core.commands import ExitCause, MemberEventKind
from synapse_ha.core.desired import DesiredMember
from synapse_ha.core.health.prestart import Prestart
from synapse_ha.worker.agent import _report
from synapse_ha.worker.member_dirs import MemberExit
from synapse_ha.worker.members import Member, MemberExecutor
from synapse_ha.worker.shim import EXIT_PRESTART_FAILED
from synapse_ha.worker.shim_prestart import FAILED, run_prestart
from tests.integration.cluster import wait_for
from tests.worker.conftest import MakeExecutor
from tests.worker.helpers import spec


def with_prestart(member: DesiredMember, command: str, timeout_ms: int = 10_000) -> DesiredMember:
    launch = dataclasses.replace(member.spec, prestart=Prestart((command,), True, timeout_ms))
    return dataclasses.replace(member, spec=launch)


def finish(executor: MemberExecutor, member: Member) -> MemberExit:
    assert member.shim is not None
    member.shim.wait(timeout=20)
    executor.poll()
    assert member.exit is not None
    return member.exit


def test_a_passing_check_runs_as_the_member_would_and_the_member_starts(
    make_executor: MakeExecutor, tmp_path: Path
) -> None:
    executor = make_executor()
    seen = tmp_path / "seen"
    check = f'echo "$HF_HOME $SYNAPSE_JOB_ID $(pwd)" > {seen}'
    member = executor.start(
        with_prestart(
            spec("echo member ran", env=(("HF_HOME", "/data/hf"),), workdir=str(tmp_path)), check
        )
    )
    result = finish(executor, member)
    assert (result.exit_code, result.node_fault) == (0, False)
    assert seen.read_text().split() == ["/data/hf", "job-1", str(tmp_path)]
    assert "member ran" in (member.dir / "output.log").read_text()


def test_a_failing_check_never_runs_the_member_and_is_the_nodes_fault(
    make_executor: MakeExecutor, tmp_path: Path
) -> None:
    executor = make_executor()
    marker = tmp_path / "ran"
    member = executor.start(
        with_prestart(spec(f"touch {marker}"), "echo; echo 'no /data mount' >&2; exit 2")
    )
    result = finish(executor, member)
    assert result.exit_code == EXIT_PRESTART_FAILED
    assert result.node_fault and not result.disrupted
    assert result.detail == "prestart check failed: no /data mount"
    assert not marker.exists()
    assert "prestart check failed: no /data mount" in (member.dir / "output.log").read_text()
    report = _report(member.key, MemberEventKind.EXITED, result)
    assert report.cause is ExitCause.NODE_CANNOT_RUN


def test_a_check_past_its_timeout_fails_with_how_it_ended(make_executor: MakeExecutor) -> None:
    executor = make_executor()
    member = executor.start(with_prestart(spec("true"), "sleep 60", timeout_ms=300))
    result = finish(executor, member)
    assert result.node_fault
    assert result.detail == "prestart check failed: timed out after 0.3s"


def test_a_silent_failure_says_its_exit_code(make_executor: MakeExecutor) -> None:
    executor = make_executor()
    member = executor.start(with_prestart(spec("true"), "exit 3"))
    assert finish(executor, member).detail == "prestart check failed: exited 3"


def test_a_stop_cuts_a_running_check_short(make_executor: MakeExecutor, tmp_path: Path) -> None:
    executor = make_executor()
    started = tmp_path / "started"
    member = executor.start(
        with_prestart(spec("true"), f"touch {started}; sleep 60", timeout_ms=120_000)
    )
    wait_for("the check to start", started.exists, 10)
    executor.stop(member.key)
    result = finish(executor, member)
    assert not result.node_fault
    assert result.exit_code == 143
    assert result.detail.endswith("(during its prestart check)")


def _failing_step(step_write: int) -> Callable[[], None]:
    def before_exec() -> None:
        os.write(step_write, b"cwd")
        raise OSError("refused")

    return before_exec


@pytest.mark.parametrize(
    ("argv", "before_exec", "said"),
    [
        (["/nonexistent/check"], lambda step_write: lambda: None, "FileNotFoundError"),
        (["/bin/true"], _failing_step, "cwd"),
    ],
)
def test_a_check_that_cannot_start_says_the_step_that_failed_or_the_error(
    tmp_path: Path,
    argv: list[str],
    before_exec: Callable[[int], Callable[[], None]],
    said: str,
) -> None:
    record = {"argv": argv, "env": {}, "timeout_s": 5.0}
    outcome = run_prestart(record, str(tmp_path), before_exec, lambda: "")
    assert outcome == (FAILED, f"could not run it ({said})")
