"""Topology domains: a node's path of labels, outermost first, ending with the host."""

from __future__ import annotations

CLUSTER = "cluster"  # the whole cluster, above every configured level


def domain_at(path: tuple[str, ...], levels: tuple[str, ...], level: str) -> tuple[str, ...]:
    """The domain of ``path`` at ``level``: the path prefix down to and including it.

    ``levels`` includes ``"host"`` as its last entry; the level ``"cluster"`` gives the
    empty prefix, shared by every node.
    """
    if level == CLUSTER:
        return ()
    return path[: levels.index(level) + 1]


def describe_domain(domain: tuple[str, ...], levels: tuple[str, ...]) -> str:
    """``rack r3 (zone z1 / block b2 / rack r3)``-style text for people."""
    if not domain:
        return "the cluster"
    level = levels[len(domain) - 1]
    return f"{level} {domain[-1]}"
