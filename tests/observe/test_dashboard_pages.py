"""The dashboard's pages in headless Chromium, over a faked cluster: the app is the real
:class:`~synapse_ha.observe.dashboard.Dashboard` behind the real HTTPS server, with its
API client replaced by :class:`FakeCluster` (what ``ListJobs``, ``ListNodes``,
``ListQueues``, ``ListHistory`` and ``GetJob`` would answer). Fast: no replica starts.

Checks: no page shows a 13-digit epoch number; times are shown in the browser's own
zone; the job page has queue, CPU, memory, time limit, elapsed time, time left and
command, and an attempt bar with time ticks; the signed-in user is named; ``/nodes``
names each GPU's holder, health and conditions; ``/queues`` nominal, used, borrowed,
pending and the fair-share position, in that order; ``/history`` finished jobs with
filters; ``/charts`` draws its two charts (uPlot canvases) from series that match the
jobs, under the CSP; ``/usage`` GPU-hours per user or queue with its period form; a live
page refreshes itself without reloading (the scroll position stays), the charts too.

``SYNAPSE_DASHBOARD_SCREENSHOTS=DIR`` saves a screenshot of each page there
(``dashboard-overview.png``, ``dashboard-job.png``, ``dashboard-nodes.png``,
``dashboard-queues.png``, ``dashboard-history.png``, ``dashboard-charts.png``,
``dashboard-usage.png``).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import time
import zoneinfo
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from synapse_ha.observe.dashboard import Dashboard
from synapse_ha.observe.http import ObserveServer
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.security.bundle import ClusterCredentials
from synapse_ha.security.tls import Transport
from tests.integration.cluster import wait_for
from tests.integration.test_dashboard_browser import CHROMIUM, CHROMIUM_ARGS

EPOCH_MS = re.compile(r"\b\d{13}\b")
ZONE = "Asia/Kolkata"  # +05:30, never the machine's zone by accident
TOKEN = "syn_0123456789ab_" + "s" * 43
MINUTE = 60_000


class FakeCluster:
    """The API answers the pages read; ``history_asked`` records each ListHistory's
    filters."""

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms
        self.jobs = [running_job(now_ms), pending_job(now_ms, "job-000002")]
        self.history_asked: list[dict[str, Any]] = []
        self.usage_asked: list[tuple[str, int, int]] = []

    def close(self) -> None:
        pass

    def cluster_status(self) -> pb.GetClusterStatusResponse:
        replicas = [
            pb.ReplicaStatus(
                replica_id=r,
                role="leader" if r == "r1" else "follower",
                term=3,
                commit_index=1042,
                last_applied=1042,
                healthy=True,
            )
            for r in ("r1", "r2", "r3")
        ]
        return pb.GetClusterStatusResponse(
            leader_id="r1",
            replicas=replicas,
            answered_by="r1",
            nodes=3,
            running_jobs=1,
            pending_jobs=len(self.jobs) - 1,
        )

    def list_jobs(self, **_: Any) -> list[pb.Job]:
        return list(self.jobs)

    def get_job(self, job_id: str) -> pb.Job:
        return next(j for j in self.jobs if j.job_id == job_id)

    def list_nodes(self) -> list[pb.Node]:
        return [node("w1", "ra", [0, 1, 2, 3]), node("w2", "ra", [0, 1, 2, 3]), sick_node()]

    def list_queues(self) -> pb.ListQueuesResponse:
        # The API's order (positions) is not the order of the names, nor of the shares
        # of nominal in use now (prod holds nothing now but used much in the past): the
        # page follows the positions.
        return pb.ListQueuesResponse(
            queues=[
                pb.QueueStatus(
                    queue=pb.Queue(name="prod", gpu=8, cohort="lab"),
                    usage=pb.QueueUsage(lent_gpu=4, pending_jobs=1, pending_gpu=6),
                    fair_share_ppm=2_500_000,
                    cohort_shares_ppm=[700_000],
                    fair_share_position=2,
                ),
                pb.QueueStatus(
                    queue=pb.Queue(name="research", gpu=4, cohort="lab"),
                    usage=pb.QueueUsage(used_gpu=8, borrowed_gpu=4, running_jobs=1),
                    fair_share_ppm=2_100_000,
                    cohort_shares_ppm=[700_000],
                    fair_share_position=1,
                ),
            ],
            cohorts=[
                pb.CohortStatus(
                    cohort=pb.Cohort(name="lab", parent="org"), nominal_gpu=12, used_gpu=8
                ),
                pb.CohortStatus(cohort=pb.Cohort(name="org"), nominal_gpu=12, used_gpu=8),
            ],
            preemption="topology",
            fair_share_half_life_ms=7 * 24 * 60 * MINUTE,
        )

    def list_history(self, **filters: Any) -> list[pb.HistoryJob]:
        self.history_asked.append(filters)
        done = [
            finished("job-000000", "alice", self.now_ms - 90 * MINUTE),
            finished("job-000003", "bob", self.now_ms - 30 * MINUTE),
        ]
        return [
            j
            for j in done
            if (not filters.get("user") or j.owner == filters["user"])
            and j.finished_at_ms >= filters.get("since_ms", 0)
        ]

    def get_usage(self, by: str, since_ms: int, until_ms: int = 0) -> pb.GetUsageResponse:
        self.usage_asked.append((by, since_ms, until_ms))
        day = "2026-11-28"
        rows = (
            [("alice", 6 * 60 * MINUTE, 2), ("bob", 3 * 60 * MINUTE, 1), ("carol", 45 * MINUTE, 1)]
            if by == "user"
            else [("prod", 9 * 60 * MINUTE, 3), ("research", 45 * MINUTE, 1)]
        )
        return pb.GetUsageResponse(
            by=by,
            since_ms=since_ms,
            until_ms=until_ms,
            rows=[pb.UsageRow(key=k, day=day, gpu_ms=ms, attempts=n) for k, ms, n in rows],
        )


def running_job(now_ms: int, job_id: str = "job-000001") -> pb.Job:
    """Waited 2 minutes; holds 2 x 4 GPUs since 10 minutes ago."""
    members = [
        pb.Member(rank=i, node_id=n, gpus=[0, 1, 2, 3], state="running")
        for i, n in enumerate(("w1", "w2"))
    ]
    return pb.Job(
        job_id=job_id,
        owner="alice",
        spec=pb.JobSpec(
            name="train-llm",
            replicas=2,
            queue="research",
            resources=pb.Resources(gpu=4, cpu_milli=1500, memory_mib=8192),
            argv=pb.CommandArgs(args=["python", "train.py", "--lr", "3e-4"]),
            time_limit_ms=60 * MINUTE,
        ),
        state="RUNNING",
        job_state=pb.JOB_STATE_RUNNING,
        reason="attempt 1 running",
        submitted_at_ms=now_ms - 12 * MINUTE,
        attempts_made=1,
        attempt=pb.Attempt(
            number=1,
            fencing_token=5,
            bound_at_ms=now_ms - 10 * MINUTE,
            started_at_ms=now_ms - 10 * MINUTE + 7_000,
            members=members,
        ),
    )


def pending_job(now_ms: int, job_id: str) -> pb.Job:
    """Waits for 3 x 2 GPUs since 3 minutes ago."""
    return pb.Job(
        job_id=job_id,
        owner="bob",
        spec=pb.JobSpec(name="eval", replicas=3, resources=pb.Resources(gpu=2)),
        state="PENDING",
        job_state=pb.JOB_STATE_PENDING,
        reason="needs 3 member(s) x (2 GPU); first in line, capacity reserved starting in 8m47s",
        reason_code="first_in_line_reserved",
        submitted_at_ms=now_ms - 3 * MINUTE,
    )


def node(node_id: str, rack: str, used: list[int]) -> pb.Node:
    return pb.Node(
        node_id=node_id,
        status="ready",
        capacity=pb.Resources(gpu=4, cpu_milli=32_000, memory_mib=262_144),
        allocated=pb.Resources(gpu=len(used), cpu_milli=1500, memory_mib=8192),
        allocated_gpus=used,
        topology=[pb.TopologyLabel(level="rack", value=rack)],
        last_heartbeat_age_ms=400,
        gpu_model="mock-H100",
    )


def sick_node() -> pb.Node:
    n = node("w3", "rb", [])
    n.gpu_faults.append(pb.GpuFault(gpu=2, code="xid-79", detail="fell off the bus"))
    n.conditions.append(pb.NodeCondition(name="health-check", message="disk /scratch full"))
    return n


def finished(job_id: str, owner: str, ended_ms: int) -> pb.HistoryJob:
    """Waited 5 minutes, then held 8 GPUs for 45."""
    return pb.HistoryJob(
        job_id=job_id,
        name="nightly",
        owner=owner,
        queue="prod",
        state="SUCCEEDED",
        job_state=pb.JOB_STATE_SUCCEEDED,
        reason="all 2 members exited 0",
        submitted_at_ms=ended_ms - 50 * MINUTE,
        started_at_ms=ended_ms - 45 * MINUTE,
        finished_at_ms=ended_ms,
        attempts=1,
        gpus_per_attempt=8,
        gpu_ms=8 * 45 * MINUTE,
        nodes=["w1", "w2"],
        attempt_list=[
            pb.HistoryAttempt(
                number=1, gpus=8, bound_at_ms=ended_ms - 45 * MINUTE, ended_at_ms=ended_ms
            )
        ],
    )


class FakedDashboard(Dashboard):
    def __init__(self, fake: FakeCluster, transport: Transport) -> None:
        super().__init__(
            ["127.0.0.1:1"],
            transport,
            clock_ms=lambda: fake.now_ms,
            identify=lambda token: "alice (user)" if token == TOKEN else "",
            refresh_s=1,
            charts_refresh_s=1,
        )
        self.fake = fake

    def _client(self, token: str) -> Any:
        return self.fake

    def log_tails(self, client: Any, job: pb.Job) -> dict[int, str]:
        return {m.rank: f"step 1200 loss 1.93 (rank {m.rank})" for m in job.attempt.members}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, FakeCluster]]:
    credentials = ClusterCredentials.ensure(tmp_path / "credentials")
    tls = credentials.replica_tls("r1")
    fake = FakeCluster(int(time.time() * 1000))
    app = FakedDashboard(fake, Transport(tls))
    server = ObserveServer("127.0.0.1:0", _registry(), tls, app=app)
    server.start()
    try:
        yield server.url, fake
    finally:
        server.stop()
        app.close()


def _registry():  # type: ignore[no-untyped-def]
    from prometheus_client import CollectorRegistry

    return CollectorRegistry()


def _shown_in_zone(ms: int, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    moment = datetime.datetime.fromtimestamp(ms / 1000, zoneinfo.ZoneInfo(ZONE))
    return moment.strftime(fmt)


def test_every_page_reads_in_the_browsers_zone_and_refreshes_itself(
    served: tuple[str, FakeCluster],
) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs it (apt-get install chromium)")
    url, fake = served
    shots = os.environ.get("SYNAPSE_DASHBOARD_SCREENSHOTS")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(
                ignore_https_errors=True,
                timezone_id=ZONE,
                viewport={"width": 1280, "height": 400},
                extra_http_headers={"Authorization": f"Bearer {TOKEN}"},
            )
            page = context.new_page()
            errors: list[str] = []
            page.on(
                "console",
                lambda m: (
                    errors.append(m.text)
                    if m.type == "error" and not m.text.startswith("Failed to load resource")
                    else None
                ),
            )
            page.on(  # the browser's own /favicon.ico aside, every fetch finds its page
                "response",
                lambda r: (
                    errors.append(f"{r.status} {r.url}")
                    if r.status >= 400 and not r.url.endswith("/favicon.ico")
                    else None
                ),
            )

            def visit(path: str, ready: str, shot: str) -> str:
                page.goto(url + path, timeout=30_000)
                page.wait_for_selector(ready, timeout=30_000)
                text = page.inner_text("body")
                assert not EPOCH_MS.search(text), (path, EPOCH_MS.search(text))
                assert page.inner_text("#viewer") == "alice (user)"
                if shots:
                    page.screenshot(path=str(Path(shots) / f"dashboard-{shot}.png"), full_page=True)
                return text

            # The overview: GPU cells name their holder, node names are shown.
            visit("/", "#running", "overview")
            held = page.locator('[data-node="w1"] .g.u[data-gpu="2"]')
            assert held.get_attribute("title") == "GPU 2: job-000001"
            assert page.inner_text('[data-node="w3"] .name') == "w3"

            # The job page: its details, times in the browser's zone, the axis.
            job = fake.jobs[0]
            text = visit("/jobs/job-000001", "#timeline", "job")
            assert page.inner_text("#queue-name") == "research"
            assert page.inner_text("#gang") == "2 members x 4 GPU, 1.5 CPU, 8Gi memory"
            assert page.inner_text("#command") == "python train.py --lr 3e-4"
            assert page.inner_text("#time-limit") == "1h00m"
            assert page.inner_text("#elapsed") == "9m53s"
            assert page.inner_text("#time-left") == "50m07s"
            assert page.inner_text("#wait") == "2m07s"
            submitted = page.inner_text("#submitted time")
            assert submitted == _shown_in_zone(job.submitted_at_ms), submitted
            ticks = page.locator("#timeline .tick-label")
            assert ticks.count() >= 3
            first = int(ticks.first.get_attribute("data-ms") or 0)
            assert ticks.first.text_content() == _shown_in_zone(first, "%H:%M")
            assert "axis every 2m00s" in text
            assert page.locator("#cancel").count() == 1  # not withheld: the viewer may manage it

            # Nodes: labels, each GPU's holder, health and conditions.
            visit("/nodes", "#node-table", "nodes")
            w1 = page.locator('#node-table tr[data-node="w1"]')
            assert "rack=ra" in w1.inner_text()
            assert w1.locator('a[data-holds="0,1,2,3"]').inner_text() == "job-000001"
            w3 = page.inner_text('#node-table tr[data-node="w3"] .health')
            assert "GPU 2 xid-79: fell off the bus" in w3 and "disk /scratch full" in w3

            # Queues: nominal, used, borrowed, pending; in the fair-share order.
            visit("/queues", "#queue-table", "queues")
            research = page.locator('#queue-table tr[data-queue="research"]')
            cells = [
                research.locator(f".{c}").inner_text() for c in ("nominal", "used", "borrowed")
            ]
            assert cells == ["4", "8", "4"]
            prod = page.locator('#queue-table tr[data-queue="prod"]')
            assert prod.locator(".pending").inner_text() == "1 (6 GPU)"
            assert prod.locator(".share").inner_text() == "250%"
            assert prod.locator(".cohort-shares").inner_text() == "lab 70%"
            names = page.locator("#queue-table tr[data-queue]").evaluate_all(
                "rows => rows.map(r => [r.dataset.queue, r.querySelector('.position').innerText])"
            )
            assert names == [["research", "1"], ["prod", "2"]]  # the API's positions
            assert "decayed by half every 7d00h" in page.inner_text("#fair-share-note")
            assert page.locator('#cohort-tree [data-cohort="lab"]').count() == 1

            # History: finished jobs in the browser's zone, filtered by the form.
            visit("/history", "#history", "history")
            assert page.locator("#history tr[data-job]").count() == 2
            page.fill("#filter-user", "bob")
            page.fill("#filter-since", "1d")
            page.click("#filter")
            page.wait_for_url(re.compile(r"user=bob"), timeout=30_000)
            assert page.locator("#history tr[data-job]").count() == 1
            asked = fake.history_asked[-1]
            assert asked["user"] == "bob"
            assert abs(asked["since_ms"] - (fake.now_ms - 86_400_000)) < 1000
            page.goto(url + "/history?since=yesterday-ish", timeout=30_000)
            assert "neither a duration" in page.inner_text("main")

            _charts(page, visit, fake)
            _usage(page, visit, fake)

            # A live page refreshes itself in place: no reload, the scroll position stays.
            page.goto(url + "/", timeout=30_000)
            page.wait_for_selector("#queue", timeout=30_000)
            page.evaluate("window.notReloaded = true; window.scrollTo(0, 120)")
            fake.jobs.append(pending_job(fake.now_ms, "job-000009"))
            wait_for(
                "the overview to show the new job",
                lambda: page.locator('#queue tr[data-job="job-000009"]').count() == 1,
                timeout_s=15,
                every_s=0.2,
            )
            assert page.evaluate("window.notReloaded") is True
            assert page.evaluate("window.scrollY") == 120
            assert int(page.get_attribute("body", "data-refreshed") or 0) >= 1

            # The charts page refreshes (less often) and draws the fresh series again.
            page.goto(url + "/charts?window=1h", timeout=30_000)
            page.wait_for_selector("#chart-gpus canvas", timeout=30_000)
            fake.jobs.append(running_job(fake.now_ms, "job-000010"))
            wait_for(
                "the charts to show the new job's GPUs",
                lambda: page.inner_text("#now-allocated") == "16",
                timeout_s=15,
                every_s=0.2,
            )
            assert page.locator("#chart-gpus canvas").count() == 1  # redrawn, not added
            buckets = len(json.loads(page.inner_text("#chart-data"))["times_ms"])
            assert buckets in (60, 61)  # an hour of minutes, the last one partly elapsed
            assert page.get_attribute("#chart-gpus", "data-points") == str(buckets)
            assert not errors, errors  # no script error, no CSP refusal
        finally:
            browser.close()


def _charts(page: Any, visit: Any, fake: FakeCluster) -> None:
    """/charts: two uPlot canvases, drawn from series that match the fake jobs."""
    visit("/charts", "#chart-wait canvas", "charts")
    data = json.loads(page.inner_text("#chart-data"))
    bucket, first = data["bucket_ms"], data["times_ms"][0]
    assert bucket == 5 * MINUTE and len(data["times_ms"]) in (72, 73)  # 6 hours

    def at(series: list[Any], minutes_ago: float) -> Any:
        return series[(fake.now_ms - int(minutes_ago * MINUTE) - first) // bucket]

    # job-000001 holds 8 GPUs since 10m ago; job-000002 waits for 6 since 3m ago: in
    # the last bucket (up to now, at most 5m) for as much of it as is 3m or less.
    elapsed = fake.now_ms - data["times_ms"][-1]
    waited = round(6 * min(elapsed, 3 * MINUTE) / elapsed, 3)
    assert data["allocated"][-1] == 8 and data["pending"][-1] == waited
    assert at(data["pending"], 20) == 0  # before it came: none
    # job-000000 held 8 between 135m and 90m ago, after waiting 5 minutes (prod).
    assert at(data["allocated"], 110) == 8 and at(data["allocated"], 240) == 0
    assert at(data["wait_s"]["prod"], 135) == 300
    assert at(data["wait_s"]["research"], 10) == 120
    assert page.inner_text("#now-allocated") == "8"
    assert page.inner_text("#now-pending") == f"{waited:g}"
    assert "of 12 in the cluster" in page.inner_text("#now")
    # Both charts are drawn by uPlot (no inline script: the CSP would have refused it).
    assert page.locator("#chart-gpus canvas").count() == 1
    assert page.locator("#chart-wait canvas").count() == 1
    assert page.get_attribute("#chart-gpus", "data-points") == str(len(data["times_ms"]))
    assert page.get_attribute("#chart-wait", "data-series") == "prod,research"
    assert page.get_attribute("body", "data-charts") == "2"
    legend = page.inner_text("#chart-wait .u-legend")
    assert "prod" in legend and "research" in legend
    started = page.locator('#wait-summary tr[data-queue="prod"] .started').inner_text()
    assert started == "2"
    # Another window, by the form.
    page.select_option("#window", "24h")
    page.click("#show")
    page.wait_for_url(re.compile(r"window=24h"), timeout=30_000)
    page.wait_for_selector("#chart-gpus canvas", timeout=30_000)
    assert json.loads(page.inner_text("#chart-data"))["bucket_ms"] == 15 * MINUTE


def _usage(page: Any, visit: Any, fake: FakeCluster) -> None:
    """/usage: GPU-hours per user, most first, and the period form."""
    visit("/usage", "#usage-totals", "usage")
    by, since, until = fake.usage_asked[-1]
    assert by == "user" and abs(since - (fake.now_ms - 7 * 24 * 60 * MINUTE)) < 1000
    assert until == 0
    keys = page.locator("#usage-totals tr[data-key]").evaluate_all(
        "rows => rows.map(r => [r.dataset.key, r.querySelector('.gpu-hours').innerText])"
    )
    assert keys == [["alice", "6.00"], ["bob", "3.00"], ["carol", "0.75"]]
    assert page.inner_text("#usage-total") == "9.75"
    page.select_option("#usage-by", "queue")
    page.fill("#usage-since", "30d")
    page.click("#usage-show")
    page.wait_for_url(re.compile(r"by=queue"), timeout=30_000)
    assert fake.usage_asked[-1][0] == "queue"
    assert page.locator("#usage-totals tr[data-key]").count() == 2
    page.goto(page.url.split("/usage")[0] + "/usage?since=soon", timeout=30_000)
    assert "since: 'soon' is neither a duration" in page.inner_text("main")
