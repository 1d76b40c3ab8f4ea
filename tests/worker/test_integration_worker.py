"""Workers with the real control plane on 127.0.0.1: gangs run, fail whole, fence, move."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2 as wpb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2_grpc as wpb_grpc
from synapse_ha.security.grants import GRANT_METADATA_KEY
from synapse_ha.security.tls import Transport
from synapse_ha.worker.pidns import ECHO_PID
from synapse_ha.worker.records import read_json
from tests.integration.cluster import LocalCluster, pausable_cluster, wait_for
from tests.worker.helpers import host_pid, process_gone, wait_gone
from tests.worker.workers import LocalWorkers, workers_of

pytestmark = pytest.mark.integration

HEARTBEAT_S = 0.25
LEASE_TTL_S = 2.0
DEAD_TIMEOUT_S = 5.0
TIMEOUTS = [
    "--heartbeat-interval",
    "250ms",
    "--lease-ttl",
    "2s",
    "--leader-step-down",
    "1s",
    "--dead-timeout",
    "5s",
]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with pausable_cluster(tmp_path / "cluster", TIMEOUTS, leader_timeout_s=15.0) as c:
        yield c


@pytest.fixture
def workers(cluster: LocalCluster, tmp_path: Path) -> Iterator[LocalWorkers]:
    with workers_of(cluster, tmp_path / "workers") as w:
        yield w


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[ClusterClient]:
    with cluster.client() as c:
        yield c


@pytest.fixture
def out(tmp_path: Path) -> Path:
    path = tmp_path / "out"
    path.mkdir()
    return path


def start_workers(workers: LocalWorkers, client: ClusterClient, n: int) -> None:
    """``n`` workers with one CPU each, so that every member of a gang gets its own node."""
    for i in range(n):
        workers.start(f"w{i + 1}", "--cpu", "1", "--memory", "1Gi", "--mock-gpus", "0")
    wait_for(
        f"{n} ready nodes",
        lambda: len([x for x in client.list_nodes() if x.status == "ready"]) == n,
        timeout_s=20,
    )


def gang(
    name: str, replicas: int, command: str, out: Path, retries: int = 0, backoff_ms: int = 100
) -> pb.JobSpec:
    return pb.JobSpec(
        name=name,
        replicas=replicas,
        resources=pb.Resources(cpu_milli=1000, memory_mib=64),
        shell_command=command,
        env=[pb.EnvVar(name="OUT", value=str(out))],
        retries=pb.RetryPolicy(max=retries, backoff_ms=backoff_ms, max_backoff_ms=backoff_ms),
    )


def wait_state(client: ClusterClient, job_id: str, state: str, timeout_s: float = 30) -> pb.Job:
    def probe() -> pb.Job | None:
        job = client.get_job(job_id)
        return job if job.state == state else None

    return wait_for(f"job {job_id} {state}", probe, timeout_s=timeout_s)


def pid_of(out: Path, name: str) -> int:
    """The host's pid of the running member that wrote :data:`ECHO_PID` to ``name``."""
    return host_pid(wait_for(f"pid file {name}", lambda: _read(out / name), timeout_s=20))


