"""Attacks of a plain ``user`` token on the control plane, on real processes (three TLS
replicas): starving other users (sizes, submit rate, pending jobs, event streams),
jumping the queue or preempting others (priority), taking over another user's submission
(request ids) and reading another user's secrets (redaction). Each test is the attack;
it asserts the refusal, with its typed reason, and that nothing changed.

The limits are replicated configuration; tests that need small ones set them with
SetLimits (admin) and put the defaults back afterwards.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.core.cluster_config import Limits
from synapse_ha.core.codec.formats import FORMAT
from synapse_ha.rpc.errors import Reason, RpcFailure, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.integration.cluster import LocalCluster, register_request, wait_for

pytestmark = pytest.mark.integration

SECRET = "hunter2-Zq9"
NEVER_FITS = 64  # GPUs: more than any node has, so these jobs stay pending


class World:
    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.admin = cluster.client(timeout_s=30.0)
        self.clients: dict[str, ClusterClient] = {}

    def user(self, name: str, role: str = "user", **allowance: object) -> ClusterClient:
        """A client holding a new token of ``name`` (``priority_classes``, ``max_priority``
        as CreateToken takes them)."""
        request = pb.CreateTokenRequest(user=name, role=role, **allowance)  # type: ignore[arg-type]
        answer = self.admin.call(
            "CreateToken", lambda a, t: self.admin.scheduler(a).CreateToken(request, timeout=t)
        )
        client = self.cluster.client(timeout_s=30.0, token=answer.token)
        self.clients[f"{name}-{answer.token_id}"] = client
        return client

    def jobs(self) -> list[pb.Job]:
        return self.admin.list_jobs()

    def job_ids(self) -> set[str]:
        """Every job the cluster holds: what an attack must not change."""
        return {j.job_id for j in self.jobs()}

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self.admin.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    cluster = LocalCluster(tmp_path_factory.mktemp("attacks"))
    w: World | None = None
    try:
        cluster.start()
        cluster.serving_leader(timeout_s=60)
        w = World(cluster)
        yield w
    finally:
        if w is not None:
            w.close()
        cluster.close()


@pytest.fixture(scope="module")
def alice(world: World) -> ClusterClient:
    return world.user("alice")


@pytest.fixture(scope="module")
def bob(world: World) -> ClusterClient:
    return world.user("bob")


def set_limits(client: ClusterClient, **values: int) -> pb.Limits:
    request = pb.SetLimitsRequest(
        values=[pb.LimitValue(name=k, value=v) for k, v in values.items()]
    )
    answer = client.call(
        "SetLimits", lambda a, t: client.scheduler(a).SetLimits(request, timeout=t)
    )
    limits: pb.Limits = answer.limits
    return limits


@contextmanager
def limits(world: World, **values: int) -> Iterator[None]:
    """The cluster's limits with ``values`` changed, then every one back to its default."""
    set_limits(world.admin, **values)
    try:
        yield
    finally:
        defaults = Limits()
        set_limits(world.admin, **{name: getattr(defaults, name) for name in values})


def pending_job(name: str, **fields: object) -> pb.JobSpec:
    return pb.JobSpec(
        name=name,
        replicas=1,
        resources=pb.Resources(cpu_milli=100, memory_mib=64, gpu=NEVER_FITS),
        shell_command="true",
        **fields,  # type: ignore[arg-type]
    )


def refused(call: object) -> RpcFailure:
    with pytest.raises(grpc.RpcError) as err:
        call()  # type: ignore[operator]
    return failure_of(err.value)


@contextmanager
def cancelled_afterwards(world: World) -> Iterator[None]:
    """Cancel, at the end, every unfinished job submitted in the block."""
    before = {j.job_id for j in world.jobs()}
    try:
        yield
    finally:
        for job in world.jobs():
            if job.job_id not in before and job.state in ("PENDING", "SCHEDULED", "RUNNING"):
                world.admin.cancel_job(job.job_id, reason="test cleanup")


# ------------------------------------------------------------------------- sizes


