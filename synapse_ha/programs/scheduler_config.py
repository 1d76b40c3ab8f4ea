"""The configuration of ``synapse-scheduler``: its flags and TOML file (flags win),
checked whole before the replica starts (:func:`load_config`)::

    replica_id = "r1"
    data_dir = "/var/lib/synapse/r1"
    raft_password_file = "/etc/synapse/raft.password"   # only with raft.transport = "password";
                                    # or env SYNAPSE_RAFT_PASSWORD; openssl rand -base64 32
    [[replicas]]
    id = "r1"
    raft = "10.0.0.1:7001"
    grpc = "10.0.0.1:7101"
    # ... one table per replica, the same list on every replica
    [timeouts]
    heartbeat_interval = "1s"
    lease_ttl = "4s"
    leader_step_down = "2s"
    dead_timeout = "10s"
    [raft]
    election_min = "400ms"
    election_max = "800ms"
    fsync = true             # sync the journal before acknowledging (see README)
    transport = "tls"        # the Raft channel: "tls" (default with [tls]) or "password"
    bootstrap_token_file = "/etc/synapse/admin.token"  # the first admin's token
    [tls]                    # mutual TLS (required unless insecure = true)
    ca = "/etc/synapse/tls/ca.pem"
    cert = "/etc/synapse/tls/replica-r1.pem"
    key = "/etc/synapse/tls/replica-r1.key"
    [reads]                  # heavy reads (lists, explanations) may not starve Raft
    heavy_concurrency = 2    # at most this many at once
    heavy_cpu_share = 0.3    # and this share of one core; beyond it: OVERLOADED
    leader_cpu_share = 0.05  # the leader's, for reads a follower can serve (read_config)
    [metrics]                # /metrics and the web dashboard, over HTTPS with [tls]
    address = "10.0.0.1:9101"
    [limits]                 # per-identity limits this replica puts back when it leads;
    submit_per_s = 50        # the others are `synctl config set limits.NAME=VALUE`
    [slow_nodes]
    window = "15m"           # how long each gang's window of member paces (1s to 24h)
    threshold = 15           # a strike: the slowest of its peers by this percent (1-1000)

Membership and backup: ``--join`` (``join = true``) for a replica added to a running
cluster with ``synctl cluster add-replica``; ``--restore FILE`` (``restore = "FILE"``) to
start a new cluster, alone, from a backup made by ``synctl cluster snapshot save``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from synapse_ha.core.cluster_config import LOCALITY_WAIT_MS, Timeouts
from synapse_ha.core.health.slowness import SlownessRule
from synapse_ha.core.identity.access import split_token
from synapse_ha.core.spec.validation import check_timeouts
from synapse_ha.history.events import DEFAULT_CAPACITY
from synapse_ha.leader.scheduling import SchedulingSettings
from synapse_ha.leader.slow_nodes import DEFAULT_WINDOW_MS
from synapse_ha.programs.config_file import ConfigError, address, duration_ms
from synapse_ha.programs.queue_config import LOCALITY_WAIT, SCHEDULING, scheduling_settings
from synapse_ha.programs.read_config import (
    HEAVY_READ_CPU_SHARE,
    HEAVY_READS,
    LEADER_READ_CPU_SHARE,
    READS,
)
from synapse_ha.programs.settings import (
    Inputs,
    Setting,
    add_settings,
    metrics_address,
    new_parser,
    parse_flags,
    served_address,
    setting,
    switch,
    tls_files,
    true_or_false,
    writable_directory,
)
from synapse_ha.raft.channel import (
    PASSWORD_CHANNEL,
    RAFT_CHANNELS,
    data_dir_mode_problem,
    raft_channel,
    raft_password_problem,
)
from synapse_ha.raft.replica import RaftTiming
from synapse_ha.rpc.server import ReplicaAddress
from synapse_ha.security.tls import TlsFiles, add_tls_flags

# Whether the Raft journal is synced before acknowledging (synapse_ha.raft.journal); the
# README's "Durability" section gives the guarantee and the measured cost.
RAFT_FSYNC_DEFAULT = True


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    replica_id: str
    replicas: tuple[ReplicaAddress, ...]
    data_dir: str
    raft_password: str
    timeouts: Timeouts = field(default_factory=Timeouts)
    timing: RaftTiming = field(default_factory=RaftTiming)
    log_level: str = "INFO"
    locality_wait_ms: int = LOCALITY_WAIT_MS
    heavy_reads: int = 2
    heavy_read_cpu_share: float = 0.3
    leader_read_cpu_share: float = 0.05  # 0: the leader serves follower reads as others
    tls: TlsFiles | None = None  # None: --insecure
    bootstrap_token: str = ""  # the first admin's token text
    join: bool = False  # new to a running cluster: no election before hearing a leader
    restore: str = ""  # a backup file to start a new cluster from
    history: bool = True  # history in <data_dir>/history.sqlite3 and events
    event_ring: int = DEFAULT_CAPACITY  # recent events held for WatchEvents
    metrics_address: str = ""  # /metrics and the dashboard; "" serves neither
    scheduling: SchedulingSettings = field(default_factory=SchedulingSettings)
    raft_fsync: bool = RAFT_FSYNC_DEFAULT  # journal changes synced before acknowledging
    # Heartbeat streams: where NodeStreamService listens; "" serves none.
    agent_address: str = ""
    raft_transport: str = PASSWORD_CHANNEL  # the Raft channel (synapse_ha.raft.channel)
    slow_node_window_ms: int = DEFAULT_WINDOW_MS  # the leader's pace windows (docs/slow-nodes.md)
    slow_node_threshold_pct: int = SlownessRule().threshold_pct  # a strike's margin

    @property
    def me(self) -> ReplicaAddress:
        return next(r for r in self.replicas if r.replica_id == self.replica_id)


# ------------------------------------------------------------------- the checks


def parse_replica(value: str) -> ReplicaAddress:
    """``ID=RAFT_HOST:PORT,GRPC_HOST:PORT``."""
    replica_id, sep, rest = value.partition("=")
    addresses = rest.split(",")
    if not sep or not replica_id or len(addresses) != 2:
        raise ConfigError(
            f"--replica {value!r}: expected ID=RAFT_HOST:PORT,GRPC_HOST:PORT "
            "(e.g. r1=10.0.0.1:7001,10.0.0.1:7101)"
        )
    return ReplicaAddress(
        replica_id=replica_id,
        raft=address(addresses[0].strip(), f"replica {replica_id} raft address"),
        grpc=address(addresses[1].strip(), f"replica {replica_id} grpc address"),
    )


def _restore_file(value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError("restore must be a file name")
    return value


def _election_s(what: str) -> Callable[[Any], float]:
    return lambda value: duration_ms(value, what) / 1000


def _compaction_entries(value: Any) -> int:
    if not isinstance(value, int) or value < 10:
        raise ConfigError("compaction_entries must be an integer >= 10")
    return value


def _slow_node_window(value: Any) -> int:
    what = "slow_nodes.window (--slow-node-window)"
    window_ms = duration_ms(value, what)
    if not 1_000 <= window_ms <= 86_400_000:
        raise ConfigError(f"{what} must be between 1s and 24h, got {value!r}")
    return window_ms


def _slow_node_threshold(value: Any) -> int:
    what = "slow_nodes.threshold (--slow-node-threshold)"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{what} must be a whole percent, got {value!r}")
    problem = SlownessRule(threshold_pct=value).error()  # the rule's own range
    if problem is not None:
        raise ConfigError(f"{what} must be {problem.partition(': ')[2]}")
    return value


def _event_ring(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"event_ring must be a positive integer, got {value!r}")
    return value


# ----------------------------------------------------------------- the settings

REPLICA_ID = setting(
    "--id",
    "replica_id",
    merge="truthy",
    default="",
    dest="replica_id",
    help="this replica's id (one of --replica)",
)
REPLICA = setting(
    "--replica",
    "replicas",
    action="append",
    flag_default=[],
    metavar="ID=RAFT,GRPC",
    help="a replica as ID=RAFT_HOST:PORT,GRPC_HOST:PORT; repeat for every replica",
)
DATA_DIR = setting(
    "--data-dir",
    "data_dir",
    merge="truthy",
    default="",
    help="directory for the Raft journal and snapshot",
)
RAFT_PASSWORD_FILE = setting(
    "--raft-password-file",
    "raft_password_file",
    merge="truthy",
    default="",
    help="file holding the Raft password, at least 32 random bytes in base64 or hex "
    "(openssl rand -base64 32); or set SYNAPSE_RAFT_PASSWORD",
)
REPLICA_SET = (REPLICA_ID, REPLICA, DATA_DIR, RAFT_PASSWORD_FILE)


def _timeout(name: str, default_ms: int) -> Setting:
    return setting(
        f"--{name.replace('_', '-')}",
        f"timeouts.{name}",
        default=default_ms,
        check=partial(duration_ms, what=name),
        help="a duration such as 1s, 500ms or 10s",
    )


_TIMEOUT_DEFAULTS = Timeouts()
HEARTBEAT_INTERVAL = _timeout("heartbeat_interval", _TIMEOUT_DEFAULTS.heartbeat_interval_ms)
LEASE_TTL = _timeout("lease_ttl", _TIMEOUT_DEFAULTS.lease_ttl_ms)
LEADER_STEP_DOWN = _timeout("leader_step_down", _TIMEOUT_DEFAULTS.leader_step_down_ms)
DEAD_TIMEOUT = _timeout("dead_timeout", _TIMEOUT_DEFAULTS.dead_timeout_ms)
TIMEOUTS = (HEARTBEAT_INTERVAL, LEASE_TTL, LEADER_STEP_DOWN, DEAD_TIMEOUT)

_RAFT_DEFAULTS = RaftTiming()


def _election_bound(bound: str, default_s: float, which: str) -> Setting:
    """``raft.election_<bound>`` (``--election-<bound>``), a bound of the election
    timeout, blank for its default."""
    name = f"election_{bound}"
    return setting(
        f"--election-{bound}",
        f"raft.{name}",
        merge="truthy",
        default=default_s,
        check=_election_s(name),
        blank_is_default=True,
        help=f"Raft election timeout, {which} bound (default {default_s * 1000:.0f}ms)",
    )


ELECTION_MIN = _election_bound("min", _RAFT_DEFAULTS.election_min_s, "lower")
ELECTION_MAX = _election_bound("max", _RAFT_DEFAULTS.election_max_s, "upper")
RAFT_FSYNC = switch(
    "raft.fsync",
    "sync every Raft journal change to disk before acknowledging it, so an "
    "acknowledged command survives a power loss of every replica "
    f"(default {'on' if RAFT_FSYNC_DEFAULT else 'off'}; [raft] fsync)",
    flag="--raft-fsync",
    default=RAFT_FSYNC_DEFAULT,
)
COMPACT_STATE = switch(
    "raft.compact_state",
    "write the replicated state as lists of field values, without trailing "
    "defaults (about 40%% of the size of snapshots and state downloads); on only once "
    "every replica runs "
    "this release. Left as replicated when not given ([raft] compact_state)",
)
COMPACTION_ENTRIES = setting(
    "--compaction-entries",
    "raft.compaction_entries",
    merge="truthy",
    check=_compaction_entries,
    type=int,
    help="write a snapshot and trim the journal after this many entries (default 20000)",
)
RAFT_TRANSPORT = setting(
    "--raft-transport",
    "raft.transport",
    merge="truthy",
    default="",
    choices=RAFT_CHANNELS,
    help="the Raft channel: tls (mutual TLS with the replica certificates; the default "
    "with TLS, needs no Raft password) or password (pysyncobj's channel under the Raft "
    "password, as replicas of earlier releases speak; always with --insecure). Every "
    "replica of a cluster runs the same one ([raft] transport)",
)
RAFT = (ELECTION_MIN, ELECTION_MAX, RAFT_FSYNC, COMPACT_STATE, COMPACTION_ENTRIES, RAFT_TRANSPORT)


BOOTSTRAP_TOKEN_FILE = setting(
    "--bootstrap-token-file",
    "bootstrap_token_file",
    merge="truthy",
    default="",
    help="a file holding the first admin's token (syn_...): the leader replicates its "
    "hash once, if the cluster has never had it",
)
NO_HISTORY = setting(
    "--no-history",
    "history.enabled",
    negated=True,
    default=True,
    check=true_or_false("history.enabled"),
    action="store_true",
    help="keep no job history and stream no events (synctl history, usage and events "
    "answer that they are turned off)",
)
EVENT_RING = setting(
    "--event-ring",
    "history.event_ring",
    default=DEFAULT_CAPACITY,
    check=_event_ring,
    type=int,
    help=f"recent events held for synctl events --since (default {DEFAULT_CAPACITY})",
)
METRICS_ADDRESS = metrics_address(
    "HOST:PORT where /metrics and the web dashboard are served (HTTPS with the "
    "replica's certificate; port 0 picks a free port); default: not served"
)
AGENT_ADDRESS = setting(
    "--agent-address",
    "agent_address",
    default="",
    check=served_address("agent address"),
    help="HOST:PORT where workers' heartbeat streams are served (mutual TLS; port 0 "
    'picks a free port, advertised to workers when they register); "" or unset: '
    "workers keep unary heartbeats",
)
LOG_LEVEL = setting(
    "--log-level",
    "log_level",
    merge="truthy",
    default="INFO",
    check=str.upper,
    help="DEBUG, INFO, WARNING (default INFO)",
)
SLOW_NODE_WINDOW = setting(
    "--slow-node-window",
    "slow_nodes.window",
    default=DEFAULT_WINDOW_MS,
    check=_slow_node_window,
    help="how long each window of a gang's member paces the leader weighs for slow nodes, "
    "1s to 24h (default 15m; docs/slow-nodes.md)",
)
SLOW_NODE_THRESHOLD = setting(
    "--slow-node-threshold",
    "slow_nodes.threshold",
    default=SlownessRule().threshold_pct,
    check=_slow_node_threshold,
    type=int,
    help="PCT: a member is a strike against its node when it is the slowest of its peers "
    "by at least this percent, 1 to 1000 (default 15; docs/slow-nodes.md)",
)
SERVICES = (BOOTSTRAP_TOKEN_FILE, NO_HISTORY, EVENT_RING, METRICS_ADDRESS, AGENT_ADDRESS)

# Membership and backup
JOIN = setting(
    "--join",
    "join",
    default=False,
    check=bool,
    action="store_true",
    help="this replica is new to a running cluster (after `synctl cluster add-replica`): "
    "start no election before hearing from the leader, catch up from it",
)
RESTORE = setting(
    "--restore",
    "restore",
    merge="truthy",
    default="",
    check=_restore_file,
    metavar="FILE",
    help="start a NEW cluster from a backup (`synctl cluster snapshot save`): this "
    "replica starts alone from FILE, in an empty data directory; add the others with "
    "`synctl cluster add-replica`",
)
MEMBERSHIP = (JOIN, RESTORE)


def build_parser() -> argparse.ArgumentParser:
    p = new_parser("synapse-scheduler", "Run one replica of the synapse control plane.")
    add_settings(p, REPLICA_SET, TIMEOUTS, SCHEDULING, RAFT, READS)
    add_tls_flags(
        p,
        "replica",
        "serve without TLS and without authentication (every caller is an admin); "
        "logs a warning at every start",
    )
    add_settings(p, SERVICES, (SLOW_NODE_WINDOW, SLOW_NODE_THRESHOLD, LOG_LEVEL), MEMBERSHIP)
    return p


# ------------------------------------------------------------------ the loader

# The value types of the configuration file's keys that are used without a parser of their
# own (a parser names the key in its error): a wrong type is a ConfigError naming the key.
# A file name given as a number would otherwise be opened as a file descriptor.
_FILE_TYPES: dict[str, type] = {
    "replicas": list,
    "data_dir": str,
    "raft_password_file": str,
    "bootstrap_token_file": str,
    "log_level": str,
    "join": bool,
    "insecure": bool,
    "timeouts": dict,
    "scheduling": dict,
    "limits": dict,
    "raft": dict,
    "reads": dict,
    "history": dict,
    "tls": dict,
    "metrics": dict,
    "slow_nodes": dict,
}


def load_config(argv: Sequence[str], environ: dict[str, str] | None = None) -> SchedulerConfig:
    """Merge the TOML file and flags; raise :class:`ConfigError` on anything wrong."""
    environ = dict(os.environ if environ is None else environ)
    inputs = Inputs.read(parse_flags(build_parser(), argv), _FILE_TYPES)
    replica_id, replicas, join, restore = _replica_set(inputs)
    data_dir = inputs.value(DATA_DIR)
    if not data_dir:
        raise ConfigError("a data directory is required (--data-dir or data_dir)")
    writable_directory(data_dir)
    timeouts = _timeouts(inputs)
    locality_wait_ms = inputs.value(LOCALITY_WAIT)
    scheduling = scheduling_settings(inputs)
    timing, compact_state, raft_fsync = _raft(inputs, timeouts)
    heavy_reads, share = inputs.value(HEAVY_READS), inputs.value(HEAVY_READ_CPU_SHARE)
    tls = tls_files(inputs)
    try:
        transport = raft_channel(inputs.value(RAFT_TRANSPORT), secure=tls is not None)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    password = _raft_password(inputs, environ) if transport == PASSWORD_CHANNEL else ""
    # A restore needs an empty data directory (restore_into refuses any other, saying so).
    mixed = None if restore else data_dir_mode_problem(data_dir, secure=tls is not None)
    if mixed is not None:
        raise ConfigError(mixed)
    bootstrap_token = _bootstrap_token(inputs)
    history, event_ring = inputs.value(NO_HISTORY), inputs.value(EVENT_RING)
    metrics, agent = inputs.value(METRICS_ADDRESS), inputs.value(AGENT_ADDRESS)
    return SchedulerConfig(
        agent_address=agent,
        metrics_address=metrics,
        replica_id=replica_id,
        replicas=tuple(replicas),
        data_dir=data_dir,
        raft_password=password,
        timeouts=timeouts,
        timing=timing,
        log_level=inputs.value(LOG_LEVEL),
        locality_wait_ms=locality_wait_ms,
        heavy_reads=heavy_reads,
        heavy_read_cpu_share=share,
        leader_read_cpu_share=inputs.value(LEADER_READ_CPU_SHARE),
        tls=tls,
        bootstrap_token=bootstrap_token,
        join=join,
        restore=restore,
        history=history,
        event_ring=event_ring,
        scheduling=replace(scheduling, compact_state=compact_state),
        raft_fsync=raft_fsync,
        raft_transport=transport,
        slow_node_window_ms=inputs.value(SLOW_NODE_WINDOW),
        slow_node_threshold_pct=inputs.value(SLOW_NODE_THRESHOLD),
    )


def _replica_set(inputs: Inputs) -> tuple[str, list[ReplicaAddress], bool, str]:
    """This replica's id, every replica, and whether it joins a running cluster or
    restores one from a backup."""
    replica_id = inputs.value(REPLICA_ID)
    if not replica_id or not isinstance(replica_id, str):
        raise ConfigError("replica id is required (--id or replica_id)")
    replicas: list[ReplicaAddress] = [parse_replica(v) for v in inputs.flags.replica]
    if not replicas:
        for i, table in enumerate(inputs.file.get("replicas", [])):
            if not isinstance(table, dict) or set(table) != {"id", "raft", "grpc"}:
                raise ConfigError(f"replicas[{i}]: expected a table with id, raft and grpc")
            replicas.append(parse_replica(f"{table['id']}={table['raft']},{table['grpc']}"))
    if not replicas:
        raise ConfigError("no replicas configured (--replica or [[replicas]])")
    ids = [r.replica_id for r in replicas]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"replica ids must be unique, got {ids}")
    for kind in ("raft", "grpc"):
        addresses = [getattr(r, kind) for r in replicas]
        if len(set(addresses)) != len(addresses):
            raise ConfigError(f"{kind} addresses must be unique, got {addresses}")
    if replica_id not in ids:
        raise ConfigError(f"replica id {replica_id!r} is not among the replicas {ids}")
    join, restore = inputs.value(JOIN), inputs.value(RESTORE)
    if join and restore:
        raise ConfigError(
            "--join and --restore exclude each other: a restored replica starts "
            "a new cluster, a joining one enters a running cluster"
        )
    if len(replicas) % 2 == 0 and not join:
        raise ConfigError(
            f"use an odd number of replicas (3 or 5), got {len(replicas)} (while a replica is "
            "being added the list may be even: start the new one with --join)"
        )
    return replica_id, replicas, join, restore


def _file_text(path: str, what: str) -> str:
    """The text of the file at ``path`` without surrounding blanks; one that cannot be
    read is a :class:`ConfigError` naming ``what``."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError as exc:
        raise ConfigError(f"{what}: {exc}") from None


