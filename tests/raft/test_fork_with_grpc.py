"""A replica forks a child for every snapshot while its gRPC threads serve calls. gRPC's
own fork handlers would hold that fork until gRPC's threads stop, and those wait for the
interpreter lock the forking thread holds: the replica froze for good (no answer, no
heartbeat, not even to SIGTERM). The package turns the handlers off before grpc loads."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import grpc
import pytest

from synapse_ha.client.cluster import ClusterUnavailable
from tests.integration.cluster import LocalCluster, job_spec

# Records the variable at the moment grpc is first imported, imports the entry point,
# then prints that value and the variable as the program's children would inherit it.
_PROBE = textwrap.dedent(
    """
    import importlib, importlib.abc, os, sys
    seen = []
    class Watch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "grpc" and not seen:
                seen.append(os.environ.get("GRPC_ENABLE_FORK_SUPPORT", "<unset>"))
            return None
    sys.meta_path.insert(0, Watch())
    importlib.import_module(sys.argv[1])
    print(seen[0] if seen else "<grpc never imported>")
    print(os.environ.get("GRPC_ENABLE_FORK_SUPPORT", "<unset>"))
    """
)


@pytest.mark.parametrize("given", [None, "1"])
@pytest.mark.parametrize("program", ["synapse_ha.programs.scheduler", "synapse_ha.programs.worker"])
def test_grpc_loads_with_its_fork_handlers_off(program: str, given: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    if given is not None:
        env["GRPC_ENABLE_FORK_SUPPORT"] = given
    seen = subprocess.run(
        [sys.executable, "-c", _PROBE, program],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=env,
    )
    at_import, inherited = seen.stdout.split()
    assert at_import == "false", seen.stderr
    # Members of user jobs inherit the environment the program was given.
    assert inherited == (given or "<unset>")


@pytest.mark.integration
def test_replicas_keep_answering_while_they_fork_snapshots_under_load(tmp_path: Path) -> None:
    """Two submission streams and a snapshot every 20 entries on every replica; each
    replica answers its status every moment (before the fix one froze within seconds)."""
    cluster = LocalCluster(tmp_path, extra_args=["--compaction-entries", "20"])
    stop = threading.Event()
    acked = [0, 0]

    def submit(k: int) -> None:
        with cluster.client(timeout_s=10.0, per_try_timeout_s=2.0) as client:
            i = 0
            while not stop.is_set():
                try:
                    client.submit_job(job_spec(f"s{k}-{i}"), request_id=f"s{k}-{i}")
                except (ClusterUnavailable, grpc.RpcError):
                    continue
                acked[k] += 1
                i += 1

    streams = [threading.Thread(target=submit, args=(k,), daemon=True) for k in (0, 1)]
    try:
        cluster.start()
        cluster.serving_leader()
        for t in streams:
            t.start()
        silent_since: dict[str, float] = {}
        worst = {r.replica_id: 0.0 for r in cluster.replicas}
        end = time.monotonic() + 8.0
        while time.monotonic() < end:
            for r in cluster.replicas:
                now = time.monotonic()
                try:
                    cluster.local_status(r, timeout_s=2.0)
                except grpc.RpcError:
                    silent_since.setdefault(r.replica_id, now)
                    worst[r.replica_id] = max(worst[r.replica_id], now - silent_since[r.replica_id])
                else:
                    silent_since.pop(r.replica_id, None)
            time.sleep(0.1)
    finally:
        stop.set()
        for t in streams:
            t.join(timeout=30.0)
        cluster.close()
    snapshots = sum(r.log_path.read_text().count("snapshot at log index") for r in cluster.replicas)
    assert sum(acked) >= 100, acked
    assert snapshots >= 6, snapshots  # every replica forked several writers
    # A replica may miss a status call while the machine is busy; it is never gone.
    assert all(w < 5.0 for w in worst.values()), (worst, cluster.logs())
