"""DevCluster and run_foreground: real replicas and workers on 127.0.0.1, and nothing
left running afterwards."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from click.testing import CliRunner

from synapse_ha.cli.main import cli
from synapse_ha.client.cluster import ClusterClient, ClusterUnavailable
from synapse_ha.client.credentials import DevProfile, read_dev_profile, write_dev_profile
from synapse_ha.local.devcluster import DevCluster
from synapse_ha.local.devoptions import DEFAULT_CLUSTER, DevClusterOptions
from synapse_ha.local.foreground import busy_default_port, describe, run_foreground
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2 as wpb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2_grpc as wpb_grpc
from synapse_ha.security.tls import INSECURE_WARNING, TlsFiles, Transport
from synapse_ha.worker.procgroup import running_groups
from tests.devcluster.procs import (
    MARKER_VARIABLE,
    kill_marked,
    marked_processes,
    new_marker,
    wait_no_marked_processes,
)

T = TypeVar("T")

SMALL = DevClusterOptions(workers=2, racks=2, gpus_per_worker=2, ephemeral_ports=True)


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = 60.0) -> T:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
        except (grpc.RpcError, ClusterUnavailable, OSError) as exc:
            last, value = exc, None
        if value is not None:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last})")


def wait_job(client: ClusterClient, job_id: str, state: str, timeout_s: float = 60.0) -> pb.Job:
    """Wait (bounded) for ``job_id`` to reach ``state``; fail at once if it ends otherwise,
    and say where it was stuck if it never gets there."""
    deadline = time.monotonic() + timeout_s
    job: pb.Job | None = None
    while time.monotonic() < deadline:
        try:
            job = client.get_job(job_id)
        except (grpc.RpcError, ClusterUnavailable):
            time.sleep(0.1)
            continue
        if job.state == state:
            return job
        if job.state in ("SUCCEEDED", "FAILED", "CANCELLED"):
            break
        time.sleep(0.1)
    seen = "never answered" if job is None else f"{job.state} ({job.reason})"
    members = [] if job is None else [(m.rank, m.node_id, m.state) for m in job.attempt.members]
    raise AssertionError(f"job {job_id} is {seen}, members {members}; expected {state}")


def at_least(items: list[int], n: int) -> list[int] | None:
    return items if len(items) >= n else None


@pytest.fixture
def marker(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A marker in the environment every process started from this test inherits; at
    teardown, anything still carrying it is killed (the test has already failed then)."""
    value = new_marker()
    monkeypatch.setenv(MARKER_VARIABLE, value)
    try:
        yield value
    finally:
        kill_marked(value)


# ------------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("options", "field"),
    [
        (DevClusterOptions(workers=-1), "workers"),
        (DevClusterOptions(racks=0), "racks"),
        (DevClusterOptions(workers=2, racks=3), "racks"),
        (DevClusterOptions(gpus_per_worker=-2), "gpus_per_worker"),
        (DevClusterOptions(ready_timeout_s=0), "ready_timeout_s"),
        (DevClusterOptions(worker_cpu="lots"), "worker_cpu"),
        (DevClusterOptions(worker_memory="-1Gi"), "worker_memory"),
        (DevClusterOptions(stop_grace="0s"), "stop_grace"),
        (DevClusterOptions(data_dir=Path("/proc/version/dev")), "data_dir"),
    ],
)
def test_invalid_options_are_rejected_with_the_field_named(
    options: DevClusterOptions, field: str
) -> None:
    with pytest.raises(ValueError, match=f"^{field}:"):
        options.check()
    lines: list[str] = []
    assert run_foreground(options, lines.append) == 2
    assert lines[-1].startswith(f"error: {field}:")


def test_workers_are_spread_over_racks_in_contiguous_blocks() -> None:
    cluster = DevCluster(DevClusterOptions(workers=5, racks=2, ephemeral_ports=True))
    try:
        assert cluster._initial_racks() == ["r1", "r1", "r1", "r2", "r2"]
        assert len(set(cluster.cluster_addresses)) == 3
    finally:
        cluster.stop()
    assert not cluster.data_dir.exists()


def test_a_busy_default_port_sends_the_cluster_to_free_ports() -> None:
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        try:
            holder.bind(("127.0.0.1", 7101))
            holder.listen()
        except OSError as exc:  # something else holds it: busy all the same
            if exc.errno != errno.EADDRINUSE:
                raise
        assert busy_default_port(DevClusterOptions(workers=1, racks=1)) == "127.0.0.1:7101"
        assert busy_default_port(SMALL) is None  # free ports asked for anyway
        assert DEFAULT_CLUSTER.split(",")[0] == "127.0.0.1:7101"
    finally:
        holder.close()


def test_a_second_dev_up_of_the_same_account_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    write_dev_profile(DevProfile(cluster=DEFAULT_CLUSTER, pid=os.getpid()))
    lines: list[str] = []
    assert run_foreground(SMALL, lines.append) == 2
    assert lines == [
        f"error: a dev cluster is already running (synctl dev up, pid {os.getpid()}, "
        f"{DEFAULT_CLUSTER}); stop it first, or use it"
    ]