def _raft_password(inputs: Inputs, environ: dict[str, str]) -> str:
    """The Raft password, from its file or the environment, strong enough."""
    password = environ.get("SYNAPSE_RAFT_PASSWORD", "")
    password_file = inputs.value(RAFT_PASSWORD_FILE)
    if password_file:
        password = _file_text(password_file, "raft password file")
    if not password:
        raise ConfigError(
            "a Raft password is required (--raft-password-file or SYNAPSE_RAFT_PASSWORD): "
            "it encrypts the replicas' traffic on the password channel (--insecure or "
            "raft.transport = password)"
        )
    weak = raft_password_problem(password)
    if weak is not None:
        raise ConfigError(weak)
    return password


def _timeouts(inputs: Inputs) -> Timeouts:
    """The self-fencing timeouts (flags over ``[timeouts]``), safe together."""
    timeouts = replace(
        _TIMEOUT_DEFAULTS,
        heartbeat_interval_ms=inputs.value(HEARTBEAT_INTERVAL),
        lease_ttl_ms=inputs.value(LEASE_TTL),
        leader_step_down_ms=inputs.value(LEADER_STEP_DOWN),
        dead_timeout_ms=inputs.value(DEAD_TIMEOUT),
    )
    problems = check_timeouts(timeouts)
    if problems:
        raise ConfigError("unsafe timeouts: " + "; ".join(v.rule for v in problems))
    return timeouts


