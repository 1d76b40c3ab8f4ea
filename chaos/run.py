"""One chaos scenario end to end: build the network, start the cluster and the workload,
play the nemesis schedule, heal, quiesce, collect the replicas' states and check.

:func:`run_scenario` owns everything it creates: namespaces, links, the nftables table and
every process are removed in its ``finally`` (and swept before it starts, in case an
earlier run crashed). The caller holds :func:`chaos.net.machine_lock`, so that only one
run uses the machine at a time.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc

from chaos import gpufaults, hosts, ledger, nemesis, net, nodefaults, slowfaults
from chaos.checker import Violation, check_run
from chaos.cluster import ChaosCluster, InsecureCluster, ScenarioConfig, SinkFailed
from chaos.history import JOB_HISTORY
from chaos.nemesis import Step
from chaos.play import Nemesis
from synapse_ha.client.cluster import ClusterUnavailable
from synapse_ha.core.codec.versioned import decode_state
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.states import attempt_state, job_state

log = logging.getLogger("chaos")

# After the heal the cluster drains its backlog: the run waits while jobs keep finishing
# and gives up when none has for FINAL_STALL_S (a healed cluster that finishes nothing
# for that long is stuck; between finishes it takes a few seconds), or at the cap,
# FINAL_DEADLINE_S per unit of lane load (a five-lane soak leaves hundreds of jobs).
FINAL_STALL_S = 60.0
FINAL_DEADLINE_S = 270.0


def lane_load(lanes: int) -> float:
    """How much longer the final cap and the gap between submissions are with
    ``lanes`` fault schedules at once: each worker lane keeps some workers faulted, so the
    cluster completes fewer gangs a second, and the same submission rate would leave a
    backlog no deadline drains (one lane: 1; three: 2)."""
    return (lanes + 1) / 2


CONVERGE_S = 30.0
HISTORY_LIMIT = 10_000  # the most ListHistory answers


@dataclass
class ScenarioResult:
    name: str
    seed: int
    run_dir: Path
    faults: int
    jobs: int
    violations: list[Violation]
    expect_violations: bool
    error: str = ""
    lanes: int = 1

    @property
    def passed(self) -> bool:
        if self.error:
            return False
        return bool(self.violations) if self.expect_violations else not self.violations


# ------------------------------------------------------------------ scenario


def run_scenario(cfg: ScenarioConfig, out_dir: Path, backends: net.Backends) -> ScenarioResult:
    run_dir = out_dir / cfg.dir_name
    run_dir.mkdir(parents=True, exist_ok=False)
    nemesis.save(cfg.steps, run_dir / "schedule.json", scenario=cfg.name, seed=cfg.seed)
    meta: dict[str, object] = {
        "scenario": cfg.name,
        "seed": cfg.seed,
        "timeouts": asdict(cfg.timeouts),
        "backends": asdict(backends),
        "unsafe_no_self_fencing": cfg.unsafe_no_self_fencing,
        "relay_heartbeats": cfg.relay_heartbeats,
        "final_deadline_ms": int(FINAL_DEADLINE_S * lane_load(nemesis.lanes_of(cfg.steps)) * 1000),
        "final_stall_ms": int(FINAL_STALL_S * 1000),
        "member_ms": list(cfg.member_ms),
        "submit_interval_s": cfg.submit_interval_s,
        "security": "mutual TLS on every connection; the suite calls as the admin",
    }
    error = ""
    faults = 0
    net.sweep()
    hosts.sweep()
    cluster = ChaosCluster(cfg, run_dir, freezer=not backends.freezer_skip)
    lanes = nemesis.lanes_of(cfg.steps)
    meta["lanes"] = lanes
    players = [Nemesis(cluster, lane, lanes) for lane in range(lanes)]
    played = [0] * lanes
    marks: slowfaults.MarkWatch | None = None  # every degraded mark, for the checker
    try:
        cluster.start()
        marks = slowfaults.MarkWatch(cluster)
        marks.start()
        meta["start_ns"] = ledger.now_ns()
        play_lanes(players, cfg.steps, played)
        (run_dir / "stop-workload").touch()
        cluster.submitter.stop(grace_s=cluster_submit_grace())
        players[0].heal_all()
        meta["gpu_repairs"] = gpufaults.repair_all(cluster)
        meta["uncordons"] = nodefaults.uncordon_all(cluster)
        meta["heal_ns"] = ledger.now_ns()
        meta["heal_wall_ms"] = int(time.time() * 1000)
        quiesce(cluster, meta)
    except (
        TimeoutError,
        net.NetError,
        hosts.HostError,
        ClusterUnavailable,
        grpc.RpcError,
        OSError,
        InsecureCluster,
        SinkFailed,
    ) as exc:
        error = f"{type(exc).__name__}: {exc}"
        log.error("scenario %s seed %d aborted: %s", cfg.name, cfg.seed, error)
    finally:
        faults = sum(played)
        if marks is not None:
            marks.stop()
        for player in players:
            player.close()
        cluster.close()
        net.sweep()
        hosts.sweep_cgroups()
        slowfaults.sweep()
        hosts.sweep_disks(run_dir)
    meta["end_ns"] = ledger.now_ns()
    meta["error"] = error
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    violations = check_run(run_dir)
    jobs = len({str(r["job"]) for r in ledger.read_records(run_dir / ledger.LEDGER)})
    return ScenarioResult(
        name=cfg.name,
        seed=cfg.seed,
        run_dir=run_dir,
        faults=faults,
        jobs=jobs,
        violations=violations,
        expect_violations=cfg.unsafe_no_self_fencing,
        error=error,
        lanes=lanes,
    )


def play_lanes(players: list[Nemesis], steps: list[Step], played: list[int]) -> None:
    """Play each lane's steps in order, the lanes at once (one thread each), counting the
    faults played per lane in ``played``. The first error stops every lane after its
    current fault (each fault is bounded and heals itself) and is raised here."""
    if len(players) == 1:
        for step in steps:
            players[0].play(step)
            played[0] += 1
        return
    stop = threading.Event()
    errors: list[BaseException] = []

    def lane(player: Nemesis) -> None:
        try:
            for step in (s for s in steps if s.lane == player.lane):
                if stop.is_set():
                    return
                player.play(step)
                played[player.lane] += 1
        except BaseException as exc:  # re-raised in the scenario's thread below
            errors.append(exc)
            stop.set()

    threads = [
        threading.Thread(target=lane, args=(p,), name=f"nemesis-lane{p.lane}", daemon=True)
        for p in players
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def cluster_submit_grace() -> float:
    return 8.0  # one submission's deadline (5 s) plus its record


def drain(
    progress: Callable[[], tuple[int, int]],
    cap_s: float,
    stall_s: float,
    poll_s: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Poll ``progress`` (jobs final, jobs in all) until every job is final, none has
    become final for ``stall_s``, or ``cap_s`` has passed; say which. A poll that fails
    (no leader yet) counts as no progress."""
    start = clock()
    last_change, best, last = start, -1, "no answer from the cluster"
    while True:
        with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
            final, total = progress()
            last = f"{total - final} of {total} jobs not final"
            if final == total:
                return "every job final"
            if final > best:
                best, last_change = final, clock()
        now = clock()
        if now - last_change >= stall_s:
            return f"{last}: none became final for {now - last_change:.0f} s"
        if now - start >= cap_s:
            return f"{last} after {now - start:.0f} s"
        sleep(poll_s)


