"""The one rule set for job specs and node registrations, and every limit they obey.

Everything that accepts a job spec or a node description calls these checks: the state
machine (so nothing malformed is ever applied, whatever sent the command), the gRPC
server (to refuse a request before it is proposed), the job spec parser and ``synctl``
(which adds the file line). No other module states a rule or a limit of its own.

A check returns every rule broken, in a fixed order (the order of the fields in the
spec), as :class:`Violation` values; an empty list means all is well. A violation is data:
a code, the dotted path of the field and the rule in words, so each edge can render it as
it needs (a gRPC BadRequest, a line in a file, a ``Result`` message).
"""

from __future__ import annotations

import difflib
import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass

from synapse_ha.core.cluster_config import (
    MAX_LOCALITY_WAIT_MS,
    MAX_MIN_RUNTIME_MS,
    MAX_RECLAIM_WAIT_MS,
    MAX_REQUEUES_LIMIT,
    MAX_START_TIMEOUT_MS,
    MIN_START_TIMEOUT_MS,
    ClusterConfig,
    PriorityClass,
    Queue,
    Timeouts,
)
from synapse_ha.core.health.fitness import (
    FAULT_CODE_PATTERN,
    MAX_FAULT_CODE,
    MAX_FAULT_DETAIL,
    GpuFault,
)
from synapse_ha.core.health.prestart import MAX_PRESTART_TIMEOUT_MS, Prestart
from synapse_ha.core.health.progress import SOURCE_LOG as PROGRESS_SOURCE_LOG
from synapse_ha.core.health.progress import SOURCES as PROGRESS_SOURCES
from synapse_ha.core.health.progress import Progress
from synapse_ha.core.identity import access
from synapse_ha.core.model import JobSpec, NodeInfo, Resources
from synapse_ha.core.queues.estimates import estimate_problems
from synapse_ha.core.spec.field_rules import more_problems

# ------------------------------------------------------------------------- limits

NAME_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LEVEL_NAME_PATTERN = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
REQUEST_ID_PATTERN = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
NODE_ID_PATTERN = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,126}[A-Za-z0-9])?$")
# An image reference as the OCI distribution spec writes it (distribution/reference,
# regexp.go): [registry[:port]/]path[:tag][@algorithm:hex]. A path component is lowercase
# alphanumerics joined by ".", "_", "__" or dashes; the registry is a host name (or a
# bracketed IPv6 address) with an optional port. Nothing in it may begin with "-", hold
# white space, or name a transport ("oci-archive:/path", "docker://..."): the runtime
# receives it as one word after its options, as root.
_IMAGE_ALNUM = r"[a-z0-9]+"
_IMAGE_COMPONENT = rf"{_IMAGE_ALNUM}(?:(?:[._]|__|-+){_IMAGE_ALNUM})*"
_IMAGE_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_IMAGE_HOST = rf"(?:{_IMAGE_DOMAIN_PART}(?:\.{_IMAGE_DOMAIN_PART})*|\[[a-fA-F0-9:]+\])"
_IMAGE_NAME = rf"(?:{_IMAGE_HOST}(?::[0-9]+)?/)?{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*"
_IMAGE_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_IMAGE_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_REFERENCE_PATTERN = re.compile(
    rf"(?P<name>{_IMAGE_NAME})(?::{_IMAGE_TAG})?(?:@{_IMAGE_DIGEST})?", re.ASCII
)
MAX_IMAGE_NAME = 255  # the name part, as the distribution spec bounds it
MAX_IMAGE = 1024

