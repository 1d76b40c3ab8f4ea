"""Attacks of one tenant on the others through the node they share, on real processes: a
replica and a worker agent whose own environment holds credentials (a cloud key, a test
secret). Each test is the attack: a user's job looks at what its member can see of the
agent's environment and of the node's other processes; the test asserts it sees only
what docs/security.md says it may.

When the tests run as root (as in CI) the agent runs as root with ``--run-as owner`` and
members run as two temporary accounts (made with useradd, removed at teardown); otherwise
it runs members as its own account, where the environment test still holds and the one
that needs two users is skipped.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from synapse_ha.local.launcher import MARKER_VARIABLE
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.worker.accounts import local_account
from tests.integration.cluster import wait_for
from tests.security.tenants import AS_ROOT, TenantNode, tenant_node
from tests.worker.helpers import host_pids_with

pytestmark = pytest.mark.integration

needs_root = pytest.mark.skipif(
    not AS_ROOT,
    reason="runs members as two temporary local accounts: needs root and useradd",
)
DONE = ("SUCCEEDED", "FAILED", "CANCELLED")
TAG = secrets.token_hex(4)
# What an operator's shell leaves in a worker's environment, credentials among them.
PLANTED = {
    "AWS_SECRET_ACCESS_KEY": f"aws-secret-{TAG}",
    "SYNAPSE_TEST_SECRET": f"test-secret-{TAG}",
    "PIP_INDEX_URL": f"https://ci:password-{TAG}@pypi.example/simple",
    "OLDPWD": f"/root/project-{TAG}",
}
PASSED_ON = "SYNAPSE_TEST_PASSED_ON"  # named by the operator: --member-env-passthrough
# The documented minimal base, and the gang's variables (DESIGN §5) with the files a
# member writes to.
BASE = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "TMPDIR"}
GANG = {
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
    "SYNAPSE_PYTHON",
    "SYNAPSE_PREEMPT_FILE",
    "SYNAPSE_CHECKPOINT_FILE",
    "SYNAPSE_MEMBERSHIP_FILE",
    "SYNAPSE_PROGRESS_FILE",
}


class Node(TenantNode):
    def state(self, job_id: str, states: tuple[str, ...], timeout_s: float = 30.0) -> str:
        def reached() -> str | None:
            found = self.admin.get_job(job_id).state
            return found if found in states else None

        return wait_for(f"job {job_id} in {states}", reached, timeout_s)

    def output(self, job_id: str) -> str:
        (mdir,) = (self.data_dir / "members" / job_id).iterdir()
        return (mdir / "output.log").read_text()


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    with tenant_node("synapse-attack-node-", Node, _start_worker) as n:
        yield n


def _start_worker(n: Node) -> None:
    launcher = n.cluster.launcher
    owner = ["--run-as", "owner"] if AS_ROOT else []
    worker = launcher.worker(
        n.cluster.grpc_addresses,
        "w1",
        n.data_dir,
        extra=[
            *owner,
            "--member-env-passthrough",
            PASSED_ON,
            "--mock-gpus",
            "0",
            "--no-cgroups",
            "--stop-grace",
            "1s",
        ],
        env={**launcher.env, **PLANTED, PASSED_ON: "given-by-the-operator"},
    )
    launcher.start(worker)
    wait_for(
        "worker w1 to register",
        lambda: any(x.node_id == "w1" and x.status == "ready" for x in n.admin.list_nodes()),
        30.0,
    )


@pytest.fixture(scope="module")
def mallory(node: Node) -> str:
    return node.accounts[0] if AS_ROOT else "mallory"


def job(name: str, **command: object) -> pb.JobSpec:
    return pb.JobSpec(
        name=name,
        replicas=1,
        resources=pb.Resources(cpu_milli=100, memory_mib=64, gpu=0),
        **command,  # type: ignore[arg-type]
    )


def test_a_member_sees_none_of_the_workers_environment(node: Node, mallory: str) -> None:
    spec = job(
        "look-around",
        argv=pb.CommandArgs(args=["/usr/bin/env"]),
        env=[pb.EnvVar(name="JOB_VAR", value="the-jobs-own")],
    )
    job_id = node.user(mallory).submit_job(spec).job_id
    assert node.state(job_id, DONE) == "SUCCEEDED"
    output = node.output(job_id)
    env = dict(line.partition("=")[::2] for line in output.splitlines() if "=" in line)
    for name, value in PLANTED.items():
        assert name not in env and value not in output, name
    # Exactly the documented variables: the base, the gang's, the job's own and those the
    # operator named (the test launcher names its cleanup marker too).
    assert set(env) == BASE | GANG | {"JOB_VAR", PASSED_ON, MARKER_VARIABLE}, output
    assert env["JOB_VAR"] == "the-jobs-own"
    assert env[PASSED_ON] == "given-by-the-operator"
    if AS_ROOT:
        account = local_account(mallory)
        assert account is not None
        assert (env["HOME"], env["USER"], env["LOGNAME"]) == (account.home, mallory, mallory)
        assert env["SHELL"] == (account.shell or "/bin/sh")
        assert env["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        assert (env["LANG"], env["TMPDIR"]) == ("C.UTF-8", "/tmp")


def test_the_node_says_whether_members_share_its_processes(node: Node) -> None:
    (w1,) = [x for x in node.admin.list_nodes() if x.node_id == "w1"]
    assert w1.member_isolation == ("pid-namespace" if AS_ROOT else "shared")


# A member's view of the node's processes: pid, owner and command line of each, from
# ps and from /proc itself.
LOOK_AT_PROCESSES = r"""
ps -eo pid=,user:40=,args= | sed 's/^/ps /'
for p in /proc/[0-9]*; do
  echo "proc ${p#/proc/} $(stat -c %U "$p") $(tr '\0\n' '  ' < "$p/cmdline" 2>/dev/null)"
done
"""


@needs_root
def test_a_member_sees_only_its_own_processes(node: Node, mallory: str) -> None:
    victim = node.accounts[1]
    secret = f"SECRET=victim-{secrets.token_hex(6)}"
    victim_job = (
        node.user(victim)
        .submit_job(job("victim", shell_command=f"echo started; sleep 60; echo {secret}"))
        .job_id
    )
    try:
        assert node.state(victim_job, ("RUNNING",)) == "RUNNING"
        wait_for("the victim's member to run", lambda: host_pids_with(secret) or None, 15.0)
        spy = node.user(mallory).submit_job(job("spy", shell_command=LOOK_AT_PROCESSES)).job_id
        assert node.state(spy, DONE) == "SUCCEEDED"
        output = node.output(spy)
    finally:
        node.user(victim).cancel_job(victim_job)
    assert secret not in output and victim not in output, output
    seen = [line.split(None, 3) for line in output.splitlines() if line.startswith("proc ")]
    ps = [line.split(None, 3) for line in output.splitlines() if line.startswith("ps ")]
    assert seen and ps, output
    # Its own processes, and the namespace's init (PID 1, the agent's): nothing else.
    for view in (seen, ps):
        owners = {int(pid): user for _, pid, user, *_ in view}
        assert owners.pop(1) == "root", output
        assert set(owners.values()) == {mallory}, output
        assert max(owners) < 50, output  # pids of a namespace of its own
    # Killing the victim's member still kills all of it.
    assert node.state(victim_job, DONE) == "CANCELLED"
    wait_for("nothing of the victim's member left", lambda: not host_pids_with(secret), 15.0)
