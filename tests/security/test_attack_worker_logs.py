"""Attacks on a worker's log service by users holding genuine grants for their own jobs:
taking every thread with follow streams (``synctl logs -f``), and reading another file
through the log of their own member (a link planted in the member's directory, which
the member can write). The real WorkerService, its LogAccess policy and the replicas'
grants, over mutual TLS on 127.0.0.1; the service runs on the worker's thread pool."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from synapse_ha.core.identity.access import replica, worker
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2 as wpb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2_grpc as wpb_grpc
from synapse_ha.security.grants import GRANT_METADATA_KEY, GrantClaims, sign_grant
from synapse_ha.security.pki import CertFiles
from synapse_ha.worker.logs import (
    FOLLOWS_PER_IDENTITY,
    FOLLOWS_TOTAL,
    LOG_SERVICE_THREADS,
    LogAccess,
    add_worker_service,
    new_worker_server,
)
from tests.security.conftest import SERVER_HOSTS, Authority

NODE = "n1"
SECRET = b"root-only: the worker's private key"


class Node:
    """A worker's log service with one running member per job id in ``jobs`` (a member
    that has not exited, so a follow stream stays open)."""

    def __init__(self, root: Path, authority: Authority) -> None:
        self.members = root / "members"
        self.authority = authority
        self.signer: CertFiles = authority.issue(replica("r1"))
        self.client = authority.transport(worker("w-client"))  # any certificate of the CA
        transport = authority.transport(worker(NODE), hosts=SERVER_HOSTS)
        self.server = new_worker_server()  # the threads a worker's program serves with
        add_worker_service(
            self.server, self.members, lambda _: True, LogAccess.for_transport(transport, NODE)
        )
        self.address = f"127.0.0.1:{transport.add_port(self.server, '127.0.0.1:0')}"
        self.server.start()
        self.calls: list[grpc.Future] = []

    def member(self, job_id: str, output: bytes = b"step 1\n") -> Path:
        directory = self.members / job_id / "a1.t1.r0"
        directory.mkdir(parents=True)
        (directory / "output.log").write_bytes(output)
        return directory

    def grant(self, job_id: str, user: str) -> str:
        claims = GrantClaims(job_id, f"user:{user}", 4_102_444_800.0, NODE)  # year 2100
        return sign_grant(
            claims, key_pem=self.signer.key.read_bytes(), cert_pem=self.signer.cert.read_bytes()
        )

    def stub(self) -> wpb_grpc.WorkerServiceStub:
        channel = self.client.channel(self.address, worker=NODE)
        return wpb_grpc.WorkerServiceStub(channel)  # type: ignore[no-untyped-call]

    def follow(self, job_id: str, user: str) -> grpc.StatusCode | bytes:
        """Open a follow stream as ``user`` and read its first chunk (kept open), or the
        status it was refused with."""
        call = self.stub().ReadLog(
            wpb.ReadLogRequest(job_id=job_id, follow=True),
            metadata=[(GRANT_METADATA_KEY, self.grant(job_id, user))],
            timeout=60,
        )
        self.calls.append(call)
        try:
            return bytes(next(iter(call)).data)
        except grpc.RpcError as exc:
            return exc.code()

    def read(self, job_id: str, user: str) -> grpc.StatusCode | bytes:
        try:
            chunks = self.stub().ReadLog(
                wpb.ReadLogRequest(job_id=job_id),
                metadata=[(GRANT_METADATA_KEY, self.grant(job_id, user))],
                timeout=10,
            )
            return b"".join(c.data for c in chunks)
        except grpc.RpcError as exc:
            return exc.code()

    def nudged(self) -> bool:
        replica_client = self.authority.transport(replica("r2"))
        with replica_client.channel(self.address, worker=NODE) as channel:
            stub = wpb_grpc.WorkerServiceStub(channel)  # type: ignore[no-untyped-call]
            answer = stub.Nudge(wpb.NudgeRequest(node_id=NODE), timeout=10)
        return bool(answer.accepted)

    def close(self) -> None:
        for call in self.calls:
            call.cancel()
        self.server.stop(grace=None).wait(10)


@pytest.fixture
def node(tmp_path: Path, cluster_ca: Authority) -> Iterator[Node]:
    started = Node(tmp_path, cluster_ca)
    try:
        yield started
    finally:
        started.close()


def test_one_user_cannot_take_the_log_service_with_follow_streams(node: Node) -> None:
    node.member("job-a", b"alice's output\n")
    node.member("job-b", b"bob's output\n")
    held = [node.follow("job-a", "alice") for _ in range(FOLLOWS_PER_IDENTITY)]
    assert held == [b"alice's output\n"] * FOLLOWS_PER_IDENTITY
    # One more of alice's own job is refused; everyone else is still served.
    assert node.follow("job-a", "alice") is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert node.follow("job-b", "bob") == b"bob's output\n"
    assert node.read("job-a", "alice") == b"alice's output\n"  # reading without following
    assert node.nudged()


def test_many_users_cannot_take_every_thread_from_reads_and_nudges(node: Node) -> None:
    users = [f"user{i}" for i in range(FOLLOWS_TOTAL // FOLLOWS_PER_IDENTITY + 1)]
    for user in users:
        node.member(f"job-{user}")
    opened = [
        node.follow(f"job-{user}", user) for user in users for _ in range(FOLLOWS_PER_IDENTITY)
    ]
    assert opened.count(b"step 1\n") == FOLLOWS_TOTAL < LOG_SERVICE_THREADS
    assert set(opened) == {b"step 1\n", grpc.StatusCode.RESOURCE_EXHAUSTED}
    # Every follow stream the service allows is open: reads and nudges still find threads.
    replies: list[object] = []

    def read() -> None:
        replies.append(node.read(f"job-{users[0]}", users[0]))

    readers = [threading.Thread(target=read) for _ in range(4)]
    for r in readers:
        r.start()
    for r in readers:
        r.join(30)
    assert replies == [b"step 1\n"] * 4
    assert node.nudged()


def _root_only_file(tmp_path: Path) -> Path:
    secret = tmp_path / "worker.key"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    return secret


def test_a_link_in_the_members_directory_is_not_followed(node: Node, tmp_path: Path) -> None:
    """The member (its owner may write its own directory) replaces its output.log by a
    symbolic link to a file only root may read: its owner's grant reads nothing."""
    directory = node.member("job-a")
    secret = _root_only_file(tmp_path)
    (directory / "output.log").unlink()
    (directory / "output.log").symlink_to(secret)
    assert node.read("job-a", "alice") is grpc.StatusCode.PERMISSION_DENIED
    assert node.follow("job-a", "alice") is grpc.StatusCode.PERMISSION_DENIED
    assert secret.read_bytes() == SECRET  # nothing changed


def test_a_hard_link_to_another_file_is_not_read(node: Node, tmp_path: Path) -> None:
    directory = node.member("job-a")
    secret = _root_only_file(tmp_path)
    (directory / "output.log").unlink()
    os.link(secret, directory / "output.log")
    assert node.read("job-a", "alice") is grpc.StatusCode.PERMISSION_DENIED
    # A member's own log, written as before, reads as ever.
    node.member("job-b", b"ok\n")
    assert node.read("job-b", "bob") == b"ok\n"


def test_the_log_of_a_finished_member_ends(node: Node) -> None:
    directory = node.member("job-a", b"done\n")
    (directory / "exit.json").write_text(json.dumps({"code": 0}))
    assert node.read("job-a", "alice") == b"done\n"
