"""The harness builds the same nodes whatever the interpreter's hash seed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = (
    "from tests.core.harness import node\nprint([node(f'n{i}').address for i in range(1, 41)])\n"
)


def addresses_with_hash_seed(seed: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    return done.stdout


def test_node_addresses_do_not_depend_on_the_hash_seed() -> None:
    first = addresses_with_hash_seed("1")
    assert first.startswith("['10.0.0.")
    assert addresses_with_hash_seed("2") == first
    assert addresses_with_hash_seed("3") == first
