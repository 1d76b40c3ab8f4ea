"""SetLimits and GetLimits on one in-process replica (tests/rpc/authed.py): a limit the
leader's configuration file sets is refused, with the file named; the others change."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from synapse_ha.rpc.errors import ErrorReason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.rpc.authed import Replica, serving_replica


@pytest.fixture
def replica() -> Iterator[Replica]:
    with serving_replica() as started:
        yield started


def _as(replica: Replica, who: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {replica.tokens[who]}")]


def test_a_limit_pinned_by_the_leaders_file_is_refused_and_nothing_changes(
    replica: Replica,
) -> None:
    replica.ctx.pinned_limits = frozenset({"submit_per_s"})
    request = pb.SetLimitsRequest(
        values=[
            pb.LimitValue(name="submit_per_s", value=5),
            pb.LimitValue(name="submit_burst", value=5),
        ]
    )
    with pytest.raises(grpc.RpcError) as refused:
        replica.scheduler.SetLimits(request, metadata=_as(replica, "admin"), timeout=5)
    failure = failure_of(refused.value)
    assert failure.reason is ErrorReason.CONFLICT
    assert "submit_per_s" in failure.message and "[limits] in its TOML" in failure.message
    before = replica.backend.state.config.limits
    assert (before.submit_per_s, before.submit_burst) == (50, 200)

    other = pb.SetLimitsRequest(values=[pb.LimitValue(name="submit_burst", value=5)])
    answer = replica.scheduler.SetLimits(other, metadata=_as(replica, "admin"), timeout=5)
    assert answer.limits.submit_burst == 5 == replica.backend.state.config.limits.submit_burst
    shown = replica.scheduler.GetLimits(
        pb.GetLimitsRequest(), metadata=_as(replica, "bob"), timeout=5
    )
    assert shown.limits == answer.limits
