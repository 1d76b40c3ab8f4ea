"""The worker's side of member replacement: a rank placed again is a member of its own
(its generation in its directory, its records, its reports and its environment), never
alive beside another generation of its rank on this node, and a running member is told
of its gang's new membership (a line in ``$SYNAPSE_MEMBERSHIP_FILE``, then its signal)
without being restarted."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from synapse_ha.core.commands import MemberEventKind
from synapse_ha.core.desired import DesiredMember, MemberKey
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.worker import pidns
from synapse_ha.worker.agent import Agent, AgentTimings, _report
from synapse_ha.worker.images import ImageRuntime
from synapse_ha.worker.logs import find_member_dir
from synapse_ha.worker.member_dirs import MemberExit, parse_member_dir_name, write_exit_record
from synapse_ha.worker.member_types import cgroup_name
from synapse_ha.worker.membership import MEMBERSHIP_FILE, SIGNALS, membership_signal
from tests.worker.conftest import MakeExecutor
from tests.worker.helpers import FakeClock, Fifo, spec
from tests.worker.test_agent import FakeControl, FakeExecutor

Parts = tuple[Agent, FakeControl, FakeExecutor, FakeClock]

# A member that says what it started with, then, at each signal it is given (SIGUSR1 by
# default), the membership file's last line; it never exits by itself.
LISTENER = """
import os, signal, sys
fifo, path = sys.argv[1], os.environ["SYNAPSE_MEMBERSHIP_FILE"]
told_by = getattr(signal, sys.argv[2] if len(sys.argv) > 2 else "SIGUSR1")
def say(text):
    with open(fifo, "w") as f:
        f.write(text + "\\n")
def last_line():
    with open(path) as f:
        return f.read().splitlines()[-1]
signal.signal(told_by, lambda *_: say(f"told {os.getpid()} {last_line()}"))
say(f"started {os.getpid()} {os.environ['SYNAPSE_MEMBER_GENERATION']} {last_line()}")
while True:
    signal.pause()
"""


def gang_line(d: DesiredMember) -> dict[str, object]:
    return {
        "generation": d.generation,
        "master_addr": d.master_addr,
        "master_port": d.master_port,
        "member_hosts": list(d.member_hosts),
        "membership": d.membership,
        "rank": d.rank,
        "world_size": d.world_size,
    }


def said(fifo: Fifo) -> tuple[str, int, str, dict[str, object]]:
    """(what, pid, the rest, the JSON line) of one line a LISTENER said."""
    what, pid, rest = fifo.read_line().split(" ", 2)
    if what == "started":
        generation, line = rest.split(" ", 1)
        return what, int(pid), generation, json.loads(line)
    return what, int(pid), "", json.loads(rest)


def wait_recorded(member_dir: Path, timeout_s: float = 10.0) -> None:
    """Until the supervisor recorded the member's process (``member.json``)."""
    deadline = time.monotonic() + timeout_s
    while not (member_dir / "member.json").exists():
        assert time.monotonic() < deadline, "the supervisor never recorded the member"
        time.sleep(0.01)


def test_a_membership_change_is_appended_and_signalled_and_the_member_runs_on(
    make_executor: MakeExecutor, fifo: Fifo
) -> None:
    executor = make_executor()
    first = spec(
        (sys.executable, "-c", LISTENER, str(fifo.path)),
        rank=1,
        world_size=2,
        member_hosts=("10.0.0.1", "10.0.0.2"),
        master_addr="10.0.0.1",
        membership_signal="SIGUSR1",
    )
    member = executor.start(first)
    what, pid, generation, line = said(fifo)
    assert (what, generation, line) == ("started", "0", gang_line(first))
    wait_recorded(member.dir)
    # Rank 0 was placed again on another host: it is the new master.
    moved = dataclasses.replace(
        first, membership=1, member_hosts=("10.0.0.9", "10.0.0.2"), master_addr="10.0.0.9"
    )
    assert executor.tell_membership(moved)
    assert said(fifo) == ("told", pid, "", gang_line(moved))
    lines = (member.dir / MEMBERSHIP_FILE).read_text().splitlines()
    assert [json.loads(x) for x in lines] == [gang_line(first), gang_line(moved)]
    assert lines[1] == json.dumps(gang_line(moved), sort_keys=True)
    # The same record again (every heartbeat repeats it) tells nothing more.
    assert not executor.tell_membership(moved)
    assert len((member.dir / MEMBERSHIP_FILE).read_text().splitlines()) == 2
    # Never restarted: the same process, still running, no exit.
    assert executor.poll() == [] and executor.running() == [first.key]
    assert (member.dir / "member.json").exists() and member.exit is None
    assert json.loads((member.dir / "member.json").read_text())["pid"] == pid


