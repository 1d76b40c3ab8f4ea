"""GPU health through NVML, against a fake NVML module with pynvml's event API: an event
set, registration, waits that time out or return an Xid or ECC event, a GPU that is
lost, pending page retirement, a failed row remapping, an NVLink going down."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from synapse_ha.worker.gpu_faults import HealthRecord
from synapse_ha.worker.gpu_health import (
    GpuHealthMonitor,
    GpuHealthSettings,
    health_monitor,
)
from synapse_ha.worker.gpu_nvml import NvmlWatch
from synapse_ha.worker.xid import XidTable


class NVMLError(Exception):
    pass


class NVMLError_Timeout(NVMLError):
    pass


class NVMLError_GpuIsLost(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


@dataclass
class Handle:
    index: int


@dataclass
class EventData:
    device: Handle
    eventType: int
    eventData: int


class FakeNVML:
    """pynvml's health API over ``count`` GPUs; tests queue events and set conditions."""

    NVMLError = NVMLError
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_NotSupported = NVMLError_NotSupported
    nvmlEventTypeSingleBitEccError = 1
    nvmlEventTypeDoubleBitEccError = 2
    nvmlEventTypeXidCriticalError = 8
    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 4

    def __init__(self, count: int = 4) -> None:
        self.count = count
        self.events: queue.SimpleQueue[EventData] = queue.SimpleQueue()
        self.registered: dict[int, int] = {}
        self.lost: set[int] = set()
        self.pending_pages: set[int] = set()
        self.remap_failed: set[int] = set()
        self.no_retirement: set[int] = set()  # Ampere+: page retirement not supported
        self.links_up: dict[int, set[int]] = {g: {0, 1} for g in range(count)}
        self.calls: list[str] = []
        self.waits = 0
        self.initialised = 0
        self.freed = False

    def _handle(self, h: Handle) -> int:
        if h.index in self.lost:
            raise NVMLError_GpuIsLost("GPU is lost")
        return h.index

    def nvmlInit(self) -> None:
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Handle:
        self.calls.append(f"handle {i}")
        if i in self.lost:
            raise NVMLError_GpuIsLost("GPU is lost")
        return Handle(i)

    def nvmlDeviceGetIndex(self, h: Handle) -> int:
        return h.index

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.freed = True

    def nvmlDeviceGetSupportedEventTypes(self, h: Handle) -> int:
        return 1 | 2 | 8 | 0x100

    def nvmlDeviceRegisterEvents(self, h: Handle, types: int, event_set: str) -> None:
        assert event_set == "event-set"
        self.registered[self._handle(h)] = types

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> EventData:
        assert 0 < timeout_ms <= 1000  # bounded, so that the thread can stop
        self.waits += 1
        try:
            return self.events.get(timeout=min(timeout_ms, 20) / 1000)
        except queue.Empty:
            raise NVMLError_Timeout("Timeout") from None

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: Handle) -> int:
        if self._handle(h) in self.no_retirement:
            raise NVMLError_NotSupported("Not Supported")
        self.calls.append(f"retired {h.index}")
        return 1 if h.index in self.pending_pages else 0

    def nvmlDeviceGetRemappedRows(self, h: Handle) -> tuple[int, int, int, int]:
        failed = self._handle(h) in self.remap_failed
        return (3, 2 if failed else 0, 0, 1 if failed else 0)

    def nvmlDeviceGetNvLinkState(self, h: Handle, link: int) -> int:
        if link >= 2:
            raise NVMLError_NotSupported("Not Supported")
        return 1 if link in self.links_up[self._handle(h)] else 0


def opened(nvml: FakeNVML, gpus: int = 4) -> NvmlWatch:
    return NvmlWatch.open(nvml, HealthRecord(gpus, XidTable()), poll_interval_s=5.0)


def codes(watch: NvmlWatch) -> list[tuple[int, str]]:
    return [(f.gpu, f.code) for f in watch.record.faults()]


