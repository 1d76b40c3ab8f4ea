"""``WorkerService``: members' output, read (and followed) from this node; nudges.

Logs are the per-member files ``DATA_DIR/members/JOB_ID/aATTEMPT.tTOKEN.rRANK/output.log``.
A member has finished writing once its ``exit.json`` exists; a follow stream then sends
what is left and a final chunk with ``eof`` set. The servicer only reads files, so it
never contends with the agent loop. A nudge only sets a flag the agent loop reads.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc

from synapse_ha.rpc.gen.synapse.v1 import worker_pb2 as wpb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2_grpc as wpb_grpc
from synapse_ha.worker.members import parse_member_dir_name

DEFAULT_CHUNK = 64 * 1024
MAX_CHUNK = 1024 * 1024


def find_member_dir(members_root: Path, job_id: str, attempt: int, rank: int) -> Path | None:
    """The member directory for (job, attempt, rank); attempt 0 means the newest."""
    job_dir = members_root / job_id
    if "/" in job_id or job_id in ("", ".", "..") or not job_dir.is_dir():
        return None
    best: tuple[tuple[int, int], Path] | None = None
    for entry in job_dir.iterdir():
        parsed = parse_member_dir_name(entry.name)
        if parsed is None or parsed[2] != rank or (attempt and parsed[0] != attempt):
            continue
        order = (parsed[0], parsed[1])
        if best is None or order > best[0]:
            best = (order, entry)
    return best[1] if best else None


def read_chunks(
    member_dir: Path,
    offset: int,
    max_bytes: int,
    follow: bool,
    keep_going: Callable[[], bool],
    wait: Callable[[float], None] = time.sleep,
    poll_s: float = 0.1,
) -> Iterator[wpb.LogChunk]:
    """Chunks of the member's log from ``offset`` (negative: from the end). Without
    ``follow`` it stops at the current end of the file (``eof`` when the member has
    exited); with it, it waits for new output until the member exits."""
    path = member_dir / "output.log"
    chunk = DEFAULT_CHUNK if max_bytes <= 0 else min(max_bytes, MAX_CHUNK)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        position = max(0, size + offset) if offset < 0 else offset
        f.seek(position)
        while keep_going():
            # Check for the exit before reading so that output written before the exit
            # record is always sent before the final chunk.
            exited = (member_dir / "exit.json").exists()
            data = f.read(chunk)
            if data:
                yield wpb.LogChunk(data=data, offset=position, eof=False)
                position += len(data)
                continue
            if exited:
                yield wpb.LogChunk(data=b"", offset=position, eof=True)
                return
            if not follow:
                return
            wait(poll_s)


class WorkerServicer(wpb_grpc.WorkerServiceServicer):
    """The worker's own API: members' logs, and nudges from the leader.

    ``on_nudge(node_id)`` returns whether the nudge was for this node; it must return at
    once (it runs on a gRPC thread and only flags the agent loop)."""

    def __init__(self, members_root: Path, on_nudge: Callable[[str], bool] | None = None) -> None:
        self.members_root = members_root
        self.on_nudge = on_nudge

    def Nudge(self, request: wpb.NudgeRequest, context: grpc.ServicerContext) -> wpb.NudgeResponse:
        accepted = self.on_nudge is not None and self.on_nudge(request.node_id)
        return wpb.NudgeResponse(accepted=accepted)

    def ReadLog(
        self, request: wpb.ReadLogRequest, context: grpc.ServicerContext
    ) -> Iterator[wpb.LogChunk]:
        if request.rank < 0 or request.attempt < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "rank and attempt must be >= 0")
        member_dir = find_member_dir(
            self.members_root, request.job_id, request.attempt, request.rank
        )
        if member_dir is None or not (member_dir / "output.log").exists():
            what = f"attempt {request.attempt}" if request.attempt else "any attempt"
            context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no log for job {request.job_id!r} rank {request.rank} ({what}) on this node",
            )
        yield from read_chunks(
            member_dir, request.offset, request.max_bytes, request.follow, context.is_active
        )


def add_worker_service(
    server: grpc.Server, members_root: Path, on_nudge: Callable[[str], bool] | None = None
) -> None:
    servicer = WorkerServicer(members_root, on_nudge)
    wpb_grpc.add_WorkerServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
