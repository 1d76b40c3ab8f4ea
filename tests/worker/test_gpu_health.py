"""The worker's GPU health: the Xid table and its overrides, the sticky record, the mock
fault file, the monitor's thread and its configuration."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from synapse_ha.core.health.fitness import GpuFault
from synapse_ha.programs.config_file import ConfigError
from synapse_ha.programs.worker_config import load_config
from synapse_ha.worker.gpu_faults import HealthRecord
from synapse_ha.worker.gpu_health import (
    GpuHealthMonitor,
    GpuHealthSettings,
    MockFaultFile,
    health_monitor,
    parse_mock_line,
)
from synapse_ha.worker.xid import XidAction, XidTable, parse_xid_actions

BASE = ["--insecure", "--scheduler", "127.0.0.1:1"]


def record(gpus: int = 4, overrides: tuple[tuple[int, XidAction], ...] = ()) -> HealthRecord:
    return HealthRecord(gpus, XidTable(overrides))


# ------------------------------------------------------------------- Xid table


def test_the_xid_table_takes_hardware_xids_out_and_reports_application_ones() -> None:
    table = XidTable()
    for xid in (48, 63, 64, 74, 79, 92, 94, 95, 119, 120):
        assert table.entry(xid).action is XidAction.UNHEALTHY, xid
    for xid in (13, 31, 43, 45):
        assert table.entry(xid).action is XidAction.REPORT, xid
    assert table.entry(4242).action is XidAction.REPORT  # unknown: not fatal


def test_overrides_change_an_entry_and_add_codes() -> None:
    overrides = parse_xid_actions({"13": "unhealthy", "79": "report", "500": "unhealthy"}, "t")
    table = XidTable(overrides)
    assert table.entry(13).action is XidAction.UNHEALTHY
    assert table.entry(79).action is XidAction.REPORT
    assert table.entry(79).name == "GPU has fallen off the bus"
    assert {13, 500} <= table.unhealthy() and 79 not in table.unhealthy()
    assert parse_xid_actions(["31=unhealthy", "13 = report"], "--xid-action") == (
        (13, XidAction.REPORT),
        (31, XidAction.UNHEALTHY),
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"13": "fatal"}, r"gpu_health\.xid_actions\.13: the action must be 'unhealthy' or"),
        ({"x13": "report"}, r"gpu_health\.xid_actions\.x13: 'x13' is not an Xid"),
        ({"0": "report"}, r"is not an Xid \(a number from 1 to 65535\)"),
        (["13"], r"--xid-action: '13' is not XID=ACTION"),
    ],
)
def test_a_bad_override_is_a_config_error_naming_the_key_and_the_rule(
    tmp_path: Path, value: object, message: str
) -> None:
    if isinstance(value, dict):
        body = ", ".join(f'"{k}" = "{v}"' for k, v in value.items())
        path = tmp_path / "w.toml"
        path.write_text(f"[gpu_health]\nxid_actions = {{{body}}}\n")
        argv = ["--config", str(path)]
    else:
        argv = [f"--xid-action={v}" for v in value]  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=message):
        load_config([*BASE, "--data-dir", str(tmp_path / "d"), *argv])


def test_gpu_health_settings_come_from_the_file_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "w.toml"
    path.write_text(
        'mock_gpus = 4\nmock_gpu_faults = "faults"\n'
        '[gpu_health]\npoll_interval = "2s"\nxid_actions = {"13" = "unhealthy"}\n'
    )
    argv = [*BASE, "--data-dir", str(tmp_path / "d"), "--config", str(path)]
    settings = load_config(argv).gpu_health
    assert settings.enabled and settings.poll_interval_s == 2.0
    assert settings.xid_actions == ((13, XidAction.UNHEALTHY),)
    assert settings.mock_faults == Path("faults").absolute()
    flags = load_config([*argv, "--xid-action", "79=report", "--no-gpu-health"]).gpu_health
    assert flags.xid_actions == ((79, XidAction.REPORT),) and not flags.enabled
    with pytest.raises(ConfigError, match="--mock-gpu-faults needs --mock-gpus"):
        load_config([*BASE, "--data-dir", str(tmp_path / "d"), "--mock-gpu-faults", "f"])


def test_the_boot_id_is_read_from_the_machine_or_the_given_file(tmp_path: Path) -> None:
    argv = [*BASE, "--data-dir", str(tmp_path / "d")]
    machine = load_config(argv).gpu_health
    assert machine.boot_id_file == Path("/proc/sys/kernel/random/boot_id")
    boot = tmp_path / "boot_id"
    boot.write_text("0a64b61b-2afc-4c8f-b2d9-9706274ebd5b\n")
    given = load_config([*argv, "--boot-id-file", str(boot)]).gpu_health
    assert given.boot_id() == "0a64b61b-2afc-4c8f-b2d9-9706274ebd5b"
    boot.unlink()
    assert given.boot_id() == ""  # unreadable: not said
    assert load_config([*argv, "--boot-id-file", ""]).gpu_health.boot_id_file is None


# -------------------------------------------------------------------- the record


def test_faults_are_sticky_one_per_gpu_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    r = record()
    with caplog.at_level(logging.WARNING, logger="synapse.worker.gpu_health"):
        assert r.saw_xid(2, 79) == GpuFault(2, "xid-79", "Xid 79: GPU has fallen off the bus")
        assert r.saw_xid(2, 79) is None
        assert r.saw(2, "ecc-dbe", "double-bit") is None
        assert r.saw(2, "ecc-dbe", "double-bit") is None
        assert r.saw_xid(1, 13) is None  # application Xid: reported only
        assert r.saw(0, "lost", "x" * 255 + "\x00" + "y" * 100) is not None
        assert r.saw(7, "lost", "no such GPU") is None
    assert [(f.gpu, f.code) for f in r.faults()] == [(0, "lost"), (2, "xid-79")]
    assert len(r.faults()[0].detail) == 256 and r.faults()[0].detail.isprintable()
    unhealthy = [m for m in caplog.messages if "is unhealthy" in m]
    assert unhealthy == [
        "GPU 2 is unhealthy: xid-79 (Xid 79: GPU has fallen off the bus)",
        f"GPU 0 is unhealthy: lost ({'x' * 255}?)",
    ]
    assert sum("also reported ecc-dbe" in m for m in caplog.messages) == 1
    assert any("GPU 1 reported Xid 13" in m and "not fatal" in m for m in caplog.messages)
    assert any("ignored lost on GPU 7" in m for m in caplog.messages)


# ------------------------------------------------------------ the mock fault file


def test_mock_lines_parse_or_say_what_is_wrong() -> None:
    assert parse_mock_line("3 xid 79\n") is not None
    assert parse_mock_line("  # a comment") is None and parse_mock_line("") is None
    for bad, why in (
        ("x xid 79", "'x' is not a GPU index"),
        ("3 xid seventy", "'seventy' is not an Xid number"),
        ("3 xid", "expected '<gpu> xid <code>'"),
        ("3 melted", "or '<gpu> ecc-dbe|lost|retired-pages|remap-failed|nvlink'"),
        ("3 lost now", "expected"),
    ):
        with pytest.raises(ValueError, match=re.escape(why)):
            parse_mock_line(bad)


def test_appended_lines_are_seen_and_malformed_ones_ignored_with_their_line_number(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "faults"
    path.write_text("0 xid 79\n")  # before the start: a previous life's
    r = record()
    reader = MockFaultFile(path, r)
    assert reader.read_new() == 0 and r.faults() == ()
    with path.open("a") as f:
        f.write("1 xid 48\nbogus line\n9 lost\n2 xid 13\n# note\n3 ecc-dbe\n")
    with caplog.at_level(logging.WARNING, logger="synapse.worker.gpu_health"):
        assert reader.read_new() == 2
    assert [(f.gpu, f.code) for f in r.faults()] == [(1, "xid-48"), (3, "ecc-dbe")]
    assert r.faults()[0].detail == "Xid 48: double-bit ECC error (mock fault, line 2)"
    assert any(f"{path} line 3 ignored" in m for m in caplog.messages)
    assert any(f"{path} line 4 ignored: this node has no GPU 9" in m for m in caplog.messages)
    with path.open("a") as f:
        f.write("2 remap-")
    assert reader.read_new() == 0  # half a line: not yet
    with path.open("a") as f:
        f.write("failed")
    assert reader.read_new() == 0
    assert reader.read_new() == 1  # unchanged for one read: the line counts
    assert r.faults()[1] == GpuFault(2, "remap-failed", "row remapping failed (mock fault, line 8)")


def test_a_missing_file_is_waited_for_and_read_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "later"
    r = record()
    reader = MockFaultFile(path, r)
    assert reader.read_new() == 0
    path.write_text("0 lost\n1 nvlink\n")
    assert reader.read_new() == 2
    path.write_text("2 lost\n")  # rewritten shorter: read from its start
    assert reader.read_new() == 1
    (tmp_path / "new").write_text("# replaced\n3 retired-pages\n")
    (tmp_path / "new").rename(path)  # another file: read from its start
    assert reader.read_new() == 1
    assert [f.code for f in r.faults()] == ["lost", "nvlink", "lost", "retired-pages"]


# ------------------------------------------------------------------- the monitor


@pytest.fixture
def monitors() -> Iterator[list[GpuHealthMonitor]]:
    made: list[GpuHealthMonitor] = []
    yield made
    for m in made:
        m.stop()


def wait_faults(monitor: GpuHealthMonitor, n: int, timeout_s: float = 5.0) -> tuple[GpuFault, ...]:
    deadline = time.monotonic() + timeout_s
    while len(monitor.faults()) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    return monitor.faults()


def test_the_monitor_tails_the_file_in_its_thread_and_stops_in_bounded_time(
    tmp_path: Path, monitors: list[GpuHealthMonitor]
) -> None:
    path = tmp_path / "faults"
    settings = GpuHealthSettings(mock_faults=path, xid_actions=((13, XidAction.UNHEALTHY),))
    monitor = health_monitor(settings, 4, mock_gpus=True, load_nvml=lambda: None)
    monitors.append(monitor)
    monitor.start()
    path.write_text("3 xid 13\n")
    appended = time.monotonic()
    assert [(f.gpu, f.code) for f in wait_faults(monitor, 1)] == [(3, "xid-13")]
    assert time.monotonic() - appended < 1.0
    started = time.monotonic()
    assert monitor.stop() is True
    assert time.monotonic() - started < 1.0
    assert not any(t.name == "gpu-health" and t.is_alive() for t in threading.enumerate())


def test_without_a_file_no_gpus_or_when_disabled_there_is_nothing_to_watch() -> None:
    for settings, gpus, mock in (
        (GpuHealthSettings(), 4, True),
        (GpuHealthSettings(mock_faults=Path("/nonexistent")), 0, True),
        (GpuHealthSettings(enabled=False), 8, False),
    ):
        monitor = health_monitor(settings, gpus, mock_gpus=mock, load_nvml=lambda: None)
        monitor.start()
        assert monitor.faults() == () and monitor.stop() is True