def _read(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text or None


def replica_transport(cluster: LocalCluster) -> Transport:
    """The transport of the first replica's certificate (replicas may read every log)."""
    assert cluster.credentials is not None
    return Transport(cluster.credentials.replica_tls(cluster.replicas[0].replica_id))


def read_log(
    transport: Transport,
    worker: tuple[str, str],
    job_id: str,
    rank: int,
    metadata: tuple[tuple[str, str], ...] = (),
) -> list[wpb.LogChunk]:
    """Every chunk of one member's log, read from ``worker`` (its node id and address;
    the caller checks that the server is that node's worker)."""
    node_id, address = worker
    with transport.channel(address, worker=node_id) as channel:
        stub = wpb_grpc.WorkerServiceStub(channel)  # type: ignore[no-untyped-call]
        request = wpb.ReadLogRequest(job_id=job_id, rank=rank)
        return list(stub.ReadLog(request, timeout=10, metadata=metadata))


def member_dirs(workers: LocalWorkers, job_id: str) -> list[Path]:
    return sorted(
        d for w in workers.workers for d in (w.data_dir / "members" / job_id).glob("a*.t*.r*")
    )


def test_a_two_member_gang_runs_on_two_workers_and_succeeds(
    cluster: LocalCluster, workers: LocalWorkers, client: ClusterClient, out: Path
) -> None:
    start_workers(workers, client, 2)
    command = (
        'echo "rank=$RANK/$WORLD_SIZE master=$MASTER_ADDR:$MASTER_PORT hosts=$SYNAPSE_MEMBER_HOSTS"'
    )
    job_id = client.submit_job(gang("pair", 2, command, out)).job_id
    job = wait_state(client, job_id, "SUCCEEDED")
    assert {m.node_id for m in job.attempt.members} == {"w1", "w2"}
    port = job.attempt.master_port
    nodes = {n.node_id: n.address for n in client.list_nodes()}
    # A replica's certificate may read every log on a worker.
    as_replica = replica_transport(cluster)
    for member in job.attempt.members:
        worker = (member.node_id, nodes[member.node_id])
        chunks = read_log(as_replica, worker, job_id, member.rank)
        text = b"".join(c.data for c in chunks).decode()
        expected = f"rank={member.rank}/2 master=127.0.0.1:{port} hosts=127.0.0.1,127.0.0.1\n"
        assert text == expected
        assert chunks[-1].eof


def test_a_workers_log_service_needs_a_replica_certificate_or_a_grant_for_the_job(
    cluster: LocalCluster, workers: LocalWorkers, client: ClusterClient, out: Path
) -> None:
    start_workers(workers, client, 2)
    job_id = client.submit_job(gang("secret", 2, "echo rank-$RANK", out)).job_id
    job = wait_state(client, job_id, "SUCCEEDED")
    nodes = {n.node_id: n.address for n in client.list_nodes()}
    by_rank = {m.rank: (m.node_id, nodes[m.node_id]) for m in job.attempt.members}
    rank_on = {m.node_id: m.rank for m in job.attempt.members}
    assert sorted(rank_on) == ["w1", "w2"]
    creds = cluster.credentials
    assert creds is not None
    # The transport-only certificate token holders use names nobody: no right to any log.
    as_client = Transport(creds.client_tls())
    with pytest.raises(grpc.RpcError) as err:
        read_log(as_client, by_rank[0], job_id, 0)
    assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
    # Another worker's certificate names a caller, but not one that may read logs.
    as_other_worker = Transport(creds.worker_tls("w2"))
    with pytest.raises(grpc.RpcError) as err:
        read_log(as_other_worker, ("w1", nodes["w1"]), job_id, rank_on["w1"])
    assert err.value.code() is grpc.StatusCode.PERMISSION_DENIED
    # Without a certificate of the cluster's CA the handshake itself fails.
    with pytest.raises(grpc.RpcError) as err:
        read_log(Transport.insecure(), by_rank[0], job_id, 0)
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    # A grant signed by a replica opens that job's log on the node it names, offline.
    leader = cluster.serving_leader()
    answer = cluster.stub(leader).GrantLogAccess(
        pb.GrantLogAccessRequest(job_id=job_id, rank=0), timeout=10
    )
    assert answer.node_address == by_rank[0][1]
    grant = ((GRANT_METADATA_KEY, answer.grant),)
    chunks = read_log(as_client, by_rank[0], job_id, 0, metadata=grant)
    assert b"".join(c.data for c in chunks) == b"rank-0\n"
    # ...and nowhere else: not on the node of rank 1, not for another job.
    with pytest.raises(grpc.RpcError) as err:
        read_log(as_client, by_rank[1], job_id, 1, metadata=grant)
    assert err.value.code() is grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as err:
        read_log(as_client, by_rank[0], "job-other", 0, metadata=grant)
    assert err.value.code() is grpc.StatusCode.PERMISSION_DENIED
    # A grant that is not one (here: its signature cut off) authenticates nobody.
    forged = ((GRANT_METADATA_KEY, answer.grant.rsplit(".", 2)[0] + ".AAAA.AAAA"),)
    with pytest.raises(grpc.RpcError) as err:
        read_log(as_client, by_rank[0], job_id, 0, metadata=forged)
    assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED


def test_one_member_failing_stops_the_whole_gang_and_it_is_retried(
    workers: LocalWorkers, client: ClusterClient, out: Path
) -> None:
    start_workers(workers, client, 2)
    command = (
        f"{ECHO_PID} > $OUT/pid-$SYNAPSE_ATTEMPT-$RANK; "
        'if [ "$SYNAPSE_ATTEMPT" = 1 ]; then '
        '  if [ "$RANK" = 1 ]; then sleep 0.5; exit 1; fi; exec sleep 600; '
        "fi; echo done"
    )
    # The back-off outlasts a heartbeat round plus the stop: the leader does not wait for
    # the failed attempt's other members to confirm their exit before binding the next.
    job_id = client.submit_job(gang("flaky", 2, command, out, retries=1, backoff_ms=1500)).job_id
    first = pid_of(out, "pid-1-0")  # running until rank 1 fails, half a second later
    job = wait_state(client, job_id, "SUCCEEDED")
    assert job.attempts_made == 2
    assert process_gone(first)

    records = {}
    for d in member_dirs(workers, job_id):
        attempt, rank = d.name.split(".")[0][1:], d.name.split(".")[2][1:]
        records[(int(attempt), int(rank))] = (
            read_json(d / "member.json"),
            read_json(d / "exit.json"),
        )
    assert set(records) == {(1, 0), (1, 1), (2, 0), (2, 1)}
    assert records[(1, 1)][1]["exit_code"] == 1  # type: ignore[index]
    assert records[(1, 0)][1]["detail"] == "stopped by the worker"  # type: ignore[index]
    # No instant with members of both attempts running.
    first_ended = max(records[(1, r)][1]["ended_at_ms"] for r in (0, 1))  # type: ignore[index]
    second_started = min(records[(2, r)][0]["started_at_ms"] for r in (0, 1))  # type: ignore[index]
    assert first_ended <= second_started


def test_a_worker_cut_off_from_the_leader_kills_its_members_within_the_lease(
    cluster: LocalCluster, workers: LocalWorkers, client: ClusterClient, out: Path
) -> None:
    start_workers(workers, client, 2)
    job_id = client.submit_job(
        gang("cutoff", 2, f"{ECHO_PID} > $OUT/pid-$RANK; exec sleep 600", out)
    ).job_id
    pids = [pid_of(out, "pid-0"), pid_of(out, "pid-1")]
    wait_state(client, job_id, "RUNNING")
    for r in cluster.replicas:
        assert r.process is not None
        os.killpg(r.process.pid, signal.SIGSTOP)
    wait_gone(pids, LEASE_TTL_S + 1.0)

    def fenced_records() -> bool:
        # Fenced by the member's supervisor or by the agent, whichever noticed first; the
        # agent rewrites the records once every supervisor is gone.
        records = [read_json(d / "exit.json") for d in member_dirs(workers, job_id)]
        return len(records) == 2 and all(
            r is not None and str(r["detail"]).startswith("fenced") for r in records
        )

    wait_for("fenced exit records", fenced_records, timeout_s=5)


def test_a_killed_worker_has_its_gang_replaced_after_dead_timeout_never_before(
    workers: LocalWorkers, client: ClusterClient, out: Path
) -> None:
    start_workers(workers, client, 3)
    job_id = client.submit_job(
        gang("mover", 2, f"{ECHO_PID} > $OUT/pid-$SYNAPSE_ATTEMPT-$RANK; exec sleep 600", out, 2)
    ).job_id
    pids = [pid_of(out, "pid-1-0"), pid_of(out, "pid-1-1")]
    job = wait_state(client, job_id, "RUNNING")
    first_token = job.attempt.fencing_token
    victim_id = job.attempt.members[0].node_id
    victim = next(w for w in workers.workers if w.node_id == victim_id)
    workers.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    # The dead agent's member goes with its supervisor (well within the lease).
    wait_gone(pids[:1], LEASE_TTL_S + 1.0)

    def replaced() -> pb.Job | None:
        j = client.get_job(job_id)
        return j if j.attempt.fencing_token != first_token else None

    moved = wait_for("a new attempt", replaced, timeout_s=DEAD_TIMEOUT_S + 15)
    elapsed = time.monotonic() - killed_at
    assert elapsed >= DEAD_TIMEOUT_S - HEARTBEAT_S, f"re-placed after {elapsed:.2f}s"
    assert victim_id not in {m.node_id for m in moved.attempt.members}
    pid_of(out, "pid-2-0")
    pid_of(out, "pid-2-1")
    assert process_gone(pids[1])  # the surviving member of the old attempt was stopped
