"""The Python client of a synapse cluster: submit, watch, read logs and cancel from Python
(a notebook, a pipeline, an orchestrator's task) with the rules synctl follows.

    from synapse_ha.client import Cluster

    cluster = Cluster.from_env()
    job = cluster.submit("train.yaml")
    for line in job.logs(follow=True):
        print(line)
    info = job.wait()
    assert info.succeeded, info.reason

:meth:`Cluster.from_env` finds the replicas and the credentials as synctl does
(:mod:`synapse_ha.client.credentials`). Every call goes to the leader, follows redirects
and retries as :class:`~synapse_ha.client.cluster.ClusterClient` does (it is the same
client). A failure is raised as a :class:`SynapseError` carrying the cluster's reason
code (``JOB_NOT_FOUND``, ``INVALID_FIELD``, ``PERMISSION_DENIED``...): its subclasses
name the cases a caller branches on. ``docs/python.md`` lists the public surface.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from synapse_ha.client import credentials
from synapse_ha.client.cluster import ClusterClient, new_request_id
from synapse_ha.client.errors import (
    InvalidSpec,
    SynapseError,
    WaitTimedOut,
    translated,
)
from synapse_ha.client.logs import (
    GrantCache,
    LogLine,
    LogLines,
    MemberFollower,
    MemberLog,
    WorkerUnreachable,
    fetch_grant,
    read_log,
    stop_followers,
)
from synapse_ha.client.specfile import (
    SpecFileError,
    SpecFileUnreadable,
    line_in_file,
    load_job_file,
)
from synapse_ha.core.model import JobState
from synapse_ha.core.spec.document import ParsedJob, SpecError, parse_job_spec
from synapse_ha.core.workflows.arrays import array_problems, task_id
from synapse_ha.core.workflows.dependencies import Dependencies, dependency_problems, merged
from synapse_ha.rpc.errors import Reason
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.states import job_state
from synapse_ha.rpc.to_proto import spec_to_proto
from synapse_ha.security.tls import TlsFiles, Transport

# Jobs in one SubmitJobs call of submit_many (the most the cluster takes in one).
SUBMIT_BATCH = 1_000
# How often wait() and logs(follow=True) ask for the job's state.
POLL_INTERVAL_S = 0.5
# After a followed job ends, how long its members' log streams may take to deliver the rest.
FOLLOW_DRAIN_S = 5.0


# ---------------------------------------------------------------------- job values


@dataclass(frozen=True, slots=True)
class Member:
    """Where one member of the job's current (or last) attempt runs."""

    rank: int
    node_id: str


@dataclass(frozen=True, slots=True)
class JobInfo:
    """One job as the cluster knows it at the time of the call. ``reason_code`` is the
    machine-readable code of ``reason`` (``waiting_capacity``, ``failed_exit``...);
    ``raw`` is the whole ``synapse.v1.Job`` message for anything not named here."""

    id: str
    name: str
    state: JobState
    reason: str
    reason_code: str
    owner: str
    attempt: int  # 0 before the first placement
    members: tuple[Member, ...]
    submitted_at_ms: int
    finished_at_ms: int
    raw: pb.Job
    # Dependencies not met yet, as (kind, job id): the job is not placed meanwhile.
    waiting_for: tuple[tuple[str, str], ...] = ()
    # The step its next attempt resumes from (docs/checkpoints.md); None: none.
    resume_step: int | None = None

    @property
    def finished(self) -> bool:
        return self.state.finished

    @property
    def succeeded(self) -> bool:
        return self.state is JobState.SUCCEEDED

    @classmethod
    def of(cls, job: pb.Job) -> JobInfo:
        started = job.HasField("attempt")
        return cls(
            id=job.job_id,
            name=job.spec.name,
            state=job_state(job),
            reason=job.reason,
            reason_code=job.reason_code,
            owner=job.owner,
            attempt=job.attempt.number if started else 0,
            members=tuple(Member(m.rank, m.node_id) for m in job.attempt.members)
            if started
            else (),
            submitted_at_ms=job.submitted_at_ms,
            finished_at_ms=job.finished_at_ms,
            raw=job,
            waiting_for=Dependencies(
                tuple(job.waiting_for.after_ok),
                tuple(job.waiting_for.after_any),
                tuple(job.waiting_for.after_not_ok),
                tuple(job.waiting_for.after),
            ).pairs(),
            resume_step=job.resume_step if job.HasField("resume_step") else None,
        )