def test_a_huge_environment_is_refused_and_nothing_is_replicated(
    world: World, alice: ClusterClient
) -> None:
    before = world.job_ids()
    spec = pending_job("fat-env", env=[pb.EnvVar(name="BLOB", value="x" * (1024 * 1024))])
    failure = refused(lambda: alice.submit_job(spec))
    assert failure.reason is Reason.LIMIT_EXCEEDED
    assert failure.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert failure.metadata["limit"] == "env_bytes"
    assert failure.metadata["allowed"] == str(Limits().env_bytes)
    assert int(failure.metadata["actual"]) > 1024 * 1024
    # Each part within its own rule, the whole beyond limits.spec_bytes.
    fat = pending_job("fat-spec", env=[pb.EnvVar(name="PART", value="x" * 30_000)])
    fat.shell_command = "echo " + "y" * 60_000
    assert refused(lambda: alice.submit_job(fat)).metadata["limit"] == "spec_bytes"
    assert world.job_ids() == before


# ------------------------------------------------------------------------ the rate


def test_a_user_submitting_faster_than_its_rate_is_refused_until_its_bucket_refills(
    world: World,
) -> None:
    # A user of its own: the bucket it drains is no other test's.
    flooder = world.user("flooder")
    with cancelled_afterwards(world), limits(world, submit_burst=3, submit_per_s=1):
        # As fast as she can: the burst, then one a second at most (however slow this
        # machine is, the count is bounded by the time the attempts took).
        started = time.monotonic()
        accepted: list[str] = []
        failure: RpcFailure | None = None
        for i in range(30):
            try:
                accepted.append(flooder.submit_job(pending_job(f"burst-{i}")).job_id)
            except grpc.RpcError as exc:
                failure = failure_of(exc)
                break
        elapsed_s = time.monotonic() - started
        assert failure is not None, f"{len(accepted)} submissions in {elapsed_s:.1f} s"
        assert failure.reason is Reason.LIMIT_EXCEEDED
        assert failure.metadata["limit"] == "submit_per_s"
        assert 0 < int(failure.metadata["retry_after_ms"]) <= 1000
        assert 3 <= len(accepted) <= 3 + int(elapsed_s) + 1
        # The refused submission made nothing; the admin is not limited; the bucket refills.
        names = {j.spec.name for j in world.jobs()}
        assert f"burst-{len(accepted)}" not in names
        assert {f"burst-{i}" for i in range(len(accepted))} <= names
        for i in range(5):
            world.admin.submit_job(pending_job(f"admin-{i}"))
        wait_for("the flooder's bucket to refill", lambda: _accepted(flooder, "after-refill"), 5.0)


def _accepted(client: ClusterClient, name: str) -> bool:
    try:
        client.submit_job(pending_job(name))
    except grpc.RpcError as exc:
        if failure_of(exc).reason is Reason.LIMIT_EXCEEDED:
            return False
        raise
    return True


# ---------------------------------------------------------------- pending jobs


def test_a_user_at_its_pending_cap_takes_no_more_and_others_are_not_blocked(
    world: World, alice: ClusterClient, bob: ClusterClient
) -> None:
    with cancelled_afterwards(world), limits(world, pending_jobs_per_user=2):
        for i in range(2):
            alice.submit_job(pending_job(f"mine-{i}"))
        before = world.job_ids()
        failure = refused(lambda: alice.submit_job(pending_job("third")))
        assert failure.reason is Reason.LIMIT_EXCEEDED
        assert failure.metadata["limit"] == "pending_jobs_per_user"
        assert (failure.metadata["allowed"], failure.metadata["actual"]) == ("2", "2")
        assert "user alice has 2 pending jobs" in failure.message
        assert world.job_ids() == before
        # Another user, and the admin, still submit.
        assert bob.submit_job(pending_job("bobs")).created
        assert world.admin.submit_job(pending_job("admins")).created


