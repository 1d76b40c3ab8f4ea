"""``synapse-scheduler``: one replica of the control plane (composition root).

Configuration comes from flags and/or a TOML file (flags win)::

    replica_id = "r1"
    data_dir = "/var/lib/synapse/r1"
    raft_password_file = "/etc/synapse/raft.password"   # or env SYNAPSE_RAFT_PASSWORD;
                                                        # 32 random bytes: openssl rand -base64 32
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
    bootstrap_token_file = "/etc/synapse/admin.token"  # the first admin's token
    [tls]                    # mutual TLS (required unless insecure = true)
    ca = "/etc/synapse/tls/ca.pem"
    cert = "/etc/synapse/tls/replica-r1.pem"
    key = "/etc/synapse/tls/replica-r1.key"
    [reads]                  # heavy reads (lists, explanations) may not starve Raft
    heavy_concurrency = 2    # at most this many at once
    heavy_cpu_share = 0.3    # and this share of one core; beyond it: OVERLOADED
    [metrics]                # /metrics and the web dashboard, over HTTPS with [tls]
    address = "10.0.0.1:9101"
    [limits]                 # per-identity limits this replica puts back when it leads;
    submit_per_s = 50        # the others are `synctl config set limits.NAME=VALUE`

Membership and backup: ``--join`` (``join = true``) for a replica added to a running
cluster with ``synctl cluster add-replica``; ``--restore FILE`` (``restore = "FILE"``) to
start a new cluster, alone, from a backup made by ``synctl cluster snapshot save``.

The process runs in the foreground, logs to stderr, logs ``ready: ...`` once it has joined
a quorum with a known leader, and stops gracefully on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import os
import queue
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, overload

from synapse_ha.core import commands as cmd
from synapse_ha.core.access import Role, split_token
from synapse_ha.core.admission import check_limits
from synapse_ha.core.backup import BackupError, decode_backup
from synapse_ha.core.model import (
    DEFAULT_GRACE_MS,
    LOCALITY_WAIT_MS,
    MAX_LOCALITY_WAIT_MS,
    MAX_REQUEUES_LIMIT,
    MAX_START_TIMEOUT_MS,
    MIN_START_TIMEOUT_MS,
    Limits,
    PreemptionMode,
    PriorityClass,
    Timeouts,
)
from synapse_ha.core.validation import check_priority_classes, check_timeouts
from synapse_ha.history.events import DEFAULT_CAPACITY, EventRing
from synapse_ha.history.recorder import HistoryRecorder
from synapse_ha.history.store import FILE_NAME as HISTORY_FILE
from synapse_ha.history.store import HistoryStore
from synapse_ha.leader.loop import (
    STALL_MS,
    LeaderLoop,
    Liveness,
    LoopSettings,
    SchedulingSettings,
)
from synapse_ha.observe.dashboard import Dashboard
from synapse_ha.observe.http import AddressError, ObserveServer, parse_address
from synapse_ha.observe.metrics import ReplicaMetrics
from synapse_ha.programs.config_file import (
    ConfigError,
    address,
    check_file_types,
    duration_ms,
    read_toml,
)
from synapse_ha.raft.replica import (
    RaftReplica,
    RaftTiming,
    RestoreError,
    data_dir_mode_problem,
    raft_password_problem,
    seed_restored_state,
)
from synapse_ha.raft.snapshot_file import SnapshotMember
from synapse_ha.rpc.admission import ReadGate
from synapse_ha.rpc.auth import AuthInterceptor, token_hash
from synapse_ha.rpc.nudge import WorkerNudger
from synapse_ha.rpc.server import ReplicaAddress, ReplicaContext, build_server
from synapse_ha.rpc.stream import StreamFirstNudger, StreamServer
from synapse_ha.security.grants import GrantClaims, sign_grant
from synapse_ha.security.tls import (
    INSECURE_WARNING,
    TlsError,
    TlsFiles,
    Transport,
    add_tls_flags,
    peer_identity,
    tls_from,
)

log = logging.getLogger("synapse.scheduler")

# The user the bootstrap admin token names, and how long a log grant lasts.
BOOTSTRAP_ADMIN = "admin"
GRANT_TTL_S = 300.0


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

    @property
    def me(self) -> ReplicaAddress:
        return next(r for r in self.replicas if r.replica_id == self.replica_id)


# ---------------------------------------------------------------------- parsing


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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="synapse-scheduler", description="Run one replica of the synapse control plane."
    )
    p.add_argument("--config", help="TOML configuration file")
    p.add_argument("--id", dest="replica_id", help="this replica's id (one of --replica)")
    p.add_argument(
        "--replica",
        action="append",
        default=[],
        metavar="ID=RAFT,GRPC",
        help="a replica as ID=RAFT_HOST:PORT,GRPC_HOST:PORT; repeat for every replica",
    )
    p.add_argument("--data-dir", help="directory for the Raft journal and snapshot")
    p.add_argument(
        "--raft-password-file",
        help="file holding the Raft password, at least 32 random bytes in base64 or hex "
        "(openssl rand -base64 32); or set SYNAPSE_RAFT_PASSWORD",
    )
    for name in ("heartbeat-interval", "lease-ttl", "leader-step-down", "dead-timeout"):
        p.add_argument(f"--{name}", help="a duration such as 1s, 500ms or 10s")
    p.add_argument(
        "--locality-wait",
        help="how long a gang that fits in one rack waits for one before spreading "
        "across racks (e.g. 10m, the default; 0s turns it off)",
    )
    # Queues and preemption; TOML [scheduling] and [[scheduling.priority_classes]].
    p.add_argument(
        "--priority-class",
        action="append",
        default=[],
        metavar="NAME=VALUE[,preempts][,grace=30s]",
        help="a priority class (repeatable; replaces the built-in low, normal, high)",
    )
    p.add_argument("--preemption", help="topology (the default), blind or off")
    p.add_argument("--fair-share-half-life", help="decay of past usage in fair share (7d)")
    p.add_argument(
        "--max-requeues",
        type=int,
        help="how often a job may be requeued by disruptions it did not cause before it "
        "fails (default 5)",
    )
    p.add_argument(
        "--start-timeout",
        help="how long after its bind a gang's members may take to report running before "
        "the attempt fails: allow for the largest image pull (default 60s; 1s to 24h)",
    )
    p.add_argument("--election-min", help="Raft election timeout, lower bound (default 400ms)")
    p.add_argument("--election-max", help="Raft election timeout, upper bound (default 800ms)")
    p.add_argument(
        "--raft-fsync",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="sync every Raft journal change to disk before acknowledging it, so an "
        "acknowledged command survives a power loss of every replica "
        f"(default {'on' if RAFT_FSYNC_DEFAULT else 'off'}; [raft] fsync)",
    )
    p.add_argument(
        "--compact-state",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write the replicated state as lists of field values, without trailing "
        "defaults (about 40%% of the size of snapshots and state downloads); on only once "
        "every replica runs "
        "this release. Left as replicated when not given ([raft] compact_state)",
    )
    p.add_argument(
        "--compaction-entries",
        type=int,
        help="write a snapshot and trim the journal after this many entries (default 20000)",
    )
    p.add_argument(
        "--heavy-reads",
        type=int,
        help="heavy reads (ListJobs, ListNodes, ExplainJob) served at once (default 2)",
    )
    p.add_argument(
        "--heavy-read-cpu-share",
        type=float,
        help="share of one core heavy reads may use, 0-1 (default 0.3); past it they wait "
        "and then get OVERLOADED, so they cannot starve Raft and heartbeats",
    )
    add_tls_flags(
        p,
        "replica",
        "serve without TLS and without authentication (every caller is an admin); "
        "logs a warning at every start",
    )
    p.add_argument(
        "--bootstrap-token-file",
        help="a file holding the first admin's token (syn_...): the leader replicates its "
        "hash once, if the cluster has never had it",
    )
    p.add_argument(
        "--no-history",
        action="store_true",
        default=None,
        help="keep no job history and stream no events (synctl history, usage and events "
        "answer that they are turned off)",
    )
    p.add_argument(
        "--event-ring",
        type=int,
        help=f"recent events held for synctl events --since (default {DEFAULT_CAPACITY})",
    )
    p.add_argument(
        "--metrics-address",
        help="HOST:PORT where /metrics and the web dashboard are served (HTTPS with the "
        "replica's certificate; port 0 picks a free port); default: not served",
    )
    p.add_argument(
        "--agent-address",
        help="HOST:PORT where workers' heartbeat streams are served (mutual TLS; port 0 "
        'picks a free port, advertised to workers when they register); "" or unset: '
        "workers keep unary heartbeats",
    )
    p.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING (default INFO)")
    # Membership and backup
    p.add_argument(
        "--join",
        action="store_true",
        default=None,
        help="this replica is new to a running cluster (after `synctl cluster add-replica`): "
        "start no election before hearing from the leader, catch up from it",
    )
    p.add_argument(
        "--restore",
        metavar="FILE",
        help="start a NEW cluster from a backup (`synctl cluster snapshot save`): this "
        "replica starts alone from FILE, in an empty data directory; add the others with "
        "`synctl cluster add-replica`",
    )
    return p


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
}


def load_config(argv: Sequence[str], environ: dict[str, str] | None = None) -> SchedulerConfig:
    """Merge the TOML file and flags; raise :class:`ConfigError` on anything wrong."""
    environ = dict(os.environ if environ is None else environ)
    args = build_parser().parse_args(list(argv))
    doc = read_toml(args.config)
    check_file_types(doc, _FILE_TYPES)
    replica_id, replicas, join, restore = _replica_set(args, doc)
    data_dir = args.data_dir or doc.get("data_dir", "")
    if not data_dir:
        raise ConfigError("a data directory is required (--data-dir or data_dir)")
    _check_writable(data_dir)
    password = _raft_password(args, doc, environ)
    timeouts = _timeouts(args, doc)
    locality_wait_ms = _locality_wait(args, doc)
    scheduling = replace(
        _scheduling(args, doc.get("scheduling", {})), limits=_limits(doc.get("limits", {}))
    )
    timing, compact_state, raft_fsync = _raft(args, doc, timeouts)
    scheduling = replace(scheduling, compact_state=compact_state)
    heavy_reads, share = _reads(args, doc)
    try:
        tls = tls_from(args, doc)
    except TlsError as exc:
        raise ConfigError(str(exc)) from None
    # A restore needs an empty data directory (restore_into refuses any other, saying so).
    mixed = None if restore else data_dir_mode_problem(data_dir, secure=tls is not None)
    if mixed is not None:
        raise ConfigError(mixed)
    bootstrap_token = _bootstrap_token(args, doc)
    history, event_ring = _history(args, doc)
    metrics_address, agent_address = _service_addresses(args, doc)
    return SchedulerConfig(
        agent_address=agent_address,
        metrics_address=metrics_address,
        replica_id=replica_id,
        replicas=tuple(replicas),
        data_dir=data_dir,
        raft_password=password,
        timeouts=timeouts,
        timing=timing,
        log_level=(args.log_level or doc.get("log_level", "INFO")).upper(),
        locality_wait_ms=locality_wait_ms,
        heavy_reads=heavy_reads,
        heavy_read_cpu_share=share,
        tls=tls,
        bootstrap_token=bootstrap_token,
        join=join,
        restore=restore,
        history=history,
        event_ring=event_ring,
        scheduling=scheduling,
        raft_fsync=raft_fsync,
    )


def _replica_set(
    args: argparse.Namespace, doc: dict[str, Any]
) -> tuple[str, list[ReplicaAddress], bool, str]:
    """This replica's id, every replica, and whether it joins a running cluster or
    restores one from a backup."""
    replica_id = args.replica_id or doc.get("replica_id", "")
    if not replica_id or not isinstance(replica_id, str):
        raise ConfigError("replica id is required (--id or replica_id)")
    replicas: list[ReplicaAddress] = [parse_replica(v) for v in args.replica]
    if not replicas:
        for i, table in enumerate(doc.get("replicas", [])):
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
    join = bool(args.join if args.join is not None else doc.get("join", False))
    restore = args.restore or doc.get("restore", "")
    if not isinstance(restore, str):
        raise ConfigError("restore must be a file name")
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


def _raft_password(args: argparse.Namespace, doc: dict[str, Any], environ: dict[str, str]) -> str:
    """The Raft password, from its file or the environment, strong enough."""
    password = environ.get("SYNAPSE_RAFT_PASSWORD", "")
    password_file = args.raft_password_file or doc.get("raft_password_file", "")
    if password_file:
        try:
            with open(password_file, encoding="utf-8") as pw:
                password = pw.read().strip()
        except OSError as exc:
            raise ConfigError(f"raft password file: {exc}") from None
    if not password:
        raise ConfigError(
            "a Raft password is required (--raft-password-file or SYNAPSE_RAFT_PASSWORD): "
            "it encrypts the replicas' traffic"
        )
    weak = raft_password_problem(password)
    if weak is not None:
        raise ConfigError(weak)
    return password


def _timeouts(args: argparse.Namespace, doc: dict[str, Any]) -> Timeouts:
    """The self-fencing timeouts (flags over ``[timeouts]``), safe together."""
    t_doc = doc.get("timeouts", {})
    defaults = Timeouts()

    def pick(flag: str | None, key: str, default_ms: int) -> int:
        raw = flag if flag is not None else t_doc.get(key)
        return default_ms if raw is None else duration_ms(raw, key)

    timeouts = replace(
        defaults,
        heartbeat_interval_ms=pick(
            args.heartbeat_interval, "heartbeat_interval", defaults.heartbeat_interval_ms
        ),
        lease_ttl_ms=pick(args.lease_ttl, "lease_ttl", defaults.lease_ttl_ms),
        leader_step_down_ms=pick(
            args.leader_step_down, "leader_step_down", defaults.leader_step_down_ms
        ),
        dead_timeout_ms=pick(args.dead_timeout, "dead_timeout", defaults.dead_timeout_ms),
    )
    problems = check_timeouts(timeouts)
    if problems:
        raise ConfigError("unsafe timeouts: " + "; ".join(v.rule for v in problems))
    return timeouts


def _locality_wait(args: argparse.Namespace, doc: dict[str, Any]) -> int:
    s_doc = doc.get("scheduling", {})
    raw_wait = args.locality_wait if args.locality_wait is not None else s_doc.get("locality_wait")
    locality_wait_ms = (
        LOCALITY_WAIT_MS if raw_wait is None else duration_ms(raw_wait, "locality_wait")
    )
    if locality_wait_ms > MAX_LOCALITY_WAIT_MS:
        raise ConfigError(f"locality_wait must be at most {MAX_LOCALITY_WAIT_MS // 3_600_000}h")
    return locality_wait_ms


def _raft(
    args: argparse.Namespace, doc: dict[str, Any], timeouts: Timeouts
) -> tuple[RaftTiming, bool | None, bool]:
    """``[raft]``: election and compaction timing, the compact state and fsync."""
    r_doc = doc.get("raft", {})
    timing = RaftTiming()
    election_min = args.election_min or r_doc.get("election_min")
    election_max = args.election_max or r_doc.get("election_max")
    timing = replace(
        timing,
        election_min_s=duration_ms(election_min, "election_min") / 1000
        if election_min
        else timing.election_min_s,
        election_max_s=duration_ms(election_max, "election_max") / 1000
        if election_max
        else timing.election_max_s,
        leader_step_down_s=timeouts.leader_step_down_ms / 1000,
    )
    compaction = args.compaction_entries or r_doc.get("compaction_entries")
    if compaction is not None:
        if not isinstance(compaction, int) or compaction < 10:
            raise ConfigError("compaction_entries must be an integer >= 10")
        timing = replace(timing, log_compaction_min_entries=compaction)
    compact_state = args.compact_state
    if compact_state is None:
        compact_state = r_doc.get("compact_state")
    if compact_state is not None and not isinstance(compact_state, bool):
        raise ConfigError(f"raft.compact_state must be true or false, got {compact_state!r}")
    raft_fsync = args.raft_fsync if args.raft_fsync is not None else r_doc.get("fsync")
    raft_fsync = RAFT_FSYNC_DEFAULT if raft_fsync is None else raft_fsync
    if not isinstance(raft_fsync, bool):
        raise ConfigError(f"raft.fsync must be true or false, got {raft_fsync!r}")
    if timing.election_max_s <= timing.election_min_s:
        raise ConfigError("election_max must exceed election_min")
    if timing.election_min_s <= 3 * timing.append_entries_period_s:
        raise ConfigError(f"election_min must exceed {3 * timing.append_entries_period_s}s")
    if timing.leader_step_down_s <= timing.append_entries_period_s:
        raise ConfigError("leader_step_down is too short")
    return timing, compact_state, raft_fsync


def _reads(args: argparse.Namespace, doc: dict[str, Any]) -> tuple[int, float]:
    """``[reads]``: how many heavy reads at once, and their CPU share."""
    reads = doc.get("reads", {})
    heavy_reads = (
        args.heavy_reads if args.heavy_reads is not None else reads.get("heavy_concurrency", 2)
    )
    if (
        isinstance(heavy_reads, bool)
        or not isinstance(heavy_reads, int)
        or not 1 <= heavy_reads <= 64
    ):
        raise ConfigError(f"heavy reads at once must be an integer in 1..64, got {heavy_reads!r}")
    share = args.heavy_read_cpu_share
    if share is None:
        share = reads.get("heavy_cpu_share", 0.3)
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
        raise ConfigError(f"heavy read CPU share must be in (0, 1], got {share!r}")
    return heavy_reads, float(share)


def _bootstrap_token(args: argparse.Namespace, doc: dict[str, Any]) -> str:
    """The first admin's token from its file ("" without one)."""
    bootstrap_token = ""
    token_file = args.bootstrap_token_file or doc.get("bootstrap_token_file", "")
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as token_text:
                bootstrap_token = token_text.read().strip()
        except OSError as exc:
            raise ConfigError(f"bootstrap token file: {exc}") from None
        if split_token(bootstrap_token) is None:
            raise ConfigError(
                f"bootstrap token file {token_file}: not a token (syn_<12 hex>_<secret>)"
            )
    return bootstrap_token


