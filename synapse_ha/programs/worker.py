"""``synapse-worker``: the node agent's composition root.

Its configuration comes from flags and/or a TOML file (:mod:`.worker_config`). It runs in
the foreground; SIGTERM or SIGINT stops every member gracefully, reports their exits when
a leader answers, and exits. Members are supervised by per-member shims
(:mod:`synapse_ha.worker.shim`) that kill them when the lease lapses even if this process
is killed or frozen.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.model import FEATURE_IMAGES
from synapse_ha.observe.http import ObserveServer
from synapse_ha.observe.metrics import MeteredControlPlane, MeteredExecutor, WorkerMetrics
from synapse_ha.programs.config_file import ConfigError, load_program_config, stop_on_signals
from synapse_ha.programs.worker_config import (
    UNSAFE_NO_SELF_FENCING_ENV,
    WorkerConfig,
    load_config,
)
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.security.tls import Transport
from synapse_ha.worker import discovery
from synapse_ha.worker.accounts import RunAsMode, RunAsPolicy, agent_user_name
from synapse_ha.worker.agent import Agent, AgentTimings, GrpcControlPlane
from synapse_ha.worker.cgroups import CgroupLimiter, probe_cgroups
from synapse_ha.worker.gpu_clocks import ClocksProbe
from synapse_ha.worker.gpu_health import GpuHealthMonitor, health_monitor
from synapse_ha.worker.health_check import HealthCheck
from synapse_ha.worker.isolation import (
    IsolationRefused,
    MemberIsolation,
    decide_isolation,
    probe_pid_namespace,
)
from synapse_ha.worker.lease import LeaseFile
from synapse_ha.worker.logs import LogAccess, add_worker_service, new_worker_server
from synapse_ha.worker.members import ExecutorSettings, MemberExecutor
from synapse_ha.worker.stream import StreamControlPlane

log = logging.getLogger("synapse.worker")

TICK_S = 0.02


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


def member_isolation(
    config: WorkerConfig,
    euid: int | None = None,
    probe: Callable[[], str] = probe_pid_namespace,
) -> MemberIsolation:
    """Whether members get PID namespaces of their own here, said at every start; a
    worker running members as their owners where they cannot refuses to start (a
    ConfigError) unless the operator allowed it. ``euid`` stands for this process's
    effective uid and ``probe`` for :func:`probe_pid_namespace` (tests give them)."""
    euid = os.geteuid() if euid is None else euid
    try:
        isolation = decide_isolation(config.run_as, euid, config.allow_shared_pid_namespace, probe)
    except IsolationRefused as exc:
        raise ConfigError(str(exc)) from None
    if isolation.pid_namespace:
        log.info("each member runs in a PID namespace of its own: it sees only its processes")
    elif config.run_as is RunAsMode.OWNER:
        log.warning(
            "members share this node's PID namespace (%s): every member sees every process "
            "of the node, other users' command lines too (--allow-shared-pid-namespace)",
            isolation.why_shared,
        )
    else:
        log.info("members share this node's PID namespace: %s", isolation.why_shared)
    return isolation


def registration(
    config: WorkerConfig, advertise: str, isolation: MemberIsolation | None = None
) -> pb.RegisterNodeRequest:
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
        member_isolation=isolation.advertised if isolation is not None else "",
        boot_id=config.gpu_health.boot_id(),
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


class _AgentBox:
    """The agent once it exists, for the leader's nudges and pushes: each wakes the
    agent's loop, so a bound member starts without waiting for the next tick."""

    def __init__(self) -> None:
        self.wake = threading.Event()
        self.agent: Agent | None = None

    def nudge(self, node_id: str) -> bool:
        accepted = self.agent is not None and self.agent.nudge(node_id)
        if accepted:
            self.wake.set()
        return accepted

    def push(self, desired: list[pb.DesiredMember]) -> None:
        if self.agent is not None:
            self.agent.push(desired)
            self.wake.set()


def _cgroup_limiter(config: WorkerConfig) -> CgroupLimiter | None:
    """The cgroup v2 limiter members' cpu and memory are held to; None (said) without."""
    if not config.cgroups:
        log.warning("cpu/memory limits are not enforced: cgroups disabled by configuration")
        return None
    cgroups, why = probe_cgroups(config.cgroup_root)
    if cgroups is None:
        log.warning("cpu/memory limits are not enforced: %s", why)
    else:
        log.info("%s", why)
    return cgroups


def _member_executor(
    config: WorkerConfig,
    lease_file: LeaseFile,
    cgroups: CgroupLimiter | None,
    isolation: MemberIsolation,
) -> MemberExecutor:
    run_as = run_as_policy(config)
    say_whose_account_members_use(config, run_as)
    return MemberExecutor(
        config.data_dir,
        lease_file.path,
        ExecutorSettings(
            stop_grace_s=config.stop_grace_s,
            fence_grace_s=config.fence_grace_s,
            self_fencing=config.self_fencing,
            run_as=run_as,
            fork_server=True,  # supervisors forked, not started as interpreters
            member_env_passthrough=config.member_env_passthrough,
            pid_namespace=isolation.pid_namespace,
        ),
        image_runtime=config.image,
        cgroups=cgroups,
    )


