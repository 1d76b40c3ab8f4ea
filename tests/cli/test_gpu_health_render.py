"""synctl's view of GPU health and node fitness without a cluster: the node document's
``gpu_faults`` and ``unfit``, the UNHEALTHY and UNFIT FOR columns, the repair answer,
and hostile fault text kept off the terminal."""

from __future__ import annotations

import json

import yaml

from synapse_ha.cli import render, render_nodes
from synapse_ha.client.nodes import node_from_proto, repaired_from_proto
from synapse_ha.core.health.fitness import GpuFault, Unfit
from synapse_ha.core.model import Node, NodeInfo, NodeStatus, Resources
from synapse_ha.rpc import to_proto
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

NOW = 1_700_000_000_000
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\r\u202eevil"


def sick_node(code: str = "xid-79", detail: str = "Xid 79: fell off the bus") -> pb.Node:
    return pb.Node(
        node_id="w1",
        address="w1.example:7070",
        node_status=pb.NODE_STATUS_READY,
        status="ready",
        capacity=pb.Resources(gpu=8, cpu_milli=8000, memory_mib=16384),
        allocated_gpus=[0, 1, 3],
        topology=[pb.TopologyLabel(level="rack", value="r1")],
        gpu_faults=[
            pb.GpuFault(gpu=5, code="ecc-dbe", detail="", since_ms=NOW - 5_000),
            pb.GpuFault(gpu=3, code=code, detail=detail, since_ms=NOW - 60_000),
        ],
        unfit=[
            pb.NodeUnfit(owner="carol", detail="expired", until_ms=NOW - 1),
            pb.NodeUnfit(owner="bob", detail="no account for bob", until_ms=NOW + 600_000),
            pb.NodeUnfit(owner="alice", detail="no account for alice", until_ms=NOW + 1),
        ],
        last_heartbeat_age_ms=-1,
    )


def row(text: str, node_id: str) -> dict[str, str]:
    """The table's row of ``node_id`` by column header (headers hold single spaces, cells
    none, so columns split on runs of two spaces or more are exact for these tests)."""
    lines = text.splitlines()
    header = lines[0]
    starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")]
    names: list[tuple[str, int]] = []
    for start in starts:
        if names and header[start - 2 : start] != "  ":
            continue  # the second word of a header like FREE GPU
        names.append((header[start:].split("  ")[0].strip(), start))
    line = next(line for line in lines[1:] if line.startswith(node_id + " "))
    cells = {}
    for index, (name, start) in enumerate(names):
        end = names[index + 1][1] if index + 1 < len(names) else len(line)
        cells[name] = line[start:end].strip()
    return cells


def test_the_document_carries_faults_by_gpu_and_the_unfit_owners_in_force() -> None:
    doc = render_nodes.node_document(node_from_proto(sick_node()), NOW)
    assert doc["gpu_faults"] == [
        {
            "gpu": 3,
            "code": "xid-79",
            "detail": "Xid 79: fell off the bus",
            "since_ms": NOW - 60_000,
        },
        {"gpu": 5, "code": "ecc-dbe", "detail": "", "since_ms": NOW - 5_000},
    ]
    assert doc["unfit"] == [
        {"owner": "alice", "detail": "no account for alice", "until_ms": NOW + 1},
        {"owner": "bob", "detail": "no account for bob", "until_ms": NOW + 600_000},
    ]
    # Free: neither allocated (0, 1, 3) nor unhealthy (3, 5).
    assert doc["free_gpus"] == 4
    assert json.loads(render.structured({"nodes": [doc]}, "json"))["nodes"][0] == doc
    assert yaml.safe_load(render.structured({"nodes": [doc]}, "yaml"))["nodes"][0] == doc


