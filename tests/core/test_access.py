"""The access policy (who may call which RPC, who may manage which job, who may speak
for which node) and the token commands of the state machine."""

from __future__ import annotations

import json

import pytest

from synapse_ha.core import commands as c
from synapse_ha.core.codec.versioned import decode_state, encode_state
from synapse_ha.core.identity import access
from synapse_ha.core.identity.access import AccessRefusalCode, Identity, Role
from synapse_ha.core.machine import apply
from synapse_ha.core.model import ClusterState, Token
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

ADMIN = access.user("root", Role.ADMIN)
OPERATOR = access.user("ops", Role.OPERATOR)
ALICE = access.user("alice")
BOB = access.user("bob")
REPLICA = access.replica("r1")
WORKER = access.worker("n1")


def test_policy_names_every_method_of_both_services_and_nothing_else() -> None:
    methods = {
        f"/{service.full_name}/{method.name}"
        for service in pb.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert {s.full_name for s in pb.DESCRIPTOR.services_by_name.values()} == {
        access.SCHEDULER_SERVICE,
        access.NODE_AGENT_SERVICE,
        access.NODE_STREAM_SERVICE,
    }
    assert set(access.POLICY) == methods


@pytest.mark.parametrize("method", sorted(access.POLICY))
def test_admins_may_call_everything(method: str) -> None:
    assert access.authorize(ADMIN, method) is None


def _m(name: str) -> str:
    service = access.NODE_AGENT_SERVICE if name in ("RegisterNode", "Heartbeat") else None
    return f"/{service or access.SCHEDULER_SERVICE}/{name}"


# caller, method, allowed
MATRIX = [
    (OPERATOR, "CordonNode", True),
    (OPERATOR, "DrainNode", True),
    (OPERATOR, "CancelJob", True),
    (OPERATOR, "CreateToken", False),
    (OPERATOR, "GetReplicaState", False),
    (OPERATOR, "Heartbeat", False),
    (ALICE, "SubmitJob", True),
    (ALICE, "ListJobs", True),
    (ALICE, "GetClusterStatus", True),
    (ALICE, "CancelJob", True),  # the handler narrows it to her own jobs
    (ALICE, "GrantLogAccess", True),
    (ALICE, "CordonNode", False),
    (ALICE, "UncordonNode", False),
    (ALICE, "ListTokens", False),
    (ALICE, "RevokeToken", False),
    (ALICE, "RegisterNode", False),
    (REPLICA, "GetClusterStatus", True),
    (REPLICA, "GetReplicaState", True),
    (REPLICA, "ListJobs", True),
    (REPLICA, "SubmitJob", False),
    (REPLICA, "CancelJob", False),
    (REPLICA, "Heartbeat", False),
    (WORKER, "RegisterNode", True),
    (WORKER, "Heartbeat", True),
    (WORKER, "SubmitJob", False),
    (WORKER, "GetClusterStatus", False),
    (WORKER, "ListJobs", False),
    (WORKER, "CordonNode", False),
]


@pytest.mark.parametrize(
    ("identity", "method", "allowed"),
    MATRIX,
    ids=[f"{i}-{m}-{'ok' if a else 'no'}" for i, m, a in MATRIX],
)
def test_role_method_matrix(identity: Identity, method: str, allowed: bool) -> None:
    refusal = access.authorize(identity, _m(method))
    if allowed:
        assert refusal is None
    else:
        assert refusal is not None
        assert refusal.code is AccessRefusalCode.PERMISSION_DENIED
        assert method in refusal.message and str(identity) in refusal.message


def test_a_refusal_says_what_is_needed() -> None:
    refusal = access.authorize(BOB, _m("CordonNode"))
    assert refusal is not None
    assert refusal.message == (
        "user:bob (role user) may not call CordonNode; it needs role operator or admin"
    )


def test_no_identity_is_unauthenticated_and_unknown_methods_are_closed() -> None:
    refusal = access.authorize(None, _m("ListJobs"))
    assert refusal is not None and refusal.code is AccessRefusalCode.UNAUTHENTICATED
    unknown = access.authorize(ADMIN, "/synapse.v1.SchedulerService/DropEverything")
    assert unknown is not None and unknown.code is AccessRefusalCode.PERMISSION_DENIED


@pytest.mark.parametrize(
    ("identity", "owner", "allowed"),
    [
        (ALICE, "alice", True),
        (ALICE, "bob", False),
        (ALICE, "", False),
        (OPERATOR, "bob", True),
        (ADMIN, "", True),
        (REPLICA, "alice", False),
        (access.worker("alice"), "alice", False),
    ],
)
def test_may_manage_job(identity: Identity, owner: str, allowed: bool) -> None:
    assert access.may_manage_job(identity, owner) is allowed
    refusal = access.job_refusal(identity, "job-000001", owner)
    assert (refusal is None) is allowed


@pytest.mark.parametrize(
    ("identity", "node_id", "allowed"),
    [
        (WORKER, "n1", True),
        (WORKER, "n2", False),
        (ADMIN, "n2", True),
        (OPERATOR, "n1", False),
        (access.user("n1"), "n1", False),
        (REPLICA, "n1", False),
    ],
)
def test_may_speak_for_node(identity: Identity, node_id: str, allowed: bool) -> None:
    assert (access.may_speak_for_node(identity, node_id) is None) is allowed


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("syn_0123456789ab_s3cr_et-x", ("0123456789ab", "s3cr_et-x")),
        ("syn_0123456789ab_", None),
        ("syn_0123456789AB_x", None),
        ("tok_0123456789ab_x", None),
        ("syn_0123456789a_x", None),
        ("", None),
    ],
)
def test_split_token(text: str, parts: tuple[str, str] | None) -> None:
    assert access.split_token(text) == parts


