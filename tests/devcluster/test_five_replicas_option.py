"""`synctl dev up --replicas 3|5`: the option and the replica set it makes."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from synapse_ha.cli.main import cli
from synapse_ha.local.devcluster import DevCluster
from synapse_ha.local.devoptions import DevClusterOptions


@pytest.mark.parametrize("replicas", [1, 2, 4, 7])
def test_only_three_or_five_replicas(replicas: int) -> None:
    with pytest.raises(ValueError, match="replicas: must be 3 or 5"):
        DevClusterOptions(replicas=replicas).check()


@pytest.mark.parametrize(
    ("replicas", "ports"), [(3, [7101, 7102, 7103]), (5, list(range(7101, 7106)))]
)
def test_the_replica_set_has_fixed_ports(replicas: int, ports: list[int]) -> None:
    cluster = DevCluster(DevClusterOptions(replicas=replicas, workers=0, racks=1))
    try:
        assert [int(a.rpartition(":")[2]) for a in cluster.cluster_addresses] == ports
        assert len({r.replica_id for r in cluster.replicas}) == replicas
    finally:
        cluster.stop()


def test_the_cli_refuses_other_counts() -> None:
    result = CliRunner().invoke(cli, ["dev", "up", "--replicas", "4"])
    assert result.exit_code == 2 and "'4' is not one of '3', '5'" in result.output
