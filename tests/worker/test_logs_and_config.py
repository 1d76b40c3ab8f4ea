"""ReadLog over gRPC (with follow), and synapse-worker's configuration."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from synapse_ha.core.model import FEATURE_IMAGES
from synapse_ha.programs.worker import registration
from synapse_ha.programs.worker_config import ConfigError, load_config
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2 as wpb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2_grpc as wpb_grpc
from synapse_ha.security.bundle import ClusterCredentials
from synapse_ha.security.tls import TlsFiles
from synapse_ha.worker.logs import FollowSlots, add_worker_service, find_member_dir, read_chunks
from synapse_ha.worker.members import MemberExecutor
from tests.worker.conftest import MakeExecutor
from tests.worker.helpers import Fifo, spec


@pytest.fixture
def executor(make_executor: MakeExecutor) -> MemberExecutor:
    return make_executor("logs")


@pytest.fixture
def log_stub(executor: MemberExecutor) -> Iterator[wpb_grpc.WorkerServiceStub]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    add_worker_service(server, executor.root)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield wpb_grpc.WorkerServiceStub(channel)  # type: ignore[no-untyped-call]
    finally:
        channel.close()
        server.stop(grace=None).wait(5)


def read_all(stub: wpb_grpc.WorkerServiceStub, **request: object) -> list[wpb.LogChunk]:
    return list(stub.ReadLog(wpb.ReadLogRequest(**request), timeout=20))


def test_read_log_follows_a_running_member_to_its_end(
    executor: MemberExecutor, log_stub: wpb_grpc.WorkerServiceStub, fifo: Fifo, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    gate_fifo = Fifo(gate)  # the member blocks reading it until the test writes
    member = executor.start(
        spec(f"echo first; echo up > {fifo.path}; read line < {gate}; echo second", job_id="lj")
    )
    fifo.read_line()
    chunks: list[wpb.LogChunk] = []
    follower = threading.Thread(
        target=lambda: chunks.extend(read_all(log_stub, job_id="lj", rank=0, follow=True))
    )
    follower.start()
    with open(gate, "w") as g:
        g.write("go\n")
    follower.join(timeout=20)
    gate_fifo.close()
    assert not follower.is_alive()
    assert b"".join(c.data for c in chunks) == b"first\nsecond\n"
    assert chunks[-1].eof
    assert member.shim is not None
    member.shim.wait(timeout=10)


def test_read_log_offsets_and_attempts(
    executor: MemberExecutor, log_stub: wpb_grpc.WorkerServiceStub
) -> None:
    for attempt, token in ((1, 3), (2, 8)):
        m = executor.start(spec(f"echo attempt-{attempt}", attempt=attempt, token=token))
        assert m.shim is not None
        m.shim.wait(timeout=10)
    newest = read_all(log_stub, job_id="job-1", rank=0)
    assert b"".join(c.data for c in newest) == b"attempt-2\n"
    assert newest[-1].eof
    first = read_all(log_stub, job_id="job-1", rank=0, attempt=1, offset=-2)
    assert first[0].data == b"1\n"
    assert first[0].offset == len(b"attempt-1\n") - 2
    small = read_all(log_stub, job_id="job-1", rank=0, attempt=1, max_bytes=4)
    assert [c.data for c in small if c.data] == [b"atte", b"mpt-", b"1\n"]
    with pytest.raises(grpc.RpcError) as err:
        read_all(log_stub, job_id="job-1", rank=5)
    assert err.value.code() is grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as err:
        read_all(log_stub, job_id="../etc", rank=0)
    assert err.value.code() is grpc.StatusCode.NOT_FOUND


def test_read_chunks_without_follow_stops_at_the_current_end(tmp_path: Path) -> None:
    mdir = tmp_path / "a1.t1.r0"
    mdir.mkdir()
    (mdir / "output.log").write_bytes(b"partial")
    waits: list[float] = []
    chunks = list(read_chunks(mdir, 0, 0, False, lambda: True, waits.append))
    assert [(c.data, c.eof) for c in chunks] == [(b"partial", False)]
    assert waits == []
    assert find_member_dir(tmp_path, "missing", 0, 0) is None


# ----------------------------------------------------------------------- config


# Where TLS is beside the point the tests run --insecure; the TLS tests below use real
# files from a ClusterCredentials.
BASE = ["--scheduler", "127.0.0.1:1", "--no-cgroups", "--insecure"]
NO_TLS = ["--scheduler", "127.0.0.1:1", "--no-cgroups"]


def test_flags_make_a_registration(tmp_path: Path) -> None:
    config = load_config(
        [
            *BASE,
            "--scheduler",
            "127.0.0.1:2,127.0.0.1:3",
            "--data-dir",
            str(tmp_path),
            "--node-id",
            "gpu-7",
            "--topology",
            "zone=z1,block=b1,rack=r3",
            "--cpu",
            "500m",
            "--memory",
            "2Gi",
            "--mock-gpus",
            "4",
            "--mock-nvlink",
            "0-1,2-3",
            "--image-runtime",
            "/bin/sh",
            "--image-run-args",
            "--ipc host",
        ]
    )
    assert (config.image_runtime, config.image_run_args) == ("/bin/sh", "--ipc host")
    assert config.schedulers == ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")
    request = registration(config, "10.1.1.7:7070")
    assert request.node_id == "gpu-7"
    assert request.address == "10.1.1.7:7070"
    assert (request.capacity.cpu_milli, request.capacity.memory_mib) == (500, 2048)
    assert request.capacity.gpu == 4
    assert [list(i.gpus) for i in request.gpu_islands] == [[0, 1], [2, 3]]
    assert [(t.level, t.value) for t in request.topology] == [
        ("block", "b1"),
        ("rack", "r3"),
        ("zone", "z1"),
    ]
    assert FEATURE_IMAGES in request.features


def test_a_node_without_an_image_runtime_does_not_offer_images(tmp_path: Path) -> None:
    config = load_config([*BASE, "--data-dir", str(tmp_path), "--mock-gpus", "0"])
    assert FEATURE_IMAGES not in registration(config, "h:1").features


def test_toml_configuration(tmp_path: Path) -> None:
    tls = ClusterCredentials.ensure(tmp_path / "creds").worker_tls("n9")
    path = tmp_path / "worker.toml"
    path.write_text(
        f'schedulers = ["127.0.0.1:9"]\ndata_dir = "{tmp_path}"\nnode_id = "n9"\n'
        'topology = "rack=r1"\nmock_gpus = 2\nlease_ttl = "2s"\nheartbeat_interval = "500ms"\n'
        f'[tls]\nca = "{tls.ca}"\ncert = "{tls.cert}"\nkey = "{tls.key}"\n'
    )
    config = load_config(["--config", str(path), "--node-id", "from-flag"])
    assert config.node_id == "from-flag"
    assert config.schedulers == ("127.0.0.1:9",)
    assert config.mock_gpus == 2
    assert (config.heartbeat_interval_s, config.lease_ttl_s) == (0.5, 2.0)
    assert config.tls == tls


def test_tls_files_come_from_flags_or_the_file_and_flags_win(tmp_path: Path) -> None:
    creds = ClusterCredentials.ensure(tmp_path / "creds")
    mine, other = creds.worker_tls("n1"), creds.worker_tls("n2")
    path = tmp_path / "worker.toml"
    path.write_text(f'[tls]\nca = "{mine.ca}"\ncert = "{mine.cert}"\nkey = "{mine.key}"\n')
    args = [*NO_TLS, "--data-dir", str(tmp_path / "d"), "--config", str(path)]
    assert load_config(args).tls == mine
    flagged = load_config([*args, "--tls-cert", str(other.cert), "--tls-key", str(other.key)])
    assert flagged.tls == TlsFiles(ca=mine.ca, cert=other.cert, key=other.key)
    assert load_config([*NO_TLS, "--data-dir", str(tmp_path / "d"), "--insecure"]).tls is None


def test_a_worker_without_tls_material_or_insecure_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--tls-ca, --tls-cert, --tls-key not given") as err:
        load_config([*NO_TLS, "--data-dir", str(tmp_path)])
    assert "--insecure" in str(err.value)
    tls = ClusterCredentials.ensure(tmp_path / "creds").worker_tls("n1")
    partial = ["--tls-ca", str(tls.ca), "--tls-cert", str(tls.cert)]
    with pytest.raises(ConfigError, match="--tls-key not given"):
        load_config([*NO_TLS, "--data-dir", str(tmp_path), *partial])


def test_insecure_and_tls_files_together_are_refused(tmp_path: Path) -> None:
    tls = ClusterCredentials.ensure(tmp_path / "creds").worker_tls("n1")
    with pytest.raises(ConfigError, match="exclude each other"):
        load_config([*BASE, "--data-dir", str(tmp_path), *["--tls-ca", str(tls.ca)]])


def test_tls_files_that_do_not_fit_are_refused_naming_the_file(tmp_path: Path) -> None:
    creds = ClusterCredentials.ensure(tmp_path / "creds")
    one, two = creds.worker_tls("n1"), creds.worker_tls("n2")
    args = [*NO_TLS, "--data-dir", str(tmp_path), "--tls-ca", str(one.ca)]
    with pytest.raises(ConfigError, match=f"{two.key} is not the private key of {one.cert}"):
        load_config([*args, "--tls-cert", str(one.cert), "--tls-key", str(two.key)])
    missing = tmp_path / "absent.pem"
    with pytest.raises(ConfigError, match=f"cannot read TLS file {missing}"):
        load_config([*args, "--tls-cert", str(missing), "--tls-key", str(one.key)])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data-dir", "/tmp/x"], "scheduler address is required"),
        ([*BASE], "data directory is required"),
        ([*BASE, "--data-dir", "{tmp}", "--topology", "rack"], "LEVEL=VALUE"),
        ([*BASE, "--data-dir", "{tmp}", "--cpu", "lots"], "--cpu"),
        ([*BASE, "--data-dir", "{tmp}", "--memory", "12 parsecs"], "--memory"),
        ([*BASE, "--data-dir", "{tmp}", "--mock-nvlink", "all"], "needs --mock-gpus"),
        ([*BASE, "--data-dir", "{tmp}", "--mock-gpus", "2", "--mock-nvlink", "0-5"], "outside"),
        ([*BASE, "--data-dir", "{tmp}", "--image-runtime", "podman run"], "without its subcommand"),
        (
            [*BASE, "--data-dir", "{tmp}", "--image-runtime", "x {image} {command}"],
            "not a template",
        ),
        ([*BASE, "--data-dir", "{tmp}", "--image-runtime", "/no/such/podman"], "not an executable"),
        ([*BASE, "--data-dir", "{tmp}", "--image-run-args", "--ipc host"], "needs --image-runtime"),
        ([*BASE, "--data-dir", "{tmp}", "--image-cap-add", "NET_RAW"], "needs --image-runtime"),
        ([*BASE, "--data-dir", "{tmp}", "--rootless-runtime"], "needs --image-runtime"),
        (
            [*BASE, "--data-dir", "{tmp}", "--image-runtime", "true", "--image-cap-add", "ALL"],
            "not a Linux capability",
        ),
        (
            [*BASE, "--data-dir", "{tmp}", "--image-runtime", "true", "--image-run-args=-u 0"],
            "long form",
        ),
        (
            [
                *BASE,
                *("--data-dir", "{tmp}", "--run-as", "agent"),
                *("--image-runtime", "true", "--rootless-runtime"),
            ],
            "needs --run-as owner",
        ),
        ([*BASE, "--data-dir", "{tmp}", "--lease-ttl", "1s"], "must exceed"),
        (["--scheduler", "nohost", "--data-dir", "{tmp}"], "not HOST:PORT"),
        ([*BASE, "--data-dir", "/proc/forbidden"], "not writable"),
    ],
)
def test_bad_configuration_is_explained(tmp_path: Path, args: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config([a.replace("{tmp}", str(tmp_path)) for a in args])


def test_the_container_options_come_from_flags_or_the_file(tmp_path: Path) -> None:
    path = tmp_path / "worker.toml"
    path.write_text(
        'image_runtime = "true"\nimage_cap_add = ["net_raw"]\nrootless_runtime = true\n'
    )
    args = [*BASE, "--data-dir", str(tmp_path / "data"), "--config", str(path)]
    config = load_config([*args, "--run-as", "owner"], {}, euid=0)
    assert config.image is not None
    assert os.path.isabs(config.image.command[0])  # found once, at start
    assert (config.image.cap_add, config.image.rootless) == (("NET_RAW",), True)
    both = load_config([*args, "--run-as", "owner", "--image-cap-add", "IPC_LOCK"], {}, euid=0)
    assert both.image is not None and both.image.cap_add == ("IPC_LOCK", "NET_RAW")
    path.write_text('image_runtime = "true"\nimage_cap_add = "NET_RAW"\n')
    with pytest.raises(ConfigError, match="image_cap_add: must be an array"):
        load_config(args, {}, euid=0)


def test_follow_slots_bound_each_identity_and_the_node_and_free_on_release() -> None:
    slots = FollowSlots(per_identity=1, total=2)
    assert slots.acquire("u") is None
    refused = slots.acquire("u")
    assert refused is not None and "u follows 1 logs" in refused.message
    assert slots.acquire(None) is None  # a replica: bound by the total only
    refused = slots.acquire("v")
    assert refused is not None and "2 logs are followed" in refused.message
    slots.release("u")
    assert slots.acquire("v") is None
    refused = slots.acquire("u")  # its own slot was given back: only the node is full
    assert refused is not None and "2 logs are followed" in refused.message
    slots.release(None)
    assert slots.acquire("u") is None
