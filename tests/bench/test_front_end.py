"""The front ends that bench/throughput.py can submit through: each caller gets its own
job's answer from a batched call, and the smoke run counts their CPU and batches."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
# Under pytest the name ``bench`` is this test package: load the module by its path.
_SPEC = importlib.util.spec_from_file_location("bench_front_end", ROOT / "bench" / "front_end.py")
assert _SPEC is not None and _SPEC.loader is not None
front_end = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = front_end  # its dataclasses look their module up
_SPEC.loader.exec_module(front_end)
Batcher = front_end.Batcher


class Leader:
    """``SubmitJobs`` as a stub's ``.future``: calls held until released, answered with
    a job id per request (or failed)."""

    def __init__(self) -> None:
        self.calls: list[pb.SubmitJobsRequest] = []
        self.pending: list[futures.Future[Any]] = []
        self.lock = threading.Lock()
        self.arrived = threading.Semaphore(0)

    def future(self, request: pb.SubmitJobsRequest, timeout: float) -> futures.Future[Any]:
        call: futures.Future[Any] = futures.Future()
        with self.lock:
            self.calls.append(request)
            self.pending.append(call)
        self.arrived.release()
        return call

    def answer(self, index: int, error: Exception | None = None) -> None:
        request, call = self.calls[index], self.pending[index]
        if error is not None:
            call.set_exception(error)
            return
        call.set_result(
            pb.SubmitJobsResponse(
                jobs=[pb.SubmitJobResponse(job_id=f"job-{r.request_id}") for r in request.jobs]
            )
        )


def _request(i: int) -> pb.SubmitJobRequest:
    return pb.SubmitJobRequest(request_id=f"r{i}")


def test_requests_waiting_leave_together_and_each_gets_its_own_answer() -> None:
    leader = Leader()
    batcher = Batcher(leader, batch=3, window=1)
    try:
        first = batcher.submit(_request(0))
        assert leader.arrived.acquire(timeout=5)  # the first leaves alone
        waiting = [batcher.submit(_request(i)) for i in range(1, 6)]
        leader.answer(0)
        assert first.result(timeout=5).job_id == "job-r0"
        # One call in flight at most: the five waiting leave as 3 and then 2.
        assert leader.arrived.acquire(timeout=5)
        assert [r.request_id for r in leader.calls[1].jobs] == ["r1", "r2", "r3"]
        leader.answer(1)
        assert leader.arrived.acquire(timeout=5)
        assert [r.request_id for r in leader.calls[2].jobs] == ["r4", "r5"]
        leader.answer(2)
        assert [f.result(timeout=5).job_id for f in waiting] == [f"job-r{i}" for i in range(1, 6)]
        assert batcher.calls == 3
    finally:
        batcher.stop()


def test_a_failed_call_fails_every_request_it_carried() -> None:
    leader = Leader()
    batcher = Batcher(leader, batch=10, window=1)
    try:
        carried = [batcher.submit(_request(0))]
        assert leader.arrived.acquire(timeout=5)
        leader.answer(0, grpc.RpcError("unavailable"))
        with pytest.raises(grpc.RpcError):
            carried[0].result(timeout=5)
    finally:
        batcher.stop()


@pytest.mark.integration
def test_throughput_smoke_through_two_front_ends() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "throughput.py"), "--smoke", "--front-ends", "2"],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout)
    submit, bind = report["submit"], report["bind"]
    assert submit["acknowledged"] == submit["distinct_jobs"] == submit["submissions"] == 200
    assert submit["front_ends"] == 2 and submit["cpu_us_per_submission"]["front_ends"] > 0
    assert submit["jobs_per_front_end_call"] >= 1
    assert bind["front_ends"] == 2 and bind["members_bound"] == 40 * 4