def test_one_batch_cannot_pass_the_pending_cap_or_the_burst(
    world: World, alice: ClusterClient
) -> None:
    """SubmitJobs counts every job of the call against the caps and the submit rate: a
    batch that would pass one is refused whole, naming the job that would."""
    with cancelled_afterwards(world), limits(world, pending_jobs_per_user=3):
        alice.submit_job(pending_job("before"))
        before = world.job_ids()
        batch = [pb.SubmitJobRequest(spec=pending_job(f"b{i}")) for i in range(3)]
        failure = refused(lambda: alice.submit_jobs(batch))
        assert failure.reason is Reason.LIMIT_EXCEEDED
        assert failure.metadata["limit"] == "pending_jobs_per_user"
        assert failure.message.startswith("jobs[2]: ")
        assert world.job_ids() == before  # not even the first two
        assert [a.created for a in alice.submit_jobs(batch[:2])] == [True, True]
    with cancelled_afterwards(world), limits(world, submit_burst=5):
        before = world.job_ids()
        many = [pb.SubmitJobRequest(spec=pending_job(f"m{i}")) for i in range(6)]
        failure = refused(lambda: alice.submit_jobs(many))
        assert failure.reason is Reason.LIMIT_EXCEEDED
        assert "may submit at most limits.submit_burst (5) jobs at once" in failure.message
        assert world.job_ids() == before


def test_concurrent_submissions_cannot_overshoot_the_pending_cap(world: World) -> None:
    dave = world.user("dave")  # a bucket of his own: the rate is not what this tests
    with cancelled_afterwards(world), limits(world, pending_jobs_per_user=5):
        outcomes: list[str] = []
        lock = threading.Lock()

        def submit(i: int) -> None:
            try:
                dave.submit_job(pending_job(f"race-{i}"))
                outcome = "created"
            except grpc.RpcError as exc:
                outcome = f"{failure_of(exc).reason}: {failure_of(exc).message}"
            with lock:
                outcomes.append(outcome)

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        mine = [j for j in world.jobs() if j.owner == "dave" and j.state == "PENDING"]
    assert outcomes.count("created") == 5 == len(mine), outcomes
    assert sum(o.startswith("LIMIT_EXCEEDED") for o in outcomes) == 7, outcomes


# ----------------------------------------------------------------- event streams


class Stream:
    """A WatchEvents stream held open (follow) until :meth:`close`."""

    def __init__(self, client: ClusterClient, address: str) -> None:
        self.call = client.scheduler(address).WatchEvents(
            pb.WatchEventsRequest(since_index=0, follow=True), timeout=60
        )
        self.first: pb.Event | RpcFailure | None = None

    def opened(self) -> pb.Event | RpcFailure:
        """The first event, or the refusal: either means the server decided."""
        try:
            self.first = next(iter(self.call))
        except grpc.RpcError as exc:
            self.first = failure_of(exc)
        return self.first

    def close(self) -> None:
        self.call.cancel()


def test_users_cannot_hold_every_event_stream_of_a_replica(
    world: World, alice: ClusterClient, bob: ClusterClient
) -> None:
    leader = world.cluster.serving_leader()
    world.admin.submit_job(pending_job("an-event"))  # at least one event to read
    streams: list[Stream] = []

    def open_stream(client: ClusterClient) -> pb.Event | RpcFailure:
        stream = Stream(client, leader.grpc)
        streams.append(stream)
        return stream.opened()

    try:
        with limits(world, watch_streams_per_identity=2, watch_streams_total=3):
            assert isinstance(open_stream(alice), pb.Event)
            assert isinstance(open_stream(alice), pb.Event)
            third = open_stream(alice)
            assert isinstance(third, RpcFailure) and third.reason is Reason.LIMIT_EXCEEDED
            assert third.metadata["limit"] == "watch_streams_per_identity"
            assert isinstance(open_stream(bob), pb.Event)  # the last of the total
            full = open_stream(bob)
            assert isinstance(full, RpcFailure)
            assert full.metadata["limit"] == "watch_streams_total"
            # Users hold every stream they may: the admin still gets one.
            assert isinstance(open_stream(world.admin), pb.Event)
    finally:
        for stream in streams:
            stream.close()


# ---------------------------------------------------------------------- priority


