"""``synctl nodes`` and ``synctl nodes repair`` on a real cluster: a test node registered
by hand reports unhealthy GPUs in its heartbeat (as an admin, on the NodeAgentService, as
a worker would), the table and JSON show them, and repairs clear them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from synapse_ha.cli.defaults import ExitCode
from synapse_ha.cli.main import cli
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.cli.conftest import Synctl
from tests.integration.cluster import wait_for

SICK = "w-sick"
FAULTS = [
    pb.GpuFault(gpu=3, code="xid-79", detail="Xid 79: GPU has fallen off the bus"),
    pb.GpuFault(gpu=5, code="ecc-dbe", detail="uncorrectable ECC error"),
]


def faults_of(synctl: Synctl, node_id: str) -> list[tuple[int, str]]:
    node = next(n for n in synctl.client.list_nodes() if n.node_id == node_id)
    return [(f.gpu, f.code) for f in node.gpu_faults]


def beat(synctl: Synctl, faults: list[pb.GpuFault] | None = None) -> None:
    """One heartbeat of the test node (it keeps the node from being declared dead)."""
    synctl.client.heartbeat(pb.HeartbeatRequest(node_id=SICK, gpu_faults=faults or []))


@pytest.fixture
def sick(synctl: Synctl) -> Iterator[Synctl]:
    """The test node, registered with 8 GPUs (no CPU or memory to speak of: no member
    lands on it) and GPUs 3 and 5 reported unhealthy; repaired again afterwards."""
    synctl.client.register_node(
        pb.RegisterNodeRequest(
            node_id=SICK,
            address="127.0.0.1:9",
            capacity=pb.Resources(cpu_milli=1, memory_mib=1, gpu=8),
            topology=[pb.TopologyLabel(level="rack", value="r9")],
        )
    )
    beat(synctl, FAULTS)
    wait_for("faults recorded", lambda: faults_of(synctl, SICK) == [(3, "xid-79"), (5, "ecc-dbe")])
    yield synctl
    beat(synctl)
    synctl.client.repair_gpus(SICK)


def test_nodes_show_the_unhealthy_gpus(sick: Synctl) -> None:
    beat(sick)  # a heartbeat without faults clears nothing
    table = sick("nodes")
    assert table.exit_code == 0, table.output
    header, *rows = table.stdout.splitlines()
    assert "UNHEALTHY" in header.split() and "UNFIT" in header.split()
    row = next(r for r in rows if r.startswith(SICK + " "))
    assert "3:xid-79,5:ecc-dbe" in row.split()
    assert "6/8" in row.split()  # free: 8 less the 2 unhealthy
    healthy = next(r for r in rows if r.startswith("w1 "))
    assert "8/8" in healthy.split()

    as_json = sick("nodes", "-o", "json")
    assert as_json.exit_code == 0, as_json.output
    node = next(n for n in json.loads(as_json.stdout)["nodes"] if n["id"] == SICK)
    assert [(f["gpu"], f["code"], f["detail"]) for f in node["gpu_faults"]] == [
        (3, "xid-79", "Xid 79: GPU has fallen off the bus"),
        (5, "ecc-dbe", "uncorrectable ECC error"),
    ]
    assert all(f["since_ms"] > 0 for f in node["gpu_faults"])
    assert node["unfit"] == []
    assert node["free_gpus"] == 6


def test_repair_one_gpu_then_the_rest(sick: Synctl) -> None:
    beat(sick)
    one = sick("nodes", "repair", SICK, "--gpu", "3")
    assert one.exit_code == 0, one.output
    lines = one.stdout.splitlines()
    assert lines[0] == f"node {SICK}: GPU 3 xid-79 repaired"
    assert lines[1].startswith("still unhealthy: GPU 5 ecc-dbe (uncorrectable ECC error) since ")
    assert len(lines) == 2
    assert faults_of(sick, SICK) == [(5, "ecc-dbe")]

    beat(sick)
    again = sick("nodes", "repair", SICK, "--gpu", "3", "-o", "json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["message"] == f"node {SICK}: nothing to repair"

    rest = sick("-o", "json", "nodes", "repair", SICK)
    assert rest.exit_code == 0, rest.output
    assert json.loads(rest.stdout) == {
        "id": SICK,
        "message": f"node {SICK}: GPU 5 ecc-dbe repaired",
        "gpu_faults": [],
    }
    assert faults_of(sick, SICK) == []
    listed = sick("nodes")
    row = next(r for r in listed.stdout.splitlines() if r.startswith(SICK + " "))
    assert "8/8" in row.split()


@pytest.mark.parametrize(
    ("args", "code", "reason"),
    [
        (("no-such-node",), ExitCode.NOT_FOUND, "NODE_NOT_FOUND"),
        ((SICK, "--gpu", "8"), ExitCode.USAGE, "INVALID_FIELD"),
    ],
)
def test_repair_errors_map_to_exit_codes(
    sick: Synctl, args: tuple[str, ...], code: ExitCode, reason: str
) -> None:
    beat(sick)
    result = sick("-o", "json", "nodes", "repair", *args)
    assert result.exit_code == code, result.output
    assert json.loads(result.stderr)["error"]["code"] == reason
    assert faults_of(sick, SICK) == [(3, "xid-79"), (5, "ecc-dbe")]


def test_a_negative_gpu_is_a_usage_error_before_any_call(synctl: Synctl) -> None:
    result = synctl("nodes", "repair", "w1", "--gpu", "-1")
    assert result.exit_code == ExitCode.USAGE
    assert "--gpu" in result.stderr


def test_a_user_may_not_repair(sick: Synctl, tmp_path: Path) -> None:
    made = sick("token", "create", "--user", "mallory")
    assert made.exit_code == 0, made.output
    token_file = tmp_path / "mallory.token"
    token_file.write_text(made.stdout.strip() + "\n")
    env = {**sick.admin_env, "SYNAPSE_TOKEN_FILE": str(token_file)}
    beat(sick)
    result = sick("nodes", "repair", SICK, env=env)
    assert result.exit_code == ExitCode.DENIED, result.output
    assert faults_of(sick, SICK) == [(3, "xid-79"), (5, "ecc-dbe")]


def test_repair_completes_node_ids(synctl: Synctl) -> None:
    result = CliRunner().invoke(
        cli,
        [],
        prog_name="synctl",
        env={
            **synctl.admin_env,
            "XDG_CONFIG_HOME": "/nonexistent",
            "_SYNCTL_COMPLETE": "bash_complete",
            "COMP_WORDS": f"synctl --cluster {synctl.addresses} nodes repair w",
            "COMP_CWORD": "5",
        },
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    completed = {line.split(",", 1)[1] for line in result.stdout.splitlines() if "," in line}
    assert {"w1", "w2"} <= completed


def test_events_show_the_faults_and_the_repair(sick: Synctl) -> None:
    beat(sick)
    assert sick("nodes", "repair", SICK, "--gpu", "5").exit_code == 0

    def health_events() -> list[tuple[str, str]] | None:
        listed = sick("events", "-o", "json")
        assert listed.exit_code == 0, listed.output
        found = [
            (e["kind"], e.get("detail", ""))
            for e in json.loads(listed.stdout)["events"]
            if e.get("node_id") == SICK and e["kind"] in ("gpu_unhealthy", "gpu_repaired")
        ]
        return found if found and found[-1][0] == "gpu_repaired" else None

    found = wait_for("the repair among the events", health_events, timeout_s=10)
    assert found[-2:] == [
        (
            "gpu_unhealthy",
            "GPU 3 xid-79 (Xid 79: GPU has fallen off the bus), "
            "GPU 5 ecc-dbe (uncorrectable ECC error)",
        ),
        ("gpu_repaired", "GPU 5 ecc-dbe repaired"),
    ]
    table = sick("events")
    line = [r for r in table.stdout.splitlines() if " gpu_repaired " in r][-1]
    assert line.split()[-5:] == [SICK, "GPU", "5", "ecc-dbe", "repaired"]
