"""Cancelling from the dashboard, in headless Chromium against a real TLS cluster: the
button posts to the dashboard, which calls ``CancelJob`` as the viewer, so the API's own
access check decides.

alice (role user) runs a job. bob (role user) is shown no button on it, and a post he
makes anyway from the dashboard's own origin is refused with the API's reason, the job
still running. alice, signed in through the form, is named on the page as herself,
cancels it with the button, and the job ends CANCELLED by her. Her charts, usage and
queue pages then show what the API answers: the job's GPU and its wait, her usage only,
the queue's fair-share position.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from tests.integration.cluster import wait_for
from tests.integration.test_dashboard_browser import CHROMIUM, CHROMIUM_ARGS
from tests.observe.world import wait_running, world

pytestmark = pytest.mark.integration


def sleeper() -> pb.JobSpec:
    return pb.JobSpec(
        name="sleeper",
        replicas=1,
        resources=pb.Resources(cpu_milli=100, memory_mib=64, gpu=1),
        shell_command="exec sleep 600",
    )


def test_only_whom_the_api_allows_can_cancel_from_the_dashboard(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs it (apt-get install chromium)")
    with world(tmp_path, {"w1": "ra"}) as (cluster, _workers):
        with cluster.client() as admin:
            alice = admin.create_token(user="alice", role="user").token
            bob = admin.create_token(user="bob", role="user").token
        with cluster.client(token=alice) as as_alice:
            job_id = as_alice.submit_job(sleeper()).job_id
            wait_running(as_alice, job_id)
        url = cluster.local_status(cluster.serving_leader()).dashboard_url
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                as_bob = browser.new_context(
                    ignore_https_errors=True,
                    extra_http_headers={"Authorization": f"Bearer {bob}"},
                ).new_page()
                as_bob.goto(f"{url}jobs/{job_id}", timeout=30_000)
                as_bob.wait_for_selector("#job", timeout=30_000)
                assert as_bob.inner_text("#viewer") == "bob (user)"
                assert as_bob.locator("#cancel").count() == 0  # another user's job
                forged = as_bob.evaluate(
                    """async (path) => {
                        const r = await fetch(path, {method: "POST", body: "csrf=",
                            headers: {"Content-Type": "application/x-www-form-urlencoded"}});
                        return [r.status, await r.text()];
                    }""",
                    f"/jobs/{job_id}/cancel",
                )
                assert forged[0] == 403, forged
                assert "not cancelled" in forged[1] and "bob" in forged[1], forged[1]
                with cluster.client() as admin:
                    assert admin.get_job(job_id).state == "RUNNING"

                page = browser.new_context(ignore_https_errors=True).new_page()
                page.goto(url, timeout=30_000)
                page.fill("#token", alice)
                page.click("#sign-in")
                page.wait_for_selector("#replicas", timeout=30_000)
                assert page.inner_text("#viewer") == "alice (user)"
                page.goto(f"{url}jobs/{job_id}", timeout=30_000)
                page.click("#cancel")
                page.wait_for_selector("#state", timeout=30_000)
                with cluster.client() as admin:
                    done = wait_for(
                        "the job to be cancelled",
                        lambda: (j := admin.get_job(job_id)).state == "CANCELLED" and j,
                        timeout_s=30,
                    )
                assert done.cancelled_by == "user:alice", done.cancelled_by
                _pages_after(page, url, done)
            finally:
                browser.close()


def _pages_after(page: Any, url: str, job: pb.Job) -> None:
    """alice's charts, usage and queues, from the real API's answers: her cancelled job
    (1 GPU) is in the history, so in the charts and in her usage."""

    def charted() -> dict[str, Any] | None:
        page.goto(f"{url}charts?window=1h", timeout=30_000)
        page.wait_for_selector("#chart-gpus canvas", timeout=30_000)
        data: dict[str, Any] = json.loads(page.inner_text("#chart-data"))
        return data if data["wait_s"] else None

    data = wait_for("the cancelled job in the charts", charted, timeout_s=30, every_s=0.5)
    assert list(data["wait_s"]) == ["default"] and sum(data["started"]["default"]) == 1
    bound, first = job.attempt.bound_at_ms, data["times_ms"][0]
    at = (bound - first) // data["bucket_ms"]
    assert data["wait_s"]["default"][at] == round((bound - job.submitted_at_ms) / 1000, 3)
    assert 0 < data["allocated"][at] <= 1 and max(data["allocated"]) <= 1  # its one GPU
    assert page.locator("#chart-wait canvas").count() == 1

    def used() -> bool:
        page.goto(f"{url}usage", timeout=30_000)
        return page.locator('#usage-totals tr[data-key="alice"]').count() == 1

    wait_for("alice's usage", used, timeout_s=30, every_s=0.5)
    assert page.locator("#usage-totals tr[data-key]").count() == 1  # hers only
    page.goto(f"{url}queues", timeout=30_000)
    default = page.locator('#queue-table tr[data-queue="default"]')
    assert default.get_attribute("data-position") == "1"
