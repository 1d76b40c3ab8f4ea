"""The Raft channel over mutual TLS (synapse_ha.raft.tls_transport): replicas commit and
fail over on it; peers that are not replicas of the cluster are refused before a message
is read; a log entry whose pickle imports or calls is refused and nothing is applied;
malformed frames close only their own connection. Replicas and peers on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synapse_ha.core.identity.access import replica, worker
from synapse_ha.local.ports import reserve_ports
from synapse_ha.local.waiting import wait_until
from synapse_ha.raft import wire
from synapse_ha.raft.replica import RaftReplica, RaftTiming
from synapse_ha.raft.tls_transport import RefusalLog, TlsTransport
from synapse_ha.security.pki import REPLICA_SERVER_NAME, CertFiles
from synapse_ha.security.tls import TlsFiles
from tests.security.conftest import Authority

REPO = Path(__file__).resolve().parents[2]
# Nobody stands for election on their own in these tests: terms move only by the
# messages a test sends.
QUIET = RaftTiming(election_min_s=600.0, election_max_s=1200.0)
VOTE_TERM = 7


# ------------------------------------------------------------ three processes


@contextmanager
def _members(tmp_path: Path, cluster_ca: Authority) -> Iterator[list[tuple[Any, Path]]]:
    addresses = [f"127.0.0.1:{p}" for p in reserve_ports(3)]
    started: list[tuple[subprocess.Popen[str], Path]] = []
    try:
        for i, address in enumerate(addresses):
            certs = cluster_ca.issue(replica(f"r{i}"))
            data = tmp_path / f"r{i}"
            data.mkdir()
            status = tmp_path / f"r{i}.json"
            args = [address, ",".join(addresses), str(data), str(certs.ca), str(certs.cert)]
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.security.raft_tls_member",
                    *args,
                    str(certs.key),
                    str(status),
                ],
                cwd=REPO,
                stdin=subprocess.PIPE,
                text=True,
            )
            started.append((process, status))
        yield started
    finally:
        for process, _ in started:
            with suppress(OSError):
                assert process.stdin is not None
                process.stdin.close()
        for process, _ in started:
            try:
                process.wait(20.0)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5.0)


def _status(path: Path) -> dict[str, Any]:
    try:
        report: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return report


def _leading(members: list[tuple[Any, Path]], at_least: int, above_term: int = -1) -> Any:
    for process, status in members:
        report = _status(status)
        if (
            process.poll() is None
            and report.get("leader")
            and report["committed"] >= at_least
            and report["term"] > above_term
        ):
            return process, report
    return None


def test_three_replicas_commit_and_fail_over_when_the_leader_is_killed(
    tmp_path: Path, cluster_ca: Authority
) -> None:
    with _members(tmp_path, cluster_ca) as members:
        leader, report = wait_until("a leader that commits", lambda: _leading(members, 5), 60.0)
        os.kill(leader.pid, signal.SIGKILL)
        leader.wait(10.0)
        survivors = [m for m in members if m[0] is not leader]
        successor, after = wait_until(
            "a new leader that commits",
            lambda: _leading(survivors, 3, above_term=report["term"]),
            60.0,
        )
        assert successor is not leader and after["term"] > report["term"]


# ------------------------------------------------------- one replica, raw peers


@contextmanager
def _lone_replica(
    tmp_path: Path, cluster_ca: Authority, named: bool = False
) -> Iterator[tuple[RaftReplica, list[str]]]:
    """A replica whose two other members do not run: the tests speak for them. With
    ``named``, the members' replica ids are known (r0, r1, r2 in address order)."""
    ports = reserve_ports(3)
    # The replica's address sorts first, so it never dials the members the tests play.
    own, *others = sorted(f"127.0.0.1:{p}" for p in ports)
    files = TlsFiles.from_cert_files(cluster_ca.issue(replica("r0")))
    data = tmp_path / "r0"
    data.mkdir()
    directory = {a: (f"r{i}", "") for i, a in enumerate([own, *others])} if named else None
    member = RaftReplica(
        own,
        [own, *others],
        str(data),
        "",
        QUIET,
        directory=directory,
        secure=True,
        raft_tls=files,
    )
    try:
        yield member, others
    finally:
        member.stop()


def _transport(member: RaftReplica) -> TlsTransport:
    transport: TlsTransport = member._sync._SyncObj__transport
    return transport


