"""Attacks of a plain ``user`` token on the member launch path, on real processes: a TLS
replica and a worker agent run as root with ``--run-as owner`` and an image runtime.
Each test is the attack: the attacker (``mallory``, a user token whose name is a local
account) submits a job, through the real API, that tries to become root or another user
on the worker; the test asserts the refusal and that nothing changed.

podman is absent here: the worker's image runtime is a fake ``podman`` on the agent's
``PATH`` (:mod:`tests.worker.fake_runtime`) that records its exact argv, environment and
env file, then runs the container's command on the host with the ids ``--user`` names.

The tests that need the worker as root with temporary accounts (made with useradd and
removed at teardown) run when the tests run as root, as in CI, and are skipped
otherwise; the refusals at submit and in the worker's own check run anywhere.
"""

from __future__ import annotations

import grp
import json
import os
import secrets
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from synapse_ha.core.desired import MemberKey
from synapse_ha.core.model import JobSpec, Resources
from synapse_ha.local.process import Worker
from synapse_ha.programs import worker as worker_main
from synapse_ha.rpc.errors import Reason, RpcFailure, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.to_proto import desired_to_proto
from synapse_ha.worker.accounts import local_account
from synapse_ha.worker.agent import Agent
from synapse_ha.worker.environment import FIXED_PATH
from synapse_ha.worker.images import ImageRuntime
from synapse_ha.worker.lease import LeaseFile
from synapse_ha.worker.members import ExecutorSettings, MemberExecutor
from synapse_ha.worker.shim import WORKDIR_REFUSED
from tests.integration.cluster import wait_for
from tests.security.tenants import AS_ROOT, TenantNode, tenant_node
from tests.worker import fake_runtime
from tests.worker.helpers import FakeClock, desired_member, wait_exit
from tests.worker.test_agent import FakeControl

pytestmark = pytest.mark.integration

