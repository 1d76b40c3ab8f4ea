"""Slurm's host lists: ``node[01-04,07],gpu-a`` as host names, and back.

What ``scontrol show hostnames`` and ``scontrol show hostlist`` do, for the scripts that
expand ``$SLURM_JOB_NODELIST`` (``scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n
1``). A list is comma-separated; a bracket holds comma-separated numbers and ranges
``lo-hi``, whose width is kept when ``lo`` has leading zeros (``[08-10]`` is 08, 09, 10);
a name may hold several brackets (``r[1-2]n[1-3]``: every combination, leftmost slowest,
as Slurm orders them). Duplicates are kept, in order. Malformed input raises
:class:`HostListError` naming the piece and the rule.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator, Sequence

MAX_HOSTS = 100_000  # no real allocation comes near; a typo like [1-99999999] is refused
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_TRAILING_NUMBER = re.compile(r"^(.*?)(\d+)$")


class HostListError(ValueError):
    """A host list that breaks a rule: ``piece`` is the part at fault."""

    def __init__(self, piece: str, rule: str) -> None:
        super().__init__(f"{piece!r}: {rule}")
        self.piece = piece
        self.rule = rule


def expand(text: str) -> list[str]:
    """Every host name ``text`` names, in order."""
    out: list[str] = []
    for item in _items(text.strip()):
        for host in _expand_item(item):
            out.append(host)
            if len(out) > MAX_HOSTS:
                raise HostListError(text[:80], f"names more than {MAX_HOSTS:,} hosts")
    return out


def expand_all(lists: Iterable[str]) -> list[str]:
    """:func:`expand` of each of ``lists`` (as ``scontrol`` reads several arguments)."""
    return [host for text in lists for host in expand(text)]


def compress(hosts: Sequence[str]) -> str:
    """The shortest usual form of ``hosts`` in their order: runs of names that differ
    only in a trailing number of the same width, consecutive, share one bracket
    (``n1,n2,n3,x`` is ``n[1-3],x``). ``expand(compress(h)) == h``."""
    out: list[str] = []
    i = 0
    while i < len(hosts):
        match = _TRAILING_NUMBER.match(hosts[i])
        if match is None:
            out.append(hosts[i])
            i += 1
            continue
        prefix, digits = match.groups()
        numbers = [digits]
        j = i + 1
        while j < len(hosts):
            later = _TRAILING_NUMBER.match(hosts[j])
            if later is None or later.group(1) != prefix or not _same_width(digits, later[2]):
                break
            numbers.append(later.group(2))
            j += 1
        if len(numbers) == 1:
            out.append(hosts[i])
        else:
            out.append(f"{prefix}[{','.join(_ranges(numbers))}]")
        i = j
    return ",".join(out)


def _same_width(a: str, b: str) -> bool:
    """Whether two numbers of names print alike in one bracket: the same width when
    either is zero-padded."""
    padded = (a.startswith("0") and len(a) > 1) or (b.startswith("0") and len(b) > 1)
    return len(a) == len(b) if padded else True


def _ranges(numbers: Sequence[str]) -> Iterator[str]:
    """``numbers`` (in order) as comma pieces, consecutive runs as ``lo-hi``."""
    start = 0
    for k in range(1, len(numbers) + 1):
        if k < len(numbers) and int(numbers[k]) == int(numbers[k - 1]) + 1:
            continue
        lo, hi = numbers[start], numbers[k - 1]
        yield lo if start == k - 1 else f"{lo}-{hi}"
        start = k


def _items(text: str) -> Iterator[str]:
    """The comma-separated items of a list, commas inside brackets kept."""
    if not text:
        return
    depth, start = 0, 0
    for k, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostListError(text, "brackets do not nest")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostListError(text, "a ']' without its '['")
        elif ch == "," and depth == 0:
            yield _item(text[start:k], text)
            start = k + 1
    if depth:
        raise HostListError(text, "a '[' without its ']'")
    yield _item(text[start:], text)


def _item(item: str, text: str) -> str:
    item = item.strip()
    if not item:
        raise HostListError(text, "an empty host name (two commas, or one at an end)")
    if any(ch.isspace() for ch in item):
        raise HostListError(item, "a host name has no spaces")
    return item


def _expand_item(item: str) -> Iterator[str]:
    """One item's names: literal parts and brackets, every combination in order."""
    parts: list[list[str]] = []
    rest = item
    while rest:
        open_at = rest.find("[")
        if open_at < 0:
            parts.append([rest])
            break
        close_at = rest.index("]", open_at)
        if open_at:
            parts.append([rest[:open_at]])
        parts.append(_bracket(rest[open_at + 1 : close_at], item))
        rest = rest[close_at + 1 :]
    for combination in itertools.product(*parts):
        yield "".join(combination)


def _bracket(inside: str, item: str) -> list[str]:
    if not inside:
        raise HostListError(item, "an empty bracket")
    out: list[str] = []
    for piece in inside.split(","):
        match = _RANGE.match(piece.strip())
        if match is None:
            raise HostListError(item, f"{piece!r} in a bracket: give N or LO-HI")
        lo, hi = match.group(1), match.group(2)
        if hi is None:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise HostListError(item, f"{piece!r}: the range ends before it starts")
        if int(hi) - int(lo) >= MAX_HOSTS:
            raise HostListError(item, f"{piece!r} names more than {MAX_HOSTS:,} hosts")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        out.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return out
