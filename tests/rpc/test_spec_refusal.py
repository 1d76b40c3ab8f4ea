"""The cluster's refusal of a job spec carries every rule it breaks, and synctl and the
Python client show them all at their lines of the file, in line order (an in-process
replica with the auth interceptor, tests/rpc/authed.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from synapse_ha.cli.defaults import ExitCode
from synapse_ha.cli.main import cli
from synapse_ha.client import Cluster, InvalidSpec
from synapse_ha.rpc.errors import ErrorReason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.rpc.authed import Replica, serving_replica
from tests.rpc.test_access import credentials

# Well formed, so the client sends it; the cluster's topology levels are its own, and
# these name none of them (the preferred level is on the earlier line).
SPEC = """\
name: train
replicas: 2
command: python train.py
topology:
  preferred: hots
  required: rak
"""
EXPECTED = [
    (
        5,
        "topology.preferred",
        "'hots' is not a topology level, did you mean `host`? (zone, block, rack, host)",
    ),
    (
        6,
        "topology.required",
        "'rak' is not a topology level, did you mean `rack`? (zone, block, rack, host)",
    ),
]


@pytest.fixture
def replica() -> Iterator[Replica]:
    with serving_replica() as started:
        yield started


def test_a_refused_spec_carries_every_rule_it_breaks(replica: Replica) -> None:
    spec = pb.JobSpec(
        name="Bad Name",
        replicas=-1,
        resources=pb.Resources(gpu=2),
        shell_command="true",
        topology_required="rak",
        time_limit_ms=400 * 24 * 3600 * 1000,
    )
    with pytest.raises(grpc.RpcError) as caught:
        replica.scheduler.SubmitJob(
            pb.SubmitJobRequest(spec=spec, request_id="r-1"),
            metadata=credentials(replica, "alice"),
            timeout=10,
        )
    failure = failure_of(caught.value)
    assert failure.code is grpc.StatusCode.INVALID_ARGUMENT
    assert failure.reason is ErrorReason.INVALID_FIELD
    assert [v.field for v in failure.violations] == [
        "name",
        "replicas",
        "topology.required",
        "time_limit",
    ]
    assert "did you mean `rack`?" in failure.violations[2].rule
    for violation in failure.violations:
        assert str(violation) in failure.message


def test_the_python_client_shows_every_rule_the_cluster_refused_at_its_line(
    replica: Replica, tmp_path: Path
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(SPEC)
    with (
        Cluster(replica.address, token=replica.tokens["alice"]) as cluster,
        pytest.raises(InvalidSpec) as caught,
    ):
        cluster.submit(path)
    assert [(line, field, rule) for line, field, rule in caught.value.problems] == EXPECTED
    assert str(caught.value).splitlines()[1] == f"{path}:6: topology.required: {EXPECTED[1][2]}"


def test_synctl_shows_every_rule_the_cluster_refused_in_line_order(
    replica: Replica, tmp_path: Path
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(SPEC)
    token = tmp_path / "token"
    token.write_text(replica.tokens["alice"])
    args = ["--cluster", replica.address, "--token-file", str(token), "submit", str(path)]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == ExitCode.USAGE, result.output
    assert result.stderr.splitlines() == [
        "error: invalid job spec, 2 problems:",
        *(
            f"  {path}:{line}: {field}: {rule} (the cluster's rule)"
            for line, field, rule in EXPECTED
        ),
    ]