def _history(args: argparse.Namespace, doc: dict[str, Any]) -> tuple[bool, int]:
    """``[history]``: kept or not, and the event ring's size."""
    h_doc = doc.get("history", {})
    history = not args.no_history if args.no_history is not None else h_doc.get("enabled", True)
    event_ring = args.event_ring if args.event_ring is not None else h_doc.get("event_ring")
    event_ring = DEFAULT_CAPACITY if event_ring is None else event_ring
    if not isinstance(history, bool):
        raise ConfigError(f"history.enabled must be true or false, got {history!r}")
    if isinstance(event_ring, bool) or not isinstance(event_ring, int) or event_ring < 1:
        raise ConfigError(f"event_ring must be a positive integer, got {event_ring!r}")
    return history, event_ring


def _service_addresses(args: argparse.Namespace, doc: dict[str, Any]) -> tuple[str, str]:
    """Where the metrics and dashboard, and the heartbeat streams, listen ("": nowhere)."""
    metrics_address = args.metrics_address or doc.get("metrics", {}).get("address", "")
    if metrics_address:
        try:
            parse_address(str(metrics_address), "metrics address")
        except AddressError as exc:
            raise ConfigError(str(exc)) from None
    agent_address = args.agent_address
    if agent_address is None:
        agent_address = doc.get("agent_address", "")
    if agent_address:
        try:
            parse_address(str(agent_address), "agent address")
        except AddressError as exc:
            raise ConfigError(str(exc)) from None
    return str(metrics_address), str(agent_address)


