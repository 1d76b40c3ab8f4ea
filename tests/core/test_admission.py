"""The admission rules (core/identity/admission.py): sizes, pending caps, authorised priority and
request ids scoped to their owner; and the reasons a job's text is withheld from."""

from __future__ import annotations

import dataclasses

import pytest

from synapse_ha.core import commands as cmd
from synapse_ha.core.cluster_config import DEFAULT_PRIORITY_CLASSES, ClusterConfig, Limits, Queue
from synapse_ha.core.identity import access, admission
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, JobSpec
from synapse_ha.core.reasons import ReasonCode, reason, render, text, withheld
from tests.core.harness import job

ALICE = access.user("alice")
OPERATOR = access.user("olga", access.Role.OPERATOR)
ADMIN = access.user("root", access.Role.ADMIN)
CLASSES = DEFAULT_PRIORITY_CLASSES  # low -100, normal 0, high 100 (preempts)


def test_sizes_bind_everyone_and_name_the_limit_and_figure() -> None:
    limits = Limits(spec_bytes=4096, env_bytes=1024)
    small = dataclasses.replace(job(), env=(("A", "b"),))
    assert admission.size_refusal(limits, small) is None
    big_env = dataclasses.replace(job(), env=(("SECRET", "x" * 1100),))
    refusal = admission.size_refusal(limits, big_env)
    assert refusal is not None
    assert (refusal.limit, refusal.allowed, refusal.actual) == ("env_bytes", 1024, 1106)
    assert "1106 bytes" in refusal.message and "limits.env_bytes" in refusal.message
    big_command = dataclasses.replace(job(), command=("echo " + "y" * 5000,))
    refusal = admission.size_refusal(limits, big_command)
    assert refusal is not None and refusal.limit == "spec_bytes"
    assert refusal.actual == admission.spec_bytes(big_command) > 4096


def test_pending_caps_count_the_owner_and_the_queue() -> None:
    state = ClusterState()
    for i, owner in enumerate(["alice", "alice", "bob"]):
        apply(state, cmd.SubmitJob(spec=job(f"j{i}"), request_id=f"r{i}", owner=owner))
    counts = admission.pending_counts(state, "alice", "default")
    assert counts == admission.PendingCounts(owner=2, queue=3)
    limits = Limits(pending_jobs_per_user=3, pending_jobs_per_queue=4)
    assert admission.pending_refusal(limits, counts, "alice", "default") is None
    at_user_cap = admission.pending_refusal(limits, counts, "alice", "default", more=2)
    assert at_user_cap is not None and at_user_cap.limit == "pending_jobs_per_user"
    full_queue = admission.PendingCounts(owner=0, queue=4)
    at_queue_cap = admission.pending_refusal(limits, full_queue, "carol", "default")
    assert at_queue_cap is not None and at_queue_cap.limit == "pending_jobs_per_queue"
    assert "queue default has 4 pending jobs" in at_queue_cap.message


def test_only_users_and_operators_are_limited() -> None:
    assert admission.limited(ALICE) and admission.limited(OPERATOR)
    assert not admission.limited(ADMIN)
    assert not admission.limited(access.worker("n1"))
    assert not admission.limited(access.replica("r1"))


def _spec(priority: int = 0, priority_class: str = "") -> JobSpec:
    return dataclasses.replace(job(), priority=priority, priority_class=priority_class)


@pytest.mark.parametrize(
    ("who", "queue", "grant", "allowed"),
    [
        # A class that preempts: the queue must list it, and the caller must be trusted.
        (ALICE, Queue("default"), admission.PriorityGrant(("high",)), False),
        (ADMIN, Queue("default"), admission.PriorityGrant(), False),
        (ALICE, Queue("q", priority_classes=("normal", "high")), admission.PriorityGrant(), False),
        (ALICE, Queue("q", priority_classes=("high",)), admission.PriorityGrant(("high",)), True),
        (OPERATOR, Queue("q", priority_classes=("high",)), admission.PriorityGrant(), True),
    ],
)
def test_a_class_that_preempts_needs_the_queue_and_the_credential(
    who: access.Identity, queue: Queue, grant: admission.PriorityGrant, allowed: bool
) -> None:
    spec = _spec(priority_class="high")
    refusal = admission.priority_refusal(who, spec, queue, CLASSES, grant)
    assert (refusal is None) is allowed
    if refusal is not None:
        assert refusal.code is access.AccessRefusalCode.PERMISSION_DENIED
        assert "high" in refusal.message


