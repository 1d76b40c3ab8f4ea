"""The dashboard's pages and routes, without a cluster: pure renders and the app's
answers to requests that need no API call."""

from __future__ import annotations

from pathlib import Path

from synapse_ha.cli.render import cluster_document, cluster_table
from synapse_ha.observe.dashboard import COOKIE, Dashboard, Overview, render_job, render_overview
from synapse_ha.observe.http import ObserveServer, Request
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


def test_requests_without_a_token_are_sent_to_the_login_form(tmp_path: Path) -> None:
    credentials = ClusterCredentials.ensure(tmp_path / "credentials")
    app = Dashboard(["127.0.0.1:1"], Transport(credentials.replica_tls("r1")))
    try:
        answer = app(Request("GET", "/", {}, b"", False))
        assert answer.status == 303
        assert ("Location", "/login") in answer.headers
        assert app(Request("GET", "/login", {}, b"", False)).status == 200
        assert app(Request("POST", "/login", {}, b"token=", False)).status == 400
        assert app(Request("POST", "/jobs/x", {"cookie": f"{COOKIE}=t"}, b"", False)).status == 405
        logout = app(Request("GET", "/logout", {}, b"", False))
        assert any(v.startswith(f"{COOKIE}=;") for _, v in logout.headers)
    finally:
        app.close()


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
    doc = cluster_document(status())
    assert doc["replicas"][1]["dashboard_url"] == "https://127.0.0.1:9001/"
    text = cluster_table(doc)
    assert "DASHBOARD" in text and "https://127.0.0.1:9002/metrics" in text
