"""Where a job's members may run (``nodes:`` of a job spec; sbatch's ``--constraint``,
``--gres=gpu:TYPE:N``, ``-w`` and ``-x``): a :class:`NodeSelector`, the parser of its
feature expression, and whether a node matches it.

* **Features** (``features: "a100&ib"``): the features a worker advertises in its
  configuration, read as Slurm reads ``--constraint``: ``a&b`` (both), ``a|b`` (either;
  ``&`` binds tighter), parentheses, and one matching-OR group ``[a|b]`` joined to the
  rest with ``&``: every member runs on nodes that share one of its alternatives (all on
  ``a`` nodes, or all on ``b`` nodes). Feature names are compared exactly. Slurm's counts
  (``a*2``) are refused: every member's node must match.
* **GPU model** (``gpu_model: a100``): compared with the model a worker reports (NVML's
  ``NVIDIA A100-SXM4-80GB``) without regard to case. Both are cut into words of letters
  and digits; the given words must appear in that order among the reported ones, each
  equal to its word or continuing it with letters only: ``a100`` matches
  ``NVIDIA A100-SXM4-80GB`` and ``A100X``, ``a10`` matches ``A10G`` but not ``A100``,
  ``a100_80gb`` matches ``NVIDIA A100-SXM4-80GB``.
* **Names** (``names: [gpu01, gpu02]``): nodes that must each hold a member of the job
  (Slurm's ``-w``: the job gets at least those nodes); its other members go to any
  matching node. **Exclude** (``exclude: [gpu07]``): nodes it may not use (``-x``). A
  name matches a node's id, the host part of its address, or that host's first label
  (``gpu01`` for ``gpu01.cluster:7001``). Slurm's host lists (``gpu[01-02]``) are
  expanded by the client; the spec holds plain names.

Standard library only, deterministic: the scheduler (core/scheduler/passes.py), the state
machine's check of a plan (core/machine/binding.py) and the submission's feasibility
(core/feasibility.py) ask the same :func:`compiled` selector.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

MAX_NAMES = 1000  # names, and excluded names, each
MAX_FEATURES_TEXT = 1024
_FEATURE = re.compile(r"[A-Za-z0-9_.:+-]{1,64}")
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,253}")
_GPU_MODEL = re.compile(r"[A-Za-z0-9_. -]{1,64}")
_WORD = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True, slots=True)
class NodeSelector:
    """The nodes a job's members may run on (see the module). Empty fields select all."""

    features: str = ""  # a feature expression: "a100&ib", "[rack1|rack2]"
    gpu_model: str = ""  # a GPU type: "a100", "h100"
    names: tuple[str, ...] = ()  # nodes that must each hold a member
    exclude: tuple[str, ...] = ()  # nodes never used

    def __bool__(self) -> bool:
        return bool(self.features or self.gpu_model or self.names or self.exclude)


# ---------------------------------------------------------------- feature expressions

# A parsed expression: a feature name, or ("&" | "|", operand, operand, ...).
Expr = str | tuple[str, ...] | tuple[object, ...]


def feature_name_problem(name: str) -> str:
    """Why ``name`` cannot be a node feature a selector names ("" when it can)."""
    if _FEATURE.fullmatch(name):
        return ""
    return (
        f"{name!r}: a feature is letters, digits, '_', '.', ':', '+' and '-', at most 64 characters"
    )


class FeatureError(ValueError):
    """A feature expression that does not parse; the message names the rule."""


@dataclass(frozen=True, slots=True)
class Features:
    """A parsed feature expression: each alternative a node set must satisfy as a whole
    (one without a ``[...]`` group; one per choice of it with one), None for any node."""

    alternatives: tuple[Expr | None, ...]


