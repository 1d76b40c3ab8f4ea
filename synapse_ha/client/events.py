"""Following the cluster's event stream across replicas (``WatchEvents``): a replica that
goes away mid-stream is replaced by the next one, resuming after the last event."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import grpc

from synapse_ha.client.unavailable import ClusterUnavailable
from synapse_ha.rpc.errors import Reason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

if TYPE_CHECKING:
    from synapse_ha.client.cluster import ClusterClient


def watch_events(
    client: ClusterClient,
    since_index: int = 0,
    follow: bool = False,
    reconnect_s: float | None = None,
) -> Iterator[pb.Event]:
    """Events after ``since_index`` (0: the oldest the replica holds); with
    ``follow``, until the caller stops iterating. A replica that goes away mid-stream
    is replaced by the next one, resuming after the last event received (every
    replica has the same indexes), for up to ``reconnect_s`` (default: the client's
    timeout) without an answer; then :class:`ClusterUnavailable`. A replica that no
    longer holds the events after ``since_index`` (EVENTS_EXPIRED: restarted, or
    too far behind) is skipped for one that does; when none does, that error is
    raised, as refusals are, as the ``grpc.RpcError`` it is."""
    window = client.timeout_s if reconnect_s is None else reconnect_s
    address = client.leader_hint
    since = since_index
    attempts: list[tuple[str, str]] = []
    give_up = time.monotonic() + window
    expired: set[str] = set()  # replicas that no longer hold what follows ``since``
    while True:
        request = pb.WatchEventsRequest(since_index=since, follow=follow)
        stream = client.scheduler(address).WatchEvents(request)
        try:
            for event in stream:
                give_up = time.monotonic() + window
                expired.clear()
                since = event.index
                yield event
            return
        except grpc.RpcError as exc:
            failure = failure_of(exc)
            attempts.append((address, failure.describe()))
            if failure.reason is Reason.EVENTS_EXPIRED:
                expired.add(address)
                if expired >= set(client.addresses):
                    raise
                address = client.next_address(address)
                continue
            transport = failure.reason is Reason.UNKNOWN and failure.code in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.CANCELLED,
            )
            if not transport and failure.reason is not Reason.OVERLOADED:
                raise
            if time.monotonic() > give_up:
                raise ClusterUnavailable("WatchEvents", attempts) from exc
            address = client.next_address(address)
            time.sleep(random.uniform(client.backoff_s / 2, client.backoff_s))
        finally:
            stream.cancel()
