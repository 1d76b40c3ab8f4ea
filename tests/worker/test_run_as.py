"""Whose account a member runs under: resolution (pure, with the account database
injected), refusals as member start failures, configuration, and the wire fields."""

from __future__ import annotations

import pwd
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from synapse_ha.cli import render_nodes
from synapse_ha.client.nodes import node_from_proto
from synapse_ha.core.commands import ExitCause, MemberEventKind
from synapse_ha.core.model import JobSpec, Node, NodeInfo, NodeStatus, Resources
from synapse_ha.programs.worker import registration, run_as_policy
from synapse_ha.programs.worker_config import ConfigError, load_config
from synapse_ha.rpc import from_proto, to_proto
from synapse_ha.rpc.from_proto import desired_from_proto
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.worker.accounts import (
    Account,
    RunAsMode,
    RunAsPolicy,
    RunAsRefusal,
    RunAsRefusalCode,
    agent_user_name,
    local_account,
    parse_user_map,
    resolve_member_account,
)
from synapse_ha.worker.agent import _report
from synapse_ha.worker.environment import member_environment
from synapse_ha.worker.images import ImageRuntime
from synapse_ha.worker.launch import member_argv
from synapse_ha.worker.lease import LeaseFile
from synapse_ha.worker.members import EXIT_REFUSED, ExecutorSettings, MemberExecutor
from tests.worker.helpers import desired_member, spec

ALICE = Account("alice", 1001, 1001, (27, 1001), "/home/alice")
SVC = Account("svc_alice", 2001, 2001, (2001, 3000), "/srv/alice")
ROOT = Account("root", 0, 0, (0,), "/root")


class FakeAccounts:
    """An account database: names looked up are recorded."""

    def __init__(self, *accounts: Account) -> None:
        self.by_name = {a.name: a for a in accounts}
        self.asked: list[str] = []

    def __call__(self, name: str) -> Account | None:
        self.asked.append(name)
        return self.by_name.get(name)


def policy(mode: RunAsMode = RunAsMode.OWNER, **changes: object) -> RunAsPolicy:
    fields: dict[str, object] = {"mode": mode, "node_id": "w1", "agent_user": "synapse"}
    fields.update(changes)
    return RunAsPolicy(**fields)  # type: ignore[arg-type]


# ------------------------------------------------------------------- resolution


def test_an_owner_runs_as_the_account_of_the_same_name() -> None:
    accounts = FakeAccounts(ALICE, SVC)
    assert resolve_member_account(policy(), "alice", accounts) == ALICE
    assert accounts.asked == ["alice"]


def test_the_user_map_names_the_account_instead() -> None:
    accounts = FakeAccounts(ALICE, SVC)
    mapped = policy(user_map=(("alice", "svc_alice"),))
    assert resolve_member_account(mapped, "alice", accounts) == SVC
    assert accounts.asked == ["svc_alice"]


def test_an_owner_without_an_account_or_mapping_is_refused_with_the_reason() -> None:
    refusal = resolve_member_account(policy(), "alice", FakeAccounts(SVC))
    assert isinstance(refusal, RunAsRefusal)
    assert refusal.code is RunAsRefusalCode.NO_ACCOUNT
    assert refusal.describe() == ("node w1 has no account for user alice (and no --user-map entry)")


def test_a_mapping_to_a_missing_account_names_both() -> None:
    mapped = policy(user_map=(("alice", "svc_gone"),))
    refusal = resolve_member_account(mapped, "alice", FakeAccounts(ALICE))
    assert isinstance(refusal, RunAsRefusal)
    assert refusal.code is RunAsRefusalCode.NO_ACCOUNT
    assert "svc_gone" in refusal.describe() and "alice" in refusal.describe()


