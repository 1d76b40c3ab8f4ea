"""Fixtures of the in-process RPC tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.rpc.stream_client import Client


@pytest.fixture
def clients() -> Iterator[list[Client]]:
    made: list[Client] = []
    yield made
    for c in made:
        c.close()
