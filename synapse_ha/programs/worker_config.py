"""The configuration of ``synapse-worker``: its flags and TOML file (``--config``; a flag
wins over the file), checked whole before the agent starts (:func:`load_config`). TOML
keys are the flag names with underscores, for example::

    schedulers = ["10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"]
    node_id = "gpu-017"
    listen = "0.0.0.0:7070"
    advertise = "10.0.1.17:7070"
    topology = "zone=z1,block=b1,rack=r3"
    data_dir = "/var/lib/synapse-worker"
    cpu = "60"            # override what the OS reports
    memory = "480Gi"
    mock_gpus = 8         # machines without GPUs: declare them
    mock_nvlink = "0-3,4-7"
    mock_gpu_faults = "/run/synapse/gpu-faults"   # with mock GPUs: faults appended here
    image_runtime = "podman"           # run members whose job names an image
    image_run_args = "--ipc host --shm-size 16g"   # extra options for `podman run`
    image_cap_add = ["NET_RAW"]        # capabilities containers keep (default: none)
    rootless_runtime = true            # the runtime runs as each member's owner
    features = ["ib"]
    run_as = "owner"                   # or "agent" (default: owner when run as root)
    allow_root_members = false
    member_env_passthrough = ["HTTPS_PROXY", "NCCL_SOCKET_IFNAME"]  # agent variables members get
    allow_shared_pid_namespace = false # true: start where members cannot get PID namespaces
    [user_map]                         # job owner = local account
    alice = "svc_alice"
    [metrics]                          # /metrics over HTTPS with the worker's certificate
    address = "0.0.0.0:9102"
    [gpu_health]                       # the GPU health monitor (worker/gpu_health.py)
    enabled = true
    poll_interval = "5s"
    xid_actions = {"13" = "unhealthy", "79" = "report"}   # override the Xid table

and, at the top level, the health-check program (worker/health_check.py)::

    health_check = "/usr/local/sbin/node-health --quick"
    health_check_interval = "5m"
    health_check_timeout = "60s"
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synapse_ha.core.node_selector import feature_name_problem
from synapse_ha.core.spec.document import SpecError, parse_cpu, parse_memory
from synapse_ha.programs.config_file import ConfigError, address, duration_ms
from synapse_ha.programs.health_check_config import HEALTH_CHECK_SETTINGS, health_check_settings
from synapse_ha.programs.member_config import (
    ACCOUNTS,
    ALLOW_ROOT_MEMBERS,
    ALLOW_SHARED_PID_NAMESPACE,
    IMAGES,
    MEMBER_ENV_PASSTHROUGH,
    PROCESSES,
    RUN_AS,
    USER_MAP,
    image_options,
    image_runtime,
    members_run_as,
)
from synapse_ha.programs.settings import (
    Inputs,
    Setting,
    add_settings,
    defaulted,
    metrics_address,
    new_parser,
    parse_flags,
    setting,
    tls_files,
    true_or_false,
    writable_directory,
)
from synapse_ha.security.tls import TlsFiles, add_tls_flags
from synapse_ha.worker import discovery
from synapse_ha.worker.accounts import RunAsMode
from synapse_ha.worker.gpu_health import GpuHealthSettings
from synapse_ha.worker.health_check import HealthCheckSettings
from synapse_ha.worker.images import ImageRuntime
from synapse_ha.worker.xid import parse_xid_actions

log = logging.getLogger("synapse.worker")

# A deliberately broken build for the chaos suite, which must catch it: with this variable
# set to 1 AND the confirmation flag below, neither the agent nor the member supervisors
# fence themselves when the lease runs out. Either one alone is refused at start-up.
UNSAFE_NO_SELF_FENCING_ENV = "SYNAPSE_TEST_UNSAFE_NO_SELF_FENCING"
UNSAFE_NO_SELF_FENCING_FLAG = "--i-know-this-is-unsafe-no-self-fencing"


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    schedulers: tuple[str, ...]
    node_id: str
    listen: str
    advertise: str
    topology: tuple[tuple[str, str], ...]
    data_dir: Path
    cpu_milli: int | None
    memory_mib: int | None
    mock_gpus: int | None
    mock_nvlink: str
    mock_gpu_model: str
    image_runtime: str
    image_run_args: str
    features: tuple[str, ...]
    heartbeat_interval_s: float
    lease_ttl_s: float
    stop_grace_s: float
    fence_grace_s: float
    cgroups: bool
    cgroup_root: Path
    log_level: str
    self_fencing: bool = True
    run_as: RunAsMode = RunAsMode.AGENT
    user_map: tuple[tuple[str, str], ...] = ()
    allow_root_members: bool = False
    # Variables of the agent's environment members get; members get no other one.
    member_env_passthrough: tuple[str, ...] = ()
    # With --run-as owner: start even where members cannot get PID namespaces of their own.
    allow_shared_pid_namespace: bool = False
    tls: TlsFiles | None = None  # None: --insecure
    metrics_address: str = ""  # where /metrics is served; "" serves none
    # The runtime as it will run (its program by absolute path, found at start), or None.
    image: ImageRuntime | None = None
    gpu_health: GpuHealthSettings = field(default_factory=GpuHealthSettings)
    health_check: HealthCheckSettings = field(default_factory=HealthCheckSettings)


# ------------------------------------------------------------------- the checks


def parse_topology(text: str) -> tuple[tuple[str, str], ...]:
    labels: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        level, sep, value = part.partition("=")
        if not sep or not level.strip() or not value.strip():
            raise ConfigError(f"--topology: {part!r} is not LEVEL=VALUE (e.g. rack=r3)")
        if level.strip() in labels:
            raise ConfigError(f"--topology: level {level.strip()!r} appears twice")
        labels[level.strip()] = value.strip()
    return tuple(sorted(labels.items()))


def _check_address(value: str, what: str) -> str:
    return address(value, what, form="HOST:PORT", port_zero=True)


def _host_port(what: str) -> Callable[[Any], str]:
    return lambda value: _check_address(str(value), what)


def _positive_seconds(what: str) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        ms = duration_ms(value, what)
        if ms <= 0:
            raise ConfigError(f"{what}: must be positive")
        return ms / 1000

    return check


def _quantity(parse: Callable[[Any, str], int], what: str) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        try:
            return parse(value, what)
        except SpecError as exc:
            raise ConfigError(str(exc)) from None

    return check


def _gpu_count(value: Any) -> int:
    if not isinstance(value, int) or value < 0:
        raise ConfigError("--mock-gpus: must be an integer >= 0")
    return value


# ----------------------------------------------------------------- the settings


SCHEDULERS = setting(
    "--scheduler",
    "schedulers",
    merge="truthy",
    default=(),
    action="append",
    flag_default=[],
    metavar="HOST:PORT",
    help="a scheduler replica's gRPC address; repeat or separate with commas",
)
NODE_ID = setting("--node-id", "node_id", help="this node's id (default: the host name)")
LISTEN = defaulted(
    "listen",
    "0.0.0.0:7070",
    _host_port("--listen"),
    "where the log service listens (default 0.0.0.0:7070)",
)
ADVERTISE = defaulted(
    "advertise",
    "",
    _host_port("--advertise"),
    "HOST:PORT other machines reach this node at",
)
TOPOLOGY = defaulted(
    "topology",
    (),
    lambda value: parse_topology(str(value)),
    "labels such as zone=z1,block=b1,rack=r3",
)
DATA_DIR = setting("--data-dir", "data_dir", help="directory for member logs and pid records")
NODE = (SCHEDULERS, NODE_ID, LISTEN, ADVERTISE, TOPOLOGY, DATA_DIR)

CPU = setting(
    "--cpu",
    "cpu",
    check=_quantity(parse_cpu, "--cpu"),
    help="CPU capacity to offer, e.g. 32 or 500m (default: the OS)",
)
MEMORY = setting(
    "--memory",
    "memory",
    check=_quantity(parse_memory, "--memory"),
    help="memory to offer, e.g. 256Gi (default: the OS)",
)
MOCK_GPUS = setting(
    "--mock-gpus",
    "mock_gpus",
    check=_gpu_count,
    type=int,
    help="declare this many GPUs instead of NVML",
)
MOCK_NVLINK = defaulted(
    "mock_nvlink",
    "all",
    str,
    "mock NVLink islands: all, none or 0-1,2-3",
)
MOCK_GPU_MODEL = defaulted(
    "mock_gpu_model",
    "mock-gpu",
    str,
    "model name of mock GPUs",
)
MOCK_GPU_FAULTS = setting(
    "--mock-gpu-faults",
    "mock_gpu_faults",
    check=lambda value: Path(str(value)),
    metavar="PATH",
    help="with --mock-gpus: each line appended to PATH is a GPU fault, seen within 1s "
    "('3 xid 79', '3 ecc-dbe', '3 lost', '3 retired-pages', '3 remap-failed', '3 nvlink')",
)
CAPACITY = (CPU, MEMORY, MOCK_GPUS, MOCK_NVLINK, MOCK_GPU_MODEL, MOCK_GPU_FAULTS)


def _xid_actions(value: Any) -> Any:
    where = "gpu_health.xid_actions" if isinstance(value, dict) else "--xid-action"
    try:
        return parse_xid_actions(value, where)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


NO_GPU_HEALTH = setting(
    "--no-gpu-health",
    "gpu_health.enabled",
    negated=True,
    default=True,
    check=true_or_false("gpu_health.enabled"),
    action="store_true",
    help="do not watch the GPUs' health (no Xid, ECC, lost-GPU or NVLink faults reported)",
)
GPU_POLL_INTERVAL = setting(
    "--gpu-poll-interval",
    "gpu_health.poll_interval",
    default=5.0,
    check=_positive_seconds("--gpu-poll-interval"),
    help="how often NVML is polled for a lost GPU, pending page retirement, a failed row "
    "remapping or an NVLink gone down (default 5s; Xid and ECC events arrive at once)",
)
XID_ACTIONS = setting(
    "--xid-action",
    "gpu_health.xid_actions",
    merge="truthy",
    default=(),
    check=_xid_actions,
    action="append",
    flag_default=[],
    metavar="XID=ACTION",
    help="override the Xid table: ACTION is unhealthy (the GPU is taken out of service) "
    "or report (logged only); repeat for several",
)
BOOT_ID_FILE = setting(
    "--boot-id-file",
    "gpu_health.boot_id_file",
    default="/proc/sys/kernel/random/boot_id",
    check=str,
    metavar="PATH",
    help="the machine's boot id, sent at registration: with the cluster's "
    "clear_gpu_faults_on_reboot a new one clears the node's GPU faults ('' : none sent)",
)
GPU_HEALTH = (NO_GPU_HEALTH, GPU_POLL_INTERVAL, XID_ACTIONS, BOOT_ID_FILE)

FEATURES = setting(
    "--feature",
    "features",
    merge="both",
    action="append",
    flag_default=[],
    help="an extra node feature",
)


def _seconds_setting(name: str, default_s: float, help: str) -> Setting:
    flag = f"--{name.replace('_', '-')}"
    return setting(flag, name, default=default_s, check=_positive_seconds(flag), help=help)


HEARTBEAT_INTERVAL = _seconds_setting(
    "heartbeat_interval", 1.0, "until the leader says otherwise (default 1s)"
)
LEASE_TTL = _seconds_setting("lease_ttl", 4.0, "until the leader says otherwise (default 4s)")
STOP_GRACE = _seconds_setting(
    "stop_grace", 5.0, "SIGTERM to SIGKILL on a graceful stop (default 5s)"
)
FENCE_GRACE = _seconds_setting(
    "fence_grace", 0.5, "SIGTERM to SIGKILL when fencing (default 500ms)"
)
TIMING = (HEARTBEAT_INTERVAL, LEASE_TTL, STOP_GRACE, FENCE_GRACE)

NO_CGROUPS = setting(
    "--no-cgroups",
    "no_cgroups",
    merge="truthy",
    default=False,
    action="store_true",
    flag_default=False,
    help="do not use cgroup limits",
)
CGROUP_ROOT = defaulted(
    "cgroup_root",
    Path("/sys/fs/cgroup"),
    lambda value: Path(str(value)),
    "cgroup v2 mount point (default /sys/fs/cgroup)",
)
LOG_LEVEL = defaulted(
    "log_level",
    "INFO",
    lambda value: str(value).upper(),
    "DEBUG, INFO, WARNING (default INFO)",
)
METRICS_ADDRESS = metrics_address(
    "HOST:PORT where /metrics is served (HTTPS with the worker's certificate, "
    "client certificate required; port 0 picks a free port); default: not served"
)
SERVICE = (NO_CGROUPS, CGROUP_ROOT, LOG_LEVEL, METRICS_ADDRESS)


def build_parser() -> argparse.ArgumentParser:
    p = new_parser("synapse-worker", "Run the synapse node agent on this machine.")
    add_settings(
        p,
        NODE,
        CAPACITY,
        GPU_HEALTH,
        HEALTH_CHECK_SETTINGS,
        IMAGES,
        (FEATURES,),
        TIMING,
        SERVICE,
        ACCOUNTS,
        PROCESSES,
    )
    add_tls_flags(
        p,
        "worker",
        "no TLS: talk to the replicas and serve logs in plaintext, to anyone "
        "(logs a warning at every start)",
    )
    p.add_argument(
        UNSAFE_NO_SELF_FENCING_FLAG,
        dest="unsafe_no_self_fencing",
        action="store_true",
        help=argparse.SUPPRESS,  # test-only; see UNSAFE_NO_SELF_FENCING_ENV
    )
    return p


# ------------------------------------------------------------------ the loader

# The value types of the configuration file's keys that are used without a parser of their
# own (a parser names the key in its error): a wrong type is a ConfigError naming the key.
_FILE_TYPES: dict[str, tuple[type, ...]] = {
    "schedulers": (str, list),
    "features": (list,),
    "metrics": (dict,),
    "user_map": (dict,),
    "no_cgroups": (bool,),
    "image_cap_add": (list,),
    "rootless_runtime": (bool,),
    "gpu_health": (dict,),
    "mock_gpu_faults": (str,),
    "member_env_passthrough": (list,),
}


def load_config(
    argv: Sequence[str], environ: Mapping[str, str] | None = None, *, euid: int | None = None
) -> WorkerConfig:
    """Merge the TOML file and flags; raise :class:`ConfigError` on anything wrong.
    ``euid`` stands for this process's effective uid (tests give it)."""
    flags = parse_flags(build_parser(), argv)
    self_fencing = _self_fencing(
        flags.unsafe_no_self_fencing, os.environ if environ is None else environ
    )
    inputs = Inputs.read(
        flags,
        _FILE_TYPES,
        string_lists=("schedulers", "features", "image_cap_add", "member_env_passthrough"),
    )
    schedulers = _schedulers(inputs)
    node_id = str(inputs.raw(NODE_ID) or socket.gethostname())
    listen, advertise = inputs.value(LISTEN), inputs.value(ADVERTISE)
    data_dir = _data_dir(inputs)
    cpu_milli, memory_mib = inputs.value(CPU), inputs.value(MEMORY)
    mock = _mock_gpus(inputs)
    options = image_options(inputs)
    features = [str(f) for f in inputs.value(FEATURES)]
    for feature in features:  # what a job's nodes.features can name
        if problem := feature_name_problem(feature):
            raise ConfigError(f"features: {problem}")
    heartbeat, lease = inputs.value(HEARTBEAT_INTERVAL), inputs.value(LEASE_TTL)
    if lease <= heartbeat:
        raise ConfigError("--lease-ttl must exceed --heartbeat-interval")
    run_as = members_run_as(inputs.raw(RUN_AS), os.geteuid() if euid is None else euid)
    # Mock GPUs have no devices to hand to a container.
    image = image_runtime(options, run_as, gpu_devices=mock is None)
    user_map = inputs.value(USER_MAP)
    if user_map and run_as is RunAsMode.AGENT:
        log.warning("--user-map has no effect: members run as this agent's user (--run-as agent)")
    allow_root, tls = inputs.value(ALLOW_ROOT_MEMBERS), tls_files(inputs)
    metrics, topology = inputs.value(METRICS_ADDRESS), inputs.value(TOPOLOGY)
    return WorkerConfig(
        member_env_passthrough=inputs.value(MEMBER_ENV_PASSTHROUGH),
        allow_shared_pid_namespace=inputs.value(ALLOW_SHARED_PID_NAMESPACE),
        metrics_address=metrics,
        schedulers=tuple(dict.fromkeys(schedulers)),
        node_id=node_id,
        listen=listen,
        advertise=advertise,
        topology=topology,
        data_dir=Path(data_dir).resolve(),
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        mock_gpus=mock,
        mock_nvlink=inputs.value(MOCK_NVLINK),
        mock_gpu_model=inputs.value(MOCK_GPU_MODEL),
        image_runtime=options.runtime,
        image_run_args=options.run_args,
        features=tuple(sorted(set(features))),
        heartbeat_interval_s=heartbeat,
        lease_ttl_s=lease,
        stop_grace_s=inputs.value(STOP_GRACE),
        fence_grace_s=inputs.value(FENCE_GRACE),
        cgroups=not inputs.value(NO_CGROUPS),
        cgroup_root=inputs.value(CGROUP_ROOT),
        log_level=inputs.value(LOG_LEVEL),
        self_fencing=self_fencing,
        run_as=run_as,
        user_map=user_map,
        allow_root_members=allow_root,
        tls=tls,
        image=image,
        gpu_health=_gpu_health(inputs, mock),
        health_check=health_check_settings(inputs),
    )


