"""GPU health through NVML: the monitor's source on a machine with real GPUs.

The NVML module is injected (``pynvml`` in production, loaded lazily as discovery does;
a fake in tests). :meth:`NvmlWatch.open` initialises NVML (its own reference: discovery
and the metrics keep theirs), creates an event set and registers every GPU for critical
Xid events and double-bit ECC events, as far as each GPU supports them
(``nvmlDeviceGetSupportedEventTypes``). Each :meth:`NvmlWatch.step` then

* waits for one event with ``nvmlEventSetWait_v2`` for at most ``EVENT_WAIT_MS``, so the
  thread notices a stop within that bound: an Xid event goes through the Xid table, a
  double-bit ECC event is the fault ``ecc-dbe``;
* every ``poll_interval_s``, polls each GPU not yet unhealthy:

  - ``lost``: NVML answers ``NVMLError_GpuIsLost`` to any query of it (its handle, or
    any of the queries below);
  - ``retired-pages``: ``nvmlDeviceGetRetiredPagesPendingStatus`` says retired pages
    wait for a GPU reset (GPUs before Ampere);
  - ``remap-failed``: ``nvmlDeviceGetRemappedRows`` reports a row remapping failure
    (Ampere and later; a remapping merely pending is not a fault: the GPU works and
    applies it at its next reset);
  - ``nvlink``: a link that was active when the watch opened is no longer
    (``nvmlDeviceGetNvLinkState``). NVLink error *counters*
    (``nvmlDeviceGetNvLinkErrorCounter``: replay, recovery, CRC) are not read: they grow
    on healthy links too, and telling a failing link from a busy one needs a rate over a
    window and a threshold per link generation, which DCGM's NVLink watch owns; a link
    going down is the failure that matters to a gang, and is cheap to see.

A query a GPU does not support (``NVMLError_NotSupported``) is not asked of it again.
Without NVML (no library, no driver) the watch says so once and sees nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, TypeVar

from synapse_ha.worker.gpu_faults import HealthRecord

log = logging.getLogger("synapse.worker.gpu_health")

EVENT_WAIT_MS = 500
T = TypeVar("T")


class _Lost(Exception):
    """The GPU a query was about is lost (recorded already)."""


class NvmlWatch:
    """NVML events and polls feeding a :class:`HealthRecord`."""

    def __init__(self, nvml: Any, record: HealthRecord, poll_interval_s: float) -> None:
        self.nvml = nvml
        self.record = record
        self.poll_interval_s = poll_interval_s
        self.clock: Callable[[], float] = time.monotonic
        self.event_set: Any = None
        self.initialised = False
        self.next_poll_at = 0.0
        self.active_links: dict[int, tuple[int, ...]] = {}
        self._unsupported: set[tuple[int, str]] = set()
        self._failing: set[tuple[int, str]] = set()

    @classmethod
    def open(cls, nvml: Any, record: HealthRecord, poll_interval_s: float) -> NvmlWatch:
        """The watch, NVML initialised and every GPU registered for events. Never raises:
        without NVML the watch sees nothing (said once)."""
        watch = cls(nvml, record, poll_interval_s)
        if nvml is None:
            log.warning("GPU health is not watched: NVML is not available (nvidia-ml-py)")
            return watch
        try:
            nvml.nvmlInit()
        except Exception as exc:
            log.warning("GPU health is not watched: NVML is not available (%s)", exc)
            return watch
        watch.initialised = True
        watch._register_events()
        watch._find_active_links()
        return watch

    # ------------------------------------------------------------------ events

    def _register_events(self) -> None:
        nvml = self.nvml
        wanted = int(nvml.nvmlEventTypeXidCriticalError) | int(nvml.nvmlEventTypeDoubleBitEccError)
        try:
            self.event_set = nvml.nvmlEventSetCreate()
        except Exception as exc:
            log.warning("no NVML events (%s): GPU health is polled only", exc)
            return
        gpus = range(self.record.gpu_count)
        self._each_gpu(gpus, lambda gpu, handle: self._register_gpu(gpu, handle, wanted))

    def _each_gpu(self, gpus: Iterable[int], step: Callable[[int, Any], None]) -> None:
        """``step(gpu, handle)`` for each of ``gpus`` whose handle NVML gives (see
        :meth:`_query`); a GPU found lost is recorded and the next one taken."""
        nvml = self.nvml
        for gpu in gpus:
            with contextlib.suppress(_Lost):
                handle = self._query(gpu, "handle", partial(nvml.nvmlDeviceGetHandleByIndex, gpu))
                if handle is not None:
                    step(gpu, handle)

    def _register_gpu(self, gpu: int, handle: Any, wanted: int) -> None:
        nvml = self.nvml
        types = self._query(
            gpu, "event-types", lambda: nvml.nvmlDeviceGetSupportedEventTypes(handle)
        )
        mask = wanted & int(types if types is not None else wanted)
        if mask:
            self._query(
                gpu,
                "register-events",
                lambda: nvml.nvmlDeviceRegisterEvents(handle, mask, self.event_set),
            )

    def wait_event(self, stop: threading.Event) -> None:
        """Wait up to EVENT_WAIT_MS for one event and record what it says."""
        nvml = self.nvml
        if self.event_set is None:
            stop.wait(EVENT_WAIT_MS / 1000)
            return
        try:
            data = nvml.nvmlEventSetWait_v2(self.event_set, EVENT_WAIT_MS)
        except nvml.NVMLError_Timeout:
            return
        except nvml.NVMLError_GpuIsLost:
            self.next_poll_at = 0.0  # which one: the poll finds it
            return
        except Exception as exc:
            if (-1, "wait") not in self._failing:
                self._failing.add((-1, "wait"))
                log.warning("waiting for NVML events failed (%s); retrying", exc)
            stop.wait(EVENT_WAIT_MS / 1000)
            return
        self._record_event(data)

    def _record_event(self, data: Any) -> None:
        nvml = self.nvml
        try:
            gpu = int(nvml.nvmlDeviceGetIndex(data.device))
        except Exception as exc:
            log.error(
                "NVML event %#x (data %d) for a GPU NVML cannot name (%s); polling now",
                int(data.eventType),
                int(data.eventData),
                exc,
            )
            self.next_poll_at = 0.0
            return
        kind = int(data.eventType)
        if kind & int(nvml.nvmlEventTypeXidCriticalError):
            self.record.saw_xid(gpu, int(data.eventData), "NVML event")
        elif kind & int(nvml.nvmlEventTypeDoubleBitEccError):
            self.record.saw(gpu, "ecc-dbe", "double-bit ECC error (NVML event)")

    # -------------------------------------------------------------------- polls

    def _find_active_links(self) -> None:
        nvml = self.nvml
        max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
        enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
        for gpu in range(self.record.gpu_count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(gpu)
            except Exception:
                continue  # a lost GPU shows at the first poll
            active = []
            for link in range(max_links):
                try:
                    if nvml.nvmlDeviceGetNvLinkState(handle, link) == enabled:
                        active.append(link)
                except Exception:  # NotSupported, InvalidArgument past the last link
                    continue
            self.active_links[gpu] = tuple(active)

    def poll(self) -> None:
        """Check every GPU not unhealthy yet (see the module docstring)."""
        self.next_poll_at = self.clock() + self.poll_interval_s
        record = self.record
        healthy = (gpu for gpu in range(record.gpu_count) if not record.is_unhealthy(gpu))
        self._each_gpu(healthy, self._poll_gpu)

    def _poll_gpu(self, gpu: int, handle: Any) -> None:
        nvml = self.nvml
        pending = self._query(
            gpu, "retired-pages", lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)
        )
        if pending is not None and pending == getattr(nvml, "NVML_FEATURE_ENABLED", 1):
            self.record.saw(gpu, "retired-pages", "retired pages pending a GPU reset")
            return
        rows = self._query(gpu, "remap", lambda: nvml.nvmlDeviceGetRemappedRows(handle))
        if rows is not None and int(rows[3]):
            self.record.saw(
                gpu,
                "remap-failed",
                f"row remapping failed ({int(rows[1])} uncorrectable rows remapped)",
            )
            return
        down = [
            link for link in self.active_links.get(gpu, ()) if self._link_down(gpu, handle, link)
        ]
        if down:
            self.record.saw(gpu, "nvlink", f"NVLink {down[0]} is down (active at start)")

    def _link_down(self, gpu: int, handle: Any, link: int) -> bool:
        nvml = self.nvml
        state = self._query(
            gpu, f"nvlink-{link}", lambda: nvml.nvmlDeviceGetNvLinkState(handle, link)
        )
        return state is not None and state != getattr(nvml, "NVML_FEATURE_ENABLED", 1)

    def _query(self, gpu: int, what: str, call: Callable[[], T]) -> T | None:
        """``call``'s answer; None when the GPU does not support it or it failed
        (logged once per GPU and query). Raises :class:`_Lost` (recorded) when NVML
        says the GPU is lost."""
        nvml = self.nvml
        if (gpu, what) in self._unsupported:
            return None
        try:
            return call()
        except nvml.NVMLError_GpuIsLost:
            self.record.saw(gpu, "lost", f"NVML: GPU is lost ({what})")
            raise _Lost() from None
        except nvml.NVMLError_NotSupported:
            self._unsupported.add((gpu, what))
            return None
        except Exception as exc:
            if (gpu, what) not in self._failing:
                self._failing.add((gpu, what))
                log.warning("NVML query %s of GPU %d failed: %s", what, gpu, exc)
            return None

    # --------------------------------------------------------------- the thread

    def step(self, stop: threading.Event) -> None:
        if not self.initialised:
            stop.wait(EVENT_WAIT_MS / 1000)
            return
        if self.clock() >= self.next_poll_at:
            self.poll()
        self.wait_event(stop)

    def close(self) -> None:
        if not self.initialised:
            return
        if self.event_set is not None:
            with contextlib.suppress(Exception):
                self.nvml.nvmlEventSetFree(self.event_set)
            self.event_set = None
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()
        self.initialised = False
