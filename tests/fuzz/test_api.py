"""Fuzzing every request message of the control API against a live 3-replica cluster.

Each example is one batch of requests drawn generically from the protobuf descriptors
(:mod:`tests.fuzz.strategies`), each sent to a random replica as a random identity
(admin, token user, node certificate). After every batch: every replica runs and answers
GetClusterStatus within a bound; no answer was UNKNOWN or INTERNAL (an exception escaped a
handler); the core invariants hold on the replicated state; and when every request of the
batch was rejected, the replicated state is byte-for-byte what it was before the batch.

The admin does not send AddReplica or RemoveReplica: an accepted membership change to a
made-up address is a legitimate admin action that costs the cluster its quorum. The user
and the node send them (and must be refused).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.fuzz import harness
from tests.fuzz.cluster import FuzzCluster
from tests.fuzz.strategies import Method, message_strategy, mutation_strategy, request_methods

pytestmark = pytest.mark.integration

METHODS = request_methods([pb.DESCRIPTOR])
IDENTITIES = ["admin", "user", "node"]
ADMIN_SKIPS = {"AddReplica", "RemoveReplica"}
TALLY = harness.Tally("api")


# Valid requests, mutated one or two fields at a time (see mutation_strategy).
SEEDS: dict[str, Message] = {
    "SubmitJobRequest": pb.SubmitJobRequest(
        spec=pb.JobSpec(
            name="fuzz",
            replicas=2,
            resources=pb.Resources(cpu_milli=500, memory_mib=64, gpu=1),
            shell_command="echo $RANK",
            env=[pb.EnvVar(name="A", value="b")],
        ),
        request_id="fuzz-request-0001",
    ),
    "CreateTokenRequest": pb.CreateTokenRequest(user="someone", role="user", ttl_ms=60_000),
    "SetQueueRequest": pb.SetQueueRequest(queue=pb.Queue(name="fuzzq", gpu=4, cohort="c")),
    "ListJobsRequest": pb.ListJobsRequest(limit=10),
    "GetUsageRequest": pb.GetUsageRequest(by="user", since_ms=1),
    "WatchEventsRequest": pb.WatchEventsRequest(since_index=1),
    "GetClusterStatusRequest": pb.GetClusterStatusRequest(),
}


def _requests(method: Method) -> st.SearchStrategy[list[Message]]:
    one = message_strategy(method.input)
    seed = SEEDS.get(method.input.name)
    if seed is not None:
        one = st.one_of(one, mutation_strategy(seed), st.just(seed))
    return st.lists(one, min_size=1, max_size=3 if method.client_streaming else 1)


@st.composite
def _call(draw: Any, methods: list[Method]) -> tuple[str, Method, str, list[Message]]:
    method = draw(st.sampled_from(methods))
    identities = [i for i in IDENTITIES if not (i == "admin" and method.name in ADMIN_SKIPS)]
    identity = draw(st.sampled_from(identities))
    target = draw(st.sampled_from(["leader", "leader", "r1", "r2", "r3"]))
    return identity, method, target, draw(_requests(method))


BATCH = st.lists(_call(METHODS), min_size=1, max_size=6)
STREAMING = [m for m in METHODS if m.server_streaming or m.client_streaming]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzCluster]:
    c = FuzzCluster(tmp_path_factory.mktemp("fuzz-api"))
    try:
        c.start()
        yield c
    finally:
        c.close()
        harness.record(TALLY.summary())


def run_batch(cluster: FuzzCluster, batch: list[tuple[str, Method, str, list[Message]]]) -> None:
    leader = cluster.leader_id()
    before = cluster.last
    if before is None or before.replica_id != leader:
        before = cluster.settled_state(leader)
    kinds = []
    for identity, method, target, requests in batch:
        replica = leader if target == "leader" else target
        outcome = harness.call(
            cluster.channels[identity, replica], method, requests, cluster.metadata[identity]
        )
        TALLY.add(method.name, identity, outcome)
        kinds.append(outcome.kind)
    TALLY.batches += 1
    cluster.assert_alive()
    assert TALLY.crashes == [], "\n".join(TALLY.crashes)
    assert harness.TIMEOUT not in kinds, f"a call hung: {batch}"
    after = cluster.settled_state(leader)
    cluster.last = after
    cluster.assert_invariants(after)
    if all(k == harness.REJECTED for k in kinds):
        TALLY.state_checks += 1
        assert cluster.comparable(after) == cluster.comparable(before), (
            f"rejected requests changed the replicated state "
            f"(applied {before.last_applied} -> {after.last_applied}): "
            f"{[(i, m.name, r) for i, m, _, r in batch]}"
        )


@settings(
    max_examples=harness.examples(30),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)
@given(batch=BATCH)
def test_random_requests_leave_the_cluster_alive_and_consistent(
    cluster: FuzzCluster, batch: list[tuple[str, Method, str, list[Message]]]
) -> None:
    TALLY.examples += 1
    run_batch(cluster, batch)


@settings(
    max_examples=harness.examples(8),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)
@given(batch=st.lists(_call(STREAMING), min_size=1, max_size=3))
def test_random_streaming_requests(
    cluster: FuzzCluster, batch: list[tuple[str, Method, str, list[Message]]]
) -> None:
    TALLY.examples += 1
    run_batch(cluster, batch)


def test_the_state_comparison_sees_an_accepted_write(cluster: FuzzCluster) -> None:
    """The check of rejected batches can fail: an accepted submission changes the bytes."""
    leader = cluster.leader_id()
    before = cluster.settled_state(leader)
    (submit,) = [m for m in METHODS if m.name == "SubmitJob"]
    seed = pb.SubmitJobRequest()
    seed.CopyFrom(SEEDS["SubmitJobRequest"])
    seed.request_id = "fuzz-state-check"
    outcome = harness.call(cluster.channels["admin", leader], submit, [seed])
    assert outcome.kind == harness.ACCEPTED, outcome
    after = cluster.settled_state(leader)
    cluster.last = after
    assert cluster.comparable(after) != cluster.comparable(before)


def test_every_replica_ends_with_the_same_valid_state(cluster: FuzzCluster) -> None:
    for snap in cluster.converged():
        cluster.assert_invariants(snap)
    assert {"SubmitJob", "WatchEvents", "SaveSnapshot"} <= {m.name for m in METHODS}
