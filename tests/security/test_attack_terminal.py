"""A job attacks the terminal of whoever looks at it, on real processes (a TLS replica
and a worker on 127.0.0.1): a plain ``user`` writes terminal control sequences into its
job's output and into its job's reason (the cancel reason it gives), and an admin
then runs ``synctl logs``, ``status``, ``jobs``, ``explain`` and ``events`` in a real
terminal (a pseudo-terminal, so synctl knows it writes to one). The sequences retitle
the window (OSC 0), clear the screen (CSI 2J, also as the one-byte C1 CSI), and rewrite
the line with carriage returns and backspaces; the admin's terminal must receive none of
them, and see them written out instead. Only ``synctl logs --raw`` passes them.
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
import tty
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.client.credentials import CLUSTER_ENV
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.cli.conftest import CREDENTIAL_VARIABLES, exported
from tests.integration.cluster import LocalCluster, wait_for
from tests.worker.workers import LocalWorkers

pytestmark = pytest.mark.integration

# What the job prints (printf under /bin/sh): a new window title and a bell, a cleared
# screen, a line whose start is overwritten by a carriage return, backspaces, C1 CSI.
PRINTF = r"printf 'title\033]0;pwned\007clear\033[2Jdone\rOK  \b\b\302\23331m\n'"
OUTPUT = "title\x1b]0;pwned\x07clear\x1b[2Jdone\rOK  \b\b\x9b31m"
OUTPUT_SHOWN = "title\\x1b]0;pwned\\x07clear\\x1b[2Jdone\\rOK  \\b\\b\\x9b31m"
# The reason the owner gives when it cancels its job: the same tricks, and a newline that
# would start a fake line of the table.
REASON = "\x1b]0;pwned\x07\x1b[2Jquota\rall fine\b\b\nSTATE:         SUCCEEDED"
REASON_SHOWN = "\\x1b]0;pwned\\x07\\x1b[2Jquota\\rall fine\\b\\b\\nSTATE:         SUCCEEDED"
# Bytes a terminal acts on: ESC, BEL, CR, BS, and C1 CSI as UTF-8.
ACTIVE = (b"\x1b", b"\x07", b"\r", b"\x08", b"\xc2\x9b")
WAIT_S = 60.0


@dataclass
class Scene:
    cluster: LocalCluster
    env: dict[str, str]  # the admin's synctl environment
    printed: str  # job id: its member printed OUTPUT
    cancelled: str  # job id: its owner cancelled it with REASON


def in_terminal(env: dict[str, str], *args: str) -> tuple[int, bytes]:
    """Run synctl with stdout and stderr on a pseudo-terminal (raw: no output
    processing, so these are the bytes synctl wrote); its exit code and everything the
    terminal received."""
    controller, terminal = pty.openpty()
    tty.setraw(terminal)
    process = subprocess.Popen(
        [sys.executable, "-m", "synapse_ha.cli", *args],
        stdin=subprocess.DEVNULL,
        stdout=terminal,
        stderr=terminal,
        env=env,
        start_new_session=True,
    )
    os.close(terminal)
    received = bytearray()
    deadline = time.monotonic() + WAIT_S
    try:
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([controller], [], [], left)
            if not ready:
                break
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not chunk:
                break
            received += chunk
        code = process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        os.close(controller)
    return code, bytes(received)


def assert_inert(received: bytes, what: str) -> None:
    found = [b for b in ACTIVE if b in received]
    assert not found, f"{what}: the terminal received {found}: {received!r}"


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    root = tmp_path_factory.mktemp("terminal-attack")
    cluster = LocalCluster(root / "cluster", size=1)
    workers = LocalWorkers(root / "workers", cluster.grpc_addresses, cluster.credentials)
    workers.root.mkdir()
    try:
        cluster.start()
        cluster.serving_leader(timeout_s=WAIT_S)
        workers.start("w1", "--cpu", "4", "--memory", "4Gi", "--mock-gpus", "0")
        assert cluster.credentials is not None
        with cluster.client(timeout_s=WAIT_S) as admin:
            wait_for(
                "w1 ready",
                lambda: [n for n in admin.list_nodes() if n.status == "ready"],
                timeout_s=WAIT_S,
            )
            alice_token = admin.create_token(user="alice", role="user").token
        with cluster.client(timeout_s=WAIT_S, token=alice_token) as alice:
            printed, cancelled = _attack(alice)
        env = {k: v for k, v in os.environ.items() if k not in CREDENTIAL_VARIABLES}
        env.update(exported(cluster.credentials.exports()))
        env.update(
            {CLUSTER_ENV: ",".join(cluster.grpc_addresses), "XDG_CONFIG_HOME": "/nonexistent"}
        )
        yield Scene(cluster, env, printed, cancelled)
    finally:
        workers.close()
        cluster.close()


def _attack(alice: ClusterClient) -> tuple[str, str]:
    """Alice's part: a job that prints the sequences, and one she cancels with them."""

    def spec(name: str, command: str) -> pb.JobSpec:
        return pb.JobSpec(
            name=name,
            replicas=1,
            resources=pb.Resources(cpu_milli=100, memory_mib=64),
            shell_command=command,
        )

    printed = alice.submit_job(spec("printer", PRINTF)).job_id
    cancelled = alice.submit_job(spec("sleeper", "exec sleep 600")).job_id
    wait_for(
        "the printer to succeed",
        lambda: alice.get_job(printed).state == "SUCCEEDED",
        timeout_s=WAIT_S,
    )
    wait_for(
        "the sleeper to run",
        lambda: alice.get_job(cancelled).state == "RUNNING",
        timeout_s=WAIT_S,
    )
    alice.cancel_job(cancelled, REASON)
    wait_for(
        "the sleeper to be cancelled",
        lambda: alice.get_job(cancelled).state == "CANCELLED",
        timeout_s=WAIT_S,
    )
    return printed, cancelled


def test_a_jobs_output_reaches_the_terminal_escaped(scene: Scene) -> None:
    for args in (("logs", scene.printed), ("logs", scene.printed, "--member", "0")):
        code, received = in_terminal(scene.env, *args)
        assert code == 0, received
        assert_inert(received, " ".join(args))
        assert OUTPUT_SHOWN.encode() in received, received
    # Only on request, the bytes as the member wrote them (to a file, a pipe, a pager).
    code, raw = in_terminal(scene.env, "logs", scene.printed, "--member", "0", "--raw")
    assert code == 0
    assert OUTPUT.encode() in raw


@pytest.mark.parametrize(
    "command",
    [("status",), ("jobs", "--all"), ("explain",), ("events",)],
    ids=lambda c: c[0],
)
def test_a_jobs_reason_reaches_the_terminal_escaped(scene: Scene, command: tuple[str, ...]) -> None:
    args = (*command, scene.cancelled) if command[0] in ("status", "explain") else command
    code, received = in_terminal(scene.env, *args)
    assert code == 0, received
    assert_inert(received, " ".join(args))
    shown = REASON_SHOWN if command[0] != "jobs" else REASON_SHOWN[:40]  # a shortened column
    assert shown.encode() in received, received
    # The layout is intact: the reason's newline started no line of its own.
    assert b"\nSTATE:         SUCCEEDED" not in received, received
