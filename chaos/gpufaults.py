"""The ``gpu-xid`` fault: one GPU of a worker turns unhealthy, as its driver would report
a fatal Xid, through the worker's mock fault file (``--mock-gpu-faults``).

How it plays (:func:`play_gpu_xid`):

* the target is a worker of the lane's pool that runs gangs (the step's ``pick``); the
  GPU is one that its running gangs hold (from the members' start records), else any
  healthy one, else any; the Xid is drawn from :data:`FATAL_XIDS` (every one makes the
  GPU unhealthy in the worker's default Xid table);
* ``<gpu> xid <code>`` is appended to the worker's file; the worker reads it within a
  second and names the GPU in every heartbeat; the leader records it (``since_ms``) and
  requeues the gangs holding it. While the fault lasts the nemesis polls the node list
  and notes each ``since_ms`` it sees for that GPU;
* the heal: a worker's faults are sticky until it restarts (an operator resets the GPU,
  restarts the worker, then repairs), so the worker is killed and started again (a fresh
  agent skips the lines already in the file), and the GPU is repaired through
  ``RepairGpus`` until it stays clear for :data:`SETTLE_S`. Without the repair the
  cluster would lose a GPU per fault for good.

The record (``faults.jsonl``) carries ``gpu_node`` (the worker), ``gpu_node_address``
(as the members' records name it), ``gpu``, ``xid``, ``inject_ns`` and
``gpu_unhealthy_ms``: one ``[since_ms, repair_sent_ms, repair_done_ms]`` per span the
replicated state held the fault (leader clock for ``since_ms``, the suite's wall clock
for the repair; 0, 0 when never repaired). :func:`repair_all` repairs what is left at
the end of a run the same way (the run's ``meta.json``, ``gpu_repairs``).
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from chaos import ledger
from chaos.cluster import WORKER_GPUS, ChaosCluster
from synapse_ha.client.cluster import ClusterUnavailable

# Fatal Xids: the GPU fell off the bus, double-bit and uncontained ECC errors, page
# retirement, NVLink, GSP; the worker's Xid table makes each one unhealthy.
FATAL_XIDS = (79, 48, 94, 95, 63, 64, 74, 92, 119, 120)
# After a repair the GPU must stay clear this long before the heal is done: a report the
# old agent sent just before it was killed would bring the fault back.
SETTLE_S = 1.0
REPAIR_DEADLINE_S = 30.0
POLL_S = 0.1


def wall_ms() -> int:
    return int(time.time() * 1000)


def xid_line(gpu: int, xid: int) -> str:
    """One line of the mock fault file (the contract with the worker)."""
    return f"{gpu} xid {xid}\n"


def append_line(path: Path, line: str) -> None:
    """Append ``line`` with one ``O_APPEND`` write: the worker never reads half of it."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def choose_gpu(held: set[int], unhealthy: set[int], gpus: int, rng: random.Random) -> int:
    """A GPU the worker's running gangs hold and not already unhealthy; else any healthy
    GPU; else any GPU."""
    every = set(range(gpus))
    for pool in (held & every - unhealthy, every - unhealthy, every):
        if pool:
            return rng.choice(sorted(pool))
    raise ValueError(f"gpus: {gpus} is not a positive GPU count")


@dataclass(slots=True)
class UnhealthySpans:
    """The spans in which the replicated state held one GPU's fault."""

    spans: list[list[int]] = field(default_factory=list)  # [since, repair sent, done]

    def saw(self, since_ms: int) -> None:
        if since_ms and all(s[0] != since_ms for s in self.spans):
            self.spans.append([since_ms, 0, 0])

    def open(self) -> bool:
        return any(not s[1] for s in self.spans)

    def repaired(self, sent_ms: int, done_ms: int) -> None:
        for s in self.spans:
            if not s[1]:
                s[1], s[2] = sent_ms, done_ms