MAX_NAME = 63
MAX_REPLICAS = 10_000
MAX_GPUS_PER_NODE = 64  # a member runs on one node, so also the most GPUs per member
MAX_CPU_MILLI = 100_000 * 1000  # 100,000 cores
MAX_MEMORY_MIB = 1024 * 1024 * 1024  # 1 PiB
MAX_PRIORITY = 1_000_000
MAX_TIME_LIMIT_MS = 366 * 24 * 3600 * 1000
MAX_RETRIES = 1000
MAX_BACKOFF_MS = 7 * 24 * 3600 * 1000
MIN_PROGRESS_TIMEOUT_MS = 10 * 1000
MAX_PROGRESS_TIMEOUT_MS = 7 * 24 * 3600 * 1000
MAX_ENV = 1024
MAX_COMMAND_BYTES = 64 * 1024
MAX_PATH = 4096
MAX_ADDRESS = 261  # a 253-character host name, ':' and a port
# A node's members_run_as: "owner", or "agent:" and the agent's account name; "" unsaid.
MEMBERS_RUN_AS_PATTERN = re.compile(r"(owner|agent:[^\s:]{1,64})?")
BOOT_ID_PATTERN = re.compile(r"[A-Za-z0-9-]{0,64}")  # a machine's boot id; "": not said
MEMBER_ISOLATIONS = ("", "pid-namespace", "shared")  # a node's member_isolation

HOST_LEVEL = "host"
MAX_TOKEN_QUEUES = 64
MAX_QUEUE_GPUS = 10_000_000
MAX_PRIORITY_CLASSES = 64
MAX_GRACE_MS = 24 * 3600 * 1000


