"""GPU discovery through a fake NVML module; mock islands; CPU and memory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from synapse_ha.worker import discovery
from synapse_ha.worker.cgroups import probe_cgroups


class NVMLError(Exception):
    pass


@dataclass
class Memory:
    total: int


@dataclass
class Pci:
    busId: bytes | str


class FakeNVML:
    """pynvml's API over a declared machine: ``links`` maps (gpu, link) to a peer."""

    NVML_NVLINK_MAX_LINKS = 6
    NVML_FEATURE_ENABLED = 1

    def __init__(self, count: int, links: dict[tuple[int, int], int], fail_init: bool = False):
        self.count = count
        self.links = links
        self.fail_init = fail_init
        self.shut_down = False

    def bus(self, i: int) -> str:
        return f"00000000:{0x10 + i:02X}:00.0"

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise NVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h:08x}"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Memory:
        return Memory(total=80 * 1024**3)

    def nvmlDeviceGetPciInfo(self, h: int) -> Pci:
        return Pci(busId=self.bus(h).encode())

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if link >= 4:
            raise NVMLError("Not Supported")
        return 1 if (h, link) in self.links else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Pci:
        # The remote side is reported with a short domain, as some drivers do.
        return Pci(busId=self.bus(self.links[(h, link)])[4:].lower())


def test_gpus_and_nvlink_islands_come_from_nvml() -> None:
    links = {(0, 0): 1, (1, 0): 0, (2, 0): 3, (3, 1): 2, (4, 0): 5, (5, 0): 6, (6, 2): 4}
    nvml = FakeNVML(8, links)
    warnings: list[str] = []
    found = discovery.discover_gpus(nvml, warnings.append)
    assert warnings == []
    assert found.count == 8
    assert found.model == "NVIDIA H100 80GB HBM3"
    assert found.gpus[3] == discovery.GpuInfo(3, "NVIDIA H100 80GB HBM3", 81920, "GPU-00000003")
    assert found.islands == ((0, 1), (2, 3), (4, 5, 6), (7,))
    assert nvml.shut_down


def test_without_nvml_there_are_no_gpus_and_it_is_said() -> None:
    warnings: list[str] = []
    assert discovery.discover_gpus(None, warnings.append).count == 0
    assert discovery.discover_gpus(FakeNVML(2, {}, fail_init=True), warnings.append).count == 0
    assert len(warnings) == 2
    assert "NVML is not available" in warnings[0]
    assert "Driver Not Loaded" in warnings[1]


def test_islands_are_connected_components() -> None:
    assert discovery.islands_from_links(4, {(0, 3), (3, 2)}) == ((0, 2, 3), (1,))
    assert discovery.islands_from_links(0, set()) == ()


@pytest.mark.parametrize(
    ("text", "count", "islands"),
    [
        ("all", 4, ((0, 1, 2, 3),)),
        ("none", 3, ((0,), (1,), (2,))),
        ("0-1,2-3", 4, ((0, 1), (2, 3))),
        ("0-3,4-7", 8, ((0, 1, 2, 3), (4, 5, 6, 7))),
        ("0+2,1", 4, ((0, 2), (1,), (3,))),
        ("all", 0, ()),
    ],
)
def test_mock_nvlink_islands(text: str, count: int, islands: tuple[tuple[int, ...], ...]) -> None:
    assert discovery.parse_mock_nvlink(text, count) == islands


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0-1,1-2", "two islands"),
        ("0-9", "outside"),
        ("a-b", "not a GPU range"),
        ("3-1", "backwards"),
    ],
)
def test_bad_mock_nvlink_is_explained(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        discovery.parse_mock_nvlink(text, 4)


def test_mock_gpus() -> None:
    found = discovery.mock_gpus(4, "0-1,2-3", model="mock-a100")
    assert found.count == 4
    assert found.model == "mock-a100"
    assert found.islands == ((0, 1), (2, 3))


def test_cpu_and_memory_come_from_the_os(tmp_path: Path) -> None:
    assert discovery.cpu_milli() >= 1000
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16384000 kB\nMemFree: 1 kB\n")
    assert discovery.memory_mib(str(meminfo)) == 16000
    assert discovery.memory_mib(str(tmp_path / "missing")) > 0


def test_cgroup_limits_are_written_where_the_hierarchy_allows(tmp_path: Path) -> None:
    limiter, why = probe_cgroups(tmp_path / "nothing")
    assert limiter is None
    assert "no cgroup v2" in why
    (tmp_path / "cgroup.controllers").write_text("cpuset io pids\n")
    limiter, why = probe_cgroups(tmp_path)
    assert limiter is None
    assert "lacks the cpu, memory controller" in why
    (tmp_path / "cgroup.controllers").write_text("cpu io memory pids\n")
    limiter, why = probe_cgroups(tmp_path)
    assert limiter is not None
    path = Path(limiter.create("job.t1.r0", cpu_milli=1500, memory_mib=512))
    assert (path / "cpu.max").read_text() == "150000 100000"
    assert (path / "memory.max").read_text() == str(512 * 1024 * 1024)
    unlimited = Path(limiter.create("job.t1.r1", cpu_milli=0, memory_mib=0))
    assert (unlimited / "cpu.max").read_text() == "max"
