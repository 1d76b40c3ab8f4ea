"""The dashboard's GPU map marks unhealthy GPUs and names each node's faults, escaped."""

from __future__ import annotations

import re

from synapse_ha.observe.pages import STYLE, Overview, render_node_map, render_overview
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

HOSTILE = '"><script>alert(1)</script>'


def nodes() -> list[pb.Node]:
    sick = pb.Node(
        node_id="w1",
        node_status=pb.NODE_STATUS_READY,
        capacity=pb.Resources(gpu=4),
        allocated_gpus=[0, 3],
        topology=[pb.TopologyLabel(level="rack", value="ra")],
        gpu_faults=[
            pb.GpuFault(gpu=3, code="xid-79", detail=HOSTILE, since_ms=1),
            pb.GpuFault(gpu=1, code="ecc-dbe", since_ms=2),
        ],
    )
    healthy = pb.Node(
        node_id="w2",
        node_status=pb.NODE_STATUS_READY,
        capacity=pb.Resources(gpu=4),
        allocated_gpus=[1],
        topology=[pb.TopologyLabel(level="rack", value="ra")],
    )
    return [sick, healthy]


def node_span(page: str, node_id: str) -> str:
    match = re.search(rf'<span class="node[^"]*" data-node="{node_id}".*?</span>', page)
    assert match is not None, page
    return match.group()


def test_unhealthy_gpus_get_their_own_class_and_the_title_names_the_faults() -> None:
    page = render_node_map(nodes())
    sick = node_span(page, "w1")
    assert sick.startswith('<span class="node ready sick"')
    assert 'data-unhealthy="2"' in sick
    assert 'title="w1 ready 2/4 GPU; unhealthy: GPU 1 ecc-dbe, GPU 3 xid-79"' in sick
    # GPU 0 in use, 1 unhealthy, 2 free, 3 unhealthy though still held.
    assert re.findall(r'<i class="g (\w)"', sick) == ["u", "x", "f", "x"]
    assert 'data-gpu="3" data-fault="xid-79"' in sick
    healthy = node_span(page, "w2")
    assert healthy.startswith('<span class="node ready"')
    assert 'data-unhealthy="0"' in healthy
    assert re.findall(r'<i class="g (\w)"', healthy) == ["f", "u", "f", "f"]


def test_fault_text_is_escaped() -> None:
    page = render_overview(Overview(nodes=nodes()))
    assert "<script>" not in page
    assert "&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_the_stylesheet_styles_unhealthy_gpus_and_nodes() -> None:
    assert ".g.x{" in STYLE
    assert ".node.sick{" in STYLE