@pytest.mark.skipif(os.geteuid() != 0, reason="PID namespaces need root")
def test_a_member_in_a_pid_namespace_gets_the_signal_and_its_keeper_lives_on(
    make_executor: MakeExecutor, fifo: Fifo
) -> None:
    executor = make_executor(pid_namespace=True)
    first = spec(
        (sys.executable, "-c", LISTENER, str(fifo.path), "SIGUSR2"), membership_signal="SIGUSR2"
    )
    member = executor.start(first)
    assert said(fifo)[0] == "started"
    wait_recorded(member.dir)
    assert executor.tell_membership(dataclasses.replace(first, membership=1))
    assert said(fifo)[0] == "told"
    time.sleep(0.1)  # a keeper the signal ended would have ended the member with it
    assert executor.poll() == [] and executor.running() == [first.key]


def test_every_signal_a_job_may_name_leaves_a_members_keeper_alive() -> None:
    """A keeper ends with the member it keeps: a job's membership signal must be one the
    keeper ignores, or one whose default action ends nothing."""
    harmless = {signal.SIGWINCH, signal.SIGCONT}
    assert {membership_signal(name) for name in SIGNALS} <= set(pidns._POLITE) | harmless
    assert membership_signal("") is None and membership_signal("SIGKILL") is None


def test_a_generation_is_a_member_of_its_own(make_executor: MakeExecutor) -> None:
    executor = make_executor()
    command = "echo generation=$SYNAPSE_MEMBER_GENERATION; exit 3"
    old = spec(command, job_id="j", token=3, rank=1)
    new = spec(command, job_id="j", token=3, rank=1, generation=1)
    assert old.key != new.key and new.key == MemberKey("j", 3, 1, 1)
    dirs = [executor.start(d).dir for d in (old, new)]
    assert [d.name for d in dirs] == ["a1.t3.r1", "a1.t3.r1.g1"]
    exits: dict[MemberKey, MemberExit] = {}
    deadline = time.monotonic() + 10.0
    while len(exits) < 2:
        assert time.monotonic() < deadline, f"only {list(exits)} exited"
        exits.update(executor.poll())
        time.sleep(0.02)
    assert {key: e.exit_code for key, e in exits.items()} == {old.key: 3, new.key: 3}
    for d, mdir in zip((old, new), dirs, strict=True):
        assert (mdir / "output.log").read_text() == f"generation={d.generation}\n"
    assert executor.known == {old.key, new.key}
    exited = _report(new.key, MemberEventKind.EXITED, MemberExit(3, "exit 3", 0))
    assert (exited.rank, exited.generation, exited.exit_code) == (1, 1, 3)
    # Its cgroup and container names are its own too.
    assert cgroup_name(old.key) != cgroup_name(new.key)
    assert ImageRuntime.container_name(old.key) != ImageRuntime.container_name(new.key)
    # Its log is the rank's newest.
    assert find_member_dir(executor.root, "j", 1, 1) == dirs[1]


def test_records_without_a_generation_recover_as_generation_0(
    make_executor: MakeExecutor, tmp_path: Path
) -> None:
    job_dir = tmp_path / "node" / "members" / "j"
    for name in ("a2.t7.r0", "a2.t7.r0.g2"):
        (job_dir / name).mkdir(parents=True)
        write_exit_record(job_dir / name, MemberExit(0, "", 5))
    (job_dir / "a2.t7.r0.g0").mkdir()  # not a name this worker writes: ignored
    executor = make_executor()
    found = dict(executor.recover())
    assert set(found) == {MemberKey("j", 7, 0), MemberKey("j", 7, 0, 2)}
    assert executor.known == set(found)
    assert parse_member_dir_name("a2.t7.r0") == (2, 7, 0, 0)
    assert parse_member_dir_name("a2.t7.r0.g0") is None