# ---------------------------------------------------------------------------- jobs


@dataclass(frozen=True, eq=False, repr=False)
class _Handle:
    """A handle on what ``id`` names in ``cluster``; ``created`` False: the request id
    named one submitted before."""

    cluster: Cluster
    id: str
    created: bool = True

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id!r})"


class Job(_Handle):
    """A handle on one job of a :class:`Cluster`; every property or method asks the
    cluster afresh."""

    def info(self) -> JobInfo:
        """The job now (``GetJob``)."""
        with translated(self.id):
            return JobInfo.of(self.cluster.client.get_job(self.id))

    @property
    def state(self) -> JobState:
        return self.info().state

    def wait(self, timeout_s: float | None = None, poll_s: float = POLL_INTERVAL_S) -> JobInfo:
        """Block until the job finished (SUCCEEDED, FAILED or CANCELLED) and return it;
        :class:`WaitTimedOut` after ``timeout_s`` (None: no limit)."""
        info = _until_finished(self.info, timeout_s, poll_s)
        if not info.finished:
            raise WaitTimedOut(info, timeout_s or 0.0)
        return info

    def cancel(self, reason: str = "") -> JobInfo:
        """Cancel the job (a pending one never starts, a running one's members are
        stopped) and return it. Cancelling a job already cancelled returns it; one that
        finished otherwise raises :class:`SynapseError` (``CONFLICT``)."""
        try:
            with translated(self.id):
                self.cluster.client.cancel_job(self.id, reason)
        except SynapseError as exc:
            if exc.reason != str(Reason.CONFLICT) or self.info().state is not JobState.CANCELLED:
                raise
        return self.info()

    def explain(self) -> pb.ExplainJobResponse:
        """Why the job is pending, or where each member runs (``ExplainJob``)."""
        with translated(self.id):
            return self.cluster.client.explain_job(self.id)

    def logs(self, follow: bool = False, member: int | None = None) -> Iterator[LogLine]:
        """The members' output, line by line (only rank ``member`` when given), read
        straight from the workers. Without ``follow``: what the current or last attempt
        wrote so far. With ``follow``: new lines as they are written until the job ends,
        a retry's new attempt from its start. A member whose worker cannot be reached
        is skipped (``follow`` keeps trying)."""
        if follow:
            yield from self._follow(member)
            return
        info = self.info()
        lines = LogLines(info.attempt)
        for log in self._member_logs(info, member):
            try:
                for data in read_log(
                    log, self.cluster.client.timeout_s, self.cluster.transport, self._grant(log)
                ):
                    lines.feed(log.rank, data)
            except (LookupError, WorkerUnreachable):
                pass  # not started yet, or its worker is gone: no output to give
            finally:
                lines.flush(log.rank)
            yield from lines.drain()

    def _grant(self, log: MemberLog) -> str | None:
        with translated(self.id):
            return self.cluster.grants.get(log)

    def _member_logs(self, info: JobInfo, member: int | None) -> list[MemberLog]:
        if member is not None and all(m.rank != member for m in info.members):
            raise SynapseError("MEMBER_NOT_FOUND", f"job {self.id} has no member {member}")
        addresses = self.cluster.node_addresses()
        return [
            MemberLog(self.id, info.attempt, m.rank, m.node_id, addresses[m.node_id])
            for m in info.members
            if (member is None or m.rank == member) and m.node_id in addresses
        ]

    def _follow(self, member: int | None) -> Iterator[LogLine]:
        followers: list[MemberFollower] = []
        followed = 0
        lines = LogLines(0)
        try:
            while True:
                info = self.info()
                if info.attempt and info.attempt != followed:
                    stop_followers(followers, FOLLOW_DRAIN_S)
                    yield from lines.drain()
                    lines = LogLines(info.attempt)
                    for log in self._member_logs(info, member):
                        self._grant(log)  # here, so that a refusal reaches the caller
                        follower = MemberFollower(
                            log, lines, self.cluster.transport, self.cluster.grants
                        )
                        follower.start()
                        followers.append(follower)
                    followed = info.attempt
                yield from lines.drain()
                if info.finished:
                    stop_followers(followers, FOLLOW_DRAIN_S)
                    yield from lines.drain()
                    return
                time.sleep(POLL_INTERVAL_S)
        finally:
            for follower in followers:
                follower.stop()


