"""Whether a job could ever fit the cluster's nodes, and, when it could not, what is missing.

A gang fits the cluster *ever* when, with nothing else running, some set of its nodes
could hold every member at once: each member's GPUs, CPU and memory on one node, only
nodes that run container images for a job that names one, only nodes its node selector
matches (core/node_selector.py: a feature, GPU model or name no node has is said first),
and, with
``topology.required``, every member inside one domain of that level. That is exactly
when the scheduler could place it on an empty cluster of those nodes (the gang fits when
some domain at its widest allowed level has room for every member,
:func:`synapse_ha.core.scheduler.placement.fits`).

Which nodes count: every registered node, whatever its status. A dead node may come back
(its worker registers again), a cordoned or draining one may be uncordoned, and an
unhealthy GPU may be repaired, so none of them makes a job impossible. A cluster with no
node at all (its workers have not registered yet) refuses nothing: every job waits.

:func:`shortfall` answers with a :class:`Shortfall`, a sentence a person can act on
("no node has 9 GPUs; the largest has 8", "needs 5 nodes with 8 GPUs; the cluster has
4", "needs 5 nodes with 8 GPUs in one rack; the largest rack has 2"), or None.

**Cost.** Submissions are a hot path, so nothing here looks at every node per question.
The nodes are summarised (:class:`NodeSummary`) as counts of node *shapes* (GPUs, CPU,
memory, whether it runs images), for the cluster and per topology domain; a question
costs the shapes (and, with ``topology.required``, the domains of that level), and its
answer is kept with the summary, so alike submissions cost one dictionary look-up. The
summary is derived state of the :class:`ClusterState` (``_fits``, not replicated), built
on first use: a node's registration, the only command that changes what a node is,
replaces it with an updated copy (:func:`note_registered`, which costs the node's domains,
not the nodes), and a snapshot shares it, so a scheduling pass never rebuilds it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from synapse_ha.core.model import (
    FEATURE_IMAGES,
    ZERO,
    ClusterState,
    JobSpec,
    Node,
    NodeInfo,
    Resources,
)
from synapse_ha.core.node_selector import (
    NodeSelector,
    compiled,
    describe,
    feature_names,
    gpu_model_matches,
    matches,
    node_names,
)
from synapse_ha.core.spec.member_limits import rules_in_force
from synapse_ha.core.topology import CLUSTER

HOST = "host"
# The format from which a submission that can never fit is refused: every replica then
# refuses it alike (a release before it accepts such a job, and it waits).
REFUSES_AT_FORMAT = 9

Shape = tuple[int, int, int, bool]  # GPUs, CPU millicores, memory MiB, runs images
Domain = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Shortfall:
    """What keeps a job from ever fitting: ``missing`` ("no node has 9 GPUs"), what the
    cluster has instead (``have``: "the largest has 8") and the spec field to change."""

    field: str
    missing: str
    have: str

    def refusal(self) -> str:
        """``no node has 9 GPUs; the largest has 8``."""
        return f"{self.missing}; {self.have}"

    def waiting(self) -> str:
        """For a job that waits for nodes: ``no node has 9 GPUs yet; the largest has 8``,
        ``needs 5 nodes with 8 GPUs; the cluster has 4 so far``."""
        if self.missing.startswith("no node"):
            return f"{self.missing} yet; {self.have}"
        return f"{self.missing}; {self.have} so far"


class NodeSummary:
    """The counted nodes of a state as shapes: ``shapes`` for the cluster, and per
    topology level (``levels``, outermost first) each domain's shapes. Never changed once
    made (:meth:`changed` makes a new one), but for the answers it keeps."""

    __slots__ = ("answers", "domains", "levels", "selected", "shapes")

    def __init__(
        self,
        levels: tuple[str, ...],
        shapes: dict[Shape, int],
        domains: tuple[dict[Domain, dict[Shape, int]], ...],
    ) -> None:
        self.levels = levels
        self.shapes = shapes
        self.domains = domains
        self.answers: dict[tuple[object, ...], Shortfall | None] = {}
        # Per node selector, what no node has or the nodes of each alternative (_selected).
        self.selected: dict[NodeSelector, Shortfall | list[NodeSummary]] = {}

    @classmethod
    def build(cls, nodes: Iterable[Node | NodeInfo], levels: tuple[str, ...]) -> NodeSummary:
        summary = cls(levels, {}, tuple({} for _ in levels))
        for node in nodes:
            summary._count(node.info if isinstance(node, Node) else node, +1)
        return summary

    def _count(self, info: NodeInfo, sign: int) -> None:
        shape = shape_of(info)
        _bump(self.shapes, shape, sign)
        labels = dict(info.topology)
        path = tuple(labels.get(level, "-") for level in self.levels)
        for depth, per_domain in enumerate(self.domains):
            domain = path[: depth + 1]
            inner = per_domain.get(domain)
            if inner is None:
                inner = per_domain[domain] = {}
            _bump(inner, shape, sign)
            if not inner:
                del per_domain[domain]

    def changed(self, before: NodeInfo | None, after: NodeInfo) -> NodeSummary:
        """A new summary with node ``after`` added (``before`` None) or redescribed."""
        touched = [after] if before is None else [before, after]
        domains = []
        for depth, per_domain in enumerate(self.domains):
            copied = dict(per_domain)
            for info in touched:  # the inner counts about to change are copied too
                labels = dict(info.topology)
                domain = tuple(labels.get(level, "-") for level in self.levels[: depth + 1])
                if domain in copied:
                    copied[domain] = dict(copied[domain])
            domains.append(copied)
        summary = NodeSummary(self.levels, dict(self.shapes), tuple(domains))
        if before is not None:
            summary._count(before, -1)
        summary._count(after, +1)
        return summary


def _bump(counts: dict[Shape, int], shape: Shape, sign: int) -> None:
    left = counts.get(shape, 0) + sign
    if left:
        counts[shape] = left
    else:
        counts.pop(shape, None)


def shape_of(info: NodeInfo) -> Shape:
    c = info.capacity
    return (c.gpu, c.cpu_milli, c.memory_mib, FEATURE_IMAGES in info.features)


# ------------------------------------------------------------------------- the summary


def summary_of(state: ClusterState) -> NodeSummary:
    """The summary of ``state``'s nodes, kept with the state (built on first use)."""
    summary = state._fits
    levels = state.config.topology_levels
    if not isinstance(summary, NodeSummary) or summary.levels != levels:
        summary = state._fits = NodeSummary.build(state.nodes.values(), levels)
    return summary