class ViolationCode(enum.StrEnum):
    """Why a field was refused. Stable: clients may branch on it."""

    REQUIRED = "required"  # the field is absent
    UNKNOWN_FIELD = "unknown_field"  # the field does not exist
    WRONG_TYPE = "wrong_type"  # present, but not of the expected type
    INVALID_FIELD = "invalid_field"  # present and well typed, but breaks a rule


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule: ``field`` is a dotted path such as ``resources.memory`` (``spec``
    for a whole document), ``rule`` says in words what is allowed."""

    code: ViolationCode
    field: str
    rule: str

    def __str__(self) -> str:
        return f"{self.field}: {self.rule}"


def invalid(field: str, rule: str) -> Violation:
    return Violation(ViolationCode.INVALID_FIELD, field, rule)


def describe(violations: Sequence[Violation]) -> str:
    """All violations as one sentence (``field: rule; field: rule``)."""
    return "; ".join(str(v) for v in violations)


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """``did you mean `command`?`` for the choice closest to a misspelt ``word``
    (:func:`difflib.get_close_matches`, its default cutoff), else empty."""
    close = difflib.get_close_matches(word, sorted(choices), n=1)
    return f"did you mean `{close[0]}`?" if close else ""


# ------------------------------------------------------------------------ job specs


def check_job_spec(spec: JobSpec, topology_levels: Sequence[str] | None) -> list[Violation]:
    """Every rule ``spec`` breaks (DESIGN §6), in field order.

    ``topology_levels`` are the cluster's level names (``host`` is always allowed, and may
    be included). ``None`` means they are not known here, as in a client of a cluster whose
    levels are its own configuration: then any well-formed level name passes.
    """
    out: list[Violation] = []
    if not spec.name:
        out.append(Violation(ViolationCode.REQUIRED, "name", "is required"))
    elif len(spec.name) > MAX_NAME or not NAME_PATTERN.match(spec.name):
        out.append(
            invalid(
                "name",
                f"{spec.name!r} must be 1 to {MAX_NAME} characters of a-z, 0-9 and '-', "
                "starting and ending with a letter or digit",
            )
        )
    if not 1 <= spec.replicas <= MAX_REPLICAS:
        out.append(
            invalid("replicas", f"must be between 1 and {MAX_REPLICAS}, got {spec.replicas}")
        )
    out.extend(_check_resources(spec.resources, "resources", per_member=True))
    out.extend(_check_command(spec.command, spec.shell))
    out.extend(_check_env(spec.env))
    out.extend(_check_env_values(spec.env, has_image=bool(spec.image)))
    if (
        len(spec.workdir) > MAX_PATH
        or (spec.workdir and not spec.workdir.startswith("/"))
        or "\x00" in spec.workdir
    ):
        out.append(invalid("workdir", f"must be an absolute path of at most {MAX_PATH} characters"))
    problem = image_reference_problem(spec.image) if spec.image else ""
    if problem:
        out.append(invalid("image", problem))
    if not -MAX_PRIORITY <= spec.priority <= MAX_PRIORITY:
        out.append(invalid("priority", f"must be between -{MAX_PRIORITY} and {MAX_PRIORITY}"))
    for field, level in (
        ("topology.required", spec.topology_required),
        ("topology.preferred", spec.topology_preferred),
    ):
        problem = _check_level(level, topology_levels)
        if problem:
            out.append(invalid(field, problem))
    if not 0 <= spec.time_limit_ms <= MAX_TIME_LIMIT_MS:
        out.append(invalid("time_limit", "must be between 0 (none) and 366d"))
    retries = spec.retries
    if not 0 <= retries.max_retries <= MAX_RETRIES:
        out.append(invalid("retries.max", f"must be between 0 and {MAX_RETRIES}"))
    if not 0 <= retries.backoff_ms <= MAX_BACKOFF_MS:
        out.append(invalid("retries.backoff", "must be between 0 (retry at once) and 7d"))
    elif not retries.backoff_ms <= retries.max_backoff_ms <= MAX_BACKOFF_MS:
        out.append(
            invalid("retries.max_backoff", "must be at least retries.backoff and at most 7d")
        )
    problem = name_problem(spec.queue)
    if problem:
        out.append(invalid("queue", f"{spec.queue!r}: a queue name is {problem}"))
    problem = name_problem(spec.priority_class) if spec.priority_class else ""
    if problem:
        out.append(invalid("priority", f"{spec.priority_class!r}: a class name is {problem}"))
    out.extend(_check_progress(spec.progress, has_image=bool(spec.image)))
    if spec.prestart is not None:
        out.extend(_check_prestart(spec.prestart))
    out.extend(invalid(field, rule) for field, rule in more_problems(spec))
    return out


def _check_progress(progress: Progress | None, *, has_image: bool) -> list[Violation]:
    """``progress:`` (hang detection): a timeout of 10s to 7d, a known source; a job with
    an image reads its progress from its output, since the progress file is the host's
    and is not mounted into its containers."""
    if progress is None:
        return []
    out = []
    if not MIN_PROGRESS_TIMEOUT_MS <= progress.timeout_ms <= MAX_PROGRESS_TIMEOUT_MS:
        out.append(invalid("progress.timeout", "must be between 10s and 7d"))
    if progress.source not in PROGRESS_SOURCES:
        hint = did_you_mean(progress.source, PROGRESS_SOURCES)
        out.append(
            invalid(
                "progress.source",
                f"{progress.source!r} is not a progress source"
                + (f", {hint} (allowed: " if hint else " (allowed: ")
                + f"{', '.join(PROGRESS_SOURCES)})",
            )
        )
    elif has_image and progress.source != PROGRESS_SOURCE_LOG:
        out.append(
            invalid(
                "progress.source",
                "must be log for a job with an image (its containers have no progress file)",
            )
        )
    return out


def _check_prestart(prestart: Prestart) -> list[Violation]:
    out = _check_command(prestart.command, prestart.shell, "prestart.command")
    if not 0 < prestart.timeout_ms <= MAX_PRESTART_TIMEOUT_MS:
        out.append(invalid("prestart.timeout", "must be more than 0 and at most 1h"))
    return out


def check_request_id(request_id: str) -> list[Violation]:
    """A submission's idempotency key; empty means "none given" here (the server makes one)."""
    if request_id and not REQUEST_ID_PATTERN.match(request_id):
        return [
            invalid("request_id", "1 to 128 characters of letters, digits and . _ : - (or empty)")
        ]
    return []


def _check_resources(r: Resources, prefix: str, *, per_member: bool) -> list[Violation]:
    out = []
    unit = " per member" if per_member else ""
    if not 0 <= r.cpu_milli <= MAX_CPU_MILLI:
        out.append(
            invalid(f"{prefix}.cpu", f"must be between 0 and {MAX_CPU_MILLI // 1000} cores{unit}")
        )
    if not 0 <= r.memory_mib <= MAX_MEMORY_MIB:
        out.append(invalid(f"{prefix}.memory", f"must be between 0 and 1Pi{unit}"))
    if not 0 <= r.gpu <= MAX_GPUS_PER_NODE:
        out.append(
            invalid(f"{prefix}.gpu", f"must be between 0 and {MAX_GPUS_PER_NODE}, got {r.gpu}")
        )
    return out


