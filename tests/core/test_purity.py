"""The core imports only the standard library and itself (DESIGN §2)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import synapse_ha.core

CORE = Path(synapse_ha.core.__file__).parent
FORBIDDEN_STDLIB = {"time", "datetime", "socket", "subprocess", "threading", "os", "asyncio"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_core_imports_only_the_standard_library_without_clock_or_io() -> None:
    offenders = []
    files = sorted(CORE.rglob("*.py"))
    assert len(files) >= 5
    for path in files:
        for name in _imports(path):
            top = name.split(".")[0]
            if name.startswith("synapse_ha.core") or name == "__future__":
                continue
            if top not in sys.stdlib_module_names or top in FORBIDDEN_STDLIB:
                offenders.append(f"{path.name}: {name}")
    assert offenders == []
