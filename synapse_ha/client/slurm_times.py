"""Slurm's ways of writing times, as sbatch reads them: a time limit (``--time``) and
a moment (``--begin``, ``--deadline``)."""

from __future__ import annotations

import datetime
import re

_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def time_seconds(value: str) -> int:
    """Slurm's time formats: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``."""
    match = _TIME.match(value.strip())
    if not match or value.strip() in ("0", "UNLIMITED", "INFINITE"):
        raise ValueError("give a time limit such as 90, 1:30:00 or 2-00:00:00")
    days, a, b, c = (int(g) if g else None for g in match.groups())
    if days is not None:  # D-H[:M[:S]]
        return days * 86_400 + (a or 0) * 3_600 + (b or 0) * 60 + (c or 0)
    if c is not None:  # H:M:S
        return (a or 0) * 3_600 + (b or 0) * 60 + c
    if b is not None:  # M:S
        return (a or 0) * 60 + b
    return (a or 0) * 60  # M


_BEGIN_UNITS = {"": 1, "s": 1, "sec": 1, "second": 1, "seconds": 1, "m": 60, "min": 60,
                "minute": 60, "minutes": 60, "h": 3600, "hour": 3600, "hours": 3600,
                "d": 86_400, "day": 86_400, "days": 86_400, "week": 604_800,
                "weeks": 604_800}  # fmt: skip
_BEGIN_RELATIVE = re.compile(r"^now\+(\d+)([a-z]*)$")
_BEGIN_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2})?)?$")
_BEGIN_CLOCK = re.compile(r"^\d{2}:\d{2}(:\d{2})?$")


def begin_text(value: str, now: datetime.datetime) -> str:
    """``begin:`` for sbatch's ``--begin`` (``now+2hours``, ``2026-12-01T02:00``,
    ``16:00``): a delay, or the time in UTC of a date and time read in ``now``'s zone (the
    submitting machine's, as sbatch reads them); a clock time already past is tomorrow's."""
    text = value.strip()
    relative = _BEGIN_RELATIVE.match(text)
    if relative:
        unit = _BEGIN_UNITS.get(relative.group(2))
        if unit is None:
            raise ValueError(f"{relative.group(2)!r}: give seconds, minutes, hours, days or weeks")
        return f"+{int(relative.group(1)) * unit}s"
    if _BEGIN_DATE.match(text):
        at = datetime.datetime.fromisoformat(text).replace(tzinfo=now.tzinfo)
    elif _BEGIN_CLOCK.match(text):
        clock = datetime.time.fromisoformat(text)
        at = datetime.datetime.combine(now.date(), clock, tzinfo=now.tzinfo)
        if at <= now:
            at += datetime.timedelta(days=1)
    else:
        raise ValueError(
            "give now+N[seconds|minutes|hours|days|weeks], YYYY-MM-DD[THH:MM[:SS]] or "
            "HH:MM[:SS] (midnight, noon, teatime and MMDDYY are not supported)"
        )
    return at.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
