"""The records a member's supervisor and the agent keep in the member's directory, and
the lease file they both read.

Every record is a JSON object written atomically (readers see the old file or the whole
new one), mode 0600 unless said otherwise, and neither written nor read through a link:
the agent acts as root on what it reads back. A record written once the member runs
can take its disk space in advance (:func:`reserve`), so that a disk that fills up
meanwhile cannot keep it from being written.

Part of the supervisor (:mod:`synapse_ha.worker.shim`): standard library only, and
neither pathlib nor typing, which would slow every member start.
"""

from __future__ import annotations

import contextlib
import json
import os

# No typing at run time: mypy reads the annotations; the interpreter never imports it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    StrPath = str | os.PathLike[str]

# Room kept for a record written later on a disk that may be full by then.
RESERVED_BYTES = 4096


def write_json_atomic(path: StrPath, doc: dict[str, Any], mode: int = 0o600) -> None:
    """Write ``doc`` so that readers see either the old file or the whole new one; the
    file gets ``mode`` (by default readable by its writer alone) and a link planted at
    the temporary name is replaced, never followed."""
    head, name = os.path.split(os.fspath(path))
    tmp = os.path.join(head, f".{name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with open(fd, "w", encoding="utf-8") as f:
        os.fchmod(fd, mode)  # whatever the umask took away
        json.dump(doc, f)
    os.replace(tmp, path)


def reserve(path: StrPath) -> None:
    """Take ``RESERVED_BYTES`` of disk now for ``path``'s record (written later by
    :func:`write_reserved`). Raises ``OSError`` (ENOSPC) when the disk is full already."""
    fd = os.open(
        f"{os.fspath(path)}.reserved", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600
    )
    with open(fd, "wb") as f:
        f.write(b" " * RESERVED_BYTES)
        f.flush()


def write_reserved(path: StrPath, doc: dict[str, Any]) -> None:
    """Write ``doc`` into the room :func:`reserve` took (no new disk space needed) and
    rename it to ``path``: readers see no file or the whole record. Without a
    reservation, as :func:`write_json_atomic`."""
    room = f"{os.fspath(path)}.reserved"
    data = json.dumps(doc).encode()
    if not os.path.exists(room) or len(data) > RESERVED_BYTES:
        write_json_atomic(path, doc)
        return
    with open(os.open(room, os.O_RDWR | os.O_NOFOLLOW), "r+b") as f:
        f.write(data)
        f.truncate(len(data))
    os.replace(room, path)


def read_json(path: StrPath) -> dict[str, Any] | None:
    """The JSON object in ``path`` (never through a link), or None."""
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def read_lease_deadline(path: StrPath) -> float:
    """The monotonic deadline in the lease file; 0 (expired) when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return float(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0.0
