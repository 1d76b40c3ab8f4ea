"""A small tmpfs for tests that need a disk that really fills up (root only)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """``path`` as a tmpfs of ``size`` (``256k``, ``1m``) while the block runs."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "synapse-test-disk", str(path)],
        check=True,
        timeout=30,
    )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, timeout=30)
