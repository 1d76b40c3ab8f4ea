"""Who is calling: identities, roles, and the SPIFFE names certificates carry (DESIGN §8).

A caller is a replica, a worker (named by its node id) or a user (with a role). The
transport proves replicas and workers by their certificate; a user proves itself with a
bearer token or a user certificate. Certificates name the identity in a URI subject
alternative name:

* ``spiffe://synapse/replica/<replica-id>``
* ``spiffe://synapse/worker/<node-id>``
* ``spiffe://synapse/user/<role>/<user-name>``

Pure: no I/O, no clock.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

SPIFFE_PREFIX = "spiffe://synapse/"
# Names that fit in a URI path segment and a log line: the node-id alphabet.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class Kind(enum.StrEnum):
    REPLICA = "replica"
    WORKER = "worker"
    USER = "user"


class Role(enum.StrEnum):
    """A user's role: ``admin`` may do everything, ``operator`` manages nodes and any
    job, ``user`` submits to its queues and manages its own jobs."""

    ADMIN = "admin"
    OPERATOR = "operator"
    USER = "user"


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller. ``role`` is set for users only."""

    kind: Kind
    name: str
    role: Role | None = None

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"

    @property
    def spiffe_id(self) -> str:
        if self.kind is Kind.USER:
            return f"{SPIFFE_PREFIX}user/{self.role or Role.USER}/{self.name}"
        return f"{SPIFFE_PREFIX}{self.kind}/{self.name}"


def replica(name: str) -> Identity:
    return Identity(Kind.REPLICA, name)


def worker(node_id: str) -> Identity:
    return Identity(Kind.WORKER, node_id)


def user(name: str, role: Role = Role.USER) -> Identity:
    return Identity(Kind.USER, name, role)


def parse_spiffe_id(uri: str) -> Identity | None:
    """The identity a certificate's URI SAN names, or None when it names none of ours."""
    if not uri.startswith(SPIFFE_PREFIX):
        return None
    parts = uri[len(SPIFFE_PREFIX) :].split("/")
    try:
        kind = Kind(parts[0])
    except ValueError:
        return None
    if kind is Kind.USER:
        if len(parts) != 3:
            return None
        try:
            role = Role(parts[1])
        except ValueError:
            return None
        name = parts[2]
    else:
        if len(parts) != 2:
            return None
        role = None
        name = parts[1]
    if not NAME_PATTERN.match(name):
        return None
    return Identity(kind, name, role)


# --------------------------------------------------------------------------- policy


class Audience(enum.StrEnum):
    """The classes of caller the policy names: each user role, replicas and workers."""

    ADMIN = "admin"
    OPERATOR = "operator"
    USER = "user"
    REPLICA = "replica"
    WORKER = "worker"


def audience_of(identity: Identity) -> Audience:
    if identity.kind is Kind.USER:
        return Audience(identity.role or Role.USER)
    return Audience(identity.kind.value)


SCHEDULER_SERVICE = "synapse.v1.SchedulerService"
NODE_AGENT_SERVICE = "synapse.v1.NodeAgentService"
NODE_STREAM_SERVICE = "synapse.v1.NodeStreamService"  # heartbeat streams

_A, _O, _U = Audience.ADMIN, Audience.OPERATOR, Audience.USER
_PEOPLE = frozenset({_A, _O, _U})
_READERS = _PEOPLE | {Audience.REPLICA}


def _scheduler(method: str) -> str:
    return f"/{SCHEDULER_SERVICE}/{method}"


def _agent(method: str) -> str:
    return f"/{NODE_AGENT_SERVICE}/{method}"