def test_a_user_cannot_preempt_others_or_jump_the_queue(world: World, alice: ClusterClient) -> None:
    before = world.job_ids()
    preempting = pending_job("evict-them", priority_class="high")
    failure = refused(lambda: alice.submit_job(preempting))
    assert failure.reason is Reason.PERMISSION_DENIED
    assert "priority class high" in failure.message
    assert "listed by the queue" in failure.message
    jumping = pending_job("me-first", priority=1_000_000)
    failure = refused(lambda: alice.submit_job(jumping))
    assert failure.reason is Reason.PERMISSION_DENIED
    assert "priority 1000000" in failure.message and "max_priority" in failure.message
    assert world.job_ids() == before


def test_preemption_needs_a_queue_that_lists_the_class_and_a_token_that_allows_it(
    world: World, alice: ClusterClient
) -> None:
    queue = pb.Queue(name="urgent", priority_classes=["normal", "high"])
    world.admin.call("SetQueue", lambda a, t: world.admin.scheduler(a).SetQueue(
        pb.SetQueueRequest(queue=queue), timeout=t))  # fmt: skip
    plain = world.user("carol", queues=["urgent"])
    spec = pending_job("carols", queue="urgent", priority_class="high")
    with cancelled_afterwards(world):
        failure = refused(lambda: plain.submit_job(spec))
        assert failure.reason is Reason.PERMISSION_DENIED
        assert "synctl token create --priority-class high" in failure.message
        allowed = world.user("carol", queues=["urgent"], priority_classes=["high"])
        assert allowed.submit_job(spec).created


# --------------------------------------------------------------------- request ids


def test_another_users_request_id_makes_a_job_of_ones_own(
    world: World, alice: ClusterClient, bob: ClusterClient
) -> None:
    with cancelled_afterwards(world):
        bobs = bob.submit_job(pending_job("nightly-bob"), request_id="nightly")
        squatted = alice.submit_job(pending_job("nightly-alice"), request_id="nightly")
        assert bobs.created and squatted.created
        assert squatted.job_id != bobs.job_id
        assert world.admin.get_job(squatted.job_id).owner == "alice"
        # Bob's retry still finds his job, not hers.
        again = bob.submit_job(pending_job("nightly-bob"), request_id="nightly")
        assert (again.job_id, again.created) == (bobs.job_id, False)
        assert bob.get_job(bobs.job_id).request_id == "nightly"
        assert alice.get_job(bobs.job_id).request_id == ""  # not even the id is shown


# ---------------------------------------------------------------------- redaction


def test_another_users_secrets_never_reach_a_user(
    world: World, alice: ClusterClient, bob: ClusterClient
) -> None:
    """Bob's job names a secret in its workdir, image, request id and in the detail of
    its member's exit (the text its worker reports); alice sees none of it through
    GetJob, ListJobs or WatchEvents, while bob sees it all."""
    node = register_request("n-redact", "127.0.0.9", gpu=8)
    world.admin.register_node(node)
    spec = pb.JobSpec(
        name="bobs-secret-job",
        replicas=1,
        resources=pb.Resources(cpu_milli=100, memory_mib=64, gpu=8),
        shell_command=f"train --password={SECRET}",
        env=[pb.EnvVar(name="TOKEN", value=SECRET)],
        workdir=f"/data/{SECRET}",
    )
    job_id = bob.submit_job(spec, request_id=f"req-{SECRET}").job_id
    bound = wait_for(
        "bob's job bound to the node",
        lambda: (j := world.admin.get_job(job_id)).HasField("attempt") and j,
        timeout_s=30,
    )
    world.admin.heartbeat(
        pb.HeartbeatRequest(
            node_id="n-redact",
            reports=[
                pb.MemberReport(
                    job_id=job_id,
                    fencing_token=bound.attempt.fencing_token,
                    rank=0,
                    kind=pb.MemberReport.EXITED,
                    exit_code=1,
                    detail=f"Traceback: bad password {SECRET}",
                )
            ],
        )
    )
    wait_for("bob's job to fail", lambda: world.admin.get_job(job_id).state == "FAILED", 30)
    world.admin.set_node_status("n-redact", "cordon", "redaction test done")

    owners_view = str(bob.get_job(job_id))
    assert owners_view.count(SECRET) >= 4  # reason, env, workdir, command: all there

    seen_by_alice = [
        str(alice.get_job(job_id)),
        str(next(j for j in alice.list_jobs() if j.job_id == job_id)),
        *(str(e) for e in alice.watch_events() if e.job_id == job_id),
    ]
    assert len(seen_by_alice) >= 4  # the job twice, and its events
    for view in seen_by_alice:
        assert SECRET not in view, view
    shown = alice.get_job(job_id)
    assert shown.redacted and shown.state == "FAILED"
    assert shown.reason.startswith("attempt 1 failed (rank 0 on n-redact exited with code 1")
    assert "[details withheld]" in shown.reason
    bobs_events = [str(e) for e in bob.watch_events() if e.job_id == job_id]
    assert any(SECRET in e for e in bobs_events)


