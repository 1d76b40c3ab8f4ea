"""A job's window (DESIGN §6, ``begin:`` and ``deadline:``): when it may first be
considered for placement, and when a job still pending gives up.

Each is given as a time (``2026-12-01T02:00Z``: an ISO 8601 time with its time zone, held
as milliseconds since the epoch) or as a delay after the submission (``+2h``). A delay is
resolved by the state machine with the submission's command time, the cluster's
replicated clock, never a replica's own. A job with a begin time is not considered
before it (reason ``begin_time``); a job still pending at its deadline is cancelled with
reason ``deadline`` by a command the leader proposes when it comes due
(:class:`~synapse_ha.core.commands.ExpireDeadline`), verified at apply.
"""

from __future__ import annotations

import calendar
import re

# Times from 2000 to 2200; delays of at most a year.
MIN_TIME_MS = 946_684_800_000
MAX_TIME_MS = 7_258_118_400_000
MAX_DELAY_MS = 366 * 24 * 3600 * 1000


def window_problems(
    begin_at_ms: int, begin_delay_ms: int, deadline_at_ms: int, deadline_delay_ms: int
) -> list[tuple[str, str]]:
    """``(field, rule)`` for every rule the window breaks on its own (a deadline given
    as a time is checked against the submission's time at apply)."""
    out: list[tuple[str, str]] = []
    for field, at_ms, delay_ms in (
        ("begin", begin_at_ms, begin_delay_ms),
        ("deadline", deadline_at_ms, deadline_delay_ms),
    ):
        if at_ms and delay_ms:
            out.append((field, "give a time or a delay (+2h), not both"))
        elif at_ms and not MIN_TIME_MS <= at_ms <= MAX_TIME_MS:
            out.append((field, "must be a time between the years 2000 and 2200"))
        elif not 0 <= delay_ms <= MAX_DELAY_MS:
            out.append((field, "a delay must be between +0s and +366d"))
    if deadline_delay_ms and deadline_delay_ms <= begin_delay_ms and not begin_at_ms:
        out.append(("deadline", "must come after begin"))
    if deadline_at_ms and begin_at_ms and deadline_at_ms <= begin_at_ms:
        out.append(("deadline", "must come after begin"))
    return out


def resolved(at_ms: int, delay_ms: int, submitted_at_ms: int) -> int:
    """The time a begin or deadline stands for (0: none)."""
    if at_ms:
        return at_ms
    return submitted_at_ms + delay_ms if delay_ms else 0


_ISO = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,6}))?)?"
    r"(Z|[+-]\d{2}:?\d{2})$"
)


def parse_time(text: str) -> int | None:
    """Milliseconds since the epoch of an ISO 8601 time with its zone (``Z`` or an
    offset such as ``+01:00``): ``2026-12-01T02:00Z``, ``2026-12-01T03:00:00.5+01:00``;
    None when ``text`` is not one."""
    match = _ISO.match(text.strip())
    if match is None:
        return None
    year, month, day, hour, minute = (int(g) for g in match.groups()[:5])
    second = int(match.group(6) or 0)
    fraction_ms = int((match.group(7) or "0").ljust(6, "0")) // 1000
    if not (1 <= month <= 12 and 1 <= day <= calendar.monthrange(year, month)[1]):
        return None
    if hour > 23 or minute > 59 or second > 59:
        return None
    zone = match.group(8)
    offset_min = 0
    if zone != "Z":
        digits = zone[1:].replace(":", "")
        offset_min = int(digits[:2]) * 60 + int(digits[2:])
        offset_min = -offset_min if zone[0] == "-" else offset_min
    seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    return (seconds - offset_min * 60) * 1000 + fraction_ms


def time_text(ms: int) -> str:
    """``2026-12-01T02:00:00Z``: a time for people, in UTC (whole seconds)."""
    days, rest = divmod(ms // 1000, 86_400)
    hour, rest = divmod(rest, 3_600)
    minute, second = divmod(rest, 60)
    year, month, day = _civil(days)
    return f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}Z"


def _civil(days: int) -> tuple[int, int, int]:
    """The date ``days`` after 1970-01-01 (proleptic Gregorian calendar)."""
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1_460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, day
