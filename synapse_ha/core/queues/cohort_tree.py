"""The cohort tree: cohorts inside cohorts (organisation -> team -> project, up to
:data:`MAX_COHORT_DEPTH` deep), and what a queue may borrow through it (DESIGN §8). Pure.

Nodes are cohorts (:class:`~synapse_ha.core.cluster_config.Cohort` records, and the
names queues use that no record defines: roots with nothing of their own) and, as leaves,
the queues with a GPU quota in a cohort. Every node has a nominal, a usage and two
figures, computed from the leaves up:

* a queue **lends** ``min(lending_limit, max(0, nominal - used))`` and **borrows**
  ``max(0, used - nominal)`` (as :mod:`synapse_ha.core.queues.quota` counts a flat cohort);
* a cohort's **pool** is its own nominal plus what its children lend; its **demand** is
  what its children borrow. It borrows from its parent ``max(0, demand - pool)`` and
  lends to it ``min(lending_limit, max(0, pool - demand))``.

A state is within the tree's limits when no cohort borrows more than its borrowing limit
and no root borrows at all. A queue may take its idle nominal (a reclaim gets it back
if others hold it) and may borrow the most GPUs ``x`` for which the tree stays within
its limits once the queue uses ``nominal + borrowed + x`` — within its own borrowing
limit, each ancestor's borrowing limit, and what each ancestor's other children lend.
Every figure is monotonic in ``x``, so the most is found by bisection.

With no cohort records every cohort is a root of queues alone, and the rule is the flat
one: what the other queues lend less what every queue of the cohort borrows.

All arithmetic is on integers; children are visited in name order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from synapse_ha.core.cluster_config import Cohort, Queue
from synapse_ha.core.spec.validation import MAX_QUEUE_GPUS, Violation, invalid, name_problem

MAX_COHORT_DEPTH = 6  # cohorts on the way from a queue's cohort to its root, at most
MAX_COHORTS = 1_000


def check_cohort(cohort: Cohort, cohorts: Mapping[str, Cohort]) -> list[Violation]:
    """Every rule ``cohort`` breaks as a new or changed record among ``cohorts`` (the
    records now), in field order: its names, that its parent exists, that the tree has
    no cycle and is at most :data:`MAX_COHORT_DEPTH` deep, and its limits."""
    out: list[Violation] = []
    problem = name_problem(cohort.name)
    if problem:
        out.append(invalid("name", problem))
    if cohort.parent:
        problem = name_problem(cohort.parent)
        if problem:
            out.append(invalid("parent", problem))
        elif cohort.parent == cohort.name:
            out.append(invalid("parent", "a cohort cannot be its own parent"))
        elif cohort.parent not in cohorts:
            out.append(invalid("parent", f"no cohort {cohort.parent!r}: create the parent first"))
        else:
            out.extend(_shape_problems(cohort, cohorts))
    for field, value in (
        ("gpu", cohort.gpu),
        ("borrowing_limit_gpu", cohort.borrowing_limit_gpu),
        ("lending_limit_gpu", cohort.lending_limit_gpu),
    ):
        if value is not None and not 0 <= value <= MAX_QUEUE_GPUS:
            out.append(invalid(field, f"must be between 0 and {MAX_QUEUE_GPUS}, or unset"))
    if cohort.name not in cohorts and len(cohorts) >= MAX_COHORTS:
        out.append(invalid("name", f"at most {MAX_COHORTS} cohorts"))
    return out


def _shape_problems(cohort: Cohort, cohorts: Mapping[str, Cohort]) -> list[Violation]:
    """A cycle through ``cohort``'s new parent, or a tree deeper than the bound."""
    above = ancestors(cohort.parent, cohorts, stop=cohort.name)
    if cohort.name in above:
        chain = " -> ".join([cohort.name, *above[: above.index(cohort.name) + 1]])
        return [invalid("parent", f"would make a cycle ({chain})")]
    depth = len(above) + 1 + _height_below(cohort.name, cohorts)
    if depth > MAX_COHORT_DEPTH:
        return [
            invalid("parent", f"the tree would be {depth} cohorts deep, at most {MAX_COHORT_DEPTH}")
        ]
    return []


def _height_below(name: str, cohorts: Mapping[str, Cohort]) -> int:
    """Cohorts on the longest way down from ``name`` (not counting it)."""
    children = children_of(cohorts)
    best, level, frontier = 0, 0, [name]
    while frontier and level <= MAX_COHORT_DEPTH:
        frontier = [c for f in frontier for c in children.get(f, ())]
        level += 1
        if frontier:
            best = level
    return best


def ancestors(name: str, cohorts: Mapping[str, Cohort], stop: str = "") -> list[str]:
    """``name`` and the cohorts above it, nearest first (a bounded walk: a cycle, which
    :func:`check_cohort` never lets in, ends it; so does reaching ``stop``)."""
    out: list[str] = []
    while name and name not in out and len(out) <= MAX_COHORT_DEPTH + 1:
        out.append(name)
        if name == stop:
            break
        record = cohorts.get(name)
        name = record.parent if record is not None else ""
    return out


def children_of(cohorts: Mapping[str, Cohort]) -> dict[str, list[str]]:
    """Child cohorts of each cohort, in name order."""
    out: dict[str, list[str]] = {}
    for name in sorted(cohorts):
        parent = cohorts[name].parent
        if parent:
            out.setdefault(parent, []).append(name)
    return out


def distance(a: str, b: str, cohorts: Mapping[str, Cohort]) -> int | None:
    """How many levels above cohort ``a`` its nearest common ancestor with cohort ``b``
    is: 0 for one cohort (siblings), 1 for cousins, ...; None for cohorts of two trees."""
    up_a = ancestors(a, cohorts)
    up_b = set(ancestors(b, cohorts))
    for level, name in enumerate(up_a):
        if name in up_b:
            return level
    return None


