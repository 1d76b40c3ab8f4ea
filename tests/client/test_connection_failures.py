"""A cluster that cannot be reached is said so at once, with the cause and what to set:
connection refused, a name that does not resolve, and the TLS mismatches (a server
certificate from another CA, a TLS server asked in plaintext, a plaintext server asked
with TLS). A replica that answers, even slowly or with NO_LEADER, is still waited for.

The replicas are in-process gRPC servers on 127.0.0.1; the clients' deadlines are long
(10 s), so a client that waited instead of failing fast fails the test by its duration."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from synapse_ha.client import Cluster, ClusterUnreachable
from synapse_ha.client.cluster import ClusterClient, ClusterUnavailable
from synapse_ha.client.unavailable import Cause
from synapse_ha.rpc.errors import Reason
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.security.bundle import ClusterCredentials
from synapse_ha.security.tls import TlsFiles, Transport
from tests.rpc.test_client_hedging import slow
from tests.rpc.test_errors import Replica, ScriptedServicer, Step, answer, fails, serve, submit

__all__ = ["serve"]

TIMEOUT_S = 10.0
FAST_S = 1.0  # "well under a second" on a loaded 2-core machine


@pytest.fixture
def closed_ports() -> Iterator[list[str]]:
    """Three loopback addresses where nothing listens (bound, not listening, held for
    the test so nobody else takes them): connecting is refused."""
    held = []
    for _ in range(3):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        held.append(s)
    try:
        yield [f"127.0.0.1:{s.getsockname()[1]}" for s in held]
    finally:
        for s in held:
            s.close()


def client(addresses: list[str], **options: object) -> ClusterClient:
    return ClusterClient(addresses, timeout_s=TIMEOUT_S, per_try_timeout_s=2.0, **options)  # type: ignore[arg-type]


def timed_failure(c: ClusterClient) -> tuple[ClusterUnavailable, float]:
    started = time.monotonic()
    with c, pytest.raises(ClusterUnavailable) as info:
        submit(c)
    return info.value, time.monotonic() - started


def test_every_replica_refusing_fails_at_once_naming_each(closed_ports: list[str]) -> None:
    error, took = timed_failure(client(closed_ports, fail_fast=True, secure=True))
    assert took < FAST_S
    assert error.fast and error.causes == dict.fromkeys(closed_ports, Cause.REFUSED)
    for address in closed_ports:
        assert f"{address}: connection refused" in str(error)
    assert "Is the cluster running? (`synctl dev up` starts a local one.)" in str(error)


def test_without_fail_fast_a_refusing_cluster_is_waited_for(closed_ports: list[str]) -> None:
    """Workers keep the old behaviour: every replica may be restarting at once."""
    started = time.monotonic()
    c = ClusterClient(closed_ports, timeout_s=0.6, per_try_timeout_s=0.3)
    with c, pytest.raises(ClusterUnavailable) as info:
        submit(c)
    assert time.monotonic() - started >= 0.6
    assert not info.value.fast
    assert "no replica answered before the deadline" in str(info.value)


def test_a_name_that_does_not_resolve_fails_at_once() -> None:
    error, took = timed_failure(client(["no-such-host.invalid:7101"], fail_fast=True))
    assert took < FAST_S
    assert error.causes == {"no-such-host.invalid:7101": Cause.UNRESOLVED}
    assert "the host name does not resolve" in str(error)


@pytest.mark.parametrize("second", ["slow", "no_leader"])
def test_a_live_replica_is_still_waited_for_when_the_others_refuse(
    serve: Callable[[list[Step]], Replica], closed_ports: list[str], second: str
) -> None:
    steps = {
        "slow": [slow(1.5, "job-slow")],
        "no_leader": [fails(Reason.NO_LEADER), fails(Reason.NO_LEADER), answer("job-slow")],
    }
    live = serve(steps[second])
    with client([*closed_ports[:2], live.address], fail_fast=True, hedge_s=None) as c:
        assert submit(c).job_id == "job-slow"


# ------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def two_cas(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[ClusterCredentials, ClusterCredentials]:
    root = tmp_path_factory.mktemp("cas")
    return ClusterCredentials.ensure(root / "ours"), ClusterCredentials.ensure(root / "theirs")


@pytest.fixture
def tls_replica(
    two_cas: tuple[ClusterCredentials, ClusterCredentials],
) -> Iterator[str]:
    """A replica of our CA, serving mutual TLS; its address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_SchedulerServiceServicer_to_server(ScriptedServicer([answer()]), server)  # type: ignore[no-untyped-call]
    port = Transport(two_cas[0].replica_tls("a")).add_port(server, "127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def over(files: TlsFiles | None, address: str) -> ClusterClient:
    transport = Transport(files)
    return client(
        [address], fail_fast=True, secure=transport.secure, channel_factory=transport.channel
    )


def test_tls_to_our_own_replica_works(
    two_cas: tuple[ClusterCredentials, ClusterCredentials], tls_replica: str
) -> None:
    with over(two_cas[0].client_tls(), tls_replica) as c:
        assert submit(c).job_id == "job-000001"


def test_a_server_certificate_from_another_ca_says_so(
    two_cas: tuple[ClusterCredentials, ClusterCredentials], tls_replica: str
) -> None:
    error, took = timed_failure(over(two_cas[1].client_tls(), tls_replica))
    assert took < FAST_S
    assert error.causes == {tls_replica: Cause.UNTRUSTED}
    assert "set SYNAPSE_CA (synctl --ca) to this cluster's CA bundle" in str(error)


def test_plaintext_to_a_tls_cluster_says_to_set_the_tls_files(tls_replica: str) -> None:
    error, took = timed_failure(over(None, tls_replica))
    assert took < FAST_S
    assert error.causes == {tls_replica: Cause.CLOSED}
    assert "the client has no TLS files: set SYNAPSE_CA, SYNAPSE_CERT, SYNAPSE_KEY" in str(error)
    assert 'eval "$(synctl dev env)"' in str(error)


def test_tls_to_a_plaintext_cluster_says_to_drop_the_tls_files(
    two_cas: tuple[ClusterCredentials, ClusterCredentials], serve: Callable[[list[Step]], Replica]
) -> None:
    plain = serve([answer()])
    error, took = timed_failure(over(two_cas[0].client_tls(), plain.address))
    assert took < FAST_S
    assert error.causes == {plain.address: Cause.PLAINTEXT_SERVER}
    assert "unset SYNAPSE_CA, SYNAPSE_CERT, SYNAPSE_KEY" in str(error)


def test_the_python_client_fails_fast_with_the_tls_hint(tls_replica: str, tmp_path: Path) -> None:
    environ = {"SYNAPSE_CLUSTER": tls_replica, "XDG_CONFIG_HOME": str(tmp_path)}
    started = time.monotonic()
    with Cluster.from_env(environ) as cluster, pytest.raises(ClusterUnreachable) as info:
        cluster.jobs()
    assert time.monotonic() - started < FAST_S
    assert "the client has no TLS files: set SYNAPSE_CA" in str(info.value)