def quiesce(cluster: ChaosCluster, meta: dict[str, object]) -> None:
    """Wait for every job to finish (:func:`drain`) and every replica to hold the same
    state; save the states whatever happens, for the checker."""
    final_deadline_ms, final_stall_ms = meta["final_deadline_ms"], meta["final_stall_ms"]
    assert isinstance(final_deadline_ms, int) and isinstance(final_stall_ms, int)
    meta["quiesce"] = drain(cluster.all_jobs_final, final_deadline_ms / 1000, final_stall_ms / 1000)
    states_dir = cluster.dir / "replica_states"
    states_dir.mkdir(exist_ok=True)
    states: dict[str, pb.GetReplicaStateResponse] = {}
    deadline = time.monotonic() + CONVERGE_S
    while time.monotonic() < deadline:
        with contextlib.suppress(grpc.RpcError):
            states = cluster.collect_states()
            if len({s.state_sha256 for s in states.values()}) == 1:
                break
        time.sleep(0.5)
    with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
        save_job_history(cluster, cluster.dir / JOB_HISTORY)
    for name, answer in states.items():
        (states_dir / f"{name}.state").write_bytes(answer.encoded_state)
        (states_dir / f"{name}.json").write_text(
            json.dumps(
                {
                    "replica_id": answer.replica_id,
                    "last_applied": answer.last_applied,
                    "state_sha256": answer.state_sha256,
                    "jobs": len(decode_state(answer.encoded_state).jobs),
                }
            )
            + "\n",
            encoding="utf-8",
        )


def save_job_history(cluster: ChaosCluster, path: Path) -> None:
    """Every finished job's attempts as the replicas' history holds them (the final state
    keeps only each job's last attempt): owners, queues, GPUs, bind and end times, nodes
    and outcomes for the checker. ``gpus``: what the gang asks at most (an elastic gang's
    ``max``); ``min_gpus``: at least (its ``min``); ``replaces``: whether it places lost
    members again (``on_node_failure: replace``)."""
    jobs = cluster.observer.list_history(limit=HISTORY_LIMIT)
    doc = [
        {
            "job": j.job_id,
            "state": job_state(j).value,
            "owner": j.owner,
            "queue": j.queue,
            "submitted_at_ms": j.submitted_at_ms,
            "gpus": j.spec.replicas * j.spec.resources.gpu,
            "min_gpus": (j.spec.elastic.min_replicas or j.spec.replicas) * j.spec.resources.gpu,
            "replaces": j.spec.HasField("replace"),
            "reason_code": j.reason_code,
            "requeues": j.requeues,
            "retries_used": j.retries_used,
            "attempts": [
                {
                    "number": a.number,
                    "token": a.fencing_token,
                    "state": attempt_state(a).value,
                    "bound_at_ms": a.bound_at_ms,
                    "ended_at_ms": a.ended_at_ms,
                    "outcome_code": a.outcome_code,
                    "outcome": a.outcome,
                    "nodes": list(a.nodes),
                }
                for a in j.attempt_list
            ],
        }
        for j in jobs
    ]
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
