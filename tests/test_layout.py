"""The package's shape: modules a newcomer can read whole, functions that fit on a screen.

No module under ``synapse_ha/`` (generated code aside) is over 600 lines, and no function
or method is over 80, unless its docstring says why it must be one piece."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "synapse_ha"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
EXCUSE = "one piece"


def _sources() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if "gen" not in p.relative_to(PACKAGE).parts]


def long_functions(source: str) -> list[tuple[str, int, int]]:
    """``(name, first line, length)`` of each function over the limit without an excuse."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            excused = EXCUSE in (ast.get_docstring(node) or "")
            if length > MAX_FUNCTION_LINES and not excused:
                found.append((node.name, node.lineno, length))
    return found


def test_the_checks_can_fail() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def f():\n{body}\n") == [("f", 1, MAX_FUNCTION_LINES + 1)]
    excused = f'def f():\n    """It must be {EXCUSE}: …"""\n{body}\n'
    assert long_functions(excused) == []


def test_no_module_is_over_600_lines() -> None:
    sizes = {p: len(p.read_text().splitlines()) for p in _sources()}
    over = {str(p.relative_to(PACKAGE.parent)): n for p, n in sizes.items() if n > MAX_MODULE_LINES}
    assert over == {}


def test_no_function_is_over_80_lines_without_a_reason() -> None:
    over = [
        f"{p.relative_to(PACKAGE.parent)}:{line} {name} ({length} lines)"
        for p in _sources()
        for name, line, length in long_functions(p.read_text())
    ]
    assert over == []
