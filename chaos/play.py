"""The nemesis at play: :class:`Nemesis` turns each :class:`~chaos.nemesis.Step` into a
fault on a running :class:`~chaos.cluster.ChaosCluster`, holds it for its duration, heals
it and appends what it did to ``faults.jsonl``. Several nemeses (lanes) can play at once,
each on its own targets (:func:`chaos.nemesis.worker_pool`).
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable

import grpc

from chaos import (
    elasticfaults,
    gpufaults,
    hosts,
    ledger,
    membership,
    nemesis,
    net,
    nodefaults,
    rejoin_rules,
    replacefaults,
    slowfaults,
)
from chaos.cluster import ChaosCluster
from chaos.nemesis import Step
from synapse_ha.client.cluster import ClusterUnavailable
from synapse_ha.core.model import NodeStatus
from synapse_ha.local.process import Process, Replica, Worker
from synapse_ha.rpc.states import node_status

log = logging.getLogger("chaos")

GANG_WAIT_S = 20.0

# After the newer attempts of a frozen host's gangs started, how long the thaw waits for
# their members' token claims to reach the sink.
CLAIM_SETTLE_S = 0.3


class Nemesis:
    """Plays steps against a :class:`ChaosCluster`, logging each to ``faults.jsonl``."""

    def __init__(self, cluster: ChaosCluster, lane: int = 0, lanes: int = 1) -> None:
        self.c = cluster
        self.lane = lane
        self.owner = f"lane{lane}"  # its part of the nftables sets (chaos/net.py)
        self.pool = nemesis.worker_pool(sorted(cluster.workers), lane, lanes)
        self.out = ledger.Appender(cluster.dir / ledger.FAULTS)
        self._watch: Callable[[], None] | None = None  # polled while a fault lasts

    def close(self) -> None:
        self.out.close()

    def wait_for_gangs(self, need_worker: bool) -> list[str]:
        """Wait (bounded) until gangs run. For a fault aimed at a worker, prefer workers
        where a gang member has just started, so that the fault hits a gang in the middle
        of its run rather than at its end; fall back to any busy worker."""

        def mine(workers: list[str]) -> list[str]:
            return [w for w in workers if w in self.pool]

        deadline = time.monotonic() + GANG_WAIT_S
        while time.monotonic() < deadline:
            fresh = mine(self.c.busy_workers(fresh_s=1.0))
            if fresh or (not need_worker and mine(self.c.busy_workers())):
                return fresh or mine(self.c.busy_workers())
            time.sleep(0.02)
        busy = mine(self.c.busy_workers())
        if busy or not need_worker:
            return busy
        # Nothing ran: any live worker, or (none alive) any worker at all.
        return sorted(w for w in self.pool if self.c.workers[w].alive) or list(self.pool)

    def play(self, step: Step) -> dict[str, object]:
        c = self.c
        time.sleep(step.gap_before_s)
        worker_fault = step.kind in (
            nemesis.CUT_WORKER_FROM_LEADER,
            nemesis.CUT_WORKER_FROM_REPLICAS,
            nemesis.KILL_WORKER,
            nemesis.PAUSE_WORKER,
            nemesis.FREEZE_HOST,
            nemesis.DISK_FULL_WORKER,
            nemesis.GPU_XID,
            nemesis.NODE_CANNOT_RUN,
            *nemesis.REPLACE_FAULTS,
        )
        busy = self.wait_for_gangs(worker_fault)
        leader = c.fresh_leader()
        rng = random.Random(step.pick)
        replicas = [h.address for h in c.replica_hosts]
        targets: list[str] = []
        detail = ""
        start_ns = ledger.now_ns()
        heal: Callable[[], None] = lambda: net.set_blocked([], self.owner)  # noqa: E731
        extra: dict[str, object] = {}
        hold: Callable[[], str] | None = None  # waits past the duration; says what it saw
        if step.kind == nemesis.ISOLATE_LEADER:
            targets = [leader]
            others = [h.address for h in c.hosts if h.name != leader]
            net.set_blocked(net.cut([c.address(leader)], others), self.owner)
        elif step.kind == nemesis.ISOLATE_FOLLOWER:
            targets = [rng.choice(c.followers())]
            others = [h.address for h in c.hosts if h.name != targets[0]]
            net.set_blocked(net.cut([c.address(targets[0])], others), self.owner)
        elif step.kind == nemesis.CUT_RELAY:
            targets = [rng.choice(c.followers())]
            detail = f"cut from leader {leader} only; workers and the other replicas reach it"
            net.set_blocked(net.cut([c.address(targets[0])], [c.address(leader)]), self.owner)
        elif step.kind == nemesis.BRIDGE:
            bridge, far = rng.sample(c.followers(), 2)
            targets = [leader, bridge, far]
            detail = f"{bridge} sees both {leader} and {far}, who cannot see each other"
            net.set_blocked(net.cut([c.address(leader)], [c.address(far)]), self.owner)
        elif step.kind in (nemesis.CUT_WORKER_FROM_LEADER, nemesis.CUT_WORKER_FROM_REPLICAS):
            worker = busy[step.pick % len(busy)]
            peers = [c.address(leader)] if step.kind == nemesis.CUT_WORKER_FROM_LEADER else replicas
            targets = [worker]
            detail = f"cut from {'leader ' + leader if len(peers) == 1 else 'every replica'}"
            net.set_blocked(net.cut([c.address(worker)], peers), self.owner)
        elif step.kind == nemesis.PARTITION_CLIENT:
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline and not c.in_flight_submission():
                time.sleep(0.002)
            caught = c.in_flight_submission()
            net.set_blocked(net.cut([c.client_host.address], replicas), self.owner)
            targets = ["client"]
            detail = (
                "cut while a submission was in flight"
                if caught
                else ("cut between submissions (none was in flight within 10 s)")
            )
        elif step.kind == nemesis.KILL_LEADER:
            targets = [leader]
            victim: Process = c.replicas[leader]
            victim.kill()
            heal = lambda: c.restart(victim)  # noqa: E731
        elif step.kind == nemesis.KILL_ALL_REPLICAS:
            targets = sorted(c.replicas)
            for p in c.replicas.values():
                p.kill()

            def restart_all() -> None:
                for p in c.replicas.values():
                    c.restart(p)

            heal = restart_all
        elif step.kind == nemesis.KILL_WORKER:
            worker = busy[step.pick % len(busy)]
            targets = [worker]
            killed: Process = c.workers[worker]
            killed.kill()
            heal = lambda: c.restart(killed)  # noqa: E731
        elif step.kind == nemesis.PAUSE_WORKER:
            worker = busy[step.pick % len(busy)]
            targets = [worker]
            c.workers[worker].pause()
            heal = c.workers[worker].resume
        elif step.kind == nemesis.PAUSE_LEADER:
            targets = [leader]
            c.replicas[leader].pause()
            heal = c.replicas[leader].resume
        elif step.kind == nemesis.GPU_XID:
            targets = [busy[step.pick % len(busy)]]
            detail, self._watch, heal = gpufaults.play_gpu_xid(c, targets[0], rng, extra)
        elif step.kind == nemesis.NODE_CANNOT_RUN:
            targets = [busy[step.pick % len(busy)]]
            play = nodefaults.play_node_cannot_run
            detail, self._watch, heal = play(c, targets[0], rng, extra)
        elif step.kind in nemesis.REPLACE_FAULTS:
            found = replacefaults.play(c, step.kind, self.pool, busy, step.pick, extra)
            targets, detail, self._watch, heal, hold = found
        elif step.kind in nemesis.ELASTIC_FAULTS:
            found_elastic = elasticfaults.play(c, step.kind, step.index, step.pick, extra)
            targets, detail, self._watch, heal, hold = found_elastic
        elif step.kind == nemesis.SLOW_NODE:
            found_slow = slowfaults.play(c, step.index, step.pick, extra)
            targets, detail, self._watch, heal, hold = found_slow
        elif step.kind == nemesis.REJOIN:
            targets, detail, heal = rejoin_rules.play_rejoin(c, rng, self.owner)
        elif step.kind in nemesis.HOST_FAULTS:
            targets, detail, heal, hold = self.play_host_fault(step, leader, busy, rng, extra)
        elif step.kind in membership.KINDS:
            targets, detail, heal = membership.play(c, step, leader, rng)
        else:
            raise ValueError(f"unknown fault {step.kind!r}")
        on_workers = [t for t in targets if t in c.workers] or None
        gangs = c.running_gangs(on_workers)
        until = time.monotonic() + step.duration_s
        while (left := until - time.monotonic()) > 0:
            if self._watch is not None:
                with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
                    self._watch()
            time.sleep(min(left, 0.1) if self._watch is not None else left)
        self._watch = None
        if hold is not None:
            detail = f"{detail}; {hold()}"
        heal()
        record: dict[str, object] = {
            "type": "fault",
            "step": step.index,
            "lane": step.lane,
            "kind": step.kind,
            "targets": targets,
            "hit": {
                "leader": leader,
                "workers_running_gangs": busy,
                "gangs_running" + (" on targets" if on_workers else ""): gangs,
            },
            "detail": detail,
            "start_ns": start_ns,
            "end_ns": ledger.now_ns(),
            **extra,
        }
        self.out.append(record)
        log.info(
            "fault %d %s on %s for %.1f s %s; gangs hit: %s",
            step.index,
            step.kind,
            targets,
            step.duration_s,
            detail,
            ", ".join(gangs) or "none",
        )
        return record

    def play_host_fault(
        self,
        step: Step,
        leader: str,
        busy: list[str],
        rng: random.Random,
        extra: dict[str, object],
    ) -> tuple[list[str], str, Callable[[], None], Callable[[], str] | None]:
        """Start a loss, freeze, disk or clock fault: targets, a sentence, how to heal,
        and (for a freeze) what to wait for after the duration."""
        c = self.c
        replicas = [h.address for h in c.replica_hosts]
        if step.kind == nemesis.PACKET_LOSS:
            pool = [leader, *sorted(c.workers)] if step.pick % 2 else [leader]
            target = rng.choice(pool)
            others = [h.address for h in c.hosts if h.name != target]
            net.set_lossy(net.cut([c.address(target)], others), self.owner)
            detail = f"{net.LOSS_PERCENT}% of packets to and from {target} dropped at random"
            return [target], detail, lambda: net.set_lossy([], self.owner), None
        if step.kind == nemesis.ONE_WAY_LOSS:
            if step.pick % 2 and busy:
                target = busy[step.pick % len(busy)]
                net.set_lossy(net.one_way([c.address(target)], replicas), self.owner)
                detail = f"{net.LOSS_PERCENT}% of packets from {target} to the replicas dropped"
            else:
                target = leader
                others = [h.address for h in c.hosts if h.name != leader]
                net.set_lossy(net.one_way([c.address(leader)], others), self.owner)
                detail = f"{net.LOSS_PERCENT}% of the leader's outgoing packets dropped"
            return [target], detail, lambda: net.set_lossy([], self.owner), None
        if step.kind == nemesis.FREEZE_HOST:
            return self._freeze(step, busy, extra)
        if step.kind in (nemesis.DISK_FULL_REPLICA, nemesis.DISK_FULL_WORKER):
            if step.kind == nemesis.DISK_FULL_REPLICA:
                names = [leader] if step.pick % 2 else c.followers()
                target = rng.choice(names)
                process: Process = c.replicas[target]
            else:
                target = busy[step.pick % len(busy)]
                process = c.workers[target]
            disk = process.data_dir if isinstance(process, Replica | Worker) else c.dir / target
            if not hosts.is_our_disk(disk):
                # A replaced replica's fresh data directory is not a disk of ours.
                return [target], f"{disk} is not a small disk: nothing filled", lambda: None, None
            taken = hosts.fill(disk)

            def heal_disk() -> None:
                hosts.unfill(disk)
                extra["alive_at_heal"] = process.alive
                # A negative code is the signal that ended it (SIGBUS: a write through a
                # memory map found no space).
                extra["exit_code_at_heal"] = process.returncode
                if not process.alive:
                    c.restart(process)

            return [target], f"{disk.name} full ({taken >> 20} MiB taken)", heal_disk, None
        # Clock jumps: the leader's wall clock moves; its monotonic clock does not.
        offset = nemesis.clock_jump_s(step.kind, step.pick)
        clock = c.clock_file(leader)
        # Each ready node's silence as the leader saw it just before the jump (-1: not
        # heard since this leader's election, so unknown and left out).
        ages = {
            n.node_id: int(n.last_heartbeat_age_ms)
            for n in c.observer.list_nodes()
            if node_status(n) is NodeStatus.READY and n.last_heartbeat_age_ms >= 0
        }
        listed = time.monotonic()
        hosts.set_clock(clock, offset)
        extra["clock_offset_s"] = offset
        extra["ready_before"] = sorted(ages)
        extra["dead_timeout_ms"] = int(c.cfg.timeouts.dead_timeout_s * 1000)
        silence: dict[str, int] = {}
        extra["declared_dead"] = []
        extra["silence_bound_ms"] = silence

        def watch() -> None:
            # A node ready when the jump came and dead now was declared dead while the
            # clock was off. Its silence at the declaration was at most its silence before
            # the jump plus the time since: a fault that ended just before the jump (a cut,
            # a killed agent) can leave a node silent long enough to die for real.
            for n in c.observer.list_nodes():
                dead = node_status(n) is NodeStatus.DEAD
                if n.node_id in ages and dead and n.node_id not in silence:
                    since = int((time.monotonic() - listed) * 1000)
                    silence[n.node_id] = ages[n.node_id] + since
            extra["declared_dead"] = sorted(silence)

        self._watch = watch

        def heal_clock() -> None:
            with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
                watch()
            hosts.set_clock(clock, 0.0)

        return [leader], f"wall clock moved by {offset:+.0f} s", heal_clock, None

    def _freeze(
        self, step: Step, busy: list[str], extra: dict[str, object]
    ) -> tuple[list[str], str, Callable[[], None], Callable[[], str] | None]:
        """Freeze a whole worker host (agent, supervisors, members) and thaw it only after
        a newer attempt of a gang it ran has started elsewhere (bounded)."""
        c = self.c
        target = busy[step.pick % len(busy)]
        horizon = ledger.now_ns() - int(0.6e9)
        frozen_gangs = {
            job: token
            for (job, token, node), at in list(c.last_seen.items())
            if node == target and at >= horizon
        }
        # The members frozen there: a gang with member replacement is fenced once each of
        # them has a newer generation started elsewhere (the gang runs on).
        frozen_members = sorted(c.members_seen.on(target, horizon))
        extra["frozen"] = sorted([job, token] for job, token in frozen_gangs.items())
        extra["frozen_node"] = c.address(target)  # as the members' records name it
        cgroup = hosts.host_cgroup(target)
        hosts.freeze(cgroup, True)
        started = time.monotonic()

        def watch() -> None:
            # When the leader declared the frozen node dead: from then on its attempts
            # are superseded, and a write of theirs after the thaw is stale.
            if "declared_dead_ns" not in extra and any(
                n.node_id == target and node_status(n) is NodeStatus.DEAD
                for n in c.observer.list_nodes()
            ):
                extra["declared_dead_ns"] = ledger.now_ns()

        self._watch = watch

        def hold() -> str:
            # Thaw once every frozen gang has a newer attempt started (its members claim
            # their token at the sink as they start, so the sink can refuse a resumed
            # member of the old one), bounded. A gang with no newer attempt by then is
            # "unfenced": nothing can refuse its resumed members' first writes.
            def fenced(job: str, token: int) -> bool:
                if c.newest_token.get(job, 0) > token:
                    return True
                ranks = [k for k in frozen_members if k[:2] == (job, token)]
                return bool(ranks) and all(c.members_seen.newer_generation(k) for k in ranks)

            def unfenced() -> list[list[str | int]]:
                return sorted(
                    [job, token] for job, token in frozen_gangs.items() if not fenced(job, token)
                )

            deadline = started + nemesis.FREEZE_MAX_S
            while time.monotonic() < deadline:
                with contextlib.suppress(grpc.RpcError, ClusterUnavailable):
                    watch()
                if not unfenced():
                    if frozen_gangs:
                        time.sleep(CLAIM_SETTLE_S)  # a start record comes before its claim
                    break
                time.sleep(0.05)
            waited = time.monotonic() - started
            left = unfenced()
            extra["unfenced"] = left
            if not frozen_gangs:
                return f"no gang ran there; thawed after {waited:.1f} s"
            newer = [
                f"{job}/t{c.newest_token[job]}"
                for job, token in sorted(frozen_gangs.items())
                if c.newest_token.get(job, 0) > token
            ] + [
                f"{job}/t{token} rank {rank} g{gen + 1}"
                for job, token, rank, gen in frozen_members
                if c.members_seen.newer_generation((job, token, rank, gen))
            ]
            text = f"thawed {waited:.1f} s in"
            if newer:
                text += f", after newer attempts or generations started: {', '.join(newer)}"
            if left:
                text += "; no newer attempt of: " + ", ".join(f"{j}/t{t}" for j, t in left)
            return text

        detail = "frozen whole (cgroup.freeze): " + (
            ", ".join(f"{j}/t{t}" for j, t in sorted(frozen_gangs.items())) or "no gang"
        )
        return [target], detail, lambda: hosts.freeze(cgroup, False), hold

    def heal_all(self) -> None:
        net.heal_network()
        for name in self.c.replicas:
            hosts.set_clock(self.c.clock_file(name), 0.0)
        if self.c.freezer:
            for name in self.c.workers:
                hosts.freeze(hosts.host_cgroup(name), False)
        for h in [*self.c.replica_hosts, *self.c.worker_hosts]:
            hosts.unfill(self.c.dir / h.name)
        self.c.submitter.resume()  # elastic-grow stops it
        for p in [*self.c.replicas.values(), *self.c.workers.values()]:
            p.resume()
            if not p.alive:
                self.c.restart(p)
