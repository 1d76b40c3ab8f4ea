"""The dev cluster's stable dashboard address: fixed /metrics and dashboard ports when
they are free (none with ephemeral ports), a free port instead of a taken one, and
``synctl dev up`` naming the dashboard first. No cluster starts."""

from __future__ import annotations

import socket

from synapse_ha.local.devcluster import DevCluster
from synapse_ha.local.devoptions import (
    DEFAULT_WORKER_PORT_BASE,
    FIVE_GRPC_PORTS,
    FIVE_RAFT_PORTS,
    MAX_WORKERS,
    DevClusterOptions,
    preferred_metrics_ports,
)
from synapse_ha.local.foreground import dashboard_line, describe, moved_ports
from synapse_ha.local.ports import HOST, PortHolder


def test_the_dashboards_have_fixed_ports_unless_free_ones_are_asked_for() -> None:
    three = preferred_metrics_ports(DevClusterOptions())
    assert [three[r] for r in ("a", "b", "c")] == [7191, 7192, 7193]
    assert "d" not in three and three["w1"] == 7201 and three["w4"] == 7204
    five = preferred_metrics_ports(DevClusterOptions(replicas=5))
    assert (five["d"], five["e"]) == (7194, 7195)
    assert preferred_metrics_ports(DevClusterOptions(ephemeral_ports=True)) == {}
    # No clash with the cluster's other fixed ports, nor between programs.
    others = {*FIVE_GRPC_PORTS, *FIVE_RAFT_PORTS}
    others |= set(range(DEFAULT_WORKER_PORT_BASE, DEFAULT_WORKER_PORT_BASE + MAX_WORKERS))
    assert not others & set(five.values())
    assert len(set(five.values())) == len(five)


def test_a_taken_port_is_replaced_by_a_free_one() -> None:
    holder = PortHolder()
    listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listening.bind((HOST, 0))
        listening.listen()
        taken = listening.getsockname()[1]
        instead = holder.reserve_preferred(taken)
        assert instead != taken and (HOST, instead) in holder.held()
        scratch = PortHolder()
        (free,) = scratch.reserve(1)
        scratch.release()
        assert holder.reserve_preferred(free) == free  # free: kept
        assert holder.reserve_preferred(free) != free  # held here already, for another
        assert holder.reserve_preferred(0) not in (0, free)
    finally:
        listening.close()
        holder.release()


def test_dev_up_names_the_dashboard_first_and_any_port_it_could_not_have() -> None:
    cluster = DevCluster(DevClusterOptions(workers=1, racks=1, ephemeral_ports=True))
    try:
        first = cluster.replicas[0].metrics
        assert cluster.dashboard_url == f"https://{first}/"
        assert cluster.credentials is not None
        assert dashboard_line(cluster) == (
            f"dashboard: https://{first}/ (replica a's; every replica serves one) — sign in "
            f"with the admin token in {cluster.credentials.admin_token_file}"
        )
        assert describe(cluster)[:2] == [dashboard_line(cluster), "replicas:"]
        assert moved_ports(cluster) == []  # nothing was asked for
        cluster.preferred_metrics_ports["b"] = 1  # as if port 1 had been wanted, and taken
        assert moved_ports(cluster) == [
            f"{HOST}:1 is in use: replica b serves on {cluster.replicas[1].metrics} instead"
        ]
    finally:
        cluster.stop()