def image_reference_problem(image: str) -> str:
    """Empty when ``image`` is an image reference (``registry/name[:tag][@digest]``, see
    :data:`IMAGE_REFERENCE_PATTERN`), else the rule it breaks. The worker checks every
    image against this rule again before it hands one to a container runtime."""
    match = IMAGE_REFERENCE_PATTERN.fullmatch(image) if len(image) <= MAX_IMAGE else None
    if match is None or len(match.group("name")) > MAX_IMAGE_NAME:
        return (
            "must be an image reference such as registry.example/team/train:24.01 or "
            "name@sha256:<hex>: lowercase path components, an optional registry host and "
            "tag, no spaces, not starting with '-', no transport prefix"
        )
    return ""


def _check_command(
    command: tuple[str, ...], shell: bool, field: str = "command"
) -> list[Violation]:
    if not command or not all(command):
        return [invalid(field, "must be a non-empty string or a list of non-empty strings")]
    if any("\x00" in part for part in command):
        return [invalid(field, "must not contain NUL characters")]
    if shell and len(command) != 1:
        return [invalid(field, "a shell command is exactly one string")]
    if sum(len(part) for part in command) > MAX_COMMAND_BYTES:
        return [invalid(field, f"must be at most {MAX_COMMAND_BYTES} characters")]
    return []


def _check_env(env: tuple[tuple[str, str], ...]) -> list[Violation]:
    if len(env) > MAX_ENV:
        return [invalid("env", f"at most {MAX_ENV} variables")]
    out = []
    seen: set[str] = set()
    for name, _ in env:
        if not ENV_NAME_PATTERN.match(name):
            out.append(invalid(f"env.{name}", "variable names are letters, digits and _"))
        elif name in seen:
            out.append(invalid(f"env.{name}", "appears twice"))
        seen.add(name)
    return out


def _check_env_values(env: tuple[tuple[str, str], ...], *, has_image: bool) -> list[Violation]:
    """No value may hold a NUL (no process environment can carry one). A job with an
    image gets its variables through an environment file of ``NAME=VALUE`` lines, so
    there a value may not hold a line break either."""
    out = []
    for name, value in env:
        if "\x00" in value:
            out.append(invalid(f"env.{name}", "a value must not contain NUL characters"))
        elif has_image and ("\n" in value or "\r" in value):
            out.append(
                invalid(f"env.{name}", "a job with an image cannot pass a value with a line break")
            )
    return out


def _check_level(level: str, topology_levels: Sequence[str] | None) -> str:
    """Empty when ``level`` (possibly empty: no constraint) is acceptable, else the rule."""
    if not level:
        return ""
    if topology_levels is None:
        return "" if LEVEL_NAME_PATTERN.match(level) else f"{level!r} is not a topology level name"
    levels = tuple(dict.fromkeys((*topology_levels, HOST_LEVEL)))
    if level not in levels:
        hint = did_you_mean(level, levels)
        return (
            f"{level!r} is not a topology level{f', {hint}' if hint else ''} ({', '.join(levels)})"
        )
    return ""


# --------------------------------------------------------------------------- nodes


