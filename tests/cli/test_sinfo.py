"""sinfo's view of nodes (synapse_ha.cli.sinfo): Slurm's state words and format fields."""

from __future__ import annotations

from synapse_ha.cli.sinfo import node_state, row
from synapse_ha.core.model import NodeStatus
from synapse_ha.rpc import states
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb


def node(name: str, status: NodeStatus, gpus_used: int, cpu_used: int = 0) -> pb.Node:
    return pb.Node(
        node_id=name,
        address=f"{name}.cluster:7070",
        capacity=pb.Resources(gpu=8, cpu_milli=96_000, memory_mib=1_000_000),
        allocated=pb.Resources(gpu=gpus_used, cpu_milli=cpu_used),
        features=["ib", "h100"],
        **states.node_status_fields(status),
    )


def test_a_nodes_state_is_slurms_word_for_it() -> None:
    assert node_state(node("a", NodeStatus.READY, 0)) == "idle"
    assert node_state(node("a", NodeStatus.READY, 4)) == "mix"
    assert node_state(node("a", NodeStatus.READY, 8)) == "alloc"
    assert node_state(node("a", NodeStatus.CORDONED, 0)) == "drain"
    assert node_state(node("a", NodeStatus.DRAINING, 2)) == "drng"
    assert node_state(node("a", NodeStatus.DEAD, 0)) == "down"


def test_a_group_of_nodes_in_sinfos_fields() -> None:
    group = [node("gpu01", NodeStatus.READY, 0), node("gpu02", NodeStatus.READY, 8)]
    field = {name: row("default", group, name) for name in (
        "partition", "partitionname", "nodes", "nodelist", "hostnames", "cpus", "gres",
        "features", "nodes_aiot", "statecompact", "state",
    )}  # fmt: skip
    assert field == {
        "partition": "default*",
        "partitionname": "default",
        "nodes": "2",
        "nodelist": "gpu[01-02]",
        "hostnames": "gpu01.cluster,gpu02.cluster",
        "cpus": "96",
        "gres": "gpu:8",
        "features": "h100,ib",
        "nodes_aiot": "1/1/0/2",
        "statecompact": "alloc/idle",
        "state": "allocated/idle",
    }
    assert row("research", group, "partition") == "research"
