"""Job history, usage and the event stream on real processes: three TLS replicas, one
mock-GPU worker, an admin (certificate) and two users (tokens).

The retention purge is not exercised here (the replicas keep finished jobs for an hour;
tests/history/test_replica_hook.py purges at once through the same apply hook)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from synapse_ha.cli.main import cli
from synapse_ha.client.cluster import ClusterClient, ClusterUnavailable
from synapse_ha.rpc.errors import Reason, RpcFailure, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.cli.conftest import CREDENTIAL_VARIABLES, exported
from tests.integration.cluster import LocalCluster, Replica, wait_for
from tests.worker.workers import LocalWorkers

pytestmark = pytest.mark.integration

# (user, job name, GPUs, seconds the member sleeps)
JOBS = (("alice", "alice-train", 2, 1.0), ("bob", "bob-train", 1, 2.0))
WAIT_S = 90.0


@dataclass
class World:
    cluster: LocalCluster
    workers: LocalWorkers
    admin: ClusterClient
    users: dict[str, ClusterClient]
    job_ids: dict[str, str] = field(default_factory=dict)  # user -> job id
    start_index: int = 0  # the newest event index before the jobs were submitted
    clients: list[ClusterClient] = field(default_factory=list)
    restarted: Replica | None = None

    def on(self, address: str) -> ClusterClient:
        """An admin client of one replica only (history and events are answered from
        the replica's own copy)."""
        client = ClusterClient(
            [address], timeout_s=20.0, channel_factory=self.cluster.transport.channel
        )
        self.clients.append(client)
        return client

    def history_on(self, address: str) -> list[pb.HistoryJob]:
        return self.on(address).list_history()

    def whole(self) -> list[Replica]:
        """The replicas that hold every event since the jobs ran: all but the one
        :func:`restarted_follower` restarted from a snapshot (the tests run in any order)."""
        return [r for r in self.cluster.replicas if r is not self.restarted]

    def close(self) -> None:
        for client in [*self.clients, *self.users.values(), self.admin]:
            client.close()


def gpu_job(name: str, gpus: int, sleep_s: float) -> pb.JobSpec:
    return pb.JobSpec(
        name=name,
        replicas=1,
        resources=pb.Resources(cpu_milli=100, memory_mib=64, gpu=gpus),
        shell_command=f"sleep {sleep_s}",
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("history")
    # Frequent compaction, so that a restarted replica goes through a snapshot too.
    cluster = LocalCluster(root / "cluster", extra_args=["--compaction-entries", "50"])
    workers = LocalWorkers(root / "workers", cluster.grpc_addresses, cluster.credentials)
    workers.root.mkdir(parents=True)
    w: World | None = None
    try:
        cluster.start()
        cluster.serving_leader(timeout_s=60)
        assert cluster.credentials is not None, "the test cluster must run with TLS"
        admin = cluster.client(timeout_s=30.0)
        users = {
            user: cluster.client(timeout_s=30.0, token=admin.create_token(user).token)
            for user in ("alice", "bob")
        }
        w = World(cluster, workers, admin, users)
        workers.start("w1", "--mock-gpus", "4")
        wait_for("w1 to register", lambda: len(admin.list_nodes()) == 1, WAIT_S)
        w.start_index = max([e.index for e in admin.watch_events()], default=0)
        for user, name, gpus, sleep_s in JOBS:
            w.job_ids[user] = users[user].submit_job(gpu_job(name, gpus, sleep_s)).job_id
        for job_id in w.job_ids.values():
            wait_for(
                f"{job_id} to finish",
                lambda j=job_id: admin.get_job(j).state in ("SUCCEEDED", "FAILED"),
                WAIT_S,
            )
            assert admin.get_job(job_id).state == "SUCCEEDED", cluster.logs()
        yield w
    except Exception:
        print(cluster.logs(), workers.logs())
        raise
    finally:
        if w is not None:
            w.close()
        workers.close()
        cluster.close()


def row_key(j: pb.HistoryJob) -> bytes:
    return j.SerializeToString(deterministic=True)


def all_replicas_have(world: World, count: int) -> list[list[pb.HistoryJob]]:
    def probe() -> list[list[pb.HistoryJob]] | None:
        rows = [world.history_on(r.grpc) for r in world.cluster.replicas]
        return rows if all(len(r) == count for r in rows) else None

    return wait_for(f"{count} finished jobs on every replica", probe, WAIT_S)


def test_every_replica_holds_the_same_history(world: World) -> None:
    per_replica = all_replicas_have(world, len(JOBS))
    first = [row_key(j) for j in per_replica[0]]
    for rows in per_replica[1:]:
        assert [row_key(j) for j in rows] == first
    rows = {j.job_id: j for j in per_replica[0]}
    for user, name, gpus, sleep_s in JOBS:
        row = rows[world.job_ids[user]]
        assert (row.owner, row.name, row.state, row.queue) == (user, name, "SUCCEEDED", "default")
        assert row.attempts == 1 and row.nodes == ["w1"]
        (attempt,) = row.attempt_list
        assert attempt.gpus == gpus
        # The member slept sleep_s between its bind and its end (both commands' times).
        assert attempt.ended_at_ms - attempt.bound_at_ms >= sleep_s * 1000
        assert attempt.gpu_ms == gpus * (attempt.ended_at_ms - attempt.bound_at_ms)
        assert row.gpu_ms == attempt.gpu_ms
        assert row.spec.shell_command == f"sleep {sleep_s}"


def test_usage_sums_the_recorded_gpu_time(world: World) -> None:
    rows = {j.owner: j for j in all_replicas_have(world, len(JOBS))[0]}
    since = min(j.submitted_at_ms for j in rows.values()) - 1
    usage = world.admin.get_usage("user", since)
    per_user: dict[str, int] = {}
    for r in usage.rows:
        per_user[r.key] = per_user.get(r.key, 0) + r.gpu_ms
    assert per_user == {user: rows[user].gpu_ms for user, *_ in JOBS}
    by_queue = world.admin.get_usage("queue", since)
    assert sum(r.gpu_ms for r in by_queue.rows) == sum(j.gpu_ms for j in rows.values())
    assert {r.key for r in by_queue.rows} == {"default"}


def test_a_user_sees_only_its_own_history_and_usage(world: World) -> None:
    all_replicas_have(world, len(JOBS))
    alice = world.users["alice"]
    assert [j.owner for j in alice.list_history()] == ["alice"]
    assert {r.key for r in alice.get_usage("user", 1).rows} == {"alice"}
    with pytest.raises(grpc.RpcError) as refused:
        alice.list_history(user="bob")
    assert failure_of(refused.value).reason is Reason.PERMISSION_DENIED
    assert {j.owner for j in world.admin.list_history()} == {"alice", "bob"}


def kinds_of(events: list[pb.Event], job_id: str) -> list[str]:
    return [e.kind for e in events if e.job_id == job_id]


def test_events_tell_each_job_in_order_and_resume_on_another_replica(world: World) -> None:
    whole = world.whole()
    first, second = whole[:2]
    job_ids = list(world.job_ids.values())

    def probe() -> dict[str, list[pb.Event]] | None:
        held = {r.replica_id: list(world.on(r.grpc).watch_events(world.start_index)) for r in whole}
        done = all("exited" in kinds_of(e, j) for e in held.values() for j in job_ids)
        return held if done else None

    held = wait_for("every replica to hold the jobs' events", probe, WAIT_S)
    for events in held.values():
        for job_id in job_ids:
            assert kinds_of(events, job_id) == ["submitted", "bound", "started", "exited"]
        assert [e.index for e in events] == sorted({e.index for e in events})
    # Every replica streams the same events with the same indexes.
    shortest = min(len(events) for events in held.values())
    for events in held.values():
        assert events[:shortest] == held[first.replica_id][:shortest]

    # Follow on one replica, stop after alice's job started, resume on another from that
    # index.
    alice_job = world.job_ids["alice"]
    seen: list[pb.Event] = []
    follower = world.on(first.grpc).watch_events(world.start_index, follow=True)
    for event in follower:
        seen.append(event)
        if event.job_id == alice_job and event.kind == "started":
            break
    follower.close()  # the stream is cancelled: a disconnect
    resumed = list(world.on(second.grpc).watch_events(seen[-1].index))
    n = len(held[second.replica_id])
    assert (seen + resumed)[:n] == held[second.replica_id]
    assert kinds_of(resumed, alice_job) == ["exited"]


def test_a_follower_streams_new_events_as_they_are_applied(world: World) -> None:
    follower_replica = world.cluster.followers(world.cluster.serving_leader())[0]
    got: list[pb.Event] = []
    ready = threading.Event()

    def watch() -> None:
        client = world.on(follower_replica.grpc)
        newest = max([e.index for e in client.watch_events()], default=0)
        ready.set()
        for event in client.watch_events(newest, follow=True, reconnect_s=WAIT_S):
            got.append(event)
            if event.kind == "node_cordoned":
                return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    assert ready.wait(WAIT_S)
    world.admin.set_node_status("w1", "cordon", "history test")
    try:
        thread.join(WAIT_S)
        assert not thread.is_alive()
        assert [(e.kind, e.node_id, e.detail) for e in got if e.node_id] == [
            ("node_cordoned", "w1", "history test")
        ]
    finally:
        world.admin.set_node_status("w1", "uncordon")


def restarted_follower(world: World) -> Replica:
    """A follower killed with SIGKILL and started again (once per module), after enough
    entries for a compaction (every 50), so that it restarts from a snapshot."""
    if world.restarted is not None:
        return world.restarted
    cluster = world.cluster
    leader = cluster.serving_leader()
    victim = cluster.followers(leader)[0]
    for i in range(60):  # more GPUs than any node has: they wait, and finish nothing
        filler = gpu_job(f"filler-{i}", 64, 1.0)
        filler.wait_for_nodes = True
        world.admin.submit_job(filler)
    cluster.kill(victim)
    cluster.start(victim)
    cluster.serving_leader(timeout_s=60)
    world.restarted = victim
    return victim


def test_an_index_older_than_the_replica_holds_is_refused_with_a_code(world: World) -> None:
    restarted = restarted_follower(world)
    client = world.on(restarted.grpc)
    # It restarted from a snapshot: the events of the commands in it are not held.

    def refusal() -> RpcFailure | None:
        try:
            list(client.watch_events(world.start_index, reconnect_s=1.0))
        except grpc.RpcError as exc:
            failure = failure_of(exc)
            return failure if failure.reason is Reason.EVENTS_EXPIRED else None
        except ClusterUnavailable:
            return None  # still starting
        return None

    failure = wait_for("the restarted replica to refuse an old index", refusal, WAIT_S)
    oldest = int(failure.metadata["oldest_index"])
    assert oldest > world.start_index
    assert all(e.index > oldest for e in client.watch_events(oldest))


def test_history_survives_a_replica_restart(world: World) -> None:
    before = all_replicas_have(world, len(JOBS))
    restarted_follower(world)
    after = all_replicas_have(world, len(JOBS))
    assert [[row_key(j) for j in rows] for rows in after] == [
        [row_key(j) for j in rows] for rows in before
    ]


def test_synctl_history_usage_and_events(world: World) -> None:
    assert world.cluster.credentials is not None
    env: dict[str, str | None] = dict.fromkeys(CREDENTIAL_VARIABLES)
    env.update(exported(world.cluster.credentials.exports()))
    env["XDG_CONFIG_HOME"] = "/nonexistent"
    runner = CliRunner()

    def synctl(*args: str) -> str:
        result = runner.invoke(
            cli,
            ["--cluster", ",".join(r.grpc for r in world.whole()), "--timeout", "20", *args],
            catch_exceptions=False,
            env=env,
        )
        assert result.exit_code == 0, result.output
        return result.output

    history = json.loads(synctl("history", "--user", "alice", "-o", "json"))
    assert [j["job_id"] for j in history["jobs"]] == [world.job_ids["alice"]]
    assert "alice-train" in synctl("history", "--since", "1d")
    usage = json.loads(synctl("usage", "--by", "queue", "--since", "1d", "-o", "json"))
    assert usage["by"] == "queue" and usage["total_gpu_hours"] > 0
    events = json.loads(synctl("events", "--since", str(world.start_index), "-o", "json"))
    kinds = [e["kind"] for e in events["events"] if e.get("job_id") == world.job_ids["bob"]]
    assert kinds == ["submitted", "bound", "started", "exited"]
    assert "exited" in synctl("events", "--since", str(world.start_index))


def test_the_data_directory_holds_the_history_file(world: World) -> None:
    for replica in world.cluster.replicas:
        assert Path(replica.data_dir, "history.sqlite3").is_file()
