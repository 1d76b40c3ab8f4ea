"""The history methods of ``SchedulerService``: finished jobs, GPU usage and the event
stream, from this replica's own copies."""

from __future__ import annotations

from collections.abc import Iterator

import grpc

from synapse_ha.core.identity import access, admission
from synapse_ha.core.identity.access import Identity
from synapse_ha.core.spec import validation
from synapse_ha.history.events import EventRing, EventsExpired
from synapse_ha.history.store import USAGE_KEYS, HistoryFilter, HistoryStore
from synapse_ha.rpc import to_proto
from synapse_ha.rpc.auth import caller
from synapse_ha.rpc.errors import ErrorReason, abort, abort_invalid
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.load_gates import StreamRefusal
from synapse_ha.rpc.server.context import Servicer
from synapse_ha.service.submit import limit_refusal


class EventService(Servicer):
    """ListHistory, GetUsage and WatchEvents."""

    # ------------------------------------------------ history and events

    def _history_owner(self, context: grpc.ServicerContext, asked: str) -> str:
        """The owner a history read is limited to: ``asked`` for those who see every
        job's history; a user's own name (asking for another user is refused)."""
        identity = caller(context)
        if access.sees_all_history(identity):
            return asked
        if asked and asked != identity.name:
            self._refuse(
                context,
                access.AccessRefusal(
                    access.AccessRefusalCode.PERMISSION_DENIED,
                    f"{access.describe_caller(identity)} may read only its own history, "
                    f"not user {asked}'s; it needs role operator or admin",
                ),
                identity,
            )
        return identity.name

    def _history_store(self, context: grpc.ServicerContext) -> HistoryStore:
        if self.ctx.history is None:
            abort(context, ErrorReason.CONFLICT, "history is turned off on this replica")
        return self.ctx.history

    def ListHistory(
        self, request: pb.ListHistoryRequest, context: grpc.ServicerContext
    ) -> pb.ListHistoryResponse:
        """Finished jobs from this replica's history, newest first."""
        violations = [
            validation.invalid(name, "must be 0 or positive")
            for name in ("since_ms", "until_ms", "limit")
            if getattr(request, name) < 0
        ]
        if violations:
            abort_invalid(context, violations)
        owner = self._history_owner(context, request.user)
        store = self._history_store(context)
        wanted = HistoryFilter(
            owner=owner,
            queue=request.queue,
            node_id=request.node_id,
            since_ms=request.since_ms,
            until_ms=request.until_ms,
            limit=request.limit or 1000,
        )
        with self._heavy_read(context):
            jobs = store.jobs(wanted)
        return pb.ListHistoryResponse(
            jobs=[to_proto.history_job_to_proto(j) for j in jobs], answered_by=self.ctx.self_id
        )

    def GetUsage(
        self, request: pb.GetUsageRequest, context: grpc.ServicerContext
    ) -> pb.GetUsageResponse:
        """GPU-milliseconds per user or queue and UTC day, from this replica's history."""
        until = request.until_ms or self.ctx.clock_ms()
        violations = []
        if request.by not in USAGE_KEYS:
            violations.append(validation.invalid("by", f"must be one of {', '.join(USAGE_KEYS)}"))
        if request.since_ms <= 0:
            violations.append(validation.invalid("since_ms", "must be a positive time"))
        elif until <= request.since_ms:
            violations.append(validation.invalid("until_ms", "must be later than since_ms"))
        if violations:
            abort_invalid(context, violations)
        owner = self._history_owner(context, "")
        store = self._history_store(context)
        with self._heavy_read(context):
            rows = store.usage(request.by, request.since_ms, until, owner=owner)
        return pb.GetUsageResponse(
            rows=[to_proto.usage_row_to_proto(r) for r in rows],
            by=request.by,
            since_ms=request.since_ms,
            until_ms=until,
            answered_by=self.ctx.self_id,
        )

    def WatchEvents(
        self, request: pb.WatchEventsRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.Event]:
        """Events after ``since_index`` from this replica's ring; with ``follow``, new ones
        as they are applied until the client goes away. Each open stream holds a thread:
        a user or operator may hold ``limits.watch_streams_per_identity`` of them on a
        replica, all of them together ``limits.watch_streams_total``; admins and replicas
        have slots of their own (:class:`StreamSlots`), so users cannot lock them out.
        Text a job controls is withheld from callers who may not manage the job."""
        if request.since_index < 0:
            abort_invalid(context, [validation.invalid("since_index", "must be 0 or positive")])
        ring = self.ctx.events
        if ring is None:
            abort(context, ErrorReason.CONFLICT, "events are turned off on this replica")
        identity = caller(context)
        limits = self.ctx.backend.cluster_config().limits
        limited = admission.limited(identity)
        who = str(identity)
        refusal = self.ctx.per_identity.watch_slots.acquire(
            who, limited, limits.watch_streams_per_identity, limits.watch_streams_total
        )
        if refusal is not None:
            self._fail(context, limit_refusal(identity, _stream_limit(identity, refusal)))
        try:
            yield from _stream_events(ring, request, context, identity)
        finally:
            self.ctx.per_identity.watch_slots.release(who, limited)


def _stream_limit(identity: Identity, refusal: StreamRefusal) -> admission.LimitExceeded:
    who = access.describe_caller(identity)
    if refusal.limit == "unlimited_streams":
        message = (
            f"{refusal.actual} event streams of admins and replicas are open on this replica, "
            "all it has; close one, or watch another replica"
        )
        return admission.LimitExceeded(
            admission.LimitName.WATCH_STREAMS_TOTAL, refusal.allowed, refusal.actual, message
        )
    name = admission.LimitName(refusal.limit)
    if name is admission.LimitName.WATCH_STREAMS_PER_IDENTITY:
        message = (
            f"{who} has {refusal.actual} event streams open on this replica; "
            f"limits.watch_streams_per_identity allows {refusal.allowed}: close one first"
        )
    else:
        message = (
            f"{refusal.actual} event streams of users are open on this replica; "
            f"limits.watch_streams_total allows {refusal.allowed}: retry after a pause, or "
            "watch another replica"
        )
    return admission.LimitExceeded(name, refusal.allowed, refusal.actual, message)


def _stream_events(
    ring: EventRing, request: pb.WatchEventsRequest, context: grpc.ServicerContext, viewer: Identity
) -> Iterator[pb.Event]:
    since = request.since_index
    end = None if request.follow else ring.newest_index
    while context.is_active():
        try:
            events = ring.wait_after(since, timeout_s=0.5) if end is None else ring.after(since)
        except EventsExpired as exc:
            abort(
                context,
                ErrorReason.EVENTS_EXPIRED,
                str(exc),
                {"oldest_index": str(exc.complete_after), "since_index": str(exc.since)},
            )
        for event in events:
            if end is not None and event.index > end:
                return
            redacted = bool(event.job_id) and not access.may_manage_job(viewer, event.owner)
            yield to_proto.event_to_proto(event, redacted)
            since = event.index
        if end is not None and (not events or since >= end):
            return
