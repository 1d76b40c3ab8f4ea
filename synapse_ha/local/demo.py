"""``make demo``: a narrated run of a real three-replica cluster on 127.0.0.1.

It starts a :class:`~synapse_ha.local.devcluster.DevCluster` (three ``synapse-scheduler``
replicas, four mock-GPU ``synapse-worker`` processes in racks r1 and r2, free ports),
then shows and checks, step by step:

1. a gang that needs more GPUs than are free waits, and says why;
2. a worker joins and the gang binds at once, all members together;
3. a gang with ``topology.required: rack`` lands inside one rack;
4. the leader replica is killed with SIGKILL while the gang runs; another takes over,
   and a resubmission with the same request id returns the same job;
5. the jobs finish: one attempt each, the fencing token unchanged across the failover,
   every member exited 0, each rank wrote exactly one line (in the members' own log
   files, read back through the workers' log service, and in a shared ledger), and no
   worker ever started a second copy of a member;
6. who may do what: the admin makes tokens for users bob and alice; bob's job runs and
   he reads its log, alice may neither cancel it nor read its log (PERMISSION_DENIED);
7. a summary table.

Secure by default: every process serves mutual TLS with certificates from the cluster's
own CA, the demo calls the replicas as the admin (by certificate), users by token, and
logs are read with grants signed by a replica.

Every wait is bounded. The process exits 0 when every check passed and 1 otherwise;
everything it started is stopped on success, failure and Ctrl-C (exit 130).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import grpc

from synapse_ha.client.cluster import ClusterClient, ClusterUnavailable
from synapse_ha.core.membership import ReplicaRole
from synapse_ha.core.model import FINISHED_JOB_STATES, JobState, NodeStatus
from synapse_ha.core.spec.document import parse_job_spec
from synapse_ha.local.devcluster import DevCluster, DevClusterError
from synapse_ha.local.devoptions import DevClusterOptions
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.states import job_state, node_status, replica_role
from synapse_ha.rpc.to_proto import spec_to_proto

T = TypeVar("T")

GPUS_PER_WORKER = 4
RUN_S = 8  # how long each pretrain member runs; long enough to kill the leader mid-run
OPTIONS = DevClusterOptions(
    workers=4,
    racks=2,
    gpus_per_worker=GPUS_PER_WORKER,
    ephemeral_ports=True,
    stop_grace="1s",
    ready_timeout_s=60.0,
)


class DemoFailed(Exception):
    """A wait ran out; the message says what was awaited."""


@dataclass
class Narrator:
    """Prints steps and checks, and remembers whether every check passed."""

    out: Callable[[str], None] = print
    started: float = field(default_factory=time.monotonic)
    passed: int = 0
    failed: list[str] = field(default_factory=list)

    def step(self, title: str) -> None:
        self.out("")
        self.out(f"[{time.monotonic() - self.started:5.1f}s] == {title}")

    def say(self, text: str) -> None:
        self.out(f"         {text}".rstrip())

    def check(self, what: str, ok: bool, detail: str = "") -> bool:
        mark = "ok  " if ok else "FAIL"
        self.out(f"         [{mark}] {what}" + (f": {detail}" if detail else ""))
        if ok:
            self.passed += 1
        else:
            self.failed.append(what)
        return ok


def wait_until(what: str, probe: Callable[[], T | None], timeout_s: float) -> T:
    """Call ``probe`` until it returns something other than None; bounded."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            value = probe()
        except (grpc.RpcError, ClusterUnavailable) as exc:
            last = str(exc).splitlines()[0][:200]
            value = None
        if value is not None:
            return value
        time.sleep(0.1)
    raise DemoFailed(f"timed out after {timeout_s:.0f}s waiting for {what} {last}".strip())


def job_spec(doc: dict[str, Any]) -> tuple[pb.JobSpec, str]:
    """Validate a job document with the same parser ``synctl`` uses; (spec, request id)."""
    parsed = parse_job_spec(doc)
    return spec_to_proto(parsed.spec), parsed.request_id


def racks_of(client: ClusterClient) -> dict[str, str]:
    return {
        n.node_id: next((t.value for t in n.topology if t.level == "rack"), "?")
        for n in client.list_nodes()
    }


def refusal(call: Callable[[], object]) -> str:
    """The status code ``call`` is refused with, or "allowed"."""
    try:
        call()
    except grpc.RpcError as exc:
        code = exc.code()
        return code.name if code is not None else "UNKNOWN"
    return "allowed"


