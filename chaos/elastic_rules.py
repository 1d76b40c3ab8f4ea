"""The checker's rules for elastic gangs (``replicas: {min, max}``, core/elastic.py), pure
functions of a :class:`~chaos.history.History` and the final state.

An elastic gang's attempt keeps its fencing token while it grows (new top ranks) and
shrinks (its top ranks stopped and dropped); a rank given back may be grown again later in
the same attempt. The cluster starts it in a newer generation (``rank-twice`` of
:mod:`chaos.replace_rules` compares generations); these rules also hold a second process
of the same (job, token, rank, generation) to them. Its members name the gang's range in
their records (``elastic``: ``<min>:<max>``, chaos/member.py). A member process runs from
its first record to its last; as for ``overlap``, a record of an attempt frozen with its
host, written while frozen or within ``THAW_KILL_BOUND_MS`` after the thaw, is left out
(nothing on a frozen host acts before the thaw; the cluster may have moved on meanwhile).

``elastic-over-max``
    An elastic gang's attempt (job, token) never had more than ``max`` member processes
    running at once.
``rank-twice``
    (with :mod:`chaos.replace_rules`, which compares generations) No two processes of one
    (job, token, rank, generation) ran at once: a rank grown again after it was given back
    starts only once its old process is gone.
``elastic-below-min``
    An attempt of an elastic gang that succeeded never ran with fewer than ``min`` members
    between the moment ``min`` of them first ran at once and its first commit (a member's
    ``effect`` record): a shrink never takes a gang below its ``min``. An attempt that
    did not succeed (a member lost: node dead, fenced, GPU fault, preempted) is not
    judged, it ends; nor one frozen with a host (its members' spans stop at the freeze).

``duplicate-member`` leaves elastic gangs to ``rank-twice``: a rank given back and grown
again is started by a second process by design.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

from chaos.history import History, MemberRecord, Violation, frozen_attempts, in_thaw_window
from synapse_ha.core.model import AttemptState, ClusterState

Attempt = tuple[str, int]  # (job, fencing token)
# A member process: (job, token, rank, generation, PID namespace, start ticks, pid).
Process = tuple[str, int, int, int, int, int, int]
Span = tuple[int, int]  # its first and last record
# A member stopped while its attempt works on this much longer was given back (a gang
# ended whole stops its members within the workers' stop grace).
GAVE_BACK_MS = 2_000


def gang_range(text: str) -> tuple[int, int]:
    """``(min, max)`` of an ``elastic`` field ``<min>:<max>``."""
    fewest, _, most = text.partition(":")
    return int(fewest), int(most)


def process_of(r: MemberRecord) -> Process:
    return (r.job, r.token, r.rank, r.generation, r.pid_ns, r.start_ticks, r.pid)


def elastic_spans(history: History) -> tuple[dict[Process, Span], dict[Attempt, tuple[int, int]]]:
    """Every process of an elastic gang's member -> its span (records in a thaw window
    left out), and each elastic attempt -> its gang's ``(min, max)``."""
    thaws = frozen_attempts(history)
    spans: dict[Process, Span] = {}
    ranges: dict[Attempt, tuple[int, int]] = {}
    for r in history.members:
        if not r.elastic:
            continue
        ranges[(r.job, r.token)] = gang_range(r.elastic)
        if in_thaw_window(r, thaws):
            continue
        key = process_of(r)
        first, last = spans.get(key, (r.mono_ns, r.mono_ns))
        spans[key] = (min(first, r.mono_ns), max(last, r.mono_ns))
    return spans, ranges


def running_counts(spans: list[Span]) -> list[tuple[int, int]]:
    """``(instant, processes running just after it)`` at every start and end, in time
    order. At one instant, spans that end there are over before spans that start there
    begin, and a span of one record is over right after its start."""
    events: list[tuple[int, int]] = []  # (time, 0 end | 1 start | 2 end of a point)
    for first, last in spans:
        events += [(first, 1), (last, 2 if last == first else 0)]
    events.sort()
    out: list[tuple[int, int]] = []
    live = 0
    for at, kind in events:
        live += 1 if kind == 1 else -1
        out.append((at, live))
    return out


def by_attempt(spans: dict[Process, Span]) -> dict[Attempt, list[Span]]:
    out: dict[Attempt, list[Span]] = defaultdict(list)
    for key, span in spans.items():
        out[key[:2]].append(span)
    return out