def check_gpu_faults(faults: Sequence[GpuFault], gpu_count: int) -> list[Violation]:
    """Every rule a report of unhealthy GPUs breaks: each names a GPU of the node, once,
    with a fault code (lowercase words joined by dashes) and a bounded sentence."""
    out: list[Violation] = []
    seen: set[int] = set()
    for i, fault in enumerate(faults):
        where = f"gpu_faults[{i}]"
        if not 0 <= fault.gpu < gpu_count:
            out.append(invalid(f"{where}.gpu", f"must be a GPU index from 0 to {gpu_count - 1}"))
        elif fault.gpu in seen:
            out.append(invalid(f"{where}.gpu", f"GPU {fault.gpu} is named twice"))
        seen.add(fault.gpu)
        if len(fault.code) > MAX_FAULT_CODE or not FAULT_CODE_PATTERN.fullmatch(fault.code):
            out.append(
                invalid(
                    f"{where}.code",
                    f"1 to {MAX_FAULT_CODE} lowercase letters and digits in words joined by -",
                )
            )
        if len(fault.detail) > MAX_FAULT_DETAIL or not fault.detail.isprintable():
            out.append(
                invalid(f"{where}.detail", f"at most {MAX_FAULT_DETAIL} printable characters")
            )
    return out


def check_node_info(info: NodeInfo) -> list[Violation]:
    """Every rule a node description breaks, in field order.

    ``gpu_islands`` may be empty: the state machine then gives each GPU an island of its
    own (no NVLink is assumed where none was reported). Otherwise the islands must hold
    every GPU index ``0..gpu-1`` exactly once.
    """
    out: list[Violation] = []
    if not NODE_ID_PATTERN.match(info.node_id):
        out.append(invalid("node_id", "1 to 128 characters of letters, digits and . _ -"))
    problem = _address_problem(info.address)
    if problem:
        out.append(invalid("address", problem))
    out.extend(_check_resources(info.capacity, "capacity", per_member=False))
    if info.gpu_islands:
        indices = sorted(i for island in info.gpu_islands for i in island)
        if indices != list(range(info.capacity.gpu)):
            out.append(
                invalid(
                    "gpu_islands",
                    f"must hold every GPU index 0..{info.capacity.gpu - 1} exactly once",
                )
            )
    levels = [level for level, _ in info.topology]
    if len(set(levels)) != len(levels):
        out.append(invalid("topology", "a level appears twice"))
    if not MEMBERS_RUN_AS_PATTERN.fullmatch(info.members_run_as):
        out.append(
            invalid("members_run_as", 'must be "owner" or "agent:" and a user name (1 to 64)')
        )
    if not BOOT_ID_PATTERN.fullmatch(info.boot_id):
        out.append(invalid("boot_id", "at most 64 letters, digits and dashes"))
    if info.member_isolation not in MEMBER_ISOLATIONS:
        out.append(invalid("member_isolation", 'must be "pid-namespace" or "shared"'))
    return out


def _address_problem(address: str) -> str:
    """Empty when ``address`` is ``host`` or ``host:port`` (``[v6]:port`` too), else the rule.
    The host is what gang members see as ``MASTER_ADDR``; a worker also gives the port of
    its own services."""
    rule = "must be host or host:port, without spaces"
    if not address or len(address) > MAX_ADDRESS or any(c.isspace() for c in address):
        return rule
    host, sep, port = address.rpartition(":")
    if sep and not port:
        return f"{address!r} {rule}"
    if sep and port.isdigit() and (not host or not 0 < int(port) < 65536):
        return f"{address!r}: the port must be between 1 and 65535, after a host"
    return ""


# -------------------------------------------------------------------------- tokens


def check_token(
    token_id: str,
    user: str,
    role: object,
    queues: Sequence[str],
    secret_sha256: str,
    expires_at_ms: int,
) -> list[Violation]:
    """Every rule a new token breaks, in field order. ``token_id`` may be empty when the
    server has yet to make one."""
    out: list[Violation] = []
    if token_id and not access.TOKEN_ID_PATTERN.match(token_id):
        out.append(invalid("token_id", "must be 12 lowercase hexadecimal digits"))
    if not access.NAME_PATTERN.match(user):
        out.append(invalid("user", "1 to 63 characters of letters, digits and . _ - "))
    if not isinstance(role, access.Role):
        allowed = ", ".join(r.value for r in access.Role)
        out.append(invalid("role", f"must be one of {allowed}"))
    if len(queues) > MAX_TOKEN_QUEUES:
        out.append(invalid("queues", f"at most {MAX_TOKEN_QUEUES}"))
    for i, queue in enumerate(queues):
        if not NAME_PATTERN.match(queue) or len(queue) > MAX_NAME:
            out.append(invalid(f"queues[{i}]", "lowercase letters, digits and -, at most 63"))
    if len(set(queues)) != len(queues):
        out.append(invalid("queues", "a queue appears twice"))
    if not access.TOKEN_HASH_PATTERN.match(secret_sha256):
        out.append(invalid("secret_sha256", "must be 64 lowercase hexadecimal digits"))
    if expires_at_ms < 0:
        out.append(invalid("expires_at_ms", "must be 0 (never) or a time"))
    return out


