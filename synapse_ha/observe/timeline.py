"""An attempt on a time axis: an SVG bar from its bind to its end (or now), the part
before its members ran in grey, the run in blue, under an axis with ticks at round wall
clock times (every 1 s ... 1 d, about five of them) labelled with the time of day.

SVG attributes only, no inline style (the Content-Security-Policy allows none). Labels
carry ``data-ms`` so the page's script shows them in the browser's zone.
"""

from __future__ import annotations

from synapse_ha.observe.page_kit import esc, time_html
from synapse_ha.rpc import readable
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb

WIDTH = 600
BAR_Y, BAR_H, AXIS_Y = 4, 12, 20
_STEPS_MS = (
    *(s * 1000 for s in (1, 2, 5, 10, 15, 30)),
    *(m * 60_000 for m in (1, 2, 5, 10, 15, 30)),
    *(h * 3_600_000 for h in (1, 2, 3, 6, 12)),
    86_400_000,
)


def tick_step(span_ms: int, ticks: int = 5) -> int:
    """The smallest round step that puts at most ``ticks`` ticks on ``span_ms``."""
    for step in _STEPS_MS:
        if span_ms / step <= ticks:
            return step
    return _STEPS_MS[-1] * max(1, -(-span_ms // (_STEPS_MS[-1] * ticks)))


def ticks(start_ms: int, end_ms: int) -> list[int]:
    """Round times within ``[start_ms, end_ms]``, every :func:`tick_step`."""
    step = tick_step(max(1, end_ms - start_ms))
    first = -(-start_ms // step) * step
    return list(range(first, end_ms + 1, step))


def _x(ms: int, start: int, span: int) -> float:
    return WIDTH * min(1.0, max(0.0, (ms - start) / span))


def attempt_timeline(attempt: pb.Attempt, now_ms: int) -> str:
    """The bar, its axis, and a line naming bind, start and end as times."""
    start = attempt.bound_at_ms or now_ms
    end = attempt.ended_at_ms or now_ms
    span = max(1, end - start)
    run_from = attempt.started_at_ms or end
    run_x = _x(run_from, start, span)
    step = tick_step(span)
    fmt = "time" if step < 60_000 else "hm"
    marks = []
    for at in ticks(start, end):
        x = _x(at, start, span)
        label = readable.local_time(at).split(" ")[1]
        if fmt == "hm":
            label = label[:5]
        marks.append(
            f'<line class="tick" x1="{x:.1f}" y1="{AXIS_Y - 3}" x2="{x:.1f}" y2="{AXIS_Y + 2}">'
            f'</line><text class="tick-label" x="{x:.1f}" y="{AXIS_Y + 14}" '
            f'text-anchor="middle" data-ms="{at}" data-fmt="{fmt}">{esc(label)}</text>'
        )
    svg = (
        f'<svg class="bar" id="timeline" width="{WIDTH + 40}" height="{AXIS_Y + 20}" '
        f'viewBox="-20 0 {WIDTH + 40} {AXIS_Y + 20}" role="img" '
        'aria-label="the attempt from its bind to its end, on a time axis">'
        f'<rect class="track" x="0" y="{BAR_Y}" width="{WIDTH}" height="{BAR_H}"></rect>'
        f'<rect class="run" x="{run_x:.1f}" y="{BAR_Y}" width="{WIDTH - run_x:.1f}" '
        f'height="{BAR_H}"></rect>'
        f'<line class="axis" x1="0" y1="{AXIS_Y}" x2="{WIDTH}" y2="{AXIS_Y}"></line>'
        + "".join(marks)
        + "</svg>"
    )
    ended = time_html(attempt.ended_at_ms) if attempt.ended_at_ms else "still running"
    legend = (
        f'<p class="muted" id="timeline-legend">bound {time_html(attempt.bound_at_ms)} · '
        f"members running {time_html(attempt.started_at_ms)} · ended {ended} · "
        f"axis every {esc(readable.clock(step))}</p>"
    )
    return svg + legend