def test_every_gpu_is_registered_for_xid_and_double_bit_ecc_events_only() -> None:
    nvml = FakeNVML()
    watch = opened(nvml)
    assert nvml.registered == dict.fromkeys(range(4), 8 | 2)
    assert watch.active_links == dict.fromkeys(range(4), (0, 1))
    watch.close()
    assert nvml.freed and nvml.initialised == 0


def test_a_critical_xid_event_makes_its_gpu_unhealthy_an_application_xid_does_not() -> None:
    nvml = FakeNVML()
    watch = opened(nvml)
    stop = threading.Event()
    nvml.events.put(EventData(Handle(1), 8, 13))
    nvml.events.put(EventData(Handle(2), 8, 79))
    nvml.events.put(EventData(Handle(3), 2, 0))
    for _ in range(3):
        watch.wait_event(stop)
    assert codes(watch) == [(2, "xid-79"), (3, "ecc-dbe")]
    assert watch.record.faults()[0].detail == "Xid 79: GPU has fallen off the bus (NVML event)"
    waits = nvml.waits
    watch.wait_event(stop)  # nothing: a timeout, said nowhere
    assert nvml.waits == waits + 1 and len(codes(watch)) == 2


def test_the_poll_finds_a_lost_gpu_pending_retirement_failed_remapping_and_a_link_down() -> None:
    nvml = FakeNVML(5)
    watch = opened(nvml, 5)
    watch.poll()
    assert codes(watch) == []
    nvml.lost.add(0)
    nvml.pending_pages.add(1)
    nvml.no_retirement.add(2)
    nvml.remap_failed.add(2)
    nvml.links_up[3] = {0}
    watch.poll()
    assert codes(watch) == [(0, "lost"), (1, "retired-pages"), (2, "remap-failed"), (3, "nvlink")]
    assert watch.record.faults()[3].detail == "NVLink 1 is down (active at start)"
    # An unhealthy GPU is not polled again; a query it does not support is not asked again.
    nvml.calls.clear()
    watch.poll()
    assert nvml.calls == ["handle 4", "retired 4"]


def test_a_gpu_lost_while_registering_is_recorded() -> None:
    nvml = FakeNVML()
    nvml.lost.add(3)
    watch = opened(nvml)
    assert codes(watch) == [(3, "lost")]
    assert sorted(nvml.registered) == [0, 1, 2]


def test_without_nvml_or_its_driver_nothing_is_watched() -> None:
    class NoDriver(FakeNVML):
        def nvmlInit(self) -> None:
            raise NVMLError("Driver Not Loaded")

    for nvml in (None, NoDriver()):
        watch = NvmlWatch.open(nvml, HealthRecord(4, XidTable()), 5.0)
        stop = threading.Event()
        started = time.monotonic()
        watch.step(stop)
        assert time.monotonic() - started < 1.0 and watch.record.faults() == ()
        watch.close()


@pytest.fixture
def monitors() -> Iterator[list[GpuHealthMonitor]]:
    made: list[GpuHealthMonitor] = []
    yield made
    for m in made:
        m.stop()


def test_the_monitor_thread_watches_nvml_and_stops_within_the_event_wait(
    monitors: list[GpuHealthMonitor],
) -> None:
    nvml = FakeNVML()
    monitor = health_monitor(
        GpuHealthSettings(poll_interval_s=0.05), 4, mock_gpus=False, load_nvml=lambda: nvml
    )
    monitors.append(monitor)
    monitor.start()
    nvml.events.put(EventData(Handle(1), 8, 48))
    nvml.lost.add(2)
    deadline = time.monotonic() + 5
    while len(monitor.faults()) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [(f.gpu, f.code) for f in monitor.faults()] == [(1, "xid-48"), (2, "lost")]
    started = time.monotonic()
    assert monitor.stop() is True
    assert time.monotonic() - started < 1.0
    assert nvml.freed and nvml.initialised == 0