_TOKENS = re.compile(r"\s*(?:([&|()\[\]])|(\*\s*\d*)|([^\s&|()\[\]*]+))")


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        match = _TOKENS.match(text, pos)
        if match is None or match.end() == pos:
            raise FeatureError(f"unexpected {text[pos:]!r}")
        op, count, name = match.groups()
        if count is not None:
            raise FeatureError(
                "counts (feature*N) are not supported: every member's node must match"
            )
        if name is not None and (problem := feature_name_problem(name)):
            raise FeatureError(problem)
        out.append(op if op is not None else name)
        pos = match.end()
    return out


class _Parser:
    """A recursive-descent reader of the tokens; :func:`_top` reads the top level."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.group: tuple[Expr, ...] | None = None  # the [...] alternatives, once read

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, wanted: str) -> None:
        found = self.peek()
        if found != wanted:
            raise FeatureError(
                f"expected {wanted!r}, found {found!r}" if found else f"{wanted!r} is missing"
            )
        self.pos += 1

    def term(self, top: bool = False) -> Expr | None:
        """A name, ``( ... )``, or (``top``, once) the ``[...]`` group, read into
        :attr:`group` (None is returned for it)."""
        token = self.peek()
        if token == "[":
            if not top or self.group is not None:
                raise FeatureError("one [...] group at most, joined to the rest with '&'")
            self.pos += 1
            alternatives = [self.and_expr()]
            while self.peek() == "|":
                self.pos += 1
                alternatives.append(self.and_expr())
            self.take("]")
            if len(alternatives) < 2:
                raise FeatureError("a [...] group lists alternatives: [a|b]")
            self.group = tuple(alternatives)
            return None
        if token == "(":
            self.pos += 1
            inner = self.or_expr()
            self.take(")")
            return inner
        if token is None or token in ("&", "|", ")", "]"):
            raise FeatureError(
                "a feature name is missing" + (f" before {token!r}" if token else " at the end")
            )
        self.pos += 1
        return token

    def or_expr(self) -> Expr:
        parts = [self.and_expr()]
        while self.peek() == "|":
            self.pos += 1
            parts.append(self.and_expr())
        return _or(parts)

    def and_expr(self) -> Expr:
        parts = [self.plain()]
        while self.peek() == "&":
            self.pos += 1
            parts.append(self.plain())
        return parts[0] if len(parts) == 1 else ("&", *parts)

    def plain(self) -> Expr:
        term = self.term()
        assert term is not None  # only the top level reads a group
        return term


def _and(parts: list[Expr]) -> Expr | None:
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else ("&", *parts)


def _or(parts: list[Expr]) -> Expr:
    return parts[0] if len(parts) == 1 else ("|", *parts)


@lru_cache(maxsize=1024)
def parse_features(text: str) -> Features:
    """The parsed feature expression ``text`` (``""``: any node). Raises
    :class:`FeatureError` naming what is wrong."""
    if not text.strip():
        return Features((None,))
    if len(text) > MAX_FEATURES_TEXT:
        raise FeatureError(f"at most {MAX_FEATURES_TEXT} characters")
    parser = _Parser(_tokens(text))
    base = _top(parser)
    if parser.group is None:
        return Features((base,))
    return Features(tuple(alt if base is None else ("&", base, alt) for alt in parser.group))


def _top(parser: _Parser) -> Expr | None:
    """``term (('&'|'|') term)*`` with ``&`` binding tighter: the ``|``-separated runs of
    ``&``-joined terms (the ``[...]`` group, read once, counts as true in its run)."""
    runs: list[list[Expr]] = [[]]
    grouped_run = -1
    while True:
        before = parser.group
        term = parser.term(top=True)
        if parser.group is not before:
            grouped_run = len(runs) - 1
        elif term is not None:
            runs[-1].append(term)
        op = parser.peek()
        if op == "&":
            parser.pos += 1
        elif op == "|":
            parser.pos += 1
            runs.append([])
        elif op is None:
            break
        else:
            raise FeatureError(f"unexpected {op!r}")
    if parser.group is not None and (len(runs) > 1 or grouped_run != 0):
        raise FeatureError("a [...] group may only be joined to the rest with '&'")
    if len(runs) == 1:
        return _and(runs[0])
    return _or([r for r in (_and(run) for run in runs) if r is not None])


def holds(expr: Expr | None, features: frozenset[str]) -> bool:
    """Whether a node with ``features`` satisfies ``expr`` (None: any node)."""
    if expr is None:
        return True
    if isinstance(expr, str):
        return expr in features
    op, operands = expr[0], _operands(expr)
    if op == "&":
        return all(holds(e, features) for e in operands)
    return any(holds(e, features) for e in operands)


def _operands(expr: tuple[object, ...]) -> list[Expr]:
    return [e for e in expr[1:] if isinstance(e, str | tuple)]


def feature_names(expr: Expr | None) -> list[str]:
    """The feature names ``expr`` mentions, in order, each once."""
    if expr is None:
        return []
    if isinstance(expr, str):
        return [expr]
    out: list[str] = []
    for operand in _operands(expr):
        out.extend(n for n in feature_names(operand) if n not in out)
    return out


def render(expr: Expr | None) -> str:
    """``expr`` written back (``a100&(ib|roce)``)."""
    if expr is None:
        return ""
    if isinstance(expr, str):
        return expr
    op = str(expr[0])
    texts = [
        f"({render(e)})" if op == "&" and not isinstance(e, str) and e[0] == "|" else render(e)
        for e in _operands(expr)
    ]
    return op.join(texts)


# ------------------------------------------------------------------------ GPU models


def gpu_words(text: str) -> tuple[str, ...]:
    return tuple(_WORD.findall(text.lower()))


def gpu_model_matches(wanted: str, reported: str) -> bool:
    """Whether the GPU type ``wanted`` (``a100``) names the model a node reports
    (``NVIDIA A100-SXM4-80GB``): see the module."""
    return _words_match(gpu_words(wanted), gpu_words(reported))


def _words_match(want: tuple[str, ...], have: tuple[str, ...]) -> bool:
    if not want:
        return True
    i = 0
    for word in have:
        if i < len(want) and _word_matches(want[i], word):
            i += 1
    return i == len(want)


def _word_matches(want: str, word: str) -> bool:
    return word == want or (word.startswith(want) and word[len(want) :].isalpha())


# ---------------------------------------------------------------------------- names


def host_of(address: str) -> str:
    """The host part of ``host:port`` (``[v6]:port`` too); the address itself otherwise.
    As :func:`synapse_ha.core.views.host_of`, which names the hosts Slurm's variables list
    (that module reads the state, which this one may not import)."""
    if address.startswith("["):
        return address[1 : address.find("]")] if "]" in address else address
    host, sep, port = address.rpartition(":")
    return host if sep and port.isdigit() else address


def node_names(node_id: str, address: str) -> frozenset[str]:
    """The names a node answers to: its id, its host, and the host's first label when the
    host is a name (not an IP address)."""
    host = host_of(address)
    names = {node_id, host}
    try:
        ipaddress.ip_address(host)
    except ValueError:
        names.add(host.split(".", 1)[0])
    names.discard("")
    return frozenset(names)


# ------------------------------------------------------------------------- matching


@dataclass(frozen=True, slots=True)
class Compiled:
    """A selector ready to match nodes: per alternative of its feature expression, the
    expression; the GPU model's words; the names and excluded names."""

    alternatives: tuple[Expr | None, ...]
    gpu: tuple[str, ...]
    names: frozenset[str]
    exclude: frozenset[str]

    def allows(
        self, alternative: int, node_id: str, address: str, features: Iterable[str], gpu: str
    ) -> bool:
        """Whether a node may hold a member when the gang takes ``alternative``."""
        if self.exclude and not self.exclude.isdisjoint(node_names(node_id, address)):
            return False
        if self.gpu and not _words_match(self.gpu, gpu_words(gpu)):
            return False
        return holds(self.alternatives[alternative], frozenset(features))


