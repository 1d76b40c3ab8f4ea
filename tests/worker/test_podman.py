"""Members in real containers through podman, on an image built locally from a static
busybox (no registry, no network pulls). Skipped, with the reason, where podman is
missing or cannot run containers on this machine."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from synapse_ha.core.desired import MemberKey
from synapse_ha.worker.images import ImageRuntime
from synapse_ha.worker.lease import LeaseFile
from tests.worker.conftest import MakeExecutor
from tests.worker.helpers import spec, wait_exit

IMAGE = "localhost/synapse-test-busybox:1"
BUSYBOX_TOOLS = ("sh", "cat", "echo", "sleep", "pwd", "head")
# Where the container manager may not raise resource limits (no CAP_SYS_RESOURCE, as in
# some VMs and nested containers), its defaults make the OCI runtime fail; limits below
# the current hard limits always work.
LOW_ULIMITS = "--ulimit nofile=1024:1024 --ulimit nproc=4096:4096"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def _busybox_image(podman: str, workdir: Path) -> str | None:
    """Import a one-binary image from the host's busybox; None, or why it failed."""
    busybox = shutil.which("busybox")
    if busybox is None:
        return "busybox is not installed (Debian: apt-get install busybox-static)"
    tarball = workdir / "rootfs.tar"
    with tarfile.open(tarball, "w") as tar:
        tar.add(busybox, arcname="bin/busybox")
        for tool in BUSYBOX_TOOLS:
            link = tarfile.TarInfo(f"bin/{tool}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            tar.addfile(link)
    done = subprocess.run(
        [podman, "import", str(tarball), IMAGE],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        return f"podman import failed: {_last_line(done.stderr)}"
    return None


@pytest.fixture(scope="module")
def podman_runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ImageRuntime]:
    """A runtime that demonstrably runs a container here: podman as is, then with low
    ulimits, then with runc as the OCI runtime (crun refuses cgroup v1/v2 hybrids)."""
    podman = shutil.which("podman")
    if podman is None:
        pytest.skip("podman is not installed (Debian: apt-get install podman)")
    failure = _busybox_image(podman, tmp_path_factory.mktemp("image"))
    if failure is not None:
        pytest.skip(failure)
    candidates = [(podman, ""), (podman, LOW_ULIMITS)]
    if shutil.which("runc"):
        candidates += [(f"{podman} --runtime runc", ""), (f"{podman} --runtime runc", LOW_ULIMITS)]
    tried = []
    chosen: ImageRuntime | None = None
    for command, run_args in candidates:
        runtime = ImageRuntime.parse(command, run_args)
        argv = [*runtime.command, "run", "--rm", *runtime.run_args, IMAGE, "/bin/sh", "-c", "true"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode == 0:
            chosen = runtime
            break
        tried.append(f"`{shlex.join(argv)}`: {_last_line(done.stderr)}")
    try:
        if chosen is None:
            pytest.skip("podman cannot run containers here: " + "; ".join(tried))
        yield chosen
    finally:
        subprocess.run([podman, "rmi", "-f", IMAGE], capture_output=True, timeout=120, check=False)


def container_exists(runtime: ImageRuntime, key: MemberKey) -> bool:
    name = ImageRuntime.container_name(key)
    done = subprocess.run(
        [*runtime.command, "ps", "-a", "-q", "--filter", f"name=^{name}$"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return bool(done.stdout.strip())


def test_a_member_runs_in_a_podman_container(
    podman_runtime: ImageRuntime, make_executor: MakeExecutor
) -> None:
    executor = make_executor(image_runtime=podman_runtime)
    command = (
        "echo rank=$RANK of=$WORLD_SIZE job=$SYNAPSE_JOB_ID token=$SYNAPSE_FENCING_TOKEN "
        "hosts=$SYNAPSE_MEMBER_HOSTS hf=$HF_HOME; pwd; "
        "cat /sys/fs/cgroup/memory.max 2>/dev/null "
        "|| cat /sys/fs/cgroup/memory/memory.limit_in_bytes"
    )
    member = executor.start(
        spec(
            command,
            job_id="job-9",
            token=12,
            rank=1,
            world_size=2,
            image=IMAGE,
            env=(("HF_HOME", "/data/hf"),),
            workdir="/bin",
            memory_mib=64,
        )
    )
    try:
        code, detail = wait_exit(executor, member.key, 60.0)
        output = (member.dir / "output.log").read_text()
        assert (code, detail) == (0, ""), output
        assert output.splitlines() == [
            "rank=1 of=2 job=job-9 token=12 hosts=127.0.0.1,127.0.0.1 hf=/data/hf",
            "/bin",
            str(64 * 1024 * 1024),
        ]
        assert not container_exists(podman_runtime, member.key)  # --rm
    finally:
        subprocess.run(
            [*podman_runtime.command, "rm", "-f", ImageRuntime.container_name(member.key)],
            capture_output=True,
            timeout=60,
            check=False,
        )


def test_a_lost_lease_stops_the_container(
    podman_runtime: ImageRuntime, make_executor: MakeExecutor
) -> None:
    # busybox sleep as the container's PID 1 ignores SIGTERM, and killing the podman
    # client alone leaves the container running under conmon: the supervisor must stop
    # the container by name.
    executor = make_executor(image_runtime=podman_runtime)
    member = executor.start(spec(("sleep", "600"), image=IMAGE))
    try:
        deadline = time.monotonic() + 60
        while not container_exists(podman_runtime, member.key):
            assert time.monotonic() < deadline, (member.dir / "output.log").read_text()
            assert not executor.poll(), (member.dir / "output.log").read_text()
            time.sleep(0.1)
        LeaseFile(executor.lease_path).revoke()
        code, detail = wait_exit(executor, member.key, 60.0)
        assert detail == "fenced: the node's lease expired"
        assert code != 0
        assert not container_exists(podman_runtime, member.key)
    finally:
        subprocess.run(
            [*podman_runtime.command, "rm", "-f", ImageRuntime.container_name(member.key)],
            capture_output=True,
            timeout=60,
            check=False,
        )
