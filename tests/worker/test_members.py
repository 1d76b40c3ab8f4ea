"""Members as supervised process groups: environment, output, stop, limits, records."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from synapse_ha.core.desired import DesiredMember, LaunchSpec, MemberKey
from synapse_ha.core.model import Resources
from synapse_ha.rpc.from_proto import desired_from_proto
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.worker.environment import (
    FIXED_PATH,
    changes_process_behaviour,
    supervisor_environment,
)
from synapse_ha.worker.member_dirs import MemberExit
from synapse_ha.worker.members import Member, MemberExecutor
from synapse_ha.worker.shim import NOT_RUNNABLE, WORKDIR_REFUSED
from synapse_ha.worker.supervisors import SHIM_COMMAND
from tests.integration.cluster import wait_for
from tests.worker.conftest import MakeExecutor
from tests.worker.helpers import Fifo, process_gone, spec, wait_gone


def finish(executor: MemberExecutor, member: Member, timeout_s: float = 10.0) -> MemberExit:
    """Block until the member's supervisor exits, then collect the exit."""
    if member.shim is not None:
        member.shim.wait(timeout=timeout_s)
    executor.poll()
    assert member.exit is not None, f"no exit for {member.key}"
    return member.exit


def log_text(member: Member) -> str:
    return (member.dir / "output.log").read_text()


