"""Attacks on the Raft channel between replicas, with real synapse-scheduler processes on
127.0.0.1.

* A replica started with a weak Raft password (the pysyncobj key every replica's
  unpickler trusts) exits at once with the rule in its error, before it writes anything.
* A replica started ``--insecure`` with the cluster's password in the place of a member
  of a secure cluster (a fresh machine on its addresses): it would serve the cluster's
  state, tokens included, to anonymous callers as an admin. It never gets a byte of the
  state (it talks the password channel, the secure replicas mutual TLS), and its log
  says why; the secure cluster goes on untouched.
* The same member restarted ``--insecure`` on its own data directory refuses to start:
  the directory holds a secure cluster's state.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.codec.versioned import decode_state
from synapse_ha.local.launcher import Launcher
from synapse_ha.local.process import Replica
from synapse_ha.local.replicas import RAFT_PASSWORD_VARIABLE
from synapse_ha.raft.channel import MODE_FILE, PASSWORD_RULE
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.security.tls import Transport
from tests.integration.cluster import PASSWORD, LocalCluster, job_spec, reserve_ports, wait_for

pytestmark = pytest.mark.integration

WHY = "does not share this replica's Raft key"


def run_replica(argv: list[str], password: str) -> subprocess.CompletedProcess[str]:
    """Run a replica to its exit (bounded); what it printed."""
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, RAFT_PASSWORD_VARIABLE: password},
        check=False,
    )


def one_replica_argv(data_dir: Path) -> list[str]:
    raft, grpc_port = reserve_ports(2)
    return [
        sys.executable,
        "-m",
        "synapse_ha.programs.scheduler",
        "--id",
        "r1",
        "--replica",
        f"r1=127.0.0.1:{raft},127.0.0.1:{grpc_port}",
        "--data-dir",
        str(data_dir),
        "--insecure",
    ]


@pytest.mark.parametrize(
    "password",
    [
        "hunter2",
        "integration-test-password",  # the tests' own, before the rule
        "Z" * 44,  # long, but a pattern
        "0123456789abcdef" * 3,  # 24 bytes of hex
        base64.b64encode(bytes(range(0, 240, 10))).decode(),  # 24 distinct bytes: too short
    ],
)
def test_a_replica_with_a_weak_raft_password_exits_with_the_rule(
    tmp_path: Path, password: str
) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    done = run_replica(one_replica_argv(data_dir), password)
    assert done.returncode == 2, done.stderr
    assert "the Raft password is too weak" in done.stderr
    assert PASSWORD_RULE in done.stderr
    assert list(data_dir.iterdir()) == []  # no journal, no snapshot, no mode file


def _fingerprint(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def secure_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path / "secure")
    try:
        cluster.start()
        cluster.serving_leader(timeout_s=30.0)
        yield cluster
    finally:
        cluster.close()


def _state_of(address: str) -> pb.GetReplicaStateResponse | None:
    """The insecure replica's state, asked as the anonymous admin it serves (None while
    it does not answer)."""
    with ClusterClient(
        [address], per_try_timeout_s=1.0, channel_factory=Transport.insecure().channel
    ) as c:
        try:
            return c.replica_state(address)
        except grpc.RpcError:
            return None


def test_an_insecure_replica_in_a_secure_members_place_never_gets_the_state(
    secure_cluster: LocalCluster, tmp_path: Path
) -> None:
    cluster = secure_cluster
    with cluster.client(timeout_s=20.0) as admin:
        job = admin.submit_job(job_spec("secret-training")).job_id
        token = admin.create_token("alice", role="user")
    victim = cluster.replica("r3")
    wait_for("r3 to hold the job", lambda: job in _jobs_on(cluster, victim), timeout_s=20.0)
    victim.stop()
    secure_data = _fingerprint(victim.data_dir)
    assert (victim.data_dir / MODE_FILE).read_text() == "secure\n"

    intruder_launcher = Launcher(tmp_path / "intruder-logs")  # no credentials: --insecure
    try:
        # The member restarted --insecure on its own data directory: refused at once.
        on_own_data = intruder_launcher.replica(
            cluster.peers[2], cluster.peers, victim.data_dir, env=victim.env
        )
        done = run_replica(on_own_data.argv, PASSWORD)
        assert done.returncode == 2, done.stderr
        assert "holds the state of a secure cluster" in done.stderr
        assert _fingerprint(victim.data_dir) == secure_data

        # A fresh machine in r3's place, --insecure, with the cluster's password.
        intruder = intruder_launcher.replica(
            cluster.peers[2], cluster.peers, tmp_path / "intruder-data", env=victim.env
        )
        assert "--insecure" in intruder.argv
        intruder.data_dir.mkdir()
        intruder_launcher.start(intruder)
        first = wait_for("the intruder to answer", lambda: _state_of(intruder.grpc), 30.0)
        # Raft would have sent the whole state within a few connection retries (0.5 s
        # apart): watch for longer than that.
        watched_until = time.monotonic() + 5.0
        seen = first
        while time.monotonic() < watched_until:
            state = decode_state(seen.encoded_state)
            assert state.jobs == {} and state.tokens == {}, "the intruder got the state"
            assert state.applied_commands == 0
            time.sleep(0.2)
            seen = _state_of(intruder.grpc) or seen
        wait_for("the intruder to say why", lambda: WHY in intruder.log_tail(20_000), 15.0)
        log = intruder.log_tail(20_000)
        assert "this replica runs insecure (--insecure)" in log

        # The secure cluster goes on without r3, unchanged by the intruder.
        with cluster.client(timeout_s=20.0) as admin:
            assert admin.get_job(job).spec.name == "secret-training"
            assert token.token_id in [t.token_id for t in _tokens(admin)]
        secure_logs = cluster.replica("r1").log_tail(40_000) + cluster.replica("r2").log_tail(
            40_000
        )
        assert "refused: the TLS handshake failed" in secure_logs
    finally:
        intruder_launcher.close()
    assert _fingerprint(victim.data_dir) == secure_data


def _jobs_on(cluster: LocalCluster, replica: Replica) -> set[str]:
    with cluster.client() as client:
        return set(decode_state(client.replica_state(replica.grpc).encoded_state).jobs)


def _tokens(client: ClusterClient) -> list[pb.TokenInfo]:
    request = pb.ListTokensRequest()
    response = client.call(
        "ListTokens", lambda a, t: client.scheduler(a).ListTokens(request, timeout=t)
    )
    return list(response.tokens)
