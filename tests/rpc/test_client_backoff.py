"""The client's back-off while a leader is being elected: its pauses stay short (an
election ends within an election timeout), while other refusals keep backing off
exponentially. The pauses are recorded, not slept."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

import synapse_ha.client.cluster as client_module
from synapse_ha.client.cluster import ClusterClient
from synapse_ha.rpc.errors import ErrorReason
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.rpc.test_errors import Replica, Step, answer, fails, serve

__all__ = ["serve"]


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    recorded: list[float] = []
    monkeypatch.setattr(client_module.time, "sleep", recorded.append)
    return recorded


def _submit_through(replica: Replica) -> pb.SubmitJobResponse:
    client = ClusterClient(
        [replica.address],
        timeout_s=30.0,
        per_try_timeout_s=5.0,
        backoff_s=0.05,
        max_backoff_s=1.0,
        election_backoff_s=0.2,
        rng=random.Random(3),
    )
    with client:
        return client.submit_job(pb.JobSpec(name="a"), request_id="r1")


@pytest.mark.parametrize("reason", [ErrorReason.NO_LEADER, ErrorReason.LEADER_NOT_READY])
def test_while_a_leader_is_elected_the_pause_stays_short(
    serve: Callable[[list[Step]], Replica], pauses: list[float], reason: ErrorReason
) -> None:
    replica = serve([fails(reason)] * 8 + [answer()])
    assert _submit_through(replica).job_id == "job-000001"
    assert len(pauses) == 8
    assert max(pauses) <= 0.2
    assert pauses[-1] >= 0.1  # still a back-off: half the cap at least, with jitter


def test_other_refusals_keep_backing_off_exponentially(
    serve: Callable[[list[Step]], Replica], pauses: list[float]
) -> None:
    replica = serve([fails(ErrorReason.OVERLOADED)] * 8 + [answer()])
    assert _submit_through(replica).job_id == "job-000001"
    assert len(pauses) == 8
    assert max(pauses) > 0.2