# ------------------------------------------------------------------ clusters


@pytest.mark.integration
def test_a_job_runs_and_stop_leaves_no_process_behind(marker: str) -> None:
    with DevCluster(SMALL) as cluster, cluster.client(timeout_s=20) as client:
        nodes = {n.node_id: n for n in client.list_nodes()}
        assert sorted(nodes) == ["w1", "w2"]
        assert {tuple((t.level, t.value) for t in n.topology) for n in nodes.values()} == {
            (("block", "b1"), ("rack", "r1"), ("zone", "z1")),
            (("block", "b1"), ("rack", "r2"), ("zone", "z1")),
        }
        assert all(n.capacity.gpu == 2 for n in nodes.values())
        spec = pb.JobSpec(
            name="ranks",
            replicas=2,
            resources=pb.Resources(gpu=2),
            shell_command='echo "rank $RANK of $WORLD_SIZE"',
        )
        job_id = client.submit_job(spec).job_id
        job = wait_job(client, job_id, "SUCCEEDED")
        for member in job.attempt.members:
            # With a grant from the leader, over the cluster's TLS transport.
            text = cluster.read_log(client, job_id, member.rank)
            assert text == f"rank {member.rank} of 2\n"
        # Secure by default: the workers' log service and the replicas refuse plaintext
        # and callers without a grant.
        address = nodes[job.attempt.members[0].node_id].address
        with grpc.insecure_channel(address) as channel:
            stub = wpb_grpc.WorkerServiceStub(channel)  # type: ignore[no-untyped-call]
            with pytest.raises(grpc.RpcError) as plaintext:
                b"".join(c.data for c in stub.ReadLog(wpb.ReadLogRequest(job_id=job_id)))
        assert plaintext.value.code() is grpc.StatusCode.UNAVAILABLE
        node_id = job.attempt.members[0].node_id
        with cluster.transport.channel(address, worker=node_id) as channel:
            stub = wpb_grpc.WorkerServiceStub(channel)  # type: ignore[no-untyped-call]
            with pytest.raises(grpc.RpcError) as no_grant:
                b"".join(c.data for c in stub.ReadLog(wpb.ReadLogRequest(job_id=job_id)))
        assert no_grant.value.code() is grpc.StatusCode.PERMISSION_DENIED
        with (
            ClusterClient(cluster.cluster_addresses, timeout_s=2) as plain,
            pytest.raises(ClusterUnavailable),
        ):
            plain.list_nodes()

        # A gang still running when the cluster stops must not survive it.
        spec = pb.JobSpec(
            name="forever", replicas=2, resources=pb.Resources(gpu=1), shell_command="sleep 600"
        )
        job_id = client.submit_job(spec).job_id
        wait_job(client, job_id, "RUNNING")
        groups = cluster.process_groups
        # replicas, workers, and a supervisor and a member per rank
        wait_for("every process to be up", lambda: at_least(marked_processes(marker), 3 + 2 + 4))
        data_dir = cluster.data_dir
    after = cluster.process_groups
    assert groups <= after
    assert len(after) >= 3 + 2 + 2 * 2
    assert after & running_groups() == set()
    assert wait_no_marked_processes(marker, timeout_s=5) == []
    assert not data_dir.exists()
    cluster.stop()  # idempotent


@pytest.mark.integration
def test_a_killed_leader_is_replaced_and_restarts_as_a_follower(
    marker: str, tmp_path: Path
) -> None:
    options = DevClusterOptions(
        workers=1, racks=1, gpus_per_worker=1, ephemeral_ports=True, data_dir=tmp_path / "dev"
    )
    with DevCluster(options) as cluster:
        old = cluster.leader_id()
        assert old is not None
        cluster.kill_replica(old)
        assert not cluster.replica(old).alive
        new = cluster.wait_for_leader(timeout_s=30)
        assert new != old
        cluster.restart_replica(old)
        status = wait_for(
            "the old leader to rejoin as a follower",
            lambda: (lambda s: s if s.role == "follower" and s.leader_id == new else None)(
                cluster.replica_status(cluster.replica(old))
            ),
        )
        assert status.leader_id == new
        worker = cluster.add_worker(rack="r9", gpus=3)
        with cluster.client() as client:
            node = next(n for n in client.list_nodes() if n.node_id == worker.node_id)
        assert node.capacity.gpu == 3
        assert ("rack", "r9") in [(t.level, t.value) for t in node.topology]
    assert wait_no_marked_processes(marker, timeout_s=5) == []
    # A data directory the caller gave is kept, with every process's log.
    logs = sorted(p.name for p in (tmp_path / "dev" / "logs").iterdir())
    assert logs == [
        "scheduler-a.log",
        "scheduler-b.log",
        "scheduler-c.log",
        "worker-w1.log",
        "worker-w2.log",
    ]


