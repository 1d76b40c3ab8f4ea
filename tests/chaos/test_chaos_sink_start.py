"""A scenario waits for its effect sink to listen and stops at once, with the sink's own
words, when the sink exited instead (its address held by a sink a killed run left
behind); ``net.leftover_sinks`` finds such sinks for the sweep."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaos import net
from chaos.cluster import SinkFailed, sink_listening
from synapse_ha.local.process import Process


def started(tmp_path: Path, name: str, argv: list[str]) -> Process:
    log = tmp_path / f"{name}.log"
    p = Process(name, argv, log)
    with log.open("wb") as out:
        p.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    return p


def test_a_sink_that_exited_stops_the_scenario_with_its_log(tmp_path: Path) -> None:
    code = "import sys; print('OSError: [Errno 98] Address already in use'); sys.exit(4)"
    p = started(tmp_path, "sink", [sys.executable, "-c", code])
    assert p.process is not None
    p.process.wait(timeout=30)
    with pytest.raises(SinkFailed, match=r"exited \(code 4\).*Address already in use"):
        sink_listening(p, "10.77.0.1:7900")


def test_a_listening_sink_is_seen_and_found_by_the_sweep(tmp_path: Path) -> None:
    address = "127.0.0.1:0"
    p = started(
        tmp_path,
        "sink",
        [sys.executable, "-m", "chaos.sink", address, str(tmp_path / "effects.jsonl")],
    )
    assert p.process is not None
    try:
        deadline = time.monotonic() + 30
        while not sink_listening(p, address):
            assert time.monotonic() < deadline, p.log_tail()
            time.sleep(0.05)
        assert p.process.pid in net.leftover_sinks()
    finally:
        p.process.kill()
        p.process.wait(timeout=30)
    assert p.process.pid not in net.leftover_sinks()