def note_registered(state: ClusterState, node_id: str, before: NodeInfo | None) -> None:
    """Keep the summary of ``state``'s nodes after node ``node_id`` registered
    (``before``: its description until then, None for a new node). The state machine
    calls it; without a summary it does nothing (the next question builds one). The
    summary is replaced, never changed: snapshots may share the old one."""
    summary = state._fits
    if not isinstance(summary, NodeSummary):
        return
    after = state.nodes[node_id].info
    if before is after:
        return
    if summary.levels != state.config.topology_levels:
        state._fits = None  # built anew, with the levels, when next asked
        return
    state._fits = summary.changed(before, after)


# ------------------------------------------------------------------------ the question


def shortfall(state: ClusterState, spec: JobSpec) -> Shortfall | None:
    """None when some set of ``state``'s nodes could hold the whole gang of ``spec`` at
    once (or the cluster has no node yet); else what is missing. A member takes what its
    node reserves for it, its request raised to the floor with its supervisor's share
    (core/spec/member_limits.py): a gang whose request fits only without those is told so."""
    if not state.nodes:
        return None
    summary = summary_of(state)
    if spec.nodes is not None:
        return _selected(state, summary, spec, spec.nodes)
    return _against(state, summary, spec)


def _against(state: ClusterState, summary: NodeSummary, spec: JobSpec) -> Shortfall | None:
    """:func:`shortfall` on the nodes ``summary`` counts."""
    found = check(summary, spec)
    reserved = rules_in_force(state).reserved(spec.resources)
    if found is not None or reserved is spec.resources:
        return found
    found = check(summary, spec, reserved)
    if found is None:
        return None
    return Shortfall(
        found.field,
        f"{found.missing} (a node reserves {reserved.describe()} per member: the cluster's "
        "floor and the member's supervisor)",
        found.have,
    )


def _selected(
    state: ClusterState, summary: NodeSummary, spec: JobSpec, selector: NodeSelector
) -> Shortfall | None:
    """:func:`shortfall` of a gang with a node selector: what no node has (a feature, a GPU
    model, a name), else the gang against the nodes of each alternative of its feature
    expression (None once one could hold it; else the first's shortfall). The nodes each
    alternative selects are counted once per summary and selector."""
    found = summary.selected.get(selector)
    if found is None:
        found = summary.selected[selector] = _select(state, summary.levels, selector)
    if isinstance(found, Shortfall):
        return found
    first: Shortfall | None = None
    for counted in found:
        short = _against(state, counted, spec)
        if short is None:
            return None
        first = first or short
    assert first is not None
    return Shortfall(first.field, first.missing, f"{first.have}, of the nodes it selects")