FOREGROUND = """
import sys
from pathlib import Path
from synapse_ha.local.devoptions import DevClusterOptions
from synapse_ha.local.foreground import run_foreground
options = DevClusterOptions(workers=2, racks=2, gpus_per_worker=1, ephemeral_ports=True)
sys.exit(run_foreground(options, lambda line: print(line, flush=True)))
"""


@pytest.mark.integration
def test_run_foreground_stops_everything_on_sigint(
    marker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    output = tmp_path / "out.txt"
    with open(output, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", FOREGROUND],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        text = wait_for(
            "the cluster to be ready",
            lambda: (lambda t: t if "ready; press Ctrl-C" in t else None)(output.read_text()),
            timeout_s=90,
        )
        exported = dict(
            line.removeprefix("export ").split("=", 1)
            for line in text.splitlines()
            if line.startswith("export ")
        )
        assert sorted(exported) == [
            "SYNAPSE_CA",
            "SYNAPSE_CERT",
            "SYNAPSE_CLUSTER",
            "SYNAPSE_KEY",
            "SYNAPSE_TOKEN_FILE",
        ]
        addresses = exported["SYNAPSE_CLUSTER"].split(",")
        assert len(addresses) == 3
        assert "w1" in text and "rack=r2" in text
        published = read_dev_profile()  # what synctl and Cluster.from_env find
        assert published is not None and published.addresses == addresses
        assert published.pid == process.pid
        assert published.token_file == Path(exported["SYNAPSE_TOKEN_FILE"])
        # What the printed lines give a user: the transport-only certificate and the
        # admin token.
        transport = Transport(
            TlsFiles(
                ca=Path(exported["SYNAPSE_CA"]),
                cert=Path(exported["SYNAPSE_CERT"]),
                key=Path(exported["SYNAPSE_KEY"]),
            )
        )
        token = Path(exported["SYNAPSE_TOKEN_FILE"]).read_text().strip()
        with ClusterClient(
            addresses, timeout_s=20, token=token, channel_factory=transport.channel
        ) as client:
            spec = pb.JobSpec(
                name="sleeper", replicas=2, resources=pb.Resources(gpu=1), shell_command="sleep 600"
            )
            job_id = client.submit_job(spec).job_id
            wait_job(client, job_id, "RUNNING")
        wait_for(
            "every process to be up", lambda: at_least(marked_processes(marker), 1 + 3 + 2 + 4)
        )

        os.kill(process.pid, signal.SIGINT)
        assert process.wait(timeout=60) == 0
        text = output.read_text()
        assert text.splitlines()[-1] == "stopped"
        assert not (tmp_path / "config" / "synapse" / "dev-cluster.json").exists()
        assert wait_no_marked_processes(marker, timeout_s=5) == []
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@pytest.mark.integration
def test_the_demo_passes_and_leaves_nothing_running(marker: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "synapse_ha.local.demo"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        start_new_session=True,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "FAIL" not in result.stdout
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("all ") and "checks passed" in last
    headings = ("waits", "joins", "topology.required: rack", "kill -9", "finish", "Who may do what")
    for heading in (*headings, "Summary", "alice may not cancel bob's job: PERMISSION_DENIED"):
        assert heading in result.stdout
    assert wait_no_marked_processes(marker, timeout_s=5) == []


@pytest.mark.integration
def test_an_insecure_cluster_speaks_plaintext_and_says_so(marker: str) -> None:
    options = DevClusterOptions(
        workers=1, racks=1, gpus_per_worker=1, ephemeral_ports=True, insecure=True
    )
    with DevCluster(options) as cluster:
        assert cluster.credentials is None
        assert not (cluster.data_dir / "credentials").exists()
        lines = describe(cluster)
        assert f"warning: {INSECURE_WARNING}" in lines
        assert [x for x in lines if x.startswith("export ")] == [
            f"export SYNAPSE_CLUSTER={cluster.cluster}"
        ]
        with ClusterClient(cluster.cluster_addresses, timeout_s=20) as plain:
            spec = pb.JobSpec(
                name="hello", replicas=1, resources=pb.Resources(gpu=1), shell_command="echo hi"
            )
            job_id = plain.submit_job(spec).job_id
            wait_job(plain, job_id, "SUCCEEDED")
            # No grant: an insecure cluster signs none, and its workers need none.
            assert cluster.read_log(plain, job_id, 0) == "hi\n"
        # synctl without any TLS settings reads the log the same way.
        result = CliRunner().invoke(
            cli,
            ["--cluster", cluster.cluster, "logs", job_id],
            env={"XDG_CONFIG_HOME": "/nonexistent", "SYNAPSE_CA": None, "SYNAPSE_CERT": None,
                 "SYNAPSE_KEY": None, "SYNAPSE_TOKEN": None, "SYNAPSE_TOKEN_FILE": None},
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        assert result.stdout == "[rank 0] hi\n"
    assert wait_no_marked_processes(marker, timeout_s=5) == []