# ------------------------------------------------------- queues and preemption


def _priority_class_flag(text: str) -> dict[str, Any]:
    """``NAME=VALUE[,preempts][,grace=30s]`` as the TOML table it stands for."""
    head, *options = [part.strip() for part in text.split(",")]
    name, sep, value = head.partition("=")
    if not sep:
        raise ConfigError(f"--priority-class {text!r}: expected NAME=VALUE[,preempts][,grace=D]")
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"--priority-class {text!r}: the value must be an integer") from None
    table: dict[str, Any] = {"name": name, "value": number}
    for option in options:
        key, _, raw = option.partition("=")
        if key == "preempts" and not raw:
            table["preempts"] = True
        elif key == "grace" and raw:
            table["grace"] = raw
        else:
            raise ConfigError(f"--priority-class {text!r}: unknown option {option!r}")
    return table


def _scheduling(args: argparse.Namespace, s_doc: dict[str, Any]) -> SchedulingSettings:
    """Priority classes, the preemption mode and the fair-share half-life from flags or
    TOML ``[scheduling]``; each left None (the replicated value stays) when not given.
    The classes are checked by the rule set the state machine applies."""
    tables: list[Any] = [_priority_class_flag(t) for t in args.priority_class]
    if not tables:
        tables = s_doc.get("priority_classes", [])
        if not isinstance(tables, list):
            raise ConfigError("scheduling.priority_classes: expected an array of tables")
    classes: tuple[PriorityClass, ...] | None = None
    if tables:
        built = []
        for i, table in enumerate(tables):
            where = f"scheduling.priority_classes[{i}]"
            if not isinstance(table, dict) or not {"name", "value"} <= set(table):
                raise ConfigError(f"{where}: expected a table with name and value")
            unknown = set(table) - {"name", "value", "preempts", "grace"}
            if unknown:
                raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
            value, preempts = table["value"], table.get("preempts", False)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"{where}.value: expected an integer")
            if not isinstance(preempts, bool) or not isinstance(table["name"], str):
                raise ConfigError(f"{where}: name is a string and preempts true or false")
            grace = (
                duration_ms(table["grace"], f"{where}.grace")
                if "grace" in table
                else DEFAULT_GRACE_MS
            )
            built.append(PriorityClass(table["name"], value, preempts, grace))
        problems = check_priority_classes(built)
        if problems:
            raise ConfigError("; ".join(str(v) for v in problems))
        classes = tuple(built)
    raw_mode = args.preemption or s_doc.get("preemption")
    mode = None
    if raw_mode is not None:
        try:
            mode = PreemptionMode(str(raw_mode))
        except ValueError:
            allowed = ", ".join(m.value for m in PreemptionMode)
            raise ConfigError(f"preemption must be one of {allowed}, got {raw_mode!r}") from None
    raw_life = args.fair_share_half_life or s_doc.get("fair_share_half_life")
    half_life = None if raw_life is None else duration_ms(raw_life, "fair_share_half_life")
    if half_life is not None and half_life <= 0:
        raise ConfigError("fair_share_half_life must be positive")
    raw_requeues = args.max_requeues
    if raw_requeues is None:
        raw_requeues = s_doc.get("max_requeues")
    if raw_requeues is not None and (
        not isinstance(raw_requeues, int)
        or isinstance(raw_requeues, bool)
        or not 0 <= raw_requeues <= MAX_REQUEUES_LIMIT
    ):
        raise ConfigError(f"max_requeues must be an integer from 0 to {MAX_REQUEUES_LIMIT}")
    raw_start = args.start_timeout or s_doc.get("start_timeout")
    start_timeout = None if raw_start is None else duration_ms(raw_start, "start_timeout")
    if start_timeout is not None and not (
        MIN_START_TIMEOUT_MS <= start_timeout <= MAX_START_TIMEOUT_MS
    ):
        raise ConfigError(
            f"start_timeout must be from {MIN_START_TIMEOUT_MS // 1000}s to "
            f"{MAX_START_TIMEOUT_MS // 3_600_000}h, got {raw_start!r}"
        )
    return SchedulingSettings(
        classes, mode, half_life, raw_requeues, start_timeout_ms=start_timeout
    )


