"""Invariants of the cluster state, checked after every apply in tests and chaos runs.

``check(state)`` returns a list of violations, each a sentence; empty means healthy.
"""

from __future__ import annotations

import itertools

from synapse_ha.core.model import ClusterState, JobState, MemberState, NodeStatus, Resources


def check(state: ClusterState) -> list[str]:
    problems: list[str] = []
    expected: dict[str, Resources] = {node_id: Resources() for node_id in state.nodes}
    expected_gpus: dict[str, set[int]] = {node_id: set() for node_id in state.nodes}
    expected_ports: dict[str, list[int]] = {node_id: [] for node_id in state.nodes}
    tokens: list[tuple[int, str]] = []

    for job_id, job in sorted(state.jobs.items()):
        attempt = job.attempt
        if attempt is not None:
            tokens.append((attempt.fencing_token, job_id))
            if attempt.fencing_token > state.last_fencing_token:
                problems.append(
                    f"{job_id}: token {attempt.fencing_token} is beyond the last issued"
                )
            if attempt.number != job.attempts_made:
                problems.append(f"{job_id}: attempt {attempt.number} of {job.attempts_made} made")
            if attempt.state.live != (attempt.ended_at_ms is None):
                problems.append(
                    f"{job_id}: attempt {attempt.number} is {attempt.state.value} but "
                    f"{'has not ended' if attempt.ended_at_ms is None else 'has ended'}"
                )
            if attempt.state.live != job.state.holds_resources:
                problems.append(f"{job_id}: {job.state.value} with attempt {attempt.state.value}")
            if attempt.ended_at_ms is not None and attempt.outcome is None:
                problems.append(f"{job_id}: attempt {attempt.number} ended without an outcome")
        # Every ended attempt was retried, requeued or ended the job: never more of those
        # than attempts made, and never more retries than the job allows.
        if job.retries_used + job.requeues > job.attempts_made:
            problems.append(
                f"{job_id}: {job.retries_used} retries and {job.requeues} requeues "
                f"from {job.attempts_made} attempts"
            )
        if job.retries_used > job.spec.retries.max_retries:
            problems.append(
                f"{job_id}: {job.retries_used} retries used of {job.spec.retries.max_retries}"
            )
        lost = job.lost_attempt
        if lost is not None:
            if job.state.finished:
                problems.append(f"{job_id}: {job.state.value} but keeps a lost attempt")
            if lost.fencing_token > job.fencing_token or lost.number > job.attempts_made:
                problems.append(
                    f"{job_id}: lost attempt {lost.number} (token {lost.fencing_token}) is "
                    f"newer than attempt {job.attempts_made} (token {job.fencing_token})"
                )
            ranks = list(lost.exited_zero)
            if (
                ranks != sorted(set(ranks))
                or any(not 0 <= r < len(lost.nodes) for r in ranks)
                or len(ranks) >= len(lost.nodes)
                or len(lost.nodes) != job.spec.replicas
            ):
                problems.append(f"{job_id}: lost attempt ranks {ranks} of {len(lost.nodes)}")
        if job.state.holds_resources:
            if attempt is None:
                problems.append(f"{job_id}: {job.state.value} without an attempt")
                continue
            if len(attempt.members) != job.spec.replicas:
                problems.append(
                    f"{job_id}: partial gang, {len(attempt.members)} of {job.spec.replicas} bound"
                )
            if len(attempt.member_status) != len(attempt.members):
                problems.append(f"{job_id}: member status does not match members")
            if attempt.members and attempt.members[0].node_id in expected_ports:
                expected_ports[attempt.members[0].node_id].append(attempt.master_port)
            for member in attempt.members:
                node = state.nodes.get(member.node_id)
                if node is None or node.status is NodeStatus.DEAD:
                    problems.append(f"{job_id}: rank {member.rank} is on a missing or dead node")
                    continue
                expected[member.node_id] = expected[member.node_id] + job.spec.resources
                clash = expected_gpus[member.node_id] & set(member.gpus)
                if clash:
                    problems.append(
                        f"{job_id}: GPUs {sorted(clash)} on {member.node_id} double-booked"
                    )
                expected_gpus[member.node_id].update(member.gpus)
            if attempt.preempted_by and (
                attempt.preemption is None or attempt.preempt_deadline_ms <= 0
            ):
                problems.append(f"{job_id}: preempted without a kind or a deadline")
            # Members of a preempted attempt may stop before any started.
            if (
                job.state is JobState.SCHEDULED
                and not attempt.preempted_by
                and any(s.state is not MemberState.BOUND for s in attempt.member_status)
            ):
                problems.append(f"{job_id}: SCHEDULED but a member already started")
        elif attempt is not None and attempt.ended_at_ms is None:
            problems.append(f"{job_id}: {job.state.value} but attempt {attempt.number} never ended")

    unconfirmed_on = {
        m.node_id
        for job in state.jobs.values()
        if job.attempt is not None and job.attempt.ended_at_ms is not None
        for m, st in zip(job.attempt.members, job.attempt.member_status, strict=True)
        if st.state is not MemberState.EXITED
    }

    ordered = sorted(tokens)
    for (a, ja), (b, jb) in itertools.pairwise(ordered):
        if a == b:
            problems.append(f"fencing token {a} used by both {ja} and {jb}")

    for node_id, node in sorted(state.nodes.items()):
        if node.allocated != expected[node_id]:
            problems.append(
                f"node {node_id}: allocated {node.allocated} but its members hold "
                f"{expected[node_id]}"
            )
        if node.allocated_gpus != expected_gpus[node_id]:
            problems.append(f"node {node_id}: allocated GPUs disagree with its members")
        if node.master_ports != sorted(expected_ports[node_id]):
            problems.append(
                f"node {node_id}: master ports {node.master_ports} but its rank-0 members "
                f"use {sorted(expected_ports[node_id])}"
            )
        if not node.allocated.fits_in(node.info.capacity) or node.allocated.is_negative():
            problems.append(
                f"node {node_id}: over-committed ({node.allocated} of {node.info.capacity})"
            )
        if node.status is NodeStatus.DEAD and node.allocated != Resources():
            problems.append(f"node {node_id}: dead but holds resources")
        if (
            node.status is NodeStatus.DRAINING
            and node.allocated == Resources()
            and node_id not in unconfirmed_on
        ):
            problems.append(f"node {node_id}: draining but holds no members (should be cordoned)")

    for request_id, job_id in sorted(state.request_ids.items()):
        owner = state.jobs.get(job_id)
        if owner is None or owner.request_id != request_id:
            problems.append(f"request id {request_id!r} points at a missing job {job_id}")
    if state.jobs and max(j.seq for j in state.jobs.values()) >= state.next_job_seq:
        problems.append("a job's sequence number is not below next_job_seq")
    return problems
