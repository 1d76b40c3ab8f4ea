"""Member replacement's data (DESIGN §4, opt-in with ``replace:`` in the job spec).

A gang whose spec has a :class:`ReplacePolicy` keeps running when one of its members is
lost to its node (the node declared dead, or a GPU under the member turned unhealthy):
that rank becomes a :class:`Vacancy` of the live attempt, and once its old member is known
stopped the leader places the rank again on another node with the same rank and the next
generation (:class:`~synapse_ha.core.commands.ReplaceMembers`), while the other members
run on. A vacancy not filled within the policy's timeout ends the attempt as any
disruption does: the gang is requeued whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from synapse_ha.core.reasons import Reason, ReasonCode

# The job document's keys: ``on_node_failure: replace`` (or ``requeue``, the default),
# ``replace_timeout`` and ``membership_signal``.
REPLACE_KEYS = ("on_node_failure", "replace_timeout", "membership_signal")
DEFAULT_REPLACE_TIMEOUT_MS = 300_000  # 5 minutes
DEFAULT_MEMBERSHIP_SIGNAL = "SIGUSR1"
# The signals a member may ask to be told of a membership change with; "" means none.
MEMBERSHIP_SIGNALS = ("", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGINT", "SIGWINCH", "SIGCONT")


@dataclass(frozen=True, slots=True)
class ReplacePolicy:
    """``replace:`` in the job spec. ``timeout_ms``: how long a lost rank may wait to be
    placed again before the gang is requeued whole; ``signal``: what the surviving
    members get once a line describing the new membership is written to their
    ``$SYNAPSE_MEMBERSHIP_FILE`` ("" for none)."""

    timeout_ms: int = DEFAULT_REPLACE_TIMEOUT_MS
    signal: str = DEFAULT_MEMBERSHIP_SIGNAL


@dataclass(frozen=True, slots=True)
class Vacancy:
    """A rank of a live attempt whose member was lost, waiting to be placed again.

    ``node_id``: where the lost member ran; ``since_ms``: when it was lost; ``cause``:
    why (its node's death, a GPU fault); ``stopped``: its old member is known stopped
    (its node was declared dead, which comes only after its worker fenced itself, or its
    worker reported its exit). A vacancy is filled only once ``stopped``: at no instant
    may two generations of one rank run."""

    rank: int
    node_id: str
    since_ms: int
    cause: Reason
    stopped: bool = False


def leaving(vacancy: Vacancy) -> bool:
    """Whether ``vacancy`` is a rank an elastic gang gives back (core/elastic.py): it is
    never placed again, and the attempt drops it once it is known stopped."""
    return vacancy.cause.code is ReasonCode.SHRINKING


MIN_REPLACE_TIMEOUT_MS = 1_000
MAX_REPLACE_TIMEOUT_MS = 24 * 3600 * 1000


def replace_problems(policy: ReplacePolicy | None, replicas: int) -> list[tuple[str, str]]:
    """``(field, rule)`` for each rule ``policy`` breaks (None: no replacement)."""
    if policy is None:
        return []
    problems = []
    if replicas < 2:
        problems.append(
            ("on_node_failure", "replace needs a gang of 2 or more members (one is requeued)")
        )
    if not MIN_REPLACE_TIMEOUT_MS <= policy.timeout_ms <= MAX_REPLACE_TIMEOUT_MS:
        problems.append(("replace_timeout", "must be between 1s and 24h"))
    if policy.signal not in MEMBERSHIP_SIGNALS:
        named = ", ".join(s for s in MEMBERSHIP_SIGNALS if s)
        problems.append(("membership_signal", f"must be one of {named} or none"))
    return problems
