"""Who may read logs from a worker and nudge it: the worker's LogAccess policy behind a
real WorkerService on 127.0.0.1, over mutual TLS and over plaintext."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from synapse_ha.core.identity.access import replica, worker
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2 as wpb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2_grpc as wpb_grpc
from synapse_ha.security.grants import GRANT_METADATA_KEY, GrantClaims, sign_grant
from synapse_ha.security.pki import CertFiles
from synapse_ha.security.tls import TlsFiles, Transport
from synapse_ha.worker.logs import LogAccess, add_worker_service
from tests.security.conftest import SERVER_HOSTS, Authority

NODE = "n1"
JOB = "job-7"
NOW_S = 1_800_000_000.0


class FakeClock:
    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


class Nudges:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, node_id: str) -> bool:
        self.seen.append(node_id)
        return node_id == NODE


@pytest.fixture
def members_root(tmp_path: Path) -> Path:
    """One finished member of JOB with a two-line log."""
    member = tmp_path / "members" / JOB / "a1.t1.r0"
    member.mkdir(parents=True)
    (member / "output.log").write_bytes(b"hello\nworld\n")
    (member / "exit.json").write_text(json.dumps({"code": 0}))
    return tmp_path / "members"


@contextmanager
def worker_service(
    transport: Transport, members_root: Path, access: LogAccess, nudges: Nudges
) -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    add_worker_service(server, members_root, nudges, access)
    port = transport.add_port(server, "127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None).wait(5)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW_S)


@pytest.fixture
def nudges() -> Nudges:
    return Nudges()


@pytest.fixture
def secure_worker(
    cluster_ca: Authority, members_root: Path, clock: FakeClock, nudges: Nudges
) -> Iterator[str]:
    """A worker serving mutual TLS, checking grants against its own CA file."""
    transport = cluster_ca.transport(worker(NODE), hosts=SERVER_HOSTS)
    access = LogAccess.for_transport(transport, NODE, clock)
    with worker_service(transport, members_root, access, nudges) as address:
        yield address


def grant_for(files: CertFiles, job_id: str = JOB, node_id: str = NODE, ttl_s: float = 60) -> str:
    claims = GrantClaims(job_id, "user:alice", NOW_S + ttl_s, node_id)
    return sign_grant(claims, key_pem=files.key.read_bytes(), cert_pem=files.cert.read_bytes())


def read_log(address: str, client: Transport, grant: str | None = None, job_id: str = JOB) -> bytes:
    metadata = [(GRANT_METADATA_KEY, grant)] if grant is not None else []
    with client.channel(address, worker=NODE) as channel:
        stub = wpb_grpc.WorkerServiceStub(channel)  # type: ignore[no-untyped-call]
        chunks = stub.ReadLog(wpb.ReadLogRequest(job_id=job_id), timeout=10, metadata=metadata)
        return b"".join(c.data for c in chunks)


def read_refused(
    address: str, client: Transport, grant: str | None = None, job_id: str = JOB
) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        read_log(address, client, grant, job_id)
    return err.value.code(), err.value.details()


def nudge(address: str, client: Transport) -> bool:
    with client.channel(address, worker=NODE) as channel:
        stub = wpb_grpc.WorkerServiceStub(channel)  # type: ignore[no-untyped-call]
        response: wpb.NudgeResponse = stub.Nudge(wpb.NudgeRequest(node_id=NODE), timeout=10)
        return response.accepted


def nudge_refused(address: str, client: Transport) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        nudge(address, client)
    code: grpc.StatusCode = err.value.code()
    return code


def test_a_replica_may_read_logs_and_nudge(
    secure_worker: str, server_files: CertFiles, nudges: Nudges
) -> None:
    as_replica = Transport(TlsFiles.from_cert_files(server_files))
    assert read_log(secure_worker, as_replica) == b"hello\nworld\n"
    assert nudge(secure_worker, as_replica)
    assert nudges.seen == [NODE]


def test_a_grant_for_the_job_lets_a_user_read_its_logs(
    secure_worker: str, server_files: CertFiles, alice: CertFiles
) -> None:
    as_alice = Transport(TlsFiles.from_cert_files(alice))
    assert read_log(secure_worker, as_alice, grant_for(server_files)) == b"hello\nworld\n"
    assert read_log(secure_worker, as_alice, grant_for(server_files, node_id="")) != b""


def test_a_user_without_a_grant_is_denied(secure_worker: str, alice: CertFiles) -> None:
    code, details = read_refused(secure_worker, Transport(TlsFiles.from_cert_files(alice)))
    assert code is grpc.StatusCode.PERMISSION_DENIED
    assert "user:alice may not read logs without a grant" in details


def test_grants_for_another_job_or_node_are_denied(
    secure_worker: str, server_files: CertFiles, alice: CertFiles
) -> None:
    as_alice = Transport(TlsFiles.from_cert_files(alice))
    other_job = grant_for(server_files, job_id="job-8")
    assert read_refused(secure_worker, as_alice, other_job)[0] is grpc.StatusCode.PERMISSION_DENIED
    # The grant does allow its own job, which this worker has no log of.
    assert read_refused(secure_worker, as_alice, other_job, "job-8")[0] is grpc.StatusCode.NOT_FOUND
    other_node = grant_for(server_files, node_id="n2")
    assert read_refused(secure_worker, as_alice, other_node)[0] is grpc.StatusCode.PERMISSION_DENIED


def test_expired_and_forged_grants_do_not_authenticate(
    secure_worker: str,
    server_files: CertFiles,
    node_n1: CertFiles,
    alice: CertFiles,
    clock: FakeClock,
) -> None:
    as_alice = Transport(TlsFiles.from_cert_files(alice))
    grant = grant_for(server_files, ttl_s=30)
    clock.now_s = NOW_S + 30
    code, details = read_refused(secure_worker, as_alice, grant)
    assert (code, "EXPIRED" in details) == (grpc.StatusCode.UNAUTHENTICATED, True)
    clock.now_s = NOW_S
    signed_by_a_worker = grant_for(node_n1)
    code, details = read_refused(secure_worker, as_alice, signed_by_a_worker)
    assert (code, "UNTRUSTED_SIGNER" in details) == (grpc.StatusCode.UNAUTHENTICATED, True)


def test_only_a_replica_may_nudge(
    secure_worker: str,
    alice: CertFiles,
    node_n1: CertFiles,
    server_files: CertFiles,
    nudges: Nudges,
) -> None:
    as_alice = Transport(TlsFiles.from_cert_files(alice))
    assert nudge_refused(secure_worker, as_alice) is grpc.StatusCode.PERMISSION_DENIED
    as_worker = Transport(TlsFiles.from_cert_files(node_n1))
    assert nudge_refused(secure_worker, as_worker) is grpc.StatusCode.PERMISSION_DENIED
    assert nudges.seen == []


def test_without_any_credential_the_caller_is_unauthenticated(
    cluster_ca: Authority, members_root: Path, clock: FakeClock, nudges: Nudges
) -> None:
    # A plaintext port in front of a policy that has a CA: callers carry no certificate.
    access = LogAccess(cluster_ca.ca_pem, NODE, clock)
    with worker_service(Transport.insecure(), members_root, access, nudges) as address:
        code, details = read_refused(address, Transport.insecure())
        assert code is grpc.StatusCode.UNAUTHENTICATED
        assert "neither" in details
        assert nudge_refused(address, Transport.insecure()) is grpc.StatusCode.UNAUTHENTICATED
    assert nudges.seen == []


def test_insecure_mode_allows_everything(
    members_root: Path, clock: FakeClock, nudges: Nudges
) -> None:
    access = LogAccess(None, NODE, clock)
    with worker_service(Transport.insecure(), members_root, access, nudges) as address:
        assert read_log(address, Transport.insecure()) == b"hello\nworld\n"
        assert nudge(address, Transport.insecure())
    assert nudges.seen == [NODE]


def test_a_rotated_ca_bundle_applies_to_grants_at_once(
    tmp_path: Path,
    cluster_ca: Authority,
    other_ca: Authority,
    members_root: Path,
    clock: FakeClock,
    nudges: Nudges,
    server_files: CertFiles,
) -> None:
    issued = cluster_ca.issue(worker(NODE), hosts=SERVER_HOSTS)
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(cluster_ca.ca_pem)
    transport = Transport(TlsFiles(ca=bundle, cert=issued.cert, key=issued.key))
    access = LogAccess.for_transport(transport, NODE, clock)
    new_replica = other_ca.issue(replica("r9"))
    # Checked in process through the policy: the caller needs no TLS for this.
    context = _Context([(GRANT_METADATA_KEY, grant_for(new_replica))])
    refusal = access.check_read(context, JOB)  # type: ignore[arg-type]
    assert refusal is not None and refusal.code is grpc.StatusCode.UNAUTHENTICATED
    staged = tmp_path / "bundle.new"
    staged.write_bytes(cluster_ca.ca_pem + other_ca.ca_pem)
    staged.replace(bundle)
    assert access.check_read(context, JOB) is None  # type: ignore[arg-type]
    old_grant = _Context([(GRANT_METADATA_KEY, grant_for(server_files))])
    assert access.check_read(old_grant, JOB) is None  # type: ignore[arg-type]


class _Context:
    """The two ServicerContext methods the policy reads, for a caller without TLS."""

    def __init__(self, metadata: list[tuple[str, str]]) -> None:
        self.metadata = metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.metadata
