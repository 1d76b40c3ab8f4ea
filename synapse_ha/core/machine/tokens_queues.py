"""Tokens and queues: creating and revoking API tokens, setting and deleting queues and
the cohorts of the cohort tree."""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from synapse_ha.core import commands as cmd
from synapse_ha.core.cluster_config import DEFAULT_QUEUE
from synapse_ha.core.commands import Result, ResultCode, error, ok
from synapse_ha.core.identity.admission import check_priority_allowance
from synapse_ha.core.machine.changes import Handling, nothing, tokens
from synapse_ha.core.model import ClusterState, Token
from synapse_ha.core.queues.cohort_tree import check_cohort
from synapse_ha.core.spec.validation import (
    Violation,
    ViolationCode,
    check_queue,
    check_token,
    describe,
)


def _create_token(state: ClusterState, c: cmd.CreateToken, now: int) -> Result:
    violations = check_token(c.token_id, c.user, c.role, c.queues, c.secret_sha256, c.expires_at_ms)
    violations += check_priority_allowance(c.priority_classes, c.max_priority)
    if not c.token_id:
        violations.insert(0, Violation(ViolationCode.REQUIRED, "token_id", "is required"))
    if violations:
        return error(ResultCode.INVALID, describe(violations))
    if c.token_id in state.tokens:
        return error(ResultCode.CONFLICT, f"token {c.token_id} exists already")
    if c.expires_at_ms and c.expires_at_ms <= now:
        return error(ResultCode.INVALID, "expires_at_ms: must be later than now")
    given = {name: getattr(c, name) for name in _GIVEN_BY_COMMAND}
    state.tokens[c.token_id] = Token(**given, created_at_ms=now, created_by=c.actor)
    return ok(f"token {c.token_id} created for {c.user} (role {c.role})")


# The fields of a token its CreateToken gives as they are (the rest: when and by whom).
_GIVEN_BY_COMMAND = tuple(
    f.name
    for f in dataclasses.fields(Token)
    if f.name in {g.name for g in dataclasses.fields(cmd.CreateToken)}
)


def _revoke_token(state: ClusterState, c: cmd.RevokeToken, now: int) -> Result:
    token = state.tokens.get(c.token_id)
    if token is None:
        return error(ResultCode.NOT_FOUND, f"no token {c.token_id!r}")
    if token.revoked_at_ms:
        return ok(f"token {c.token_id} was already revoked")
    # 0 means live, so a revocation at time 0 (only ever in tests) is recorded as 1.
    revoked = dataclasses.replace(token, revoked_at_ms=max(now, 1), revoked_by=c.actor)
    state.tokens[c.token_id] = revoked
    return ok(f"token {c.token_id} revoked")


# ----------------------------------------------------------------------------- queues


V = TypeVar("V")


def _stored(table: dict[str, V], name: str, value: V, what: str) -> tuple[dict[str, V], Result]:
    """``table`` with ``value`` under ``name``, in name order, and the result that says
    whether the ``what`` was created or updated."""
    existed = name in table
    table[name] = value
    return dict(sorted(table.items())), ok(f"{what} {name} {'updated' if existed else 'created'}")


def _set_queue(state: ClusterState, c: cmd.SetQueue, now: int) -> Result:
    violations = check_queue(c.queue, state.config.priority_classes)
    violations += check_priority_allowance((), c.queue.max_priority)
    if c.queue.name == DEFAULT_QUEUE and c.queue.cohort:
        violations.append(Violation(ViolationCode.INVALID_FIELD, "cohort", "not for default"))
    if violations:
        return error(ResultCode.INVALID, describe(violations))
    state.queues, stored = _stored(state.queues, c.queue.name, c.queue, "queue")
    return stored


def _delete_queue(state: ClusterState, c: cmd.DeleteQueue, now: int) -> Result:
    if c.name == DEFAULT_QUEUE:
        return error(ResultCode.CONFLICT, "the default queue cannot be deleted")
    if c.name not in state.queues:
        return error(ResultCode.NOT_FOUND, f"no queue {c.name!r}")
    using = sorted(
        job.job_id
        for job in state.jobs.values()
        if not job.state.finished and job.spec.queue == c.name
    )
    if using:
        shown = ", ".join(using[:5]) + (" ..." if len(using) > 5 else "")
        return error(
            ResultCode.CONFLICT, f"queue {c.name} still has {len(using)} unfinished job(s): {shown}"
        )
    del state.queues[c.name]
    return ok(f"queue {c.name} deleted")


# ---------------------------------------------------------------------------- cohorts


def _set_cohort(state: ClusterState, c: cmd.SetCohort, now: int) -> Result:
    violations = check_cohort(c.cohort, state.cohorts)
    if violations:
        return error(ResultCode.INVALID, describe(violations))
    state.cohorts, stored = _stored(state.cohorts, c.cohort.name, c.cohort, "cohort")
    return stored


def _delete_cohort(state: ClusterState, c: cmd.DeleteCohort, now: int) -> Result:
    if c.name not in state.cohorts:
        return error(ResultCode.NOT_FOUND, f"no cohort {c.name!r}")
    children = sorted(n for n, record in state.cohorts.items() if record.parent == c.name)
    if children:
        return error(
            ResultCode.CONFLICT,
            f"cohort {c.name} is the parent of {', '.join(children)}: move or delete them first",
        )
    del state.cohorts[c.name]
    return ok(f"cohort {c.name} deleted")


HANDLERS: dict[type, Handling] = {
    cmd.CreateToken: Handling(_create_token, tokens),
    cmd.RevokeToken: Handling(_revoke_token, tokens),
    cmd.SetQueue: Handling(_set_queue, nothing),
    cmd.DeleteQueue: Handling(_delete_queue, nothing),
    cmd.SetCohort: Handling(_set_cohort, nothing),
    cmd.DeleteCohort: Handling(_delete_cohort, nothing),
}