# ------------------------------------------------------------------- configuration


def check_timeouts(t: Timeouts) -> list[Violation]:
    """The rules that make self-fencing safe (DESIGN §5): a worker's lease outlives a
    heartbeat, and a node is declared dead only after its lease, the leader's step-down
    and a margin have all run out."""
    out = [
        invalid(f"timeouts.{name}", "must be > 0")
        for name in ("heartbeat_interval_ms", "lease_ttl_ms", "leader_step_down_ms")
        if getattr(t, name) <= 0
    ]
    if t.lease_ttl_ms <= t.heartbeat_interval_ms:
        out.append(
            invalid(
                "timeouts.lease_ttl_ms",
                f"lease_ttl ({t.lease_ttl_ms} ms) must exceed heartbeat_interval "
                f"({t.heartbeat_interval_ms} ms)",
            )
        )
    bound = t.lease_ttl_ms + t.leader_step_down_ms + t.safety_margin_ms
    if t.dead_timeout_ms <= bound:
        out.append(
            invalid(
                "timeouts.dead_timeout_ms",
                f"dead_timeout ({t.dead_timeout_ms} ms) must exceed lease_ttl + "
                f"leader_step_down + margin ({bound} ms)",
            )
        )
    return out


def check_cluster_config(config: ClusterConfig) -> list[Violation]:
    """Every rule ``config`` breaks on its own (the per-identity limits are
    :func:`synapse_ha.core.identity.admission.check_limits`, the hot spares
    :func:`synapse_ha.core.spares.check_spare_settings`; a change that would orphan an
    unfinished job's topology level is the state machine's to refuse)."""
    out = check_timeouts(config.timeouts)
    levels = config.topology_levels
    if len(set(levels)) != len(levels) or "host" in levels or any(not lv for lv in levels):
        out.append(invalid("topology_levels", "must be distinct, non-empty and not 'host'"))
    if config.retention_ms < 0:
        out.append(invalid("retention_ms", "must be >= 0"))
    if (
        config.master_port_span < 1
        or not 1024 <= config.master_port_base <= 65535
        or config.master_port_base + config.master_port_span - 1 > 65535
    ):
        out.append(invalid("master_port_base", "the master port range must lie within 1024..65535"))
    if not 0 <= config.locality_wait_ms <= MAX_LOCALITY_WAIT_MS:
        out.append(invalid("locality_wait_ms", f"must be between 0 and {MAX_LOCALITY_WAIT_MS}"))
    if not 0 <= config.max_requeues <= MAX_REQUEUES_LIMIT:
        out.append(invalid("max_requeues", f"must be between 0 and {MAX_REQUEUES_LIMIT}"))
    if not MIN_START_TIMEOUT_MS <= config.start_timeout_ms <= MAX_START_TIMEOUT_MS:
        rule = f"must be between {MIN_START_TIMEOUT_MS} and {MAX_START_TIMEOUT_MS}"
        out.append(invalid("start_timeout_ms", rule))
    out.extend(check_priority_classes(config.priority_classes))
    if config.fair_share_half_life_ms < 1:
        out.append(invalid("fair_share_half_life_ms", "must be >= 1"))
    if not 0 <= config.reclaim_wait_max_ms <= MAX_RECLAIM_WAIT_MS:
        out.append(invalid("reclaim_wait_max_ms", f"must be between 0 and {MAX_RECLAIM_WAIT_MS}"))
    if not 0 <= config.defrag_share_pct <= 100:
        out.append(invalid("defrag_share_pct", "must be between 0 and 100 (percent of nodes)"))
    if (bound := config.reservations_rule()) is not None:
        out.append(invalid("reservations_per_pass", bound))
    return out