@pytest.mark.parametrize("user_map", [(), (("alice", "root"),)])
def test_root_is_refused_unless_the_node_allows_it(user_map: tuple[tuple[str, str], ...]) -> None:
    owner = "alice" if user_map else "root"
    refusal = resolve_member_account(policy(user_map=user_map), owner, FakeAccounts(ROOT))
    assert isinstance(refusal, RunAsRefusal)
    assert refusal.code is RunAsRefusalCode.ROOT_REFUSED
    assert refusal.describe() == "node w1 does not run members as root"
    allowed = policy(user_map=user_map, allow_root_members=True)
    assert resolve_member_account(allowed, owner, FakeAccounts(ROOT)) == ROOT


def test_mode_agent_runs_every_member_as_the_agent() -> None:
    accounts = FakeAccounts(ALICE, ROOT)
    assert resolve_member_account(policy(RunAsMode.AGENT), "alice", accounts) is None
    assert resolve_member_account(policy(RunAsMode.AGENT), "nobody-here", accounts) is None
    assert resolve_member_account(policy(RunAsMode.AGENT), "", accounts) is None
    assert accounts.asked == []


def test_a_job_without_an_owner_would_run_as_root_and_is_refused_unless_allowed() -> None:
    accounts = FakeAccounts(ALICE, ROOT)
    refusal = resolve_member_account(policy(), "", accounts)
    assert isinstance(refusal, RunAsRefusal)
    assert refusal.describe() == "node w1 does not run members as root"
    assert resolve_member_account(policy(allow_root_members=True), "", accounts) is None
    assert accounts.asked == []


def test_the_node_advertises_its_mode() -> None:
    assert policy().advertised() == "owner"
    assert policy(RunAsMode.AGENT, agent_user="svc").advertised() == "agent:svc"


# ------------------------------------------------------------- local accounts


def passwd(name: str, uid: int, gid: int, home: str) -> pwd.struct_passwd:
    return pwd.struct_passwd((name, "x", uid, gid, "", home, "/bin/sh"))


def test_a_local_account_has_its_supplementary_groups_home_and_shell() -> None:
    def getpwnam(name: str) -> pwd.struct_passwd:
        if name != "alice":
            raise KeyError(name)
        return passwd("alice", 1001, 100, "/home/alice")

    def getgrouplist(name: str, gid: int) -> list[int]:
        assert (name, gid) == ("alice", 100)
        return [44, 100, 27]

    found = local_account("alice", getpwnam=getpwnam, getgrouplist=getgrouplist)
    assert found == Account("alice", 1001, 100, (27, 44, 100), "/home/alice", "/bin/sh")
    assert local_account("bob", getpwnam=getpwnam, getgrouplist=getgrouplist) is None
    assert local_account("", getpwnam=getpwnam, getgrouplist=getgrouplist) is None