def _select(
    state: ClusterState, levels: tuple[str, ...], selector: NodeSelector
) -> Shortfall | list[NodeSummary]:
    """What no node has for ``selector``, or the summary of the nodes of each alternative."""
    infos = [node.info for node in state.nodes.values()]
    c = compiled(selector)
    have = sorted({f for info in infos for f in info.features})
    for name in (n for alt in c.alternatives for n in feature_names(alt)):
        if name not in have:
            listed = ", ".join(have[:12]) + (", ..." if len(have) > 12 else "")
            return Shortfall(
                "nodes.features",
                f"no node has feature {name}",
                f"the nodes have {listed}" if have else "no node advertises a feature",
            )
    if selector.gpu_model and not any(
        gpu_model_matches(selector.gpu_model, i.gpu_model) for i in infos
    ):
        models = sorted({i.gpu_model for i in infos if i.gpu_model})
        return Shortfall(
            "nodes.gpu_model",
            f"no node has a GPU model matching {selector.gpu_model}",
            f"the nodes have {', '.join(models[:8])}" if models else "no node reports a GPU model",
        )
    answering = [node_names(i.node_id, i.address) for i in infos]
    for name in selector.names:
        if not any(name in names for names in answering):
            return Shortfall("nodes.names", f"no node is named {name}", "see synctl nodes")
    counted = []
    for alternative in range(len(c.alternatives)):
        chosen = [i for i in infos if matches(c, alternative, i)]
        named = all(
            any(name in node_names(i.node_id, i.address) for i in chosen) for name in selector.names
        )
        if chosen and named:
            counted.append(NodeSummary.build(chosen, levels))
    if not counted:
        return Shortfall(
            "nodes",
            f"no node matches {describe(selector)}",
            "the nodes named must match the rest too" if selector.names else "see synctl nodes",
        )
    return counted


def check(
    summary: NodeSummary, spec: JobSpec, reserved: Resources | None = None
) -> Shortfall | None:
    """:func:`shortfall` on a summary (its answer is kept with the summary), each member
    taking ``reserved`` (default: its request)."""
    req = spec.resources if reserved is None else reserved
    level = spec.topology_required if spec.topology_required != CLUSTER else ""
    key = (req.gpu, req.cpu_milli, req.memory_mib, spec.replicas, level, bool(spec.image))
    answers = summary.answers
    if key in answers:
        return answers[key]
    if len(answers) > 4096:
        answers.clear()
    found = answers[key] = _check(summary, req, spec.replicas, level, bool(spec.image))
    return found


def _check(
    summary: NodeSummary, req: Resources, n: int, level: str, images: bool
) -> Shortfall | None:
    shapes = summary.shapes
    if images:
        shapes = {s: c for s, c in shapes.items() if s[3]}
        if not shapes:
            return Shortfall(
                "image",
                "no node runs container images (feature images)",
                f"the cluster's {sum(summary.shapes.values())} node(s) run members on the host",
            )
    among = " of those that run container images" if images else ""
    for index, want, field, unit in _resources(req):
        largest = max(s[index] for s in shapes)
        if want > largest:
            return Shortfall(
                field,
                f"no node has {_amount(want, unit)}",
                f"the largest{among} has {_bare(largest, unit)}",
            )
    slots = {s: _slots(s, req, n) for s in sorted(shapes)}
    most = max(slots.values())
    what = _describe(req)
    if most == 0:
        return Shortfall(
            "resources", f"no node has {what} together", f"the nodes{among} are {_shapes(shapes)}"
        )
    single = most == 1  # each node holds one member at most: count nodes
    if level == HOST:
        if most < n:
            return Shortfall(
                "topology.required",
                f"needs {n} members of {what} on one host",
                f"a host{among} holds {most} at most",
            )
        return None
    if level:
        best = _best_domain(summary, shapes, slots, level, n)
        if best < n:
            what = _binding(
                req,
                best,
                lambda r: _best_domain(summary, shapes, _slots_of(shapes, r, n), level, n),
            )
            have = (
                f"the largest {level} has {best}"
                if single
                else f"the roomiest {level} holds {best}"
            )
            return Shortfall(
                "topology.required", f"{_needs(n, what, single)} in one {level}", have + among
            )
    total = _total(shapes, slots)
    if total < n:
        what = _binding(req, total, lambda r: _total(shapes, _slots_of(shapes, r, n)))
        have = f"the cluster has {total}" if single else f"the cluster's nodes hold {total}"
        return Shortfall("replicas", _needs(n, what, single), have + among)
    return None


