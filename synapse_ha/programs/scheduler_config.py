"""The configuration of ``synapse-scheduler``: its flags and TOML file (flags win),
checked whole before the replica starts (:func:`load_config`)::

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
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from synapse_ha.core.access import split_token
from synapse_ha.core.admission import check_limits
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
from synapse_ha.history.events import DEFAULT_CAPACITY
from synapse_ha.leader.loop import SchedulingSettings
from synapse_ha.observe.http import AddressError, parse_address
from synapse_ha.programs.config_file import (
    ConfigError,
    address,
    check_file_types,
    duration_ms,
    read_toml,
)
from synapse_ha.raft.channel import data_dir_mode_problem, raft_password_problem
from synapse_ha.raft.replica import RaftTiming
from synapse_ha.rpc.server import ReplicaAddress
from synapse_ha.security.tls import TlsError, TlsFiles, add_tls_flags, tls_from

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
