"""What a simulated gang's workers report: its members' starts and exits, through the
real ``apply``, node by node, as the workers would send them."""

from __future__ import annotations

from synapse_ha.core import commands as c
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, MemberPlacement

SIGTERM_EXIT = 143  # the exit code a member stopped by SIGTERM reports


def report_all(
    state: ClusterState,
    job_id: str,
    token: int,
    kind: c.MemberEventKind,
    now: int,
    exit_code: int = 0,
) -> None:
    """Report every member of the attempt started (or exited with ``exit_code``), node
    by node."""
    attempt = state.jobs[job_id].attempt
    assert attempt is not None
    report_members(state, job_id, token, attempt.members, kind, now, exit_code)


def report_members(
    state: ClusterState,
    job_id: str,
    token: int,
    members: tuple[MemberPlacement, ...],
    kind: c.MemberEventKind,
    now: int,
    exit_code: int = 0,
) -> None:
    """``members`` of the attempt ``token`` report ``kind``, node by node."""
    by_node: dict[str, list[c.MemberEvent]] = {}
    for m in members:
        by_node.setdefault(m.node_id, []).append(
            c.MemberEvent(job_id, token, m.rank, kind, exit_code, generation=m.generation)
        )
    for node_id, events in sorted(by_node.items()):
        apply(state, c.ReportMembers(node_id, tuple(events), now_ms=now))


def shrink_gang(state: ClusterState, shrink: c.ShrinkMembers, now: int) -> int:
    """Apply ``shrink``; the ranks it gives back exit at once (143, as after SIGTERM) and
    the attempt drops them. The GPUs they held (0 when ``apply`` refused it)."""
    job = state.jobs.get(shrink.job_id)
    if job is None or job.attempt is None or not apply(state, shrink).ok:
        return 0
    attempt = state.jobs[shrink.job_id].attempt
    assert attempt is not None
    leaving = attempt.members[shrink.size :]
    kind = c.MemberEventKind.EXITED
    report_members(state, shrink.job_id, shrink.fencing_token, leaving, kind, now, SIGTERM_EXIT)
    return job.spec.resources.gpu * len(leaving)
