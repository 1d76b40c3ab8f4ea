"""The worker's GPU health monitor: which of this machine's GPUs are unhealthy.

A :class:`GpuHealthMonitor` runs one thread over a *source* of what the GPUs report:
NVML (:mod:`synapse_ha.worker.gpu_nvml`: critical Xid and double-bit ECC events, and a
poll for a lost GPU, pending page retirement, a failed row remapping, an NVLink gone
down), or, with mock GPUs, the mock fault file (:class:`MockFaultFile`). Everything a
source sees goes to one :class:`~synapse_ha.worker.gpu_faults.HealthRecord`, which decides
what is a fault:

* An Xid goes through the Xid table (:mod:`synapse_ha.worker.xid`): ``unhealthy`` makes
  the fault ``xid-<code>``; ``report`` is logged at WARNING only.
* ``ecc-dbe``, ``lost``, ``retired-pages``, ``remap-failed`` and ``nvlink`` are faults.
* Faults are sticky: a GPU once unhealthy stays so until the worker restarts (an
  operator resets the GPU, restarts the worker, then repairs it with ``synctl``). A GPU
  has one fault, its first; a later one is logged.
* Each new fault is logged once at WARNING with the GPU, the code and the detail.

The agent sends :meth:`GpuHealthMonitor.faults` in every heartbeat (DESIGN §4, "GPU
health is replicated state"). The monitor starts before the agent registers and
:meth:`~GpuHealthMonitor.stop` ends its thread within a bounded time.

The mock fault file (``--mock-gpu-faults PATH``) is the chaos suite's way in: each line
appended to PATH is one fault, seen within a second: ``<gpu> xid <code>``,
``<gpu> ecc-dbe``, ``<gpu> lost``, ``<gpu> retired-pages``, ``<gpu> remap-failed``,
``<gpu> nvlink``. Blank lines and lines starting with ``#`` are skipped; a malformed
line (or one naming a GPU this node does not have) is logged with its line number and
ignored. Lines already in the file when the worker starts are its previous life's and are
skipped; a file that does not exist yet is waited for and read from its first line, as is
a file replaced (another file renamed over it) or truncated meanwhile. A last line
without its newline counts once it has stayed unchanged for one read.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from synapse_ha.core.health.fitness import GpuFault
from synapse_ha.worker.gpu_faults import FAULT_KINDS, HealthRecord
from synapse_ha.worker.gpu_nvml import NvmlWatch
from synapse_ha.worker.xid import XidAction, XidTable

log = logging.getLogger("synapse.worker.gpu_health")

MOCK_READ_EVERY_S = 0.2
STOP_JOIN_S = 3.0


# ------------------------------------------------------------------ mock faults


@dataclass(frozen=True, slots=True)
class MockFault:
    gpu: int
    code: str  # one of FAULT_KINDS, or "xid"
    xid: int = 0


def parse_mock_line(line: str) -> MockFault | None:
    """One line of the mock fault file; None for a blank line or a comment. Raises
    ValueError saying what is wrong."""
    words = line.split()
    if not words or words[0].startswith("#"):
        return None
    if not words[0].isdigit():
        raise ValueError(f"{words[0]!r} is not a GPU index")
    gpu = int(words[0])
    if len(words) == 3 and words[1] == "xid":
        if not words[2].isdigit() or int(words[2]) == 0:
            raise ValueError(f"{words[2]!r} is not an Xid number")
        return MockFault(gpu, "xid", int(words[2]))
    if len(words) == 2 and words[1] in FAULT_KINDS:
        return MockFault(gpu, words[1])
    raise ValueError(f"expected '<gpu> xid <code>' or '<gpu> {'|'.join(FAULT_KINDS)}'")


class MockFaultFile:
    """Tails the mock fault file into a :class:`HealthRecord` (see the module docstring
    for the rules). :meth:`read_new` reads what was appended since the last call."""

    def __init__(self, path: Path, record: HealthRecord) -> None:
        self.path = path
        self.record = record
        self._identity: tuple[int, int] | None = None
        self._offset = 0
        self._line_no = 0
        self._fragment = b""
        self._waiting_said = False
        self._skip_existing()

    def _skip_existing(self) -> None:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
                st = os.fstat(f.fileno())
        except FileNotFoundError:
            log.info("waiting for the mock GPU fault file %s", self.path)
            self._waiting_said = True
            return
        except OSError as exc:
            log.warning("cannot read the mock GPU fault file %s: %s", self.path, exc)
            return
        self._identity = (st.st_dev, st.st_ino)
        self._offset = len(data)
        self._line_no = data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)
        if data:
            log.info(
                "mock GPU fault file %s: skipping its %d line(s) from before this start",
                self.path,
                self._line_no,
            )

    def read_new(self) -> int:
        """Apply every line appended since the last read; how many were faults."""
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if (st.st_dev, st.st_ino) != self._identity or st.st_size < self._offset:
                    if self._identity is not None or self._waiting_said:
                        log.info("reading the mock GPU fault file %s from its start", self.path)
                    self._identity, self._offset, self._line_no = (st.st_dev, st.st_ino), 0, 0
                    self._fragment = b""
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            if not self._waiting_said:
                log.info("waiting for the mock GPU fault file %s", self.path)
                self._waiting_said = True
            return 0
        except OSError as exc:
            log.warning("cannot read the mock GPU fault file %s: %s", self.path, exc)
            return 0
        self._offset += len(data)
        if not data and self._fragment:  # a last line left without its newline
            data, self._fragment = self._fragment + b"\n", b""
        *lines, rest = (self._fragment + data).split(b"\n")
        self._fragment = rest
        return sum(self._apply(line) for line in lines)

    def _apply(self, raw: bytes) -> int:
        self._line_no += 1
        try:
            fault = parse_mock_line(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            log.warning("%s line %d ignored: %s", self.path, self._line_no, exc)
            return 0
        if fault is None:
            return 0
        if not 0 <= fault.gpu < self.record.gpu_count:
            log.warning(
                "%s line %d ignored: this node has no GPU %d", self.path, self._line_no, fault.gpu
            )
            return 0
        where = f"mock fault, line {self._line_no}"
        if fault.code == "xid":
            return int(self.record.saw_xid(fault.gpu, fault.xid, where) is not None)
        detail = f"{FAULT_KINDS[fault.code]} ({where})"
        return int(self.record.saw(fault.gpu, fault.code, detail) is not None)

    def step(self, stop: threading.Event) -> None:
        self.read_new()
        stop.wait(MOCK_READ_EVERY_S)

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------- monitor


class HealthSource(Protocol):
    """What a monitor's thread runs: ``step`` until told to stop (each call returns
    within about a second, also when it has nothing to do), then ``close``."""

    def step(self, stop: threading.Event) -> None: ...
    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class GpuHealthSettings:
    """The worker's ``[gpu_health]`` settings."""

    enabled: bool = True
    poll_interval_s: float = 5.0
    xid_actions: tuple[tuple[int, XidAction], ...] = ()
    mock_faults: Path | None = None  # the mock fault file (mock GPUs only)
    # Where the machine's boot id is read, sent when the worker registers (a new one
    # tells the leader the machine rebooted); None: not sent.
    boot_id_file: Path | None = Path("/proc/sys/kernel/random/boot_id")

    def boot_id(self) -> str:
        """The machine's boot id, or "" when it cannot be read."""
        if self.boot_id_file is None:
            return ""
        try:
            return self.boot_id_file.read_text(encoding="ascii").strip()[:64]
        except (OSError, UnicodeDecodeError):
            return ""


