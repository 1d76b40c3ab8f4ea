"""``synapse-worker``: the node agent's composition root.

Configuration comes from flags and/or a TOML file (``--config``); a flag wins over the
file. TOML keys are the flag names with underscores, for example::

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
    image_runtime = "podman"           # run members whose job names an image
    image_run_args = "--ipc host --shm-size 16g"   # extra options for `podman run`
    image_cap_add = ["NET_RAW"]        # capabilities containers keep (default: none)
    rootless_runtime = true            # the runtime runs as each member's owner
    features = ["ib"]
    run_as = "owner"                   # or "agent" (default: owner when run as root)
    allow_root_members = false
    [user_map]                         # job owner = local account
    alice = "svc_alice"
    [metrics]                          # /metrics over HTTPS with the worker's certificate
    address = "0.0.0.0:9102"

It runs in the foreground; SIGTERM or SIGINT stops every member gracefully, reports their
exits when a leader answers, and exits. Members are supervised by per-member shims
(:mod:`synapse_ha.worker.shim`) that kill them when the lease lapses even if this process
is killed or frozen.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.model import FEATURE_IMAGES
from synapse_ha.core.spec import SpecError, parse_cpu, parse_memory
from synapse_ha.observe.http import AddressError, ObserveServer, parse_address
from synapse_ha.observe.metrics import MeteredControlPlane, MeteredExecutor, WorkerMetrics
from synapse_ha.programs.config_file import (
    ConfigError,
    address,
    check_file_types,
    duration_ms,
    read_toml,
)
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.security.tls import (
    INSECURE_WARNING,
    TlsError,
    TlsFiles,
    Transport,
    add_tls_flags,
    tls_from,
)
from synapse_ha.worker import discovery
from synapse_ha.worker.accounts import RunAsMode, RunAsPolicy, agent_user_name, parse_user_map
from synapse_ha.worker.agent import Agent, AgentTimings, GrpcControlPlane
from synapse_ha.worker.cgroups import CgroupLimiter, probe_cgroups
from synapse_ha.worker.lease import LeaseFile
from synapse_ha.worker.logs import LogAccess, add_worker_service, new_worker_server
from synapse_ha.worker.members import ExecutorSettings, ImageRuntime, MemberExecutor
from synapse_ha.worker.stream import StreamControlPlane

log = logging.getLogger("synapse.worker")

TICK_S = 0.02

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
    tls: TlsFiles | None = None  # None: --insecure
    metrics_address: str = ""  # where /metrics is served; "" serves none
    # The runtime as it will run (its program by absolute path, found at start), or None.
    image: ImageRuntime | None = None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="synapse-worker", description="Run the synapse node agent on this machine."
    )
    p.add_argument("--config", help="TOML configuration file")
    p.add_argument(
        "--scheduler",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a scheduler replica's gRPC address; repeat or separate with commas",
    )
    p.add_argument("--node-id", help="this node's id (default: the host name)")
    p.add_argument("--listen", help="where the log service listens (default 0.0.0.0:7070)")
    p.add_argument("--advertise", help="HOST:PORT other machines reach this node at")
    p.add_argument("--topology", help="labels such as zone=z1,block=b1,rack=r3")
    p.add_argument("--data-dir", help="directory for member logs and pid records")
    p.add_argument("--cpu", help="CPU capacity to offer, e.g. 32 or 500m (default: the OS)")
    p.add_argument("--memory", help="memory to offer, e.g. 256Gi (default: the OS)")
    p.add_argument("--mock-gpus", type=int, help="declare this many GPUs instead of NVML")
    p.add_argument("--mock-nvlink", help="mock NVLink islands: all, none or 0-1,2-3")
    p.add_argument("--mock-gpu-model", help="model name of mock GPUs")
    p.add_argument(
        "--image-runtime",
        help="container runtime command, e.g. podman or docker; members whose job names an "
        "image run through it and the node offers the images feature",
    )
    p.add_argument(
        "--image-run-args",
        help='extra options for the runtime\'s run command, e.g. "--ipc host --shm-size 16g" '
        "(long forms only; options that change the container's identity, capabilities or "
        "security options are refused)",
    )
    p.add_argument(
        "--image-cap-add",
        action="append",
        default=[],
        metavar="CAPABILITY",
        help="a capability containers keep (repeatable; default: every one is dropped)",
    )
    p.add_argument(
        "--rootless-runtime",
        action="store_true",
        default=None,
        help="run the image runtime as each member's owner (rootless podman; needs "
        "--run-as owner): the preferred mode",
    )
    p.add_argument("--feature", action="append", default=[], help="an extra node feature")
    p.add_argument("--heartbeat-interval", help="until the leader says otherwise (default 1s)")
    p.add_argument("--lease-ttl", help="until the leader says otherwise (default 4s)")
    p.add_argument("--stop-grace", help="SIGTERM to SIGKILL on a graceful stop (default 5s)")
    p.add_argument("--fence-grace", help="SIGTERM to SIGKILL when fencing (default 500ms)")
    p.add_argument("--no-cgroups", action="store_true", help="do not use cgroup limits")
    p.add_argument("--cgroup-root", help="cgroup v2 mount point (default /sys/fs/cgroup)")
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING (default INFO)")
    p.add_argument(
        "--metrics-address",
        help="HOST:PORT where /metrics is served (HTTPS with the worker's certificate, "
        "client certificate required; port 0 picks a free port); default: not served",
    )
    p.add_argument(
        "--run-as",
        choices=[m.value for m in RunAsMode],
        help="owner: members run as their job's owner (needs root); agent: as this "
        "agent's user (default: owner when run as root, else agent)",
    )
    p.add_argument(
        "--user-map",
        action="append",
        default=[],
        metavar="USER=ACCOUNT",
        help="run USER's members as the local ACCOUNT (repeatable)",
    )
    p.add_argument(
        "--allow-root-members",
        action="store_true",
        default=None,
        help="let members run as root when their owner maps to it (default: refused)",
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


def _seconds(value: object, what: str, default: float) -> float:
    if value is None:
        return default
    ms = duration_ms(value, what)
    if ms <= 0:
        raise ConfigError(f"{what}: must be positive")
    return ms / 1000


def _run_as(flag: object, euid: int) -> RunAsMode:
    """The mode asked for, else owner when running as root and agent otherwise."""
    if flag is None:
        return RunAsMode.OWNER if euid == 0 else RunAsMode.AGENT
    try:
        mode = RunAsMode(str(flag))
    except ValueError:
        raise ConfigError(f"--run-as: must be owner or agent, got {flag!r}") from None
    if mode is RunAsMode.OWNER and euid != 0:
        raise ConfigError(
            "--run-as owner needs the agent to run as root (it switches to each owner's "
            "account); use --run-as agent"
        )
    return mode


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
}


def load_config(
    argv: Sequence[str], environ: Mapping[str, str] | None = None, *, euid: int | None = None
) -> WorkerConfig:
    """Merge the TOML file and flags; raise :class:`ConfigError` on anything wrong.
    ``euid`` stands for this process's effective uid (tests give it)."""
    args = build_parser().parse_args(list(argv))
    self_fencing = _self_fencing(
        args.unsafe_no_self_fencing, os.environ if environ is None else environ
    )
    doc = read_toml(args.config)
    check_file_types(doc, _FILE_TYPES, string_lists=("schedulers", "features", "image_cap_add"))

    def pick(flag: object, key: str) -> Any:
        return flag if flag is not None else doc.get(key)

    schedulers: list[str] = []
    raw = args.scheduler or doc.get("schedulers", [])
    if isinstance(raw, str):
        raw = [raw]
    for item in raw:
        schedulers += [s.strip() for s in str(item).split(",") if s.strip()]
    if not schedulers:
        raise ConfigError("at least one scheduler address is required (--scheduler HOST:PORT)")
    for s in schedulers:
        _check_address(s, "--scheduler")

    node_id = str(pick(args.node_id, "node_id") or socket.gethostname())
    listen = _check_address(str(pick(args.listen, "listen") or "0.0.0.0:7070"), "--listen")
    advertise = str(pick(args.advertise, "advertise") or "")
    if advertise:
        _check_address(advertise, "--advertise")
    data_dir = pick(args.data_dir, "data_dir")
    if not data_dir:
        raise ConfigError("a data directory is required (--data-dir)")
    try:
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        probe = Path(data_dir) / ".write-probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"data directory {data_dir!r} is not writable: {exc}") from None
    _check_data_dir_is_the_agents(Path(data_dir), os.geteuid())

    try:
        cpu = pick(args.cpu, "cpu")
        cpu_milli = parse_cpu(cpu, "--cpu") if cpu is not None else None
        memory = pick(args.memory, "memory")
        memory_mib = parse_memory(memory, "--memory") if memory is not None else None
    except SpecError as exc:
        raise ConfigError(str(exc)) from None

    mock = pick(args.mock_gpus, "mock_gpus")
    if mock is not None and (not isinstance(mock, int) or mock < 0):
        raise ConfigError("--mock-gpus: must be an integer >= 0")
    mock_nvlink = str(pick(args.mock_nvlink, "mock_nvlink") or "all")
    if mock is not None:
        try:
            discovery.parse_mock_nvlink(mock_nvlink, mock)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    elif pick(args.mock_nvlink, "mock_nvlink") is not None:
        raise ConfigError("--mock-nvlink needs --mock-gpus")

    image_runtime = str(pick(args.image_runtime, "image_runtime") or "")
    image_run_args = str(pick(args.image_run_args, "image_run_args") or "")
    cap_add = [*doc.get("image_cap_add", []), *args.image_cap_add]
    rootless = pick(args.rootless_runtime, "rootless_runtime") or False
    for flag, given in (
        ("--image-run-args", image_run_args),
        ("--image-cap-add", cap_add),
        ("--rootless-runtime", rootless),
    ):
        if given and not image_runtime:
            raise ConfigError(f"{flag} needs --image-runtime")

    features = [*doc.get("features", []), *args.feature]
    heartbeat = _seconds(
        pick(args.heartbeat_interval, "heartbeat_interval"), "--heartbeat-interval", 1.0
    )
    lease = _seconds(pick(args.lease_ttl, "lease_ttl"), "--lease-ttl", 4.0)
    if lease <= heartbeat:
        raise ConfigError("--lease-ttl must exceed --heartbeat-interval")
    run_as = _run_as(pick(args.run_as, "run_as"), os.geteuid() if euid is None else euid)
    if rootless and run_as is not RunAsMode.OWNER:
        raise ConfigError(
            "--rootless-runtime runs the runtime as each member's owner: it needs "
            "--run-as owner (and the agent running as root)"
        )
    image: ImageRuntime | None = None
    if image_runtime:
        try:
            image = ImageRuntime.parse(
                image_runtime,
                image_run_args,
                # Mock GPUs have no devices to hand to a container.
                gpu_devices=mock is None,
                cap_add=cap_add,
                rootless=rootless,
            )
        except ValueError as exc:
            raise ConfigError(f"--image-runtime: {exc}") from None
    try:
        user_map = parse_user_map(args.user_map or doc.get("user_map", {}))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if user_map and run_as is RunAsMode.AGENT:
        log.warning("--user-map has no effect: members run as this agent's user (--run-as agent)")
    allow_root = pick(args.allow_root_members, "allow_root_members") or False
    if not isinstance(allow_root, bool):
        raise ConfigError("allow_root_members: must be true or false")
    try:
        tls = tls_from(args, doc)
    except TlsError as exc:
        raise ConfigError(str(exc)) from None
    metrics_address = args.metrics_address or doc.get("metrics", {}).get("address", "")
    if metrics_address:
        try:
            parse_address(str(metrics_address), "metrics address")
        except AddressError as exc:
            raise ConfigError(str(exc)) from None
    return WorkerConfig(
        metrics_address=str(metrics_address),
        schedulers=tuple(dict.fromkeys(schedulers)),
        node_id=node_id,
        listen=listen,
        advertise=advertise,
        topology=parse_topology(str(pick(args.topology, "topology") or "")),
        data_dir=Path(data_dir).resolve(),
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        mock_gpus=mock,
        mock_nvlink=mock_nvlink,
        mock_gpu_model=str(pick(args.mock_gpu_model, "mock_gpu_model") or "mock-gpu"),
        image_runtime=image_runtime,
        image_run_args=image_run_args,
        features=tuple(sorted({str(f) for f in features})),
        heartbeat_interval_s=heartbeat,
        lease_ttl_s=lease,
        stop_grace_s=_seconds(pick(args.stop_grace, "stop_grace"), "--stop-grace", 5.0),
        fence_grace_s=_seconds(pick(args.fence_grace, "fence_grace"), "--fence-grace", 0.5),
        cgroups=not (args.no_cgroups or doc.get("no_cgroups", False)),
        cgroup_root=Path(str(pick(args.cgroup_root, "cgroup_root") or "/sys/fs/cgroup")),
        log_level=str(pick(args.log_level, "log_level") or "INFO").upper(),
        self_fencing=self_fencing,
        run_as=run_as,
        user_map=user_map,
        allow_root_members=allow_root,
        tls=tls,
        image=image,
    )


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