def _needs(n: int, what: str, single: bool) -> str:
    """What a gang of ``n`` members of ``what`` needs: nodes when each node holds one
    member at most (``single``), else room for its members."""
    return f"needs {n} nodes with {what}" if single else f"needs room for {n} members of {what}"


def _total(shapes: dict[Shape, int], slots: dict[Shape, int]) -> int:
    return sum(count * slots[s] for s, count in shapes.items())


def _slots_of(shapes: dict[Shape, int], req: Resources, n: int) -> dict[Shape, int]:
    return {s: _slots(s, req, n) for s in shapes}


def _binding(req: Resources, figure: int, room: Callable[[Resources], int]) -> str:
    """The request as a sentence names it: the one resource that alone leaves the same
    ``figure`` of room (``room`` of a request of it alone), else all of them."""
    for alone in (
        Resources(gpu=req.gpu),
        Resources(cpu_milli=req.cpu_milli),
        Resources(memory_mib=req.memory_mib),
    ):
        if alone != ZERO and room(alone) == figure:
            return _describe(alone)
    return _describe(req)


def _best_domain(
    summary: NodeSummary, shapes: dict[Shape, int], slots: dict[Shape, int], level: str, n: int
) -> int:
    """The room of the roomiest domain at ``level`` (members, each node's at most the
    gang's size ``n``; once one has room for ``n``, that one)."""
    per_domain = summary.domains[summary.levels.index(level)]
    best = 0
    for counts in per_domain.values():
        room = sum(count * slots.get(s, 0) for s, count in counts.items() if s in shapes)
        if room > best:
            best = room
            if best >= n:
                break
    return best


def _slots(shape: Shape, req: Resources, cap: int) -> int:
    """How many members of ``req`` one node of ``shape`` holds, at most ``cap``."""
    n = cap
    for have, want in ((shape[0], req.gpu), (shape[1], req.cpu_milli), (shape[2], req.memory_mib)):
        if want > 0:
            n = min(n, have // want)
    return max(n, 0)


def _resources(req: Resources) -> list[tuple[int, int, str, str]]:
    return [
        (0, req.gpu, "resources.gpu", "GPU"),
        (1, req.cpu_milli, "resources.cpu", "CPU"),
        (2, req.memory_mib, "resources.memory", "memory"),
    ]


def _bare(value: int, unit: str) -> str:
    """A figure as the largest node's: ``8``, ``64``, ``512 GiB``."""
    if unit == "CPU":
        return f"{value / 1000:g}"
    if unit == "memory":
        return _memory(value)
    return str(value)


def _amount(value: int, unit: str) -> str:
    """``9 GPUs``, ``1 GPU``, ``0.5 CPUs``, ``256 GiB of memory``."""
    if unit == "memory":
        return f"{_memory(value)} of memory"
    figure = _bare(value, unit)
    return f"{figure} {unit}" if figure == "1" else f"{figure} {unit}s"


def _memory(mib: int) -> str:
    if mib % (1024 * 1024) == 0:
        return f"{mib // (1024 * 1024)} TiB"
    if mib % 1024 == 0:
        return f"{mib // 1024} GiB"
    return f"{mib} MiB"


def _describe(req: Resources) -> str:
    """``8 GPUs``, ``8 GPUs and 32 CPUs``, ``8 GPUs, 32 CPUs and 256 GiB of memory``;
    ``no resources`` for a request of nothing."""
    parts = [_amount(want, unit) for _, want, _, unit in _resources(req) if want > 0]
    if not parts:
        return "no resources"
    if len(parts) == 1:
        return parts[0]
    return f"{', '.join(parts[:-1])} and {parts[-1]}"


def _shapes(shapes: dict[Shape, int], limit: int = 3) -> str:
    """``4 x (8 GPUs, 64 CPUs, 512 GiB)`` for the largest few kinds of node."""
    ranked = sorted(
        shapes.items(), key=lambda item: (-item[0][0], -item[0][1], -item[0][2], item[0][3])
    )
    texts = [
        f"{count} x ({_amount(s[0], 'GPU')}, {_amount(s[1], 'CPU')}, {_memory(s[2])})"
        for s, count in ranked[:limit]
    ]
    more = len(ranked) - limit
    return ", ".join(texts) + (f" and {more} other kind(s)" if more > 0 else "")
