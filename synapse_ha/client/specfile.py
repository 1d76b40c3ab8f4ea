"""Job spec files (DESIGN §6): YAML in, a validated :class:`JobSpec` out, and errors that
point at the file line.

The document is parsed twice from the same text: once into plain data for
:func:`synapse_ha.core.spec.document.parse_job_spec` (which applies the core's one rule set,
:mod:`synapse_ha.core.spec.validation`), once into PyYAML's node tree, whose marks give the
line of every key and list item. A violation naming ``resources.memory`` is then
reported as ``job.yaml:5: resources.memory: '...' is not a memory quantity``; every rule
the file breaks is reported at once, in line order. A field that is absent from the file
(a required one, or a rule that relates two fields) is reported at the line of its
nearest enclosing field, or without a line (after the others) at the top level.

Duplicate keys, which PyYAML would silently collapse to the last value, are rejected.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from synapse_ha.core.cluster_config import DEFAULT_TOPOLOGY_LEVELS
from synapse_ha.core.model import JobSpec
from synapse_ha.core.spec.document import ParsedJob, SpecError, parse_job_spec
from synapse_ha.core.spec.validation import Violation, ViolationCode
from synapse_ha.core.spec.values import NamesItsViolation

MAX_SPEC_FILE_BYTES = 1024 * 1024
# Limits on the document's shape, checked before it is built: PyYAML builds nested
# collections recursively (too deep a document would overflow the stack), and aliases let
# a few lines stand for billions of values ("billion laughs").
MAX_SPEC_DEPTH = 32  # nested mappings and lists
MAX_SPEC_ALIASES = 1000
MAX_SPEC_NODES = 100_000  # values of the document with its aliases expanded


@dataclass(frozen=True, slots=True)
class FileProblem(NamesItsViolation):
    """One rule a spec file breaks, at its 1-based ``line`` (None when the file lacks the
    field and has no enclosing one)."""

    line: int | None
    violation: Violation


class SpecFileError(SpecError):
    """A job spec file is not YAML or breaks spec rules.

    ``problems`` are every rule broken, in line order (those without a line last), each
    with its line, field and rule; ``field``, ``line``, ``rule`` and ``code`` are the
    first one's. ``field`` is a dotted path such as ``resources.memory`` (``spec`` for
    the document as a whole). ``str()`` gives ``path:line: field: rule``, a line per
    problem.
    """

    def __init__(
        self,
        path: str,
        line: int | None,
        field: str,
        rule: str,
        code: ViolationCode | None = None,
        *,
        problems: Sequence[FileProblem] = (),
    ) -> None:
        first = Violation(code or ViolationCode.INVALID_FIELD, field, rule)
        self.problems: tuple[FileProblem, ...] = tuple(problems) or (FileProblem(line, first),)
        super().__init__(field, rule, first.code, violations=[p.violation for p in self.problems])
        self.path = path
        self.line = line
        self.args = (self.render(),)

    @classmethod
    def located(
        cls, path: str, violations: Sequence[Violation], lines: dict[str, int]
    ) -> SpecFileError:
        """The error for ``violations`` (non-empty) of the file whose fields are at
        ``lines``: sorted by line, then field."""
        problems = sorted(
            (FileProblem(line_of(v.field, lines), v) for v in violations),
            key=lambda p: (p.line is None, p.line or 0, p.field),
        )
        first = problems[0]
        return cls(path, first.line, first.field, first.rule, first.code, problems=problems)

    def lines(self) -> list[str]:
        """``path:line: field: rule`` for each problem."""
        return [self._where(p.line) + f": {p.field}: {p.rule}" for p in self.problems]

    def render(self) -> str:
        return "\n".join(self.lines())

    def _where(self, line: int | None) -> str:
        return f"{self.path}:{line}" if line is not None else self.path

    def __str__(self) -> str:
        return self.render()


class SpecFileUnreadable(SpecFileError):
    """The spec file cannot be read: ``no such file: PATH`` when it does not exist.
    ``os_error`` is the error the system gave."""

    def __init__(self, path: str, os_error: OSError) -> None:
        self.os_error = os_error
        missing = isinstance(os_error, FileNotFoundError)
        super().__init__(
            path, None, "spec", "no such file" if missing else f"cannot read: {os_error.strerror}"
        )

    def render(self) -> str:
        return f"{self.rule}: {self.path}"


def field_lines(root: yaml.Node | None) -> dict[str, int]:
    """Map every field path of a composed document (``resources.gpu``, ``command[1]``) to
    the 1-based line where it starts (the key's line for mapping entries). Raises
    :class:`SpecError` for a key that appears twice in one mapping, and for a document
    that expands (through aliases) to more than ``MAX_SPEC_NODES`` values or deeper than
    ``MAX_SPEC_DEPTH`` levels."""
    lines: dict[str, int] = {}
    visited = 0
    # Iterative, and bounded: aliases let a small file name a huge (or very deep) tree.
    stack: list[tuple[yaml.Node, str, int]] = [] if root is None else [(root, "", 0)]
    while stack:
        node, path, depth = stack.pop()
        visited += 1
        if depth > MAX_SPEC_DEPTH:
            raise _LocatedError(
                "spec",
                node.start_mark.line + 1,
                f"nested (through its aliases) deeper than {MAX_SPEC_DEPTH} levels",
            )
        if visited > MAX_SPEC_NODES:
            raise _LocatedError(
                "spec",
                node.start_mark.line + 1,
                f"the document expands (through its aliases) to more than {MAX_SPEC_NODES} values",
            )
        children: list[tuple[yaml.Node, str, int]] = []
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key_node, value_node in node.value:
                key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
                child = f"{path}.{key}" if path else key
                if key in seen and key != "<<":
                    raise _LocatedError(child, key_node.start_mark.line + 1, "appears twice")
                seen.add(key)
                lines.setdefault(child, key_node.start_mark.line + 1)
                children.append((value_node, child, depth + 1))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                child = f"{path}[{i}]"
                lines.setdefault(child, item.start_mark.line + 1)
                children.append((item, child, depth + 1))
        stack.extend(reversed(children))
    return lines


def line_of(field: str, lines: dict[str, int]) -> int | None:
    """The line of ``field``, else of its nearest enclosing field that is in the file."""
    candidate = field
    while candidate:
        if candidate in lines:
            return lines[candidate]
        cut = max(candidate.rfind("."), candidate.rfind("["))
        candidate = candidate[:cut] if cut > 0 else ""
    return None


def load_job_file(
    path: str | Path, topology_levels: Sequence[str] | None = DEFAULT_TOPOLOGY_LEVELS
) -> ParsedJob:
    """Read and validate a job spec file; the result carries the spec and the file's
    ``request_id`` (empty when it has none). Raises :class:`SpecFileError`.

    ``topology_levels=None`` accepts any well-formed level name (see
    :func:`synapse_ha.core.spec.document.parse_job_spec`)."""
    name = str(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_SPEC_FILE_BYTES + 1)
    except OSError as exc:
        raise SpecFileUnreadable(name, exc) from exc
    if len(raw) > MAX_SPEC_FILE_BYTES:
        raise SpecFileError(name, None, "spec", f"file larger than {MAX_SPEC_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecFileError(name, None, "spec", "the file is not UTF-8 text") from exc
    try:
        _check_shape(name, text)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        if "'\\t'" in problem:
            problem += " (YAML indents with spaces, not tabs)"
        raise SpecFileError(name, line, "spec", f"not valid YAML: {problem}") from exc
    except yaml.YAMLError as exc:
        raise SpecFileError(name, None, "spec", f"not valid YAML: {exc}") from exc
    try:
        lines = field_lines(root)
    except _LocatedError as exc:
        raise SpecFileError(name, exc.line, exc.field, exc.rule) from exc
    try:
        return parse_job_spec(data, topology_levels)
    except SpecError as exc:
        raise SpecFileError.located(name, exc.violations, lines) from exc


def _check_shape(name: str, text: str) -> None:
    """Refuse a document nested deeper than ``MAX_SPEC_DEPTH`` or with more than
    ``MAX_SPEC_ALIASES`` aliases, from PyYAML's event stream (which is not recursive),
    before anything is built from it. Raises :class:`SpecFileError`, or PyYAML's error
    for text that is not YAML."""
    depth = 0
    aliases = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
            depth += 1
            if depth > MAX_SPEC_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark is not None else None
                raise SpecFileError(
                    name, line, "spec", f"nested deeper than {MAX_SPEC_DEPTH} levels"
                )
        elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_SPEC_ALIASES:
                line = event.start_mark.line + 1 if event.start_mark is not None else None
                raise SpecFileError(
                    name, line, "spec", f"more than {MAX_SPEC_ALIASES} aliases (*name)"
                )


def load_job_spec_file(
    path: str | Path, topology_levels: Sequence[str] | None = DEFAULT_TOPOLOGY_LEVELS
) -> JobSpec:
    """Like :func:`load_job_file`, for callers that need only the spec."""
    return load_job_file(path, topology_levels).spec


def cluster_refusal(
    path: str | Path, violations: Sequence[Violation], field: str = "", rule: str = ""
) -> SpecFileError:
    """The cluster's refusal of the spec read from ``path``: each of its ``violations``
    (or the one ``field`` and ``rule`` it named) at its line in the file, in line order,
    marked as the cluster's rule."""
    given = violations or [Violation(ViolationCode.INVALID_FIELD, field, rule)]
    marked = [Violation(v.code, v.field, f"{v.rule} (the cluster's rule)") for v in given]
    return SpecFileError.located(str(path), marked, _lines_in_file(path))


def _lines_in_file(path: str | Path) -> dict[str, int]:
    try:
        root = yaml.compose(Path(path).read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
        return field_lines(root)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, SpecError):
        return {}


def line_in_file(path: str | Path, field: str) -> int | None:
    """The line of ``field`` (or of its nearest enclosing field) in a spec file, for errors
    found elsewhere, such as a cluster's own topology levels; None when unknown."""
    return line_of(field, _lines_in_file(path))


class _LocatedError(SpecError):
    def __init__(self, field: str, line: int, rule: str) -> None:
        super().__init__(field, rule)
        self.line = line
