"""A job's pre-start check (DESIGN §6, ``prestart:``): a command each member's worker
runs on the member's node, as the member would run, before starting it. It exits 0 when
the node can run the member; otherwise the member is reported exited with cause
``node_cannot_run`` (the node's fault: the gang is requeued, the node is unfit for the
job's owner for a back-off)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PRESTART_TIMEOUT_MS = 60_000
MAX_PRESTART_TIMEOUT_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class Prestart:
    """The command (a shell string when ``shell``, else argv) and how long it may run."""

    command: tuple[str, ...]
    shell: bool = True
    timeout_ms: int = DEFAULT_PRESTART_TIMEOUT_MS
