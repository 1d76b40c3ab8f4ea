"""The dashboard's new routes without a cluster: the script, the charts' files (read
from the package) and the list pages are routed (not 404), the cancel post is refused
from another site or without the session's value before any API call, and the attempt
bar's axis ticks fall on round times."""

from __future__ import annotations

from pathlib import Path

from synapse_ha.observe.dashboard import COOKIE, Dashboard
from synapse_ha.observe.http import Request
from synapse_ha.observe.page_kit import SCRIPT
from synapse_ha.observe.static_files import (
    CHARTS_SCRIPT,
    UPLOT_SCRIPT,
    UPLOT_STYLESHEET,
    UPLOT_VERSION,
)
from synapse_ha.observe.timeline import attempt_timeline, tick_step, ticks
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.security.bundle import ClusterCredentials
from synapse_ha.security.tls import Transport


def test_the_script_and_the_list_pages_are_routed(tmp_path: Path) -> None:
    credentials = ClusterCredentials.ensure(tmp_path / "credentials")
    app = Dashboard(["127.0.0.1:1"], Transport(credentials.replica_tls("r1")))
    try:
        script = app(Request("GET", SCRIPT, {}, b"", False))
        assert script.status == 200 and script.content_type.startswith("text/javascript")
        assert b"data-refresh-s" in script.body
        for path in ("/nodes", "/queues", "/history?user=alice", "/charts?window=1h", "/usage"):
            answer = app.triage(Request("GET", path, {}, b"", False))
            assert answer is not None and answer.status == 303  # to sign in, not 404
        assert app(Request("GET", "/cpu", {}, b"", False)).status == 404
        # The charts' files come from the package, to anyone (they hold nothing secret).
        for path, kind, start in (
            (
                UPLOT_SCRIPT,
                "text/javascript",
                f"/*! https://github.com/leeoniya/uPlot (v{UPLOT_VERSION})",
            ),
            (UPLOT_STYLESHEET, "text/css", ".uplot"),
            (CHARTS_SCRIPT, "text/javascript", '"use strict";'),
            ("/static/uPlot.LICENSE", "text/plain", "The MIT License"),
        ):
            served = app.triage(Request("GET", path, {}, b"", False))
            assert served is not None and served.status == 200, path
            assert served.content_type.startswith(kind) and served.body.decode().startswith(start)
        assert app(Request("GET", "/static/other.js", {}, b"", False)).status == 404
        assert app(Request("POST", CHARTS_SCRIPT, {}, b"", False)).status == 405
    finally:
        app.close()


def test_a_cancel_post_needs_this_origin_and_the_sessions_value(tmp_path: Path) -> None:
    """No API answers at 127.0.0.1:1: each refusal is made from the request alone."""
    credentials = ClusterCredentials.ensure(tmp_path / "credentials")
    app = Dashboard(["127.0.0.1:1"], Transport(credentials.replica_tls("r1")))
    try:
        session = app.sessions.open(credentials.admin_token)
        cookie = {"cookie": f"{COOKIE}={session.session_id}", "host": "h:1"}
        path = "/jobs/job-000001/cancel"
        assert app(Request("GET", path, cookie, b"", False)).status == 405
        elsewhere = {**cookie, "origin": "https://evil.example"}
        body = f"csrf={session.csrf}".encode()
        assert app(Request("POST", path, elsewhere, body, False)).status == 403
        own = {**cookie, "origin": "https://h:1"}
        refused = app(Request("POST", path, own, b"csrf=guess", False))
        assert refused.status == 403 and b"not this dashboard" in refused.body
        nobody = app(Request("POST", path, {"origin": "https://h:1", "host": "h:1"}, body, False))
        assert nobody.status == 303  # no credential: to the sign-in form
    finally:
        app.close()


def test_the_axis_ticks_at_round_times() -> None:
    assert tick_step(10 * 60_000) == 2 * 60_000
    assert tick_step(9_000) == 2_000
    assert tick_step(3 * 86_400_000) == 86_400_000
    start = 1_795_885_981_589
    marks = ticks(start, start + 10 * 60_000)
    assert marks and all(m % 120_000 == 0 for m in marks)
    assert start <= marks[0] < start + 120_000 and marks[-1] <= start + 10 * 60_000
    attempt = pb.Attempt(bound_at_ms=start, started_at_ms=start + 7_000)
    svg = attempt_timeline(attempt, start + 10 * 60_000)
    assert svg.count('class="tick-label"') == len(marks)
    assert f'data-ms="{marks[0]}"' in svg and "axis every 2m00s" in svg