# ---------------------------------------------------------------------- running


def _warn_once() -> Any:
    said: set[str] = set()

    def warn(message: str) -> None:
        if message not in said:
            said.add(message)
            log.warning("%s", message)

    return warn


def run_as_policy(config: WorkerConfig) -> RunAsPolicy:
    return RunAsPolicy(
        mode=config.run_as,
        node_id=config.node_id,
        agent_user=agent_user_name(),
        user_map=config.user_map,
        allow_root_members=config.allow_root_members,
    )


def say_whose_account_members_use(config: WorkerConfig, run_as: RunAsPolicy) -> None:
    """Log, at every start, whose account members run under; in agent mode a WARNING
    that every job on this node shares one account (and, as root, that it is root)."""
    if run_as.mode is RunAsMode.OWNER:
        log.info(
            "members run as their job's owner (%d user-map entries; root members %s)",
            len(run_as.user_map),
            "allowed" if run_as.allow_root_members else "refused",
        )
        if config.tls is not None:
            _warn_about_a_shared_key(config.tls.key)
    else:
        log.warning(
            "members run as this agent's user %s: every job on this node shares that one "
            "account, so a member can read other members' files and this worker's key and "
            "act as this worker; for a node several users share, run the agent as root "
            "with --run-as owner%s",
            run_as.agent_user,
            " (as root, every member runs as root)" if os.geteuid() == 0 else "",
        )
    if config.image is not None:
        log.info(
            "containers run without privileges (no-new-privileges, every capability "
            "dropped%s); the runtime %s runs as %s",
            f" but {', '.join(config.image.cap_add)}" if config.image.cap_add else "",
            config.image.command[0],
            "each member's owner" if config.image.rootless else "root",
        )