def test_the_limits_are_readable_by_users_and_changed_by_admins_only(
    world: World, alice: ClusterClient
) -> None:
    answer = alice.call("GetLimits", lambda a, t: alice.scheduler(a).GetLimits(
        pb.GetLimitsRequest(), timeout=t))  # fmt: skip
    assert answer.limits.submit_burst == Limits().submit_burst
    failure = refused(lambda: set_limits(alice, submit_per_s=1_000_000))
    assert failure.reason is Reason.PERMISSION_DENIED
    bad = refused(lambda: set_limits(world.admin, watch_streams_per_identity=0))
    assert bad.reason is Reason.INVALID_FIELD
    unknown = refused(lambda: set_limits(world.admin, gpus_per_user=4))
    assert unknown.reason is Reason.INVALID_FIELD and "no limit 'gpus_per_user'" in unknown.message
    after = alice.call("GetLimits", lambda a, t: alice.scheduler(a).GetLimits(
        pb.GetLimitsRequest(), timeout=t))  # fmt: skip
    assert after.limits == answer.limits


# --------------------------------------------------------------- swamping a node


def test_a_tiny_array_cannot_swamp_a_node(world: World, alice: ClusterClient) -> None:
    """Alice's 300 tasks asking a millicore and a MiB each, on real replicas: the leader
    binds at most limits.members_per_node_per_user of them on a node, and every task left
    waiting says which limit holds it (tests/security/test_attack_swamp.py has the rest
    of the attack on the core)."""
    # The floors and caps are in force once every replica reads the newest format.
    newest = lambda: world.admin.cluster_status().format_floor == FORMAT  # noqa: E731
    wait_for("every replica to read the newest format", newest, timeout_s=30)
    world.admin.register_node(register_request("n-swamp", "127.0.0.10", gpu=0))
    spec = pb.JobSpec(
        name="swamp",
        replicas=1,
        resources=pb.Resources(cpu_milli=1, memory_mib=1, gpu=0),
        shell_command="true",
        array="0-299",
    )
    array_id = alice.submit_job(spec).job_id
    try:

        def decided() -> list[pb.Job] | None:
            tasks = [j for j in world.jobs() if j.array_id == array_id]
            waiting = [j for j in tasks if j.reason_code == "pending_first_pass"]
            return tasks if len(tasks) == 300 and not waiting else None

        tasks = wait_for("the leader's pass over the array", decided, timeout_s=30)
        on_node: dict[str, int] = {}
        for j in tasks:
            if j.state == "SCHEDULED":
                for m in j.attempt.members:
                    on_node[m.node_id] = on_node.get(m.node_id, 0) + 1
        assert on_node, "no task was bound"
        assert max(on_node.values()) < 300, f"one node runs the whole array: {on_node}"
        cap = Limits().members_per_node_per_user
        assert max(on_node.values()) <= cap, on_node
        held = [j for j in tasks if j.state == "PENDING"]
        assert held and all(j.reason_code == "waiting_member_cap" for j in held)
        assert f"limits.members_per_node_per_user: at most {cap}" in held[0].reason
    finally:
        world.admin.cancel_job(array_id, reason="test cleanup")
        world.admin.set_node_status("n-swamp", "cordon", "swamp test done")
