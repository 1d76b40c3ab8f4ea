"""The worker's probe of GPU clocks (worker/gpu_clocks.py): a GPU held down by a thermal
or power limit for the hold time fails the ``gpu-clocks`` check, a power cap or an idle
GPU never does, and without NVML there is no check."""

from __future__ import annotations

from typing import Any

from synapse_ha.core.health.fitness import NodeCheck
from synapse_ha.worker.gpu_clocks import CHECK_NAME, ClocksJudge, ClocksProbe, reasons_text

HW_THERMAL, SW_POWER_CAP, IDLE, POWER_BRAKE = 0x40, 0x4, 0x1, 0x80


class NVMLError_NotSupported(Exception):
    pass


class FakeNvml:
    NVMLError_NotSupported = NVMLError_NotSupported

    def __init__(self, reasons: list[int]) -> None:
        self.reasons = reasons
        self.clock_asked = 0
        self.inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.reasons)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: int) -> int:
        return self.reasons[handle]

    def nvmlDeviceGetClockInfo(self, handle: int, kind: int) -> int:
        self.clock_asked += 1
        raise NVMLError_NotSupported

    def nvmlDeviceGetMaxClockInfo(self, handle: int, kind: int) -> int:
        return 1980


def test_a_gpu_held_down_for_the_hold_time_fails_the_check() -> None:
    judge = ClocksJudge(hold_s=120)
    assert judge.observe(0, {0: (IDLE, 0, 0), 1: (HW_THERMAL, 1005, 1980)}) == NodeCheck(
        CHECK_NAME, False, ""
    )
    assert not judge.observe(119, {0: (IDLE, 0, 0), 1: (HW_THERMAL, 1005, 1980)}).failing
    held = judge.observe(130, {0: (IDLE, 0, 0), 1: (HW_THERMAL | SW_POWER_CAP, 1005, 1980)})
    assert held == NodeCheck(CHECK_NAME, True, "GPU 1 hw-thermal for 2m (SM 1005/1980 MHz)")
    # Released for one sample: the hold starts again.
    assert not judge.observe(140, {1: (SW_POWER_CAP, 1900, 1980)}).failing
    assert not judge.observe(200, {1: (POWER_BRAKE, 300, 0)}).failing
    assert judge.observe(330, {1: (POWER_BRAKE, 300, 0)}).message == ("GPU 1 hw-power-brake for 2m")


def test_a_power_cap_an_idle_gpu_or_application_clocks_never_fail_it() -> None:
    judge = ClocksJudge(hold_s=1)
    for t in range(10):
        assert not judge.observe(t, {0: (SW_POWER_CAP | IDLE | 0x2 | 0x10, 900, 1980)}).failing
    assert reasons_text(0xFF) == "hw-slowdown,sw-thermal,hw-thermal,hw-power-brake"


def test_the_probe_samples_through_nvml_and_says_when_its_result_changed() -> None:
    nvml = FakeNvml([IDLE, HW_THERMAL])
    now = [0.0]
    changes: list[int] = []
    probe = ClocksProbe(
        nvml, changed=lambda: changes.append(1), judge=ClocksJudge(60), clock=lambda: now[0]
    )
    assert probe.checks() == ()  # before the first sample
    probe.step()
    assert probe.checks() == (NodeCheck(CHECK_NAME, False, ""),) and changes == [1]
    now[0] = 61
    probe.step()
    (check,) = probe.checks()
    assert check.failing and check.message == "GPU 1 hw-thermal for 1m (SM 0/1980 MHz)"
    assert changes == [1, 1]
    probe.step()
    assert changes == [1, 1]  # unchanged: no early heartbeat
    assert nvml.clock_asked == 2  # not supported: asked once per GPU, never again


def test_without_nvml_there_is_no_probe_and_no_check() -> None:
    probe = ClocksProbe(None)
    probe.start()
    probe.stop()
    assert probe.checks() == ()

    class Broken(FakeNvml):
        def nvmlInit(self) -> None:
            raise RuntimeError("driver not loaded")

    broken: Any = Broken([])
    failing = ClocksProbe(broken)
    failing.start()
    failing.stop()
    assert failing.checks() == () and failing.nvml is None
