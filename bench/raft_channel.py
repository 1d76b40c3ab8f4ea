"""What the Raft channel costs the replicas: pysyncobj's password channel (pickle +
Fernet) against mutual TLS with the schema encoding (synapse_ha.raft.tls_transport).

For each channel, three replicas (RaftReplica, no gRPC) run as processes of their own on
127.0.0.1. Once one leads, it proposes ``--entries`` barriers, ``--in-flight`` at a time
(group commit puts several into one log entry, as under load), each carrying
``--payload`` bytes. The CPU time (user + system, from /proc) of the leader and of the
followers is read just before and just after, and divided by the log entries committed
in between and by the proposals. Both channels run in one invocation, one after the
other; the load average around each is recorded.

Prints one JSON object and writes it to ``bench/results/raft_channel.json`` (``--out``;
``--smoke`` runs a tiny version and writes only where ``--out`` says).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synapse_ha.core import commands as cmd
from synapse_ha.core.identity.access import replica
from synapse_ha.local.ports import reserve_ports
from synapse_ha.raft.replica import RaftReplica
from synapse_ha.security.bundle import new_raft_password
from synapse_ha.security.pki import init_ca, issue
from synapse_ha.security.tls import TlsFiles

RESULT = Path(__file__).resolve().parent / "results" / "raft_channel.json"
CHANNELS = ("password", "tls")
_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime


def member(spec: dict[str, Any]) -> None:
    """One replica: reports its role and log index to ``status``; when it leads and the
    file ``go`` appears, proposes the workload and writes ``done``."""
    files = None
    if spec["channel"] == "tls":
        files = TlsFiles(**{k: Path(v) for k, v in spec["tls"].items()})
    node = RaftReplica(
        spec["address"],
        spec["peers"],
        spec["data"],
        spec["password"],
        secure=True,
        raft_tls=files,
    )
    status, go, done = Path(spec["status"]), Path(spec["go"]), Path(spec["done"])
    payload = "x" * spec["payload"]
    deadline = time.monotonic() + spec["lifetime_s"]
    try:
        while time.monotonic() < deadline:
            leads = node.is_leader()
            report = {"leader": leads, "index": node.status().commit_index}
            status.with_suffix(".new").write_text(json.dumps(report))
            os.replace(status.with_suffix(".new"), status)
            if leads and go.exists() and not done.exists():
                failed = _propose(node, spec["entries"], spec["in_flight"], payload)
                report = {"index": node.status().commit_index, "failed": failed}
                done.with_suffix(".new").write_text(json.dumps(report))
                os.replace(done.with_suffix(".new"), done)  # never read half-written
            time.sleep(0.05)
    finally:
        node.stop()


def _propose(node: RaftReplica, entries: int, in_flight: int, payload: str) -> int:
    """Propose ``entries`` barriers, ``in_flight`` at a time; how many failed (an
    election on a loaded machine)."""
    sent = failed = 0
    while sent < entries:
        wave = [
            node.propose(cmd.Barrier(f"{payload}{sent + i}"))
            for i in range(min(in_flight, entries - sent))
        ]
        for future in wave:
            try:
                future.result(30.0)
            except Exception:
                failed += 1
        sent += len(wave)
    return failed


def run_channel(channel: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    addresses = [f"127.0.0.1:{p}" for p in reserve_ports(3)]
    init_ca(root / "ca")
    password = new_raft_password()
    go, done = root / "go", root / "done"
    processes = []
    try:
        for i, address in enumerate(addresses):
            certs = issue(root / "ca", replica(f"r{i}"), root / f"cert{i}")
            data = root / f"r{i}"
            data.mkdir()
            spec = {
                "channel": channel,
                "address": address,
                "peers": addresses,
                "data": str(data),
                "password": password,
                "tls": {"ca": str(certs.ca), "cert": str(certs.cert), "key": str(certs.key)},
                "status": str(root / f"r{i}.json"),
                "go": str(go),
                "done": str(done),
                "entries": args.entries,
                "in_flight": args.in_flight,
                "payload": args.payload,
                "lifetime_s": 600.0,
            }
            processes.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--member", json.dumps(spec)],
                    stdin=subprocess.PIPE,
                )
            )
        leader = _wait_leader(processes, root)
        time.sleep(1.0)  # the followers connected and caught up
        before = {p.pid: _cpu_s(p.pid) for p in processes}
        index_before = json.loads((root / f"r{leader}.json").read_text())["index"]
        load_before = os.getloadavg()[0]
        started = time.monotonic()
        go.write_text("go")
        _wait(lambda: done.exists(), 600.0)
        elapsed = time.monotonic() - started
        after = {p.pid: _cpu_s(p.pid) for p in processes}
        finished = json.loads(done.read_text())
        committed = finished["index"] - index_before
    finally:
        for p in processes:
            p.terminate()
        for p in processes:
            p.wait(30.0)
    leader_pid = processes[leader].pid
    leader_cpu = after[leader_pid] - before[leader_pid]
    followers_cpu = [after[p] - before[p] for p in before if p != leader_pid]
    return {
        "log_entries": committed,
        "proposals": args.entries,
        "failed_proposals": finished["failed"],
        "seconds": round(elapsed, 3),
        "proposals_per_s": round(args.entries / elapsed, 1),
        "leader_cpu_s": round(leader_cpu, 3),
        "leader_cpu_us_per_entry": round(1e6 * leader_cpu / max(committed, 1), 1),
        "leader_cpu_us_per_proposal": round(1e6 * leader_cpu / args.entries, 1),
        "follower_cpu_us_per_entry": round(1e6 * max(followers_cpu) / max(committed, 1), 1),
        "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def _wait_leader(processes: list[subprocess.Popen[bytes]], root: Path) -> int:
    found: list[int] = []

    def leads() -> bool:
        for i in range(len(processes)):
            try:
                if json.loads((root / f"r{i}.json").read_text())["leader"]:
                    found.append(i)
                    return True
            except (OSError, ValueError):
                pass
        return False

    _wait(leads, 60.0)
    return found[0]


def _wait(probe: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            raise TimeoutError("the replicas did not get there in time")
        time.sleep(0.05)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="a tiny run (seconds)")
    p.add_argument("--entries", type=int, default=20_000)
    p.add_argument("--in-flight", type=int, default=32)
    p.add_argument("--payload", type=int, default=200, help="bytes per proposal")
    p.add_argument("--out", type=Path, help=f"where to write the JSON (default {RESULT})")
    p.add_argument("--member", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.member:
        member(json.loads(args.member))
        return
    if args.smoke:
        args.entries = 200
    results: dict[str, Any] = {"smoke": args.smoke}
    for channel in CHANNELS:
        with tempfile.TemporaryDirectory(prefix=f"raft-{channel}-") as root:
            results[channel] = run_channel(channel, args, Path(root))
    old, new = results["password"], results["tls"]
    results["leader_cpu_per_entry_tls_over_password"] = round(
        new["leader_cpu_us_per_entry"] / max(old["leader_cpu_us_per_entry"], 1e-9), 3
    )
    text = json.dumps(results, indent=2)
    print(text)
    out = args.out if args.out is not None else (None if args.smoke else RESULT)
    if out is not None:
        out.write_text(text + "\n")


if __name__ == "__main__":
    main()