def members_line(job: pb.Job, racks: dict[str, str]) -> str:
    return ", ".join(
        f"rank {m.rank}→{m.node_id}({racks.get(m.node_id, '?')}) gpus {list(m.gpus)}"
        for m in job.attempt.members
    )


# ---------------------------------------------------------------------- the story


@dataclass
class Demo:
    cluster: DevCluster
    client: ClusterClient
    ledger: Path
    n: Narrator
    jobs: dict[str, str] = field(default_factory=dict)  # name -> job id
    request_ids: dict[str, str] = field(default_factory=dict)
    tokens_before_failover: dict[str, int] = field(default_factory=dict)
    restarted: str = ""  # the replica killed and started again

    def submit(self, doc: dict[str, Any]) -> str:
        spec, request_id = job_spec(doc)
        answer = self.client.submit_job(spec, request_id=request_id)
        self.jobs[doc["name"]] = answer.job_id
        self.request_ids[doc["name"]] = request_id
        return answer.job_id

    def pretrain(self) -> dict[str, Any]:
        """The spec of the demo's big gang: 5 members of 4 GPUs, two retries."""
        return {
            "name": "pretrain",
            "replicas": 5,
            "resources": {"gpu": 4, "cpu": 1, "memory": "1Gi"},
            "command": self.member_command(),
            "env": {"LEDGER": str(self.ledger)},
            "retries": {"max": 2, "backoff": "1s"},
        }

    def job(self, name: str) -> pb.Job:
        return self.client.get_job(self.jobs[name])

    def check_waits_whole(self, what: str, job: pb.Job) -> None:
        """Check that ``job`` is pending with no member bound (the gang waits whole)."""
        waits = job_state(job) is JobState.PENDING and not job.attempt.members
        self.n.check(what, waits, job_state(job))

    def wait_state(self, name: str, wanted: set[JobState], timeout_s: float) -> pb.Job:
        def probe() -> pb.Job | None:
            job = self.job(name)
            return job if job_state(job) in wanted else None

        return wait_until(f"{name} to be {' or '.join(sorted(wanted))}", probe, timeout_s)

    def member_command(self) -> str:
        return (
            f"sleep {RUN_S}; "
            'line="$SYNAPSE_JOB_ID rank=$RANK/$WORLD_SIZE attempt=$SYNAPSE_ATTEMPT '
            'token=$SYNAPSE_FENCING_TOKEN"; echo "$line"; echo "$line" >> "$LEDGER"'
        )

    # ---------------------------------------------------------------- steps

    def show_cluster(self) -> None:
        n = self.n
        n.step("A local cluster: 3 scheduler replicas, 4 workers x 4 mock GPUs, 2 racks")
        leader = self.cluster.leader_id()
        for r in self.cluster.replicas:
            role = ReplicaRole.LEADER if r.replica_id == leader else ReplicaRole.FOLLOWER
            n.say(f"replica {r.replica_id}  gRPC {r.grpc}  Raft {r.raft}  {role}")
        for w in self.cluster.workers:
            n.say(f"worker  {w.node_id}  {w.gpus} GPU  {w.topology}")
        n.check("a leader was elected", leader is not None, f"replica {leader}")
        ready = [x for x in self.client.list_nodes() if node_status(x) is NodeStatus.READY]
        n.check("all 4 workers registered and ready", len(ready) == 4, f"{len(ready)} ready")

    def gang_waits(self) -> None:
        n = self.n
        n.step(
            "A 5 x 4-GPU gang needs 20 GPUs; only 16 exist: it asks to wait for nodes to join "
            "(wait_for_nodes), so it waits"
        )
        job_id = self.submit(
            {**self.pretrain(), "request_id": "demo-pretrain-1", "wait_for_nodes": True}
        )
        n.say(f"submitted pretrain as {job_id} (request id demo-pretrain-1)")

        def pending_with_reason() -> pb.Job | None:
            job = self.job("pretrain")
            return job if job_state(job) is JobState.PENDING and job.reason else None

        job = wait_until("pretrain to get a pending reason", pending_with_reason, 15)
        time.sleep(1.5)  # several scheduling passes: it must still be waiting
        job = self.job("pretrain")
        n.say(f"reason: {job.reason}")
        n.say(f"explain: {self.client.explain_job(job_id).explanation}")
        self.check_waits_whole("the gang waits whole (no member bound)", job)

    def worker_joins(self) -> None:
        n = self.n
        n.step("Worker w5 (4 GPUs) joins rack r2: the gang starts at once")
        started = time.monotonic()
        worker = self.cluster.add_worker(rack="r2", gpus=GPUS_PER_WORKER)
        joined = time.monotonic()
        n.say(f"w5 ({worker.topology}) registered {joined - started:.1f}s after it started")
        job = self.wait_state("pretrain", {JobState.SCHEDULED, JobState.RUNNING}, 15)
        bound_after = time.monotonic() - joined
        job = self.wait_state("pretrain", {JobState.RUNNING}, 20)
        racks = racks_of(self.client)
        n.say(f"members: {members_line(job, racks)}")
        n.say(
            f"attempt {job.attempt.number}, fencing token {job.attempt.fencing_token}, "
            f"master port {job.attempt.master_port}"
        )
        n.check(
            "all 5 members bound in one step, one per node",
            len({m.node_id for m in job.attempt.members}) == 5,
            f"bound {bound_after:.1f}s after w5 registered",
        )
        self.tokens_before_failover["pretrain"] = job.attempt.fencing_token

    def topology_gang(self) -> None:
        n = self.n
        n.step("A 3 x 4-GPU gang with topology.required: rack")
        n.say("rack r1 has 2 hosts (8 GPUs), rack r2 has 3 hosts (12 GPUs)")
        job_id = self.submit(
            {
                "name": "finetune",
                "replicas": 3,
                "resources": {"gpu": 4, "cpu": 1, "memory": "1Gi"},
                "command": 'sleep 2; echo "$SYNAPSE_JOB_ID rank=$RANK/$WORLD_SIZE"',
                "topology": {"required": "rack"},
                "request_id": "demo-finetune-1",
            }
        )
        n.say(f"submitted finetune as {job_id}")
        time.sleep(1.5)  # a few scheduling passes
        job = self.job("finetune")
        n.say(f"{job_state(job)}: {job.reason or '-'}")
        self.check_waits_whole("finetune queues behind the running gang", job)

    def kill_leader(self) -> None:
        n = self.n
        old = self.cluster.leader_id()
        n.step(f"kill -9 of the leader, replica {old}, while pretrain runs")
        if old is None:
            n.check("a leader to kill", False)
            return
        before = self.job("pretrain")
        n.say(f"pretrain is {job_state(before)}, token {before.attempt.fencing_token}")
        killed = time.monotonic()
        self.cluster.kill_replica(old, signal.SIGKILL)
        new = self.cluster.wait_for_leader(timeout_s=30)
        took = time.monotonic() - killed
        n.check("another replica took over", new != old, f"replica {new} after {took:.1f}s")
        answer = self.client.submit_job(
            job_spec(self.pretrain())[0], request_id=self.request_ids["pretrain"]
        )
        n.check(
            "resubmitting with the same request id returns the same job",
            answer.job_id == self.jobs["pretrain"] and not answer.created,
            f"{answer.job_id}, created={answer.created}",
        )
        after = self.job("pretrain")
        n.say(f"pretrain is {job_state(after)}, token {after.attempt.fencing_token}")
        self.cluster.restart_replica(old)
        self.restarted = old
        n.say(f"replica {old} restarted on its data directory; it rejoins as a follower")

    def jobs_finish(self) -> None:
        n = self.n
        n.step("The jobs finish; nothing lost, nothing run twice")
        for name in ("pretrain", "finetune"):
            job = self.wait_state(name, set(FINISHED_JOB_STATES), 60)
            n.say(f"{name}: {job_state(job)}")
        racks = racks_of(self.client)
        ledger = self.ledger.read_text().splitlines() if self.ledger.exists() else []
        for name in ("pretrain", "finetune"):
            job = self.job(name)
            members = job.attempt.members
            n.say(f"{name}: {members_line(job, racks)}")
            n.check(
                f"{name} succeeded in its first and only attempt",
                job_state(job) is JobState.SUCCEEDED
                and job.attempts_made == 1
                and job.attempt.number == 1,
                f"{job_state(job)}, attempts {job.attempts_made}, outcome {job.attempt.outcome}",
            )
            codes = [m.exit_code if m.has_exit_code else None for m in members]
            n.check(
                f"{name}: every member exited 0",
                len(codes) == job.spec.replicas and all(c == 0 for c in codes),
                f"exit codes {codes}",
            )
            lines_per_rank = []
            for m in members:
                text = self.cluster.read_log(self.client, job.job_id, m.rank)
                lines_per_rank.append(
                    sum(f"rank={m.rank}/{job.spec.replicas}" in x for x in text.splitlines())
                )
            n.check(
                f"{name}: each rank's own log holds exactly one line",
                lines_per_rank == [1] * job.spec.replicas,
                f"lines per rank {lines_per_rank}",
            )
            copies = self.member_copies(job.job_id)
            n.check(
                f"{name}: each rank was started once, on one worker",
                sorted(copies) == list(range(job.spec.replicas))
                and all(len(v) == 1 for v in copies.values()),
                f"member directories per rank {[len(v) for _, v in sorted(copies.items())]}",
            )
            if name == "finetune":
                member_racks = {racks.get(m.node_id, "?") for m in members}
                n.check(
                    "finetune landed inside one rack",
                    len(member_racks) == 1,
                    f"racks {sorted(member_racks)}",
                )
            if name == "pretrain":
                token = self.tokens_before_failover.get(name)
                n.check(
                    "pretrain kept its fencing token across the failover",
                    job.attempt.fencing_token == token,
                    f"{token} before, {job.attempt.fencing_token} after",
                )
                mine = [x for x in ledger if x.startswith(f"{job.job_id} ")]
                ranks = sorted(int(x.split("rank=")[1].split("/")[0]) for x in mine)
                tokens = {x.rsplit("token=", 1)[1] for x in mine}
                n.check(
                    "the shared ledger has one line per rank, all with that token",
                    ranks == list(range(job.spec.replicas)) and tokens == {str(token)},
                    f"{len(mine)} lines, tokens {sorted(tokens)}",
                )

    def access_control(self) -> None:
        n = self.n
        n.step("Who may do what: users bob and alice, with tokens the admin makes")
        tokens = {user: self.client.create_token(user).token for user in ("bob", "alice")}
        n.say("the admin ran: synctl token create --user bob; ... --user alice")
        with (
            self.cluster.client(timeout_s=20.0, token=tokens["bob"]) as bob,
            self.cluster.client(timeout_s=20.0, token=tokens["alice"]) as alice,
        ):
            spec, _ = job_spec(
                {
                    "name": "bob-eval",
                    "replicas": 1,
                    "resources": {"cpu": 1, "memory": "256Mi"},
                    "command": 'echo "eval of $SYNAPSE_JOB_ID by bob"',
                }
            )
            job_id = bob.submit_job(spec).job_id
            self.jobs["bob-eval"] = job_id
            n.say(f"bob submitted bob-eval as {job_id}")
            job = self.wait_state("bob-eval", set(FINISHED_JOB_STATES), 30)
            n.check("bob's job ran and records him as its owner", job.owner == "bob", job.owner)
            text = self.cluster.read_log(bob, job_id, 0)
            n.check(
                "bob reads his job's log (with a grant from the leader)",
                f"eval of {job_id} by bob" in text,
                text.strip(),
            )
            cancel = refusal(lambda: alice.cancel_job(job_id, "not mine"))
            n.check("alice may not cancel bob's job", cancel == "PERMISSION_DENIED", cancel)
            logs = refusal(lambda: self.cluster.read_log(alice, job_id, 0))
            n.check("alice may not read bob's log", logs == "PERMISSION_DENIED", logs)

    def member_copies(self, job_id: str) -> dict[int, list[str]]:
        """rank -> the member directories that exist for it on any worker."""
        copies: dict[int, list[str]] = {}
        for w in self.cluster.workers:
            for d in (w.data_dir / "members" / job_id).glob("a*.t*.r*"):
                rank = int(d.name.rsplit(".r", 1)[1])
                copies.setdefault(rank, []).append(f"{w.node_id}:{d.name}")
        return copies

    def summary(self) -> None:
        n = self.n
        n.step("Summary")
        racks = racks_of(self.client)
        rows = [("job", "name", "state", "attempts", "token", "nodes", "racks", "exit codes")]
        for job in self.client.list_jobs():
            members = job.attempt.members
            rows.append(
                (
                    job.job_id,
                    job.spec.name,
                    str(job_state(job)),
                    str(job.attempts_made),
                    str(job.attempt.fencing_token),
                    ",".join(m.node_id for m in members),
                    ",".join(sorted({racks.get(m.node_id, "?") for m in members})),
                    ",".join(str(m.exit_code) if m.has_exit_code else "-" for m in members),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            n.say("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        status = self.client.cluster_status()
        leader = next((r for r in status.replicas if replica_role(r) is ReplicaRole.LEADER), None)
        if self.restarted and leader is not None:
            target = leader.commit_index
            restarted = self.cluster.replica(self.restarted)

            def caught_up() -> pb.ReplicaStatus | None:
                mine = self.cluster.replica_status(restarted)
                return (
                    mine
                    if replica_role(mine) is ReplicaRole.FOLLOWER and mine.last_applied >= target
                    else None
                )

            mine = wait_until(f"replica {self.restarted} to catch up", caught_up, 30)
            n.check(
                f"restarted replica {self.restarted} caught up as a follower",
                mine.last_applied >= target,
                f"applied {mine.last_applied}, leader's commit index was {target}",
            )
        status = self.client.cluster_status()
        n.say("")
        for r in status.replicas:
            n.say(
                f"replica {r.replica_id}: {replica_role(r) or 'unknown':<9} term {r.term}  "
                f"commit {r.commit_index}  {'healthy' if r.healthy else r.error}"
            )
        self.show_synctl()

    def show_synctl(self) -> None:
        """``synctl jobs`` as a user would type it, when the CLI is installed."""
        synctl = Path(sys.executable).parent / "synctl"
        if not synctl.exists():
            return
        self.n.say("")
        exports = self.cluster.exports()
        for line in exports:
            self.n.say(f"$ {line}")
        self.n.say("$ synctl jobs --all")
        env = dict(os.environ)
        for line in exports:
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = value
        try:
            result = subprocess.run(
                [str(synctl), "jobs", "--all"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
                env=env,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.n.say(f"(synctl did not run: {exc})")
            return
        for line in (result.stdout or result.stderr).splitlines():
            self.n.say(line)


# -------------------------------------------------------------------- running


class InterruptGuard:
    """Turns the first SIGINT or SIGTERM into KeyboardInterrupt; once :attr:`shielded`,
    signals are ignored so that the cleanup runs to the end."""

    def __init__(self) -> None:
        self.raised = False
        self.shielded = False
        self._previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self.raised and not self.shielded:
            self.raised = True
            raise KeyboardInterrupt

    def install(self) -> None:
        for sig in self._previous:
            signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, old in self._previous.items():
            if old is not None:
                signal.signal(sig, old)


def run(out: Callable[[str], None] = print) -> int:
    narrator = Narrator(out)
    out("synapse_ha demo: a real 3-replica control plane and mock-GPU workers on 127.0.0.1")
    guard = InterruptGuard()
    guard.install()
    scratch = Path(tempfile.mkdtemp(prefix="synapse-demo-"))
    cluster: DevCluster | None = None
    client: ClusterClient | None = None
    try:
        narrator.step("Starting 3 replicas and 4 workers (each its own process)")
        cluster = DevCluster(OPTIONS)
        cluster.start()
        client = cluster.client(timeout_s=20.0)
        demo = Demo(cluster, client, scratch / "ledger.txt", narrator)
        demo.show_cluster()
        demo.gang_waits()
        demo.worker_joins()
        demo.topology_gang()
        demo.kill_leader()
        demo.jobs_finish()
        demo.access_control()
        demo.summary()
    except KeyboardInterrupt:
        pass
    except (DemoFailed, DevClusterError, ClusterUnavailable, grpc.RpcError) as exc:
        narrator.check("the demo ran to the end", False, str(exc).splitlines()[0])
        out(str(exc))
    finally:
        guard.shielded = True
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.keep_data = bool(narrator.failed)
            cluster.stop()
        shutil.rmtree(scratch, ignore_errors=True)
        guard.restore()
    if guard.raised:
        out("")
        out("interrupted; every process the demo started has been stopped")
        return 130
    out("")
    total = narrator.passed + len(narrator.failed)
    if narrator.failed:
        out(f"{len(narrator.failed)} of {total} checks FAILED: {'; '.join(narrator.failed)}")
        if cluster is not None:
            out(f"logs kept in {cluster.logs_dir}")
        return 1
    out(
        f"all {total} checks passed in {time.monotonic() - narrator.started:.0f}s; "
        "every process the demo started has been stopped"
    )
    return 0


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
