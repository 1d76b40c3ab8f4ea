"""The Raft channel guard: the password rule, the key bound to the security mode, the
data directory's mode, and the log line that says why a peer without the key cannot be
reached (two real pysyncobj replicas on 127.0.0.1, in process)."""

from __future__ import annotations

import base64
import logging
import os
import secrets
import socket
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from synapse_ha.local.ports import reserve_ports
from synapse_ha.local.waiting import wait_until
from synapse_ha.raft.channel import (
    MODE_FILE,
    PASSWORD_CHANNEL,
    PASSWORD_RULE,
    TLS_CHANNEL,
    data_dir_mode_problem,
    raft_channel,
    raft_key,
    raft_password_problem,
)
from synapse_ha.raft.password_transport import KeyMismatchLog
from synapse_ha.raft.replica import RaftReplica, RaftTiming
from synapse_ha.security.bundle import new_raft_password
from tests.integration.cluster import PASSWORD

# Random keys drawn at import: each has a fixed id, so that every xdist worker collects
# the same tests.
STRONG = [
    # openssl rand -base64 32
    pytest.param(base64.b64encode(secrets.token_bytes(32)).decode(), id="base64-32"),
    pytest.param(
        base64.b64encode(secrets.token_bytes(48)).decode().rstrip("="), id="base64-48-unpadded"
    ),
    # openssl rand -hex 32
    pytest.param(secrets.token_hex(32), id="hex-32"),
    pytest.param(secrets.token_hex(32).upper(), id="hex-32-upper"),
    pytest.param(secrets.token_urlsafe(32), id="urlsafe-32"),
    pytest.param(PASSWORD, id="test-password"),
    # openssl rand -base64 64: two lines of base64
    pytest.param(
        "\n".join((lambda t: [t[:64], t[64:]])(base64.b64encode(secrets.token_bytes(64)).decode())),
        id="base64-64-two-lines",
    ),
]


@pytest.mark.parametrize("password", STRONG)
def test_random_keys_of_32_bytes_or_more_pass(password: str) -> None:
    assert raft_password_problem(password) is None


def test_generated_passwords_pass() -> None:
    for _ in range(200):
        assert raft_password_problem(new_raft_password()) is None


@pytest.mark.parametrize(
    ("password", "why"),
    [
        ("pw", "holds 1 bytes"),
        ("integration-test-password", "neither base64 nor hex"),
        ("example-raft-passwords", "holds 16 bytes"),
        ("correct horse battery staple", "neither base64 nor hex"),
        pytest.param(
            base64.b64encode(secrets.token_bytes(31)).decode(), "holds 31 bytes", id="base64-31"
        ),
        pytest.param(secrets.token_hex(31), "holds 31 bytes", id="hex-31"),
        pytest.param(  # an odd number of digits
            secrets.token_hex(32)[:-1], "neither base64 nor hex", id="hex-63-digits"
        ),
        ("a" * 44, "holds 22 bytes"),  # hex digits only: read as hex
        ("Z" * 44, "take only 3 distinct values"),
        ("ab" * 32, "take only 1 distinct values"),  # hex: 0xab, 32 times
        (base64.b64encode(bytes(range(8)) * 5).decode(), "take only 8 distinct values"),
        ("Zm9v+bar_baz-quxZm9v+bar_baz-quxZm9v+bar_baz", "neither base64 nor hex"),
        ("x" * 10 + "=" * 3, "neither base64 nor hex"),
    ],
)
def test_short_patterned_or_unencoded_passwords_are_refused_with_the_rule(
    password: str, why: str
) -> None:
    problem = raft_password_problem(password)
    assert problem is not None
    assert why in problem
    assert problem.endswith(PASSWORD_RULE)
    assert "openssl rand -base64 32" in problem


def test_a_replica_refuses_a_weak_password_before_it_touches_its_data_dir(
    tmp_path: Path,
) -> None:
    me = f"127.0.0.1:{reserve_ports(1)[0]}"
    with pytest.raises(ValueError, match="too weak"):
        RaftReplica(me, [me], str(tmp_path), "integration-test-password", secure=True)
    assert list(tmp_path.iterdir()) == []


def test_the_key_depends_on_the_mode() -> None:
    assert raft_key(PASSWORD, secure=True) == PASSWORD  # unchanged: rolling upgrades
    insecure = raft_key(PASSWORD, secure=False)
    assert insecure != PASSWORD
    assert insecure == raft_key(PASSWORD, secure=False)
    assert insecure != raft_key(new_raft_password(), secure=False)