def _limits(l_doc: dict[str, Any]) -> tuple[tuple[str, int], ...]:
    """The limits TOML ``[limits]`` sets (DESIGN §8; the others stay as replicated),
    checked by the rule set the state machine applies."""
    known = {f.name for f in dataclasses.fields(Limits)}
    unknown = sorted(set(l_doc) - known)
    if unknown:
        raise ConfigError(
            f"limits.{unknown[0]}: no such limit (limits: {', '.join(sorted(known))})"
        )
    for name, value in l_doc.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"limits.{name}: must be a whole number, got {value!r}")
    problems = check_limits(dataclasses.replace(Limits(), **l_doc))
    if problems:
        raise ConfigError("; ".join(str(v) for v in problems))
    return tuple(sorted(l_doc.items()))


def _check_writable(path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, ".write-probe")
        with open(probe, "w", encoding="utf-8") as f:
            f.write("ok")
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"data directory {path!r} is not writable: {exc}") from None


# ------------------------------------------------------------------------ running


def tune_gc(collect: bool = True) -> None:
    """Keep the cyclic garbage collector's pauses short on a large state.

    The replicated state of a big cluster is millions of long-lived objects; a full
    collection walks all of them and, landing inside the apply lock or a heartbeat, stalls
    it for a hundred milliseconds and more. Objects alive now (the state loaded from the
    snapshot and the journal) are moved out of the collector's view, and the youngest
    generation is collected less often. Called at start (``collect``: a collection first,
    over what the imports left) and once the replica has caught up, without one: that
    collection would walk the whole state just loaded (0.25 s at 40,000 jobs, holding the
    interpreter as the replica starts to serve) and find nothing, since decoding and
    applying make no reference cycles.
    """
    if collect:
        gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