def _self_fencing(flag: bool, environ: Mapping[str, str]) -> bool:
    """Self-fencing is off only when the test variable and the flag are both given."""
    env_value = environ.get(UNSAFE_NO_SELF_FENCING_ENV, "")
    if env_value not in ("", "0", "1"):
        raise ConfigError(f"{UNSAFE_NO_SELF_FENCING_ENV}: must be 1 or unset, got {env_value!r}")
    wants_off = env_value == "1"
    if wants_off and not flag:
        raise ConfigError(
            f"{UNSAFE_NO_SELF_FENCING_ENV}=1 disables self-fencing (test-only, unsafe); "
            f"refusing to start without {UNSAFE_NO_SELF_FENCING_FLAG}"
        )
    if flag and not wants_off:
        raise ConfigError(
            f"{UNSAFE_NO_SELF_FENCING_FLAG} needs {UNSAFE_NO_SELF_FENCING_ENV}=1 (test-only)"
        )
    return not wants_off


def _schedulers(inputs: Inputs) -> list[str]:
    """The replicas' addresses, from repeated flags or a list, each maybe comma-separated."""
    schedulers: list[str] = []
    raw = inputs.value(SCHEDULERS)
    if isinstance(raw, str):
        raw = [raw]
    for item in raw:
        schedulers += [s.strip() for s in str(item).split(",") if s.strip()]
    if not schedulers:
        raise ConfigError("at least one scheduler address is required (--scheduler HOST:PORT)")
    for s in schedulers:
        _check_address(s, "--scheduler")
    return schedulers