# ------------------------------------------------------------------------- cluster

# Jobs named as dependencies: a Job, a job id, or several.
Jobs = Job | str | Iterable[Job | str]


@dataclass(frozen=True, slots=True)
class ArrayInfo:
    """An array as the cluster knows it at the time of the call: its tasks (those still
    kept) counted by state. ``raw`` is the whole ``synapse.v1.ArraySummary``."""

    id: str
    name: str
    owner: str
    tasks: int
    throttle: int  # at most this many tasks run at once (0: no bound)
    task_states: dict[JobState, int]
    raw: pb.ArraySummary

    @property
    def finished(self) -> bool:
        """Every task finished (however)."""
        return sum(n for s, n in self.task_states.items() if s.finished) == self.tasks

    @property
    def succeeded(self) -> bool:
        return self.task_states.get(JobState.SUCCEEDED, 0) == self.tasks

    @classmethod
    def of(cls, array: pb.ArraySummary) -> ArrayInfo:
        counts = {JobState(s): n for s, n in sorted(array.task_states.items())}
        return cls(
            id=array.array_id,
            name=array.spec.name,
            owner=array.owner,
            tasks=array.tasks,
            throttle=array.throttle,
            task_states=counts,
            raw=array,
        )


class Array(_Handle):
    """A handle on one array (:meth:`Cluster.submit_array`): its tasks are jobs,
    ``<array id>_<index>``, each with its own attempts and logs."""

    def info(self) -> ArrayInfo:
        """The array now (``GetArray``)."""
        with translated(self.id):
            return ArrayInfo.of(self.cluster.client.get_array(self.id))

    def task(self, index: int) -> Job:
        """A handle on the task ``index`` (a job)."""
        return Job(self.cluster, task_id(self.id, index))

    def tasks(self) -> list[JobInfo]:
        """Every task still kept, finished ones too, by index."""
        return self.cluster.jobs("all", array=self.id)

    def wait(self, timeout_s: float | None = None, poll_s: float = POLL_INTERVAL_S) -> ArrayInfo:
        """Block until every task finished and return the array; :class:`WaitTimedOut`
        after ``timeout_s`` (None: no limit)."""
        info = _until_finished(self.info, timeout_s, poll_s)
        if not info.finished:
            left = info.tasks - sum(n for s, n in info.task_states.items() if s.finished)
            what = f"array {self.id} still has {left} unfinished task(s)"
            raise WaitTimedOut(info, timeout_s or 0.0, what)
        return info

    def cancel(self, reason: str = "") -> ArrayInfo:
        """Cancel every unfinished task (finished ones keep how they ended)."""
        with translated(self.id):
            self.cluster.client.cancel_job(self.id, reason)
        return self.info()


