"""The dashboard's pages and routes, without a cluster: pure renders, the session store
on a fake clock, and the app's answers to requests that need no API call (the API
address answers nothing, so any refusal here is made from the request alone)."""

from __future__ import annotations

import re
from pathlib import Path

from synapse_ha.cli.render_cluster import cluster_document, cluster_table
from synapse_ha.client.replicas import status_from_proto
from synapse_ha.observe.dashboard import COOKIE, LEGACY_TOKEN_COOKIE, LOGIN_COOKIE, Dashboard
from synapse_ha.observe.http import ObserveServer, Request, Response
from synapse_ha.observe.page_kit import SCRIPT
from synapse_ha.observe.pages import (
    STYLESHEET,
    Overview,
    render_job,
    render_login,
    render_overview,
    render_queue,
)
from synapse_ha.observe.sessions import SessionLimits, Sessions
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.security.bundle import ClusterCredentials
from synapse_ha.security.tls import Transport


def status() -> pb.GetClusterStatusResponse:
    replicas = [
        pb.ReplicaStatus(
            replica_id=r,
            role="leader" if r == "r2" else "follower",
            term=4,
            healthy=True,
            metrics_url=f"https://127.0.0.1:900{i}/metrics",
            dashboard_url=f"https://127.0.0.1:900{i}/",
        )
        for i, r in enumerate(("r1", "r2", "r3"))
    ]
    return pb.GetClusterStatusResponse(leader_id="r2", replicas=replicas, answered_by="r1")


def a_job(job_id: str, state: str, nodes: list[str]) -> pb.Job:
    members = [
        pb.Member(rank=i, node_id=n, gpus=[0, 1], state="running") for i, n in enumerate(nodes)
    ]
    return pb.Job(
        job_id=job_id,
        spec=pb.JobSpec(name="<train>", replicas=len(nodes) or 2, resources=pb.Resources(gpu=2)),
        state=state,
        reason="needs 2 members x 2 GPU in one rack",
        reason_code="waiting_capacity",
        attempt=pb.Attempt(number=1, fencing_token=7, members=members) if nodes else None,
    )


def test_the_overview_shows_health_queue_running_gangs_and_racks() -> None:
    nodes = [
        pb.Node(
            node_id=n,
            status="ready",
            capacity=pb.Resources(gpu=4),
            allocated_gpus=[0, 1] if n == "w1" else [],
            topology=[pb.TopologyLabel(level="rack", value=rack)],
        )
        for n, rack in (("w1", "ra"), ("w2", "rb"))
    ]
    overview = Overview(
        status=status(),
        jobs=[a_job("job-1", "RUNNING", ["w1"]), a_job("job-2", "PENDING", [])],
        nodes=nodes,
    )
    page = render_overview(overview, "token abc")
    assert '<b id="leader">r2</b>' in page
    assert 'data-replica="r2" data-role="leader"' in page
    assert 'data-job="job-1" data-nodes="w1"' in page
    assert 'data-reason="waiting_capacity"' in page
    assert 'data-rack="ra"' in page and 'data-node="w1" data-used="2"' in page
    assert 'data-node="w2" data-used="0"' in page
    assert "&lt;train&gt;" in page and "<train>" not in page  # escaped


def test_a_section_the_viewer_may_not_read_says_why() -> None:
    overview = Overview(status=status(), errors={"nodes": "PERMISSION_DENIED: no"})
    page = render_overview(overview)
    assert "PERMISSION_DENIED: no" in page
    assert 'id="nodes"' not in page


def test_the_job_page_lists_members_and_log_tails() -> None:
    page = render_job(a_job("job-1", "RUNNING", ["w1", "w2"]), {0: "hi <0>", 1: ""}, 10_000)
    assert 'data-rank="1" data-node="w2"' in page
    assert "hi &lt;0&gt;" in page
    assert "fencing token 7" in page
    assert 'id="checkpoint"' not in page and 'id="resume-step"' not in page


def test_the_job_page_shows_the_checkpoint_marks() -> None:
    job = a_job("job-1", "RUNNING", ["w1", "w2"])
    job.resume_step = 500
    job.attempt.checkpoint.CopyFrom(pb.Checkpoint(at_ms=4_000, step=1200))
    job.attempt.members[0].checkpoint.CopyFrom(pb.Checkpoint(at_ms=4_000, step=1200))
    job.attempt.members[1].checkpoint.CopyFrom(pb.Checkpoint(at_ms=7_000))
    page = render_job(job, {}, 10_000)
    assert '<td id="checkpoint">step 1200, 6s ago</td>' in page
    assert '<td id="resume-step">step 500</td>' in page
    assert "<td>3s ago, no step</td>" in page


