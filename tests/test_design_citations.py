"""Every "DESIGN §N" (or "DESIGN §N.M") citation in the repository names a section of
docs/design.md, every module docs/design.md names exists, and nothing points at a design
document outside the repository."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
# Where citations live: the package, the chaos suite, benchmarks, tests, docs, the API
# sources and the deployment examples, and the README.
CITING = ("synapse_ha", "chaos", "bench", "tests", "docs", "protos", "deploy")
SUFFIXES = frozenset({".py", ".md", ".proto", ".toml", ".yaml", ".yml", ".sh"})
SKIPPED_DIRS = frozenset({"__pycache__", "runs", "results"})

# "DESIGN §4", "DESIGN §4.1", also across a line break, and "DESIGN §4, §8" / "§4 and §8".
_SECTION = r"§(\d+(?:\.\d+)*)"
CITATION = re.compile(rf"DESIGN\s+{_SECTION}((?:\s*(?:,|and|/)\s*{_SECTION})*)")
FURTHER = re.compile(_SECTION)
# "## 4. Lifecycle, ...", "### 4.1 The timeouts".
HEADING = re.compile(r"^#{2,6}\s+(\d+(?:\.\d+)*)\.?\s", re.MULTILINE)


def cited_sections(text: str) -> list[str]:
    """The section numbers ``text`` cites, in order."""
    found = []
    for match in CITATION.finditer(text):
        found.append(match.group(1))
        found.extend(FURTHER.findall(match.group(2)))
    return found


def sections(text: str) -> set[str]:
    """The numbers of the numbered headings of a Markdown document."""
    return set(HEADING.findall(text))


def missing_citations(texts: dict[str, str], headings: set[str]) -> list[str]:
    """``path: §N`` for every citation that names no heading."""
    return [
        f"{path}: §{number}"
        for path, text in sorted(texts.items())
        for number in cited_sections(text)
        if number not in headings
    ]


@functools.cache
def citing_files() -> dict[str, str]:
    """The text of every file that may cite the design, by path (this file left out: its
    examples are not citations)."""
    paths = [ROOT / "README.md"]
    for top in CITING:
        for folder, dirs, files in os.walk(ROOT / top):
            dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
            paths.extend(Path(folder, f) for f in files if Path(f).suffix in SUFFIXES)
    here = Path(__file__).resolve()
    return {
        str(p.relative_to(ROOT)): p.read_text(encoding="utf-8", errors="replace")
        for p in paths
        if p != here
    }


def test_the_checks_find_a_missing_section() -> None:
    design = "## 4. Lifecycle\n\n### 4.1 The timeouts\n\n## 8. Who\n"
    headings = sections(design)
    assert headings == {"4", "4.1", "8"}
    cites = "rules (DESIGN §4), the timeouts (DESIGN\n    §4.1), queues (DESIGN §8, §99)"
    assert cited_sections(cites) == ["4", "4.1", "8", "99"]
    assert missing_citations({"x.py": cites}, headings) == ["x.py: §99"]
    assert missing_citations({"x.py": "DESIGN §4.2"}, headings) == ["x.py: §4.2"]
    assert missing_citations({"x.py": "see DESIGN §8 and §4"}, headings) == []


def test_every_design_citation_names_a_section_of_docs_design_md() -> None:
    texts = citing_files()
    headings = sections(DESIGN.read_text(encoding="utf-8"))
    assert {str(n) for n in range(1, 10)} <= headings
    assert sum(len(cited_sections(t)) for t in texts.values()) > 100  # the scan found them
    assert missing_citations(texts, headings) == []


def named_modules(text: str) -> set[str]:
    """The files a document names in backquotes (``core/spec/document.py``, ``worker/shim.py``)."""
    return set(re.findall(r"`([A-Za-z_][A-Za-z0-9_/]*\.(?:py|md|toml))`", text))


def missing_modules(names: set[str]) -> list[str]:
    """The names that are no file of the repository or of the package."""
    return sorted(
        name
        for name in names
        if not (ROOT / name).is_file() and not (ROOT / "synapse_ha" / name).is_file()
    )


def test_a_module_that_does_not_exist_is_found() -> None:
    named = named_modules("see `core/nothere.py`, `worker/shim.py` and `tests/conftest.py`")
    assert missing_modules(named) == ["core/nothere.py"]


def test_the_modules_docs_design_md_names_exist() -> None:
    named = named_modules(DESIGN.read_text(encoding="utf-8"))
    assert "core/machine/binding.py" in named  # the flows of §2.2 are read
    assert missing_modules(named) == []


def test_nothing_points_at_a_design_document_outside_the_repository() -> None:
    outside = [
        path
        for path, text in sorted(citing_files().items())
        if "shared/DESIGN" in text or "DESIGN.md" in text
    ]
    assert outside == []
