"""A job as Slurm's commands show it: the fields of ``squeue``, ``sacct`` and ``scontrol
show job``, in Slurm's words, from the API's ``Job``.

Job ids: Slurm's are numbers, ours ``job-000042``; the Slurm-facing commands print
``42`` (``42_7`` for task 7 of an array) and read either form (:func:`slurm_id`,
:func:`job_id_of`). States: ``PENDING``, ``CONFIGURING`` (bound, no member started yet),
``RUNNING``, ``COMPLETED``, ``FAILED``, ``TIMEOUT`` (ended at its time limit),
``NODE_FAIL`` (requeued past ``max_requeues``), ``CANCELLED``. Times are the local
zone's ``YYYY-MM-DDTHH:MM:SS`` (Slurm's default), ``Unknown`` when not yet; durations
``[D-]HH:MM:SS`` (``MM:SS`` under an hour), as squeue prints them.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

from synapse_ha.core.model import JobState
from synapse_ha.rpc import states
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.slurm.hostlist import compress
from synapse_ha.slurm.ids import job_id_of, slurm_id

__all__ = ["FIELDS", "SHORT_STATES", "field", "job_id_of", "slurm_id", "state"]


_STATES = {
    JobState.PENDING: "PENDING",
    JobState.SCHEDULED: "CONFIGURING",
    JobState.RUNNING: "RUNNING",
    JobState.SUCCEEDED: "COMPLETED",
    JobState.FAILED: "FAILED",
    JobState.CANCELLED: "CANCELLED",
}
_FAILED_AS = {"failed_time_limit": "TIMEOUT", "failed_max_requeues": "NODE_FAIL"}
SHORT_STATES = {
    "PENDING": "PD", "CONFIGURING": "CF", "RUNNING": "R", "COMPLETED": "CD",
    "FAILED": "F", "TIMEOUT": "TO", "NODE_FAIL": "NF", "CANCELLED": "CA",
}  # fmt: skip
# Why a job is pending, in squeue's words (%R); any other reason is "None".
_PENDING_REASONS = {
    "waiting_capacity": "Resources", "waiting_shape": "Resources",
    "waiting_locality": "Resources", "first_in_line_reserved": "Resources",
    "fits_now": "Resources", "reserved_for_other": "Priority",
    "waiting_quota": "QOSGrpGRES", "waiting_member_cap": "QOSMaxJobsPerUserLimit",
    "dependency": "Dependency", "dependency_never_satisfied": "DependencyNeverSatisfied",
    "begin_time": "BeginTime", "retry_backoff": "BeginTime",
    "array_throttle": "JobArrayTaskLimit", "waiting_for_nodes": "ReqNodeNotAvail",
    "waiting_for_victims": "Resources", "preempting": "Resources",
    "waiting_stop_confirmed": "Resources", "waiting_min_runtime": "Resources",
    "starts_without_preempting": "Resources",
}  # fmt: skip


def state(job: pb.Job) -> str:
    """The job's state in Slurm's words."""
    ours = states.job_state(job)
    if ours is JobState.FAILED and job.reason_code in _FAILED_AS:
        return _FAILED_AS[job.reason_code]
    return _STATES.get(ours, str(ours))


def pending(job: pb.Job) -> bool:
    return states.job_state(job) is JobState.PENDING


def reason(job: pb.Job) -> str:
    """squeue's ``%R``: why a pending job waits, or the nodes of one that runs."""
    if pending(job):
        return f"({_PENDING_REASONS.get(job.reason_code, 'None')})"
    return node_list(job) or "(None)"


def node_list(job: pb.Job) -> str:
    """The nodes of its current or last attempt, in rank order, as one host list."""
    if not job.HasField("attempt"):
        return ""
    nodes: list[str] = []
    for member in job.attempt.members:
        if member.node_id not in nodes:
            nodes.append(member.node_id)
    return compress(nodes)


def timestamp(ms: int) -> str:
    """``YYYY-MM-DDTHH:MM:SS`` in the local zone, ``Unknown`` for 0."""
    if ms <= 0:
        return "Unknown"
    at = datetime.datetime.fromtimestamp(ms / 1000).astimezone()
    return at.strftime("%Y-%m-%dT%H:%M:%S")


def duration(ms: int) -> str:
    """``[D-]HH:MM:SS``, ``MM:SS`` under an hour."""
    seconds = max(0, ms // 1000)
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def time_limit(job: pb.Job) -> str:
    limit = job.spec.time_limit_ms
    return duration(limit) if limit > 0 else "UNLIMITED"


def started_ms(job: pb.Job) -> int:
    return job.attempt.started_at_ms if job.HasField("attempt") else 0


def ended_ms(job: pb.Job) -> int:
    return job.finished_at_ms


def elapsed(job: pb.Job, now_ms: int) -> str:
    """How long its current or last attempt ran (``0:00`` before it started)."""
    start = started_ms(job)
    if start <= 0:
        return "0:00"
    end = job.attempt.ended_at_ms or job.finished_at_ms or now_ms
    return duration(end - start)


def exit_code(job: pb.Job) -> str:
    """sacct's ``ExitCode``: ``CODE:SIGNAL`` of the first member that failed (a code of
    128+N is signal N), ``0:0`` otherwise."""
    if not job.HasField("attempt"):
        return "0:0"
    for member in job.attempt.members:
        if member.has_exit_code and member.exit_code != 0:
            code = member.exit_code
            return f"0:{code - 128}" if code > 128 else f"{code}:0"
    return "0:0"


def nodes_count(job: pb.Job) -> str:
    return str(job.spec.replicas)


def partition(job: pb.Job) -> str:
    return job.spec.queue or "default"


# Each field, by the names Slurm's commands know it by (lower case), as text.
Field = Callable[[pb.Job, int], str]
FIELDS: dict[str, Field] = {
    "jobid": lambda j, now: slurm_id(j.job_id),
    "jobidraw": lambda j, now: slurm_id(j.job_id),
    "jobname": lambda j, now: j.spec.name,
    "name": lambda j, now: j.spec.name,
    "user": lambda j, now: j.owner,
    "state": lambda j, now: state(j),
    "statecompact": lambda j, now: SHORT_STATES.get(state(j), state(j)),
    "reason": lambda j, now: reason(j).strip("()") if pending(j) else "None",
    "nodelist": lambda j, now: node_list(j) or ("None assigned" if pending(j) else ""),
    "nnodes": lambda j, now: nodes_count(j),
    "numnodes": lambda j, now: nodes_count(j),
    "partition": lambda j, now: partition(j),
    "timelimit": lambda j, now: time_limit(j),
    "elapsed": lambda j, now: elapsed(j, now),
    "submit": lambda j, now: timestamp(j.submitted_at_ms),
    "submittime": lambda j, now: timestamp(j.submitted_at_ms),
    "start": lambda j, now: timestamp(started_ms(j)),
    "starttime": lambda j, now: timestamp(started_ms(j)),
    "end": lambda j, now: timestamp(ended_ms(j)),
    "endtime": lambda j, now: timestamp(ended_ms(j)),
    "exitcode": lambda j, now: exit_code(j),
    "workdir": lambda j, now: j.spec.workdir,
    "restarts": lambda j, now: str(max(0, j.attempts_made - 1)),
    "arrayjobid": lambda j, now: slurm_id(j.array_id) if j.array_id else "",
    "arraytaskid": lambda j, now: str(j.array_index) if j.array_id else "",
}


def field(job: pb.Job, name: str, now_ms: int) -> str:
    """One field by name (Slurm's, any case); raises KeyError for a name not known."""
    return FIELDS[name.lower()](job, now_ms)
