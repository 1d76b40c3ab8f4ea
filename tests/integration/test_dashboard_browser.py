"""The web dashboard in a real headless browser (Debian's chromium driven by Playwright).

A TLS cluster with three workers in two racks runs a rack-bound gang. The browser signs
in on a follower's dashboard with a token through the form (which holds the sign-in's
forgery guard), and keeps only a session cookie, never the token; it finds the gang on
the right nodes (queue table, node map, job page with the members' log tails), then sees
a new leader once the old one is killed, and signs out with the page's button. A
``user`` token sent as a header sees the job but not its logs, as on the API.

``SYNAPSE_DASHBOARD_SCREENSHOT=path.png`` also saves a screenshot of the main page there.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from synapse_ha.core.identity.access import split_token
from synapse_ha.observe.dashboard import COOKIE
from tests.integration.cluster import wait_for
from tests.observe.world import gang, wait_running, world

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
RACKS = {"w1": "ra", "w2": "ra", "w3": "rb"}


def test_dashboard_shows_the_gang_and_follows_the_leader(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs it (apt-get install chromium)")
    with world(tmp_path, RACKS) as (cluster, _workers):
        credentials = cluster.credentials
        assert credentials is not None
        with cluster.client() as client:
            job_id = client.submit_job(gang("browsed", replicas=2, gpu=4)).job_id
            job = wait_running(client, job_id)
            bob = client.create_token(user="bob", role="user").token
        nodes = sorted(m.node_id for m in job.attempt.members)
        assert nodes == ["w1", "w2"]  # whole nodes, in the one rack that holds the gang
        leader = cluster.serving_leader()
        follower = cluster.followers(leader)[0]
        url = cluster.local_status(follower).dashboard_url
        assert url.startswith("https://127.0.0.1:")

        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                context = browser.new_context(ignore_https_errors=True)
                page = context.new_page()
                page.goto(url, timeout=30_000)
                page.fill("#token", credentials.admin_token)
                page.click("#sign-in")
                page.wait_for_selector("#replicas", timeout=30_000)
                kept = {c["name"]: c["value"] for c in context.cookies()}
                assert list(kept) == [COOKIE], kept  # the form's value is gone too
                parts = split_token(credentials.admin_token)
                assert parts is not None  # the secret may hold '_': split it as the API does
                assert parts[1] not in kept[COOKIE]
                assert page.inner_text("#leader") == leader.replica_id
                row = page.locator(f'#running tr[data-job="{job_id}"]')
                assert row.get_attribute("data-nodes") == "w1, w2"
                for node_id in nodes:
                    cell = page.locator(f'.rack[data-rack="ra"] [data-node="{node_id}"]')
                    assert cell.get_attribute("data-used") == "4"
                assert page.locator('[data-node="w3"]').get_attribute("data-used") == "0"
                screenshot = tmp_path / "dashboard.png"
                page.screenshot(path=str(screenshot), full_page=True)
                wanted = os.environ.get("SYNAPSE_DASHBOARD_SCREENSHOT")
                if wanted:
                    shutil.copyfile(screenshot, wanted)

                row.locator("a").click()
                page.wait_for_selector("#members", timeout=30_000)
                for rank in range(len(nodes)):
                    member = page.locator(f'#members tr[data-rank="{rank}"]')
                    assert member.get_attribute("data-node") in nodes
                    log = page.inner_text(f'pre[data-log-rank="{rank}"]')
                    assert f"hello from rank {rank}" in log, log

                # A user sees the job (redacted) but may not read another owner's logs.
                as_bob = browser.new_context(
                    ignore_https_errors=True,
                    extra_http_headers={"Authorization": f"Bearer {bob}"},
                ).new_page()
                as_bob.goto(f"{url}jobs/{job_id}", timeout=30_000)
                as_bob.wait_for_selector("#members", timeout=30_000)
                assert "(no log:" in as_bob.inner_text('pre[data-log-rank="0"]')

                # Kill the leader: the follower's page shows the new one.
                cluster.kill(leader)

                def new_leader() -> str | None:
                    page.goto(url, timeout=30_000)
                    if not page.locator("#leader").count():
                        return None
                    shown = page.inner_text("#leader")
                    if shown in ("none", leader.replica_id):
                        return None
                    role = page.locator(f'#replicas tr[data-replica="{shown}"]')
                    return shown if role.get_attribute("data-role") == "leader" else None

                elected = wait_for("the dashboard to show a new leader", new_leader, 60, 0.5)
                assert elected != leader.replica_id
                dead = page.locator(f'#replicas tr[data-replica="{leader.replica_id}"]')
                assert dead.get_attribute("data-role") == "unreachable"
                assert page.locator(f'#running tr[data-job="{job_id}"]').count() == 1

                page.click("#sign-out")
                page.wait_for_selector("#token", timeout=30_000)
                page.goto(url, timeout=30_000)
                assert page.locator("#token").count() == 1  # signed out: the form again
                assert COOKIE not in {c["name"] for c in context.cookies()}
            finally:
                browser.close()
