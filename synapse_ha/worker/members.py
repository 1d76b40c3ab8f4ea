"""Gang members on this node: their launch, their records and their ends.

Every member runs under its own supervisor (:mod:`synapse_ha.worker.shim`), which starts
it as a process group of its own (with ``pid_namespace``, in a PID namespace of its own:
:mod:`synapse_ha.worker.pidns`) and kills that group when the lease expires, when the
agent goes away, on a stop request, or at the time limit. With ``fork_server`` set the
supervisors are forked from one pre-started process (:mod:`synapse_ha.worker.forkserver`,
which explains why a member still never outlives its lease) instead of each starting an
interpreter (:mod:`synapse_ha.worker.supervisors`). This module is the agent's side:

* :class:`MemberExecutor` starts, stops and polls members, and keeps one directory per
  member under ``DATA_DIR/members/JOB_ID/`` holding the launch description, the output
  log, the supervisor's pid record and the exit record. A member directory is never
  removed while the agent runs, so a (job, fencing token, rank) that ever started here is
  never started again, also after an agent restart;
* the launch path is a privilege boundary (:mod:`synapse_ha.worker.launch`): when the
  agent is root, nothing the job controls reaches a root process. The member's
  environment (:mod:`synapse_ha.worker.environment`) is used only after the drop to its
  owner; the supervisors get a cleaned one, the container runtime a fixed one, by
  absolute path, with the image checked as an image reference and containers confined
  (:mod:`synapse_ha.worker.images`). Everything the agent reads back as root (records,
  lease) is in directories only it may write, and read and written without following
  links (:mod:`synapse_ha.worker.records`);
* :meth:`MemberExecutor.recover` runs at agent start: anything left from a previous life
  of the agent is killed (never re-adopted) and reported as lost.

A member is what the leader wants run (:class:`~synapse_ha.core.desired.DesiredMember`);
its identity is (job_id, fencing_token, rank, generation):
:class:`~synapse_ha.core.desired.MemberKey`. A rank placed again on this node (a higher
generation) is another member, with a directory, records and reports of its own. While a
member runs, a higher membership count in its desired record is written to its
``$SYNAPSE_MEMBERSHIP_FILE`` and signalled (:meth:`MemberExecutor.tell_membership`,
:mod:`synapse_ha.worker.membership`).
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from synapse_ha.core.desired import DesiredMember, MemberKey
from synapse_ha.core.health.slowness import PaceReport
from synapse_ha.worker.accounts import (
    Account,
    AccountLookup,
    RunAsRefusal,
    agent_user_name,
    local_account,
    resolve_member_account,
)
from synapse_ha.worker.cgroups import CgroupLimiter
from synapse_ha.worker.checkpoint_files import CheckpointWatches, Mark, create_checkpoint_file
from synapse_ha.worker.environment import member_base_environment
from synapse_ha.worker.images import ImageRuntime, NoImageRuntime
from synapse_ha.worker.launch import (
    container_process,
    create_progress_file,
    give_to_owner,
    host_process,
    member_argv,
    prestart_record,
    progress_fields,
)
from synapse_ha.worker.member_dirs import (
    EXIT_LOST,
    MemberExit,
    collect_exit,
    member_dir_name,
    parse_member_dir_name,
    recover_exit,
    tolerate_full_disk,
    write_exit_record,
)
from synapse_ha.worker.member_types import (
    ExecutorSettings,
    Member,
    PreemptNotice,
    cgroup_name,
    known_only,
)
from synapse_ha.worker.membership import (
    append_membership,
    create_membership_file,
    membership_signal,
)
from synapse_ha.worker.pace import PaceWatches
from synapse_ha.worker.procgroup import (
    group_alive,
    process_start_ticks,
    running_groups,
    signal_group,
)
from synapse_ha.worker.records import read_json, write_json_atomic
from synapse_ha.worker.shim import PREEMPT_FILE
from synapse_ha.worker.supervisors import SupervisorStarter

__all__ = [
    "EXIT_REFUSED",
    "ExecutorSettings",
    "Member",
    "MemberExecutor",
    "PreemptNotice",
]

log = logging.getLogger("synapse.worker.members")

# A member this node refuses to run under its owner's account (no such account, or root).
EXIT_REFUSED = 126
_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
# The members root and each job's directory: entered by every member on the way to its
# own directory, listed and changed by the agent alone.
PASSAGE_MODE = 0o711


class MemberExecutor:
    """Starts, stops and observes the members of this node. Not thread-safe: the agent
    loop is its only caller (the log server only reads files)."""

    def __init__(
        self,
        data_dir: Path,
        lease_path: Path,
        settings: ExecutorSettings | None = None,
        *,
        image_runtime: ImageRuntime | None = None,
        cgroups: CgroupLimiter | None = None,
        wall_clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        lookup_account: AccountLookup = local_account,
    ) -> None:
        self.root = data_dir / "members"
        self.root.mkdir(parents=True, exist_ok=True)
        # Members reach their own directory (and their preemption notice) through it;
        # no one but the agent may list or change it.
        self.root.chmod(PASSAGE_MODE)
        self.lease_path = lease_path
        self.settings = settings or ExecutorSettings()
        self.image_runtime = image_runtime
        self.cgroups = cgroups
        self.wall_clock_ms = wall_clock_ms
        self.lookup_account = lookup_account
        self.members: dict[MemberKey, Member] = {}
        # Every key that ever started on this node (persisted as member directories).
        self.known: set[MemberKey] = set()
        self.highest_token: dict[str, int] = {}
        # Members that failed before a supervisor could start (bad command, no runtime).
        self._immediate_exits: list[tuple[MemberKey, MemberExit]] = []
        # The runtime's client, run as root, gets the agent's own home.
        self._agent_home, self._agent_user = _home_of(os.geteuid()), agent_user_name()
        self._supervisors = SupervisorStarter(
            self.settings.python, self.settings.fork_server, self.settings.fence_grace_s
        )
        self.checkpoints = CheckpointWatches()  # the members' $SYNAPSE_CHECKPOINT_FILE
        self.pace_watches = PaceWatches(time.monotonic)  # their $SYNAPSE_PROGRESS_FILE

    # ------------------------------------------------------------- lifecycle

    def member_dir(self, key: MemberKey, attempt: int) -> Path:
        name = member_dir_name(attempt, key.fencing_token, key.rank, key.generation)
        return self.root / key.job_id / name

    def start(self, desired: DesiredMember, preempted: PreemptNotice | None = None) -> Member:
        """Start one member under its supervisor. Never raises for a bad command or an
        owner this node will not run members as: those come back as an exit (code 127,
        resp. :data:`EXIT_REFUSED` with the refusal as detail) on the next :meth:`poll`.

        ``preempted``: the member's gang was preempted before it started here. Nothing is
        run; the member is recorded (so it never starts later) with an exit of 143, a
        disruption, which confirms to the leader that it is stopped.

        When the member runs as its owner, its output log belongs to the owner (0600)
        and its directory may be entered by the owner's group, not listed or changed
        (0710: the launch, pid and exit records in it are the agent's, 0600, and the agent
        acts on them as root); the supervisor drops to the owner's uid, gid and groups in
        the member's process before it enters ``workdir`` and execs. A member in a
        container gets its variables through the env file only; the runtime's client
        gets the fixed environment of :meth:`ImageRuntime.client_environment`.

        Not idempotent by itself: the caller checks :attr:`known` first.
        """
        member = self._new_member(desired)
        if preempted is not None:
            detail = preempted.not_started_detail()
            self._record_exit(member, MemberExit(143, detail, member.started_at_ms, disrupted=True))
            return member
        launch = self._launch_record(member)
        if isinstance(launch, MemberExit):
            self._record_exit(member, launch)
        else:
            self._start_supervisor(member, launch)
        return member

    def _new_member(self, desired: DesiredMember) -> Member:
        """The member's directory (which must not exist yet) and empty output log, and
        the member known from now on. Raises ValueError for a job id that is not a safe
        file name."""
        key = desired.key
        if not _SAFE_NAME.match(desired.job_id):
            raise ValueError(f"job id {desired.job_id!r} is not a safe file name")
        mdir = self.member_dir(key, desired.attempt)
        mdir.parent.mkdir(exist_ok=True)
        mdir.parent.chmod(PASSAGE_MODE)
        mdir.mkdir(mode=0o700, exist_ok=False)
        self._remember(key)
        member = Member(
            desired=desired,
            dir=mdir,
            shim=None,
            started_at_ms=self.wall_clock_ms(),
            membership=desired.membership,
        )
        self.members[key] = member
        log_path = mdir / "output.log"
        os.close(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        return member

    def _remember(self, key: MemberKey) -> None:
        self.known.add(key)
        self.highest_token[key.job_id] = max(
            self.highest_token.get(key.job_id, 0), key.fencing_token
        )

    def _member_account(self, member: Member) -> Account | MemberExit | None:
        """The account the member runs as (None: the agent's), or the refusal's exit."""
        if self.settings.run_as is None:
            return None
        resolved = resolve_member_account(
            self.settings.run_as, member.desired.owner, self.lookup_account
        )
        if isinstance(resolved, RunAsRefusal):
            detail = resolved.describe()
            return MemberExit(EXIT_REFUSED, detail, member.started_at_ms, node_fault=True)
        return resolved

    def _launch_record(self, member: Member) -> dict[str, Any] | MemberExit:
        """The member's ``launch.json``, or the exit of a member that cannot start: an
        owner this node refuses, a command it cannot run, files it could not give to the
        owner. A member on the host gets its cgroup here."""
        desired, mdir, now_ms = member.desired, member.dir, member.started_at_ms
        account = self._member_account(member)
        if isinstance(account, MemberExit):
            return account
        try:
            argv = member_argv(desired, self.image_runtime, account, mdir)
        except NoImageRuntime as exc:
            return MemberExit(127, f"could not exec: {exc}", now_ms, node_fault=True)
        except ValueError as exc:
            return MemberExit(127, f"could not exec: {exc}", now_ms)
        log_path = mdir / "output.log"
        progress_path = create_progress_file(desired, mdir)
        checkpoint_path = create_checkpoint_file(mdir)
        create_membership_file(mdir, desired)
        self.checkpoints.watch(member.key, checkpoint_path)
        if progress_path is not None:
            self.pace_watches.watch(member.key, progress_path)
        if account is not None:
            try:
                give_to_owner(mdir, log_path, account, progress_path, checkpoint_path)
            except OSError as exc:
                detail = f"could not give the member's files to {account.name}: {exc}"
                return MemberExit(EXIT_REFUSED, detail, now_ms, node_fault=True)
        cgroup_dir, settings = "", self.settings
        base = member_base_environment(
            account,
            settings.base_env,
            settings.member_env_passthrough,
            self._agent_home,
            self._agent_user,
        )
        if desired.spec.image and self.image_runtime is not None:
            passthrough = {k: base[k] for k in settings.member_env_passthrough if k in base}
            process = container_process(
                desired, self.image_runtime, account, mdir, self._agent_home, passthrough
            )
        else:
            process = host_process(desired, base, account, mdir)
            if self.cgroups is not None:
                resources = desired.spec.resources
                cgroup_dir = self.cgroups.create(
                    cgroup_name(member.key), resources.cpu_milli, resources.memory_mib
                )
        return {
            "key": list(member.key),
            "attempt": desired.attempt,
            "argv": argv,
            **process.launch_fields(),
            "log_path": str(log_path),
            "lease_path": str(self.lease_path),
            "parent_pid": os.getpid(),  # or the fork server's: see SupervisorStarter.start
            # The job's own stop grace, else the node's.
            "stop_grace_s": desired.spec.stop_grace_ms / 1000 or self.settings.stop_grace_s,
            "fence_grace_s": self.settings.fence_grace_s,
            "time_limit_ms": desired.spec.time_limit_ms,
            **progress_fields(desired, log_path, progress_path),
            "cgroup_dir": cgroup_dir,
            "self_fencing": settings.self_fencing,
            # A container has the PID namespace its runtime gives it.
            "pid_namespace": settings.pid_namespace and process.container is None,
            "prestart": prestart_record(desired, base, account, mdir, settings.pid_namespace),
        }

    def _start_supervisor(self, member: Member, launch: dict[str, Any]) -> None:
        try:
            member.shim = self._supervisors.start(member.dir, launch)
        except OSError as exc:
            detail = f"could not start supervisor: {exc}"
            exit_ = MemberExit(127, detail, member.started_at_ms, node_fault=True)
            self._record_exit(member, exit_)
            return
        if isinstance(member.shim, subprocess.Popen):
            # A forked supervisor writes its own record (the agent learns its pid later).
            write_json_atomic(
                member.dir / "shim.json",
                {"pid": member.shim.pid, "start_ticks": process_start_ticks(member.shim.pid)},
            )

    @property
    def fork_server_pid(self) -> int | None:
        """The running fork server's pid (started now if it is not running), or None
        without one."""
        return self._supervisors.fork_server_pid

    def close(self) -> None:
        """Stop the fork server, if any. Supervisors it forked watch it: call this only
        once every member is stopped (:meth:`stop_all`)."""
        self._supervisors.close()

    def stop(self, key: MemberKey) -> None:
        """Ask a member's supervisor to stop it (SIGTERM, grace, SIGKILL). Asynchronous and
        idempotent; the exit shows up in :meth:`poll`."""
        member = self.members.get(key)
        if member is None or member.exit is not None or member.stop_sent:
            return
        member.stop_sent = True
        if member.shim is not None and member.shim.poll() is None:
            member.shim.send_signal(signal.SIGTERM)

    def preempt(self, key: MemberKey, notice: PreemptNotice) -> None:
        """Stop a member whose gang is preempted: write the notice to the member's
        ``$SYNAPSE_PREEMPT_FILE`` (JSON: kind, preemptor, grace_ms, and ``checkpoint``:
        true, asking the gang to save and mark a checkpoint), then ask its
        supervisor to stop it, which sends SIGTERM to the member's process group at once
        and SIGKILL when ``notice.grace_ms`` has passed (the lease still ends it sooner).
        Asynchronous and idempotent; the exit shows up in :meth:`poll`, a disruption."""
        member = self.members.get(key)
        if member is None or member.exit is not None or member.stop_sent:
            return
        notice_doc = {
            "kind": notice.kind,
            "preemptor": notice.preemptor,
            "grace_ms": max(0, notice.grace_ms),
            "checkpoint": True,
        }
        # On a full disk the member is stopped all the same, without the notice (its
        # supervisor then gives it the plain stop grace).
        tolerate_full_disk(
            # The member reads it, as its owner: readable by all who may enter the
            # member directory (the agent and the owner's group).
            lambda: write_json_atomic(member.dir / PREEMPT_FILE, notice_doc, 0o644),
            member.dir,
        )
        log.info(
            "preempting %s (%s, for job %s; grace %d ms)",
            key,
            notice.kind,
            notice.preemptor,
            notice.grace_ms,
        )
        self.stop(key)

    def tell_membership(self, desired: DesiredMember) -> bool:
        """Tell a running member that its gang's membership changed, when ``desired`` (its
        record now) shows a higher count than it was last told of: append the new line to
        its ``$SYNAPSE_MEMBERSHIP_FILE`` (on disk first), then send the job's membership
        signal, if any, to its process group. The member is not stopped or restarted.
        Returns whether a line was written; a line that could not be (a full disk) is
        tried again with the next record. Costs one comparison when nothing changed."""
        member = self.members.get(desired.key)
        if member is None or desired.membership <= member.membership:
            return False
        if member.exit is not None or member.stop_sent:
            return False
        try:
            append_membership(member.dir, desired)
        except OSError as exc:
            log.error("could not tell %s of membership %d: %s", member.key, desired.membership, exc)
            return False
        member.membership = desired.membership
        member.desired = desired
        sig = membership_signal(desired.membership_signal)
        if sig is not None:
            self._signal_member_group(member, sig)
        log.info("told %s of membership %d", desired.key, desired.membership)
        return True

    def poll(self) -> list[tuple[MemberKey, MemberExit]]:
        """Members whose supervisor has finished since the last call, with their exit."""
        out, self._immediate_exits = self._immediate_exits, []
        for member in self.members.values():
            if member.exit is not None or member.shim is None:
                continue
            if member.shim.poll() is None:
                continue
            out.append((member.key, self._collect_exit(member)))
        return out

    def running(self) -> list[MemberKey]:
        return [k for k, m in self.members.items() if m.exit is None]

    def marks(self, keys: Iterable[MemberKey]) -> list[tuple[MemberKey, Mark]]:
        """The new checkpoint mark of each of ``keys`` whose file changed since the last
        call (:mod:`synapse_ha.worker.checkpoint_files`)."""
        return self.checkpoints.poll(keys)

    def paces(self, keys: Iterable[MemberKey]) -> list[PaceReport]:
        """The pace each of ``keys`` reported in the window (:mod:`synapse_ha.worker.pace`)."""
        return self.pace_watches.poll(keys)

    def gpus_held(self) -> dict[MemberKey, tuple[int, ...]]:
        """The GPUs of each running member (one whose supervisor has not yet recorded
        that its whole process group is gone)."""
        return {
            k: m.desired.gpus for k, m in self.members.items() if m.exit is None and m.desired.gpus
        }

    def kill_all(self, detail: str, timeout_s: float = 10.0) -> list[tuple[MemberKey, MemberExit]]:
        """Fence: kill every running member now (SIGTERM, ``fence_grace_s``, SIGKILL) and
        wait until their supervisors are gone. Returns the exits, each naming ``detail``,
        except those of members that had already exited by themselves (left to poll())."""
        live = [m for m in self.members.values() if m.exit is None]
        # A member whose supervisor recorded its exit before the fence ended by itself:
        # what is left of it is killed all the same, but that exit stands (an exit 0 is a
        # success the leader may not have seen yet) and the next poll() returns it.
        ended = {m.key for m in live if (m.dir / "exit.json").exists()}
        for m in live:
            # The supervisor fences its member (also one it is starting right now); the
            # group is signalled directly too in case the supervisor is stuck.
            if m.shim is not None and m.shim.poll() is None:
                m.shim.send_signal(signal.SIGUSR1)
            self._signal_member_group(m, signal.SIGTERM)
        deadline = time.monotonic() + self.settings.fence_grace_s + 1.0
        while time.monotonic() < deadline and any(self._tree_alive(m) for m in live):
            time.sleep(0.01)
        for m in live:
            self._signal_member_group(m, signal.SIGKILL)
            if m.shim is not None and m.shim.poll() is None:
                m.shim.kill()
        out = []
        for m in live:
            if m.shim is not None:
                try:
                    m.shim.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    log.error("supervisor of %s did not exit after SIGKILL", m.key)
            if m.key in ended:
                continue
            found = self._collect_exit(m)
            exit_code = found.exit_code if found.exit_code != 0 else EXIT_LOST
            m.exit = MemberExit(exit_code, detail, found.ended_at_ms, disrupted=True)
            self._write_exit_record(m)
            out.append((m.key, m.exit))
        return out

    def stop_all(self, timeout_s: float) -> list[tuple[MemberKey, MemberExit]]:
        """Graceful shutdown: stop every member and wait up to ``timeout_s``; whatever is
        left then is killed. Every exit it returns counts as a disruption: the members
        ended because the worker stopped, not by their own doing."""
        for key in self.running():
            self.stop(key)
        deadline = time.monotonic() + timeout_s
        out = []
        while self.running() and time.monotonic() < deadline:
            out += self.poll()
            time.sleep(0.02)
        out += self.poll()
        if self.running():
            out += self.kill_all("killed at worker shutdown")
            out += self.poll()  # members that ended by themselves meanwhile
        return [(key, replace(exit_, disrupted=True)) for key, exit_ in out]

    # ---------------------------------------------------------------- records

    def recover(self) -> list[tuple[MemberKey, MemberExit]]:
        """At agent start: learn every member this node ever ran, kill whatever a previous
        life of the agent left running, and return the exits not yet reported (members
        left running come back as lost, exit code 137). Nothing is re-adopted."""
        out = []
        killed_groups: list[int] = []
        for job_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for mdir in sorted(p for p in job_dir.iterdir() if p.is_dir()):
                found = self._recover_member(job_dir.name, mdir, killed_groups)
                if found is not None:
                    out.append(found)
        # Report them lost only once nothing of them runs any more.
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and running_groups() & set(killed_groups):
            time.sleep(0.01)
        return out

    def _recover_member(
        self, job_id: str, mdir: Path, killed_groups: list[int]
    ) -> tuple[MemberKey, MemberExit] | None:
        """One member directory at agent start: the member becomes known, whatever of it
        still runs is killed (its group added to ``killed_groups``), and its exit is
        returned unless it was reported already."""
        parsed = parse_member_dir_name(mdir.name)
        if parsed is None:
            return None
        attempt, token, rank, generation = parsed
        key = MemberKey(job_id, token, rank, generation)
        self._remember(key)
        exit_ = recover_exit(mdir, self.wall_clock_ms, killed_groups)
        if exit_ is None:
            return None
        member = Member(known_only(key, attempt), dir=mdir, shim=None, started_at_ms=0, exit=exit_)
        self._write_exit_record(member)
        self.members[key] = member
        return key, exit_

    def mark_reported(self, key: MemberKey) -> None:
        """The control plane has acknowledged this member's exit; it is never reported
        again, also after an agent restart."""
        member = self.members.pop(key, None)
        self.checkpoints.forget(key)
        self.pace_watches.forget(key)
        if member is not None:
            # Without the mark (a full disk) an agent restarted later reports the exit
            # again: reports are at-least-once.
            tolerate_full_disk(lambda: (member.dir / "reported").touch(0o600), member.dir)
            if self.cgroups is not None:
                self.cgroups.remove(cgroup_name(key))

    # ---------------------------------------------------------------- helpers

    def _collect_exit(self, member: Member) -> MemberExit:
        member.exit = collect_exit(member.dir, self.wall_clock_ms())
        return member.exit

    def _record_exit(self, member: Member, exit_: MemberExit) -> None:
        member.exit = exit_
        self._write_exit_record(member)

        def note() -> None:
            with open(member.dir / "output.log", "ab") as f:
                f.write(f"synapse-worker: {exit_.detail}\n".encode())

        tolerate_full_disk(note, member.dir)
        self._immediate_exits.append((member.key, exit_))

    def _write_exit_record(self, member: Member) -> None:
        """The exit on disk, for an agent restarted later; the exit this agent reports is
        the one in memory, so a full disk only loses the copy."""
        assert member.exit is not None
        write_exit_record(member.dir, member.exit)

    def _signal_member_group(self, member: Member, sig: int) -> None:
        record = read_json(member.dir / "member.json")
        if record and isinstance(record.get("pgid"), int):
            signal_group(int(record["pgid"]), sig)

    def _tree_alive(self, member: Member) -> bool:
        record = read_json(member.dir / "member.json")
        if record and isinstance(record.get("pgid"), int) and group_alive(int(record["pgid"])):
            return True
        return member.shim is not None and member.shim.poll() is None


def _home_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return "/"
