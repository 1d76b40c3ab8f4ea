"""The floor under every API call: what one unary gRPC call costs in Python on this machine
when its handler does nothing.

An echo server (a generic handler returning the request's bytes: no protobuf, no
authentication, no Raft) in a process of its own, and ``--processes`` client processes
each keeping ``--window`` calls in flight, as ``bench/throughput.py``'s generators do. For
each way of serving (grpcio's thread-pool server, ``sync``, and its asyncio server,
``aio``), over plaintext and over mutual TLS with the certificates a dev cluster uses:
calls a second, and the server's and the clients' CPU time per call (from ``/proc`` and
``time.process_time``: figures that hold still when other work shares the machine).

Why it matters: ``(server + client) CPU per call`` bounds the calls a second any
one-call-per-submission design can acknowledge with the load generated on the same
machine, whatever the scheduler does: ``cores / (server + client CPU per call)``. It
prints that bound too (``calls_per_s_bound_on_this_machine``). Prints one JSON object
(``--out`` writes it; ``--smoke`` makes a tiny run).

``--commit-ms MS`` makes each call wait, as a write does, for a commit: a committer
thread settles every waiting call once each ``MS`` milliseconds (a group commit). The
thread-pool server's handler blocks its thread on a ``concurrent.futures.Future``, as the
scheduler's handlers do; the asyncio server's handler awaits an asyncio future and the
committer wakes the event loop once a commit for all of them. The difference is what
keeping a thread per waiting call costs (its wake-up and its turn for the interpreter
lock), against an event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc

from synapse_ha.security.bundle import ClusterCredentials
from synapse_ha.security.tls import TlsFiles, Transport

RESULTS = Path(__file__).resolve().parent / "results" / "grpc_floor.json"
SERVICE, METHOD = "bench.Echo", "Call"
PAYLOAD = b"x" * 300  # about a small job spec's SubmitJobRequest


class Committer:
    """Settles the calls waiting for a commit, all at once, every ``period_s``."""

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self.lock = threading.Lock()
        self.waiting: list[futures.Future[bool]] = []
        self.waiting_async: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[bool]]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="committer", daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.period_s):
            with self.lock:
                waiting, self.waiting = self.waiting, []
                waiting_async, self.waiting_async = self.waiting_async, []
            for future in waiting:
                future.set_result(True)
            if waiting_async:
                loop = waiting_async[0][0]
                loop.call_soon_threadsafe(_settle_all, [f for _, f in waiting_async])

    def wait(self) -> None:
        future: futures.Future[bool] = futures.Future()
        with self.lock:
            self.waiting.append(future)
        future.result(timeout=60)

    async def wait_async(self) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        with self.lock:
            self.waiting_async.append((loop, future))
        await future


def _settle_all(waiting: list[asyncio.Future[bool]]) -> None:
    for future in waiting:
        if not future.done():
            future.set_result(True)


def _handlers(
    asynchronous: bool, committer: Committer | None
) -> tuple[grpc.GenericRpcHandler[Any, Any], ...]:
    def echo(request: bytes, _context: Any) -> bytes:
        if committer is not None:
            committer.wait()
        return request

    async def echo_async(request: bytes, _context: Any) -> bytes:
        if committer is not None:
            await committer.wait_async()
        return request

    method = grpc.unary_unary_rpc_method_handler(echo_async if asynchronous else echo)
    return (grpc.method_handlers_generic_handler(SERVICE, {METHOD: method}),)


def _transport(files: TlsFiles | None) -> Transport:
    return Transport(files) if files is not None else Transport.insecure()


def _serve(
    kind: str, files: TlsFiles | None, commit_ms: float, out: Any, go: Any, stop: Any
) -> None:
    """Serve echoes until ``stop``; put the port, then the process's CPU seconds from
    ``go`` to ``stop`` (every thread: the measured calls)."""
    transport = _transport(files)
    committer = Committer(commit_ms / 1000) if commit_ms > 0 else None
    if committer is not None:
        committer.thread.start()
    if kind == "sync":
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=128))
        server.add_generic_rpc_handlers(_handlers(False, committer))
        out.put(transport.add_port(server, "127.0.0.1:0"))
        server.start()
        go.wait(120)
        cpu = time.process_time()
        stop.wait(600)
        out.put(time.process_time() - cpu)
        server.stop(0)
        return

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(_handlers(True, committer))
        out.put(transport.add_port(server, "127.0.0.1:0"))  # type: ignore[arg-type]
        await server.start()
        while not go.is_set():
            await asyncio.sleep(0.01)
        cpu = time.process_time()
        while not stop.is_set():
            await asyncio.sleep(0.01)
        out.put(time.process_time() - cpu)
        await server.stop(0)

    asyncio.run(main())


def _client(
    port: int, files: TlsFiles | None, calls: int, window: int, ready: Any, go: Any, out: Any
) -> None:
    """Send ``calls`` echoes with ``window`` in flight; report (seconds, CPU seconds)."""
    transport = _transport(files)
    with transport.channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(f"/{SERVICE}/{METHOD}", None, None)
        for _ in range(20):
            call(PAYLOAD, timeout=30)
        ready.put(True)
        go.wait(60)
        slots = threading.Semaphore(window)
        done = threading.Event()
        left = [calls]
        lock = threading.Lock()

        def finished(_future: Any) -> None:
            slots.release()
            with lock:
                left[0] -= 1
                if left[0] == 0:
                    done.set()

        started, cpu = time.monotonic(), time.process_time()
        for _ in range(calls):
            slots.acquire()
            call.future(PAYLOAD, timeout=60).add_done_callback(finished)
        if not done.wait(300):
            raise RuntimeError("echo calls did not finish within 300 s")
        out.put((time.monotonic() - started, time.process_time() - cpu))


def measure(
    kind: str,
    files: tuple[TlsFiles, TlsFiles] | None,
    calls: int,
    processes: int,
    window: int,
    commit_ms: float = 0.0,
) -> dict[str, Any]:
    """One way of serving; ``files``: the server's and the clients' TLS files, or None."""
    ctx = mp.get_context("fork")  # the parent opens no gRPC channel or server
    served_out, go, stop = ctx.Queue(), ctx.Event(), ctx.Event()
    served, used = files if files is not None else (None, None)
    server = ctx.Process(
        target=_serve, args=(kind, served, commit_ms, served_out, go, stop), daemon=True
    )
    clients: list[Any] = []
    try:
        server.start()
        port = served_out.get(timeout=60)
        ready, out = ctx.Queue(), ctx.Queue()
        each = calls // processes
        clients = [
            ctx.Process(
                target=_client, args=(port, used, each, window, ready, go, out), daemon=True
            )
            for _ in range(processes)
        ]
        for c in clients:
            c.start()
        for _ in clients:
            ready.get(timeout=60)
        started = time.monotonic()
        go.set()
        reports = [out.get(timeout=400) for _ in clients]
        wall = time.monotonic() - started
        stop.set()
        server_cpu = served_out.get(timeout=60)
    finally:
        stop.set()
        for p in [*clients, server]:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    total = each * processes
    server_us = 1e6 * server_cpu / total
    client_us = 1e6 * sum(r[1] for r in reports) / total
    return {
        "calls": total,
        "calls_per_s": round(total / wall, 1),
        "server_cpu_us_per_call": round(server_us, 1),
        "client_cpu_us_per_call": round(client_us, 1),
        "calls_per_s_bound_on_this_machine": round(
            (os.cpu_count() or 1) * 1e6 / (server_us + client_us), 1
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny run that takes seconds")
    parser.add_argument("--calls", type=int, default=12_000)
    parser.add_argument("--processes", type=int, default=3, help="client processes")
    parser.add_argument("--window", type=int, default=64, help="calls in flight per process")
    parser.add_argument("--kinds", default="sync,aio", help="servers: sync, aio")
    parser.add_argument(
        "--commit-ms",
        type=float,
        default=0.0,
        help="each call waits for a group commit every MS milliseconds (0: none)",
    )
    parser.add_argument("--out", type=Path, help=f"where the JSON goes (default {RESULTS})")
    args = parser.parse_args(argv)
    if args.smoke:
        args.calls, args.processes, args.window = 40, 1, 4
    report: dict[str, Any] = {
        "smoke": args.smoke,
        "cpus": os.cpu_count(),
        "payload_bytes": len(PAYLOAD),
        "processes": args.processes,
        "in_flight_per_process": args.window,
        "commit_ms": args.commit_ms,
    }
    with tempfile.TemporaryDirectory(prefix="synapse-grpc-floor-") as tmp:
        credentials = ClusterCredentials.ensure(Path(tmp))
        for kind in args.kinds.split(","):
            tls = (credentials.replica_tls("echo"), credentials.admin_tls())
            for security, files in (("plaintext", None), ("tls", tls)):
                report[f"{kind}_{security}"] = measure(
                    kind, files, args.calls, args.processes, args.window, args.commit_ms
                )
    text = json.dumps(report, indent=2)
    print(text)
    out = args.out or (None if args.smoke else RESULTS)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