IMAGE = "registry.example/team/train:24.01"
needs_root = pytest.mark.skipif(
    not AS_ROOT,
    reason="runs the worker as root with members as temporary local accounts: needs root "
    "and useradd",
)
DONE = ("SUCCEEDED", "FAILED", "CANCELLED")
# What a job sets to take over a root process that would inherit its environment.
HIJACK_NAMES = ("PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "CONTAINERS_CONF", "PYTHONSTARTUP")


@dataclass
class World(TenantNode):
    worker: Worker | None = None
    runtime: fake_runtime.FakeRuntime | None = None

    def job_ids(self) -> set[str]:
        return {j.job_id for j in self.admin.list_jobs()}

    def finished(self, job_id: str, timeout_s: float = 30.0) -> pb.Job:
        def done() -> pb.Job | None:
            found = self.admin.get_job(job_id)
            return found if found.state in DONE else None

        return wait_for(f"job {job_id} to finish", done, timeout_s)

    def member_dir(self, job_id: str) -> Path:
        (found,) = (self.data_dir / "members" / job_id).iterdir()
        return found

    def output(self, job_id: str) -> str:
        return (self.member_dir(job_id) / "output.log").read_text()

    def container_of(self, done: pb.Job) -> str:
        """The container name of rank 0 of a job's last attempt."""
        return ImageRuntime.container_name(MemberKey(done.job_id, done.attempt.fencing_token, 0))


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    # The worker runs as root with members as the accounts: only as root.
    with tenant_node("synapse-attack-launch-", World, _start_worker_as_root) as w:
        yield w


def _start_worker_as_root(w: World) -> None:
    if AS_ROOT:
        _start_worker(w)


def _start_worker(w: World) -> None:
    fake_bin = w.root / "fake-bin"
    w.runtime = fake_runtime.install(fake_bin, IMAGE)
    launcher = w.cluster.launcher
    env = {**launcher.env, "PATH": f"{fake_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    # Set in the agent's own environment too: its supervisors must not carry it either.
    env["PYTHONSTARTUP"] = "/agent/startup.py"
    w.worker = launcher.worker(
        w.cluster.grpc_addresses,
        "w1",
        w.data_dir,
        extra=[
            "--run-as",
            "owner",
            "--image-runtime",
            "podman",  # found on the agent's PATH when it starts: the fake
            "--mock-gpus",
            "0",
            "--no-cgroups",
            "--stop-grace",
            "1s",
            "--fence-grace",
            "200ms",
        ],
        env=env,
    )
    launcher.start(w.worker)
    wait_for(
        "worker w1 to register",
        lambda: any(n.node_id == "w1" and n.status == "ready" for n in w.admin.list_nodes()),
        30.0,
    )


@pytest.fixture(scope="module")
def mallory(world: World) -> str:
    if not AS_ROOT:
        return "mallory"
    return world.accounts[0]


@pytest.fixture(scope="module")
def victim(world: World) -> str:
    return world.accounts[1]


def job(name: str, command: str, **fields: object) -> pb.JobSpec:
    env = fields.pop("env", {})
    return pb.JobSpec(
        name=name,
        replicas=1,
        resources=pb.Resources(cpu_milli=100, memory_mib=64, gpu=0),
        shell_command=command,
        env=[pb.EnvVar(name=k, value=v) for k, v in env.items()],  # type: ignore[attr-defined]
        **fields,  # type: ignore[arg-type]
    )


def refused(call: object) -> RpcFailure:
    with pytest.raises(grpc.RpcError) as err:
        call()  # type: ignore[operator]
    return failure_of(err.value)


# ------------------------------------------------------- the image, at submit


@pytest.mark.parametrize(
    "image",
    [
        "--privileged",
        "--user=0",
        "-v /:/host",
        "alpine --privileged",
        "alpine\n--privileged",
        "oci-archive:/root/secret.tar",
        "docker://alpine",
    ],
)
def test_an_image_that_is_a_runtime_option_is_refused_at_submit(
    world: World, mallory: str, image: str
) -> None:
    attacker = world.user(mallory)
    before = world.job_ids()
    failure = refused(lambda: attacker.submit_job(job("escape", "id -u", image=image)))
    assert failure.code is grpc.StatusCode.INVALID_ARGUMENT
    assert failure.reason is Reason.INVALID_FIELD
    assert failure.field == "image"
    assert "image reference" in failure.rule
    assert world.job_ids() == before


def test_values_that_cannot_reach_a_process_intact_are_refused_at_submit(
    world: World, mallory: str
) -> None:
    # An env file is lines of NAME=VALUE: a line break would smuggle in another line.
    attacker = world.user(mallory)
    before = world.job_ids()
    smuggled = job("smuggle", "true", image=IMAGE, env={"A": "x\nLD_PRELOAD=/tmp/evil.so"})
    failure = refused(lambda: attacker.submit_job(smuggled))
    assert (failure.reason, failure.field) == (Reason.INVALID_FIELD, "env.A")
    nul = job("nul", "true\x00rm -rf /")
    assert refused(lambda: attacker.submit_job(nul)).field == "command"
    assert world.job_ids() == before


# ------------------------------------------- the image, in the worker's own check


@pytest.mark.parametrize(
    "image", ["--privileged", "--user=0", "-v /:/host", "oci-archive:/root/x.tar", "a\n-v"]
)
def test_a_spec_that_bypassed_admission_never_reaches_the_runtime(
    tmp_path: Path, image: str
) -> None:
    # A desired member as a compromised or buggy control plane would send it: the worker
    # checks the image again and never hands it to the runtime.
    fake = fake_runtime.install(tmp_path / "bin", "never-matches")
    lease = LeaseFile(tmp_path / "lease")
    lease.write(time.monotonic() + 3600)
    executor = MemberExecutor(
        tmp_path / "data",
        lease.path,
        ExecutorSettings(fence_grace_s=0.2),
        image_runtime=ImageRuntime.parse(str(fake.path)),
    )
    try:
        spec = JobSpec(
            name="escape",
            replicas=1,
            resources=Resources(0, 0, 0),
            command=("id -u",),
            image=image,
        )
        member = desired_member(spec, job_id="job-1", token=3)
        clock = FakeClock()
        control = FakeControl(clock)
        control.desired = [desired_to_proto(member)]
        agent = Agent(
            pb.RegisterNodeRequest(node_id="n1", address="127.0.0.1:7070"),
            control,
            executor,
            clock,
        )
        agent.step()
        key = MemberKey("job-1", 3, 0)
        code, detail = wait_exit(executor, key, 20.0)
        assert not (tmp_path / "bin" / "runs").exists()  # the runtime never ran
        assert fake.stops() == []
        assert (code, detail) == (127, "could not exec: the job's image is not an image reference")
    finally:
        executor.kill_all("test teardown")


# ----------------------------------------------------------- the runtime, as root


@needs_root
def test_job_variables_never_reach_the_container_runtime(world: World, mallory: str) -> None:
    # mallory's own podman, first on her PATH; the variables that would make a root
    # process load or read her files.
    evil = world.root / "mallory-bin"
    evil.mkdir()
    pwned = world.root / "pwned"
    (evil / "podman").write_text(f"#!/bin/sh\nid -u > {pwned}\nexit 0\n")
    (evil / "podman").chmod(0o755)
    hijack = {
        "PATH": f"{evil}:/usr/bin:/bin",
        "LD_PRELOAD": str(evil / "evil.so"),
        "LD_LIBRARY_PATH": str(evil),
        "CONTAINERS_CONF": str(evil / "containers.conf"),
        "PYTHONSTARTUP": str(evil / "startup.py"),
    }
    attacker = world.user(mallory)
    job_id = attacker.submit_job(
        job("hijack", 'echo "uid=$(/usr/bin/id -u)"', image=IMAGE, env=hijack)
    ).job_id
    done = world.finished(job_id)
    assert done.state == "SUCCEEDED", (done.reason, world.cluster.logs())
    # Nothing of mallory's ran as root: her podman never ran at all.
    assert not pwned.exists()
    assert world.runtime is not None
    run = world.runtime.run(world.container_of(done))
    # The runtime (root) got the fixed environment, by absolute path ...
    assert run["uid"] == 0
    assert set(run["env"]) == {"PATH", "LANG", "HOME"}
    assert run["env"]["PATH"] == FIXED_PATH
    assert not {k for k in run["env"] if k in HIJACK_NAMES and run["env"][k] in hijack.values()}
    # ... while the job's variables reached the container, which runs as mallory.
    assert {k: run["env_file"]["variables"][k] for k in hijack} == hijack
    account = local_account(mallory)
    assert account is not None
    assert f"uid={account.uid}" in world.output(job_id)


@needs_root
def test_containers_run_confined_as_their_owner(world: World, mallory: str) -> None:
    attacker = world.user(mallory)
    job_id = attacker.submit_job(job("confined", "true", image=IMAGE)).job_id
    done = world.finished(job_id)
    assert done.state == "SUCCEEDED"
    assert world.runtime is not None
    argv = world.runtime.run(world.container_of(done))["argv"]
    account = local_account(mallory)
    assert account is not None
    options = argv[: argv.index(IMAGE)]
    assert "--security-opt=no-new-privileges" in options
    assert "--cap-drop=all" in options
    assert f"--user={account.uid}:{account.gid}" in options
    assert not [o for o in options if o.startswith(("--privileged", "--cap-add", "--userns"))]
    assert [o for o in options if o.startswith("--user")] == [f"--user={account.uid}:{account.gid}"]


@needs_root
def test_the_env_file_is_root_only_and_gone_once_the_member_ended(
    world: World, mallory: str
) -> None:
    attacker = world.user(mallory)
    job_id = attacker.submit_job(
        job("env-file", "true", image=IMAGE, env={"API_KEY": "mallory-key"})
    ).job_id
    done = world.finished(job_id)
    assert done.state == "SUCCEEDED"
    assert world.runtime is not None
    seen = world.runtime.run(world.container_of(done))["env_file"]
    assert (seen["mode"], seen["uid"]) == (0o600, 0)
    assert (seen["dir_mode"], seen["dir_uid"]) == (0o700, 0)
    assert seen["variables"]["API_KEY"] == "mallory-key"
    assert not Path(seen["path"]).exists()
    assert not Path(seen["path"]).parent.exists()


# ------------------------------------------------------- workdir, as root


@needs_root
def test_a_workdir_the_owner_cannot_enter_fails_like_a_missing_one(
    world: World, mallory: str
) -> None:
    private = world.root / "root-only"
    (private / "inner").mkdir(parents=True)
    (private / "inner" / "secret.txt").write_text("root's\n")
    private.chmod(0o700)
    attacker = world.user(mallory)
    hidden = attacker.submit_job(job("peek", "pwd; ls", workdir=str(private / "inner"))).job_id
    missing = attacker.submit_job(
        job("peek2", "pwd; ls", workdir=str(world.root / "no-such-dir" / "inner"))
    ).job_id
    hidden_job, missing_job = world.finished(hidden), world.finished(missing)
    assert (hidden_job.state, missing_job.state) == ("FAILED", "FAILED")
    # The same sentence, naming no path: the reason says nothing about what exists.
    assert WORKDIR_REFUSED in hidden_job.reason
    assert hidden_job.reason == missing_job.reason
    assert str(world.root) not in hidden_job.reason
    # The member never ran in the directory.
    output = world.output(hidden)
    assert "secret.txt" not in output and str(private) not in output


# ---------------------------------------- other members' files and the worker's


@needs_root
def test_a_member_cannot_read_or_change_what_is_not_its_own(
    world: World, mallory: str, victim: str
) -> None:
    # As users of one group ``users``: the two accounts share their primary group.
    assert local_account(mallory).gid == local_account(victim).gid  # type: ignore[union-attr]
    assert local_account(victim).gid == grp.getgrnam(world.group).gr_gid  # type: ignore[union-attr]
    secret = f"victim-secret-{secrets.token_hex(4)}"
    victim_job = (
        world.user(victim)
        .submit_job(job("victim", "echo victim-output", env={"VICTIM_SECRET": secret}))
        .job_id
    )
    assert world.finished(victim_job).state == "SUCCEEDED"
    victim_dir = world.member_dir(victim_job)
    members = world.data_dir / "members"
    lease = world.data_dir / "lease"
    key = world.cluster.credentials.worker_tls("w1").key  # type: ignore[union-attr]
    attempts = {
        "list-members": f"ls {members}",
        "list-victim-job": f"ls {members / victim_job}",
        "list-victim-dir": f"ls {victim_dir}",
        "read-victim-launch": f"cat {victim_dir / 'launch.json'}",
        "read-victim-log": f"cat {victim_dir / 'output.log'}",
        "read-victim-exit": f"cat {victim_dir / 'exit.json'}",
        "read-worker-key": f"cat {key}",
        "write-lease": f"echo 99999999999 > {lease}",
        "replace-lease": f"echo 99999999999 > {lease}.x && mv -f {lease}.x {lease}",
        "forge-own-member-record": 'echo "{}" > "$(dirname "$SYNAPSE_PREEMPT_FILE")/member.json"',
        "plant-own-link": 'ln -s /etc/shadow "$(dirname "$SYNAPSE_PREEMPT_FILE")/exit.json.new"',
        "read-own-launch": 'cat "$(dirname "$SYNAPSE_PREEMPT_FILE")/launch.json"',
    }
    probe = "\n".join(
        f"if ({command}) >/dev/null 2>&1; then echo ALLOWED {name}; else echo DENIED {name}; fi"
        for name, command in attempts.items()
    )
    lease_before = (lease.stat().st_uid, stat.S_IMODE(lease.stat().st_mode))
    records_before = {
        p.name: p.read_bytes() for p in victim_dir.iterdir() if p.is_file() and p.name != "reported"
    }
    attacker_job = world.user(mallory).submit_job(job("snoop", probe)).job_id
    assert world.finished(attacker_job).state == "SUCCEEDED"
    output = world.output(attacker_job)
    assert sorted(line for line in output.splitlines() if line.startswith("ALLOWED")) == []
    assert sorted(line.split()[1] for line in output.splitlines()) == sorted(attempts)
    assert secret not in output
    # Nothing changed: the victim's files, the lease (still the agent's, still renewed),
    # and the attacker's own records.
    assert {
        p.name: p.read_bytes() for p in victim_dir.iterdir() if p.is_file() and p.name != "reported"
    } == records_before
    assert (lease.stat().st_uid, stat.S_IMODE(lease.stat().st_mode)) == lease_before
    assert float(lease.read_text()) < 99999999999
    own = world.member_dir(attacker_job)
    assert not (own / "exit.json.new").exists()
    assert (own / "member.json").read_text() != "{}\n"
    # The modes that keep it so.
    assert stat.S_IMODE(members.stat().st_mode) == 0o711
    assert stat.S_IMODE(victim_dir.stat().st_mode) == 0o710
    for name in ("launch.json", "exit.json", "member.json", "shim.log"):
        assert stat.S_IMODE((victim_dir / name).stat().st_mode) == 0o600, name
    victim_log = (victim_dir / "output.log").stat()
    assert stat.S_IMODE(victim_log.st_mode) == 0o600
    assert victim_log.st_uid == local_account(victim).uid  # type: ignore[union-attr]
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


# -------------------------------------------------- the supervisor, as root


@needs_root
def test_the_supervisor_carries_none_of_the_jobs_variables(world: World, mallory: str) -> None:
    planted = {
        "LD_PRELOAD": "/tmp/mallory/evil.so",
        "LD_AUDIT": "/tmp/mallory/audit.so",
        "PYTHONSTARTUP": "/tmp/mallory/startup.py",
        "PYTHONPATH": "/tmp/mallory",
        "PYTHONINSPECT": "1",
        "GCONV_PATH": "/tmp/mallory",
        "GLIBC_TUNABLES": "glibc.malloc.check=3",
        "PATH": "/tmp/mallory:/usr/bin:/bin",
    }
    attacker = world.user(mallory)
    job_id = attacker.submit_job(job("linger", "exec sleep 60", env=planted)).job_id
    try:

        def running() -> Path | None:
            if not (world.data_dir / "members" / job_id).is_dir():
                return None
            found = world.member_dir(job_id)
            return found if (found / "member.json").exists() else None

        mdir = wait_for("the member to run", running, 30.0)
        shim_pid = _record_pid(mdir / "shim.json")
        # The record names the member's process group: in a PID namespace of its own, its
        # keeper (root, outside), whose child is the namespace's init (root), whose child
        # is the member.
        group = _record_pid(mdir / "member.json")
        chain = [group, *_descendants(group)]
        member_pid = chain[-1]
        fork_server = _parent_of(shim_pid)
        root_processes = [(shim_pid, "supervisor"), (fork_server, "fork server")]
        root_processes += [(pid, "member's keeper or init") for pid in chain[:-1]]
        for pid, who in root_processes:
            env = _environ(pid)
            assert _uid_of(pid) == 0, who
            carried = {k: v for k, v in env.items() if k in planted and v == planted[k]}
            assert carried == {}, who
            assert not [k for k in env if k.startswith(("LD_", "PYTHON", "GCONV", "GLIBC"))], who
            assert env.get("PATH") == FIXED_PATH, who
            assert "-I" in _cmdline(pid), who
        # The member itself runs as mallory, with what she set.
        account = local_account(mallory)
        assert account is not None
        assert _uid_of(member_pid) == account.uid
        assert _environ(member_pid)["LD_PRELOAD"] == planted["LD_PRELOAD"]
    finally:
        attacker.cancel_job(job_id)
    assert world.finished(job_id).state == "CANCELLED"


def _record_pid(path: Path) -> int:
    return int(json.loads(path.read_text())["pid"])


def _descendants(pid: int) -> list[int]:
    """The first child of ``pid``, its first child, and so on."""
    found: list[int] = []
    while children := Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        pid = int(children[0])
        found.append(pid)
    return found


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {k: v for k, _, v in pairs}


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def _uid_of(pid: int) -> int:
    return Path(f"/proc/{pid}").stat().st_uid


def _parent_of(pid: int) -> int:
    stat_line = Path(f"/proc/{pid}/stat").read_text()
    return int(stat_line[stat_line.rfind(")") + 2 :].split()[1])


# ------------------------------------------------- the shipped deployment


@needs_root
def test_a_worker_whose_members_share_its_account_says_so_at_start(world: World) -> None:
    launcher = world.cluster.launcher
    agent_mode = launcher.worker(
        world.cluster.grpc_addresses,
        "w-agent",
        world.root / "w-agent",
        extra=["--mock-gpus", "0", "--no-cgroups"],  # the launcher adds --run-as agent
    )
    launcher.start(agent_mode)
    try:
        node = wait_for(
            "worker w-agent to register",
            lambda: next((n for n in world.admin.list_nodes() if n.node_id == "w-agent"), None),
            30.0,
        )
        assert node.members_run_as == "agent:root"
        log = agent_mode.log_tail(20_000)
        warnings = [line for line in log.splitlines() if " WARNING " in line]
        assert any("shares that one account" in line for line in warnings), log
        assert any("every member runs as root" in line for line in warnings), log
    finally:
        agent_mode.stop()


@pytest.mark.parametrize(
    "run_args",
    [
        "--privileged",
        "--cap-add SYS_ADMIN",
        "--security-opt seccomp=unconfined",
        "--user 0",
        "--volume /:/host",
        "-v /:/host",
    ],
)
def test_a_worker_refuses_run_options_that_would_undo_the_confinement(
    tmp_path: Path, run_args: str
) -> None:
    data = tmp_path / "data"
    argv = [
        "--scheduler",
        "127.0.0.1:1",
        "--insecure",
        "--data-dir",
        str(data),
        "--image-runtime",
        "true",
        f"--image-run-args={run_args}",
    ]
    with pytest.raises(worker_main.ConfigError, match=r"is not allowed|long form|may not mount"):
        worker_main.load_config(argv, {})