def _warn_about_a_shared_key(key: Path) -> None:
    """Members run as their owners: the worker's key must be the agent's alone."""
    try:
        mode = stat.S_IMODE(key.stat().st_mode)
    except OSError:
        return  # the TLS layer says what is wrong with it
    if mode & 0o077:
        log.warning(
            "the worker's key %s is readable by others than its owner (mode %04o): whoever "
            "reads it can act as this worker; chmod 0600 %s",
            key,
            mode,
            key,
        )


def registration(config: WorkerConfig, advertise: str) -> pb.RegisterNodeRequest:
    warn = _warn_once()
    if config.mock_gpus is not None:
        gpus = discovery.mock_gpus(config.mock_gpus, config.mock_nvlink, config.mock_gpu_model)
    else:
        gpus = discovery.discover_gpus(discovery.load_nvml(), warn)
    features = set(config.features)
    if config.image_runtime:
        features.add(FEATURE_IMAGES)
    return pb.RegisterNodeRequest(
        node_id=config.node_id,
        address=advertise,
        capacity=pb.Resources(
            cpu_milli=config.cpu_milli if config.cpu_milli is not None else discovery.cpu_milli(),
            memory_mib=config.memory_mib
            if config.memory_mib is not None
            else discovery.memory_mib(),
            gpu=gpus.count,
        ),
        gpu_islands=[pb.RegisterNodeRequest.GpuIsland(gpus=list(i)) for i in gpus.islands],
        gpu_model=gpus.model,
        topology=[pb.TopologyLabel(level=k, value=v) for k, v in config.topology],
        features=sorted(features),
        members_run_as=run_as_policy(config).advertised(),
    )


