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
