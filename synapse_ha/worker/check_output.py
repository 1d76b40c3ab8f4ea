"""What a failing check says: the first non-empty line of its output (standard output,
else standard error), bounded to 256 printable characters, or how it ended when it
printed nothing. Shared by the health-check program
(:mod:`~synapse_ha.worker.health_check`) and a job's pre-start check
(:mod:`~synapse_ha.worker.shim_prestart`).

Part of the supervisor: standard library only (see :mod:`synapse_ha.worker.shim`).
"""

from __future__ import annotations

MAX_MESSAGE = 256
READ_LIMIT = 65_536  # of each stream: the first line is all that is kept


def first_line(stdout: bytes, stderr: bytes) -> str:
    """The first non-empty line of ``stdout``, else of ``stderr`` ("" when both are
    blank), with unprintable characters replaced and at most :data:`MAX_MESSAGE` long."""
    for stream in (stdout, stderr):
        for raw in stream.decode("utf-8", errors="replace").splitlines():
            line = "".join(c if c.isprintable() else "?" for c in raw.strip())
            if line:
                return line[:MAX_MESSAGE]
    return ""


def seconds_text(seconds: float) -> str:
    """``60s``, ``1.5s``."""
    return f"{seconds:g}s"


def ending(returncode: int | None, timeout_s: float) -> str:
    """How a check ended, for one that printed nothing: ``exited 3``, ``killed by signal
    9``, or (``returncode`` None) ``timed out after 60s``."""
    if returncode is None:
        return f"timed out after {seconds_text(timeout_s)}"
    if returncode < 0:
        return f"killed by signal {-returncode}"
    return f"exited {returncode}"


def failure_message(returncode: int | None, timeout_s: float, stdout: bytes, stderr: bytes) -> str:
    """What a failing check says (``returncode`` None: it timed out)."""
    return first_line(stdout, stderr) or ending(returncode, timeout_s)
