"""Members run as their owner through the real supervisor, with a temporary local account
(these tests need root: they create and remove accounts with useradd/userdel)."""

from __future__ import annotations

import grp
import json
import os
import secrets
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from synapse_ha.worker.accounts import RunAsMode, RunAsPolicy, local_account
from synapse_ha.worker.cgroups import CgroupLimiter, probe_cgroups
from synapse_ha.worker.checkpoint_files import Mark
from synapse_ha.worker.environment import FIXED_LANG, FIXED_PATH
from synapse_ha.worker.images import ImageRuntime
from synapse_ha.worker.lease import LeaseFile
from synapse_ha.worker.members import EXIT_REFUSED, ExecutorSettings, MemberExecutor
from tests.worker import fake_runtime
from tests.worker.helpers import spec, wait_exit

MakeOwnerExecutor = Callable[..., MemberExecutor]

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="runs members as a temporary account: needs root and useradd",
)


@dataclass(frozen=True)
class TempAccount:
    name: str
    uid: int
    gid: int
    extra_group: str
    extra_gid: int


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@pytest.fixture
def account() -> Iterator[TempAccount]:
    """A system account with a supplementary group, removed at teardown."""
    suffix = secrets.token_hex(4)
    name, group = f"synapse-t-{suffix}", f"synapse-g-{suffix}"
    _run("groupadd", "--system", group)
    try:
        _run("useradd", "--system", "--no-create-home", "--groups", group, name)
        try:
            found = local_account(name)
            assert found is not None
            yield TempAccount(name, found.uid, found.gid, group, grp.getgrnam(group).gr_gid)
        finally:
            _run("userdel", name)
    finally:
        subprocess.run(["groupdel", group], capture_output=True, timeout=30, check=False)


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A data directory every account may traverse (pytest's own temporary directories
    are root's alone), so that a test can see what the member can and cannot touch."""
    path = Path(tempfile.mkdtemp(prefix="synapse-runas-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def owner_executor(data_dir: Path) -> Iterator[MakeOwnerExecutor]:
    made: list[MemberExecutor] = []

    def make(
        cgroups: CgroupLimiter | None = None,
        image_runtime: ImageRuntime | None = None,
        **policy: object,
    ) -> MemberExecutor:
        lease = LeaseFile(data_dir / "lease")
        lease.write(time.monotonic() + 3600)
        run_as = RunAsPolicy(
            mode=RunAsMode.OWNER,
            node_id="w1",
            agent_user="root",
            **policy,  # type: ignore[arg-type]
        )
        executor = MemberExecutor(
            data_dir,
            lease.path,
            # As a root worker running members as their owners does: each member in a PID
            # namespace of its own.
            ExecutorSettings(fence_grace_s=0.2, run_as=run_as, pid_namespace=True),
            cgroups=cgroups,
            image_runtime=image_runtime,
        )
        made.append(executor)
        return executor

    yield make
    for executor in made:
        executor.kill_all("test teardown")


def test_a_member_runs_with_its_owners_uid_groups_and_files(
    owner_executor: MakeOwnerExecutor, account: TempAccount
) -> None:
    executor = owner_executor()
    probe = spec("", job_id="j-owner", owner=account.name)
    mdir = executor.member_dir(probe.key, probe.attempt)
    command = (
        'echo "uid=$(id -u) gid=$(id -g) groups=$(id -G) user=$USER home=$HOME"; '
        f"(cat {mdir}/launch.json > /dev/null) 2>/dev/null && echo can-read || echo cannot-read; "
        f"(echo forged > {mdir}/member.json) 2>/dev/null && echo wrote || echo cannot-write"
    )
    member = executor.start(spec(command, job_id="j-owner", owner=account.name))
    assert wait_exit(executor, member.key, 20.0) == (0, "")
    lines = (member.dir / "output.log").read_text().splitlines()
    fields = dict(word.split("=", 1) for word in lines[0].split(" ") if "=" in word)
    assert fields["uid"] == str(account.uid)
    assert fields["gid"] == str(account.gid)
    assert fields["user"] == account.name
    assert fields["home"] == local_account(account.name).home  # type: ignore[union-attr]
    groups = set(lines[0].split("groups=", 1)[1].split(" user=")[0].split())
    assert groups == {str(account.gid), str(account.extra_gid)}
    # The launch record holds the environment: the agent's alone, as are the records.
    assert lines[1:] == ["cannot-read", "cannot-write"]
    log_stat = (member.dir / "output.log").stat()
    assert (log_stat.st_uid, log_stat.st_gid) == (account.uid, account.gid)
    assert stat.S_IMODE(log_stat.st_mode) == 0o600
    dir_stat = member.dir.stat()
    assert (dir_stat.st_uid, dir_stat.st_gid) == (0, account.gid)
    assert stat.S_IMODE(dir_stat.st_mode) == 0o710
    for record in ("launch.json", "member.json", "exit.json", "shim.log"):
        record_stat = (member.dir / record).stat()
        assert (record_stat.st_uid, stat.S_IMODE(record_stat.st_mode)) == (0, 0o600), record


def test_a_member_running_as_its_owner_may_touch_its_progress_file(
    owner_executor: MakeOwnerExecutor, account: TempAccount
) -> None:
    executor = owner_executor()
    command = 'touch "$SYNAPSE_PROGRESS_FILE" && echo touched'
    member = executor.start(
        spec(command, job_id="j-progress", owner=account.name, progress_timeout_ms=60_000)
    )
    assert wait_exit(executor, member.key, 20.0) == (0, "")
    assert (member.dir / "output.log").read_text().strip() == "touched"
    progress = (member.dir / "progress").stat()
    assert (progress.st_uid, progress.st_gid) == (account.uid, account.gid)
    assert stat.S_IMODE(progress.st_mode) == 0o600


def test_a_member_running_as_its_owner_marks_checkpoints_the_agent_reads(
    owner_executor: MakeOwnerExecutor, account: TempAccount
) -> None:
    executor = owner_executor()
    command = 'echo "step 12" >> "$SYNAPSE_CHECKPOINT_FILE" && echo marked'
    member = executor.start(spec(command, job_id="j-mark", owner=account.name))
    assert wait_exit(executor, member.key, 20.0) == (0, "")
    assert (member.dir / "output.log").read_text().strip() == "marked"
    mark = (member.dir / "checkpoint").stat()
    assert (mark.st_uid, mark.st_gid, stat.S_IMODE(mark.st_mode)) == (
        account.uid,
        account.gid,
        0o600,
    )
    assert executor.marks([member.key]) == [(member.key, Mark(1, 12))]


def test_a_member_running_as_its_owner_reads_its_membership_file_and_cannot_write_it(
    owner_executor: MakeOwnerExecutor, account: TempAccount
) -> None:
    executor = owner_executor()
    command = 'cat "$SYNAPSE_MEMBERSHIP_FILE"; echo forged >> "$SYNAPSE_MEMBERSHIP_FILE"'
    member = executor.start(spec(command, job_id="j-membership", owner=account.name))
    assert wait_exit(executor, member.key, 20.0)[0] != 0  # the append was refused
    (line, refusal) = (member.dir / "output.log").read_text().splitlines()[:2]
    assert json.loads(line)["membership"] == 0 and "ermission denied" in refusal
    assert len((member.dir / "membership").read_text().splitlines()) == 1


def test_a_mapped_owner_runs_as_the_mapped_account(
    owner_executor: MakeOwnerExecutor, account: TempAccount
) -> None:
    executor = owner_executor(user_map=(("alice", account.name),))
    member = executor.start(spec("id -u", job_id="j-mapped", owner="alice"))
    assert wait_exit(executor, member.key, 20.0) == (0, "")
    assert (member.dir / "output.log").read_text().strip() == str(account.uid)


def test_an_owner_without_an_account_does_not_start(owner_executor: MakeOwnerExecutor) -> None:
    executor = owner_executor()
    owner = f"synapse-none-{secrets.token_hex(4)}"
    member = executor.start(spec("id -u", job_id="j-none", owner=owner))
    detail = f"node w1 has no account for user {owner} (and no --user-map entry)"
    assert wait_exit(executor, member.key, 5.0) == (EXIT_REFUSED, detail)
    assert member.shim is None


def test_a_root_owner_is_refused_unless_allowed(owner_executor: MakeOwnerExecutor) -> None:
    refusing = owner_executor()
    member = refusing.start(spec("id -u", job_id="j-root", owner="root"))
    assert wait_exit(refusing, member.key, 5.0) == (
        EXIT_REFUSED,
        "node w1 does not run members as root",
    )
    allowing = owner_executor(allow_root_members=True)
    member = allowing.start(spec("id -u", job_id="j-root-ok", owner="root"))
    assert wait_exit(allowing, member.key, 20.0) == (0, "")
    assert (member.dir / "output.log").read_text().strip() == "0"


def test_the_owner_is_set_after_the_member_joins_its_cgroup(
    owner_executor: MakeOwnerExecutor, account: TempAccount
) -> None:
    limiter, why = probe_cgroups(Path("/sys/fs/cgroup"))
    if limiter is None:
        pytest.skip(f"no writable cgroup v2 with cpu and memory here: {why}")
    executor = owner_executor(cgroups=limiter)
    member = executor.start(
        spec("id -u; cat /proc/self/cgroup", job_id="j-cg", owner=account.name, memory_mib=64)
    )
    name = f"{member.key.job_id}.t{member.key.fencing_token}.r{member.key.rank}"
    try:
        assert wait_exit(executor, member.key, 20.0) == (0, "")
        uid, cgroup = (member.dir / "output.log").read_text().split()
        assert uid == str(account.uid)
        assert cgroup.endswith(f"/synapse/{name}"), cgroup
    finally:
        executor.mark_reported(member.key)


IMAGE = "registry.example/team/train:24.01"
# The fake runtime runs as the member's owner here: it needs an interpreter every account
# may run (this one may live under root's home).
SYSTEM_PYTHON = next(
    (p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), None
)


@pytest.mark.skipif(SYSTEM_PYTHON is None, reason="no python3 every account may run")
def test_a_rootless_runtime_runs_as_the_owner_with_only_the_owners_files(
    owner_executor: MakeOwnerExecutor, account: TempAccount, data_dir: Path
) -> None:
    assert SYSTEM_PYTHON is not None
    records = data_dir / "fake-runtime"
    fake = fake_runtime.install(records, IMAGE, python=SYSTEM_PYTHON)
    records.chmod(0o777)  # the runtime, run as the owner, records what it saw there
    runtime = ImageRuntime.parse(str(fake.path), rootless=True)
    executor = owner_executor(image_runtime=runtime)
    member = executor.start(
        spec("id -u; id -g", image=IMAGE, owner=account.name, env=(("TOKEN", "s3cret"),))
    )
    assert wait_exit(executor, member.key, 20.0) == (0, "")
    run = fake.run(ImageRuntime.container_name(member.key))
    home = local_account(account.name).home  # type: ignore[union-attr]
    # The runtime's client is the owner, with the owner's fixed environment ...
    assert (run["uid"], run["gid"]) == (account.uid, account.gid)
    assert run["env"] == {
        "PATH": FIXED_PATH,
        "LANG": FIXED_LANG,
        "HOME": home,
        "USER": account.name,
        "LOGNAME": account.name,
        "XDG_RUNTIME_DIR": f"/run/user/{account.uid}",
    }
    # ... keeps the owner's ids inside the container, and is still confined ...
    options = run["argv"][: run["argv"].index(IMAGE)]
    assert "--userns=keep-id" in options
    assert "--security-opt=no-new-privileges" in options and "--cap-drop=all" in options
    assert not [o for o in options if o.startswith(("--user=", "--group-add"))]
    # ... and reads an env file that is the owner's alone, gone once the member ended.
    env_file = run["env_file"]
    assert (env_file["mode"], env_file["uid"]) == (0o600, account.uid)
    assert (env_file["dir_mode"], env_file["dir_uid"]) == (0o700, account.uid)
    assert env_file["variables"]["TOKEN"] == "s3cret"
    assert not (member.dir / "container").exists()
    assert (member.dir / "output.log").read_text().split() == [str(account.uid), str(account.gid)]


@pytest.mark.skipif(SYSTEM_PYTHON is None, reason="no python3 every account may run")
def test_a_rootless_runtime_is_stopped_as_the_owner(
    owner_executor: MakeOwnerExecutor, account: TempAccount, data_dir: Path
) -> None:
    assert SYSTEM_PYTHON is not None
    records = data_dir / "fake-runtime"
    fake = fake_runtime.install(records, IMAGE, python=SYSTEM_PYTHON)
    records.chmod(0o777)
    executor = owner_executor(image_runtime=ImageRuntime.parse(str(fake.path), rootless=True))
    member = executor.start(spec("exec sleep 60", image=IMAGE, owner=account.name))
    name = ImageRuntime.container_name(member.key)
    deadline = time.monotonic() + 20
    while not fake.ran(name):
        assert time.monotonic() < deadline, (member.dir / "output.log").read_text()
        time.sleep(0.05)
    executor.kill_all("fenced: test")
    # The container lives in the owner's storage: the owner's runtime stops it.
    stops = fake.stops()
    assert [stop["argv"] for stop in stops] == [["kill", name], ["rm", "-f", name]]
    assert {stop["uid"] for stop in stops} == {account.uid}
