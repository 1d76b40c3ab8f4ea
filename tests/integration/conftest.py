from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.cluster import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three replicas shared by the tests of one module (they must not kill replicas)."""
    c = LocalCluster(tmp_path_factory.mktemp("cluster"))
    try:
        c.start()
        c.serving_leader()
        yield c
    finally:
        c.close()


@pytest.fixture
def fresh_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three replicas of this test's own, started by the test; compacting often so that
    restarts go through the snapshot path as well as the journal."""
    c = LocalCluster(tmp_path_factory.mktemp("fresh"), extra_args=["--compaction-entries", "50"])
    try:
        yield c
    finally:
        c.close()