class Cluster:
    """A connection to one cluster: its replicas' gRPC addresses (a list, or
    ``host:port,host:port``), a bearer ``token`` and the ``tls`` files to present (None:
    plaintext, for an ``--insecure`` cluster). ``timeout_s`` bounds each call, leader
    discovery and retries included; ``follower_reads`` lets followers serve its reads,
    never older than its own writes (docs/consistency.md). Close it (or use it in a
    ``with`` block)."""

    def __init__(
        self,
        addresses: str | Sequence[str],
        *,
        token: str | None = None,
        tls: TlsFiles | None = None,
        timeout_s: float = 10.0,
        follower_reads: bool = False,
    ) -> None:
        if isinstance(addresses, str):
            addresses = credentials.parse_cluster(addresses)
        elif not addresses:
            raise ValueError("no address given (expected host:port,host:port,...)")
        self.transport = Transport(tls)
        self.client = ClusterClient(
            list(addresses),
            timeout_s=timeout_s,
            per_try_timeout_s=min(2.0, timeout_s),
            token=token,
            channel_factory=self.transport.channel,
            follower_reads=follower_reads,
            fail_fast=True,
            secure=tls is not None,
        )
        self.grants = GrantCache(lambda log: fetch_grant(self.client, log))

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, timeout_s: float = 10.0
    ) -> Cluster:
        """The cluster and credentials synctl would use, found by
        :func:`synapse_ha.client.credentials.discover`: ``$SYNAPSE_CLUSTER``, else the
        running ``synctl dev up`` cluster (with its admin credentials), else the dev
        cluster's default addresses; the token and TLS files from the variables, the dev
        profile or the config directory. Raises
        :class:`~synapse_ha.client.credentials.CredentialsError` naming what is wrong."""
        env = dict(os.environ if environ is None else environ)
        found = credentials.discover(environ=env)
        return cls(found.addresses, token=found.token, tls=found.tls, timeout_s=timeout_s)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(
        self,
        spec: str | Path | Mapping[str, Any],
        *,
        request_id: str | None = None,
        after_ok: Jobs = (),
        after_any: Jobs = (),
        after_not_ok: Jobs = (),
        after: Jobs = (),
    ) -> Job:
        """Validate and submit a job spec: a YAML file's path, or the spec as a mapping
        (the same fields as the file). A spec breaking rules raises :class:`InvalidSpec`,
        listing every one, before anything is sent (a file that cannot be read raises
        its :class:`OSError`, such as :class:`FileNotFoundError`). The submission
        carries ``request_id`` (else the file's, else a fresh one), reused on every
        retry: submitting again with the same id returns the same job
        (:attr:`Job.created` is then False).

        ``after_ok``, ``after_any``, ``after_not_ok`` and ``after`` (each a :class:`Job`,
        a job id, or several) add to the spec's ``dependencies``: the job is placed only
        once the jobs named succeeded, finished, failed, or started, and is cancelled
        (reason ``dependency_never_satisfied``) when that can never happen. A spec with
        ``array:`` is refused here: :meth:`submit_array` submits it."""
        parsed, source = self._parsed(spec, after_ok, after_any, after_not_ok, after)
        if parsed.spec.array:
            raise InvalidSpec("array", "an array: submit it with Cluster.submit_array")
        job_id, created = self._submit(parsed, request_id, source)
        return Job(self, job_id, created)

    def submit_array(
        self,
        spec: str | Path | Mapping[str, Any],
        array: str | None = None,
        *,
        request_id: str | None = None,
        after_ok: Jobs = (),
        after_any: Jobs = (),
        after_not_ok: Jobs = (),
        after: Jobs = (),
    ) -> Array:
        """Submit an array as :meth:`submit` submits a job: a task per index of
        ``array`` (Slurm's ``--array`` text, ``"0-99%10"``; None: the spec's ``array:``),
        each a job with ``$SYNAPSE_ARRAY_TASK_ID``. The dependencies may name arrays."""
        parsed, source = self._parsed(spec, after_ok, after_any, after_not_ok, after)
        if array is not None:
            for field, rule in array_problems(array.strip() or " "):
                raise InvalidSpec(field, rule)
            parsed = dataclasses.replace(
                parsed, spec=dataclasses.replace(parsed.spec, array=array.strip())
            )
        if not parsed.spec.array:
            raise InvalidSpec("array", "names no task: pass array= or give the spec array:")
        array_id, created = self._submit(parsed, request_id, source)
        return Array(self, array_id, created)

    def _submit(self, parsed: ParsedJob, request_id: str | None, source: str) -> tuple[str, bool]:
        rid = request_id or parsed.request_id or new_request_id()
        try:
            with translated():
                answer = self.client.submit_job(spec_to_proto(parsed.spec), rid)
        except InvalidSpec as exc:  # the cluster's own rules (topology levels, limits)
            if not source:
                raise
            problems = sorted(
                ((line_in_file(source, field), field, rule) for _, field, rule in exc.problems),
                key=lambda p: (p[0] is None, p[0] or 0, p[1]),
            )
            line, field, rule = problems[0]
            raise InvalidSpec(field, rule, line, source, problems=problems) from exc
        return answer.job_id, answer.created

    def _parsed(
        self,
        spec: str | Path | Mapping[str, Any],
        after_ok: Jobs,
        after_any: Jobs,
        after_not_ok: Jobs,
        after: Jobs,
    ) -> tuple[ParsedJob, str]:
        """The spec checked here, with the dependencies added, and the file it came from."""
        source = ""
        try:
            if isinstance(spec, (str, Path)):
                source = str(spec)
                parsed = load_job_file(spec, topology_levels=None)
            else:
                parsed = parse_job_spec(dict(spec), topology_levels=None)
        except SpecFileUnreadable as exc:
            raise exc.os_error from None
        except SpecFileError as exc:
            problems = [(p.line, p.field, p.rule) for p in exc.problems]
            raise InvalidSpec(exc.field, exc.rule, exc.line, source, problems=problems) from exc
        except SpecError as exc:
            problems = [(None, v.field, v.rule) for v in exc.violations]
            raise InvalidSpec(exc.field, exc.rule, problems=problems) from exc
        extra = Dependencies(_ids(after_ok), _ids(after_any), _ids(after_not_ok), _ids(after))
        if extra.pairs():
            deps = merged(parsed.spec.dependencies, extra)
            for field, rule in dependency_problems(deps):
                raise InvalidSpec(field, rule)
            parsed = dataclasses.replace(
                parsed, spec=dataclasses.replace(parsed.spec, dependencies=deps)
            )
        return parsed, source

    def submit_many(
        self, specs: Iterable[str | Path | Mapping[str, Any]], *, batch: int = SUBMIT_BATCH
    ) -> list[Job]:
        """Submit many jobs, ``batch`` to a call (``SubmitJobs``): each spec as
        :meth:`submit` takes one, each with its own request id (its file's, else a fresh
        one) reused on retries. Every spec is checked here before anything is sent; the
        cluster then checks a whole call before it makes any of its jobs, and a refusal
        names the spec as ``jobs[i]`` of its call. The jobs, in the order of ``specs``."""
        if not 1 <= batch <= SUBMIT_BATCH:
            raise ValueError(f"batch must be 1 to {SUBMIT_BATCH}, got {batch}")
        requests = []
        for i, spec in enumerate(specs):
            parsed, _ = self._parsed(spec, (), (), (), ())
            if parsed.spec.array:
                raise InvalidSpec(f"specs[{i}].array", "an array: submit it with submit_array")
            requests.append(
                pb.SubmitJobRequest(
                    spec=spec_to_proto(parsed.spec),
                    request_id=parsed.request_id or new_request_id(),
                )
            )
        jobs: list[Job] = []
        for start in range(0, len(requests), batch):
            with translated():
                answers = self.client.submit_jobs(requests[start : start + batch])
            jobs.extend(Job(self, a.job_id, a.created) for a in answers)
        return jobs

    def job(self, job_id: str) -> Job:
        """A handle on the job ``job_id`` (no call is made until it is used)."""
        return Job(self, job_id)

    def jobs(
        self,
        state: JobState | str | Iterable[JobState | str] | None = None,
        *,
        name: str = "",
        node: str = "",
        array: str = "",
        limit: int = 0,
    ) -> list[JobInfo]:
        """Jobs in submission order (an array's tasks by index): those in ``state`` (one
        or several), else every job still active (PENDING, SCHEDULED, RUNNING);
        ``state="all"`` for finished ones too. ``name``, ``node`` and ``array`` filter by
        exact job name, by a member's node and by the array a task belongs to."""
        with translated():
            found = self.client.list_jobs(
                limit=limit, states=_state_names(state), name=name, node_id=node, array_id=array
            )
        return [JobInfo.of(j) for j in found]

    def node_addresses(self) -> dict[str, str]:
        """Each registered node's WorkerService address, by node id."""
        with translated():
            return {n.node_id: n.address for n in self.client.list_nodes()}