class GpuHealthMonitor:
    """One thread over one source, feeding a :class:`HealthRecord`."""

    def __init__(self, record: HealthRecord, source: Callable[[], HealthSource] | None) -> None:
        """``source`` makes the source inside the thread (opening NVML may block); None:
        nothing to watch, no thread, no faults ever."""
        self.record = record
        self._make_source = source
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def faults(self) -> tuple[GpuFault, ...]:
        return self.record.faults()

    def start(self) -> None:
        if self._make_source is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="gpu-health", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = STOP_JOIN_S) -> bool:
        """Stop the thread; False when it did not end within ``timeout_s`` (it is a
        daemon thread: it cannot keep the process alive)."""
        self._stop.set()
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout_s)
        if thread.is_alive():
            log.warning("the GPU health monitor did not stop within %.1fs", timeout_s)
            return False
        return True

    def _run(self) -> None:
        assert self._make_source is not None
        try:
            source = self._make_source()
        except Exception:
            log.exception("the GPU health monitor could not start; GPU faults go unseen")
            return
        try:
            while not self._stop.is_set():
                source.step(self._stop)
        except Exception:
            log.exception("the GPU health monitor failed; GPU faults go unseen from now on")
        finally:
            source.close()


def health_monitor(
    settings: GpuHealthSettings, gpu_count: int, mock_gpus: bool, load_nvml: Callable[[], object]
) -> GpuHealthMonitor:
    """The monitor a worker runs: over the mock fault file with mock GPUs (none without
    one), over NVML otherwise; none when disabled or without GPUs."""
    record = HealthRecord(gpu_count, XidTable(settings.xid_actions))
    if not settings.enabled or gpu_count == 0:
        return GpuHealthMonitor(record, None)
    if mock_gpus:
        path = settings.mock_faults
        if path is None:
            return GpuHealthMonitor(record, None)
        reader = MockFaultFile(path, record)  # skips the lines already there, now
        return GpuHealthMonitor(record, lambda: reader)
    poll_s = settings.poll_interval_s
    return GpuHealthMonitor(record, lambda: NvmlWatch.open(load_nvml(), record, poll_s))
