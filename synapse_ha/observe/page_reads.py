"""What the dashboard's pages with a GET form read through the API, as the viewer:
``/history``, ``/usage`` and ``/charts``. Each turns the query string into the API's
request (a filter it cannot read is said on the page, and nothing is asked), calls the
API, and renders the page; an API error is raised to the caller
(:class:`~synapse_ha.observe.dashboard.Dashboard`), which answers it as for every page.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Protocol

import grpc

from synapse_ha.client.cluster import ClusterUnavailable
from synapse_ha.core.model import NodeStatus
from synapse_ha.observe.chart_data import (
    DEFAULT_WINDOW,
    WINDOWS_MS,
    bucket_for,
    chart_series,
    spans_of,
)
from synapse_ha.observe.chart_pages import CHARTS_REFRESH_FACTOR, render_charts
from synapse_ha.observe.list_pages import (
    USAGE_BY,
    HistoryFilters,
    UsageFilters,
    render_history,
    render_usage,
)
from synapse_ha.observe.page_kit import REFRESH_S
from synapse_ha.rpc import readable, states
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

HISTORY_LIMIT = 500  # finished jobs the history page lists
CHART_HISTORY_LIMIT = 10_000  # finished jobs the charts read (the API's most)
LIVE_STATES = ("PENDING", "SCHEDULED", "RUNNING")


class Reader(Protocol):
    """The API calls these pages make (a :class:`~synapse_ha.client.cluster.ClusterClient`)."""

    def list_history(self, **filters: object) -> list[pb.HistoryJob]: ...
    def get_usage(self, by: str, since_ms: int, until_ms: int = 0) -> pb.GetUsageResponse: ...
    def list_jobs(self, limit: int = 0, **filters: object) -> list[pb.Job]: ...
    def list_nodes(self) -> list[pb.Node]: ...


def query_of(path: str) -> dict[str, str]:
    """A request path's query string: the first value of each field."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
    return {name: values[0] for name, values in query.items() if values}


def _moment_error(name: str, value: str) -> str:
    return f"{name}: {value!r} is neither a duration (7d) nor a date (2026-11-01)"


def history_page(
    client: Reader, query: Mapping[str, str], now_ms: int, viewer: str, csrf: str
) -> str:
    filters = HistoryFilters.of(query)
    since = readable.parse_moment(filters.since, now_ms) if filters.since else 0
    if since is None:
        error = _moment_error("since", filters.since)
        return render_history([], filters, now_ms, viewer, csrf, error)
    found = client.list_history(
        user=filters.user,
        queue=filters.queue,
        node_id=filters.node,
        since_ms=since,
        limit=HISTORY_LIMIT,
    )
    return render_history(found, filters, now_ms, viewer, csrf)


def usage_page(
    client: Reader, query: Mapping[str, str], now_ms: int, viewer: str, csrf: str
) -> str:
    filters = UsageFilters.of(query)
    if filters.by not in USAGE_BY:
        error = f"by: {filters.by!r} is not one of {', '.join(USAGE_BY)}"
        return render_usage(None, filters, viewer, csrf, error)
    since = readable.parse_moment(filters.since, now_ms)
    if since is None:
        return render_usage(None, filters, viewer, csrf, _moment_error("since", filters.since))
    until = readable.parse_moment(filters.until, now_ms) if filters.until else 0
    if until is None:
        return render_usage(None, filters, viewer, csrf, _moment_error("until", filters.until))
    if until and until <= since:
        error = "until: must be after since"
        return render_usage(None, filters, viewer, csrf, error)
    return render_usage(client.get_usage(filters.by, since, until), filters, viewer, csrf)


def charts_page(
    client: Reader,
    query: Mapping[str, str],
    now_ms: int,
    viewer: str,
    csrf: str,
    refresh_s: int = CHARTS_REFRESH_FACTOR * REFRESH_S,
) -> str:
    """The charts over the window the query names (``window``: 1h, 6h, 24h or 7d): the
    live jobs and the jobs finished within the window, read once each."""
    window = query.get("window", DEFAULT_WINDOW)
    notes: list[str] = []
    if window not in WINDOWS_MS:
        notes.append(
            f"window: {window!r} is not one of {', '.join(WINDOWS_MS)}; showing "
            f"the last {DEFAULT_WINDOW}"
        )
        window = DEFAULT_WINDOW
    window_ms = WINDOWS_MS[window]
    live = client.list_jobs(states=list(LIVE_STATES))
    finished = client.list_history(since_ms=now_ms - window_ms, limit=CHART_HISTORY_LIMIT)
    if len(finished) >= CHART_HISTORY_LIMIT:
        oldest = min(j.finished_at_ms for j in finished)
        notes.append(
            f"more than {CHART_HISTORY_LIMIT} jobs finished in this window: before "
            f"{readable.local_time(oldest)} the charts count only those that finished later"
        )
    try:
        nodes = client.list_nodes()
        capacity: int | None = sum(
            n.capacity.gpu for n in nodes if states.shown_node_status(n) != NodeStatus.DEAD
        )
    except (grpc.RpcError, ClusterUnavailable):
        capacity = None  # the charts still show, without the cluster's size
    series = chart_series(
        spans_of(live, finished, now_ms), now_ms, window_ms, bucket_for(window_ms)
    )
    return render_charts(series, window, capacity, notes, viewer, csrf, refresh_s)
