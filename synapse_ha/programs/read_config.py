"""The ``[reads]`` settings of ``synapse-scheduler``: how much of a replica heavy reads
(lists, explanations) may use, so that they cannot starve Raft and the heartbeats
(:mod:`synapse_ha.rpc.load_gates`)::

    [reads]
    heavy_concurrency = 2      # at most this many at once
    heavy_cpu_share = 0.3      # and this share of one core; beyond it: OVERLOADED
    leader_cpu_share = 0.05    # the leader's share for reads a follower can serve; 0: off
"""

from __future__ import annotations

from typing import Any

from synapse_ha.programs.config_file import ConfigError
from synapse_ha.programs.settings import setting
from synapse_ha.rpc.load_gates import ReadGate, ReadLimits

# The serving leader's ration of the heavy reads a follower could serve: a burst of about
# one full listing of a few thousand jobs, then a twentieth of a core; past it they are
# refused at once with the followers' addresses.
LEADER_BURST_S = 0.1


def _heavy_reads(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 64:
        raise ConfigError(f"heavy reads at once must be an integer in 1..64, got {value!r}")
    return value


def _share(what: str, low_included: bool) -> Any:
    def check(value: Any) -> float:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        inside = number and (0 <= value <= 1 if low_included else 0 < value <= 1)
        if not inside:
            bounds = "[0, 1]" if low_included else "(0, 1]"
            raise ConfigError(f"{what} must be in {bounds}, got {value!r}")
        return float(value)

    return check


HEAVY_READS = setting(
    "--heavy-reads",
    "reads.heavy_concurrency",
    default=2,
    check=_heavy_reads,
    type=int,
    help="heavy reads (ListJobs, ListNodes, ExplainJob) served at once (default 2)",
)
HEAVY_READ_CPU_SHARE = setting(
    "--heavy-read-cpu-share",
    "reads.heavy_cpu_share",
    default=0.3,
    check=_share("heavy read CPU share", low_included=False),
    type=float,
    help="share of one core heavy reads may use, 0-1 (default 0.3); past it they wait "
    "and then get OVERLOADED, so they cannot starve Raft and heartbeats",
)
LEADER_READ_CPU_SHARE = setting(
    "--leader-read-cpu-share",
    "reads.leader_cpu_share",
    default=0.05,
    check=_share("leader read CPU share", low_included=True),
    type=float,
    help="share of one core the serving leader gives heavy reads a follower could serve "
    "(stale, or with a read token), 0-1 (default 0.05; 0: the leader serves them like any "
    "other); past it they get OVERLOADED at once, naming the followers",
)
READS = (HEAVY_READS, HEAVY_READ_CPU_SHARE, LEADER_READ_CPU_SHARE)


def read_gates(heavy: int, share: float, leader_share: float) -> tuple[ReadGate, ReadGate | None]:
    """The replica's read gate and the serving leader's own (None: off), from the
    settings' values."""
    gate = ReadGate(ReadLimits(heavy, share))
    if not leader_share:
        return gate, None
    limits = ReadLimits(1, leader_share, burst_s=LEADER_BURST_S, max_wait_s=0.0)
    return gate, ReadGate(limits)