def test_a_priority_above_the_queue_ceiling_needs_a_token_that_reaches_it() -> None:
    queue = Queue("default", max_priority=10)
    none = admission.PriorityGrant()
    assert admission.priority_refusal(ALICE, _spec(10), queue, CLASSES, none) is None
    assert admission.priority_refusal(ALICE, _spec(-500), queue, CLASSES, none) is None
    refusal = admission.priority_refusal(ALICE, _spec(1_000_000), queue, CLASSES, none)
    assert refusal is not None and "priority 1000000" in refusal.message
    assert "max_priority" in refusal.message
    reaching = admission.PriorityGrant(max_priority=1_000_000)
    assert admission.priority_refusal(ALICE, _spec(1_000_000), queue, CLASSES, reaching) is None
    assert admission.priority_refusal(OPERATOR, _spec(5000), queue, CLASSES, none) is None


def test_request_ids_are_scoped_to_their_owner_and_shown_unscoped() -> None:
    state = ClusterState()
    key = admission.request_key(state, "bob", "run-1")
    assert key == "bob/run-1"
    assert admission.shown_request_id("bob", key) == "run-1"
    apply(state, cmd.SubmitJob(spec=job("b"), request_id=key, owner="bob"))
    alice = admission.request_key(state, "alice", "run-1")
    assert alice == "alice/run-1"
    result = apply(state, cmd.SubmitJob(spec=job("a"), request_id=alice, owner="alice"))
    assert result.created and {j.owner for j in state.jobs.values()} == {"alice", "bob"}


def test_an_unscoped_id_recorded_before_scoping_is_found_by_its_owner_only() -> None:
    state = ClusterState()
    apply(state, cmd.SubmitJob(spec=job("old"), request_id="run-7", owner="bob"))
    assert admission.request_key(state, "bob", "run-7") == "run-7"  # the retry finds it
    assert admission.request_key(state, "alice", "run-7") == "alice/run-7"


def test_limits_are_checked_at_apply_and_a_bad_one_changes_nothing() -> None:
    state = ClusterState()
    bad = ClusterConfig(limits=Limits(submit_per_s=0, watch_streams_per_identity=99))
    result = apply(state, cmd.Configure(config=bad))
    assert not result.ok and "limits.submit_per_s" in result.message
    assert state.config == ClusterConfig()
    crossed = ClusterConfig(limits=Limits(watch_streams_per_identity=9, watch_streams_total=8))
    result = apply(state, cmd.Configure(config=crossed))
    assert not result.ok and "watch_streams_total" in result.message
    good = ClusterConfig(limits=Limits(pending_jobs_per_user=5))
    assert apply(state, cmd.Configure(config=good)).ok
    assert state.config.limits.pending_jobs_per_user == 5


def test_a_token_keeps_what_priority_it_allows() -> None:
    state = ClusterState()
    command = cmd.CreateToken(
        token_id="0123456789ab",
        user="alice",
        role=access.Role.USER,
        secret_sha256="0" * 64,
        priority_classes=("high",),
        max_priority=500,
    )
    assert apply(state, command).ok
    token = state.tokens["0123456789ab"]
    assert (token.priority_classes, token.max_priority) == (("high",), 500)
    wrong = dataclasses.replace(command, token_id="ba9876543210", max_priority=10**9)
    result = apply(state, wrong)
    assert not result.ok and "max_priority" in result.message
    assert "ba9876543210" not in state.tokens


def test_withheld_reasons_keep_the_code_and_drop_the_jobs_text() -> None:
    exited = reason(
        ReasonCode.MEMBER_EXITED, rank=0, node="n1", exit_code=127, detail="--password=hunter2"
    )
    failed = reason(ReasonCode.FAILED_EXIT, exited, attempt=1, retries=0)
    shown = render(withheld(failed))
    assert "hunter2" not in shown
    assert shown.startswith("attempt 1 failed (rank 0 on n1 exited with code 127")
    assert "[details withheld]" in shown
    for code in (ReasonCode.CANCELLED, ReasonCode.CANCELLED_BY):
        assert "secret" not in render(withheld(reason(code, text="secret")))
    assert render(withheld(text("secret"))) == "[details withheld]"
    running = reason(ReasonCode.RUNNING, attempt=2)
    assert withheld(running) is running  # nothing of the job's own: unchanged