def check_over_max(history: History) -> list[Violation]:
    """``elastic-over-max`` (see the module docstring)."""
    spans, ranges = elastic_spans(history)
    out: list[Violation] = []
    for (job, token), lives in sorted(by_attempt(spans).items()):
        most = ranges[(job, token)][1]
        excess = next(((at, n) for at, n in running_counts(lives) if n > most), None)
        if excess is not None:
            out.append(
                Violation(
                    "elastic-over-max",
                    job,
                    f"token {token}: {excess[1]} members ran at once (max {most}) "
                    f"at mono {excess[0] / 1e9:.3f} s",
                )
            )
    return out


def check_rank_regrown(history: History) -> list[Violation]:
    """``rank-twice`` for two processes of one (job, token, rank, generation) of an
    elastic gang (see the module docstring)."""
    spans, _ = elastic_spans(history)
    per_member: dict[tuple[str, int, int, int], list[tuple[Span, int]]] = defaultdict(list)
    for key, span in spans.items():
        per_member[key[:4]].append((span, key[6]))
    out: list[Violation] = []
    for (job, token, rank, gen), lives in sorted(per_member.items()):
        lives.sort()
        for (older, old_pid), (newer, new_pid) in itertools.pairwise(lives):
            if older[1] > newer[0]:
                out.append(
                    Violation(
                        "rank-twice",
                        job,
                        f"rank {rank} of token {token} generation {gen}: pid {old_pid} wrote "
                        f"a record {(older[1] - newer[0]) / 1e6:.0f} ms after pid {new_pid} "
                        "started as the same rank",
                    )
                )
    return out


def succeeded(history: History, state: ClusterState | None) -> set[Attempt]:
    """The attempts that succeeded, by the job history and the final state."""
    out = {
        (j.job, a.token)
        for j in history.job_history
        for a in j.attempts
        if a.state is AttemptState.SUCCEEDED
    }
    for job in state.jobs.values() if state is not None else ():
        if job.attempt is not None and job.attempt.state is AttemptState.SUCCEEDED:
            out.add((job.job_id, job.attempt.fencing_token))
    return out


def check_below_min(history: History, state: ClusterState | None) -> list[Violation]:
    """``elastic-below-min`` (see the module docstring)."""
    spans, ranges = elastic_spans(history)
    done = succeeded(history, state)
    frozen = frozen_attempts(history)
    commits: dict[Attempt, int] = {}
    for r in history.members:
        key = (r.job, r.token)
        if r.type == "effect" and key in ranges:
            commits[key] = min(commits.get(key, r.mono_ns), r.mono_ns)
    out: list[Violation] = []
    for key, lives in sorted(by_attempt(spans).items()):
        if key not in done or key not in commits or key in frozen:
            continue
        fewest = ranges[key][0]
        full = False
        for at, n in running_counts(lives):
            if at >= commits[key]:
                break
            full = full or n >= fewest
            if full and n < fewest:
                out.append(
                    Violation(
                        "elastic-below-min",
                        key[0],
                        f"token {key[1]}: {n} members ran (min {fewest}) at mono "
                        f"{at / 1e9:.3f} s, before its first commit",
                    )
                )
                break
    return out


def check_elastic(history: History, state: ClusterState | None) -> list[Violation]:
    """Every rule of this module."""
    return check_over_max(history) + check_rank_regrown(history) + check_below_min(history, state)


def grown_and_shrunk(history: History) -> tuple[list[str], list[str]]:
    """``job/token rank r`` of every rank that started after its attempt's first members
    (grown), and of every member above ``min`` stopped (``term``) while its attempt worked
    on for :data:`GAVE_BACK_MS` more (given back), for the report."""
    first_world: dict[Attempt, int] = {}
    last: dict[Attempt, int] = {}
    for r in history.members:
        if not r.elastic:
            continue
        key = (r.job, r.token)
        last[key] = max(last.get(key, 0), r.mono_ns)
        if r.type == "start" and r.world and key not in first_world:
            first_world[key] = r.world
    grown, shrunk = set(), set()
    for r in history.members:
        key = (r.job, r.token)
        if not r.elastic:
            continue
        if r.type == "start" and r.rank >= first_world.get(key, r.rank + 1):
            grown.add(f"{r.job}/{r.token} rank {r.rank}")
        went_on = last[key] > r.mono_ns + GAVE_BACK_MS * 1_000_000
        if r.type == "term" and r.rank >= gang_range(r.elastic)[0] and went_on:
            shrunk.add(f"{r.job}/{r.token} rank {r.rank}")
    return sorted(grown), sorted(shrunk)