def since_of(c: ChaosCluster, worker: str, gpu: int) -> int:
    """The fault's ``since_ms`` in the state as the leader answers; 0: healthy."""
    for n in c.observer.list_nodes():
        if n.node_id == worker:
            return next((int(f.since_ms) for f in n.gpu_faults if f.gpu == gpu), 0)
    return 0


def unhealthy_now(c: ChaosCluster, worker: str) -> set[int]:
    for n in c.observer.list_nodes():
        if n.node_id == worker:
            return {int(f.gpu) for f in n.gpu_faults}
    return set()


def repair_until_clear(c: ChaosCluster, worker: str, gpu: int, spans: UnhealthySpans) -> bool:
    """Repair ``gpu`` of ``worker`` (its agent restarted first) until it has stayed clear
    for :data:`SETTLE_S`; False when :data:`REPAIR_DEADLINE_S` ran out first (the end of
    the run tries again)."""
    deadline = time.monotonic() + REPAIR_DEADLINE_S
    clear_since = time.monotonic()
    while time.monotonic() < deadline:
        with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
            spans.saw(since_of(c, worker, gpu))
            if spans.open():
                sent = wall_ms()
                c.observer.repair_gpus(worker, [gpu])
                spans.repaired(sent, wall_ms())
                clear_since = time.monotonic()
            elif time.monotonic() - clear_since >= SETTLE_S:
                return True
        time.sleep(POLL_S)
    return False


def restart_worker(c: ChaosCluster, worker: str) -> None:
    """Kill the worker's agent and start it again: its faults were sticky; the new agent
    skips the lines already in its fault file."""
    process = c.workers[worker]
    if process.alive:
        process.kill()
    c.restart(process)


def play_gpu_xid(
    c: ChaosCluster,
    worker: str,
    rng: random.Random,
    extra: dict[str, object],
    held: set[int] | None = None,
) -> tuple[str, Callable[[], None], Callable[[], None]]:
    """Inject the fault on ``worker``: a sentence, what to poll while it lasts, and the
    heal (restart the worker, repair the GPU). Fills ``extra`` with the record. The GPU
    is one of ``held`` (default: every GPU the worker's running gangs hold)."""
    held = c.held_gpus(worker) if held is None else held
    gpu = choose_gpu(held, unhealthy_now(c, worker), WORKER_GPUS, rng)
    xid = rng.choice(FATAL_XIDS)
    spans = UnhealthySpans()
    extra.update(
        gpu_node=worker,
        gpu_node_address=c.address(worker),
        gpu=gpu,
        xid=xid,
        gpu_held_by_gangs=sorted(held),
        inject_ns=ledger.now_ns(),
        gpu_unhealthy_ms=spans.spans,
    )
    append_line(c.gpu_fault_file(worker), xid_line(gpu, xid))

    def watch() -> None:
        spans.saw(since_of(c, worker, gpu))

    def heal() -> None:
        with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
            watch()
        restart_worker(c, worker)
        extra["worker_restarted"] = True
        extra["repaired"] = repair_until_clear(c, worker, gpu, spans)

    held_text = f"held by gangs there ({sorted(held)})" if gpu in held else "not held by a gang"
    return f"GPU {gpu} xid {xid}, {held_text}", watch, heal


def repair_all(c: ChaosCluster) -> list[dict[str, object]]:
    """At the end of a run: every GPU still unhealthy in the state is repaired (its worker
    restarted first); one record per GPU, as a ``gpu-xid`` fault's."""
    out: list[dict[str, object]] = []
    for n in c.observer.list_nodes():
        if not n.gpu_faults or n.node_id not in c.workers:
            continue
        restart_worker(c, n.node_id)
        for fault in sorted(n.gpu_faults, key=lambda f: f.gpu):
            spans = UnhealthySpans()
            spans.saw(int(fault.since_ms))
            repaired = repair_until_clear(c, n.node_id, int(fault.gpu), spans)
            out.append(
                {
                    "gpu_node": n.node_id,
                    "gpu_node_address": c.address(n.node_id),
                    "gpu": int(fault.gpu),
                    "gpu_unhealthy_ms": spans.spans,
                    "repaired": repaired,
                }
            )
    return out