_Info = TypeVar("_Info", JobInfo, ArrayInfo)


def _until_finished(look: Callable[[], _Info], timeout_s: float | None, poll_s: float) -> _Info:
    """``look()`` every ``poll_s`` until what it returns has finished or ``timeout_s``
    passed (None: no limit); the last answer."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        info = look()
        if info.finished or (deadline is not None and time.monotonic() >= deadline):
            return info
        pause = poll_s if deadline is None else min(poll_s, deadline - time.monotonic())
        time.sleep(max(0.0, pause))


_ACTIVE = (JobState.PENDING, JobState.SCHEDULED, JobState.RUNNING)


def _ids(jobs: Jobs) -> tuple[str, ...]:
    if isinstance(jobs, (Job, str)):
        jobs = [jobs]
    return tuple(j.id if isinstance(j, Job) else j for j in jobs)


def _state_names(state: JobState | str | Iterable[JobState | str] | None) -> list[str]:
    if state is None:
        return [str(s) for s in _ACTIVE]
    if isinstance(state, (JobState, str)):
        state = [state]
    names: list[str] = []
    for s in state:
        text = str(s).upper()
        if text == "ALL":
            return []
        if text not in JobState.__members__:
            known = ", ".join(JobState.__members__)
            raise ValueError(f"{s!r} is not a job state (one of {known}, or 'all')")
        names.append(text)
    return names