class SteadyClock:
    """Wall-clock milliseconds that a step of the system clock does not move.

    The reading is the wall clock when the process started plus the monotonic time since.
    Everything the leader measures with it (silence before a dead declaration, start
    timeouts, time limits, back-offs, retention) is therefore a real elapsed duration: a
    clock stepped forward or back while the replica runs changes nothing until the replica
    restarts. The monotonic clock is slewed by NTP like the wall clock, so its rate stays
    true; only steps are left out. Timestamps written into replicated commands come from
    the proposing leader's reading: across a leader change they can differ by the skew
    between the two machines' clocks when their replicas started (docs/chaos.md, "Clocks").
    """

    def __init__(
        self,
        wall_ns: Callable[[], int] = time.time_ns,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._monotonic_ns = monotonic_ns
        self._start_monotonic_ns = monotonic_ns()
        self._start_wall_ns = wall_ns()

    def __call__(self) -> int:
        elapsed = self._monotonic_ns() - self._start_monotonic_ns
        return (self._start_wall_ns + elapsed) // 1_000_000


_now_ms = SteadyClock()


class Replica:
    """Wires the Raft replica, the leader loop and the gRPC server together."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.stopping = threading.Event()
        self._wake = threading.Event()
        self._roles: queue.SimpleQueue[tuple[bool, int, int]] = queue.SimpleQueue()
        self.liveness = Liveness()
        self.transport = Transport(config.tls)
        self.nudger = WorkerNudger(
            channel_factory=self.transport.channel, credentials_version=self.transport.version
        )
        # Workers with a heartbeat stream get pushes on it; the others nudges.
        self.stream_nudger = StreamFirstNudger(None, self.nudger)
        self._bootstrap_proposed_at = 0.0
        self._bootstrapped = False
        me = config.me
        # A restored replica starts a new cluster alone; the others join it one by one.
        partners = [me] if config.restore else list(config.replicas)
        self.history: HistoryRecorder | None = None
        if config.history:
            store = HistoryStore(os.path.join(config.data_dir, HISTORY_FILE))
            self.history = HistoryRecorder(store, EventRing(config.event_ring))
        self.raft = RaftReplica(
            me.raft,
            [r.raft for r in partners],
            config.data_dir,
            config.raft_password,
            secure=config.tls is not None,
            timing=config.timing,
            on_role_change=self._role_changed,
            on_applied=self._wake.set,
            directory={r.raft: (r.replica_id, r.grpc) for r in config.replicas},
            join=config.join,
            observer=self.history,
            fsync=config.raft_fsync,
        )
        self.metrics = ReplicaMetrics(
            config.replica_id, self.raft, last_plan=lambda: self.loop.last_plan
        )
        self.loop = LeaderLoop(
            self.raft,
            self.metrics.proposer(self.raft),
            self.liveness,
            config.replica_id,
            settings=LoopSettings(),
            rng=random.Random(),
            desired_timeouts=config.timeouts,
            desired_locality_wait_ms=config.locality_wait_ms,
            desired_scheduling=config.scheduling,
            nudger=self.stream_nudger,
            wake=self._wake.set,
        )
        self.context = ReplicaContext(
            self_id=config.replica_id,
            replicas=MemberDirectory(self.raft, me),
            backend=self.raft,
            liveness=self.liveness,
            serving=lambda: self.loop.ready and self.raft.leads_with_quorum(),
            clock_ms=_now_ms,
            last_plan=lambda: self.loop.last_plan,
            read_gate=ReadGate(
                concurrency=config.heavy_reads, cpu_share=config.heavy_read_cpu_share
            ),
            peer_channel=self.transport.channel,
            grant_signer=self._sign_grant if config.tls is not None else None,
            membership=self.raft,
            history=self.history.store if self.history else None,
            events=self.history.ring if self.history else None,
            pinned_limits=config.scheduling.pinned_limits,
        )
        auth = None
        if config.tls is not None:
            auth = AuthInterceptor(
                lambda: self.raft.snapshot().tokens, _now_ms, identify_peer=peer_identity
            )
        self.server = build_server(
            self.context, me.grpc, auth=auth, add_port=self.transport.add_port
        )
        self.streams: StreamServer | None = None
        if config.agent_address:
            assert self.context.auth is not None  # set by build_server
            self.streams = StreamServer(
                self.context, config.agent_address, self.context.auth, self.transport.add_port
            )
            self.stream_nudger.streams = self.streams
        self._driver = threading.Thread(target=self._drive, name="leader-loop", daemon=True)
        self.observe: ObserveServer | None = None
        if config.metrics_address:
            others = [r.grpc for r in config.replicas if r.replica_id != config.replica_id]
            self.dashboard = Dashboard([me.grpc, *others], self.transport, clock_ms=_now_ms)
            self.observe = ObserveServer(
                config.metrics_address, self.metrics.registry, config.tls, app=self.dashboard
            )
            self.context.metrics_url = self.observe.metrics_url
            self.context.dashboard_url = self.observe.url + "/"

    def _sign_grant(self, job_id: str, subject: str, node_id: str) -> tuple[str, int]:
        """A log grant for ``subject`` to read ``job_id``'s member logs on ``node_id``,
        signed with this replica's key (read afresh: certificates rotate)."""
        material = self.transport.material()
        if material is None:
            raise RuntimeError("log grants need TLS material")
        expires_at_s = time.time() + GRANT_TTL_S
        claims = GrantClaims(
            job_id=job_id, subject=subject, expires_at_s=expires_at_s, node_id=node_id
        )
        grant = sign_grant(claims, key_pem=material.key, cert_pem=material.cert)
        return grant, int(expires_at_s * 1000)

    def _bootstrap_admin(self) -> None:
        """As the serving leader, replicate the bootstrap admin token's hash once: only
        if the cluster has never had that token (a revoked one stays revoked)."""
        parsed = split_token(self.config.bootstrap_token)
        if parsed is None or self._bootstrapped:
            return
        if not self.loop.ready or not self.raft.is_leader():
            return  # followers never look: no snapshot on every loop tick
        token_id, secret = parsed
        if token_id in self.raft.snapshot().tokens:
            self._bootstrapped = True  # replicated (and maybe revoked since): never again
            return
        now = time.monotonic()
        if now - self._bootstrap_proposed_at < 1.0:
            return
        self._bootstrap_proposed_at = now
        self.raft.propose(
            cmd.CreateToken(
                token_id=token_id,
                user=BOOTSTRAP_ADMIN,
                role=Role.ADMIN,
                secret_sha256=token_hash(secret),
                queues=(),
                expires_at_ms=0,
                now_ms=_now_ms(),
                actor="bootstrap",
            )
        )
        log.info("replicating the bootstrap admin token %s (user %s)", token_id, BOOTSTRAP_ADMIN)

    def _role_changed(self, is_leader: bool, term: int) -> None:
        self._roles.put((is_leader, term, _now_ms()))
        self._wake.set()

    def start(self) -> None:
        self.server.start()
        if self.streams is not None:
            self.streams.start()
            host = self.streams.address.rpartition(":")[0]
            if host in ("0.0.0.0", "::", "[::]"):
                host = self.config.me.grpc.rpartition(":")[0]
            self.context.stream_address = f"{host}:{self.streams.port}"
            log.info("heartbeat streams at %s", self.context.stream_address)
        if self.observe is not None:
            self.observe.start()
            log.info("metrics at %s, dashboard at %s/", self.observe.metrics_url, self.observe.url)
        self._driver.start()
        log.info(
            "replica %s started: raft %s, grpc %s, data %s",
            self.config.replica_id,
            self.config.me.raft,
            self.config.me.grpc,
            self.config.data_dir,
        )

    def _drive(self) -> None:
        said_ready = False
        last = ""
        # Each round (a short wait, then a step), the wall time this process neither slept
        # on purpose nor spent on a CPU is time it did not run (stopped, starved): the
        # leader was not reading heartbeats then (LeaderLoop.note_not_running). A long
        # scheduling pass uses CPU, so it is not mistaken for one.
        round_wall, round_cpu = time.monotonic(), time.process_time()
        while not self.stopping.is_set():
            due_ms = self.loop.next_step_in_ms(_now_ms())
            timeout_s = 0.05 if due_ms is None else min(0.05, due_ms / 1000)
            self._wake.wait(timeout_s)
            self._wake.clear()
            wall, cpu = time.monotonic(), time.process_time()
            stalled_ms = int(((wall - round_wall) - (cpu - round_cpu) - timeout_s) * 1000)
            round_wall, round_cpu = wall, cpu
            try:
                if stalled_ms >= STALL_MS:
                    self.loop.note_not_running(stalled_ms, _now_ms())
                while True:
                    try:
                        is_leader, term, at = self._roles.get_nowait()
                    except queue.Empty:
                        break
                    self.loop.on_role_change(is_leader, term, at)
                    log.info("%s leadership in term %d", "gained" if is_leader else "lost", term)
                # No note_state_changed() here: the loop plans when a command was applied
                # since its last pass (and every schedule_period_ms), not on every wake.
                self.metrics.note_leader(self.raft.leader_address())
                step_started = time.perf_counter()
                sentence = self.loop.step(_now_ms())
                self.metrics.observe_step(self.loop.last_plan, time.perf_counter() - step_started)
                self._bootstrap_admin()
                for notable in self.loop.take_notable():
                    log.info("%s", notable)
                if sentence != last:
                    log.debug("%s", sentence)
                last = sentence
                if not said_ready:
                    status = self.raft.status()
                    if status.ready and status.leader and status.has_quorum:
                        leader = self.context.by_raft(status.leader)
                        log.info(
                            "ready: joined the quorum as %s in term %d; leader is %s",
                            status.role,
                            status.term,
                            leader.replica_id if leader else status.leader,
                        )
                        said_ready = True
                        tune_gc(collect=False)
            except Exception:
                log.exception("leader loop step failed")

    def stop(self) -> None:
        self.stopping.set()
        self._wake.set()
        if self.streams is not None:
            self.streams.stop()
        self.server.stop(grace=1.0).wait(2.0)
        self._driver.join(timeout=2.0)
        if self.observe is not None:
            self.observe.stop()
            self.dashboard.close()
        self.nudger.close()
        self.raft.stop()
        if self.history is not None:
            self.history.close()
        log.info("replica %s stopped", self.config.replica_id)


# ------------------------------------------------- membership and backup


class MemberDirectory(Sequence[ReplicaAddress]):
    """The replicas as the Raft membership has them at each read (members added or
    removed online included), this replica always among them: what GetClusterStatus
    lists and NOT_LEADER points to."""

    def __init__(self, raft: RaftReplica, me: ReplicaAddress) -> None:
        self._raft = raft
        self._me = me

    def _current(self) -> list[ReplicaAddress]:
        out = [
            ReplicaAddress(replica_id=m.replica_id, raft=m.raft, grpc=m.grpc)
            for m in self._raft.member_addresses()
        ]
        if not any(r.raft == self._me.raft for r in out):
            out.append(self._me)
        return [self._me if r.raft == self._me.raft else r for r in out]

    @overload
    def __getitem__(self, index: int) -> ReplicaAddress: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[ReplicaAddress]: ...
    def __getitem__(self, index: int | slice) -> ReplicaAddress | Sequence[ReplicaAddress]:
        return self._current()[index]

    def __len__(self) -> int:
        return len(self._current())

    def __iter__(self) -> Iterator[ReplicaAddress]:
        return iter(self._current())


def restore_into(config: SchedulerConfig) -> str:
    """Seed an empty data directory from the backup ``config.restore``; return a line
    for the log. Raises :class:`ConfigError` for a corrupt backup or a used directory."""
    try:
        with open(config.restore, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ConfigError(f"--restore {config.restore}: {exc}") from None
    try:
        backup = decode_backup(data)
    except BackupError as exc:
        raise ConfigError(f"--restore {config.restore}: {exc}") from None
    me = config.me
    try:
        seed_restored_state(
            config.data_dir,
            backup.state,
            backup.header.raft_index,
            SnapshotMember(raft=me.raft, replica_id=me.replica_id, grpc=me.grpc),
        )
    except RestoreError as exc:
        raise ConfigError(f"--restore {config.restore}: {exc}") from None
    return (
        f"restored {config.restore}: raft index {backup.header.raft_index} of replica "
        f"{backup.header.replica_id}, {len(backup.state.jobs)} jobs, "
        f"{len(backup.state.nodes)} nodes; starting a new cluster with this replica alone"
    )


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = load_config(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"synapse-scheduler: {exc}", file=sys.stderr)
        return 2
    logging.getLogger().setLevel(config.log_level)
    if config.tls is None:
        log.warning("%s", INSECURE_WARNING)
    if config.restore:
        try:
            log.info("%s", restore_into(config))
        except ConfigError as exc:
            print(f"synapse-scheduler: {exc}", file=sys.stderr)
            return 2
    tune_gc()
    replica = Replica(config)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        log.info("received %s; stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    replica.start()
    while not stop.wait(1.0):
        pass
    replica.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
