"""The checker's rules for member replacement (``on_node_failure: replace``, DESIGN §4),
pure functions of a :class:`~chaos.history.History`.

A gang with ``replace:`` keeps its attempt (and its fencing token) when one member's node
dies or a GPU under it faults: that rank is placed again with the next generation once
its old member is known stopped. A member is therefore (job, token, rank, generation);
every member record and every sink decision names its generation
(``$SYNAPSE_MEMBER_GENERATION``, 0 as bound with the attempt).

``rank-twice``
    No (job, token, rank) ran in two generations at once: once a member of a newer
    generation of the rank has written its first record, no member of an older
    generation of that rank writes any record. The ``overlap`` rule's tolerance applies:
    a record of an attempt frozen with its host, written while frozen or within
    ``THAW_KILL_BOUND_MS`` after the thaw, is excused (nothing on a frozen host can act
    before the thaw; its supervisor stops it then, and the sink fences what it asks).
``replaced-before-fenced``
    A replaced member was still at work when its replacement started: the sink accepted
    an effect of a generation of (job, token, rank) after a member of a newer generation
    of that rank had written its ``start`` record, even when the sink had not yet seen
    the newer generation's claim. The old member's write reached the resource, so it was
    not fenced when the new one started.

The rules that key on attempts hold with generations too: a replacement is the same
attempt, so ``overlap``, ``token-order`` and exactly-once see one attempt; ``gpu-reuse``
and ``duplicate-member`` compare members, generations apart; ``duplicate-effect`` counts
the acceptances of each generation (a replacement re-runs its rank and commits it again).
"""

from __future__ import annotations

from collections import defaultdict

from chaos.history import History, MemberRecord, Violation, frozen_attempts, in_thaw_window

Member = tuple[str, int, int, int]  # (job, fencing token, rank, generation)
Rank = tuple[str, int, int]  # (job, fencing token, rank)


def first_records(history: History) -> dict[Rank, dict[int, int]]:
    """(job, token, rank) -> generation -> the time of its first record."""
    out: dict[Rank, dict[int, int]] = defaultdict(dict)
    for r in history.members:
        seen = out[(r.job, r.token, r.rank)]
        if r.generation not in seen or r.mono_ns < seen[r.generation]:
            seen[r.generation] = r.mono_ns
    return out


def start_records(history: History) -> dict[Rank, dict[int, int]]:
    """(job, token, rank) -> generation -> the time of its first ``start`` record."""
    out: dict[Rank, dict[int, int]] = defaultdict(dict)
    for r in history.members:
        if r.type != "start":
            continue
        seen = out[(r.job, r.token, r.rank)]
        if r.generation not in seen or r.mono_ns < seen[r.generation]:
            seen[r.generation] = r.mono_ns
    return out


def check_rank_twice(history: History) -> list[Violation]:
    """``rank-twice`` (see the module docstring)."""
    firsts = first_records(history)
    if not any(len(gens) > 1 for gens in firsts.values()):
        return []
    thaws = frozen_attempts(history)
    out: list[Violation] = []
    reported: set[tuple[Member, int]] = set()
    for r in sorted(history.members, key=lambda r: r.mono_ns):
        for newer, started in sorted(firsts[(r.job, r.token, r.rank)].items()):
            if newer <= r.generation or r.mono_ns < started or (r.member, newer) in reported:
                continue
            if in_thaw_window(r, thaws):
                continue
            reported.add((r.member, newer))
            out.append(Violation("rank-twice", r.job, _twice(r, newer, started)))
    return out


def _twice(r: MemberRecord, newer: int, started: int) -> str:
    return (
        f"rank {r.rank} of token {r.token}: generation {r.generation} on {r.node} (pid "
        f"{r.pid}) wrote '{r.type}' {(r.mono_ns - started) / 1e6:.0f} ms after generation "
        f"{newer} started"
    )


def check_replaced_before_fenced(history: History) -> list[Violation]:
    """``replaced-before-fenced`` (see the module docstring)."""
    starts = start_records(history)
    out: list[Violation] = []
    for e in history.effects:
        if not e.accepted:
            continue
        newer = sorted(
            g
            for g, at in starts.get((e.job, e.token, e.rank), {}).items()
            if g > e.generation and at < e.mono_ns
        )
        if newer:
            out.append(
                Violation(
                    "replaced-before-fenced",
                    e.job,
                    f"sink accepted rank {e.rank} of token {e.token} from generation "
                    f"{e.generation} after generation {newer[-1]} of the rank had started",
                )
            )
    return out


def check_replacements(history: History) -> list[Violation]:
    """Both rules."""
    return check_rank_twice(history) + check_replaced_before_fenced(history)


def went_on_after(history: History) -> dict[tuple[str, int], list[int]]:
    """(job, token) -> when each of its replacement members (generation 1 and up) wrote
    its first record: the attempt lived on past those moments, its lost ranks placed
    again."""
    out: dict[tuple[str, int], list[int]] = defaultdict(list)
    for (job, token, _), gens in first_records(history).items():
        out[(job, token)] += [at for g, at in gens.items() if g > 0]
    return out


def nodes_of(history: History) -> dict[Member, set[str]]:
    """Each member -> the nodes its records name."""
    out: dict[Member, set[str]] = defaultdict(set)
    for r in history.members:
        out[r.member].add(r.node)
    return out


def replaced_ranks(history: History) -> list[str]:
    """``job/token rank r: generations 0-N`` for every rank placed again (the report
    lists them)."""
    return sorted(
        f"{job}/{token} rank {rank}: generations {min(gens)}-{max(gens)}"
        for (job, token, rank), gens in first_records(history).items()
        if max(gens) > 0
    )