# Who may call each RPC, by its full gRPC method path. The table is closed: a method not
# named here is refused to everyone (tests/core/test_access.py checks that it names every
# method of both services). Admins may call everything. Rows that name users are further
# narrowed by the handler: a user manages only its own jobs (:func:`may_manage_job`), and
# a worker speaks only for its own node (:func:`may_speak_for_node`).
POLICY: dict[str, frozenset[Audience]] = {
    _scheduler("SubmitJob"): _PEOPLE,
    _scheduler("SubmitJobs"): _PEOPLE,
    _scheduler("GetJob"): _READERS,
    _scheduler("ListJobs"): _READERS,
    _scheduler("GetArray"): _READERS,
    _scheduler("CancelJob"): _PEOPLE,
    _scheduler("RequeueJob"): _PEOPLE,
    _scheduler("ExplainJob"): _PEOPLE,
    _scheduler("GrantLogAccess"): _PEOPLE,
    _scheduler("ListNodes"): _READERS,
    _scheduler("CordonNode"): frozenset({_A, _O}),
    _scheduler("UncordonNode"): frozenset({_A, _O}),
    _scheduler("DrainNode"): frozenset({_A, _O}),
    _scheduler("RepairGpus"): frozenset({_A, _O}),
    _scheduler("GetClusterStatus"): _READERS,
    _scheduler("GetReplicaState"): frozenset({_A, Audience.REPLICA}),
    _scheduler("CreateToken"): frozenset({_A}),
    _scheduler("ListTokens"): frozenset({_A}),
    _scheduler("RevokeToken"): frozenset({_A}),
    # Membership and backup
    _scheduler("AddReplica"): frozenset({_A}),
    _scheduler("RemoveReplica"): frozenset({_A}),
    _scheduler("SaveSnapshot"): frozenset({_A}),
    # History and events: a user sees only its own jobs' history and usage.
    _scheduler("ListHistory"): _PEOPLE,
    _scheduler("GetUsage"): _PEOPLE,
    _scheduler("WatchEvents"): _READERS,
    # Queues: everyone who may submit sees the queues; admins change them.
    _scheduler("ListQueues"): _READERS,
    _scheduler("SetQueue"): frozenset({_A}),
    _scheduler("DeleteQueue"): frozenset({_A}),
    _scheduler("SetCohort"): frozenset({_A}),
    _scheduler("DeleteCohort"): frozenset({_A}),
    # Per-identity limits: everyone may read them, admins change them.
    _scheduler("GetLimits"): _READERS,
    _scheduler("SetLimits"): frozenset({_A}),
    _agent("RegisterNode"): frozenset({_A, Audience.WORKER}),
    _agent("Heartbeat"): frozenset({_A, Audience.WORKER}),
    # Heartbeat streams: the same callers as Heartbeat.
    f"/{NODE_STREAM_SERVICE}/Connect": frozenset({_A, Audience.WORKER}),
    # Relayed heartbeats: a follower forwards its workers' heartbeats to the leader.
    _agent("RelayHeartbeats"): frozenset({_A, Audience.REPLICA}),
}


class AccessRefusalCode(enum.StrEnum):
    UNAUTHENTICATED = "unauthenticated"  # no credential, or one that proves nothing
    PERMISSION_DENIED = "permission_denied"  # a known caller, not allowed to do this


@dataclass(frozen=True, slots=True)
class AccessRefusal:
    """Why a call is refused: a code for programs and a sentence a person can act on."""

    code: AccessRefusalCode
    message: str


def short_method(method: str) -> str:
    """``/synapse.v1.SchedulerService/CordonNode`` → ``CordonNode``."""
    return method.rsplit("/", 1)[-1]


def describe_caller(identity: Identity) -> str:
    """``user:bob (role user)``, ``worker:n1``."""
    if identity.kind is Kind.USER:
        return f"{identity} (role {identity.role or Role.USER})"
    return str(identity)


_AUDIENCE_ORDER = (Audience.USER, Audience.OPERATOR, Audience.ADMIN, Audience.WORKER)


def _needs(allowed: frozenset[Audience]) -> str:
    roles = [a.value for a in _AUDIENCE_ORDER[:3] if a in allowed]
    kinds = [f"{a.value}s" for a in (Audience.REPLICA, Audience.WORKER) if a in allowed]
    parts = []
    if roles:
        parts.append(f"role {' or '.join(roles)}")
    parts.extend(kinds)
    return "it needs " + " or ".join(parts) if parts else "nobody may call it"


def unauthenticated(why: str) -> AccessRefusal:
    return AccessRefusal(AccessRefusalCode.UNAUTHENTICATED, why)


NO_CREDENTIAL = (
    "no credential: send a token (metadata 'authorization: Bearer syn_…', e.g. synctl "
    "--token-file or SYNAPSE_TOKEN) or a client certificate of the cluster's CA"
)


def authorize(identity: Identity | None, method: str) -> AccessRefusal | None:
    """None when ``identity`` may call ``method`` (a full gRPC path), else why not.

    A method the policy does not name is refused to everyone: a new RPC is closed until
    it is given a row."""
    if identity is None:
        return unauthenticated(NO_CREDENTIAL)
    name = short_method(method)
    allowed = POLICY.get(method)
    if allowed is None:
        return AccessRefusal(
            AccessRefusalCode.PERMISSION_DENIED,
            f"{name} is not a method the cluster's policy names",
        )
    if audience_of(identity) in allowed:
        return None
    return AccessRefusal(
        AccessRefusalCode.PERMISSION_DENIED,
        f"{describe_caller(identity)} may not call {name}; {_needs(allowed)}",
    )