def test_the_table_names_each_unhealthy_gpu_and_the_owners_kept_off() -> None:
    healthy = pb.Node(node_id="w2", status="ready", capacity=pb.Resources(gpu=8))
    docs = [render_nodes.node_document(node_from_proto(n), NOW) for n in (sick_node(), healthy)]
    text = render_nodes.nodes_table(docs)
    assert row(text, "w1")["UNHEALTHY"] == "3:xid-79,5:ecc-dbe"
    assert row(text, "w1")["UNFIT FOR"] == "alice,bob"
    assert row(text, "w1")["FREE GPU"] == "4/8"
    assert row(text, "w2")["UNHEALTHY"] == "-"
    assert row(text, "w2")["UNFIT FOR"] == "-"


def test_hostile_fault_text_is_escaped_in_the_table_and_kept_exact_in_json() -> None:
    node = sick_node(code=HOSTILE, detail=HOSTILE)
    node.unfit.append(pb.NodeUnfit(owner=HOSTILE, detail=HOSTILE, until_ms=NOW + 10))
    doc = render_nodes.node_document(node_from_proto(node), NOW)
    text = render_nodes.nodes_table([doc])
    for unsafe in ("\x1b", "\x07", "\r", "\u202e"):
        assert unsafe not in text
    assert "3:\\x1b]0;pwned\\x07\\x1b[2J\\r\\u202eevil" in text
    # JSON escapes it and gives it back exactly.
    encoded = render.structured({"nodes": [doc]}, "json")
    assert "\x1b" not in encoded and "\u202e" not in encoded
    decoded = json.loads(encoded)["nodes"][0]
    assert decoded["gpu_faults"][0]["code"] == HOSTILE
    assert HOSTILE in [u["owner"] for u in decoded["unfit"]]
    assert "\x1b" not in render.structured({"nodes": [doc]}, "yaml")


def test_the_repair_answer_shows_the_message_and_each_fault_left() -> None:
    answer = pb.RepairGpusResponse(
        message="node w1: GPU 3 xid-79 repaired",
        gpu_faults=[pb.GpuFault(gpu=5, code="ecc-dbe", detail=HOSTILE, since_ms=NOW)],
    )
    doc = render_nodes.repair_document("w1", repaired_from_proto(answer))
    assert doc == {
        "id": "w1",
        "message": "node w1: GPU 3 xid-79 repaired",
        "gpu_faults": [{"gpu": 5, "code": "ecc-dbe", "detail": HOSTILE, "since_ms": NOW}],
    }
    lines = render_nodes.repair_text(doc).splitlines()
    assert lines[0] == "node w1: GPU 3 xid-79 repaired"
    assert lines[1].startswith("still unhealthy: GPU 5 ecc-dbe (\\x1b]0;pwned")
    assert lines[1].endswith(f"since {render.time_text(NOW)}")
    assert len(lines) == 2
    every = render_nodes.repair_document(
        "w1", repaired_from_proto(pb.RepairGpusResponse(message="ok"))
    )
    assert render_nodes.repair_text(every).splitlines() == ["ok", "node w1: every GPU healthy"]


def test_the_replicated_node_reaches_the_document_through_the_wire() -> None:
    node = Node(
        info=NodeInfo("w9", "127.0.0.1:9", Resources(cpu_milli=1000, memory_mib=1024, gpu=4)),
        status=NodeStatus.READY,
        registered_at_ms=NOW - 100_000,
        allocated_gpus={0},
        gpu_faults=(GpuFault(2, "lost", "GPU fell off the bus", NOW - 10),),
        unfit=(
            Unfit("dave", "no account for dave", NOW + 60_000),
            Unfit("erin", "image missing", NOW - 60_000),
        ),
    )
    doc = render_nodes.node_document(
        node_from_proto(to_proto.node_to_proto(node, heartbeat_age_ms=5)), NOW
    )
    assert doc["gpu_faults"] == [
        {"gpu": 2, "code": "lost", "detail": "GPU fell off the bus", "since_ms": NOW - 10}
    ]
    assert doc["unfit"] == [
        {"owner": "dave", "detail": "no account for dave", "until_ms": NOW + 60_000}
    ]
    assert doc["free_gpus"] == 2
    assert doc["status"] == NodeStatus.READY
