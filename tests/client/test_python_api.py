"""The Python client's pieces that need no cluster: credential discovery from the
environment, state filters, line cutting, error translation, and the documented public
surface (docs/python.md) importable from ``synapse_ha.client`` alone."""

from __future__ import annotations

import re
from pathlib import Path

import grpc
import pytest

import synapse_ha.client as client_package
from synapse_ha.client import (
    AccessDenied,
    Cluster,
    ClusterUnreachable,
    CredentialsError,
    InvalidSpec,
    JobNotFound,
    JobState,
    SynapseError,
)
from synapse_ha.client.api import _state_names
from synapse_ha.client.cluster import ClusterUnavailable
from synapse_ha.client.errors import translated
from synapse_ha.client.logs import LogLines
from synapse_ha.rpc.errors import Reason, build_status
from synapse_ha.security.bundle import ClusterCredentials

DOCS = Path(__file__).resolve().parents[2] / "docs" / "python.md"


def test_every_name_the_guide_imports_is_public_and_every_public_name_is_documented() -> None:
    text = DOCS.read_text(encoding="utf-8")
    imported: set[str] = set()
    for names in re.findall(r"from synapse_ha\.client import (\([^)]*\)|[^\n]+)", text):
        imported.update(n.strip() for n in names.replace("(", "").replace(")", "").split(","))
    imported.discard("")
    assert imported, "docs/python.md imports nothing from synapse_ha.client"
    assert imported <= set(client_package.__all__), imported - set(client_package.__all__)
    undocumented = [name for name in client_package.__all__ if f"`{name}`" not in text]
    assert not undocumented, f"public but not in docs/python.md: {undocumented}"
    assert not re.search(r"synapse_ha\.client\.(api|logs|cluster|specfile)\b", text), (
        "the guide must not need a private module"
    )


def test_from_env_reads_the_cluster_the_token_and_the_tls_files(tmp_path: Path) -> None:
    creds = ClusterCredentials.ensure(tmp_path / "creds")
    tls = creds.admin_tls()
    env = {
        "SYNAPSE_CLUSTER": "10.0.0.1:7101,10.0.0.2:7101",
        "SYNAPSE_TOKEN": "syn_abc",
        "SYNAPSE_CA": str(tls.ca),
        "SYNAPSE_CERT": str(tls.cert),
        "SYNAPSE_KEY": str(tls.key),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }
    with Cluster.from_env(env) as cluster:
        assert cluster.client.addresses == ["10.0.0.1:7101", "10.0.0.2:7101"]
        assert cluster.transport.files == tls
    # A token file named by the environment wins over the token's text.
    token_file = tmp_path / "token"
    token_file.write_text("syn_from_file\n")
    with Cluster.from_env({**env, "SYNAPSE_TOKEN_FILE": str(token_file)}) as cluster:
        assert cluster.client._token == "syn_from_file"


def test_from_env_names_what_is_missing(tmp_path: Path) -> None:
    creds = ClusterCredentials.ensure(tmp_path / "creds")
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "SYNAPSE_CA": str(creds.admin_tls().ca)}
    with pytest.raises(CredentialsError, match=r"--cert \(\$SYNAPSE_CERT\), --key"):
        Cluster.from_env(env)
    with pytest.raises(ValueError, match="'nohost' is not host:port"):
        Cluster.from_env({"XDG_CONFIG_HOME": str(tmp_path / "c"), "SYNAPSE_CLUSTER": "nohost"})


def test_state_filters() -> None:
    assert _state_names(None) == ["PENDING", "SCHEDULED", "RUNNING"]
    assert _state_names("failed") == ["FAILED"]
    assert _state_names([JobState.SUCCEEDED, "cancelled"]) == ["SUCCEEDED", "CANCELLED"]
    assert _state_names("all") == []
    with pytest.raises(ValueError, match="'done' is not a job state"):
        _state_names("done")


def test_lines_are_cut_per_member_and_the_rest_is_flushed() -> None:
    lines = LogLines(attempt=2)
    lines.feed(0, b"a\nb")
    lines.feed(1, b"x\xff\n")
    lines.feed(0, b"c\n")
    lines.feed(1, b"tail")
    lines.flush(1)
    got = [(line.rank, line.attempt, line.text) for line in lines.drain()]
    assert got == [(0, 2, "a"), (1, 2, "x\ufffd"), (0, 2, "bc"), (1, 2, "tail")]
    assert str(next(iter([_line(0, "hi")]))) == "[rank 0] hi"


def _line(rank: int, text: str) -> object:
    from synapse_ha.client import LogLine

    return LogLine(rank, 1, text)


class _Failed(grpc.RpcError):
    def __init__(self, reason: Reason, message: str, **metadata: str) -> None:
        self._status = build_status(reason, message, metadata)

    def code(self) -> grpc.StatusCode:
        return self._status.code  # type: ignore[no-any-return]

    def details(self) -> str:
        return str(self._status.details)

    def trailing_metadata(self) -> tuple[tuple[str, object], ...]:
        return tuple(self._status.trailing_metadata)


@pytest.mark.parametrize(
    ("failure", "kind", "reason"),
    [
        (
            _Failed(Reason.JOB_NOT_FOUND, "no job job-9", job_id="job-9"),
            JobNotFound,
            "JOB_NOT_FOUND",
        ),
        (_Failed(Reason.PERMISSION_DENIED, "not yours"), AccessDenied, "PERMISSION_DENIED"),
        (_Failed(Reason.UNAUTHENTICATED, "no token"), AccessDenied, "UNAUTHENTICATED"),
        (
            _Failed(Reason.INVALID_FIELD, "bad", field="topology.required", rule="unknown level"),
            InvalidSpec,
            "INVALID_FIELD",
        ),
        (_Failed(Reason.CONFLICT, "finished"), SynapseError, "CONFLICT"),
        (
            ClusterUnavailable("GetJob", [("127.0.0.1:1", "UNAVAILABLE")]),
            ClusterUnreachable,
            "UNAVAILABLE",
        ),
    ],
)
def test_failures_become_typed_errors_with_the_reason(
    failure: Exception, kind: type[SynapseError], reason: str
) -> None:
    with pytest.raises(kind) as caught, translated("job-9"):
        raise failure
    assert caught.value.reason == reason
    if isinstance(caught.value, JobNotFound):
        assert caught.value.job_id == "job-9"
    if isinstance(caught.value, InvalidSpec):
        assert (caught.value.field, caught.value.rule) == ("topology.required", "unknown level")
    if isinstance(caught.value, ClusterUnreachable):
        assert caught.value.attempts == [("127.0.0.1:1", "UNAVAILABLE")]


def test_a_spec_breaking_a_rule_is_refused_before_any_call(tmp_path: Path) -> None:
    cluster = Cluster("127.0.0.1:1", timeout_s=0.5)  # nothing listens: no call may be made
    try:
        with pytest.raises(InvalidSpec) as caught:
            cluster.submit({"name": "x", "replicas": 0, "command": "true"})
        assert caught.value.field == "replicas"
        bad = tmp_path / "job.yaml"
        bad.write_text("name: x\nreplicas: 1\ncommand: echo hi\nresources:\n  memory: lots\n")
        with pytest.raises(InvalidSpec) as in_file:
            cluster.submit(bad)
        assert (in_file.value.field, in_file.value.line) == ("resources.memory", 5)
        assert f"{bad}:5: resources.memory:" in str(in_file.value)
    finally:
        cluster.close()
