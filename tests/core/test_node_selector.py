"""Node selection (``nodes:`` of a job spec, core/node_selector.py): the feature expression's
parser, GPU model and name matching, the scheduler keeping a gang to the nodes it selects,
the state machine refusing a plan that does not, and the submission's feasibility."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.codec.formats import format_needed
from synapse_ha.core.codec.from_plain import from_plain
from synapse_ha.core.codec.to_plain import to_plain
from synapse_ha.core.model import ClusterState, JobSpec, JobState, MemberPlacement, NodeInfo
from synapse_ha.core.node_selector import (
    FeatureError,
    NodeSelector,
    gpu_model_matches,
    holds,
    host_of,
    node_names,
    parse_features,
    placement_problem,
    render,
    selector_problems,
)
from synapse_ha.core.reasons import render as render_reason
from synapse_ha.core.scheduler.capacity import Table, View
from synapse_ha.core.scheduler.placement import Gang, fits, place, search_depths
from synapse_ha.core.spec.document import SpecError, parse_job_spec
from synapse_ha.core.views import host_of as views_host_of
from tests.core.harness import Cluster, job, node

# ------------------------------------------------------------------- the parser


@pytest.mark.parametrize(
    ("text", "with_", "without"),
    [
        ("a100", {"a100"}, {"h100"}),
        ("a100&ib", {"a100", "ib"}, {"a100"}),
        ("a|b&c", {"a"}, {"b"}),  # & binds tighter: a | (b & c)
        ("(a|b)&c", {"b", "c"}, {"a"}),
        ("volta32gb", {"volta32gb"}, set()),
    ],
)
def test_feature_expressions_read_as_slurm_reads_constraint(
    text: str, with_: set[str], without: set[str]
) -> None:
    (expr,) = parse_features(text).alternatives
    assert holds(expr, frozenset(with_))
    assert not holds(expr, frozenset(without))


def test_a_matching_or_group_gives_one_alternative_per_choice_each_joined_to_the_rest() -> None:
    alternatives = parse_features("ib&[rack1|rack2]").alternatives
    assert [render(a) for a in alternatives] == ["ib&rack1", "ib&rack2"]
    assert [render(a) for a in parse_features("[a&x|b]").alternatives] == ["a&x", "b"]


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("a100*2", "counts (feature*N) are not supported"),
        ("a|[b|c]", "joined to the rest with '&'"),
        ("[a|b]&[c|d]", "one [...] group at most"),
        ("[a]", "lists alternatives"),
        ("a&&b", "a feature name is missing before '&'"),
        ("(a|b", "')' is missing"),
        ("a b", "unexpected 'b'"),
        ("a$b", "a feature is letters"),
    ],
)
def test_an_expression_that_does_not_parse_names_the_rule(text: str, rule: str) -> None:
    with pytest.raises(FeatureError, match=None) as caught:
        parse_features(text)
    assert rule in str(caught.value)


_names = st.sampled_from(["a", "b", "c", "d"])


def _exprs() -> st.SearchStrategy[object]:
    return st.recursive(
        _names,
        lambda inner: st.tuples(st.sampled_from(["&", "|"]), inner, inner),
        max_leaves=8,
    )


def _truth(expr: object, features: frozenset[str]) -> bool:
    if isinstance(expr, str):
        return expr in features
    op, left, right = expr  # type: ignore[misc]
    if op == "&":
        return _truth(left, features) and _truth(right, features)
    return _truth(left, features) or _truth(right, features)


def _written(expr: object) -> str:
    if isinstance(expr, str):
        return expr
    op, left, right = expr  # type: ignore[misc]
    return f"({_written(left)}{op}{_written(right)})"


@settings(max_examples=60, deadline=None)
@given(_exprs(), st.frozensets(_names))
def test_a_written_expression_parses_to_one_that_holds_where_it_does(
    expr: object, features: frozenset[str]
) -> None:
    (parsed,) = parse_features(_written(expr)).alternatives
    assert holds(parsed, features) == _truth(expr, features)
    # And what render writes back reads the same again.
    (again,) = parse_features(render(parsed)).alternatives
    assert holds(again, features) == _truth(expr, features)


# --------------------------------------------------------- GPU models and names


@pytest.mark.parametrize(
    ("wanted", "reported", "match"),
    [
        ("a100", "NVIDIA A100-SXM4-80GB", True),
        ("A100", "NVIDIA A100-SXM4-80GB", True),
        ("a100_80gb", "NVIDIA A100-SXM4-80GB", True),
        ("h100", "NVIDIA H100 80GB HBM3", True),
        ("v100", "Tesla V100-SXM2-32GB", True),
        ("a10", "NVIDIA A10G", True),
        ("a10", "NVIDIA A100-SXM4-80GB", False),
        ("a100", "NVIDIA H100 80GB HBM3", False),
        ("a100", "", False),
    ],
)
def test_a_gpu_type_matches_the_reported_model_by_words(
    wanted: str, reported: str, match: bool
) -> None:
    assert gpu_model_matches(wanted, reported) is match


@pytest.mark.parametrize("address", ["gpu01.cluster:7001", "10.0.0.3:7001", "[::1]:7001", "h"])
def test_a_node_answers_to_its_id_its_host_and_the_hosts_first_label(address: str) -> None:
    assert host_of(address) == views_host_of(address)  # the host Slurm's variables list
    names = node_names("n1", address)
    assert {"n1", host_of(address)} <= names
    assert ("gpu01" in names) is address.startswith("gpu01")
    assert "10" not in names  # an IP address has no first label


def test_the_rules_of_a_selector_name_the_field() -> None:
    bad = NodeSelector(features="a*2", gpu_model="a/b", names=("x", "y"), exclude=("x",))
    assert [field for field, _ in selector_problems(bad, 1)] == [
        "nodes.features",
        "nodes.gpu_model",
        "nodes.exclude",
        "nodes.names",
    ]
    assert selector_problems(NodeSelector(features="[a|b]", names=("x",)), 1) == []


# ------------------------------------------------------------------- placement


def _cluster() -> Cluster:
    """n0..n3, 8 GPUs each, racks r0/r1; n0 and n1 are A100 nodes with ib, n2 and n3 H100."""
    cl = Cluster()
    for i in range(4):
        a100 = i < 2
        info = node(f"n{i}", rack=f"r{i % 2}", features=("a100", "ib") if a100 else ("h100",))
        cl.add(dataclasses.replace(info, gpu_model="NVIDIA A100-SXM4-80GB" if a100 else "H100"))
    return cl


def _selecting(name: str, nodes: NodeSelector, **kw: object) -> JobSpec:
    return dataclasses.replace(job(name, **kw), nodes=nodes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("selector", "where"),
    [
        (NodeSelector(features="h100"), {"n2", "n3"}),
        (NodeSelector(features="a100&ib"), {"n0", "n1"}),
        (NodeSelector(gpu_model="a100"), {"n0", "n1"}),
        (NodeSelector(exclude=("n0", "n1", "n2")), {"n3"}),
    ],
)
def test_the_scheduler_places_a_gang_only_on_nodes_it_selects(
    selector: NodeSelector, where: set[str]
) -> None:
    cl = _cluster()
    job_id = cl.submit(_selecting("sel", selector, gpu=4, replicas=len(where) * 2))
    cl.run_pass()
    assert cl.state_of(job_id) is JobState.SCHEDULED
    assert set(cl.nodes_of(job_id)) == where


def test_a_gang_whose_nodes_are_full_waits_and_says_which_selector_keeps_it() -> None:
    cl = _cluster()
    first = cl.submit(_selecting("a", NodeSelector(features="a100"), gpu=8, replicas=2))
    cl.run_pass()
    waiting = cl.submit(_selecting("b", NodeSelector(features="a100"), gpu=8))
    free = cl.submit(job("c", gpu=8))  # any node: it takes an H100 node
    cl.run_pass()
    assert cl.state_of(first) is JobState.SCHEDULED
    assert cl.state_of(free) is JobState.SCHEDULED
    assert cl.state_of(waiting) is JobState.PENDING
    text = render_reason(cl.state.jobs[waiting].reason)
    assert "on nodes with features a100" in text, text
    # An H100 node is free, but the room said is on the nodes it selects.
    assert "the cluster has room for 0 (only the nodes it selects qualify)" in text, text


def test_named_nodes_each_hold_a_member() -> None:
    cl = _cluster()
    # Best fit alone would put both members on one node; n3 must hold one.
    job_id = cl.submit(_selecting("w", NodeSelector(names=("n3",)), gpu=2, replicas=2))
    cl.run_pass()
    assert "n3" in cl.nodes_of(job_id)
    # By host too: the address's host names the node.
    host = host_of(cl.state.nodes["n2"].info.address)
    other = cl.submit(_selecting("h", NodeSelector(names=(host, "n1")), gpu=8, replicas=2))
    cl.run_pass()
    assert sorted(cl.nodes_of(other)) == ["n1", "n2"]


def test_a_matching_or_group_keeps_every_member_on_one_alternative() -> None:
    cl = _cluster()
    # Groups across racks: ga = {n0 (r0), n1 (r1)}, gb = {n2 (r0), n3 (r1)}.
    for info in [n.info for n in cl.state.nodes.values()]:
        group = "ga" if info.node_id in ("n0", "n1") else "gb"
        cl.add(dataclasses.replace(info, features=(*info.features, group)))
    cl.submit(_selecting("n0-busy", NodeSelector(names=("n0",)), gpu=8))
    cl.run_pass()
    # Rack r1 (n1, n3) is the tightest fit, but n1 and n3 share no group: gb holds it.
    job_id = cl.submit(_selecting("g", NodeSelector(features="[ga|gb]"), gpu=8, replicas=2))
    cl.run_pass()
    assert sorted(cl.nodes_of(job_id)) == ["n2", "n3"]
    anywhere = cl.submit(job("any", gpu=8, replicas=2))
    assert cl.state.jobs[anywhere].spec.nodes is None


# ---------------------------------------------------------------- apply's check


def test_apply_refuses_a_plan_on_a_node_the_selector_does_not_allow() -> None:
    cl = _cluster()
    job_id = cl.submit(_selecting("x", NodeSelector(features="h100"), gpu=1))
    before = dataclasses.replace(cl.state.jobs[job_id])
    plan = c.BindPlan((c.GangPlacement(job_id, 0, (MemberPlacement(0, "n0", (0,)),)),), (), cl.now)
    result = cl.do(plan)
    (rejected,) = result.rejected
    assert rejected.code is c.RejectCode.NODE_SELECTOR
    assert "node n0 does not match the job's nodes (features h100)" in rejected.message
    assert cl.state.jobs[job_id] == before
    assert not cl.state.nodes["n0"].allocated_gpus
    # A plan that leaves out a named node is refused too.
    named = cl.submit(_selecting("y", NodeSelector(names=("n3",)), gpu=1))
    plan = c.BindPlan((c.GangPlacement(named, 0, (MemberPlacement(0, "n2", (0,)),)),), (), cl.now)
    (rejected,) = cl.do(plan).rejected
    assert "no member runs on node n3" in rejected.message


# ------------------------------------------------------------------ feasibility


@pytest.mark.parametrize(
    ("selector", "said"),
    [
        (NodeSelector(features="a100&volta32gb"), "nodes.features: the job can never fit"),
        (NodeSelector(features="volta32gb"), "no node has feature volta32gb; the nodes have "),
        (NodeSelector(gpu_model="v100"), "no node has a GPU model matching v100"),
        (NodeSelector(names=("gpu07",)), "nodes.names: the job can never fit this cluster: no"),
        (NodeSelector(features="h100", names=("n0",)), "no node matches features h100, nodes n0"),
    ],
)
def test_a_selector_no_node_can_satisfy_is_refused_at_submission(
    selector: NodeSelector, said: str
) -> None:
    cl = _cluster()
    result = cl.do(c.SubmitJob(_selecting("never", selector, gpu=1), "r-never", cl.now))
    assert result.code is c.ResultCode.INVALID
    assert said in result.message, result.message
    assert not cl.state.jobs


def test_a_gang_too_large_for_the_nodes_it_selects_is_refused_with_their_count() -> None:
    cl = _cluster()
    spec = _selecting("big", NodeSelector(gpu_model="a100"), gpu=8, replicas=3)
    result = cl.do(c.SubmitJob(spec, "r-big", cl.now))
    assert "needs 3 nodes with 8 GPUs; the cluster has 2, of the nodes it selects" in (
        result.message
    )
    waits = cl.submit(dataclasses.replace(spec, wait_for_nodes=True))
    cl.run_pass()
    assert "waits for nodes to join" in render_reason(cl.state.jobs[waits].reason)


# ------------------------------------------------------------- the job document


def test_the_job_document_reads_nodes_and_the_codec_keeps_it_at_format_13() -> None:
    doc = {
        "name": "t",
        "command": "true",
        "replicas": 2,
        "nodes": {"features": "a100&ib", "gpu_model": "a100", "names": "gpu01", "exclude": []},
    }
    spec = parse_job_spec(doc).spec
    assert spec.nodes == NodeSelector("a100&ib", "a100", ("gpu01",), ())
    assert from_plain(JobSpec, to_plain(spec)) == spec
    assert format_needed(c.SubmitJob(spec, "r", 0)) == 13
    assert parse_job_spec({**doc, "nodes": {}}).spec.nodes is None
    with pytest.raises(SpecError) as caught:
        parse_job_spec({**doc, "nodes": {"features": "a*2", "gpus": "a100"}})
    text = str(caught.value)
    assert "nodes.gpus: unknown field" in text and "nodes.features: counts" in text


def test_a_node_info_has_what_matching_reads() -> None:
    info = NodeInfo("n", "h:1", node().capacity, features=("x",), gpu_model="A100")
    assert NodeSelector(features="x", gpu_model="a100", names=("h",))
    assert not NodeSelector()
    assert info.features == ("x",)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(0, 8), min_size=1, max_size=6),  # each node's free GPUs
    st.sets(st.integers(0, 5), min_size=1, max_size=3),  # the nodes named
    st.integers(1, 6),  # members
    st.sampled_from([1, 2, 4]),  # GPUs each
    st.sampled_from(["", "rack", "host"]),  # topology.required
)
def test_a_gang_naming_nodes_is_placed_on_them_when_it_fits_and_fits_when_placed(
    free: list[int], named: set[int], members: int, gpus: int, required: str
) -> None:
    cl = Cluster(ClusterState(ClusterConfig(locality_wait_ms=0)))  # binds what fits now
    cl.add(*(node(f"n{i}", gpus=8, rack=f"r{i % 2}") for i in range(len(free))))
    for i, left in enumerate(free):  # take GPUs so that node i has ``left`` free
        if left < 8:
            cl.submit(_selecting(f"fill{i}", NodeSelector(names=(f"n{i}",)), gpu=8 - left))
            cl.run_pass()
    names = tuple(f"n{i}" for i in sorted(named) if i < len(free)) or ("n0",)
    spec = _selecting("w", NodeSelector(names=names), gpu=gpus, replicas=max(members, len(names)))
    spec = dataclasses.replace(spec, topology_required=required, wait_for_nodes=True)
    job_id = cl.submit(spec)
    view = View(Table.build(cl.state))
    depths = search_depths(cl.state, spec, len(cl.state.config.topology_levels))
    must = tuple((name,) for name in names)
    gang = Gang(cl.state.jobs[job_id], spec, spec.resources, spec.replicas, must=must)
    hosts = place(gang, view, depths)
    assert (hosts is not None) is fits(gang, view, depths)
    if hosts is None:
        return
    assert set(names) <= {node_id for node_id, _ in hosts}
    assert sum(count for _, count in hosts) == spec.replicas
    assert all(count * gpus <= view.nodes[node_id].gpu for node_id, count in hosts)
    cl.run_pass()  # apply accepts what the scheduler plans
    assert set(names) <= set(cl.nodes_of(job_id))


_SELECTORS = st.builds(
    NodeSelector,
    features=st.sampled_from(["", "a", "a&b", "a|c", "[a|b]", "c&[a|b]", "(a|b)&c"]),
    gpu_model=st.sampled_from(["", "a100", "h100"]),
    exclude=st.sampled_from([(), ("n0",), ("n1", "n2")]),
)


@settings(max_examples=20, deadline=None)
@given(
    st.lists(st.sets(st.sampled_from(["a", "b", "c"])), min_size=1, max_size=6),
    st.lists(st.tuples(_SELECTORS, st.integers(1, 3), st.sampled_from([2, 4, 8])), max_size=6),
)
def test_every_gang_the_scheduler_binds_runs_on_nodes_its_selector_allows(
    features: list[set[str]], gangs: list[tuple[NodeSelector, int, int]]
) -> None:
    cl = Cluster()
    for i, own in enumerate(features):
        info = node(f"n{i}", rack=f"r{i % 2}", features=tuple(sorted(own)))
        cl.add(dataclasses.replace(info, gpu_model="NVIDIA A100-SXM4" if i % 2 else "H100 PCIe"))
    for k, (selector, members, gpus) in enumerate(gangs):
        spec = _selecting(f"g{k}", selector, gpu=gpus, replicas=members, wait_for_nodes=True)
        cl.submit(spec)
    for _ in range(2):
        cl.run_pass()  # the harness asserts that apply accepts every placement
    infos = {node_id: n.info for node_id, n in cl.state.nodes.items()}
    for held in cl.state.jobs.values():
        if held.attempt is not None and held.spec.nodes is not None:
            nodes = [infos[node_id] for node_id in dict.fromkeys(cl.nodes_of(held.job_id))]
            assert placement_problem(held.spec.nodes, nodes) == ""