def parse_env(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


# ------------------------------------------------------------------ environment


def gang_of_three_on_two_nodes() -> list[tuple[str, pb.DesiredMember]]:
    """What a leader sends for a 3-member gang: ranks 0 and 2 on node a, rank 1 on b."""
    hosts = ["10.0.0.1", "10.0.0.2", "10.0.0.1"]
    placement = [("a", 0, [0, 1]), ("b", 0, [3]), ("a", 1, [2, 5])]
    out = []
    for rank, (node, local_rank, gpus) in enumerate(placement):
        out.append(
            (
                node,
                pb.DesiredMember(
                    job_id="job-42",
                    fencing_token=17,
                    attempt=2,
                    rank=rank,
                    world_size=3,
                    gpus=gpus,
                    master_addr="10.0.0.1",
                    master_port=29517,
                    member_hosts=hosts,
                    local_rank=local_rank,
                    local_world_size=2 if node == "a" else 1,
                    command=["env"],
                    shell=True,
                    env=[pb.EnvVar(name="HF_HOME", value="/data/hf")],
                ),
            )
        )
    return out


def test_every_member_of_a_gang_sees_the_torchrun_environment(
    make_executor: MakeExecutor,
) -> None:
    nodes = {"a": make_executor("a"), "b": make_executor("b")}
    started = [
        (node, nodes[node].start(desired_from_proto(d))) for node, d in gang_of_three_on_two_nodes()
    ]
    expected_local = {0: ("0", "2"), 1: ("0", "1"), 2: ("1", "2")}
    expected_gpus = {0: "0,1", 1: "3", 2: "2,5"}
    for node, member in started:
        assert finish(nodes[node], member).exit_code == 0
        env = parse_env(log_text(member))
        rank = member.desired.rank
        assert env["MASTER_ADDR"] == "10.0.0.1"
        assert env["MASTER_PORT"] == "29517"
        assert env["WORLD_SIZE"] == env["NNODES"] == "3"
        assert env["RANK"] == env["NODE_RANK"] == str(rank)
        assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == expected_local[rank]
        assert env["CUDA_VISIBLE_DEVICES"] == expected_gpus[rank]
        assert env["SYNAPSE_JOB_ID"] == "job-42"
        assert env["SYNAPSE_ATTEMPT"] == "2"
        assert env["SYNAPSE_FENCING_TOKEN"] == "17"
        assert env["SYNAPSE_MEMBER_HOSTS"] == "10.0.0.1,10.0.0.2,10.0.0.1"
        assert env["HF_HOME"] == "/data/hf"


def test_job_env_and_workdir_apply_but_cannot_override_the_gang_variables(
    make_executor: MakeExecutor, tmp_path: Path
) -> None:
    executor = make_executor()
    workdir = tmp_path / "work"
    workdir.mkdir()
    member = executor.start(
        spec(
            "pwd; echo RANK=$RANK; echo CUDA=[$CUDA_VISIBLE_DEVICES]; echo MINE=$MINE",
            env=(("RANK", "99"), ("MINE", "yes")),
            workdir=str(workdir),
        )
    )
    assert finish(executor, member).exit_code == 0
    lines = log_text(member).splitlines()
    assert lines == [str(workdir), "RANK=0", "CUDA=[]", "MINE=yes"]


def test_a_list_command_runs_without_a_shell(make_executor: MakeExecutor) -> None:
    executor = make_executor()
    member = executor.start(spec(("/bin/echo", "$RANK", "a b")))
    assert finish(executor, member).exit_code == 0
    assert log_text(member) == "$RANK a b\n"


def test_stdout_and_stderr_go_to_the_log_and_the_exit_code_is_kept(
    make_executor: MakeExecutor,
) -> None:
    executor = make_executor()
    member = executor.start(spec("echo to-out; echo to-err >&2; exit 3"))
    result = finish(executor, member)
    assert result.exit_code == 3
    assert log_text(member) == "to-out\nto-err\n"


def test_a_member_killed_by_a_signal_reports_128_plus_the_signal(
    make_executor: MakeExecutor,
) -> None:
    executor = make_executor()
    member = executor.start(spec("kill -9 $$"))
    result = finish(executor, member)
    assert result.exit_code == 137
    assert "signal 9" in result.detail


@pytest.mark.parametrize(
    ("command", "workdir", "detail"),
    [
        (("/nonexistent/binary",), "", NOT_RUNNABLE),
        (("{plain_file}",), "", NOT_RUNNABLE),  # exists, not executable: the same words
        (("/bin/true",), "/nonexistent/dir", WORKDIR_REFUSED),
        (("/bin/true",), "{plain_file}", WORKDIR_REFUSED),  # exists, not a directory
    ],
)
def test_a_member_that_cannot_start_exits_127_with_a_reason_naming_nothing_of_the_job(
    make_executor: MakeExecutor,
    tmp_path: Path,
    command: tuple[str, ...],
    workdir: str,
    detail: str,
) -> None:
    plain_file = tmp_path / "plain-file"
    plain_file.write_text("not a program\n")
    plain_file.chmod(0o644)
    executor = make_executor()
    argv = tuple(word.format(plain_file=plain_file) for word in command)
    member = executor.start(spec(argv, workdir=workdir.format(plain_file=plain_file)))
    result = finish(executor, member)
    assert (result.exit_code, result.detail) == (127, detail)
    assert f"synapse-worker: {detail}" in log_text(member)


def test_the_supervisors_environment_is_the_agents_without_what_changes_a_process() -> None:
    agent = {
        "HOME": "/root",
        "SYNAPSE_LAUNCH_MARKER": "m",
        "PATH": "/opt/agent/bin:/usr/bin",
        "LD_PRELOAD": "/x.so",
        "LD_LIBRARY_PATH": "/x",
        "PYTHONPATH": "/x",
        "PYTHONSTARTUP": "/x.py",
        "GCONV_PATH": "/x",
        "GLIBC_TUNABLES": "glibc.malloc.check=3",
        "MALLOC_CHECK_": "3",
        "HOSTALIASES": "/x",
        "LOCALDOMAIN": "x",
        "RES_OPTIONS": "x",
        "CONTAINERS_CONF": "/x",
        "BASH_ENV": "/x",
    }
    assert supervisor_environment(agent) == {
        "HOME": "/root",
        "SYNAPSE_LAUNCH_MARKER": "m",
        "PATH": FIXED_PATH,
    }
    assert changes_process_behaviour("LD_AUDIT") and changes_process_behaviour("PYTHONHOME")
    assert not changes_process_behaviour("HF_HOME")


# --------------------------------------------------------------- process groups


def test_stop_kills_the_members_whole_process_group(
    make_executor: MakeExecutor, fifo: Fifo
) -> None:
    executor = make_executor()
    member = executor.start(
        spec(f"sleep 300 & echo $$ $! > {fifo.path}; (sleep 301; true) & wait", job_id="grp")
    )
    shell_pid, child_pid = map(int, fifo.read_line().split())
    assert os.getpgid(child_pid) == shell_pid  # its own group, not the agent's
    assert os.getsid(shell_pid) == shell_pid
    executor.stop(member.key)
    executor.stop(member.key)  # idempotent
    result = finish(executor, member)
    assert result.exit_code == 143
    assert result.detail == "stopped by the worker"
    assert process_gone(shell_pid)
    assert process_gone(child_pid)
    assert executor.running() == []


def test_a_stopping_member_holds_its_gpus_until_its_process_group_is_gone(
    make_executor: MakeExecutor, fifo: Fifo
) -> None:
    executor = make_executor()
    holder = executor.start(spec(f"echo $$ > {fifo.path}; sleep 300", job_id="h", gpus=(2, 3)))
    executor.start(spec("sleep 300", job_id="cpu-only"))
    shell_pid = int(fifo.read_line())
    executor.stop(holder.key)
    assert executor.gpus_held() == {holder.key: (2, 3)}  # asked to stop, not yet gone
    finish(executor, holder)
    assert process_gone(shell_pid)
    assert executor.gpus_held() == {}


def test_a_member_that_ignores_sigterm_is_killed_after_the_grace(
    make_executor: MakeExecutor, fifo: Fifo
) -> None:
    executor = make_executor(stop_grace_s=0.3)
    member = executor.start(spec(f"trap '' TERM; echo $$ > {fifo.path}; sleep 300 & wait"))
    pid = int(fifo.read_line())
    executor.stop(member.key)
    result = finish(executor, member)
    assert result.exit_code == 137  # SIGKILL after the grace
    assert process_gone(pid)


def test_children_left_behind_by_a_finished_member_are_killed(
    make_executor: MakeExecutor, fifo: Fifo
) -> None:
    executor = make_executor()
    member = executor.start(spec(f"sleep 300 & echo $! > {fifo.path}; exit 0"))
    child = int(fifo.read_line())
    assert finish(executor, member).exit_code == 0
    assert process_gone(child)


def test_the_time_limit_stops_the_member_with_code_124(make_executor: MakeExecutor) -> None:
    executor = make_executor()
    member = executor.start(spec("exec sleep 300", time_limit_ms=200))
    result = finish(executor, member)
    assert result.exit_code == 124
    assert "time limit" in result.detail


def test_a_lapsed_lease_file_fences_the_member(make_executor: MakeExecutor, fifo: Fifo) -> None:
    executor = make_executor(lease_s=0.5)
    member = executor.start(spec(f"sleep 300 & echo $! > {fifo.path}; wait"))
    child = int(fifo.read_line())
    result = finish(executor, member)
    assert result.exit_code == 143
    assert result.detail.startswith("fenced")
    assert result.disrupted  # the supervisor fenced it: not the job's failure
    assert process_gone(child)


def test_kill_all_fences_every_member_and_never_reports_success(
    make_executor: MakeExecutor, fifo: Fifo
) -> None:
    executor = make_executor()
    members = [
        executor.start(spec(f"trap 'exit 0' TERM; echo $$ > {fifo.path}; sleep 300 & wait", rank=r))
        for r in range(3)
    ]
    pids = [int(fifo.read_line()) for _ in members]
    exits = dict(executor.kill_all("fenced: test"))
    assert set(exits) == {m.key for m in members}
    assert all(e.exit_code != 0 and e.detail == "fenced: test" for e in exits.values())
    assert all(process_gone(p) for p in pids)
    assert executor.running() == []


# -------------------------------------------------------------------- records


AGENT_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from synapse_ha.worker.lease import LeaseFile
    from synapse_ha.worker.members import ExecutorSettings, MemberExecutor
    from tests.worker.helpers import spec

    data, fifo, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    lease = LeaseFile(data / "lease")
    lease.write(time.monotonic() + 1.0)
    executor = MemberExecutor(data, lease.path, ExecutorSettings(fence_grace_s=0.2))
    executor.start(spec(f"sleep 300 & echo $$ $! > {fifo}; wait"))
    while True:  # renew the lease like a healthy agent, until killed or stopped
        lease.write(time.monotonic() + 1.0)
        time.sleep(0.1)
    """
)


@pytest.fixture
def fake_agent(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Start a stand-in agent process (lease 1 s) that runs one member."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(fifo: Fifo, mode: str = "") -> subprocess.Popen[bytes]:
        data = tmp_path / "agent"
        data.mkdir()
        proc = subprocess.Popen(
            [sys.executable, "-c", AGENT_SCRIPT, str(data), str(fifo.path), mode],
            start_new_session=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        proc.wait(timeout=10)


LEASE_TTL_S = 1.0


def test_kill_9_of_the_agent_leaves_no_member_behind(fake_agent, fifo: Fifo) -> None:  # type: ignore[no-untyped-def]
    agent = fake_agent(fifo)
    pids = list(map(int, fifo.read_line().split()))
    os.kill(agent.pid, signal.SIGKILL)
    wait_gone(pids, LEASE_TTL_S + 1.0)


def test_a_frozen_agent_loses_its_members_when_the_lease_lapses(fake_agent, fifo: Fifo) -> None:  # type: ignore[no-untyped-def]
    agent = fake_agent(fifo)
    pids = list(map(int, fifo.read_line().split()))
    os.kill(agent.pid, signal.SIGSTOP)
    wait_gone(pids, LEASE_TTL_S + 1.0)


def test_a_restarted_agent_kills_leftovers_and_reports_them_lost(
    make_executor: MakeExecutor, fifo: Fifo
) -> None:
    first_life = make_executor("node")
    member = first_life.start(spec(f"sleep 300 & echo $$ $! > {fifo.path}; wait", token=9))
    done = first_life.start(spec("exit 4", token=9, rank=1))
    assert finish(first_life, done).exit_code == 4
    pids = list(map(int, fifo.read_line().split()))

    second_life = make_executor("node")  # same data directory, as after a crash
    recovered = dict(second_life.recover())
    assert member.shim is not None
    member.shim.wait(timeout=10)
    wait_gone(pids, 2.0)
    running_key = MemberKey("job-1", 9, 0)
    assert recovered[running_key].exit_code == 137
    assert recovered[running_key].detail.startswith("lost")
    assert recovered[running_key].disrupted  # killed by the worker: not the job's failure
    assert recovered[MemberKey("job-1", 9, 1)].exit_code == 4  # finished, not yet reported
    assert not recovered[MemberKey("job-1", 9, 1)].disrupted
    assert second_life.known == {running_key, MemberKey("job-1", 9, 1)}
    assert second_life.highest_token == {"job-1": 9}

    second_life.mark_reported(running_key)
    second_life.mark_reported(MemberKey("job-1", 9, 1))
    third_life = make_executor("node")
    assert third_life.recover() == []  # acknowledged exits are never reported again
    assert len(third_life.known) == 2


# ---------------------------------------------------------------------- images


def test_a_member_naming_an_image_without_a_runtime_fails_to_start(
    make_executor: MakeExecutor,
) -> None:
    executor = make_executor()
    member = executor.start(spec("true", image="img:1"))
    exits = dict(executor.poll())
    assert exits[member.key].exit_code == 127
    assert "no image runtime" in exits[member.key].detail
    assert exits[member.key].node_fault  # the node's fault: the gang goes elsewhere


def test_launch_spec_keeps_every_field_of_a_desired_member() -> None:
    _, desired = gang_of_three_on_two_nodes()[2]
    launch = desired_from_proto(desired)
    assert launch == DesiredMember(
        job_id="job-42",
        attempt=2,
        fencing_token=17,
        rank=2,
        world_size=3,
        local_rank=1,
        local_world_size=2,
        gpus=(2, 5),
        master_addr="10.0.0.1",
        master_port=29517,
        member_hosts=("10.0.0.1", "10.0.0.2", "10.0.0.1"),
        spec=LaunchSpec(
            command=("env",), shell=True, env=(("HF_HOME", "/data/hf"),), resources=Resources(gpu=2)
        ),
    )


def test_the_supervisor_runs_isolated_on_the_standard_library_alone(tmp_path: Path) -> None:
    # Members start through ``python -I -S shim.py``: no site-packages, no project on the
    # path. An import of anything else would fail here before the usage line; pathlib
    # and typing are kept out because they slow every member start.
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *SHIM_COMMAND],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert "usage:" in done.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert not imported & {"pathlib", "typing"}


def test_kill_all_keeps_the_exit_of_a_member_that_had_already_exited(
    make_executor: MakeExecutor,
) -> None:
    """A member that exited 0 just before the fence (its exit not polled yet) is reported
    as it ended, not as killed: its success may still count (DESIGN §4)."""
    executor = make_executor()
    member = executor.start(spec("exit 0"))
    wait_for("the member's exit record", (member.dir / "exit.json").exists, timeout_s=30)
    assert executor.kill_all("fenced: test") == []
    ((key, exit_),) = executor.poll()
    assert key == member.key
    assert (exit_.exit_code, exit_.disrupted) == (0, False)


def test_a_task_of_an_array_sees_its_array_and_index_and_a_job_does_not(
    make_executor: MakeExecutor,
) -> None:
    executor = make_executor()
    task = executor.start(spec("env", job_id="job-000042_7"))
    single = executor.start(spec("env", job_id="job-000043", token=2))
    assert finish(executor, task).exit_code == 0 and finish(executor, single).exit_code == 0
    env = parse_env(log_text(task))
    assert env["SYNAPSE_JOB_ID"] == "job-000042_7"
    assert (env["SYNAPSE_ARRAY_JOB_ID"], env["SYNAPSE_ARRAY_TASK_ID"]) == ("job-000042", "7")
    assert (env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"]) == ("job-000042", "7")
    assert not any(name.endswith("ARRAY_TASK_ID") for name in parse_env(log_text(single)))