class FakeClock:
    def __init__(self, now_ms: int = 1_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def _cookie_values(response: Response) -> dict[str, str]:
    """``name → value`` of each Set-Cookie of a response."""
    out = {}
    for name, value in response.headers:
        if name == "Set-Cookie":
            key, _, rest = value.partition("=")
            out[key] = rest.split(";", 1)[0]
    return out


def _hidden_csrf(body: bytes) -> str:
    match = re.search(rb'name="csrf" value="([^"]+)"', body)
    assert match, body
    return match.group(1).decode()


def test_requests_without_a_credential_are_sent_to_the_login_form(tmp_path: Path) -> None:
    credentials = ClusterCredentials.ensure(tmp_path / "credentials")
    app = Dashboard(["127.0.0.1:1"], Transport(credentials.replica_tls("r1")))
    try:
        answer = app(Request("GET", "/", {}, b"", False))
        assert answer.status == 303
        assert ("Location", "/login") in answer.headers
        form = app(Request("GET", "/login", {}, b"", False))
        assert form.status == 200
        nonce = _cookie_values(form)[LOGIN_COOKIE]
        assert _hidden_csrf(form.body) == nonce
        headers = {"cookie": f"{LOGIN_COOKIE}={nonce}", "origin": "https://h:1", "host": "h:1"}
        assert (
            app(Request("POST", "/login", headers, f"csrf={nonce}&token=".encode(), False)).status
            == 400
        )
        not_a_token = app(
            Request("POST", "/login", headers, f"csrf={nonce}&token=abc".encode(), False)
        )
        assert not_a_token.status == 401 and b"not a synapse token" in not_a_token.body
        assert app(Request("POST", "/jobs/x", {"cookie": f"{COOKIE}=t"}, b"", False)).status == 405
        legacy = app(
            Request("GET", "/login", {"cookie": f"{LEGACY_TOKEN_COOKIE}=syn_x"}, b"", False)
        )
        assert _cookie_values(legacy)[LEGACY_TOKEN_COOKIE] == ""  # a token in a cookie: dropped
        as_token = app(Request("GET", "/", {"cookie": f"{LEGACY_TOKEN_COOKIE}=syn_x"}, b"", False))
        assert as_token.status == 303 and ("Location", "/login") in as_token.headers
        unknown = app(Request("GET", "/", {"cookie": f"{COOKIE}=made-up"}, b"", False))
        assert unknown.status == 303 and _cookie_values(unknown)[COOKIE] == ""  # cleared
        bad_header = app(Request("GET", "/", {"authorization": "Bearer nope"}, b"", False))
        assert bad_header.status == 401
    finally:
        app.close()


def test_the_sign_in_form_refuses_forgeries_before_any_api_call(tmp_path: Path) -> None:
    """No API answers at 127.0.0.1:1: every refusal here is made from the request alone."""
    credentials = ClusterCredentials.ensure(tmp_path / "credentials")
    app = Dashboard(["127.0.0.1:1"], Transport(credentials.replica_tls("r1")))
    token = credentials.admin_token
    try:
        nonce = _cookie_values(app(Request("GET", "/login", {}, b"", False)))[LOGIN_COOKIE]
        body = f"csrf={nonce}&token={token}".encode()
        own = {"host": "h:1", "cookie": f"{LOGIN_COOKIE}={nonce}"}
        cases = {
            "another origin": {**own, "origin": "https://evil.example"},
            "an opaque origin": {**own, "origin": "null"},
            "another scheme": {**own, "origin": "http://h:1"},
            "cross-site fetch": {**own, "sec-fetch-site": "cross-site"},
            "no form cookie": {"host": "h:1", "origin": "https://h:1"},
            "another form's cookie": {
                **own,
                "origin": "https://h:1",
                "cookie": f"{LOGIN_COOKIE}=x",
            },
        }
        for what, headers in cases.items():
            answer = app.triage(Request("POST", "/login", headers, body, False))
            assert answer is not None and answer.status == 403, what
            assert COOKIE not in _cookie_values(answer), what
        assert len(app.sessions) == 0
        # The same post from this origin goes on to the API (None: not answered here).
        assert (
            app.triage(Request("POST", "/login", {**own, "origin": "https://h:1"}, body, False))
            is None
        )
    finally:
        app.close()


def test_sessions_expire_idle_and_at_their_lifetime_and_are_bounded() -> None:
    clock = FakeClock()
    sessions = Sessions(
        clock, SessionLimits(ttl_ms=10_000, idle_ms=3_000, max_sessions=4, per_token=2)
    )
    a = sessions.open("syn_aaaaaaaaaaaa_x")
    assert a.session_id != a.token and a.token not in a.session_id
    for _ in range(3):  # in use every 2 s: alive until its lifetime ends
        clock.now_ms += 2_000
        assert sessions.get(a.session_id) is a
    clock.now_ms += 4_000  # 10 s after sign-in
    assert sessions.get(a.session_id) is None
    b = sessions.open("syn_bbbbbbbbbbbb_x")
    clock.now_ms += 3_000
    assert sessions.get(b.session_id) is None  # idle
    # One token's third session closes its first; others' sessions stay.
    others = [sessions.open(f"syn_{c * 12}_x") for c in "cd"]
    e1, e2, e3 = (sessions.open("syn_eeeeeeeeeeee_x") for _ in range(3))
    assert sessions.get(e1.session_id) is None
    assert sessions.get(e2.session_id) is e2 and sessions.get(e3.session_id) is e3
    assert all(sessions.get(o.session_id) is o for o in others)
    assert len(sessions) == 4
    assert sessions.get(e3.session_id) is e3 and sessions.get(e2.session_id) is e2
    # Used since: others[0] is the least recently used.
    sessions.open("syn_ffffffffffff_x")  # over the total: the least recently used goes
    assert sessions.get(others[0].session_id) is None
    assert sessions.close_token("syn_eeeeeeeeeeee_x") == 2 and len(sessions) == 2


def test_logout_is_a_post_with_the_sessions_own_value(tmp_path: Path) -> None:
    credentials = ClusterCredentials.ensure(tmp_path / "credentials")
    clock = FakeClock()
    app = Dashboard(["127.0.0.1:1"], Transport(credentials.replica_tls("r1")), clock_ms=clock)
    try:
        session = app.sessions.open(credentials.admin_token)
        cookie = {"cookie": f"{COOKIE}={session.session_id}", "host": "h:1"}
        assert app(Request("GET", "/logout", cookie, b"", False)).status == 405
        forged = app(
            Request("POST", "/logout", {**cookie, "origin": "https://h:1"}, b"csrf=x", False)
        )
        assert forged.status == 403
        elsewhere = {**cookie, "origin": "https://evil.example"}
        assert (
            app(
                Request("POST", "/logout", elsewhere, f"csrf={session.csrf}".encode(), False)
            ).status
            == 403
        )
        assert app.sessions.get(session.session_id) is session
        own = {**cookie, "origin": "https://h:1"}
        out = app(Request("POST", "/logout", own, f"csrf={session.csrf}".encode(), False))
        assert out.status == 303 and _cookie_values(out)[COOKIE] == ""
        assert app.sessions.get(session.session_id) is None
    finally:
        app.close()


def test_pages_use_no_inline_style_or_script() -> None:
    job = a_job("job-1", "RUNNING", ["w1"])
    job.attempt.bound_at_ms, job.attempt.started_at_ms = 1_000, 2_000
    for page in (
        render_overview(Overview(status=status()), "token abc", "csrf-value"),
        render_job(job, {0: "x"}, 10_000, "token abc", "csrf-value"),
        render_login("why", "nonce"),
    ):
        assert "<style" not in page and "style=" not in page
        # The one script comes from this origin, never inline.
        assert re.findall(r"<script[^>]*>(.*?)</script>", page) == [""]
        assert f'<script src="{SCRIPT}" defer></script>' in page
        assert f'<link rel="stylesheet" href="{STYLESHEET}">' in page
    signed_in = render_overview(Overview(status=status()), "token abc", "csrf-value")
    assert '<form class="inline" method="post" action="/logout">' in signed_in
    assert 'name="csrf" value="csrf-value"' in signed_in
    assert "/logout" not in render_overview(Overview(status=status()), "token abc")  # bearer


def test_metrics_need_a_verified_client_on_a_secure_server(tmp_path: Path) -> None:
    credentials = ClusterCredentials.ensure(tmp_path / "credentials")
    metrics = ObserveServer("127.0.0.1:0", registry=_registry(), tls=credentials.replica_tls("r1"))
    try:
        assert metrics.handle(Request("GET", "/metrics", {}, b"", False)).status == 401
        assert metrics.handle(Request("GET", "/metrics", {}, b"", True)).status == 200
        assert metrics.handle(Request("GET", "/", {}, b"", True)).status == 404
    finally:
        metrics.stop()
    plain = ObserveServer("127.0.0.1:0", registry=_registry(), tls=None)
    try:
        assert plain.handle(Request("GET", "/metrics", {}, b"", False)).status == 200
        assert plain.metrics_url.startswith("http://127.0.0.1:")
    finally:
        plain.stop()


def _registry():  # type: ignore[no-untyped-def]
    from prometheus_client import CollectorRegistry, Counter

    registry = CollectorRegistry()
    Counter("probe", "a probe", registry=registry).inc()
    return registry


def test_synctl_cluster_shows_each_replicas_urls() -> None:
    doc = cluster_document(status_from_proto(status()))
    assert doc["replicas"][1]["dashboard_url"] == "https://127.0.0.1:9001/"
    text = cluster_table(doc)
    assert "DASHBOARD" in text and "https://127.0.0.1:9002/metrics" in text


def test_the_queue_shows_an_arrays_pending_tasks_as_one_row() -> None:
    tasks = [a_job(f"job-000012_{i}", "PENDING", []) for i in range(50)]
    for i, task in enumerate(tasks):
        task.array_id, task.array_index = "job-000012", i
    single = a_job("job-000013", "PENDING", [])
    html = render_queue([*tasks, single])
    rows = re.findall(r'<tr data-job="([^"]+)"', html)
    assert rows == ["job-000012_0", "job-000013"]
    assert "(array job-000012: 50 tasks)" in html
