"""Times, durations and quantities as people read them (``synctl``'s tables and the
dashboard's pages), and times as scripts parse them.

Pure functions: the present (``now_ms``) and the time zone (``tz``, default the local
one) are arguments, so the same inputs give the same text. Times arrive as milliseconds
since the Unix epoch; 0 and None both mean "not yet" (or "never").

* :func:`local_time` ``2026-11-28 22:39:20 CET``; :func:`short_time` the same cut to
  what differs from now (``22:39:20`` today, ``Nov 27 22:39`` this year).
* :func:`clock` ``8m47s``, ``2h05m``, ``3d04h``: two units at most.
* :func:`relative` ``in 8m47s`` or ``8m47s ago``.
* :func:`iso` ``2026-11-28T21:39:20.123Z``: the ISO-8601 string JSON carries next to
  each ``*_at_ms`` field (:func:`with_iso`).
* :func:`job_durations` a job's wait in the queue, elapsed run time and time left.
* :func:`parse_moment` ``7d`` (back from now) or ``2024-10-01T12:00`` (UTC) as a time.
* :func:`cpu_text` ``1.5`` (of millicores) and :func:`memory_text` ``256Gi`` (of MiB).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from synapse_ha.core.spec.document import SpecError, parse_duration

_SECOND = 1000
_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", _SECOND))


def _moment(ms: int, tz: datetime.tzinfo | None) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).astimezone(tz)


def iso(ms: int | None) -> str | None:
    """``2026-11-28T21:39:20.123Z`` (UTC, milliseconds); None for no time."""
    if not ms:
        return None
    text = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(
        timespec="milliseconds"
    )
    return text.replace("+00:00", "Z")


def local_time(ms: int | None, tz: datetime.tzinfo | None = None) -> str:
    """``2026-11-28 22:39:20 CET`` in ``tz`` (default: the local zone); ``-`` for none."""
    if not ms:
        return "-"
    return _moment(ms, tz).strftime("%Y-%m-%d %H:%M:%S %Z").rstrip()


def short_time(ms: int | None, now_ms: int, tz: datetime.tzinfo | None = None) -> str:
    """A time for a table column: ``22:39:20`` on the day of ``now_ms``, ``Nov 27 22:39``
    in its year, else ``2025-11-27``; ``-`` for none."""
    if not ms:
        return "-"
    moment, now = _moment(ms, tz), _moment(now_ms, tz)
    if moment.date() == now.date():
        return moment.strftime("%H:%M:%S")
    if moment.year == now.year:
        return moment.strftime("%b %d %H:%M")
    return moment.strftime("%Y-%m-%d")


def clock(ms: int | None) -> str:
    """A duration in its two largest units: ``0.4s``, ``47s``, ``8m47s``, ``2h05m``,
    ``3d04h``; ``-`` for none. Rounded down: a time limit with 59.9 s left reads 59s."""
    if ms is None:
        return "-"
    ms = max(0, ms)
    if ms < 10 * _SECOND:
        return f"{ms // 100 / 10:g}s"
    for i, (unit, size) in enumerate(_UNITS[:-1]):
        if ms >= size:
            small, small_size = _UNITS[i + 1]
            return f"{ms // size}{unit}{ms % size // small_size:02d}{small}"
    return f"{ms // _SECOND}s"


def relative(ms: int | None, now_ms: int) -> str:
    """``in 8m47s`` for a time ahead of ``now_ms``, ``8m47s ago`` for one behind."""
    if not ms:
        return "-"
    if ms > now_ms:
        return f"in {clock(ms - now_ms)}"
    return f"{clock(now_ms - ms)} ago"


def with_iso(doc: Mapping[str, Any], *fields: str) -> dict[str, Any]:
    """``doc`` with, after each ``<name>_ms`` of ``fields``, ``<name>``: its ISO-8601
    string (None when the time is)."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        out[key] = value
        if key in fields:
            out[key.removesuffix("_ms")] = iso(value)
    return out


def job_durations(
    *,
    submitted_ms: int | None,
    started_ms: int | None,
    ended_ms: int | None,
    time_limit_ms: int,
    now_ms: int,
) -> dict[str, int | None]:
    """``{wait_ms, elapsed_ms, time_left_ms}`` of a job whose current or last attempt
    started at ``started_ms`` (its bind, or its members running once they reported it)
    and ended at ``ended_ms`` (None: still running or never started).

    ``wait_ms``: submission to start (to now while it waits; None when it never started
    and is over). ``elapsed_ms``: start to end (to now while it runs). ``time_left_ms``:
    what the time limit leaves while it runs (None without a limit or a live attempt).
    """
    live = bool(started_ms) and not ended_ms
    if started_ms:
        wait = max(0, started_ms - submitted_ms) if submitted_ms else None
        elapsed: int | None = max(0, (ended_ms or now_ms) - started_ms)
    else:
        wait = max(0, now_ms - submitted_ms) if submitted_ms and not ended_ms else None
        elapsed = None
    left = max(0, time_limit_ms - (elapsed or 0)) if live and time_limit_ms > 0 else None
    return {"wait_ms": wait, "elapsed_ms": elapsed, "time_left_ms": left}


def parse_moment(text: str, now_ms: int, option: str = "since") -> int | None:
    """A point in time as epoch milliseconds: a duration back from ``now_ms`` (``7d``,
    ``12h``, ``30m``) or a UTC date or time (``2024-10-01``, ``2024-10-01T12:00``);
    None when it is neither."""
    text = text.strip()
    try:
        return max(0, now_ms - parse_duration(text, option))
    except SpecError:
        pass
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


def cpu_text(milli: int) -> str:
    return f"{milli / 1000:g}"


def memory_text(mib: int) -> str:
    if mib == 0:
        return "0"
    for unit, size in (("Ti", 1024 * 1024), ("Gi", 1024)):
        if mib >= size and mib % size == 0:
            return f"{mib // size}{unit}"
    if mib >= 1024:
        return f"{mib / 1024:.1f}Gi"
    return f"{mib}Mi"
