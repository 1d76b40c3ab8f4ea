"""What the GPUs' reports amount to: the faults of this machine's GPUs, one
:class:`HealthRecord` that every source of reports (NVML, :mod:`synapse_ha.worker.gpu_nvml`;
the mock fault file, :mod:`synapse_ha.worker.gpu_health`) feeds, and that the monitor
(:class:`~synapse_ha.worker.gpu_health.GpuHealthMonitor`) reads. The rules are those of
:mod:`synapse_ha.worker.gpu_health`'s docstring: an Xid by the Xid table, the other codes
of :data:`FAULT_KINDS` always; sticky, one fault a GPU, each logged once.
"""

from __future__ import annotations

import logging
import threading

from synapse_ha.core.health.fitness import MAX_FAULT_DETAIL, GpuFault
from synapse_ha.worker.xid import XidAction, XidTable

log = logging.getLogger("synapse.worker.gpu_health")

# The fault codes a worker sends besides ``xid-<code>``, with what each means.
FAULT_KINDS = {
    "ecc-dbe": "double-bit ECC error",
    "lost": "GPU is lost",
    "retired-pages": "retired pages pending a GPU reset",
    "remap-failed": "row remapping failed",
    "nvlink": "NVLink down",
}


def bounded_detail(text: str) -> str:
    """A detail the leader accepts: printable, at most MAX_FAULT_DETAIL characters."""
    clean = "".join(c if c.isprintable() else "?" for c in text)
    return clean[:MAX_FAULT_DETAIL]


class HealthRecord:
    """The GPUs found unhealthy, sticky; safe to call from any thread."""

    def __init__(self, gpu_count: int, xids: XidTable) -> None:
        self.gpu_count = gpu_count
        self.xids = xids
        self._lock = threading.Lock()
        self._faults: dict[int, GpuFault] = {}
        self._also: set[tuple[int, str]] = set()

    def faults(self) -> tuple[GpuFault, ...]:
        with self._lock:
            return tuple(sorted(self._faults.values()))

    def is_unhealthy(self, gpu: int) -> bool:
        with self._lock:
            return gpu in self._faults

    def saw_xid(self, gpu: int, xid: int, where: str = "") -> GpuFault | None:
        """The driver reported Xid ``xid`` on ``gpu``; the fault when the table says the
        GPU is unhealthy, else None (logged)."""
        entry = self.xids.entry(xid)
        detail = f"Xid {xid}: {entry.name}{f' ({where})' if where else ''}"
        if entry.action is XidAction.REPORT:
            log.warning("GPU %d reported %s; not fatal (the Xid table says report)", gpu, detail)
            return None
        return self.saw(gpu, f"xid-{xid}", detail)

    def saw(self, gpu: int, code: str, detail: str) -> GpuFault | None:
        """``gpu`` is unhealthy (``code``, ``detail``); the new fault, or None when the GPU
        already had one or is not this node's."""
        if not 0 <= gpu < self.gpu_count:
            log.warning(
                "ignored %s on GPU %d: this node has GPUs 0..%d", code, gpu, self.gpu_count - 1
            )
            return None
        fault = GpuFault(gpu, code, bounded_detail(detail))
        with self._lock:
            first = self._faults.get(gpu)
            if first is None:
                self._faults[gpu] = fault
            elif (gpu, code) in self._also or first.code == code:
                return None
            else:
                self._also.add((gpu, code))
        if first is None:
            log.warning("GPU %d is unhealthy: %s (%s)", gpu, code, fault.detail)
            return fault
        log.warning(
            "GPU %d also reported %s (%s); it stays reported as %s",
            gpu,
            code,
            fault.detail,
            first.code,
        )
        return None
