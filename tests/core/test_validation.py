"""The one rule set: every rule for job specs and node registrations once, as a table, and
the state machine refusing what it refuses (with typed results for submissions)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.cluster_config import DEFAULT_TOPOLOGY_LEVELS, ClusterConfig, Timeouts
from synapse_ha.core.codec.versioned import decode_result, encode_result
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, JobSpec, NodeInfo, Resources, RetryPolicy
from synapse_ha.core.spec.validation import (
    MAX_COMMAND_BYTES,
    MAX_ENV,
    MAX_GPUS_PER_NODE,
    MAX_REPLICAS,
    Violation,
    ViolationCode,
    check_cluster_config,
    check_job_spec,
    check_node_info,
    check_request_id,
    describe,
)

LEVELS = DEFAULT_TOPOLOGY_LEVELS

SPEC = JobSpec(
    name="train",
    replicas=2,
    resources=Resources(cpu_milli=1000, memory_mib=1024, gpu=8),
    command=("echo $RANK",),
)
NODE = NodeInfo(
    node_id="w1",
    address="10.0.0.1:7200",
    capacity=Resources(cpu_milli=8000, memory_mib=16384, gpu=4),
    topology=(("block", "b1"), ("rack", "r1"), ("zone", "z1")),
)


def spec(**changes: Any) -> JobSpec:
    return dataclasses.replace(SPEC, **changes)


def node(**changes: Any) -> NodeInfo:
    return dataclasses.replace(NODE, **changes)


def retries(**changes: Any) -> RetryPolicy:
    return dataclasses.replace(RetryPolicy(), **changes)


def test_a_good_spec_and_node_break_no_rule() -> None:
    assert check_job_spec(SPEC, LEVELS) == []
    assert check_node_info(NODE) == []


# One row per rule: a spec that breaks exactly that rule, and the field it names.
JOB_RULES: list[tuple[str, JobSpec, str]] = [
    ("name required", spec(name=""), "name"),
    ("name pattern", spec(name="Has_Upper"), "name"),
    ("name length", spec(name="x" * 64), "name"),
    ("replicas at least 1", spec(replicas=0), "replicas"),
    ("replicas at most the limit", spec(replicas=MAX_REPLICAS + 1), "replicas"),
    ("cpu not negative", spec(resources=Resources(-1, 0, 0)), "resources.cpu"),
    ("memory at most 1Pi", spec(resources=Resources(0, 2**31, 0)), "resources.memory"),
    ("gpu per member", spec(resources=Resources(0, 0, MAX_GPUS_PER_NODE + 1)), "resources.gpu"),
    ("gpu not negative", spec(resources=Resources(0, 0, -1)), "resources.gpu"),
    ("command not empty", spec(command=()), "command"),
    ("command parts not empty", spec(command=("python", ""), shell=False), "command"),
    ("shell command is one string", spec(command=("a", "b"), shell=True), "command"),
    ("command size", spec(command=("x" * (MAX_COMMAND_BYTES + 1),)), "command"),
    ("env count", spec(env=tuple((f"V{i}", "") for i in range(MAX_ENV + 1))), "env"),
    ("env name pattern", spec(env=(("1BAD", "x"),)), "env.1BAD"),
    ("env name once", spec(env=(("A", "1"), ("A", "2"))), "env.A"),
    ("workdir absolute", spec(workdir="relative/dir"), "workdir"),
    ("workdir length", spec(workdir="/" + "x" * 5000), "workdir"),
    ("image without spaces", spec(image="two words"), "image"),
    ("priority range", spec(priority=1_000_001), "priority"),
    ("required level known", spec(topology_required="galaxy"), "topology.required"),
    ("preferred level known", spec(topology_preferred="galaxy"), "topology.preferred"),
    ("time limit not negative", spec(time_limit_ms=-1), "time_limit"),
    ("time limit at most 366d", spec(time_limit_ms=367 * 86_400_000), "time_limit"),
    ("retries not negative", spec(retries=retries(max_retries=-1)), "retries.max"),
    ("retries at most 1000", spec(retries=retries(max_retries=1001)), "retries.max"),
    ("backoff not negative", spec(retries=retries(backoff_ms=-1)), "retries.backoff"),
    (
        "max backoff >= backoff",
        spec(retries=retries(backoff_ms=5000, max_backoff_ms=10)),
        "retries.max_backoff",
    ),
]


@pytest.mark.parametrize(("rule", "bad", "field"), JOB_RULES, ids=[r[0] for r in JOB_RULES])
def test_each_job_rule(rule: str, bad: JobSpec, field: str) -> None:
    violations = check_job_spec(bad, LEVELS)
    assert [v.field for v in violations] == [field], violations
    expected = ViolationCode.REQUIRED if rule == "name required" else ViolationCode.INVALID_FIELD
    assert violations[0].code is expected
    assert violations[0].rule


NODE_RULES: list[tuple[str, NodeInfo, str]] = [
    ("node id pattern", node(node_id="has space"), "node_id"),
    ("node id length", node(node_id="n" * 129), "node_id"),
    ("address not empty", node(address=""), "address"),
    ("address without spaces", node(address="a b:1"), "address"),
    ("port in range", node(address="h:99999"), "address"),
    ("port after a host", node(address=":80"), "address"),
    ("port not empty", node(address="h:"), "address"),
    ("capacity not negative", node(capacity=Resources(-1, 0, 0)), "capacity.cpu"),
    ("gpus per node", node(capacity=Resources(0, 0, MAX_GPUS_PER_NODE + 1)), "capacity.gpu"),
    ("islands cover every gpu", node(gpu_islands=((0, 1), (2,))), "gpu_islands"),
    ("islands hold a gpu once", node(gpu_islands=((0, 1), (1, 2, 3))), "gpu_islands"),
    ("a level once", node(topology=(("rack", "r1"), ("rack", "r2"))), "topology"),
]


@pytest.mark.parametrize(("rule", "bad", "field"), NODE_RULES, ids=[r[0] for r in NODE_RULES])
def test_each_node_rule(rule: str, bad: NodeInfo, field: str) -> None:
    violations = check_node_info(bad)
    assert [v.field for v in violations] == [field], violations
    assert violations[0].code is ViolationCode.INVALID_FIELD


@pytest.mark.parametrize("address", ["10.0.0.1", "w1.example:7200", "[::1]:7200", "h:1"])
def test_an_address_is_a_host_with_an_optional_port(address: str) -> None:
    assert check_node_info(node(address=address)) == []


def test_every_broken_rule_is_reported_in_field_order() -> None:
    bad = spec(name="", replicas=0, workdir="rel", retries=retries(max_retries=-1))
    assert [v.field for v in check_job_spec(bad, LEVELS)] == [
        "name",
        "replicas",
        "workdir",
        "retries.max",
    ]
    assert describe(check_job_spec(spec(replicas=0), LEVELS)).startswith("replicas: ")


def test_topology_levels_are_the_clusters_and_host_is_always_one() -> None:
    assert check_job_spec(spec(topology_required="host"), LEVELS) == []
    assert check_job_spec(spec(topology_required="host"), (*LEVELS, "host")) == []
    assert check_job_spec(spec(topology_required="pod"), ("pod",)) == []
    # Unknown levels (a client of a cluster with its own): any well-formed name passes.
    assert check_job_spec(spec(topology_required="pod"), None) == []
    (bad,) = check_job_spec(spec(topology_preferred="two words"), None)
    assert bad.field == "topology.preferred"


def test_request_ids() -> None:
    assert check_request_id("") == []
    assert check_request_id("6f1c-run:7") == []
    assert [v.field for v in check_request_id("has space")] == ["request_id"]
    assert [v.field for v in check_request_id("x" * 129)] == ["request_id"]


def test_a_violation_is_a_value() -> None:
    v = Violation(ViolationCode.INVALID_FIELD, "resources.memory", "must be between 0 and 1Pi")
    assert str(v) == "resources.memory: must be between 0 and 1Pi"
    assert v == Violation(
        ViolationCode.INVALID_FIELD, "resources.memory", "must be between 0 and 1Pi"
    )


# ----------------------------------------------------------------- the state machine


def test_the_state_machine_refuses_what_the_rules_refuse() -> None:
    state = ClusterState()
    refused = apply(state, c.SubmitJob(spec(workdir="relative"), "r1", now_ms=1))
    assert refused.code is c.ResultCode.INVALID
    assert refused.message.startswith("workdir: ")
    assert not refused.created and not state.jobs
    bad_node = apply(state, c.RegisterNode(node(address="h:0"), now_ms=1))
    assert bad_node.code is c.ResultCode.INVALID
    assert bad_node.message.startswith("address: ")
    assert not state.nodes


def test_a_submission_says_whether_it_created_the_job() -> None:
    state = ClusterState()
    first = apply(state, c.SubmitJob(SPEC, "req-1", now_ms=1))
    again = apply(state, c.SubmitJob(SPEC, "req-1", now_ms=2))
    assert first.ok and first.created
    assert again.ok and not again.created
    assert again.job_id == first.job_id
    assert decode_result(encode_result(first)) == first
    assert decode_result(encode_result(again)).created is False


def test_a_node_without_nvlink_islands_gets_one_island_per_gpu() -> None:
    state = ClusterState()
    assert apply(state, c.RegisterNode(node(gpu_islands=()), now_ms=1)).ok
    assert state.nodes["w1"].info.gpu_islands == ((0,), (1,), (2,), (3,))
    declared = node(node_id="w2", gpu_islands=((2, 3), (0, 1)))
    assert apply(state, c.RegisterNode(declared, now_ms=2)).ok
    assert state.nodes["w2"].info.gpu_islands == ((0, 1), (2, 3))


def test_the_cluster_configuration_rules_name_each_field_they_refuse() -> None:
    assert check_cluster_config(ClusterConfig()) == []
    broken = ClusterConfig(
        timeouts=Timeouts(heartbeat_interval_ms=1_000, lease_ttl_ms=1_000, dead_timeout_ms=3_000),
        topology_levels=("rack", "rack"),
        retention_ms=-1,
        master_port_base=80,
        max_requeues=-1,
        fair_share_half_life_ms=0,
    )
    fields = [v.field for v in check_cluster_config(broken)]
    assert fields == [
        "timeouts.lease_ttl_ms",
        "timeouts.dead_timeout_ms",
        "topology_levels",
        "retention_ms",
        "master_port_base",
        "max_requeues",
        "fair_share_half_life_ms",
    ]
    # The state machine refuses the same configuration with the same words.
    result = apply(ClusterState(), c.Configure(broken, 1))
    assert not result.ok
    assert result.message == describe(check_cluster_config(broken))