def test_the_agent_user_name_falls_back_to_the_uid() -> None:
    def getpwuid(uid: int) -> pwd.struct_passwd:
        if uid == 5:
            return passwd("svc", 5, 5, "/")
        raise KeyError(uid)

    assert agent_user_name(5, getpwuid) == "svc"
    assert agent_user_name(4242, getpwuid) == "4242"


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        (["bob=svc_bob", "alice=svc_alice"], (("alice", "svc_alice"), ("bob", "svc_bob"))),
        ({"alice": "svc_alice"}, (("alice", "svc_alice"),)),
        (["alice=a", "alice=a"], (("alice", "a"),)),
        ([], ()),
    ],
)
def test_user_map_entries(
    entries: list[str] | Mapping[str, object], expected: tuple[tuple[str, str], ...]
) -> None:
    assert parse_user_map(entries) == expected


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (["alice"], "not OWNER=ACCOUNT"),
        (["alice="], "needs a user and an account"),
        (["a b=c"], "without spaces"),
        (["alice=a", "alice=b"], "two accounts"),
        ({"alice": 7}, "must be a string"),
    ],
)
def test_bad_user_map_entries_are_explained(
    entries: list[str] | Mapping[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        parse_user_map(entries)


# ------------------------------------------------------------ member start


def test_the_owner_account_names_home_user_and_logname_but_not_the_gang() -> None:
    s = spec("true", env=(("HF_HOME", "/data"),))
    env = member_environment(s, {"HOME": "/root", "USER": "root", "PATH": "/bin"}, ALICE)
    assert (env["HOME"], env["USER"], env["LOGNAME"]) == ("/home/alice", "alice", "alice")
    assert env["PATH"] == "/bin" and env["HF_HOME"] == "/data" and env["RANK"] == "0"
    assert member_environment(s, {"HOME": "/root", "USER": "root"})["USER"] == "root"


def test_a_containerised_member_runs_with_the_owner_ids_inside(tmp_path: Path) -> None:
    runtime = ImageRuntime(("/usr/bin/podman",))
    argv = member_argv(spec("id -u", image="alpine"), runtime, SVC, tmp_path)
    at = argv.index("--user=2001:2001")
    assert argv[at : at + 2] == ["--user=2001:2001", "--group-add=3000"]
    assert "--userns=keep-id" not in argv
    plain = member_argv(spec("id -u", image="alpine"), runtime, None, tmp_path)
    assert not [word for word in plain if word.startswith(("--user", "--group-add"))]
    # A rootless runtime runs as the owner itself: the owner's ids are kept inside.
    rootless = ImageRuntime(("/usr/bin/podman",), rootless=True)
    inside = member_argv(spec("id -u", image="alpine"), rootless, SVC, tmp_path)
    assert "--userns=keep-id" in inside
    assert not [word for word in inside if word.startswith(("--user=", "--group-add"))]


@pytest.fixture
def executor_with(tmp_path: Path) -> Iterator[Callable[..., MemberExecutor]]:
    """Executors whose account database is a fake; whatever they started is killed at
    teardown, also when a test fails."""
    made: list[MemberExecutor] = []

    def make(run_as: RunAsPolicy, accounts: FakeAccounts) -> MemberExecutor:
        lease = LeaseFile(tmp_path / "lease")
        lease.write(1e12)
        executor = MemberExecutor(
            tmp_path,
            lease.path,
            ExecutorSettings(fence_grace_s=0.2, run_as=run_as),
            lookup_account=accounts,
        )
        made.append(executor)
        return executor

    yield make
    for executor in made:
        executor.kill_all("test teardown")


@pytest.mark.parametrize(
    ("owner", "user_map", "detail"),
    [
        ("alice", (), "node w1 has no account for user alice (and no --user-map entry)"),
        ("root", (), "node w1 does not run members as root"),
        ("bob", (("bob", "root"),), "node w1 does not run members as root"),
    ],
)
def test_a_refused_owner_is_a_start_failure_with_the_reason(
    executor_with: Callable[..., MemberExecutor],
    owner: str,
    user_map: tuple[tuple[str, str], ...],
    detail: str,
) -> None:
    executor = executor_with(policy(user_map=user_map), FakeAccounts(ROOT))
    member = executor.start(spec("echo ran", owner=owner))
    assert member.shim is None
    [(key, exit_)] = executor.poll()
    assert key == member.key
    assert (exit_.exit_code, exit_.detail, exit_.disrupted) == (EXIT_REFUSED, detail, False)
    # The node's fault, never the job's: reported so, the gang is requeued elsewhere.
    assert exit_.node_fault
    assert _report(key, MemberEventKind.EXITED, exit_).cause is ExitCause.NODE_CANNOT_RUN
    assert (member.dir / "output.log").read_text() == f"synapse-worker: {detail}\n"
    assert key in executor.known  # never started again on this node


# ------------------------------------------------------------------ config


# TLS is beside the point here: --insecure (the TLS flags are tested in test_logs_and_config).
BASE = [
    "--scheduler",
    "127.0.0.1:1",
    "--no-cgroups",
    "--mock-gpus",
    "0",
    "--node-id",
    "w1",
    "--insecure",
]


def test_the_default_mode_follows_whether_the_agent_is_root(tmp_path: Path) -> None:
    args = [*BASE, "--data-dir", str(tmp_path)]
    assert load_config(args, {}, euid=0).run_as is RunAsMode.OWNER
    assert load_config(args, {}, euid=1000).run_as is RunAsMode.AGENT
    assert load_config([*args, "--run-as", "agent"], {}, euid=0).run_as is RunAsMode.AGENT


def test_owner_mode_needs_root(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs the agent to run as root"):
        load_config([*BASE, "--data-dir", str(tmp_path), "--run-as", "owner"], {}, euid=1000)


def test_flags_and_toml_give_the_user_map_and_root_permission(tmp_path: Path) -> None:
    args = [*BASE, "--data-dir", str(tmp_path)]
    config = load_config(
        [*args, "--user-map", "bob=svc_b", "--user-map", "alice=svc_a", "--allow-root-members"],
        {},
        euid=0,
    )
    assert config.user_map == (("alice", "svc_a"), ("bob", "svc_b"))
    assert config.allow_root_members is True
    path = tmp_path / "worker.toml"
    path.write_text('run_as = "owner"\n[user_map]\nalice = "svc_alice"\n')
    config = load_config([*args, "--config", str(path)], {}, euid=0)
    assert (config.run_as, config.user_map) == (RunAsMode.OWNER, (("alice", "svc_alice"),))
    assert config.allow_root_members is False
    with pytest.raises(ConfigError, match="not OWNER=ACCOUNT"):
        load_config([*args, "--user-map", "alice"], {}, euid=0)
    path.write_text("allow_root_members = 1\n")
    with pytest.raises(ConfigError, match="true or false"):
        load_config([*args, "--config", str(path)], {}, euid=0)


def test_the_registration_says_whose_account_members_run_under(tmp_path: Path) -> None:
    args = [*BASE, "--data-dir", str(tmp_path)]
    owner = load_config([*args, "--run-as", "owner"], {}, euid=0)
    assert registration(owner, "h:1").members_run_as == "owner"
    agent = load_config([*args, "--run-as", "agent"], {}, euid=0)
    assert registration(agent, "h:1").members_run_as == f"agent:{agent_user_name()}"
    assert run_as_policy(owner).node_id == "w1"


# ------------------------------------------------------------------ the wire


def test_the_owner_travels_from_the_desired_member_to_the_launch() -> None:
    job_spec = JobSpec(name="t", replicas=1, resources=Resources(0, 0, 0), command=("true",))
    desired = desired_member(job_spec, job_id="j1", token=3, host="10.0.0.1", owner="alice")
    assert desired_from_proto(to_proto.desired_to_proto(desired)).owner == "alice"


def test_members_run_as_travels_from_registration_to_the_node_listing() -> None:
    request = pb.RegisterNodeRequest(
        node_id="w1",
        address="h:1",
        capacity=pb.Resources(cpu_milli=1000, memory_mib=1024, gpu=0),
        members_run_as="agent:svc",
    )
    info = from_proto.node_info_from_proto(request)
    assert info == NodeInfo("w1", "h:1", Resources(1000, 1024, 0), members_run_as="agent:svc")


def test_synctl_nodes_shows_whose_account_members_run_under() -> None:
    info = NodeInfo("w1", "h:1", Resources(1000, 1024, 0), members_run_as="agent:svc")
    node = Node(info=info, status=NodeStatus.READY, registered_at_ms=1)
    doc = render_nodes.node_document(node_from_proto(to_proto.node_to_proto(node, 1500)))
    assert doc["members_run_as"] == "agent:svc"
    header, row = render_nodes.nodes_table([doc]).splitlines()
    # The last columns: RUNS AS, then UNFIT FOR and DRAINING FOR ("-": none).
    assert header.split()[-6:] == ["RUNS", "AS", "UNFIT", "FOR", "DRAINING", "FOR"]
    assert row.split()[-3:] == ["agent:svc", "-", "-"]


def test_a_feature_a_selector_could_not_name_is_refused(tmp_path: Path) -> None:
    args = [*BASE, "--data-dir", str(tmp_path), "--mock-gpus", "0"]
    assert load_config([*args, "--feature", "a100", "--feature", "ib"], {}).features == (
        "a100",
        "ib",
    )
    with pytest.raises(ConfigError, match="features: 'two words': a feature is letters"):
        load_config([*args, "--feature", "two words"], {})
