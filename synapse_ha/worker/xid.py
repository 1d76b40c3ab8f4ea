"""The Xid table: what the worker does when the driver reports an Xid on a GPU.

An Xid is the NVIDIA driver's numbered report of a GPU error (the kernel log's
``NVRM: Xid``, and NVML's ``nvmlEventTypeXidCriticalError`` events). Each code maps to
one action:

* ``unhealthy``: the GPU is named unhealthy (fault code ``xid-<code>``) in every
  heartbeat until the worker restarts; the scheduler stops placing on it and requeues
  the gang holding it (DESIGN §4, "GPU health is replicated state").
* ``report``: the Xid is logged at WARNING and nothing else happens. These are the Xids
  an application causes (an illegal address, a page fault in its own memory, a channel
  reset after its own error): the process dies, the GPU is fine.

An Xid not in the table is reported, not fatal: a GPU is taken out of service only for a
code known to mean the hardware needs a reset or a repair. Operators override any entry
(or add codes) with ``[gpu_health] xid_actions`` in the worker's configuration.

Sources the defaults follow (their classifications, not their text):

* NVIDIA's "XID Errors" catalog (GPU deployment and management documentation, Xid error
  listing with possible causes and recommended actions: application error, driver error,
  reset GPU, reboot, hardware inspection);
* the DCGM health watches (``DCGM_HEALTH_WATCH_MEM``, ``_NVLINK``, ``_PCIE``, ``_PMU``/
  ``_MCU``, ``_DRIVER``): double-bit ECC, page retirement and row remapping failures,
  NVLink errors, a GPU off the bus and micro-controller halts count as failures;
* NVIDIA NVSentinel's Xid classification (its syslog health monitor maps each Xid to a
  recommended action, from none to a GPU reset or a node reboot), and the NVIDIA
  Kubernetes device plugin, which by default ignores the application Xids 13, 31, 43,
  45, 68 and 109 and marks a device unhealthy on any other critical Xid;
* Slurm node health check (NHC) practice: drain a node on Xid 79 (fallen off the bus),
  48 (double-bit ECC) and the uncorrectable ECC family; leave application Xids to the
  job's own exit.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


class XidAction(enum.Enum):
    UNHEALTHY = "unhealthy"
    REPORT = "report"


@dataclass(frozen=True, slots=True)
class XidEntry:
    action: XidAction
    name: str  # the catalog's short description, for logs and fault details


_U, _R = XidAction.UNHEALTHY, XidAction.REPORT

DEFAULT_XIDS: Mapping[int, XidEntry] = {
    13: XidEntry(_R, "graphics engine exception (application)"),
    31: XidEntry(_R, "GPU memory page fault (application)"),
    32: XidEntry(_R, "invalid or corrupted push buffer stream"),
    43: XidEntry(_R, "GPU stopped processing (application)"),
    45: XidEntry(_R, "preemptive cleanup after previous errors"),
    48: XidEntry(_U, "double-bit ECC error"),
    61: XidEntry(_R, "internal micro-controller breakpoint/warning"),
    62: XidEntry(_U, "internal micro-controller halt"),
    63: XidEntry(_U, "ECC page retirement or row remapping event"),
    64: XidEntry(_U, "ECC page retirement or row remapping failure"),
    68: XidEntry(_R, "video processor exception"),
    69: XidEntry(_R, "graphics engine class error"),
    74: XidEntry(_U, "NVLink error"),
    79: XidEntry(_U, "GPU has fallen off the bus"),
    92: XidEntry(_U, "high single-bit ECC error rate"),
    94: XidEntry(_U, "contained ECC error"),
    95: XidEntry(_U, "uncontained ECC error"),
    109: XidEntry(_R, "context switch timeout"),
    119: XidEntry(_U, "GSP RPC timeout"),
    120: XidEntry(_U, "GSP error"),
    121: XidEntry(_R, "C2C link corrected error"),
    140: XidEntry(_U, "unrecovered ECC error"),
    154: XidEntry(_U, "GPU recovery action changed (reset or reboot required)"),
}

MAX_XID = 65535


class XidTable:
    """The defaults with an operator's overrides applied; :meth:`entry` never fails."""

    def __init__(self, overrides: Iterable[tuple[int, XidAction]] = ()) -> None:
        self._entries = dict(DEFAULT_XIDS)
        for code, action in overrides:
            known = self._entries.get(code)
            self._entries[code] = XidEntry(action, known.name if known else f"Xid {code}")

    def entry(self, code: int) -> XidEntry:
        known = self._entries.get(code)
        return known if known is not None else XidEntry(_R, "not in the Xid table")

    def unhealthy(self) -> frozenset[int]:
        """The codes that make a GPU unhealthy."""
        return frozenset(c for c, e in self._entries.items() if e.action is _U)


def parse_xid_actions(value: object, where: str) -> tuple[tuple[int, XidAction], ...]:
    """Overrides from the file's table (``{"13" = "unhealthy"}``) or the flags' list
    (``["13=unhealthy"]``), sorted by code. Raises ValueError naming ``where`` (with the
    code, for a table) and the rule broken."""
    pairs: list[tuple[str, str, str]] = []
    if isinstance(value, Mapping):
        pairs = [(str(k), str(v), f"{where}.{k}") for k, v in value.items()]
    elif isinstance(value, list | tuple):
        for item in value:
            code, sep, action = str(item).partition("=")
            if not sep:
                raise ValueError(f"{where}: {item!r} is not XID=ACTION (e.g. 13=unhealthy)")
            pairs.append((code.strip(), action.strip(), where))
    else:
        raise ValueError(f"{where}: must be a table of Xid = action")
    out: dict[int, XidAction] = {}
    choices = " or ".join(repr(a.value) for a in XidAction)
    for code, action, name in pairs:
        if not code.isdigit() or not 1 <= int(code) <= MAX_XID:
            raise ValueError(f"{name}: {code!r} is not an Xid (a number from 1 to {MAX_XID})")
        try:
            out[int(code)] = XidAction(action)
        except ValueError:
            raise ValueError(f"{name}: the action must be {choices}, got {action!r}") from None
    return tuple(sorted(out.items()))
