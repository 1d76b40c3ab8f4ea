"""The dashboard's charts page (``/charts``): GPUs allocated and pending over a window, and
the queue wait per queue, drawn in the browser from series the page carries.

The series (:mod:`synapse_ha.observe.chart_data`) travel in a ``<script
type="application/json" id="chart-data">`` element: data, which no browser runs, so the
Content-Security-Policy (scripts from this origin only, none inline) holds. The page's
scripts — the vendored uPlot and ``charts.js`` (:mod:`synapse_ha.observe.static_files`)
— draw them on time axes in the browser's zone. Without scripts the page still reads:
a summary table says what the charts show now and per queue.
"""

from __future__ import annotations

import json

from synapse_ha.observe.chart_data import WINDOWS_MS, ChartSeries
from synapse_ha.observe.page_kit import REFRESH_S, duration_html, esc, page
from synapse_ha.observe.static_files import CHARTS_SCRIPT, UPLOT_SCRIPT, UPLOT_STYLESHEET
from synapse_ha.rpc import readable

# The page reads the history as well: it refreshes this many times less often than the
# live pages.
CHARTS_REFRESH_FACTOR = 3


def json_for_script(value: object) -> str:
    """``value`` as JSON that cannot end its ``<script>`` element early or be read as
    markup: ``<``, ``>`` and ``&`` as ``\\u`` escapes (still the same JSON)."""
    text = json.dumps(value, separators=(",", ":"), sort_keys=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _window_form(window: str) -> str:
    options = "".join(
        f'<option value="{esc(name)}"{" selected" if name == window else ""}>'
        f"last {esc(name)}</option>"
        for name in WINDOWS_MS
    )
    return (
        '<form class="filters" method="get" action="/charts"><label>window '
        f'<select name="window" id="window">{options}</select></label> '
        '<button type="submit" id="show">show</button></form>'
    )


def _summary(series: ChartSeries, capacity_gpu: int | None) -> str:
    """What the charts show, as text: now, and per queue over the window."""
    now_allocated = series.allocated[-1] if series.allocated else 0.0
    now_pending = series.pending[-1] if series.pending else 0.0
    of = f" of {capacity_gpu} in the cluster" if capacity_gpu is not None else ""
    rows = []
    for queue, starts in series.started.items():
        waits = series.wait_s[queue]
        total = sum(starts)
        mean = sum(w * n for w, n in zip(waits, starts, strict=True) if w is not None) / total
        worst = max(w for w in waits if w is not None)
        rows.append(
            f'<tr data-queue="{esc(queue)}"><td>{esc(queue)}</td><td class="started">{total}</td>'
            f"<td>{duration_html(round(mean * 1000))}</td>"
            f"<td>{duration_html(round(worst * 1000))}</td></tr>"
        )
    table = (
        '<table id="wait-summary"><tr><th>queue</th><th>jobs started</th><th>mean wait</th>'
        "<th>worst bucket's mean</th></tr>" + "".join(rows) + "</table>"
        if rows
        else '<p class="muted" id="no-starts">no job started in this window</p>'
    )
    return (
        f'<p id="now">now (the last bucket): <b id="now-allocated">{now_allocated:g}</b> GPUs '
        f'allocated{of}, <b id="now-pending">{now_pending:g}</b> GPUs pending</p>' + table
    )


def render_charts(
    series: ChartSeries,
    window: str,
    capacity_gpu: int | None,
    notes: list[str],
    viewer: str = "",
    csrf: str = "",
    refresh_s: int = CHARTS_REFRESH_FACTOR * REFRESH_S,
) -> str:
    """The charts page for ``window`` (a key of :data:`WINDOWS_MS`); ``notes``: what
    the series leave out (a history cut at its limit, a section that could not be
    read)."""
    bucket = readable.clock(series.bucket_ms)
    said = "".join(f'<p class="bad note">{esc(n)}</p>' for n in notes)
    body = (
        _window_form(window)
        + said
        + '<p class="muted">Derived from the jobs the API lists (live ones and the history '
        f"of finished ones): each point is the average over a {esc(bucket)} bucket, on "
        "times in your browser's zone. Pending: GPUs the jobs waiting for a start (or a "
        "restart) ask for. The history a user may read holds only their own jobs: for a "
        "user, the jobs that finished are theirs, the live ones everybody's.</p>"
        "<h2>GPUs allocated and pending</h2>"
        '<div class="chart" id="chart-gpus"></div>'
        "<h2>Queue wait: submission to start, per queue</h2>"
        '<div class="chart" id="chart-wait"></div>'
        '<p class="muted">Each point: the mean wait of the jobs of that queue that started '
        "in the bucket.</p>"
        "<h2>In numbers</h2>"
        + _summary(series, capacity_gpu)
        + f'<script type="application/json" id="chart-data">'
        f"{json_for_script(series.document())}</script>"
    )
    return page(
        "synapse charts",
        body,
        viewer,
        csrf,
        refresh_s,
        here="/charts",
        scripts=(UPLOT_SCRIPT, CHARTS_SCRIPT),
        stylesheets=(UPLOT_STYLESHEET,),
    )
