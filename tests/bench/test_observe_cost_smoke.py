"""The observability cost benchmark's smoke run, so that it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "observe_cost.py"


def test_observe_cost_benchmark_smoke_run_reports_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    scrape = report["scrape_every_1s"]
    assert scrape["passes_with_scraper"] > 0 and scrape["passes_without_scraper"] > 0
    assert scrape["scrapes"] >= 1
    page = report["dashboard_main_page"]
    assert page["nodes"] == 200 and page["render_ms_median"] > 0 and page["http_fetch_ms"] > 0