@lru_cache(maxsize=1024)
def compiled(selector: NodeSelector) -> Compiled:
    """``selector`` ready to match (kept per selector). A feature expression that does
    not parse (validation refuses such a spec) selects no node."""
    try:
        alternatives = parse_features(selector.features).alternatives
    except FeatureError:
        alternatives = (("|",),)  # holds for no node
    return Compiled(
        alternatives,
        gpu_words(selector.gpu_model),
        frozenset(selector.names),
        frozenset(selector.exclude),
    )


class NodeFacts(Protocol):
    """What matching reads of a node (``core.model.NodeInfo`` has it)."""

    @property
    def node_id(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def features(self) -> tuple[str, ...]: ...
    @property
    def gpu_model(self) -> str: ...


def matches(c: Compiled, alternative: int, node: NodeFacts) -> bool:
    """Whether ``node`` matches alternative ``alternative`` of ``c``."""
    return c.allows(alternative, node.node_id, node.address, node.features, node.gpu_model)


def placement_problem(selector: NodeSelector, nodes: Sequence[NodeFacts]) -> str:
    """Why a gang whose members run on ``nodes`` breaks ``selector`` ("" when it keeps
    it): a node it does not match (all of them one alternative of a ``[...]`` group), or
    a name it requires that none of them answers to."""
    c = compiled(selector)
    for alternative in range(len(c.alternatives)):
        if all(matches(c, alternative, node) for node in nodes):
            break
    else:
        if len(c.alternatives) > 1:
            return f"its nodes do not all match one alternative of features {selector.features}"
        bad = next(node for node in nodes if not matches(c, 0, node))
        return f"node {bad.node_id} does not match the job's nodes ({describe(selector)})"
    names = frozenset().union(*(node_names(n.node_id, n.address) for n in nodes))
    for name in selector.names:
        if name not in names:
            return f"no member runs on node {name}, which the job requires (nodes.names)"
    return ""


def describe(selector: NodeSelector) -> str:
    """The selector as a reason says it: ``features a100&ib, GPU model a100, nodes
    gpu01,gpu02, not gpu07``."""
    parts = []
    if selector.features:
        parts.append(f"features {selector.features}")
    if selector.gpu_model:
        parts.append(f"GPU model {selector.gpu_model}")
    if selector.names:
        parts.append(f"nodes {','.join(selector.names)}")
    if selector.exclude:
        parts.append(f"not {','.join(selector.exclude)}")
    return ", ".join(parts)


# ------------------------------------------------------------------------ the rules


def selector_problems(selector: NodeSelector | None, replicas: int) -> list[tuple[str, str]]:
    """``(field, rule)`` for each rule ``selector`` breaks for a gang of ``replicas``."""
    if selector is None:
        return []
    out: list[tuple[str, str]] = []
    if selector.features:
        try:
            parse_features(selector.features)
        except FeatureError as exc:
            out.append(("nodes.features", str(exc)))
    if selector.gpu_model and not (
        _GPU_MODEL.fullmatch(selector.gpu_model) and gpu_words(selector.gpu_model)
    ):
        out.append(
            (
                "nodes.gpu_model",
                "a GPU type such as a100 or h100: letters, digits, '-', '_', '.' and spaces, "
                "at most 64 characters",
            )
        )
    for key, names in (("names", selector.names), ("exclude", selector.exclude)):
        bad = [n for n in names if not _NAME.fullmatch(n)]
        if bad:
            out.append((f"nodes.{key}", f"{bad[0]!r}: a node name or host, without spaces"))
        elif len(names) > MAX_NAMES:
            out.append((f"nodes.{key}", f"at most {MAX_NAMES} names"))
        elif len(set(names)) != len(names):
            out.append((f"nodes.{key}", "names each node once"))
    both = sorted(set(selector.names) & set(selector.exclude))
    if both:
        out.append(("nodes.exclude", f"{both[0]} is also in nodes.names"))
    if len(set(selector.names)) > replicas:
        out.append(
            (
                "nodes.names",
                f"names {len(set(selector.names))} nodes, more than the job's {replicas} "
                "member(s): each named node holds one at least",
            )
        )
    return out