def _serve_logs(
    config: WorkerConfig, executor: MemberExecutor, box: _AgentBox
) -> tuple[grpc.Server, Transport, str]:
    """The worker service (members' logs, the leader's nudges) started, its transport,
    and the address this node is reached at."""
    server = new_worker_server()
    transport = Transport(config.tls)
    add_worker_service(
        server, executor.root, box.nudge, LogAccess.for_transport(transport, config.node_id)
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
    return server, transport, advertise


def _say_what_this_node_offers(
    config: WorkerConfig, advertise: str, request: pb.RegisterNodeRequest
) -> None:
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


def _cluster_client(config: WorkerConfig, transport: Transport) -> ClusterClient:
    return ClusterClient(
        config.schedulers,
        channel_factory=transport.channel,
        credentials_version=transport.version,
        timeout_s=config.heartbeat_interval_s,
        per_try_timeout_s=min(1.0, config.heartbeat_interval_s),
        max_backoff_s=0.2,
    )


def _observe_server(config: WorkerConfig, metrics: WorkerMetrics) -> ObserveServer | None:
    """/metrics served and started, or None when no address is configured."""
    if not config.metrics_address:
        return None
    observe = ObserveServer(config.metrics_address, metrics.registry, config.tls)
    observe.start()
    log.info("metrics at %s", observe.metrics_url)
    return observe


def _gpu_health_monitor(config: WorkerConfig, request: pb.RegisterNodeRequest) -> GpuHealthMonitor:
    """The GPU health monitor of this node's GPUs, started (before registering, so that
    a fault seen from then on is in the first heartbeat)."""
    monitor = health_monitor(
        config.gpu_health,
        request.capacity.gpu,
        mock_gpus=config.mock_gpus is not None,
        load_nvml=discovery.load_nvml,
    )
    monitor.start()
    if not config.gpu_health.enabled:
        log.warning("GPU health is not watched: disabled by configuration")
    elif config.gpu_health.mock_faults is not None:
        log.info("mock GPU faults are read from %s", config.gpu_health.mock_faults)
    return monitor


def _gpu_clocks_probe(config: WorkerConfig, changed: Callable[[], None]) -> ClocksProbe:
    """The probe of GPU clocks held down by the hardware (the ``gpu-clocks`` check),
    started; none with mock GPUs or with GPU health watching turned off."""
    real = config.mock_gpus is None and config.gpu_health.enabled
    probe = ClocksProbe(discovery.load_nvml() if real else None, changed=changed)
    probe.start()
    return probe


def _step_until(stop: threading.Event, agent: Agent, wake: threading.Event) -> None:
    """The agent's loop: a step, then a wait until its next wake-up, a nudge or a push;
    each new sentence the agent says is logged once."""
    last = ""
    while not stop.is_set():
        wake.clear()
        sentence = agent.step()
        if sentence and sentence != last:
            log.info("%s", sentence)
        last = sentence or last
        wake.wait(min(TICK_S, agent.next_wakeup_in()))


def run(config: WorkerConfig, stop: threading.Event) -> int:
    lock_fd = _lock_data_dir(config.data_dir)
    cgroups = _cgroup_limiter(config)
    lease_file = LeaseFile(config.data_dir / "lease")
    lease_file.revoke()
    isolation = member_isolation(config)
    executor = _member_executor(config, lease_file, cgroups, isolation)
    recovered = executor.recover()
    for key, exit_ in recovered:
        log.warning("member %s from a previous life: %s", key, exit_.detail)
    # The leader's nudges and pushes reach the agent through this box once it exists.
    box = _AgentBox()
    server, transport, advertise = _serve_logs(config, executor, box)
    request = registration(config, advertise, isolation)
    _say_what_this_node_offers(config, advertise, request)
    client = _cluster_client(config, transport)
    metrics = WorkerMetrics(
        config.node_id, nvml=discovery.load_nvml() if config.mock_gpus is None else None
    )
    observe = _observe_server(config, metrics)
    # Heartbeat streams: a leader that offers one gets heartbeats on a stream
    # and pushes desired members on it; an older one keeps getting unary heartbeats.
    control = StreamControlPlane(
        GrpcControlPlane(client),
        transport.channel,
        box.push,
        on_silent=lambda: client.suspect(client.leader_hint),
    )
    gpu_health = _gpu_health_monitor(config, request)
    # Its first result reaches the leader in the heartbeat after it ends.
    health_check = HealthCheck(config.health_check, changed=box.wake.set)
    health_check.start()
    clocks = _gpu_clocks_probe(config, box.wake.set)
    agent = Agent(
        request,
        MeteredControlPlane(control, metrics),
        MeteredExecutor(executor, metrics),
        time.monotonic,
        lease_file=lease_file,
        timings=AgentTimings(config.heartbeat_interval_s, config.lease_ttl_s),
        self_fencing=config.self_fencing,
        gpu_faults=gpu_health.faults,
        node_checks=lambda: (*health_check.checks(), *clocks.checks()),
        checkpoint_marks=executor.marks,
        member_paces=executor.paces,
    )
    if not config.self_fencing:
        log.critical(
            "SELF-FENCING IS DISABLED (%s): a test-only, unsafe build", UNSAFE_NO_SELF_FENCING_ENV
        )
    agent.add_recovered(recovered)
    box.agent = agent
    try:
        _step_until(stop, agent, box.wake)
    finally:
        log.info("stopping: %s", agent.shutdown(lambda: executor.stop_all(config.stop_grace_s)))
        gpu_health.stop()
        health_check.stop()
        clocks.stop()
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
    config = load_program_config("synapse-worker", load_config, argv, log)
    if config is None:
        return 2
    stop = stop_on_signals(log, "stopping members")
    try:
        return run(config, stop)
    except ConfigError as exc:
        print(f"synapse-worker: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
