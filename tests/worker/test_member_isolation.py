"""What a member starts with and whether it shares the node's processes, as pure
functions: the minimal base environment, the operator's passthrough, the worker's
settings, the isolation decided at start, and how the node shows it."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from synapse_ha.cli.render_nodes import nodes_table, runs_as_text
from synapse_ha.programs.config_file import ConfigError
from synapse_ha.programs.worker import member_isolation, registration
from synapse_ha.programs.worker_config import load_config
from synapse_ha.worker.accounts import Account, RunAsMode
from synapse_ha.worker.environment import (
    FIXED_LANG,
    FIXED_PATH,
    MEMBER_BASE_NAMES,
    env_name_problem,
    member_base_environment,
    member_environment,
)
from synapse_ha.worker.isolation import (
    ISOLATED,
    NOT_ROOT,
    SHARED,
    IsolationRefused,
    MemberIsolation,
    decide_isolation,
    probe_pid_namespace,
)
from tests.worker.helpers import spec

ALICE = Account("alice", 1001, 1001, (1001,), "/home/alice", "/bin/bash")
AGENT_ENV = {
    "PATH": "/opt/venv/bin:/usr/bin",
    "HOME": "/root",
    "USER": "root",
    "AWS_SECRET_ACCESS_KEY": "agent-secret",
    "OLDPWD": "/root/project",
    "HTTPS_PROXY": "http://proxy:3128",
}
FLAGS = ["--scheduler", "127.0.0.1:1", "--no-cgroups", "--insecure"]


def test_a_member_running_as_its_owner_gets_the_owners_base_and_nothing_of_the_agents() -> None:
    env = member_base_environment(ALICE, AGENT_ENV)
    assert env == {
        "PATH": FIXED_PATH,
        "HOME": "/home/alice",
        "USER": "alice",
        "LOGNAME": "alice",
        "SHELL": "/bin/bash",
        "LANG": FIXED_LANG,
        "TMPDIR": "/tmp",
    }
    no_shell = Account("bob", 1002, 1002, (1002,), "/home/bob")
    assert member_base_environment(no_shell, {})["SHELL"] == "/bin/sh"


def test_a_member_running_as_the_agent_gets_the_agents_base_filled_in() -> None:
    env = member_base_environment(None, AGENT_ENV, agent_home="/var/lib/a", agent_user="svc")
    assert tuple(env) == MEMBER_BASE_NAMES
    assert (env["PATH"], env["HOME"], env["USER"]) == ("/opt/venv/bin:/usr/bin", "/root", "root")
    # What the agent's environment lacks: its account's, else fixed.
    assert (env["LOGNAME"], env["SHELL"], env["LANG"], env["TMPDIR"]) == (
        "svc",
        "/bin/sh",
        FIXED_LANG,
        "/tmp",
    )
    assert member_base_environment(None, {}, agent_home="/var/lib/a")["HOME"] == "/var/lib/a"


def test_only_the_variables_the_operator_names_pass_through() -> None:
    named = ("HTTPS_PROXY", "NCCL_SOCKET_IFNAME")  # the second one the agent lacks
    env = member_base_environment(ALICE, AGENT_ENV, named)
    assert env["HTTPS_PROXY"] == "http://proxy:3128"
    assert "NCCL_SOCKET_IFNAME" not in env
    assert "AWS_SECRET_ACCESS_KEY" not in env and "OLDPWD" not in env
    # The job's variables win over the base, the gang's over both.
    member = spec("true", env=(("HTTPS_PROXY", "http://mine:1"), ("RANK", "9")))
    whole = member_environment(member, env, ALICE)
    assert (whole["HTTPS_PROXY"], whole["RANK"]) == ("http://mine:1", "0")


@pytest.mark.parametrize("name", ["", "1ST", "A-B", "A B", "A=B", "é"])
def test_a_passthrough_name_must_be_a_variable_name(name: str) -> None:
    assert env_name_problem(name)
    assert env_name_problem("NCCL_SOCKET_IFNAME") == env_name_problem("_x1") == ""


def test_the_worker_settings_of_what_members_get(tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path)]
    default = load_config([*FLAGS, *data], {})
    assert (default.member_env_passthrough, default.allow_shared_pid_namespace) == ((), False)
    flags = [
        "--member-env-passthrough",
        "HTTPS_PROXY,NO_PROXY",
        "--member-env-passthrough",
        "NCCL_SOCKET_IFNAME",
        "--allow-shared-pid-namespace",
    ]
    config = load_config([*FLAGS, *data, *flags], {})
    assert config.member_env_passthrough == ("HTTPS_PROXY", "NO_PROXY", "NCCL_SOCKET_IFNAME")
    assert config.allow_shared_pid_namespace
    path = tmp_path / "worker.toml"
    path.write_text('member_env_passthrough = ["HF_TOKEN"]\nallow_shared_pid_namespace = true\n')
    from_file = load_config([*FLAGS, *data, "--config", str(path)], {})
    assert from_file.member_env_passthrough == ("HF_TOKEN",)
    assert from_file.allow_shared_pid_namespace
    with pytest.raises(ConfigError, match="member_env_passthrough: 'A-B' is not a variable"):
        load_config([*FLAGS, *data, "--member-env-passthrough", "A-B"], {})
    path.write_text('member_env_passthrough = "HF_TOKEN"\n')
    with pytest.raises(ConfigError, match="member_env_passthrough"):
        load_config([*FLAGS, *data, "--config", str(path)], {})


def test_a_root_agent_gives_members_pid_namespaces_where_it_can() -> None:
    for mode in RunAsMode:
        assert decide_isolation(mode, 0, False, lambda: "") == MemberIsolation(True)
    assert MemberIsolation(True).advertised == ISOLATED


def test_members_run_as_their_owners_without_pid_namespaces_only_when_allowed() -> None:
    def no(why: str = "unshare: Operation not permitted") -> str:
        return why

    with pytest.raises(IsolationRefused, match="--allow-shared-pid-namespace") as refused:
        decide_isolation(RunAsMode.OWNER, 0, False, no)
    assert "Operation not permitted" in str(refused.value)
    allowed = decide_isolation(RunAsMode.OWNER, 0, True, no)
    assert allowed == MemberIsolation(False, "unshare: Operation not permitted")
    assert allowed.advertised == SHARED
    # Members that all run as the agent's account are said to share, not refused.
    assert not decide_isolation(RunAsMode.AGENT, 0, False, no).pid_namespace


def test_an_agent_that_is_not_root_shares_without_trying() -> None:
    def never() -> str:
        raise AssertionError("no probe without root")

    assert decide_isolation(RunAsMode.AGENT, 1000, False, never) == MemberIsolation(False, NOT_ROOT)


def test_the_probe_says_why_it_failed(tmp_path: Path) -> None:
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'unshare: Operation not permitted'\nexit 1\n")
    broken.chmod(0o755)
    assert probe_pid_namespace(str(broken)) == "unshare: Operation not permitted"
    assert "could not run" in probe_pid_namespace(str(tmp_path / "missing"))


@pytest.mark.skipif(os.geteuid() != 0, reason="PID namespaces need root")
def test_the_probe_passes_where_root_can_make_the_namespaces() -> None:
    assert probe_pid_namespace() == ""


def test_the_node_registers_and_shows_its_isolation(tmp_path: Path) -> None:
    config = load_config([*FLAGS, "--data-dir", str(tmp_path), "--mock-gpus", "0"], {})
    assert registration(config, "h:1").member_isolation == ""
    shared = registration(config, "h:1", MemberIsolation(False, "no"))
    assert shared.member_isolation == SHARED
    assert registration(config, "h:1", MemberIsolation(True)).member_isolation == ISOLATED
    owner = {"members_run_as": "owner", "member_isolation": SHARED}
    assert runs_as_text(owner) == "owner (shared PIDs)"
    assert runs_as_text({**owner, "member_isolation": ISOLATED}) == "owner"
    assert runs_as_text({"members_run_as": "", "member_isolation": ""}) == ""
    document = {
        "id": "n1",
        "status": "ready",
        "topology_path": "-",
        "free_gpus": 0,
        "capacity": {"gpu": 0, "cpu_milli": 1000, "memory_mib": 1024},
        "allocated": {"gpu": 0, "cpu_milli": 0, "memory_mib": 0},
        "gpu_faults": [],
        "conditions": [],
        "last_heartbeat_age_ms": None,
        "address": "h:1",
        "unfit": [],
        **owner,
    }
    assert "owner (shared PIDs)" in nodes_table([document])


def test_a_worker_running_members_as_owners_refuses_to_start_without_namespaces(
    tmp_path: Path,
) -> None:
    flags = [*FLAGS, "--data-dir", str(tmp_path), "--run-as", "owner"]
    config = load_config(flags, {}, euid=0)

    def refused() -> str:
        return "unshare: Operation not permitted"

    with pytest.raises(ConfigError, match="--allow-shared-pid-namespace"):
        member_isolation(config, euid=0, probe=refused)
    allowed = dataclasses.replace(config, allow_shared_pid_namespace=True)
    assert member_isolation(allowed, euid=0, probe=refused) == MemberIsolation(False, refused())
    assert member_isolation(config, euid=0, probe=lambda: "") == MemberIsolation(True)
