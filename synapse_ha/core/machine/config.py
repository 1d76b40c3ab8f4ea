"""Cluster configuration commands: ``Configure`` (the configuration's rules, stated in
:func:`~synapse_ha.core.spec.validation.check_cluster_config`,
:func:`~synapse_ha.core.identity.admission.check_limits` and
:func:`~synapse_ha.core.spares.check_spare_settings`, and no change that would orphan an
unfinished job's topology level), ``RaiseFormat`` (core/codec/formats.py) and ``Barrier``."""

from __future__ import annotations

from synapse_ha.core import commands as cmd
from synapse_ha.core.cluster_config import ClusterConfig
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.core.commands import Result, ResultCode, error, ok
from synapse_ha.core.identity.admission import check_limits
from synapse_ha.core.machine.changes import Handling, nothing
from synapse_ha.core.model import ClusterState
from synapse_ha.core.spares import check_spare_settings
from synapse_ha.core.spec.validation import check_cluster_config
from synapse_ha.core.topology import CLUSTER


def _configure(state: ClusterState, c: cmd.Configure, now: int) -> Result:
    problems = [str(v) for v in check_cluster_config(c.config)]
    problems.extend(str(v) for v in check_limits(c.config.limits))
    problems.extend(str(v) for v in check_spare_settings(c.config))
    if problems:
        return error(ResultCode.INVALID, "; ".join(problems))
    orphaned = orphaned_levels(state, c.config)
    if orphaned:
        named = "; ".join(
            f"topology level {level!r} is used by {', '.join(jobs[:5])}"
            + (f" and {len(jobs) - 5} more" if len(jobs) > 5 else "")
            for level, jobs in orphaned
        )
        return error(
            ResultCode.CONFLICT,
            f"{named}; the new topology_levels would orphan it (let those jobs finish or "
            f"cancel them first)",
            details=tuple((level, ",".join(jobs)) for level, jobs in orphaned),
        )
    state.config = c.config
    return ok("configured")


def orphaned_levels(state: ClusterState, config: ClusterConfig) -> list[tuple[str, list[str]]]:
    """Topology levels that unfinished jobs name (``topology.required`` or ``preferred``)
    and ``config`` no longer has, each with those jobs in id order.

    Only jobs count: node labels for a level that goes away are merely ignored, and a
    level added later finds them again, so they never block a change.
    """
    known = {*config.levels_with_host(), CLUSTER}
    users: dict[str, list[str]] = {}
    for job_id in sorted(state.jobs):
        job = state.jobs[job_id]
        if job.state.finished:
            continue
        for level in (job.spec.topology_required, job.spec.topology_preferred):
            if level and level not in known:
                jobs = users.setdefault(level, [])
                if not jobs or jobs[-1] != job_id:
                    jobs.append(job_id)
    return sorted(users.items())


def _raise_format(state: ClusterState, c: cmd.RaiseFormat, now: int) -> Result:
    if c.version > FORMAT:
        return error(
            ResultCode.INVALID,
            f"format {c.version} is newer than this replica reads ({FORMAT}); upgrade it",
        )
    if c.version <= state.format_floor:
        return ok(f"the cluster already reads format {state.format_floor}")
    state.format_floor = c.version
    heard = ", ".join(c.replicas) or "every replica"
    return ok(f"the cluster reads format {c.version} ({heard})")


def _barrier(state: ClusterState, c: cmd.Barrier, now: int) -> Result:
    return ok(f"barrier {c.leader_id}".strip())


HANDLERS: dict[type, Handling] = {
    cmd.Configure: Handling(_configure, nothing),
    cmd.Barrier: Handling(_barrier, nothing),
    cmd.RaiseFormat: Handling(_raise_format, nothing),
}