def _raft(inputs: Inputs, timeouts: Timeouts) -> tuple[RaftTiming, bool | None, bool]:
    """``[raft]``: election and compaction timing, the compact state and fsync."""
    timing = replace(
        _RAFT_DEFAULTS,
        election_min_s=inputs.value(ELECTION_MIN),
        election_max_s=inputs.value(ELECTION_MAX),
        leader_step_down_s=timeouts.leader_step_down_ms / 1000,
    )
    compaction = inputs.value(COMPACTION_ENTRIES)
    if compaction is not None:
        timing = replace(timing, log_compaction_min_entries=compaction)
    compact_state = inputs.value(COMPACT_STATE)
    raft_fsync = inputs.value(RAFT_FSYNC)
    if timing.election_max_s <= timing.election_min_s:
        raise ConfigError("election_max must exceed election_min")
    if timing.election_min_s <= 3 * timing.append_entries_period_s:
        raise ConfigError(f"election_min must exceed {3 * timing.append_entries_period_s}s")
    if timing.leader_step_down_s < timing.election_max_s:
        raise ConfigError(
            f"leader_step_down ({timeouts.leader_step_down_ms} ms) must be at least "
            f"election_max ({round(timing.election_max_s * 1000)} ms): a leader that "
            "hears no majority steps down after one election timeout"
        )
    return timing, compact_state, raft_fsync


def _bootstrap_token(inputs: Inputs) -> str:
    """The first admin's token from its file ("" without one)."""
    bootstrap_token = ""
    token_file = inputs.value(BOOTSTRAP_TOKEN_FILE)
    if token_file:
        bootstrap_token = _file_text(token_file, "bootstrap token file")
        if split_token(bootstrap_token) is None:
            raise ConfigError(
                f"bootstrap token file {token_file}: not a token (syn_<12 hex>_<secret>)"
            )
    return bootstrap_token