def _data_dir(inputs: Inputs) -> str:
    """The data directory, writable and the agent's alone."""
    data_dir: str = inputs.value(DATA_DIR)
    if not data_dir:
        raise ConfigError("a data directory is required (--data-dir)")
    writable_directory(data_dir)
    _check_data_dir_is_the_agents(Path(data_dir), os.geteuid())
    return data_dir


def _check_data_dir_is_the_agents(data_dir: Path, euid: int) -> None:
    """The agent acts, as root, on the records under its data directory (pids it kills,
    exits it reports, the lease its supervisors obey): no other account may change them.
    Refuses a data directory owned by another account or writable by its group or by
    others."""
    try:
        st = data_dir.stat()
    except OSError as exc:
        raise ConfigError(f"data directory {data_dir}: {exc}") from None
    if st.st_uid != euid:
        raise ConfigError(
            f"data directory {data_dir} belongs to uid {st.st_uid}, not to this agent's "
            f"(uid {euid}): chown it to the agent's account"
        )
    if st.st_mode & 0o022:
        raise ConfigError(
            f"data directory {data_dir} is writable by others (mode "
            f"{stat.S_IMODE(st.st_mode):04o}): members could replace the records the agent "
            f"acts on; chmod go-w {data_dir}"
        )


def _mock_gpus(inputs: Inputs) -> int | None:
    """How many GPUs to declare instead of asking NVML (None: ask), their islands
    checked."""
    mock: int | None = inputs.value(MOCK_GPUS)
    if mock is not None:
        try:
            discovery.parse_mock_nvlink(inputs.value(MOCK_NVLINK), mock)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    elif inputs.raw(MOCK_NVLINK) is not None:
        raise ConfigError("--mock-nvlink needs --mock-gpus")
    return mock


def _gpu_health(inputs: Inputs, mock: int | None) -> GpuHealthSettings:
    """The GPU health settings; a mock fault file only with mock GPUs."""
    mock_faults = inputs.value(MOCK_GPU_FAULTS)
    if mock_faults is not None and mock is None:
        raise ConfigError("--mock-gpu-faults needs --mock-gpus (real GPUs report through NVML)")
    return GpuHealthSettings(
        enabled=inputs.value(NO_GPU_HEALTH),
        poll_interval_s=inputs.value(GPU_POLL_INTERVAL),
        xid_actions=inputs.value(XID_ACTIONS),
        mock_faults=Path(mock_faults).absolute() if mock_faults is not None else None,
        boot_id_file=Path(boot_id_file) if (boot_id_file := inputs.value(BOOT_ID_FILE)) else None,
    )
