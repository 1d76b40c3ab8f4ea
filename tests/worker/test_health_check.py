"""The health-check program: how a run is judged (exit, output line, timeout with its
process group killed), the thread that runs it, and its settings."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from synapse_ha.core.health.fitness import NodeCheck
from synapse_ha.programs.config_file import ConfigError
from synapse_ha.programs.worker_config import load_config
from synapse_ha.worker.check_output import failure_message, first_line
from synapse_ha.worker.health_check import HealthCheck, HealthCheckSettings, run_check
from tests.integration.cluster import wait_for

BASE = ["--insecure", "--scheduler", "127.0.0.1:1"]


def sh(script: str) -> tuple[str, ...]:
    return ("/bin/sh", "-c", script)


def test_a_zero_exit_passes() -> None:
    assert run_check(sh("echo all good"), 10) == NodeCheck("health-check", False, "")


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("echo; echo '  disk /scratch full  '; echo more; exit 1", "disk /scratch full"),
        ("echo 'ECC errors on GPU 2' >&2; exit 4", "ECC errors on GPU 2"),
        ("echo out; echo err >&2; exit 1", "out"),
        ("exit 3", "exited 3"),
        ("kill -9 $$", "killed by signal 9"),
        (f"printf '%0{400}d' 0; exit 1", "0" * 256),
    ],
)
def test_a_failing_run_says_its_first_line_or_how_it_ended(script: str, message: str) -> None:
    assert run_check(sh(script), 10) == NodeCheck("health-check", True, message)


def test_a_program_that_cannot_run_fails() -> None:
    result = run_check(("/nonexistent/health-check",), 10)
    assert result.failing and result.message.startswith("cannot run the health check")


def test_a_run_past_its_timeout_fails_and_its_process_group_is_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "child"
    script = f"sleep 60 & echo $! > {pidfile}; wait"
    result = run_check(sh(script), 0.5)
    assert result == NodeCheck("health-check", True, "timed out after 0.5s")
    child = int(pidfile.read_text())

    def dead() -> bool:
        """The background child was in the check's group: gone, or a zombie being reaped.
        (A process SIGKILL has reached shows as running while it exits, briefly; one that
        the kill missed sleeps for a minute.)"""
        try:
            return Path(f"/proc/{child}/stat").read_text().split(") ")[1][0] == "Z"
        except FileNotFoundError:
            return True

    wait_for("the check's background child to be killed", dead, timeout_s=5.0)


def test_output_lines_are_printable_and_bounded() -> None:
    assert first_line(b"\n  \n", b"bad \x1b[31mred\n") == "bad ?[31mred"
    assert first_line(b"", b"") == ""
    assert failure_message(None, 60, b"", b"") == "timed out after 60s"
    assert failure_message(2, 60, b"", b"\xff\xfe oops") == "\ufffd\ufffd oops"


def test_the_thread_runs_at_start_and_every_interval_and_says_when_it_changed() -> None:
    results = iter([NodeCheck("health-check", True, "bad")] + [NodeCheck("health-check")] * 100)
    changed = threading.Event()
    done = threading.Event()
    calls: list[float] = []

    def run(argv: tuple[str, ...], timeout_s: float, running: object) -> NodeCheck:
        calls.append(timeout_s)
        if len(calls) >= 3:
            done.set()
        return next(results)

    check = HealthCheck(HealthCheckSettings(("x",), 0.01, 7.0), changed.set, run)
    assert check.checks() == ()
    check.start()
    assert done.wait(10)
    check.stop()
    assert changed.is_set()
    assert check.checks() == (NodeCheck("health-check"),)
    assert set(calls) == {7.0}


def test_without_a_program_nothing_runs() -> None:
    check = HealthCheck(HealthCheckSettings())
    check.start()
    assert check.runs == 0 and check.checks() == ()


def test_settings_come_from_flags_and_the_file(tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path / "d")]
    assert not load_config([*BASE, *data]).health_check.enabled
    path = tmp_path / "w.toml"
    path.write_text(
        'health_check = "/opt/nhc --quick \'a b\'"\nhealth_check_interval = "2m"\n'
        'health_check_timeout = "30s"\n'
    )
    settings = load_config([*BASE, *data, "--config", str(path)]).health_check
    assert settings == HealthCheckSettings(("/opt/nhc", "--quick", "a b"), 120.0, 30.0)
    flags = load_config(
        [*BASE, *data, "--config", str(path), "--health-check", "/bin/true",
         "--health-check-timeout", "5s"]
    ).health_check  # fmt: skip
    assert flags == HealthCheckSettings(("/bin/true",), 120.0, 5.0)
    defaults = load_config([*BASE, *data, "--health-check", "/bin/true"]).health_check
    assert (defaults.interval_s, defaults.timeout_s) == (300.0, 60.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--health-check", "'unclosed"], "--health-check: No closing quotation"),
        (["--health-check-interval", "0s"], "--health-check-interval: must be more than 0"),
        (["--health-check-timeout", "2h"], "--health-check-timeout: must be more than 0 and at"),
        (["--health-check-timeout", "soon"], "--health-check-timeout"),
    ],
)
def test_bad_settings_name_the_flag(tmp_path: Path, argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config([*BASE, "--data-dir", str(tmp_path / "d"), *argv])


def test_checks_are_never_run_by_the_agent_thread() -> None:
    # The program runs in a thread of its own: the caller returns at once.
    gate = threading.Event()

    def run(argv: tuple[str, ...], timeout_s: float, running: object) -> NodeCheck:
        gate.wait(10)
        return NodeCheck("health-check")

    check = HealthCheck(HealthCheckSettings(("x",), 60, 60), run=run)
    check.start()
    assert check.checks() == ()
    gate.set()
    check.stop()


def test_a_stop_kills_the_run_under_way_and_records_nothing(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    script = f"echo $$ > {pidfile}; sleep 60"
    check = HealthCheck(HealthCheckSettings(sh(script), 60, 120))
    check.start()
    wait_for("the run to start", lambda: pidfile.exists() and pidfile.read_text().strip(), 10)
    check.stop()
    assert check._thread is not None
    check._thread.join(10)
    assert not check._thread.is_alive()  # the run ended at once, not after its timeout
    assert check.checks() == () and check.runs == 0