def _dial(member: RaftReplica, certs: CertFiles | None) -> socket.socket:
    """A connection to ``member``'s Raft port: TLS with ``certs`` (which does not check
    the replica's certificate, so only the replica decides), or plaintext."""
    host, port = member.self_address.rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=10.0)
    if certs is None:
        return raw
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.load_cert_chain(str(certs.cert), str(certs.key))
    return context.wrap_socket(raw, server_hostname=REPLICA_SERVER_NAME)


def _vote(term: int = VOTE_TERM) -> dict[str, Any]:
    return {"type": "request_vote", "term": term, "last_log_index": 99, "last_log_term": 99}


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the other side closed ``sock`` (reads until then; False on a timeout)."""
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except (OSError, ssl.SSLError):
        pass
    return True


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    with suppress(OSError, ssl.SSLError):
        sock.sendall(data)


def test_a_replica_certificate_of_the_cluster_is_heard(
    tmp_path: Path, cluster_ca: Authority
) -> None:
    certs = cluster_ca.issue(replica("r1"))
    with _lone_replica(tmp_path, cluster_ca) as (member, others), _dial(member, certs) as sock:
        sock.sendall(wire.frame(others[0]) + wire.frame(_vote()))
        wait_until("the vote's term taken", lambda: member.term() == VOTE_TERM or None, 15.0)


@pytest.mark.parametrize("who", ["worker of the cluster", "replica of another CA", "plaintext"])
def test_peers_that_are_not_replicas_of_the_cluster_are_refused(
    tmp_path: Path, cluster_ca: Authority, other_ca: Authority, who: str
) -> None:
    certs = {
        "worker of the cluster": cluster_ca.issue(worker("n1")),
        "replica of another CA": other_ca.issue(replica("r1")),
        "plaintext": None,
    }[who]
    with _lone_replica(tmp_path, cluster_ca) as (member, others):
        refusals = _transport(member).refusals
        try:
            sock = _dial(member, certs)
        except (ssl.SSLError, OSError):
            sock = None  # refused within the handshake
        if sock is not None:
            with sock:
                _send_quietly(sock, wire.frame(others[0]) + wire.frame(_vote()))
                assert _closed_by_peer(sock)
        wait_until("the refusal logged", lambda: refusals.reports > 0 or None, 15.0)
        assert member.term() < VOTE_TERM  # no message reached Raft


def test_a_replica_certificate_cannot_speak_for_another_member(
    tmp_path: Path, cluster_ca: Authority
) -> None:
    with _lone_replica(tmp_path, cluster_ca, named=True) as (member, others):
        refusals = _transport(member).refusals
        # r2's certificate announcing r1's address: refused, nothing reaches Raft.
        with _dial(member, cluster_ca.issue(replica("r2"))) as sock:
            _send_quietly(sock, wire.frame(others[0]) + wire.frame(_vote()))
            assert _closed_by_peer(sock)
        assert refusals.reports > 0
        assert member.term() < VOTE_TERM
        # r1's own certificate for its own address is heard.
        with _dial(member, cluster_ca.issue(replica("r1"))) as sock:
            sock.sendall(wire.frame(others[0]) + wire.frame(_vote()))
            wait_until("the vote's term taken", lambda: member.term() == VOTE_TERM or None, 15.0)


def _log_end(member: RaftReplica) -> tuple[int, int]:
    last = member._sync.raft_log()[-1]
    return int(last[1]), int(last[2])


class _Touch:
    """A pickle that would create ``path`` when loaded."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


def _append(member: RaftReplica, entries: list[Any], **fields: Any) -> dict[str, Any]:
    index, term = _log_end(member)
    return {
        "type": "append_entries",
        "term": VOTE_TERM,
        "commit_index": index + len(entries) + 1,
        "prevLogIdx": index,
        "prevLogTerm": term,
        "entries": entries,
        **fields,
    }