# ------------------------------------------------------------------------- queues


def name_problem(name: str) -> str:
    if not NAME_PATTERN.match(name) or len(name) > MAX_NAME:
        return "lowercase letters, digits and -, at most 63, starting and ending alphanumeric"
    return ""


def check_queue(queue: Queue, classes: Sequence[PriorityClass]) -> list[Violation]:
    """Every rule a queue's settings break, in field order. ``classes`` are the cluster's
    priority classes, which the queue's allowed classes must name."""
    out: list[Violation] = []
    problem = name_problem(queue.name)
    if problem:
        out.append(invalid("name", problem))
    limits = (
        ("gpu", queue.gpu, MAX_QUEUE_GPUS),
        ("cpu_milli", queue.cpu_milli, MAX_CPU_MILLI),
        ("memory_mib", queue.memory_mib, MAX_MEMORY_MIB),
        ("borrowing_limit_gpu", queue.borrowing_limit_gpu, MAX_QUEUE_GPUS),
        ("lending_limit_gpu", queue.lending_limit_gpu, MAX_QUEUE_GPUS),
        ("min_runtime_ms", queue.min_runtime_ms, MAX_MIN_RUNTIME_MS),
        ("running_members_per_user", queue.running_members_per_user, MAX_QUEUE_GPUS),
        ("members_per_node_per_user", queue.members_per_node_per_user, MAX_QUEUE_GPUS),
    )
    for field, value, most in limits:
        if value is not None and not 0 <= value <= most:
            out.append(invalid(field, f"must be between 0 and {most}, or unset"))
    if queue.cohort:
        problem = name_problem(queue.cohort)
        if problem:
            out.append(invalid("cohort", problem))
    if queue.gpu is None and queue.cohort:
        out.append(invalid("cohort", "a queue without a GPU quota cannot join a cohort"))
    lending, nominal = queue.lending_limit_gpu, queue.gpu
    if lending is not None and nominal is not None and lending > nominal:
        out.append(invalid("lending_limit_gpu", "cannot exceed the nominal GPU quota"))
    known = {c.name for c in classes}
    for i, name in enumerate(queue.priority_classes):
        if name not in known:
            allowed = ", ".join(sorted(known)) or "none are configured"
            out.append(invalid(f"priority_classes[{i}]", f"no such class ({allowed})"))
    if len(set(queue.priority_classes)) != len(queue.priority_classes):
        out.append(invalid("priority_classes", "a class appears twice"))
    return out + [invalid(field, rule) for field, rule in estimate_problems(queue)]


def check_priority_classes(classes: Sequence[PriorityClass]) -> list[Violation]:
    """Every rule the cluster's priority classes break."""
    out: list[Violation] = []
    if len(classes) > MAX_PRIORITY_CLASSES:
        out.append(invalid("priority_classes", f"at most {MAX_PRIORITY_CLASSES}"))
    seen: set[str] = set()
    for i, c in enumerate(classes):
        problem = name_problem(c.name)
        if problem:
            out.append(invalid(f"priority_classes[{i}].name", problem))
        if c.name in seen:
            out.append(invalid(f"priority_classes[{i}].name", "a class appears twice"))
        seen.add(c.name)
        if not -MAX_PRIORITY <= c.value <= MAX_PRIORITY:
            out.append(
                invalid(
                    f"priority_classes[{i}].value",
                    f"must be between -{MAX_PRIORITY} and {MAX_PRIORITY}",
                )
            )
        if not 0 <= c.grace_ms <= MAX_GRACE_MS:
            out.append(invalid(f"priority_classes[{i}].grace_ms", "must be between 0 and 24h"))
        if not 0 <= c.min_runtime_ms <= MAX_MIN_RUNTIME_MS:
            out.append(invalid(f"priority_classes[{i}].min_runtime_ms", "must be 0 to 7 days"))
    return out