# --------------------------------------------------------------------- token commands

HASH = "ab" * 32


def create(token_id: str = "0123456789ab", **overrides: object) -> c.CreateToken:
    fields: dict[str, object] = {
        "token_id": token_id,
        "user": "alice",
        "role": Role.USER,
        "secret_sha256": HASH,
        "queues": ("train",),
        "expires_at_ms": 0,
        "now_ms": 100,
        "actor": "user:root",
    }
    fields.update(overrides)
    return c.CreateToken(**fields)  # type: ignore[arg-type]


def test_create_and_revoke_a_token() -> None:
    state = ClusterState()
    made = create(expires_at_ms=5_000, priority_classes=("high",), max_priority=50)
    assert apply(state, made).ok
    token = state.tokens["0123456789ab"]
    assert token == Token(
        token_id="0123456789ab",
        user="alice",
        role=Role.USER,
        secret_sha256=HASH,
        created_at_ms=100,
        created_by="user:root",
        queues=("train",),
        expires_at_ms=5_000,
        priority_classes=("high",),
        max_priority=50,
    )
    assert token.live_at(4_999) and not token.live_at(5_000)
    result = apply(state, c.RevokeToken("0123456789ab", 200, "user:root"))
    assert result.ok
    revoked = state.tokens["0123456789ab"]
    assert (revoked.revoked_at_ms, revoked.revoked_by) == (200, "user:root")
    assert not revoked.live_at(150)
    again = apply(state, c.RevokeToken("0123456789ab", 300, "user:other"))
    assert again.ok and state.tokens["0123456789ab"].revoked_by == "user:root"


def test_a_revocation_at_time_zero_still_revokes() -> None:
    state = ClusterState()
    assert apply(state, create(now_ms=0)).ok
    assert apply(state, c.RevokeToken("0123456789ab", 0, "user:root")).ok
    assert not state.tokens["0123456789ab"].live_at(0)


@pytest.mark.parametrize(
    ("command", "code", "words"),
    [
        (create(token_id="xyz"), c.ResultCode.INVALID, "token_id"),
        (create(token_id=""), c.ResultCode.INVALID, "token_id: is required"),
        (create(user="al ice"), c.ResultCode.INVALID, "user"),
        (create(role="root"), c.ResultCode.INVALID, "role"),
        (create(queues=("Bad Queue",)), c.ResultCode.INVALID, "queues[0]"),
        (create(queues=("a", "a")), c.ResultCode.INVALID, "appears twice"),
        (create(secret_sha256="plain secret"), c.ResultCode.INVALID, "secret_sha256"),
        (create(expires_at_ms=-1), c.ResultCode.INVALID, "expires_at_ms"),
        (create(expires_at_ms=50), c.ResultCode.INVALID, "later than now"),
        (create(token_id="aaaaaaaaaaaa"), c.ResultCode.CONFLICT, "exists already"),
        (c.RevokeToken("bbbbbbbbbbbb", 5, "user:root"), c.ResultCode.NOT_FOUND, "bbbbbbbbbbbb"),
    ],
)
def test_bad_token_commands_are_error_results_and_change_nothing(
    command: c.Command, code: c.ResultCode, words: str
) -> None:
    state = ClusterState()
    assert apply(state, create(token_id="aaaaaaaaaaaa")).ok
    before = encode_state(state)
    result = apply(state, command)
    assert result.code is code, result.message
    assert words in result.message
    after = json.loads(encode_state(state))
    expected = json.loads(before)
    # Only the bookkeeping of every apply moves (the command count and the clock).
    for name in ("applied_commands", "last_time_ms"):
        after["state"].pop(name)
        expected["state"].pop(name)
    assert after == expected


def test_state_with_tokens_round_trips_and_old_states_decode_without_them() -> None:
    state = ClusterState()
    assert apply(state, create()).ok
    assert apply(state, c.RevokeToken("0123456789ab", 200, "user:root")).ok
    data = encode_state(state)
    assert decode_state(data) == state
    assert "ab" * 32 in data.decode()  # the hash is replicated ...
    plain = json.loads(data)
    del plain["state"]["tokens"]  # ... and a state written before tokens existed decodes
    assert decode_state(json.dumps(plain).encode()).tokens == {}