def test_an_entry_whose_pickle_calls_is_refused_and_nothing_is_applied(
    tmp_path: Path, cluster_ca: Authority
) -> None:
    marker = tmp_path / "ran"
    evil = b"\x00" + pickle.dumps(_Touch(marker), protocol=2)
    with _lone_replica(tmp_path, cluster_ca) as (member, others):
        start = _log_end(member)
        certs = cluster_ca.issue(replica("r1"))
        with _dial(member, certs) as sock:
            index = start[0] + 1
            sock.sendall(wire.frame(others[0]) + wire.frame(_append(member, [(evil, index, 7)])))
            assert _closed_by_peer(sock)
        # A large entry arrives in chunks, joined and loaded by the replica: refused too.
        with _dial(member, certs) as sock:
            chunked = pickle.dumps(_Touch(marker), protocol=2)
            first = _append(member, [], transmission="start", data=chunked[:8])
            last = _append(member, [], transmission="finish", data=chunked[8:])
            for message in (first, last):
                del message["entries"]
            sock.sendall(wire.frame(others[0]) + wire.frame(first) + wire.frame(last))
            # The same connection then carries a good entry (a no-op): it is applied,
            # so the refused ones were read before it.
            sock.sendall(wire.frame(_append(member, [(b"\x01", index, VOTE_TERM)])))
            wait_until("the no-op appended", lambda: _log_end(member)[0] == index or None, 15.0)
        assert _log_end(member) == (index, VOTE_TERM)
        assert not marker.exists()
        assert member._sync.tick_thread_alive()


@contextmanager
def _member_link(member: RaftReplica, certs: CertFiles, address: str) -> Iterator[socket.socket]:
    with _dial(member, certs) as sock:
        sock.sendall(wire.frame(address))
        yield sock


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(garbage=st.binary(min_size=1, max_size=64), framed=st.booleans())
def test_malformed_frames_close_only_their_connection(
    tmp_path_factory: pytest.TempPathFactory, cluster_ca: Authority, garbage: bytes, framed: bool
) -> None:
    tmp_path = tmp_path_factory.mktemp("fuzz")
    certs = cluster_ca.issue(replica("r1"))
    with (
        _lone_replica(tmp_path, cluster_ca) as (member, others),
        _member_link(member, certs, others[0]) as kept,
    ):
        with _member_link(member, certs, others[1]) as fuzzed:
            payload = garbage if not framed else len(garbage).to_bytes(4, "big") + garbage
            _send_quietly(fuzzed, payload + wire.frame({"type": 1}))
            if framed:
                assert _closed_by_peer(fuzzed)
        kept.sendall(wire.frame(_vote()))
        wait_until("the vote's term taken", lambda: member.term() == VOTE_TERM or None, 15.0)


def test_refusals_are_logged_once_per_peer_and_reason_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    refusals = RefusalLog(interval_s=30.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="synapse_ha.raft.tls_transport"):
        refusals.refused("at 10.0.0.9 (incoming)", "no certificate")
        refusals.refused("at 10.0.0.9 (incoming)", "no certificate")
        refusals.refused("at 10.0.0.8 (incoming)", "no certificate")
        now[0] = 31.0
        refusals.refused("at 10.0.0.9 (incoming)", "no certificate")
    assert refusals.reports == 4
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "at 10.0.0.9 (incoming) refused: no certificate" in lines[0]


def test_a_listener_with_a_worker_certificate_is_refused_by_the_dialling_replica(
    tmp_path: Path, cluster_ca: Authority
) -> None:
    # The replica's address sorts last, so it dials the member a worker plays.
    fake, own = sorted(f"127.0.0.1:{p}" for p in reserve_ports(2))
    certs = cluster_ca.issue(worker("n1"), hosts=("127.0.0.1",))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(certs.cert), str(certs.key))
    received: list[bytes] = []
    handshakes: list[str] = []
    stop = threading.Event()
    host, port = fake.rsplit(":", 1)

    def serve(listener: socket.socket) -> None:
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            with raw:
                raw.settimeout(5.0)
                try:
                    with context.wrap_socket(raw, server_side=True) as tls:
                        handshakes.append("completed")
                        received.append(tls.recv(65536))
                except (ssl.SSLError, OSError) as exc:
                    handshakes.append(type(exc).__name__)

    with socket.create_server((host, int(port))) as listener:
        listener.settimeout(0.2)
        thread = threading.Thread(target=serve, args=(listener,))
        thread.start()
        try:
            files = TlsFiles.from_cert_files(cluster_ca.issue(replica("r0")))
            data = tmp_path / "r0"
            data.mkdir()
            peers = [own, fake]
            member = RaftReplica(own, peers, str(data), "", QUIET, secure=True, raft_tls=files)
            try:
                refusals = _transport(member).refusals
                wait_until("the worker refused", lambda: refusals.reports > 0 or None, 15.0)
                assert not member._sync._SyncObj__connectedNodes
            finally:
                member.stop()
        finally:
            stop.set()
            thread.join(10.0)
    assert handshakes and all(h != "completed" for h in handshakes), handshakes
    assert not any(received)