def test_the_data_dir_remembers_a_secure_cluster(tmp_path: Path) -> None:
    assert data_dir_mode_problem(str(tmp_path), secure=False) is None  # nothing there yet
    (tmp_path / MODE_FILE).write_text("secure\n")
    problem = data_dir_mode_problem(str(tmp_path), secure=False)
    assert problem is not None and "would serve it" in problem
    assert data_dir_mode_problem(str(tmp_path), secure=True) is None
    (tmp_path / MODE_FILE).write_text("insecure\n")
    # An insecure cluster may turn secure; its data was never protected.
    assert data_dir_mode_problem(str(tmp_path), secure=True) is None
    assert data_dir_mode_problem(str(tmp_path), secure=False) is None


def test_mismatches_are_named_once_per_peer_and_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    log = KeyMismatchLog("secure (TLS)", interval_s=30.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="synapse_ha.raft.password_transport")
    for _ in range(5):
        log.undecryptable("10.0.0.9:7001")
    log.closed_during_key_exchange("10.0.0.9:7001")
    log.undecryptable("10.0.0.8:7001")
    now[0] += 31.0
    log.undecryptable("10.0.0.9:7001")
    lines = [r.getMessage() for r in caplog.records]
    assert log.reports == 8
    assert len(lines) == 4
    assert lines[0].startswith("Raft peer 10.0.0.9:7001 sent a message this replica cannot")
    assert "this replica runs secure (TLS)" in lines[0]
    assert "closed the connection before the key exchange finished" in lines[1]


TIMING = RaftTiming(election_min_s=0.3, election_max_s=0.6, connection_retry_s=0.2)


@contextmanager
def two_replicas(tmp_path: Path, modes: tuple[bool, bool]) -> Iterator[list[RaftReplica]]:
    addresses = [f"127.0.0.1:{p}" for p in reserve_ports(2)]
    made: list[RaftReplica] = []
    try:
        for i, (address, secure) in enumerate(zip(addresses, modes, strict=True)):
            data = tmp_path / f"r{i}"
            data.mkdir()
            made.append(RaftReplica(address, addresses, str(data), PASSWORD, TIMING, secure=secure))
        yield made
    finally:
        for replica in made:
            replica.stop()


def test_replicas_of_one_mode_form_a_cluster(tmp_path: Path) -> None:
    with two_replicas(tmp_path, (False, False)) as replicas:
        wait_until("a leader", lambda: any(r.is_leader() for r in replicas), 15.0)
        assert {(tmp_path / d / MODE_FILE).read_text() for d in ("r0", "r1")} == {"insecure\n"}


def test_replicas_of_different_modes_never_talk_and_both_say_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="synapse_ha.raft.password_transport")
    with two_replicas(tmp_path, (True, False)) as replicas:

        def both_said_why() -> bool:
            text = caplog.text
            return (
                "cannot decrypt" in text
                and "closed the connection before the key exchange finished" in text
            )

        wait_until("both replicas to say why", both_said_why, 15.0)
        assert not any(r.is_leader() for r in replicas)
        assert [r.status().leader for r in replicas] == ["", ""]
    assert "this replica runs secure (TLS)" in caplog.text
    assert "this replica runs insecure (--insecure)" in caplog.text
    assert os.path.exists(tmp_path / "r0" / MODE_FILE)


def _client_hello() -> bytes:
    """The first bytes a TLS client sends (a ClientHello record)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="peer")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_a_password_replica_names_a_tls_peer_and_closes_its_connection(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="synapse_ha.raft.password_transport")
    with two_replicas(tmp_path, (False, False)) as replicas:
        host, port = replicas[0].self_address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10.0) as peer:
            peer.sendall(_client_hello())
            assert peer.recv(1024) == b""  # closed at once, not after the peer gives up
        wait_until("the replica to say why", lambda: "opened a TLS handshake" in caplog.text, 5.0)
    assert "it runs raft.transport = tls" in caplog.text
    assert "this replica runs insecure (--insecure)" in caplog.text


def test_a_secure_replica_talks_raft_over_tls_unless_told_otherwise() -> None:
    assert raft_channel("", secure=True) == TLS_CHANNEL
    assert raft_channel(PASSWORD_CHANNEL, secure=True) == PASSWORD_CHANNEL
    assert raft_channel("", secure=False) == PASSWORD_CHANNEL
    with pytest.raises(ValueError, match="needs the replica's TLS files"):
        raft_channel(TLS_CHANNEL, secure=False)
    with pytest.raises(ValueError, match="must be one of tls, password"):
        raft_channel("plain", secure=True)
