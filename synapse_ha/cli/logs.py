"""How synctl prints members' output: :class:`LinePrinter`, the
:class:`~synapse_ha.client.logs.LogSink` that writes whole ``[rank N]`` lines.

Several members are followed at once, one thread per member
(:class:`~synapse_ha.client.logs.MemberFollower`); complete lines are written with a
``[rank N]`` prefix so that the interleaved output stays readable.

A member's output is the job's, and so may be written to attack the terminal it is shown
on (retitle it, clear it, rewrite earlier lines with carriage returns or backspaces).
:class:`LinePrinter` therefore shows every line through
:func:`~synapse_ha.cli.terminal.terminal_safe`, keeping tabs; only ``synctl logs --raw``
writes the bytes as the member wrote them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from synapse_ha.cli.terminal import LOG_LINE, terminal_safe

# A member's line longer than this is written in pieces (its output is not ours to hold).
MAX_LINE_BYTES = 64 * 1024


class LinePrinter:
    """Writes whole lines, prefixed with ``[rank N] `` when ``prefixed``, from several
    threads; keeps each member's partial last line until it is completed or flushed.

    Lines are decoded as UTF-8 once complete (invalid bytes become U+FFFD) and escaped
    with :func:`~synapse_ha.cli.terminal.terminal_safe`, and ``write`` gets text. With
    ``raw``, ``write`` gets each line's bytes exactly as the member wrote them (after the
    prefix, when there is one) instead. Either way a line is written without its newline
    and one longer than :data:`MAX_LINE_BYTES` in pieces."""

    def __init__(
        self, write: Callable[[str | bytes], None], prefixed: bool, raw: bool = False
    ) -> None:
        self._write = write
        self._prefixed = prefixed
        self._raw = raw
        self._lock = threading.Lock()
        self._partial: dict[int, bytes] = {}  # bytes: a character may span two chunks

    def feed(self, rank: int, data: bytes) -> None:
        *lines, rest = (self._partial.pop(rank, b"") + data).split(b"\n")
        while len(rest) > MAX_LINE_BYTES:
            lines.append(rest[:MAX_LINE_BYTES])
            rest = rest[MAX_LINE_BYTES:]
        if rest:
            self._partial[rank] = rest
        self._emit(rank, lines)

    def flush(self, rank: int) -> None:
        rest = self._partial.pop(rank, b"")
        self._emit(rank, [rest] if rest else [])

    def _emit(self, rank: int, lines: Sequence[bytes]) -> None:
        prefix = f"[rank {rank}] " if self._prefixed else ""
        with self._lock:
            for line in lines:
                if self._raw:
                    self._write(prefix.encode() + line)
                else:
                    text = line.decode("utf-8", errors="replace")
                    self._write(prefix + terminal_safe(text, keep=LOG_LINE))
