"""A wall-clock offset for one process of the chaos suite (the clock-jump faults).

When ``SYNAPSE_CHAOS_CLOCK_FILE`` names a file, ``time.time`` and ``time.time_ns`` return
the real wall clock plus the offset in seconds written in that file (re-read at most
every 50 ms; a missing or unreadable file keeps the last offset). The monotonic clocks are
untouched, as they are when an operator or NTP steps a real machine's clock.

The suite puts this directory first on a replica's ``PYTHONPATH``, so Python imports this
module at start-up before any of the program's modules (which therefore see the patched
functions, also where they did ``from time import time``). Only Python's view of the wall
clock moves: ``datetime.now``, gRPC's C core and OpenSSL keep the real clock.
"""

from __future__ import annotations

import os
import time

_PATH = os.environ.get("SYNAPSE_CHAOS_CLOCK_FILE", "")
_REREAD_S = 0.05

if _PATH:
    _real_time = time.time
    _real_time_ns = time.time_ns
    _monotonic = time.monotonic
    _state = [0.0, -1.0]  # offset in seconds, monotonic time of the next read

    def _offset() -> float:
        now = _monotonic()
        if now >= _state[1]:
            _state[1] = now + _REREAD_S
            try:
                with open(_PATH, encoding="ascii") as f:
                    _state[0] = float(f.read().strip() or 0.0)
            except (OSError, ValueError):
                pass
        return _state[0]

    def _time() -> float:
        return _real_time() + _offset()

    def _time_ns() -> int:
        return _real_time_ns() + int(_offset() * 1e9)

    time.time = _time
    time.time_ns = _time_ns
