"""The effect sink: ``python -m chaos.sink HOST:PORT EFFECTS_FILE``.

A never-faulted process (root network namespace, on the bridge address) standing in for
the storage a training job commits its output to. A member asks it, over one TCP line of
JSON, to accept its effect (job, token, rank, world size). The sink keeps the highest
fencing token it has seen per job and accepts only under that token: a lower token is
rejected, a higher one becomes the new highest.

A member also *claims* its token when it starts (``"op": "claim"``): the claim raises the
job's highest token at once, so that a member of an older attempt that resumes later (a
frozen host thawed) is refused even before the newer attempt asks to commit anything —
the way a storage service learns a new lock holder's fencing token on its first request.
Claims are logged as ``claim`` records.

A member also names its generation (a rank placed again while its gang runs on is the
next generation of the same attempt, with the same token): the sink keeps the highest
generation claimed or accepted for each (job, token, rank) and refuses an effect of a
lower one, so a replaced member that resumes after its replacement claimed is refused.

Once every rank 0..world-1 of one token has been accepted, the job's output is committed
and the sink answers any later request for that job with ``done`` (not accepted): the
commit is idempotent, as real output commits are, so an attempt that re-runs a job whose
success report was lost with its node finds the work already committed instead of
committing it twice. Every decision is appended to EFFECTS_FILE (see
:mod:`chaos.ledger`) before the answer is sent, so the file is the sink's true order.
"""

from __future__ import annotations

import json
import socketserver
import sys
import threading
from pathlib import Path
from typing import Any

from chaos.ledger import Appender, now_ns


class FencingSink:
    def __init__(self, effects: Appender) -> None:
        self.effects = effects
        self.lock = threading.Lock()
        self.highest: dict[str, int] = {}
        self.accepted_ranks: dict[tuple[str, int], set[int]] = {}
        self.committed: dict[str, int] = {}  # job -> token whose ranks all committed
        # (job, token, rank) -> the highest generation claimed or accepted
        self.generations: dict[tuple[str, int, int], int] = {}

    def claim(self, request: dict[str, Any]) -> dict[str, Any]:
        job, token = str(request["job"]), int(request["token"])
        rank, generation = int(request.get("rank", 0)), int(request.get("generation", 0))
        with self.lock:
            before = self.highest.get(job, 0)
            self.highest[job] = max(before, token)
            key = (job, token, rank)
            self.generations[key] = max(self.generations.get(key, 0), generation)
            self.effects.append(
                {
                    "type": "claim",
                    "job": job,
                    "token": token,
                    "rank": rank,
                    "generation": generation,
                    "highest_before": before,
                    "mono_ns": now_ns(),
                }
            )
        return {"claimed": token >= before, "highest": max(before, token)}

    def decide(self, request: dict[str, Any]) -> dict[str, Any]:
        if request.get("op") == "claim":
            return self.claim(request)
        job, token, rank = str(request["job"]), int(request["token"]), int(request["rank"])
        world, generation = int(request.get("world", 0)), int(request.get("generation", 0))
        with self.lock:
            before = self.highest.get(job, 0)
            done = job in self.committed
            replaced = generation < self.generations.get((job, token, rank), 0)
            accepted = not done and token >= before and not replaced
            if accepted:
                self.highest[job] = token
                self.generations[(job, token, rank)] = generation
                ranks = self.accepted_ranks.setdefault((job, token), set())
                ranks.add(rank)
                # Ranks 0..world-1: an elastic gang's members above its min (the world its
                # members commit with) may commit first; they do not complete it.
                if world > 0 and ranks.issuperset(range(world)):
                    self.committed[job] = token
            self.effects.append(
                {
                    "type": "effect",
                    "job": job,
                    "token": token,
                    "rank": rank,
                    "generation": generation,
                    "world": world,
                    "done": done,
                    "attempt": int(request.get("attempt", 0)),
                    "node": str(request.get("node", "")),
                    "pid": int(request.get("pid", 0)),
                    "accepted": accepted,
                    "highest_before": before,
                    "mono_ns": now_ns(),
                }
            )
        return {"accepted": accepted, "done": done, "highest": max(before, token)}


def serve(address: str, effects_path: Path, ready: threading.Event | None = None) -> None:
    host, _, port = address.rpartition(":")
    sink = FencingSink(Appender(effects_path))

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            line = self.rfile.readline(65536)
            try:
                request = json.loads(line)
                answer = sink.decide(request)
            except (ValueError, KeyError, TypeError) as exc:
                answer = {"accepted": False, "error": str(exc)}
            self.wfile.write(json.dumps(answer).encode() + b"\n")

    socketserver.ThreadingTCPServer.allow_reuse_address = True
    socketserver.ThreadingTCPServer.daemon_threads = True
    with socketserver.ThreadingTCPServer((host, int(port)), Handler) as server:
        if ready is not None:
            ready.set()
        print(f"sink listening on {address}", flush=True)
        server.serve_forever(poll_interval=0.1)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m chaos.sink HOST:PORT EFFECTS_FILE", file=sys.stderr)
        return 2
    serve(args[0], Path(args[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
