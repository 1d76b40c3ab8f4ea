"""API front ends in processes of their own: what they buy one-job-a-call submissions
(``bench/throughput.py --front-ends N``).

A replica serves every gRPC call in the interpreter that also runs Raft, the apply
thread and the leader's loop. A single-job ``SubmitJob`` call costs the leader the call's
own gRPC work (TLS, the handler thread and its wake-ups for the interpreter lock) beside
the job's (validation, proposal, apply); that one interpreter is what stops the rate of
``bench/throughput.py``'s part (a), near a whole core busy while the machine has CPU to
spare.

This module is the other design, for measuring it: ``N`` **front end** processes in front
of the leader share one loopback port (``SO_REUSEPORT``), serve the single-job
``SubmitJob`` calls and hand them on as ``SubmitJobs`` batches (up to ``batch`` jobs a
call, ``window`` calls in flight each) over mutual TLS, the way a front end would hand
batches to the Raft process. Each caller gets its own job's answer once its batch is
committed.

Left out, as a measurement of the design and not the design itself: a front end calls
the leader as the cluster's admin, where the real one would pass on each caller's
identity (and a refused job ends its whole batch, as ``SubmitJobs`` does); it serves
``SubmitJob`` only; it follows no leader change.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import control_pb2_grpc as pb_grpc
from synapse_ha.security.tls import TlsFiles, Transport

Files = tuple[str, str, str]  # CA, certificate, key


def tls_transport(files: Files) -> Transport:
    """The mutual TLS transport of ``files`` (paths as text: they cross processes)."""
    ca, cert, key = files
    return Transport(TlsFiles(ca=Path(ca), cert=Path(cert), key=Path(key)))


_Item = tuple[pb.SubmitJobRequest, "futures.Future[pb.SubmitJobResponse]"]


class Batcher:
    """Hands waiting ``SubmitJob`` requests on as ``SubmitJobs`` calls: up to ``batch``
    a call, ``window`` calls in flight; each request's future settles from its call."""

    def __init__(self, submit_jobs: Any, batch: int, window: int) -> None:
        self._submit_jobs = submit_jobs
        self._batch = batch
        self._window = window
        self._cond = threading.Condition()
        self._queue: list[_Item] = []
        self._in_flight = 0
        self._stopping = False
        self.calls = 0
        self.call_ms: list[float] = []  # each call's time to its answer
        self._thread = threading.Thread(target=self._send, name="front-batcher", daemon=True)
        self._thread.start()

    def submit(self, request: pb.SubmitJobRequest) -> futures.Future[pb.SubmitJobResponse]:
        future: futures.Future[pb.SubmitJobResponse] = futures.Future()
        with self._cond:
            self._queue.append((request, future))
            self._cond.notify()
        return future

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    def _send(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not (self._queue and self._in_flight < self._window):
                    self._cond.wait(0.5)
                if self._stopping:
                    return
                items = self._queue[: self._batch]
                del self._queue[: self._batch]
                self._in_flight += 1
                self.calls += 1
            call = self._submit_jobs.future(
                pb.SubmitJobsRequest(jobs=[r for r, _ in items]), timeout=30
            )
            sent = time.monotonic()
            call.add_done_callback(lambda c, items=items, t=sent: self._settle(c, items, t))

    def _settle(self, call: Any, items: list[_Item], sent: float) -> None:
        with self._cond:
            self.call_ms.append(1000 * (time.monotonic() - sent))
            self._in_flight -= 1
            self._cond.notify()
        error = call.exception()
        if error is None and len(call.result().jobs) != len(items):
            error = RuntimeError("an answer of another length than its call")
        for i, (_, future) in enumerate(items):
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(call.result().jobs[i])


class FrontEnd(pb_grpc.SchedulerServiceServicer):
    """Serves ``SubmitJob`` by waiting for its job's answer from the batcher."""

    def __init__(self, batcher: Batcher) -> None:
        self._batcher = batcher

    def SubmitJob(
        self, request: pb.SubmitJobRequest, context: grpc.ServicerContext
    ) -> pb.SubmitJobResponse:
        try:
            return self._batcher.submit(request).result(timeout=30)
        except grpc.RpcError as exc:
            context.abort(exc.code(), exc.details() or "")
        except Exception as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))


def _front_end(
    server_files: Files,
    admin_files: Files,
    leader: str,
    batch: int,
    window: int,
    threads: int,
    listen: str,
    port: Any,
    stop: Any,
) -> None:
    """One front end process: listen on ``listen`` (``127.0.0.1:0``: a free port; front
    ends on one port share its connections), put the port on ``port``, serve until
    ``stop`` is set, then put the calls it made and each one's milliseconds."""
    channel = tls_transport(admin_files).channel(leader)
    batcher = Batcher(pb_grpc.SchedulerServiceStub(channel).SubmitJobs, batch, window)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads))
    pb_grpc.add_SchedulerServiceServicer_to_server(FrontEnd(batcher), server)
    bound = tls_transport(server_files).add_port(server, listen)
    server.start()
    port.put((bound, os.getpid()))
    stop.wait(1800)
    port.put((batcher.calls, batcher.call_ms))
    server.stop(grace=1).wait(5)
    batcher.stop()
    channel.close()


@dataclass(frozen=True)
class Running:
    """Front ends serving: the address they share and their process ids."""

    address: str
    pids: tuple[int, ...]


@contextmanager
def front_ends(
    count: int,
    server_files: Files,
    admin_files: Files,
    leader: str,
    batch: int = 100,
    window: int = 2,
    threads: int = 256,
) -> Iterator[tuple[Running, list[tuple[int, list[float]]]]]:
    """Start ``count`` front end processes in front of ``leader`` on one free loopback
    port; yield them and a list that, once the block ends, holds each one's calls to the
    leader and their milliseconds each. Every process is stopped on the way out, also on
    an error."""
    ctx = mp.get_context("spawn")
    port, stop = ctx.Queue(), ctx.Event()
    procs: list[Any] = []
    calls: list[tuple[int, list[float]]] = []
    try:
        listen, pids = "127.0.0.1:0", []
        for _ in range(count):
            proc = ctx.Process(
                target=_front_end,
                args=(
                    server_files,
                    admin_files,
                    leader,
                    batch,
                    window,
                    threads,
                    listen,
                    port,
                    stop,
                ),
                daemon=True,
            )
            proc.start()
            procs.append(proc)
            bound, pid = port.get(timeout=60)
            listen = f"127.0.0.1:{bound}"
            pids.append(pid)
        yield Running(listen, tuple(pids)), calls
        stop.set()
        calls.extend(port.get(timeout=30) for _ in procs)
    finally:
        stop.set()
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