def _lock_data_dir(data_dir: Path) -> int:
    fd = os.open(data_dir / "agent.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise ConfigError(f"another synapse-worker uses the data directory {data_dir}") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def run(config: WorkerConfig, stop: threading.Event) -> int:
    lock_fd = _lock_data_dir(config.data_dir)
    cgroups: CgroupLimiter | None = None
    if config.cgroups:
        cgroups, why = probe_cgroups(config.cgroup_root)
        if cgroups is None:
            log.warning("cpu/memory limits are not enforced: %s", why)
        else:
            log.info("%s", why)
    else:
        log.warning("cpu/memory limits are not enforced: cgroups disabled by configuration")

    lease_file = LeaseFile(config.data_dir / "lease")
    lease_file.revoke()
    run_as = run_as_policy(config)
    say_whose_account_members_use(config, run_as)
    executor = MemberExecutor(
        config.data_dir,
        lease_file.path,
        ExecutorSettings(
            stop_grace_s=config.stop_grace_s,
            fence_grace_s=config.fence_grace_s,
            self_fencing=config.self_fencing,
            run_as=run_as,
            fork_server=True,  # supervisors forked, not started as interpreters
        ),
        image_runtime=config.image,
        cgroups=cgroups,
    )
    recovered = executor.recover()
    for key, exit_ in recovered:
        log.warning("member %s from a previous life: %s", key, exit_.detail)

    server = new_worker_server()
    # The leader's nudges reach the agent through this box once it exists, and wake its
    # loop so a bound member starts without waiting for the next tick.
    wake = threading.Event()
    agents: list[Agent] = []

    def on_nudge(node_id: str) -> bool:
        accepted = bool(agents) and agents[0].nudge(node_id)
        if accepted:
            wake.set()
        return accepted

    transport = Transport(config.tls)
    add_worker_service(
        server, executor.root, on_nudge, LogAccess.for_transport(transport, config.node_id)
    )
    port = transport.add_port(server, config.listen)
    if port == 0:
        raise ConfigError(f"cannot listen on {config.listen}")
    server.start()
    listen_host = config.listen.rpartition(":")[0]
    advertise = config.advertise or (
        f"{listen_host if listen_host not in ('0.0.0.0', '::', '[::]') else socket.getfqdn()}"
        f":{port}"
    )
    request = registration(config, advertise)
    log.info(
        "node %s at %s: %d mCPU, %d MiB, %d GPU (%s) islands %s, features %s",
        config.node_id,
        advertise,
        request.capacity.cpu_milli,
        request.capacity.memory_mib,
        request.capacity.gpu,
        request.gpu_model or "-",
        [list(i.gpus) for i in request.gpu_islands],
        list(request.features) or "-",
    )
    client = ClusterClient(
        config.schedulers,
        channel_factory=transport.channel,
        credentials_version=transport.version,
        timeout_s=config.heartbeat_interval_s,
        per_try_timeout_s=min(1.0, config.heartbeat_interval_s),
        max_backoff_s=0.2,
    )
    metrics = WorkerMetrics(
        config.node_id, nvml=discovery.load_nvml() if config.mock_gpus is None else None
    )
    observe = (
        ObserveServer(config.metrics_address, metrics.registry, config.tls)
        if config.metrics_address
        else None
    )
    if observe is not None:
        observe.start()
        log.info("metrics at %s", observe.metrics_url)

    # Heartbeat streams: a leader that offers one gets heartbeats on a stream
    # and pushes desired members on it; an older one keeps getting unary heartbeats.
    def on_push(desired: list[pb.DesiredMember]) -> None:
        if agents:
            agents[0].push(desired)
            wake.set()

    control = StreamControlPlane(GrpcControlPlane(client), transport.channel, on_push)
    agent = Agent(
        request,
        MeteredControlPlane(control, metrics),
        MeteredExecutor(executor, metrics),
        time.monotonic,
        lease_file=lease_file,
        timings=AgentTimings(config.heartbeat_interval_s, config.lease_ttl_s),
        self_fencing=config.self_fencing,
    )
    if not config.self_fencing:
        log.critical(
            "SELF-FENCING IS DISABLED (%s): a test-only, unsafe build", UNSAFE_NO_SELF_FENCING_ENV
        )
    agent.add_recovered(recovered)
    agents.append(agent)
    last = ""
    try:
        while not stop.is_set():
            wake.clear()
            sentence = agent.step()
            if sentence and sentence != last:
                log.info("%s", sentence)
            last = sentence or last
            wake.wait(min(TICK_S, agent.next_wakeup_in()))
    finally:
        log.info("stopping: %s", agent.shutdown(lambda: executor.stop_all(config.stop_grace_s)))
        executor.close()
        with contextlib.suppress(OSError):  # a full disk: the supervisors are gone anyway
            lease_file.revoke()
        server.stop(grace=0.5).wait(1.0)
        if observe is not None:
            observe.stop()
        control.close()
        client.close()
        os.close(lock_fd)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = load_config(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"synapse-worker: {exc}", file=sys.stderr)
        return 2
    logging.getLogger().setLevel(config.log_level)
    if config.tls is None:
        log.warning("%s", INSECURE_WARNING)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        log.info("received %s; stopping members", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return run(config, stop)
    except ConfigError as exc:
        print(f"synapse-worker: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