def root_of(cohort: str, cohorts: Mapping[str, Cohort]) -> str:
    """The root of the tree cohort ``cohort`` is in ("" for "")."""
    up = ancestors(cohort, cohorts)
    return up[-1] if up else ""


def branch(cohort: str, level: int, cohorts: Mapping[str, Cohort]) -> str:
    """The cohort ``level`` levels above ``cohort`` (``cohort`` itself at 0); "" past
    the root."""
    up = ancestors(cohort, cohorts)
    return up[level] if 0 <= level < len(up) else ""


class CohortTree:
    """The tree of one set of queues and cohort records, with its figures for a usage.
    ``used`` gives a queue's GPUs in use; the figures are computed when asked, from the
    usage at that moment."""

    def __init__(
        self,
        queues: Mapping[str, Queue],
        cohorts: Mapping[str, Cohort],
        used: Callable[[str], int],
    ) -> None:
        self.queues = queues
        self.cohorts = cohorts
        self.used = used
        self.members: dict[str, list[str]] = {}  # cohort -> its queues with a quota
        for name in sorted(queues):
            q = queues[name]
            if q.cohort and q.gpu is not None:
                self.members.setdefault(q.cohort, []).append(name)
        self.children = children_of(cohorts)

    # ------------------------------------------------------------------ figures

    def queue_figures(self, name: str) -> tuple[int, int]:
        """(lends, borrows) of queue ``name``."""
        q = self.queues[name]
        nominal = q.gpu or 0
        used = self.used(name)
        idle = max(0, nominal - used)
        lends = idle if q.lending_limit_gpu is None else min(idle, q.lending_limit_gpu)
        return lends, max(0, used - nominal)

    def pool_and_demand(self, cohort: str) -> tuple[int, int]:
        """Cohort ``cohort``'s pool (own nominal + what its children lend) and demand
        (what its children borrow)."""
        record = self.cohorts.get(cohort)
        pool = (record.gpu or 0) if record is not None else 0
        demand = 0
        for q in self.members.get(cohort, ()):
            lends, borrows = self.queue_figures(q)
            pool += lends
            demand += borrows
        for child in self.children.get(cohort, ()):
            lends, borrows = self.cohort_figures(child)
            pool += lends
            demand += borrows
        return pool, demand

    def cohort_figures(self, cohort: str) -> tuple[int, int]:
        """(lends, borrows) of cohort ``cohort`` towards its parent."""
        pool, demand = self.pool_and_demand(cohort)
        return _lend_borrow(self.cohorts.get(cohort), pool, demand)

    def nominal(self, cohort: str) -> int:
        """GPUs of the subtree of ``cohort``: its own and its queues' nominal."""
        record = self.cohorts.get(cohort)
        total = (record.gpu or 0) if record is not None else 0
        total += sum(self.queues[q].gpu or 0 for q in self.members.get(cohort, ()))
        return total + sum(self.nominal(c) for c in self.children.get(cohort, ()))

    def queues_below(self, cohort: str) -> list[str]:
        """The queues with a quota in ``cohort``'s subtree: its own, then its cohorts'."""
        out = list(self.members.get(cohort, ()))
        for child in self.children.get(cohort, ()):
            out += self.queues_below(child)
        return out

    def subtree_used(self, cohort: str) -> int:
        total = sum(self.used(q) for q in self.members.get(cohort, ()))
        return total + sum(self.subtree_used(c) for c in self.children.get(cohort, ()))

    # ---------------------------------------------------------------- borrowing

    def borrowable(self, queue: str) -> int:
        """GPUs ``queue`` may borrow beyond what it already borrows (0 for a queue
        without a quota or a cohort)."""
        q = self.queues.get(queue)
        if q is None or q.gpu is None or not q.cohort:
            return 0
        path = ancestors(q.cohort, self.cohorts)
        base = [self.pool_and_demand(c) for c in path]
        lends, borrows = self.queue_figures(queue)
        hi = sum(pool for pool, _ in base)  # never more than every pool on the way
        if q.borrowing_limit_gpu is not None:
            hi = min(hi, q.borrowing_limit_gpu - borrows)

        def fits(x: int) -> bool:
            return self._fits(path, base, (lends, borrows), (0, borrows + x))

        if hi <= 0 or not fits(0):
            return 0
        lo = 0  # fits(lo) holds; find the largest such lo <= hi
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _fits(
        self,
        path: list[str],
        base: list[tuple[int, int]],
        was: tuple[int, int],
        now: tuple[int, int],
    ) -> bool:
        """Whether the tree stays within its limits when the child below ``path[0]``
        goes from lending/borrowing ``was`` to ``now``, every other node unchanged."""
        for level, cohort in enumerate(path):
            pool, demand = base[level]
            pool += now[0] - was[0]
            demand += now[1] - was[1]
            if level == len(path) - 1:
                return demand <= pool
            record = self.cohorts.get(cohort)
            new = _lend_borrow(record, pool, demand)
            limit = record.borrowing_limit_gpu if record is not None else None
            if limit is not None and new[1] > limit:
                return False
            was, now = _lend_borrow(record, *base[level]), new
        return True


def _lend_borrow(record: Cohort | None, pool: int, demand: int) -> tuple[int, int]:
    spare = pool - demand
    lends = max(0, spare)
    if record is not None and record.lending_limit_gpu is not None:
        lends = min(lends, record.lending_limit_gpu)
    return lends, max(0, -spare)