# ------------------------------------------------------------------- the agent


@pytest.fixture
def parts() -> Parts:
    clock = FakeClock()
    control = FakeControl(clock)
    executor = FakeExecutor()
    registration = pb.RegisterNodeRequest(node_id="n1", address="127.0.0.1:7070")
    return Agent(registration, control, executor, clock), control, executor, clock


def wanted(job: str, token: int, rank: int, **fields: object) -> pb.DesiredMember:
    """A desired member as a leader sends it (``true`` unless ``command`` is given)."""
    fields.setdefault("command", ["true"])
    return pb.DesiredMember(
        job_id=job,
        fencing_token=token,
        attempt=1,
        rank=rank,
        world_size=2,
        **fields,  # type: ignore[arg-type]
    )


def test_a_new_generation_starts_only_once_the_old_one_is_gone(parts: Parts) -> None:
    agent, control, executor, clock = parts
    control.desired = [wanted("j", 5, 0, gpus=[0])]
    agent.step()
    # The rank's GPU failed: the leader placed it again, on another GPU of this node.
    control.desired = [wanted("j", 5, 0, gpus=[1], generation=1)]
    clock.advance(1.0)
    sentence = agent.step()
    assert executor.stopped == [MemberKey("j", 5, 0)]
    assert "1 member(s) waiting for their rank's other generation to end" in sentence
    clock.advance(1.0)
    agent.step()  # still stopping: still waiting
    assert executor.started == [MemberKey("j", 5, 0)]
    executor.exit(MemberKey("j", 5, 0), 143)
    clock.advance(1.0)
    agent.step()
    assert executor.started == [MemberKey("j", 5, 0), MemberKey("j", 5, 0, 1)]
    clock.advance(1.0)
    agent.step()
    sent = [(r.kind, r.generation) for r in control.heartbeats[-1].reports]
    assert (pb.MemberReport.STARTED, 1) in sent
    assert [r.generation for r in control.heartbeats[-1].running] == [1]


def test_the_agent_tells_running_members_of_a_higher_membership_only(parts: Parts) -> None:
    agent, control, executor, clock = parts
    control.desired = [wanted("j", 5, 0), wanted("j", 5, 1)]
    agent.step()
    clock.advance(1.0)
    agent.step()  # membership 0: nothing to tell
    assert executor.told == []
    control.desired = [wanted("j", 5, 0, membership=1), wanted("j", 5, 1, membership=1)]
    clock.advance(1.0)
    assert "told 2 member(s) of a new membership" in agent.step()
    clock.advance(1.0)
    agent.step()  # the same records again
    assert executor.told == [(MemberKey("j", 5, 0), 1), (MemberKey("j", 5, 1), 1)]
    assert executor.started == [MemberKey("j", 5, 0), MemberKey("j", 5, 1)]
    assert executor.stopped == []


def test_two_generations_of_a_rank_never_run_at_once_on_real_processes(
    make_executor: MakeExecutor, fifo: Fifo
) -> None:
    """Generation 0 takes a while to stop (it traps SIGTERM); generation 1, desired at
    once, starts only after it has ended."""
    clock = FakeClock()
    control = FakeControl(clock)
    executor = make_executor(stop_grace_s=5.0)
    agent = Agent(
        pb.RegisterNodeRequest(node_id="n1", address="127.0.0.1:7070"),
        control,
        executor,
        clock,
        timings=AgentTimings(heartbeat_interval_s=1.0, lease_ttl_s=3600.0),
    )
    old = (
        f"trap 'sleep 0.3; echo old ended > {fifo.path}; exit 143' TERM; "
        f"echo old started > {fifo.path}; while :; do sleep 0.05; done"
    )
    control.desired = [wanted("j", 5, 0, command=[old], shell=True)]
    agent.step()
    assert fifo.read_line() == "old started"
    new = f"echo new started > {fifo.path}"
    control.desired = [wanted("j", 5, 0, command=[new], shell=True, generation=1)]
    deadline = time.monotonic() + 15.0
    while MemberKey("j", 5, 0, 1) not in executor.known:
        assert time.monotonic() < deadline, "generation 1 never started"
        clock.advance(1.0)
        agent.step()
        time.sleep(0.02)
    assert [fifo.read_line(), fifo.read_line()] == ["old ended", "new started"]
