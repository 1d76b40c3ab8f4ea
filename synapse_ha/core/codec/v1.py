"""Version 1 encodings read as version 2: the decoders of the older layout.

Version 1 wrote reasons and attempt outcomes as sentences and kept no attempt state nor
requeue count; version 2 writes :class:`~synapse_ha.core.reasons.Reason` values. These
functions turn a version 1 command body or state, as plain values, into the version 2
layout, which :func:`~synapse_ha.core.codec.from_plain.from_plain` then checks and
rebuilds. Anything malformed is passed on as it is, for that check to judge.
"""

from __future__ import annotations

from typing import Any


def _text_reason(value: Any) -> Any:
    """A version 1 sentence as a version 2 TEXT reason (anything else as it is, for the
    type check to judge)."""
    if isinstance(value, str):
        return {"code": "text", "params": [["text", value]], "cause": None}
    return value


def upgrade_command_v1(name: str, body: Any) -> Any:
    """The body of a version 1 command named ``name`` in the version 2 layout: the
    reasons of a ``BindPlan`` and the reason of a ``FailAttempt`` as TEXT reasons."""
    if not isinstance(body, dict):
        return body
    body = dict(body)
    if name == "BindPlan" and isinstance(body.get("reasons"), list):
        body["reasons"] = [
            [pair[0], _text_reason(pair[1])] if isinstance(pair, list) and len(pair) == 2 else pair
            for pair in body["reasons"]
        ]
    if name == "FailAttempt" and "reason" in body:
        body["reason"] = _text_reason(body["reason"])
    return body


def upgrade_state_v1(state: Any) -> Any:
    """A version 1 state in the version 2 layout: each job's reason and attempt outcome
    as TEXT reasons, its attempt's state and its retries derived from what it kept."""
    if not isinstance(state, dict) or not isinstance(state.get("jobs"), dict):
        return state
    jobs = {}
    for job_id, job in state["jobs"].items():
        if isinstance(job, dict):
            job = dict(job)
            if "reason" in job:
                job["reason"] = _text_reason(job["reason"])
            attempt = job.get("attempt")
            made = job.get("attempts_made", 0)
            if isinstance(attempt, dict) and "outcome" in attempt:
                attempt = dict(attempt)
                outcome = attempt["outcome"]
                attempt["outcome"] = None if outcome == "" else _text_reason(outcome)
                # Version 1 kept no attempt state: derive it from the times and the job.
                if attempt.get("ended_at_ms") is None:
                    live = "bound" if attempt.get("started_at_ms") is None else "running"
                    attempt["state"] = live
                else:
                    attempt["state"] = {"SUCCEEDED": "succeeded", "CANCELLED": "stopped"}.get(
                        str(job.get("state")), "failed"
                    )
                job["attempt"] = attempt
            # Version 1 had no requeues: every attempt after the first was a retry.
            if isinstance(made, int) and made > 0:
                pending_retry = job.get("state") == "PENDING"
                job["retries_used"] = made if pending_retry else made - 1
        jobs[job_id] = job
    return {**state, "jobs": jobs}
