"""``WorkerService``: members' output, read (and followed) from this node; nudges.

Logs are the per-member files ``DATA_DIR/members/JOB_ID/aATTEMPT.tTOKEN.rRANK/output.log``.
A member has finished writing once its ``exit.json`` exists; a follow stream then sends
what is left and a final chunk with ``eof`` set. The servicer only reads files, so it
never contends with the agent loop. A nudge only sets a flag the agent loop reads.

Who may call (DESIGN §8), decided by a :class:`LogAccess` policy before anything is read:

=====================  ==========================================  ==================
caller                 ReadLog (job J)                             Nudge
=====================  ==========================================  ==================
replica certificate    allowed                                     allowed
valid grant for J      allowed (metadata ``synapse-grant``)        PERMISSION_DENIED
grant for another job  PERMISSION_DENIED                           PERMISSION_DENIED
or another node
forged, expired or     UNAUTHENTICATED                             (grant ignored)
untrusted grant
other certificate,     PERMISSION_DENIED                           PERMISSION_DENIED
no grant
no certificate,        UNAUTHENTICATED                             UNAUTHENTICATED
no grant
=====================  ==========================================  ==================

A caller without a TLS certificate can only exist behind a plaintext port; ``LogAccess``
with no CA (insecure mode) allows everything, as does the default :data:`ALLOW_ALL`.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

import grpc

from synapse_ha.core.identity.access import Kind
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2 as wpb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2_grpc as wpb_grpc
from synapse_ha.security.grants import GRANT_METADATA_KEY, GrantError, verify_grant
from synapse_ha.security.tls import Transport, peer_identity
from synapse_ha.worker.member_dirs import parse_member_dir_name

DEFAULT_CHUNK = 64 * 1024
MAX_CHUNK = 1024 * 1024


def find_member_dir(members_root: Path, job_id: str, attempt: int, rank: int) -> Path | None:
    """The member directory for (job, attempt, rank); attempt 0 means the newest. Of a
    rank placed here again (member replacement), the newest generation."""
    job_dir = members_root / job_id
    try:
        if "/" in job_id or job_id in ("", ".", "..") or not job_dir.is_dir():
            return None
    except OSError:  # no directory can have that name (too long, for one): no such job
        return None
    best: tuple[tuple[int, int, int], Path] | None = None
    for entry in job_dir.iterdir():
        parsed = parse_member_dir_name(entry.name)
        if parsed is None or parsed[2] != rank or (attempt and parsed[0] != attempt):
            continue
        order = (parsed[0], parsed[1], parsed[3])
        if best is None or order > best[0]:
            best = (order, entry)
    return best[1] if best else None


class NotALog(OSError):
    """The member's log is not a regular file of its own (a link the member put there)."""


