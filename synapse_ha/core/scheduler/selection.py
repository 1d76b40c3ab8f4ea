"""The nodes a gang with a node selector (``JobSpec.nodes``, core/node_selector.py) may use,
worked out once per selector and pass.

A pass hands the placement search a gang's ``avoid`` set (core/scheduler/placement.py):
a selector adds the nodes it does not match, per alternative of its feature expression's
``[...]`` group, and the nodes its ``names`` require (``must``). A gang without a selector
costs nothing here: the pass never asks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from synapse_ha.core.model import ClusterState
from synapse_ha.core.node_selector import NodeSelector, compiled, matches, node_names
from synapse_ha.core.scheduler.placement import Gang


@dataclass(frozen=True, slots=True)
class Selected:
    """What a selector leaves a gang: per alternative, the nodes it may not use; per name
    it requires, the nodes answering to it, sorted (none: no registered node does)."""

    avoid: tuple[frozenset[str], ...]
    must: tuple[tuple[str, ...], ...]


def select(state: ClusterState, selector: NodeSelector) -> Selected:
    """The avoid sets and required nodes of ``selector`` among ``state``'s nodes."""
    c = compiled(selector)
    infos = [node.info for node in state.nodes.values()]
    avoid = tuple(
        frozenset(info.node_id for info in infos if not matches(c, i, info))
        for i in range(len(c.alternatives))
    )
    must: tuple[tuple[str, ...], ...] = ()
    if c.names:
        answering = {info.node_id: node_names(info.node_id, info.address) for info in infos}
        must = tuple(
            tuple(sorted(node_id for node_id, names in answering.items() if name in names))
            for name in dict.fromkeys(selector.names)
        )
    return Selected(avoid, must)


class Selections:
    """One pass's :class:`Selected` per selector, and the avoid sets joined with an
    owner's unfit nodes, each made once."""

    __slots__ = ("joined", "selected", "state")

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.selected: dict[NodeSelector, Selected] = {}
        self.joined: dict[tuple[frozenset[str], frozenset[str]], frozenset[str]] = {}

    def of(self, selector: NodeSelector) -> Selected:
        hit = self.selected.get(selector)
        if hit is None:
            hit = self.selected[selector] = select(self.state, selector)
        return hit

    def avoid(self, unfit: frozenset[str], selector: NodeSelector) -> tuple[frozenset[str], ...]:
        """Per alternative, the nodes a gang with ``selector`` whose owner's members
        ``unfit`` nodes could not start may not use (one frozenset per combination, so
        that alike gangs share it and its hash)."""
        out = []
        for own in self.of(selector).avoid:
            if not unfit:
                out.append(own)
                continue
            key = (unfit, own)
            joined = self.joined.get(key)
            if joined is None:
                joined = self.joined[key] = unfit | own
            out.append(joined)
        return tuple(out)

    def narrow(self, gang: Gang, fits: Callable[[Gang], bool]) -> Gang:
        """``gang`` kept to the nodes its selector allows: of the alternatives of its
        ``[...]`` group, the first that ``fits`` now, else the first."""
        selector = gang.spec.nodes
        assert selector is not None
        must = self.of(selector).must
        variants = [
            replace(gang, avoid=avoid, must=must) for avoid in self.avoid(gang.avoid, selector)
        ]
        if len(variants) > 1:
            for variant in variants:
                if fits(variant):
                    return variant
        return variants[0]
