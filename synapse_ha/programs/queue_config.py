"""``synapse-scheduler``'s settings of queues, preemption and limits: its flags and TOML
``[scheduling]``, ``[[scheduling.priority_classes]]`` and ``[limits]``. Besides the
locality wait, these are replicated settings this replica puts back when it leads
(:class:`SchedulingSettings`); each left None keeps the replicated value. They are checked
by the rule sets the state machine applies."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from synapse_ha.core.cluster_config import (
    DEFAULT_GRACE_MS,
    DEFAULT_TOPOLOGY_LEVELS,
    LOCALITY_WAIT_MS,
    MAX_LOCALITY_WAIT_MS,
    MAX_RECLAIM_WAIT_MS,
    MAX_REQUEUES_LIMIT,
    MAX_SPARES,
    MAX_START_TIMEOUT_MS,
    MIN_START_TIMEOUT_MS,
    ClusterConfig,
    Limits,
    PreemptionMode,
    PriorityClass,
)
from synapse_ha.core.identity.admission import check_limits
from synapse_ha.core.spec.validation import check_priority_classes
from synapse_ha.core.topology import CLUSTER
from synapse_ha.leader.scheduling import SchedulingSettings
from synapse_ha.programs.config_file import ConfigError, duration_ms
from synapse_ha.programs.settings import Inputs, Setting, setting, switch


def _locality_wait_ms(raw: object) -> int:
    wait_ms = duration_ms(raw, "locality_wait")
    if wait_ms > MAX_LOCALITY_WAIT_MS:
        raise ConfigError(f"locality_wait must be at most {MAX_LOCALITY_WAIT_MS // 3_600_000}h")
    return wait_ms


def _preemption(raw: object) -> PreemptionMode:
    try:
        return PreemptionMode(str(raw))
    except ValueError:
        allowed = ", ".join(m.value for m in PreemptionMode)
        raise ConfigError(f"preemption must be one of {allowed}, got {raw!r}") from None


def _half_life_ms(raw: object) -> int:
    half_life = duration_ms(raw, "fair_share_half_life")
    if half_life <= 0:
        raise ConfigError("fair_share_half_life must be positive")
    return half_life


def _max_requeues(raw: object) -> int:
    if not isinstance(raw, int) or isinstance(raw, bool) or not 0 <= raw <= MAX_REQUEUES_LIMIT:
        raise ConfigError(f"max_requeues must be an integer from 0 to {MAX_REQUEUES_LIMIT}")
    return raw


# A job's rendezvous port and its step port (10,000 above) must both be valid ports.
MASTER_PORT_SPAN = ClusterConfig().master_port_span
MAX_MASTER_PORT_BASE = 65_535 - 10_000 - MASTER_PORT_SPAN + 1


def _master_port_base(raw: object) -> int:
    if not isinstance(raw, int) or isinstance(raw, bool) or not 1024 <= raw <= MAX_MASTER_PORT_BASE:
        raise ConfigError(
            f"master_port_base must be an integer from 1024 to {MAX_MASTER_PORT_BASE} "
            f"(jobs' ports are the {MASTER_PORT_SPAN} from it, and those 10000 above)"
        )
    return raw


def _start_timeout_ms(raw: object) -> int:
    start_timeout = duration_ms(raw, "start_timeout")
    if not MIN_START_TIMEOUT_MS <= start_timeout <= MAX_START_TIMEOUT_MS:
        raise ConfigError(
            f"start_timeout must be from {MIN_START_TIMEOUT_MS // 1000}s to "
            f"{MAX_START_TIMEOUT_MS // 3_600_000}h, got {raw!r}"
        )
    return start_timeout


def _count(name: str, largest: int) -> Callable[[object], int]:
    def check(raw: object) -> int:
        if not isinstance(raw, int) or isinstance(raw, bool) or not 0 <= raw <= largest:
            raise ConfigError(f"{name} must be an integer from 0 to {largest}")
        return raw

    return check


def _count_setting(name: str, largest: int, help: str) -> Setting:
    """The setting ``scheduling.<name>`` (flag ``--<name>`` with dashes): an integer from
    0 to ``largest``."""
    flag = f"--{name.replace('_', '-')}"
    return setting(flag, f"scheduling.{name}", check=_count(name, largest), type=int, help=help)


def _unfit_backoff_ms(raw: object) -> int:
    backoff = duration_ms(raw, "unfit_backoff")
    if not 0 <= backoff <= MAX_UNFIT_BACKOFF_MS:
        raise ConfigError(f"unfit_backoff must be from 0s to 7d, got {raw!r}")
    return backoff


MAX_UNFIT_BACKOFF_MS = 7 * 86_400_000


def _reclaim_wait_max_ms(raw: object) -> int:
    wait = duration_ms(raw, "reclaim_wait_max")
    if not 0 <= wait <= MAX_RECLAIM_WAIT_MS:
        raise ConfigError(f"reclaim_wait_max must be from 0s to 24h, got {raw!r}")
    return wait


def _spare_level(raw: object) -> str:
    allowed = (*DEFAULT_TOPOLOGY_LEVELS, CLUSTER)
    if raw not in allowed:
        raise ConfigError(f"spare_level must be one of {', '.join(allowed)}, got {raw!r}")
    return str(raw)


LOCALITY_WAIT = setting(
    "--locality-wait",
    "scheduling.locality_wait",
    default=LOCALITY_WAIT_MS,
    check=_locality_wait_ms,
    help="how long a gang that fits in one rack waits for one before spreading "
    "across racks (e.g. 10m, the default; 0s turns it off)",
)
# Queues and preemption; TOML [scheduling] and [[scheduling.priority_classes]].
PRIORITY_CLASS = setting(
    "--priority-class",
    "scheduling.priority_classes",
    action="append",
    flag_default=[],
    metavar="NAME=VALUE[,preempts][,grace=30s][,min-runtime=2h]",
    help="a priority class (repeatable; replaces the built-in low, normal, high)",
)
PREEMPTION = setting(
    "--preemption",
    "scheduling.preemption",
    merge="truthy",
    check=_preemption,
    help="topology (the default), blind or off",
)
FAIR_SHARE_HALF_LIFE = setting(
    "--fair-share-half-life",
    "scheduling.fair_share_half_life",
    merge="truthy",
    check=_half_life_ms,
    help="decay of past usage in fair share (7d)",
)
MAX_REQUEUES = setting(
    "--max-requeues",
    "scheduling.max_requeues",
    check=_max_requeues,
    type=int,
    help="how often a job may be requeued by disruptions it did not cause before it "
    "fails (default 5)",
)
START_TIMEOUT = setting(
    "--start-timeout",
    "scheduling.start_timeout",
    merge="truthy",
    check=_start_timeout_ms,
    help="how long after its bind a gang's members may take to report running before "
    "the attempt fails: allow for the largest image pull (default 60s; 1s to 24h)",
)
RECLAIM_WAIT_MAX = setting(
    "--reclaim-wait-max",
    "scheduling.reclaim_wait_max",
    merge="truthy",
    check=_reclaim_wait_max_ms,
    help="how long a gang reclaiming its queue's nominal quota waits before it may preempt "
    "gangs within their minimum run time (replicated; default 10m)",
)
MASTER_PORT_BASE = setting(
    "--master-port-base",
    "scheduling.master_port_base",
    check=_master_port_base,
    type=int,
    help="the first of the ports jobs' rank 0 members listen on (MASTER_PORT; sbatch jobs' "
    "step ports are 10000 above): keep the range free on every node (replicated; "
    "default 29500)",
)
# Node health and fitness (DESIGN §4).
GPU_DRAIN_THRESHOLD = _count_setting(
    "gpu_drain_threshold",
    1024,
    "drain a node once this many of its GPUs are unhealthy (default 0: never)",
)
UNFIT_BACKOFF = setting(
    "--unfit-backoff",
    "scheduling.unfit_backoff",
    merge="truthy",
    check=_unfit_backoff_ms,
    help="how long a node that could not start an owner's member skips that owner's "
    "gangs (default 10m)",
)
CORDON_AFTER_START_FAILURES = _count_setting(
    "cordon_after_start_failures",
    1000,
    "cordon a node after this many members in a row it could not start (default 3; 0: never)",
)
# Hot spares (docs/spares.md).
SPARES = _count_setting(
    "spares",
    MAX_SPARES,
    "keep this many idle nodes of each rack (see --spare-level) out of normal placement, "
    "for member replacements (replicated; applied once every replica reads format 14; "
    "default 0)",
)
# Defragmentation (docs/queues.md).
DEFRAG_SHARE_PCT = _count_setting(
    "defrag_share_pct",
    100,
    "hold at most this percentage of the schedulable nodes draining for gangs of starved "
    "queues whose free GPUs are scattered (replicated; applied once every replica reads "
    "format 17; default 0: never)",
)
SPARE_LEVEL = setting(
    "--spare-level",
    "scheduling.spare_level",
    merge="truthy",
    check=_spare_level,
    help="the topology level whose domains each keep --spares spares: zone, block, rack or "
    "cluster (default: rack)",
)


HOLD_UNTIL_STOPPED = switch(
    "scheduling.hold_until_stopped",
    "keep an ended gang's GPUs reserved until each member is confirmed stopped or "
    "its node declared dead (replicated; applied once every replica reads format 3). "
    "Left as replicated when not given",
)
CLEAR_GPU_FAULTS_ON_REBOOT = switch(
    "scheduling.clear_gpu_faults_on_reboot",
    "a node whose worker registers from a new boot has its GPU faults cleared "
    "(replicated; applied once every replica reads format 3). Left as replicated when not given",
)
RELAY_HEARTBEATS = switch(
    "scheduling.relay_heartbeats",
    "followers terminate workers' heartbeat streams and forward them to the leader "
    "in batches, spreading the workers over the replicas (replicated; applied once every "
    "replica reads format 8). Left as replicated when not given",
)
SCHEDULING = (
    LOCALITY_WAIT,
    PRIORITY_CLASS,
    PREEMPTION,
    FAIR_SHARE_HALF_LIFE,
    MAX_REQUEUES,
    START_TIMEOUT,
    RECLAIM_WAIT_MAX,
    MASTER_PORT_BASE,
    GPU_DRAIN_THRESHOLD,
    UNFIT_BACKOFF,
    CORDON_AFTER_START_FAILURES,
    SPARES,
    SPARE_LEVEL,
    DEFRAG_SHARE_PCT,
    HOLD_UNTIL_STOPPED,
    CLEAR_GPU_FAULTS_ON_REBOOT,
    RELAY_HEARTBEATS,
)


def scheduling_settings(inputs: Inputs) -> SchedulingSettings:
    """Priority classes, the preemption mode, the fair-share half-life, the requeues and
    the start timeout from flags or TOML ``[scheduling]``, and the limits of ``[limits]``."""
    return SchedulingSettings(
        _priority_classes(inputs),
        inputs.value(PREEMPTION),
        inputs.value(FAIR_SHARE_HALF_LIFE),
        inputs.value(MAX_REQUEUES),
        start_timeout_ms=inputs.value(START_TIMEOUT),
        limits=_limits(inputs.file.get("limits", {})),
        gpu_drain_threshold=inputs.value(GPU_DRAIN_THRESHOLD),
        unfit_backoff_ms=inputs.value(UNFIT_BACKOFF),
        cordon_after_start_failures=inputs.value(CORDON_AFTER_START_FAILURES),
        hold_until_stopped=inputs.value(HOLD_UNTIL_STOPPED),
        clear_gpu_faults_on_reboot=inputs.value(CLEAR_GPU_FAULTS_ON_REBOOT),
        reclaim_wait_max_ms=inputs.value(RECLAIM_WAIT_MAX),
        relay_heartbeats=inputs.value(RELAY_HEARTBEATS),
        master_port_base=inputs.value(MASTER_PORT_BASE),
        spares=inputs.value(SPARES),
        spare_level=inputs.value(SPARE_LEVEL),
        defrag_share_pct=inputs.value(DEFRAG_SHARE_PCT),
    )


def _priority_class_flag(text: str) -> dict[str, Any]:
    """``NAME=VALUE[,preempts][,grace=30s][,min-runtime=2h]`` as the TOML table it
    stands for."""
    head, *options = [part.strip() for part in text.split(",")]
    name, sep, value = head.partition("=")
    if not sep:
        raise ConfigError(
            f"--priority-class {text!r}: expected NAME=VALUE[,preempts][,grace=D][,min-runtime=D]"
        )
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
        elif key == "min-runtime" and raw:
            table["min_runtime"] = raw
        else:
            raise ConfigError(f"--priority-class {text!r}: unknown option {option!r}")
    return table


def _priority_classes(inputs: Inputs) -> tuple[PriorityClass, ...] | None:
    """The classes of ``--priority-class`` (all of them) or else of the file."""
    tables: list[Any] = [_priority_class_flag(t) for t in inputs.flags.priority_class]
    if not tables:
        in_file = inputs.in_file(PRIORITY_CLASS)
        tables = [] if in_file is None else in_file
        if not isinstance(tables, list):
            raise ConfigError("scheduling.priority_classes: expected an array of tables")
    if not tables:
        return None
    built = [_priority_class(i, table) for i, table in enumerate(tables)]
    problems = check_priority_classes(built)
    if problems:
        raise ConfigError("; ".join(str(v) for v in problems))
    return tuple(built)


def _priority_class(i: int, table: object) -> PriorityClass:
    where = f"scheduling.priority_classes[{i}]"
    if not isinstance(table, dict) or not {"name", "value"} <= set(table):
        raise ConfigError(f"{where}: expected a table with name and value")
    unknown = set(table) - {"name", "value", "preempts", "grace", "min_runtime"}
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
    value, preempts = table["value"], table.get("preempts", False)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{where}.value: expected an integer")
    if not isinstance(preempts, bool) or not isinstance(table["name"], str):
        raise ConfigError(f"{where}: name is a string and preempts true or false")
    grace = duration_ms(table["grace"], f"{where}.grace") if "grace" in table else DEFAULT_GRACE_MS
    least = table.get("min_runtime")
    least_ms = duration_ms(least, f"{where}.min_runtime") if least is not None else 0
    return PriorityClass(table["name"], value, preempts, grace, least_ms)


def _limits(l_doc: dict[str, Any]) -> tuple[tuple[str, int], ...]:
    """The limits TOML ``[limits]`` sets (DESIGN §8; the others stay as replicated)."""
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