def open_log(member_dir: Path) -> BinaryIO:
    """The member's ``output.log``, opened for reading as the agent (root) without
    trusting the member, which may write its own directory: a symbolic link there is not
    followed and a file with other names (a hard link to someone else's file) is refused
    with :class:`NotALog`, so reading one's own job's log never reads another file."""
    try:
        fd = os.open(member_dir / "output.log", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the last component is a symbolic link
            raise NotALog(errno.EPERM, "the member's output.log is a link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise NotALog(errno.EPERM, "the member's output.log is not a regular file of its own")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


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
    exited); with it, it waits for new output until the member exits. The file is opened
    by :func:`open_log`."""
    chunk = DEFAULT_CHUNK if max_bytes <= 0 else min(max_bytes, MAX_CHUNK)
    with open_log(member_dir) as f:
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


# --------------------------------------------------------------------- who may call


@dataclass(frozen=True, slots=True)
class LogRefusal:
    """Why a call is refused: the status code and a sentence for the caller."""

    code: grpc.StatusCode
    message: str


@dataclass(frozen=True, slots=True)
class Reader:
    """Who a ReadLog call reads as: ``who`` (the grant's subject) counts against the
    per-identity follow limit; ``None`` is not limited (a replica, or an insecure
    worker that knows nobody)."""

    who: str | None


class LogAuthorizer(Protocol):
    """Decides whether the caller of the current RPC may read a job's logs or nudge this
    worker: None (or a :class:`Reader`) allows, a :class:`LogRefusal` refuses."""

    def check_read(self, context: grpc.ServicerContext, job_id: str) -> LogRefusal | None: ...

    def admit_read(self, context: grpc.ServicerContext, job_id: str) -> LogRefusal | Reader: ...

    def check_nudge(self, context: grpc.ServicerContext) -> LogRefusal | None: ...


class AllowAll:
    """Allows every call: for plaintext test servers and callers that predate access
    control."""

    def check_read(self, context: grpc.ServicerContext, job_id: str) -> LogRefusal | None:
        return None

    def admit_read(self, context: grpc.ServicerContext, job_id: str) -> LogRefusal | Reader:
        return Reader(None)

    def check_nudge(self, context: grpc.ServicerContext) -> LogRefusal | None:
        return None


ALLOW_ALL = AllowAll()


class LogAccess:
    """The worker's policy (table in the module docstring): replicas (by their verified
    certificate) may do both; anyone else may read one job's logs with a grant for that
    job and this node, verified offline against the cluster CA at ``clock()``.

    ``ca_pem`` None means insecure mode: everything is allowed. ``clock`` returns seconds
    since the epoch (grant expiry times are wall-clock times set by a replica)."""

    def __init__(
        self,
        ca_pem: bytes | None,
        node_id: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._ca_pem: Callable[[], bytes | None] = lambda: ca_pem
        self.node_id = node_id
        self.clock = clock

    @classmethod
    def for_transport(
        cls, transport: Transport, node_id: str, clock: Callable[[], float] = time.time
    ) -> LogAccess:
        """The policy of a worker serving on ``transport``: grants are checked against its
        CA bundle as it is on disk (a rotated bundle applies from the next call); an
        insecure transport allows everything."""
        access = cls(None, node_id, clock)
        access._ca_pem = _CurrentCa(transport)
        return access

    def check_read(self, context: grpc.ServicerContext, job_id: str) -> LogRefusal | None:
        admitted = self.admit_read(context, job_id)
        return admitted if isinstance(admitted, LogRefusal) else None

    def admit_read(self, context: grpc.ServicerContext, job_id: str) -> LogRefusal | Reader:
        ca_pem = self._ca_pem()
        if ca_pem is None:
            return Reader(None)
        caller = peer_identity(context)
        if caller is not None and caller.kind is Kind.REPLICA:
            return Reader(None)
        grants = [v for k, v in context.invocation_metadata() if k == GRANT_METADATA_KEY]
        if not grants:
            if caller is None:
                return LogRefusal(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "reading logs needs a grant from a replica (metadata "
                    f"{GRANT_METADATA_KEY!r}) or a replica certificate; this call has neither",
                )
            return LogRefusal(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{caller} may not read logs without a grant from a replica "
                f"(metadata {GRANT_METADATA_KEY!r})",
            )
        grant = grants[0]
        try:
            claims = verify_grant(
                grant if isinstance(grant, str) else grant.decode("ascii", "replace"),
                ca_pem=ca_pem,
                now_s=self.clock(),
                job_id=job_id,
                node_id=self.node_id,
            )
        except GrantError as exc:
            code = (
                grpc.StatusCode.PERMISSION_DENIED
                if exc.reason.authenticates
                else grpc.StatusCode.UNAUTHENTICATED
            )
            return LogRefusal(code, f"log grant refused ({exc.reason}): {exc}")
        return Reader(claims.subject)

    def check_nudge(self, context: grpc.ServicerContext) -> LogRefusal | None:
        if self._ca_pem() is None:
            return None
        caller = peer_identity(context)
        if caller is None:
            return LogRefusal(
                grpc.StatusCode.UNAUTHENTICATED,
                "only a replica may nudge; this call has no certificate",
            )
        if caller.kind is not Kind.REPLICA:
            return LogRefusal(
                grpc.StatusCode.PERMISSION_DENIED, f"only a replica may nudge, not {caller}"
            )
        return None


class _CurrentCa:
    """The CA bundle of a transport's files, re-read when :meth:`Transport.version`
    changes. While the file cannot be read (mid-rotation) the last bundle read stays."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._lock = threading.Lock()
        self._version: object = object()
        self._ca: bytes | None = None

    def __call__(self) -> bytes | None:
        files = self._transport.files
        if files is None:
            return None
        with self._lock:
            version = self._transport.version()
            if version != self._version:
                try:
                    self._ca = files.ca.read_bytes()
                    self._version = version
                except OSError:
                    pass
            return self._ca if self._ca is not None else b""


# ------------------------------------------------------------------------ servicer


# The log service's threads, and how many of them follow streams may hold: each follow
# holds a thread until its member exits, so the rest stay for reads and the leader's
# nudges. One identity (a grant's subject) follows at most FOLLOWS_PER_IDENTITY logs of
# this node at once.
LOG_SERVICE_THREADS = 32
FOLLOWS_TOTAL = 24
FOLLOWS_PER_IDENTITY = 4


class FollowSlots:
    """Open follow streams on this worker: per identity and in all. Thread-safe."""

    def __init__(
        self, per_identity: int = FOLLOWS_PER_IDENTITY, total: int = FOLLOWS_TOTAL
    ) -> None:
        self.per_identity = per_identity
        self.total = total
        self._lock = threading.Lock()
        self._by_identity: Counter[str | None] = Counter()
        self._open = 0

    def acquire(self, who: str | None) -> LogRefusal | None:
        """Take a slot for ``who`` (None: a replica, limited by the total only)."""
        with self._lock:
            mine = self._by_identity[who]
            if who is not None and mine >= self.per_identity:
                return LogRefusal(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{who} follows {mine} logs on this node already, the most one identity "
                    f"may ({self.per_identity}); stop one first",
                )
            if self._open >= self.total:
                return LogRefusal(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{self._open} logs are followed on this node, the most it serves at "
                    "once; read without following, or retry later",
                )
            self._by_identity[who] += 1
            self._open += 1
            return None

    def release(self, who: str | None) -> None:
        with self._lock:
            self._by_identity -= Counter({who: 1})  # keeps only identities holding some
            self._open -= 1


class WorkerServicer(wpb_grpc.WorkerServiceServicer):
    """The worker's own API: members' logs, and nudges from the leader.

    ``on_nudge(node_id)`` returns whether the nudge was for this node; it must return at
    once (it runs on a gRPC thread and only flags the agent loop). ``authorize`` decides
    every call before the servicer looks at a file or the nudge; ``follows`` bounds the
    follow streams (serve on :data:`LOG_SERVICE_THREADS` threads)."""

    def __init__(
        self,
        members_root: Path,
        on_nudge: Callable[[str], bool] | None = None,
        authorize: LogAuthorizer = ALLOW_ALL,
        follows: FollowSlots | None = None,
    ) -> None:
        self.members_root = members_root
        self.on_nudge = on_nudge
        self.authorize = authorize
        self.follows = follows or FollowSlots()

    def Nudge(self, request: wpb.NudgeRequest, context: grpc.ServicerContext) -> wpb.NudgeResponse:
        refusal = self.authorize.check_nudge(context)
        if refusal is not None:
            context.abort(refusal.code, refusal.message)
        accepted = self.on_nudge is not None and self.on_nudge(request.node_id)
        return wpb.NudgeResponse(accepted=accepted)

    def ReadLog(
        self, request: wpb.ReadLogRequest, context: grpc.ServicerContext
    ) -> Iterator[wpb.LogChunk]:
        admitted = self.authorize.admit_read(context, request.job_id)
        if isinstance(admitted, LogRefusal):
            context.abort(admitted.code, admitted.message)
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
        if request.follow:
            refusal = self.follows.acquire(admitted.who)
            if refusal is not None:
                context.abort(refusal.code, refusal.message)
        try:
            yield from read_chunks(
                member_dir, request.offset, request.max_bytes, request.follow, context.is_active
            )
        except NotALog as exc:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, exc.strerror or str(exc))
        finally:
            if request.follow:
                self.follows.release(admitted.who)


def new_worker_server() -> grpc.Server:
    """The gRPC server a worker's log service runs on, with its :data:`LOG_SERVICE_THREADS`
    threads (follow streams hold at most :data:`FOLLOWS_TOTAL` of them)."""
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=LOG_SERVICE_THREADS, thread_name_prefix="logs"),
        options=[("grpc.so_reuseport", 0)],
    )


def add_worker_service(
    server: grpc.Server,
    members_root: Path,
    on_nudge: Callable[[str], bool] | None = None,
    authorize: LogAuthorizer = ALLOW_ALL,
) -> None:
    servicer = WorkerServicer(members_root, on_nudge, authorize)
    wpb_grpc.add_WorkerServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
