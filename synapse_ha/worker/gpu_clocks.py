"""The worker's own probe of slow GPUs: clocks held down by the hardware, seen through
NVML and reported as the node check ``gpu-clocks``.

A GPU held at low clocks by a thermal or power limit runs every kernel slower, and a
gang with a member on it trains at that member's pace (docs/slow-nodes.md). The members'
pace finds such a node only while a gang runs there; this probe finds it without one.
Every :data:`POLL_S` seconds it asks NVML, for each GPU, why its clocks are held down
(``nvmlDeviceGetCurrentClocksThrottleReasons``) and keeps only the reasons that mean the
GPU cannot run at speed (:data:`SLOW_REASONS`: a hardware slowdown, a thermal slowdown,
the power brake); a power cap under load, an idle GPU or an application clock setting
are normal. A GPU held by one of those for :data:`HOLD_S` seconds in a row makes the check
fail, with a message naming the GPUs, the reasons and their SM clock against its maximum
(``GPU 3 hw-thermal for 2m (SM 1005/1980 MHz)``); it passes again once no GPU has been
held that long. The leader records a failing check as a condition that cordons the node
(:mod:`synapse_ha.core.machine.apply_node_checks`), as the health-check program's.

Without NVML (no library, no driver, or mock GPUs) there is no probe and no check. A
query a GPU does not support is not asked of it again. Runs in a thread of its own, so
the heartbeat loop never waits for NVML.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from synapse_ha.core.health.fitness import MAX_CHECK_MESSAGE, NodeCheck

log = logging.getLogger("synapse.worker.gpu_clocks")

CHECK_NAME = "gpu-clocks"
POLL_S = 10.0
HOLD_S = 120.0
# nvmlClocksThrottleReason* bits that mean the GPU cannot run at speed.
SLOW_REASONS: dict[int, str] = {
    0x8: "hw-slowdown",
    0x20: "sw-thermal",
    0x40: "hw-thermal",
    0x80: "hw-power-brake",
}
NVML_CLOCK_SM = 1


def reasons_text(mask: int) -> str:
    """``hw-thermal,hw-power-brake`` for the slow reasons of ``mask``."""
    return ",".join(name for bit, name in sorted(SLOW_REASONS.items()) if mask & bit)


def _minutes(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 60}m" if whole >= 60 else f"{whole}s"


class ClocksJudge:
    """Whether the GPUs' clocks have been held down for ``hold_s``: fed one sample of
    every GPU at a time (:meth:`observe`, pure of any clock or NVML)."""

    def __init__(self, hold_s: float = HOLD_S) -> None:
        self.hold_s = hold_s
        self._since: dict[int, tuple[float, int]] = {}  # gpu -> (held since, reasons)

    def observe(self, now: float, samples: Mapping[int, tuple[int, int, int]]) -> NodeCheck:
        """The check after ``samples`` taken at ``now``: per GPU index, its throttle
        reasons mask, its SM clock and its maximum SM clock (MHz; 0 when unknown)."""
        held = []
        for gpu in sorted(samples):
            mask, sm, sm_max = samples[gpu]
            slow = mask & sum(SLOW_REASONS)
            if not slow:
                self._since.pop(gpu, None)
                continue
            since, _ = self._since.get(gpu, (now, 0))
            self._since[gpu] = (since, slow)
            if now - since >= self.hold_s:
                clocks = f" (SM {sm}/{sm_max} MHz)" if sm_max else ""
                held.append(f"GPU {gpu} {reasons_text(slow)} for {_minutes(now - since)}{clocks}")
        if not held:
            return NodeCheck(CHECK_NAME, False, "")
        message = "; ".join(held)
        if len(message) > MAX_CHECK_MESSAGE:
            message = message[: MAX_CHECK_MESSAGE - 3] + "..."
        return NodeCheck(CHECK_NAME, True, message)


class ClocksProbe:
    """Samples every GPU through the NVML module ``nvml`` (pynvml's API) every
    ``poll_s`` in a thread; :meth:`checks` is the latest result (none before the first
    sample, none without NVML), safe to call from any thread; ``changed`` is called when
    a result differs from the one before (the worker then heartbeats early)."""

    def __init__(
        self,
        nvml: Any,
        changed: Callable[[], None] = lambda: None,
        poll_s: float = POLL_S,
        judge: ClocksJudge | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nvml = nvml
        self.poll_s = poll_s
        self.judge = judge or ClocksJudge()
        self._changed = changed
        self._clock = clock
        self._result: NodeCheck | None = None
        self._unsupported: set[tuple[int, str]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def checks(self) -> tuple[NodeCheck, ...]:
        result = self._result
        return () if result is None else (result,)

    def start(self) -> None:
        if self.nvml is None or self._thread is not None:
            return
        try:
            self.nvml.nvmlInit()
        except Exception as exc:  # no driver: no probe, said once
            log.warning("GPU clocks are not probed: NVML did not start (%s)", exc)
            self.nvml = None
            return
        self._thread = threading.Thread(target=self._loop, name="gpu-clocks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.step()
            self._stop.wait(self.poll_s)

    def step(self) -> NodeCheck | None:
        """Sample every GPU once and judge; the result (None when NVML failed)."""
        try:
            count = int(self.nvml.nvmlDeviceGetCount())
            samples = {gpu: self._sample(gpu) for gpu in range(count)}
        except Exception as exc:  # a driver gone wrong: keep the last result, say why
            log.warning("GPU clocks not sampled: %s", exc)
            return None
        result = self.judge.observe(self._clock(), samples)
        before, self._result = self._result, result
        if result != before:
            self._changed()
        return result

    def _sample(self, gpu: int) -> tuple[int, int, int]:
        handle = self.nvml.nvmlDeviceGetHandleByIndex(gpu)
        mask = self._ask(gpu, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        sm = self._ask(gpu, "nvmlDeviceGetClockInfo", handle, NVML_CLOCK_SM)
        sm_max = self._ask(gpu, "nvmlDeviceGetMaxClockInfo", handle, NVML_CLOCK_SM)
        return mask, sm, sm_max

    def _ask(self, gpu: int, query: str, *args: Any) -> int:
        """One query's answer; 0 for one the GPU does not support, which is not asked
        again."""
        if (gpu, query) in self._unsupported:
            return 0
        try:
            return int(getattr(self.nvml, query)(*args))
        except self.nvml.NVMLError_NotSupported:
            self._unsupported.add((gpu, query))
            return 0
