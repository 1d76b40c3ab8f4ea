"""What this machine offers: CPUs and memory from the OS, GPUs and NVLink from NVML.

The NVML module is injected (``pynvml`` in production, a fake in tests). GPUs joined by
an active NVLink form one island (connected components of the peer graph); islands are
reported as sorted tuples of GPU indices, ordered by their lowest index. When NVML or the
driver is missing, discovery says so once (through ``warn``) and reports no GPUs; mock
mode declares GPUs and islands instead.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    model: str
    memory_mib: int
    uuid: str


@dataclass(frozen=True, slots=True)
class GpuInventory:
    gpus: tuple[GpuInfo, ...] = ()
    islands: tuple[tuple[int, ...], ...] = ()

    @property
    def count(self) -> int:
        return len(self.gpus)

    @property
    def model(self) -> str:
        models = sorted({g.model for g in self.gpus})
        return models[0] if len(models) == 1 else "/".join(models)


# ----------------------------------------------------------------- CPU, memory


def cpu_milli() -> int:
    """CPUs this process may run on, in millicores."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    return count * 1000


def memory_mib(meminfo: str = "/proc/meminfo") -> int:
    """Total memory in MiB (``MemTotal``), falling back to sysconf."""
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)


# ----------------------------------------------------------------------- NVML


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def normalize_bus_id(bus_id: object) -> str:
    """``00000000:3B:00.0`` and ``0000:3b:00.0`` name the same device."""
    text = _text(bus_id).strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep:
        return text
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return text


def islands_from_links(count: int, links: set[tuple[int, int]]) -> tuple[tuple[int, ...], ...]:
    """Connected components of the NVLink peer graph over GPUs ``0..count-1``."""
    parent = list(range(count))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in links:
        if 0 <= a < count and 0 <= b < count:
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    groups: dict[int, list[int]] = {}
    for i in range(count):
        groups.setdefault(find(i), []).append(i)
    return tuple(sorted(tuple(g) for g in groups.values()))


def discover_gpus(nvml: Any, warn: Callable[[str], None]) -> GpuInventory:
    """GPUs and NVLink islands through the NVML module ``nvml`` (pynvml's API). Any NVML
    failure at initialisation means no GPUs, said once through ``warn``; a link that
    cannot be queried counts as absent."""
    if nvml is None:
        warn("NVML is not available (nvidia-ml-py not installed): reporting 0 GPUs")
        return GpuInventory()
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        warn(f"NVML is not available ({exc}): reporting 0 GPUs")
        return GpuInventory()
    try:
        count = int(nvml.nvmlDeviceGetCount())
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        gpus = []
        by_bus: dict[str, int] = {}
        for i, handle in enumerate(handles):
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                GpuInfo(
                    index=i,
                    model=_text(nvml.nvmlDeviceGetName(handle)),
                    memory_mib=int(memory.total) // (1024 * 1024),
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                )
            )
            by_bus[normalize_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId)] = i
        links: set[tuple[int, int]] = set()
        max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
        enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
        for i, handle in enumerate(handles):
            for link in range(max_links):
                try:
                    if nvml.nvmlDeviceGetNvLinkState(handle, link) != enabled:
                        continue
                    remote = nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
                except Exception:  # NVMLError_NotSupported, InvalidArgument past the last link
                    continue
                peer = by_bus.get(normalize_bus_id(remote.busId))
                if peer is not None and peer != i:
                    links.add((i, peer))
        return GpuInventory(gpus=tuple(gpus), islands=islands_from_links(count, links))
    except Exception as exc:
        warn(f"NVML query failed ({exc}): reporting 0 GPUs")
        return GpuInventory()
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def load_nvml() -> Any:
    """The pynvml module, or None when it is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


# ------------------------------------------------------------------- mock mode


def parse_mock_nvlink(text: str, count: int) -> tuple[tuple[int, ...], ...]:
    """Islands from ``all``, ``none`` or ``0-1,2-3`` (ranges and single indices; ``0+2``
    joins non-adjacent GPUs). GPUs not named form islands of their own.

    Raises ValueError naming the problem.
    """
    text = text.strip().lower()
    if count == 0:
        return ()
    if text in ("", "all"):
        return (tuple(range(count)),)
    if text == "none":
        return tuple((i,) for i in range(count))
    seen: set[int] = set()
    islands: list[tuple[int, ...]] = []
    for part in text.split(","):
        members: list[int] = []
        for piece in part.strip().split("+"):
            lo, sep, hi = piece.strip().partition("-")
            try:
                first = int(lo)
                last = int(hi) if sep else first
            except ValueError:
                raise ValueError(
                    f"--mock-nvlink: {part.strip()!r} is not a GPU range such as 0-3"
                ) from None
            if first > last:
                raise ValueError(f"--mock-nvlink: range {piece.strip()!r} is backwards")
            members.extend(range(first, last + 1))
        for gpu in members:
            if not 0 <= gpu < count:
                raise ValueError(f"--mock-nvlink: GPU {gpu} is outside 0..{count - 1}")
            if gpu in seen:
                raise ValueError(f"--mock-nvlink: GPU {gpu} is in two islands")
            seen.add(gpu)
        islands.append(tuple(sorted(members)))
    islands.extend((i,) for i in range(count) if i not in seen)
    return tuple(sorted(islands))


def mock_gpus(
    count: int, nvlink: str = "all", model: str = "mock-gpu", memory: int = 81_920
) -> GpuInventory:
    if count < 0:
        raise ValueError("--mock-gpus must be >= 0")
    gpus = tuple(
        GpuInfo(index=i, model=model, memory_mib=memory, uuid=f"GPU-mock-{i:04d}")
        for i in range(count)
    )
    return GpuInventory(gpus=gpus, islands=parse_mock_nvlink(nvlink, count))
