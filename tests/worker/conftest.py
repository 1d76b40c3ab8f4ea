from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from synapse_ha.worker.cgroups import CgroupLimiter
from synapse_ha.worker.images import ImageRuntime
from synapse_ha.worker.lease import LeaseFile
from synapse_ha.worker.members import ExecutorSettings, MemberExecutor
from tests.leftovers import SESSION_VARIABLE
from tests.worker.helpers import Fifo

MakeExecutor = Callable[..., MemberExecutor]


@pytest.fixture
def make_executor(tmp_path: Path) -> Iterator[MakeExecutor]:
    """Executors over data directories under ``tmp_path`` with a lease valid for an hour;
    every member they started is killed at teardown, also when the test fails."""
    made: list[MemberExecutor] = []

    def make(
        name: str = "node",
        *,
        stop_grace_s: float = 2.0,
        lease_s: float = 3600.0,
        image_runtime: ImageRuntime | None = None,
        cgroups: CgroupLimiter | None = None,
        pid_namespace: bool = False,
    ) -> MemberExecutor:
        data = tmp_path / name
        data.mkdir(exist_ok=True)
        lease = LeaseFile(data / "lease")
        lease.write(time.monotonic() + lease_s)
        executor = MemberExecutor(
            data,
            lease.path,
            ExecutorSettings(
                stop_grace_s=stop_grace_s,
                fence_grace_s=0.2,
                pid_namespace=pid_namespace,
                # Members get none of the test process's variables but those named: the
                # session's, by which a member left running is found (tests/leftovers.py).
                member_env_passthrough=(SESSION_VARIABLE,),
            ),
            image_runtime=image_runtime,
            cgroups=cgroups,
        )
        made.append(executor)
        return executor

    yield make
    for executor in made:
        executor.kill_all("test teardown")


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Fifo]:
    f = Fifo(tmp_path / "fifo")
    yield f
    f.close()
