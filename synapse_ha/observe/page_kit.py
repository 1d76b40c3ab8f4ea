"""What every dashboard page shares: the frame (title, navigation, who is signed in, the
sign-out form, the stylesheet and the script), escaping, and times as people read them.

**Times.** A time is a ``<time>`` element: its text is the time in this replica's zone
(``2026-11-28 22:39:20 CET``, from :mod:`synapse_ha.rpc.readable`), its
``datetime`` the ISO-8601 instant, and ``data-ms`` the milliseconds, from which the
page's script (:mod:`synapse_ha.observe.script`) rewrites the text in the browser's own
zone. Durations (``8m47s``) are the server's, as of the answer.

**Refresh.** A page made with ``refresh_s`` asks its script to fetch itself again that
often and swap in the new ``<main>``: the scroll position stays, and a page that cannot
be fetched (the replica went away, the session ended) stays as it was.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from synapse_ha.rpc import readable

STYLESHEET = "/static/dashboard.css"
SCRIPT = "/static/dashboard.js"
REFRESH_S = 10  # how often the live pages fetch themselves again
NAVIGATION = (
    ("/", "cluster"),
    ("/charts", "charts"),
    ("/nodes", "nodes"),
    ("/queues", "queues"),
    ("/history", "history"),
    ("/usage", "usage"),
)


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def time_html(ms: int | None, fmt: str = "datetime") -> str:
    """A time as a ``<time>`` element (see the module docstring); ``-`` for none.
    ``fmt``: ``datetime`` (date and time) or ``time`` (the time of day only)."""
    if not ms:
        return "-"
    text = readable.local_time(ms)
    if fmt == "time":
        text = text.split(" ")[1]
    return (
        f'<time datetime="{esc(readable.iso(ms))}" data-ms="{ms}" data-fmt="{esc(fmt)}">'
        f"{esc(text)}</time>"
    )


def duration_html(ms: int | None) -> str:
    """``8m47s``; ``-`` for none."""
    return esc(readable.clock(ms))


def when_html(ms: int | None, now_ms: int) -> str:
    """``<time>`` and how long ago (or from now): ``2026-11-28 22:39:20 CET (8m47s ago)``."""
    if not ms:
        return "-"
    return f"{time_html(ms)} ({esc(readable.relative(ms, now_ms))})"


def page(
    title: str,
    body: str,
    viewer: str = "",
    csrf: str = "",
    refresh_s: int = 0,
    here: str = "",
    scripts: Sequence[str] = (),
    stylesheets: Sequence[str] = (),
) -> str:
    """A whole page. ``csrf``: the viewer's session value, for the sign-out form (none
    without a session: a bearer header has nothing to sign out of); ``here``: the
    navigation entry to mark as the current page; ``scripts`` and ``stylesheets``: more
    of this origin's files the page loads (after the dashboard's own)."""
    sign_out = (
        ' · <form class="inline" method="post" action="/logout">'
        f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
        '<button type="submit" id="sign-out">sign out</button></form>'
        if csrf
        else ""
    )
    who = (
        f'<p class="muted">signed in as <b id="viewer">{esc(viewer)}</b>{sign_out}</p>'
        if viewer
        else ""
    )
    nav = ""
    if viewer:
        links = [
            f'<a href="{path}"{" class=here" if path == here else ""}>{name}</a>'
            for path, name in NAVIGATION
        ]
        nav = f'<nav id="nav">{" · ".join(links)}</nav>'
    refresh = f' data-refresh-s="{refresh_s}"' if refresh_s else ""
    sheets = "".join(f'<link rel="stylesheet" href="{esc(s)}">' for s in stylesheets)
    more = "".join(f'<script src="{esc(s)}" defer></script>' for s in scripts)
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>{esc(title)}</title>"
        f'<link rel="stylesheet" href="{STYLESHEET}">{sheets}'
        f'<script src="{SCRIPT}" defer></script>{more}</head>'
        f"<body{refresh}><h1>{esc(title)}</h1>{nav}{who}<main>{body}</main></body></html>"
    )