def may_manage_job(identity: Identity, job_owner: str) -> bool:
    """Whether ``identity`` may cancel, explain, read the logs of, and see the command and
    environment of a job owned by ``job_owner``: admins and operators any job, a user its
    own (a job without an owner, submitted before owners were recorded, is nobody's)."""
    if identity.kind is not Kind.USER:
        return False
    if identity.role in (Role.ADMIN, Role.OPERATOR):
        return True
    return bool(job_owner) and identity.name == job_owner


def job_refusal(identity: Identity, job_id: str, job_owner: str) -> AccessRefusal | None:
    """None when :func:`may_manage_job`, else a PERMISSION_DENIED naming the owner."""
    if may_manage_job(identity, job_owner):
        return None
    owner = f"user {job_owner}" if job_owner else "no user"
    return AccessRefusal(
        AccessRefusalCode.PERMISSION_DENIED,
        f"{describe_caller(identity)} may not manage {job_id}: it belongs to {owner}; "
        f"it needs its owner, or role operator or admin",
    )


def sees_all_history(identity: Identity) -> bool:
    """Whether ``identity`` reads every job's history and usage (admins, operators and
    replicas); a user reads only its own jobs'."""
    if identity.kind is Kind.REPLICA:
        return True
    return identity.kind is Kind.USER and identity.role in (Role.ADMIN, Role.OPERATOR)


def may_speak_for_node(identity: Identity, node_id: str) -> AccessRefusal | None:
    """None when ``identity`` may register or heartbeat as ``node_id``: the worker that
    node id names, or an admin."""
    if identity.kind is Kind.WORKER and identity.name == node_id:
        return None
    if identity.kind is Kind.USER and identity.role is Role.ADMIN:
        return None
    return AccessRefusal(
        AccessRefusalCode.PERMISSION_DENIED,
        f"{describe_caller(identity)} may not speak for node {node_id!r}; only the "
        f"worker whose certificate names it may",
    )


def may_submit(identity: Identity) -> bool:
    """Jobs run as their owner, so only users (of any role) submit them."""
    return identity.kind is Kind.USER


DEFAULT_QUEUE_NAME = "default"  # the built-in queue; core.model.DEFAULT_QUEUE names it too


def queue_refusal(
    identity: Identity, queue: str, token_queues: tuple[str, ...] | None
) -> AccessRefusal | None:
    """None when ``identity`` may submit to ``queue``, else a PERMISSION_DENIED naming the
    queue and the rule (DESIGN §8, docs/queues.md).

    The rule: admins and operators may use any queue. A user may use the queues its
    credential names: ``token_queues`` are the queues of the token it presented (None
    when it presented none: a user certificate, which names no queues). A credential
    that names no queues (a token made without ``--queue``, or a certificate) allows the
    ``default`` queue only.
    """
    if identity.kind is Kind.USER and identity.role in (Role.ADMIN, Role.OPERATOR):
        return None
    allowed = token_queues or (DEFAULT_QUEUE_NAME,)
    if queue in allowed:
        return None
    if token_queues is None:
        rule = "a user certificate names no queues, so it allows the default queue only"
    elif not token_queues:
        rule = "its token names no queues, so it allows the default queue only"
    else:
        rule = f"its token allows the queues {', '.join(token_queues)}"
    return AccessRefusal(
        AccessRefusalCode.PERMISSION_DENIED,
        f"{describe_caller(identity)} may not submit to queue {queue}: {rule}; "
        f"an admin can make a token naming it (synctl token create --queue {queue})",
    )


# ---------------------------------------------------------------------------- tokens

TOKEN_PREFIX = "syn_"
TOKEN_ID_PATTERN = re.compile(r"^[0-9a-f]{12}$")
TOKEN_HASH_PATTERN = re.compile(r"^[0-9a-f]{64}$")
BOOTSTRAP = "bootstrap"  # ``created_by`` of the first admin token, made by a replica


def split_token(text: str) -> tuple[str, str] | None:
    """``syn_<token_id>_<secret>`` → (token_id, secret), or None when it is not one."""
    if not text.startswith(TOKEN_PREFIX):
        return None
    token_id, sep, secret = text[len(TOKEN_PREFIX) :].partition("_")
    if not sep or not secret or not TOKEN_ID_PATTERN.match(token_id):
        return None
    return token_id, secret
