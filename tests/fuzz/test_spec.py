"""Fuzzing the job-spec parser: only the typed errors it documents ever come out.

:func:`synapse_ha.core.spec.document.parse_job_spec` raises :class:`SpecError` and
:func:`synapse_ha.client.specfile.load_job_file` :class:`SpecFileError` for anything wrong;
nothing else may escape, whatever the input (wrong types in every field, nested garbage,
YAML that is not a job, text that is not YAML), and nothing may hang: YAML bombs (billion
laughs, recursive anchors, alias chains), deep nesting and huge documents are refused by
the file's limits with an error naming the limit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synapse_ha.client.specfile import (
    MAX_SPEC_ALIASES,
    MAX_SPEC_DEPTH,
    MAX_SPEC_FILE_BYTES,
    MAX_SPEC_NODES,
    SpecFileError,
    load_job_file,
)
from synapse_ha.core.spec.document import SpecError, parse_job_spec
from tests.fuzz import harness

HANG_BOUND_S = 120.0  # far beyond any input within the limits, on a shared machine

FIELDS = [
    "name",
    "replicas",
    "resources",
    "command",
    "env",
    "workdir",
    "priority",
    "topology",
    "time_limit",
    "retries",
    "request_id",
    "image",
    "queue",
    "gpu",
    "cpu",
    "memory",
    "required",
    "preferred",
    "max",
    "backoff",
    "max_backoff",
    "progress",
    "timeout",
    "source",
    "rack",
    "<<",
]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["500m", "256Gi", "12h", "1e400", "-1", "0x10", "nan", "1.5Pi", "99999d"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(max_size=8)), inner, max_size=5),
    ),
    max_leaves=30,
)
VALID = {
    "name": "train",
    "replicas": 2,
    "resources": {"gpu": 1, "cpu": "500m", "memory": "1Gi"},
    "command": ["echo", "hi"],
    "env": {"A": "b"},
    "time_limit": "1h",
    "retries": {"max": 2, "backoff": "10s"},
}
DOCUMENTS = st.one_of(
    st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=8),
    # A valid spec with some fields replaced by garbage.
    st.builds(lambda extra: {**VALID, **extra}, st.dictionaries(st.sampled_from(FIELDS), VALUES)),
    VALUES,
)


def bounded(fn: Callable[[], Any]) -> BaseException | None:
    """Run ``fn`` in a thread; what it raised (None if nothing). Fails if it is still
    running after HANG_BOUND_S."""
    caught: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            caught.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_BOUND_S)
    assert not thread.is_alive(), f"no answer after {HANG_BOUND_S}s: the parser hangs"
    return caught[0] if caught else None


def _only_spec_errors(exc: BaseException | None, kind: type[SpecError]) -> None:
    if exc is not None and not isinstance(exc, kind):
        raise AssertionError(f"unexpected {type(exc).__name__}: {exc}") from exc


TALLY = harness.Tally("spec")
record_the_counts = harness.recorder(TALLY)


@pytest.fixture(scope="module")
def spec_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spec")


@settings(max_examples=harness.examples(60), deadline=None, database=None)
@given(doc=DOCUMENTS)
def test_parse_job_spec_raises_only_spec_errors(doc: Any) -> None:
    TALLY.examples += 1
    exc = bounded(lambda: parse_job_spec(doc))
    _only_spec_errors(exc, SpecError)
    TALLY.add("parse_job_spec", "-", harness.Outcome("rejected" if exc else "accepted", "-"))


def _mutations(text: str) -> st.SearchStrategy[str]:
    cut = st.integers(0, max(len(text), 1))
    return st.one_of(
        st.just(text),
        st.builds(lambda i: text[:i], cut),
        st.builds(
            lambda i, junk: text[:i] + junk + text[i:],
            cut,
            st.sampled_from(
                [
                    "&a ",
                    "*a",
                    "<<: ",
                    "!!binary ",
                    "{",
                    "[",
                    ": ",
                    "\t",
                    "- ",
                    "\x00",
                    "\ufeff",
                    "%YAML 1.1\n",
                    "--- ",
                    "? ",
                    "!!python/name:os.system",
                ]
            ),
        ),
    )


YAML_TEXTS = st.one_of(
    DOCUMENTS.map(lambda d: yaml.safe_dump(d, allow_unicode=True)).flatmap(_mutations),
    st.text(max_size=200),
)


@settings(
    max_examples=harness.examples(60),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(text=YAML_TEXTS)
def test_load_job_file_raises_only_spec_file_errors(spec_dir: Path, text: str) -> None:
    TALLY.examples += 1
    path = spec_dir / "job.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    exc = bounded(lambda: load_job_file(path))
    _only_spec_errors(exc, SpecFileError)
    TALLY.add("load_job_file", "-", harness.Outcome("rejected" if exc else "accepted", "-"))


def _laughs(levels: int = 9) -> str:
    text = 'l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for i in range(1, levels):
        text += f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]\n"
    return text


JOB = "name: x\nreplicas: 1\ncommand: [echo]\n"
BOMBS = {
    "billion laughs": (_laughs() + JOB, f"more than {MAX_SPEC_NODES} values"),
    "laughs as the command": (
        _laughs() + "name: x\nreplicas: 1\ncommand: *l8\n",
        f"more than {MAX_SPEC_NODES} values",
    ),
    "recursive anchor": ("a: &a [*a]\n" + JOB, f"deeper than {MAX_SPEC_DEPTH} levels"),
    "alias chain": (
        "a0: &a0 [1]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, 200)) + JOB,
        f"deeper than {MAX_SPEC_DEPTH} levels",
    ),
    "many aliases": (
        "a: &a 1\nb: [" + ",".join(["*a"] * (MAX_SPEC_ALIASES + 1)) + "]\n" + JOB,
        f"more than {MAX_SPEC_ALIASES} aliases",
    ),
    "deep flow lists": ("[" * 50_000 + "]" * 50_000, f"deeper than {MAX_SPEC_DEPTH} levels"),
    "deep flow mappings": (
        "a: " + "{a: " * 20_000 + "1" + "}" * 20_000,
        f"deeper than {MAX_SPEC_DEPTH} levels",
    ),
    "deep block mappings": (
        "".join("  " * i + "a:\n" for i in range(100)),
        f"deeper than {MAX_SPEC_DEPTH} levels",
    ),
    "huge document": (JOB + "#" * MAX_SPEC_FILE_BYTES, f"larger than {MAX_SPEC_FILE_BYTES}"),
    "python tag": ("!!python/object/apply:os.system ['true']\n", "not valid YAML"),
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_yaml_bombs_get_an_error_naming_the_limit(tmp_path: Path, name: str) -> None:
    text, rule = BOMBS[name]
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    exc = bounded(lambda: load_job_file(path))
    assert isinstance(exc, SpecFileError), f"{name}: {exc!r}"
    assert exc.field == "spec"
    assert rule in exc.rule


def test_a_document_within_the_limits_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(JOB + "env: {A: b}\ntopology: {required: rack}\n")
    assert load_job_file(path).spec.env == (("A", "b"),)
