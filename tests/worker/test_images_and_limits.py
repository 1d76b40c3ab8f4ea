"""Container images and CPU/memory limits: what the control plane sends reaches the
member (image, env, command through the runtime; cgroup v2 limits where writable)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from synapse_ha.core.desired import DesiredMember, LaunchSpec, MemberKey
from synapse_ha.core.model import JobSpec, Resources
from synapse_ha.rpc.from_proto import desired_from_proto
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.to_proto import desired_to_proto
from synapse_ha.worker.agent import Agent
from synapse_ha.worker.cgroups import CgroupLimits, cgroup_limits, probe_cgroups
from synapse_ha.worker.images import ImageRuntime, NoImageRuntime
from synapse_ha.worker.launch import member_argv
from tests.integration.cluster import wait_for
from tests.leftovers import SESSION_VARIABLE
from tests.worker import fake_runtime
from tests.worker.conftest import MakeExecutor
from tests.worker.helpers import FakeClock, Fifo, desired_member, spec, wait_exit
from tests.worker.test_agent import FakeControl

IMAGE = "registry.example/train:24.01"
SECTION_5 = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "NNODES",
    "NODE_RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "CUDA_VISIBLE_DEVICES",
    "SYNAPSE_JOB_ID",
    "SYNAPSE_ATTEMPT",
    "SYNAPSE_FENCING_TOKEN",
    "SYNAPSE_MEMBER_HOSTS",
    "SYNAPSE_MEMBER_GENERATION",
)


# ------------------------------------------------------------ the wire, both ways


def test_image_cpu_and_memory_travel_in_the_desired_member() -> None:
    job_spec = JobSpec(
        name="train",
        replicas=2,
        resources=Resources(cpu_milli=1500, memory_mib=2048, gpu=1),
        command=("python", "train.py"),
        shell=False,
        workdir="/data/run1",
        image=IMAGE,
    )
    desired = DesiredMember(
        job_id="job-7",
        attempt=3,
        fencing_token=41,
        rank=1,
        world_size=2,
        local_rank=0,
        local_world_size=1,
        gpus=(3,),
        master_addr="10.0.0.1:7070",
        master_port=29500,
        member_hosts=("10.0.0.1:7070", "10.0.0.2:7070"),
        spec=LaunchSpec.of(job_spec),
    )
    # Through bytes, as a heartbeat reply carries it.
    wire = type(desired_to_proto(desired)).FromString(desired_to_proto(desired).SerializeToString())
    launch = desired_from_proto(wire)
    resources = launch.spec.resources
    assert (launch.spec.image, resources.cpu_milli, resources.memory_mib) == (IMAGE, 1500, 2048)
    assert (launch.spec.command, launch.spec.shell, launch.spec.workdir) == (
        ("python", "train.py"),
        False,
        "/data/run1",
    )
    assert launch.key == MemberKey("job-7", 41, 1)
    on_host = JobSpec(name="h", replicas=1, resources=Resources(0, 0, 0), command=("true",))
    host_only = desired_to_proto(dataclasses.replace(desired, spec=LaunchSpec.of(on_host)))
    assert (host_only.image, host_only.cpu_milli, host_only.memory_mib) == ("", 0, 0)


# -------------------------------------------------------------- the run command


def test_the_run_command_names_the_container_and_confines_it(tmp_path: Path) -> None:
    runtime = ImageRuntime.parse(
        "podman --runtime runc",
        "--ipc host",
        gpu_devices=True,
        cap_add=["net_raw", "CAP_SYS_NICE"],
        which={"podman": "/usr/bin/podman"}.get,
    )
    member = spec(
        "echo $RANK",
        job_id="job-7",
        token=41,
        rank=1,
        world_size=2,
        image=IMAGE,
        gpus=(2, 5),
        env=(("HF_HOME", "/data/hf"),),
        workdir="/data/run1",
        cpu_milli=1500,
        memory_mib=512,
    )
    argv = member_argv(member, runtime, None, tmp_path)
    assert argv == [
        "/usr/bin/podman",
        "--runtime",
        "runc",
        "run",
        "--ipc",
        "host",
        "--rm",
        "--name=synapse-job-7-41-1",
        "--network=host",
        f"--cidfile={tmp_path}/container/cid",
        f"--env-file={tmp_path}/container/env",
        "--security-opt=no-new-privileges",
        "--cap-drop=all",
        "--cap-add=NET_RAW",
        "--cap-add=SYS_NICE",
        "--device=nvidia.com/gpu=2",
        "--device=nvidia.com/gpu=5",
        "--cpus=1.500",
        "--memory=512m",
        "--workdir=/data/run1",
        IMAGE,
        "/bin/sh",
        "-c",
        "echo $RANK",
    ]
    # No variable travels on the command line: they are in the env file.
    assert not [word for word in argv if word.startswith(("--env=", "-e"))]
    assert runtime.stop_argvs(member.key) == [
        ["/usr/bin/podman", "--runtime", "runc", "kill", "synapse-job-7-41-1"],
        ["/usr/bin/podman", "--runtime", "runc", "rm", "-f", "synapse-job-7-41-1"],
    ]
    # Mock GPUs (no devices), no limits, no workdir: none of those flags.
    plain = member_argv(
        spec(("train", "--fast"), image=IMAGE, gpus=(0,)),
        ImageRuntime(("/usr/bin/docker",)),
        None,
        tmp_path,
    )
    assert not [w for w in plain if w.startswith(("--device", "--cpus", "--memory", "--workdir"))]
    assert plain[-3:] == [IMAGE, "train", "--fast"]


def test_the_runtime_is_found_once_by_absolute_path(tmp_path: Path) -> None:
    runtime = ImageRuntime.parse("true")
    assert os.path.isabs(runtime.command[0])
    assert os.access(runtime.command[0], os.X_OK)
    with pytest.raises(ValueError, match="absolute path"):
        ImageRuntime(("podman",))
    with pytest.raises(ValueError, match="not an executable"):
        ImageRuntime.parse("podman", which=lambda name: None)
    with pytest.raises(ValueError, match="not an executable"):
        ImageRuntime.parse(str(tmp_path / "no-such-runtime"))


@pytest.mark.parametrize(
    ("command", "run_args", "message"),
    [
        ("", "", "empty"),
        ("podman run", "", "without its subcommand"),
        ("podman run --rm {env} {image} {command}", "", "not a template"),
        ("podman 'unclosed", "", "image runtime"),
        ("podman", "--ipc 'unclosed", "image runtime"),
    ],
)
def test_a_bad_runtime_is_refused(command: str, run_args: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ImageRuntime.parse(command, run_args, which={"podman": "/usr/bin/podman"}.get)


@pytest.mark.parametrize(
    ("run_args", "message"),
    [
        ("--privileged", "--privileged is not allowed"),
        ("--privileged=true", "--privileged is not allowed"),
        ("--cap-add SYS_ADMIN", "--cap-add is not allowed"),
        ("--cap-add=ALL", "--cap-add is not allowed"),
        ("--security-opt seccomp=unconfined", "--security-opt is not allowed"),
        ("--security-opt=label=disable", "--security-opt is not allowed"),
        ("--user 0", "--user is not allowed"),
        ("--user=0:0", "--user is not allowed"),
        ("--userns=host", "--userns is not allowed"),
        ("--group-add=0", "--group-add is not allowed"),
        ("--env-host", "--env-host is not allowed"),
        ("--env LD_PRELOAD=/x.so", "--env is not allowed"),
        ("-u 0", "long form"),
        ("-v /:/host", "long form"),
        ("--volume /:/host", "may not mount /"),
        ("--volume=/etc/:/e:ro", "may not mount /etc/"),
        ("--volume /var/run/docker.sock:/s", "may not mount /var/run/docker.sock"),
        ("--mount type=bind,source=/,target=/host", "may not mount /"),
        ("--mount=type=bind,src=/root,dst=/r", "may not mount /root"),
    ],
)
def test_run_args_that_would_undo_the_confinement_are_refused(run_args: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ImageRuntime.parse("podman", run_args, which={"podman": "/usr/bin/podman"}.get)


def test_harmless_run_args_and_a_capability_allow_list_are_kept() -> None:
    runtime = ImageRuntime.parse(
        "podman",
        "--ipc host --shm-size=16g --ulimit memlock=-1:-1 --volume /data:/data "
        "--mount type=bind,source=/scratch,target=/scratch --device /dev/infiniband",
        cap_add=["IPC_LOCK"],
        which={"podman": "/usr/bin/podman"}.get,
    )
    assert runtime.cap_add == ("IPC_LOCK",)
    for bad in (["ALL"], ["CAP_EVERYTHING"], ["net raw"]):
        with pytest.raises(ValueError, match="not a Linux capability"):
            ImageRuntime.parse("podman", cap_add=bad, which={"podman": "/usr/bin/podman"}.get)


def test_an_image_without_a_runtime_is_a_typed_failure(tmp_path: Path) -> None:
    with pytest.raises(NoImageRuntime, match="no image runtime"):
        member_argv(spec("true", image=IMAGE), None)
    assert member_argv(spec("true"), None) == ["/bin/sh", "-c", "true"]


# ------------------------------------------------------- through a fake runtime


def test_a_member_with_an_image_runs_through_the_runtime(
    make_executor: MakeExecutor, tmp_path: Path
) -> None:
    fake = fake_runtime.install(tmp_path / "bin", IMAGE)
    runtime = ImageRuntime.parse(str(fake.path), "--ipc host", gpu_devices=True)
    executor = make_executor(image_runtime=runtime)
    member = executor.start(
        spec(
            "echo inside rank=$RANK gpus=$CUDA_VISIBLE_DEVICES hf=$HF_HOME",
            job_id="job-7",
            token=41,
            rank=1,
            world_size=2,
            image=IMAGE,
            gpus=(4, 6),
            env=(("HF_HOME", "/data/hf"),),
            # Exists only inside the image: the runtime client must not start there.
            workdir="/only/inside/the/image",
            cpu_milli=250,
            memory_mib=64,
        )
    )
    assert wait_exit(executor, member.key, 20.0) == (0, "")
    run = fake.run(ImageRuntime.container_name(member.key))
    argv = run["argv"]
    assert argv[:3] == ["run", "--ipc", "host"]
    assert argv[3:6] == ["--rm", "--name=synapse-job-7-41-1", "--network=host"]
    assert "--device=nvidia.com/gpu=4" in argv and "--device=nvidia.com/gpu=6" in argv
    assert argv[argv.index(IMAGE) :] == [
        IMAGE,
        "/bin/sh",
        "-c",
        "echo inside rank=$RANK gpus=$CUDA_VISIBLE_DEVICES hf=$HF_HOME",
    ]
    assert "--workdir=/only/inside/the/image" in argv
    assert "--cpus=0.250" in argv and "--memory=64m" in argv
    assert run["cwd"] == str(member.dir)
    variables = run["env_file"]["variables"]
    # The job's, the gang's and the one the executor passes through (member_env_passthrough).
    assert set(variables) == {"HF_HOME", SESSION_VARIABLE, *SECTION_5}
    assert variables["RANK"] == "1"
    assert variables["WORLD_SIZE"] == "2"
    assert variables["SYNAPSE_JOB_ID"] == "job-7"
    assert variables["SYNAPSE_FENCING_TOKEN"] == "41"
    assert variables["HF_HOME"] == "/data/hf"
    # The container sees only its two GPUs, numbered from 0.
    assert variables["CUDA_VISIBLE_DEVICES"] == "0,1"
    # The runtime's own environment is the fixed one: nothing of the job's.
    assert set(run["env"]) == {"PATH", "LANG", "HOME"}
    assert (member.dir / "output.log").read_text() == "inside rank=1 gpus=0,1 hf=/data/hf\n"
    # A member that ended on its own leaves no container to stop, and no env file.
    assert fake.stops() == []
    assert not (member.dir / "container").exists()


def test_the_agent_runs_what_the_leader_sends_through_the_runtime(
    make_executor: MakeExecutor, tmp_path: Path
) -> None:
    # The leader's projection of a core JobSpec naming an image, through the heartbeat
    # reply, the agent and the executor, to the runtime's argv and environment.
    job_spec = JobSpec(
        name="train",
        replicas=1,
        resources=Resources(cpu_milli=2000, memory_mib=128, gpu=0),
        command=("echo from-$SYNAPSE_JOB_ID",),
        image=IMAGE,
    )
    member = desired_member(job_spec, job_id="job-3", token=5, host="127.0.0.1:7070")
    clock = FakeClock()
    control = FakeControl(clock)
    control.desired = [desired_to_proto(member)]
    fake = fake_runtime.install(tmp_path / "bin", IMAGE)
    executor = make_executor(image_runtime=ImageRuntime.parse(str(fake.path)))
    agent = Agent(
        pb.RegisterNodeRequest(node_id="n1", address="127.0.0.1:7070"), control, executor, clock
    )
    assert "started 1 member(s)" in agent.step()
    key = MemberKey("job-3", 5, 0)
    assert wait_exit(executor, key, 20.0) == (0, "")
    argv = fake.run(ImageRuntime.container_name(key))["argv"]
    assert "--cpus=2.000" in argv and "--memory=128m" in argv
    assert argv[-4:] == [IMAGE, "/bin/sh", "-c", "echo from-$SYNAPSE_JOB_ID"]
    assert (executor.root / "job-3" / "a1.t5.r0" / "output.log").read_text() == "from-job-3\n"


def test_a_fenced_member_s_container_is_stopped(
    make_executor: MakeExecutor, tmp_path: Path
) -> None:
    # The lease runs out after a second: the supervisor kills the runtime client's group
    # and stops the container by name, since the runtime's monitor would keep it running.
    fake = fake_runtime.install(tmp_path / "bin", IMAGE)
    executor = make_executor(image_runtime=ImageRuntime.parse(str(fake.path)), lease_s=1.0)
    member = executor.start(spec("sleep 60", image=IMAGE))
    code, detail = wait_exit(executor, member.key, 20.0)
    assert code == 143  # the runtime client died of the SIGTERM
    assert detail == "fenced: the node's lease expired"
    name = ImageRuntime.container_name(member.key)
    assert [stop["argv"] for stop in fake.stops()] == [["kill", name], ["rm", "-f", name]]
    assert not (member.dir / "container").exists()


def test_the_env_file_is_gone_once_the_container_exists(
    make_executor: MakeExecutor, tmp_path: Path, fifo: Fifo
) -> None:
    fake = fake_runtime.install(tmp_path / "bin", IMAGE)
    executor = make_executor(image_runtime=ImageRuntime.parse(str(fake.path)))
    member = executor.start(
        spec(
            f"echo started > {fifo.path}; exec sleep 60",
            image=IMAGE,
            env=(("TOKEN", "s3cret"),),
        )
    )
    assert fifo.read_line(20.0) == "started"
    env_file = member.dir / "container" / "env"
    run = fake.run(ImageRuntime.container_name(member.key))
    # It was the agent's alone while the runtime read it ...
    assert run["env_file"]["path"] == str(env_file)
    assert (run["env_file"]["mode"], run["env_file"]["uid"]) == (0o600, os.geteuid())
    assert (run["env_file"]["dir_mode"], run["env_file"]["dir_uid"]) == (0o700, os.geteuid())
    assert run["env_file"]["variables"]["TOKEN"] == "s3cret"
    # ... and is removed once the runtime has created the container, while it runs.
    wait_for("the env file to go", lambda: not env_file.exists(), timeout_s=10)
    assert executor.running() == [member.key]
    executor.stop(member.key)
    wait_exit(executor, member.key, 20.0)
    assert not (member.dir / "container").exists()


def test_a_member_naming_an_image_without_a_runtime_says_so(make_executor: MakeExecutor) -> None:
    executor = make_executor()
    member = executor.start(spec("true", image=IMAGE))
    code, detail = wait_exit(executor, member.key, 20.0)
    assert code == 127
    assert "no image runtime" in detail
    assert IMAGE not in detail  # the job's own text stays out of the reason
    assert "no image runtime" in (member.dir / "output.log").read_text()


# -------------------------------------------------------------------- cgroups


@pytest.mark.parametrize(
    ("cpu_milli", "memory_mib", "expected"),
    [
        (1500, 512, CgroupLimits("150000 100000", str(512 * 1024 * 1024))),
        (1000, 1, CgroupLimits("100000 100000", "1048576")),
        (64000, 0, CgroupLimits("6400000 100000", "max")),
        (5, 0, CgroupLimits("1000 100000", "max")),  # the kernel's minimum quota
        (0, 0, CgroupLimits("max", "max")),
    ],
)
def test_cgroup_limit_values(cpu_milli: int, memory_mib: int, expected: CgroupLimits) -> None:
    assert cgroup_limits(cpu_milli, memory_mib) == expected


def test_a_hybrid_hierarchy_is_named_as_the_reason(tmp_path: Path) -> None:
    (tmp_path / "unified").mkdir()
    (tmp_path / "unified" / "cgroup.controllers").write_text("hugetlb\n")
    limiter, why = probe_cgroups(tmp_path)
    assert limiter is None
    assert "hybrid" in why


def test_a_member_runs_inside_its_limited_cgroup_on_a_real_hierarchy(
    make_executor: MakeExecutor,
) -> None:
    limiter, why = probe_cgroups(Path("/sys/fs/cgroup"))
    if limiter is None:
        pytest.skip(f"no writable cgroup v2 with cpu and memory here: {why}")
    executor = make_executor(cgroups=limiter)
    member = executor.start(spec("cat /proc/self/cgroup", cpu_milli=1500, memory_mib=64))
    name = f"{member.key.job_id}.t{member.key.fencing_token}.r{member.key.rank}"
    cgroup = limiter.parent / name
    try:
        assert wait_exit(executor, member.key, 20.0) == (0, "")
        assert (cgroup / "cpu.max").read_text().split() == ["150000", "100000"]
        assert (cgroup / "memory.max").read_text().strip() == str(64 * 1024 * 1024)
        inside = (member.dir / "output.log").read_text().strip()
        assert inside.endswith(f"/synapse/{name}"), inside
    finally:
        executor.mark_reported(member.key)
    assert not cgroup.exists()
