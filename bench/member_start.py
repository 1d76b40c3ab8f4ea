"""Member start cost on one node: a supervisor forked from the fork server against one
started as a new interpreter (``python -I -S shim.py``).

Starts ``--members`` members (``true``) through :class:`MemberExecutor` each way and
reports, per member, the CPU time of the agent's side (this process) and of the
supervisors and members (for forked supervisors, from the fork server's ``/proc`` times,
which include its reaped children; otherwise from this process's reaped children), plus
the wall time from the first start call until every member's first act (writing the
time to a file); as root, also forked supervisors that start each member in a PID
namespace of its own (``fork_server_pid_namespace``). Prints one JSON object;
``--smoke`` starts a few members.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synapse_ha.core.desired import DesiredMember, LaunchSpec
from synapse_ha.worker.lease import LeaseFile
from synapse_ha.worker.members import ExecutorSettings, MemberExecutor

TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def _proc_cpu_s(pid: int) -> float:
    """utime + stime + cutime + cstime of ``pid`` (its reaped children included)."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        stat = f.read()
    fields = stat[stat.rfind(")") + 2 :].split()
    return sum(int(v) for v in fields[11:15]) * TICK_S


def _usage_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _spec(rank: int, stamps: Path) -> DesiredMember:
    return DesiredMember(
        job_id="bench",
        attempt=1,
        fencing_token=1,
        rank=rank,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        gpus=(),
        master_addr="127.0.0.1",
        master_port=29500,
        member_hosts=("127.0.0.1",),
        spec=LaunchSpec(command=(f"date +%s.%N > {stamps}/$RANK",)),
    )


def measure(members: int, fork_server: bool, pid_namespace: bool = False) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="synapse-member-start-") as tmp:
        root = Path(tmp)
        stamps = root / "stamps"
        stamps.mkdir()
        lease = LeaseFile(root / "lease")
        lease.write(time.monotonic() + 3600)
        executor = MemberExecutor(
            root,
            lease.path,
            ExecutorSettings(
                fork_server=fork_server, fence_grace_s=0.2, pid_namespace=pid_namespace
            ),
        )
        try:
            server = executor.fork_server_pid
            time.sleep(0.2)  # let the fork server settle before counting
            server_before = _proc_cpu_s(server) if server else 0.0
            agent_before = _usage_s(resource.RUSAGE_SELF)
            children_before = _usage_s(resource.RUSAGE_CHILDREN)
            started = time.time()
            started_members = [executor.start(_spec(r, stamps)) for r in range(members)]
            agent_s = _usage_s(resource.RUSAGE_SELF) - agent_before
            deadline = time.monotonic() + 120
            while len(list(stamps.iterdir())) < members or any(
                p.stat().st_size == 0 for p in stamps.iterdir()
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("members did not start in time")
                time.sleep(0.002)
            last = max(float(p.read_text()) for p in stamps.iterdir())
            for member in started_members:
                assert member.shim is not None
                member.shim.wait(timeout=60)
            time.sleep(0.2)  # the fork server reaps its children every 50 ms
            children_s = _usage_s(resource.RUSAGE_CHILDREN) - children_before
            if server:
                children_s += _proc_cpu_s(server) - server_before
        finally:
            executor.kill_all("benchmark over")
            executor.close()
    return {
        "agent_cpu_ms_per_member": round(1000 * agent_s / members, 2),
        "supervisor_and_member_cpu_ms_per_member": round(1000 * children_s / members, 2),
        "all_started_ms": round(1000 * (last - started), 1),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="a few members")
    p.add_argument("--members", type=int, default=40)
    args = p.parse_args()
    members = 4 if args.smoke else args.members
    report = {
        "benchmark": "member_start",
        "members": members,
        "fork_server": measure(members, fork_server=True),
        "interpreter_per_member": measure(members, fork_server=False),
    }
    if os.geteuid() == 0:  # a PID namespace per member needs root (worker/pidns.py)
        report["fork_server_pid_namespace"] = measure(members, fork_server=True, pid_namespace=True)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
