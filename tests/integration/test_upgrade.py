"""Rolling upgrade from the previous landed release, on real processes.

The previous release is commit ``40cbe912`` of the project's history (2026-11-22, before
online membership changes), built into a directory of its own with ``pip install --no-deps
--target`` (the dependencies are the same) and run with ``PYTHONPATH`` pointing there. A cluster of
two old replicas and one new one takes a stream of submissions while the old ones are
replaced one at a time by the new release on the same data; no acknowledged job is lost
and the replicas end with identical states. The previous release talks Raft on the
password channel only: the new replicas run ``--raft-transport password`` throughout, as
deploy/README.md tells an operator to ("Raft between replicas").
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from synapse_ha.client.cluster import ClusterUnavailable
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.codec.versioned import decode_state
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.integration.cluster import LocalCluster, Replica, job_spec, register_request, wait_for

pytestmark = pytest.mark.integration

PREVIOUS_RELEASE = "40cbe912bd422f7cb1ebb37ef938ed67c0462770"
REPO = Path(__file__).resolve().parents[2]


def _previous_ref() -> str:
    found = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", "-q", f"{PREVIOUS_RELEASE}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0:
        pytest.fail(
            f"the previous release, commit {PREVIOUS_RELEASE}, is not in this checkout's git "
            "history: the rolling-upgrade test needs a clone with history (not --depth)"
        )
    return found.stdout.strip()


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory to put on PYTHONPATH that holds the previous release's package."""
    ref = _previous_ref()
    root = tmp_path_factory.mktemp("previous")
    source, target = root / "src", root / "site"
    source.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", ref],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    assert (target / "synapse_ha" / "programs" / "scheduler.py").exists()
    return target


def _run_release(replica: Replica, previous: Path | None) -> None:
    """Run ``replica`` as the previous release (``previous``) or as this one (None)."""
    env = dict(replica.env or {})
    env.pop("PYTHONPATH", None)
    env["PYTHONSAFEPATH"] = "1"  # never import this checkout from the working directory
    if previous is not None:
        env["PYTHONPATH"] = str(previous)
        # That release loads gRPC with its fork handlers on, and a replica of it froze
        # when it forked a snapshot writer under load (see synapse_ha.programs).
        env["GRPC_ENABLE_FORK_SUPPORT"] = "false"
        # Flags newer than that release are left out (it would refuse to start).
        for flag in (
            "--metrics-address",
            "--agent-address",
            "--raft-transport",
            "--master-port-base",
        ):
            if flag in replica.argv:
                i = replica.argv.index(flag)
                replica.argv = replica.argv[:i] + replica.argv[i + 2 :]
    elif "--raft-transport" not in replica.argv:
        replica.argv = [*replica.argv, "--raft-transport", "password"]
    replica.env = env


def _release_of(cluster: LocalCluster, replica: Replica) -> str | None:
    """``previous`` or ``current`` (this release validates AddReplica's fields, the
    previous one has no AddReplica); None while the replica does not answer."""
    try:
        cluster.stub(replica).AddReplica(pb.AddReplicaRequest(), timeout=5.0)
    except grpc.RpcError as exc:
        if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return None
        return "current" if exc.code() is grpc.StatusCode.INVALID_ARGUMENT else "previous"
    return "current"


def _wait_release(cluster: LocalCluster, replica: Replica) -> str:
    return wait_for(
        f"{replica.replica_id} answers", lambda: _release_of(cluster, replica), timeout_s=30.0
    )


class SubmissionStream:
    """Submits jobs one after another from a thread, each with its own request id,
    retrying the same id until it is acknowledged."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.acked: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="submissions", daemon=True)

    def __enter__(self) -> SubmissionStream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60.0)

    def _run(self) -> None:
        with self.cluster.client(timeout_s=20.0) as client:
            i = 0
            while not self._stop.is_set():
                try:
                    answer = client.submit_job(job_spec(f"stream-{i}"), request_id=f"req-{i}")
                except (ClusterUnavailable, grpc.RpcError) as exc:
                    self.errors.append(str(exc).splitlines()[0])
                    continue  # the same request id again: never a duplicate job
                self.acked.append(answer.job_id)
                i += 1

    def progressed(self, since: int, by: int = 5) -> bool:
        return len(self.acked) >= since + by


@pytest.fixture
def mixed_cluster(tmp_path: Path, previous_release: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path, extra_args=["--compaction-entries", "30"])
    cluster.expect_format = None  # the previous release holds the format back
    try:
        for replica in cluster.replicas:
            old = replica.replica_id in ("r1", "r2")
            _run_release(replica, previous_release if old else None)
        cluster.start()
        cluster.serving_leader(timeout_s=30.0)
        yield cluster
    finally:
        cluster.close()


def test_rolling_upgrade_from_the_previous_release_loses_no_acknowledged_job(
    mixed_cluster: LocalCluster,
) -> None:
    cluster = mixed_cluster
    releases = [_wait_release(cluster, r) for r in cluster.replicas]
    assert releases == ["previous", "previous", "current"]
    with cluster.client(timeout_s=30.0) as client:
        client.register_node(register_request("n1", "127.0.0.1", gpu=8))
        with SubmissionStream(cluster) as stream:
            wait_for("submissions in the mixed cluster", lambda: stream.progressed(0, 20))
            # The previous release reads format 2 only: the format gate stays shut.
            r3 = cluster.replica("r3")
            assert decode_state(client.replica_state(r3.grpc).encoded_state).format_floor == 2
            for replica_id in ("r1", "r2"):
                replica = cluster.replica(replica_id)
                replica.stop()
                _run_release(replica, None)
                cluster.start(replica)
                assert _wait_release(cluster, replica) == "current"
                done = len(stream.acked)
                wait_for(
                    f"submissions after upgrading {replica_id}",
                    lambda done=done: stream.progressed(done),
                )
                wait_for(
                    f"{replica_id} healthy again",
                    lambda r=replica: cluster.local_status(r).healthy,  # type: ignore[misc]
                    timeout_s=30.0,
                )
        acked = set(stream.acked)
        assert len(acked) == len(stream.acked)  # one job per request id

        def converged() -> set[str] | None:
            answers = [client.replica_state(r.grpc) for r in cluster.replicas]
            if len({a.state_sha256 for a in answers}) != 1:
                return None
            return set(decode_state(answers[0].encoded_state).jobs)

        jobs = wait_for("identical states on the upgraded replicas", converged, timeout_s=60.0)
    assert acked <= jobs
    assert len(acked) >= 30

    def floors() -> list[int]:
        with cluster.client(timeout_s=30.0) as client:
            answers = [client.replica_state(r.grpc) for r in cluster.replicas]
        return [decode_state(a.encoded_state).format_floor for a in answers]

    wait_for(
        "the leader raises the cluster's format once every replica reads it",
        lambda: floors() == [FORMAT] * 3,
        timeout_s=30.0,
    )
