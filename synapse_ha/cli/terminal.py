"""What synctl may print on a terminal.

Table output, notes and error lines show text the cluster, a job or a node controls
(reasons, explanations, event details, node addresses, ...). Every such string goes
through :func:`terminal_safe` before it is printed: control characters (C0 and C1, ESC,
DEL, carriage return, backspace), Unicode line separators and bidirectional controls are
written as visible escapes (``\x1b``, ``\r``, ``\u202e``), so a job cannot retitle, clear
or rewrite the operator's terminal, nor hide or reorder text. JSON is escaped by its
encoder, YAML by PyYAML's emitter (``allow_unicode`` off: every non-printable and
non-ASCII character is written as an escape).
"""

from __future__ import annotations

import re

# What a terminal may act on instead of showing: C0 controls (ESC, CR, BS, BEL among
# them), DEL and C1 controls (CSI, OSC, NEL as single code points), the Unicode line and
# paragraph separators, and the bidirectional controls that reorder what is shown.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b"}
# ``keep`` for :func:`terminal_safe`
MULTILINE = "\n"  # text whose lines are the cluster's layout (an explanation, a table)
LOG_LINE = "\t"  # a line of a member's output: tabs only move the cursor forward


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[char]
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def terminal_safe(text: str, keep: str = "") -> str:
    """``text`` as it may be printed on a terminal: every character :data:`_UNSAFE`
    names is written as a visible escape (``\\x1b``, ``\\r``, ``\\b``, ``\\u202e``),
    except those in ``keep`` (:data:`MULTILINE`, :data:`LOG_LINE`). The one rule for all
    of synctl's table and text output; idempotent (escapes are printable)."""
    if not _UNSAFE.search(text):
        return text
    if keep:
        return _UNSAFE.sub(lambda m: m.group() if m.group() in keep else _escape(m), text)
    return _UNSAFE.sub(_escape, text)
