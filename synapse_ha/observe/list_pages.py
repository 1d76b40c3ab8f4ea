"""The dashboard's list pages, pure functions of the API's messages:

* ``/nodes`` (:func:`render_nodes`) — each node: status and why (and whether it is kept
  as a hot spare), labels (topology), each GPU with the job holding it, unhealthy GPUs,
  failing checks (conditions), CPU and memory in use, the last heartbeat;
* ``/queues`` (:func:`render_queues`) — each queue in the order the scheduler considers
  them (the API's fair-share position): its fair share (decayed past usage and what it
  holds, against its nominal quota) and its cohorts' shares, cohort, nominal quota, used,
  borrowed, lent, running and pending jobs and the GPUs the pending ones need; the
  cohort tree below;
* ``/history`` (:func:`render_history`) — finished jobs, newest first, with filters
  (user, queue, node, finished since) as a GET form;
* ``/usage`` (:func:`render_usage`) — GPU-hours per user or queue over a period (a GET
  form), most first, and per UTC day: the API's ``GetUsage``, as ``synctl usage``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from synapse_ha.core.queues.fairshare import SHARE_SCALE
from synapse_ha.observe.cohort_tree_page import render_cohort_tree
from synapse_ha.observe.page_kit import REFRESH_S, duration_html, esc, page, time_html
from synapse_ha.observe.pages import gpu_cell, rack_of
from synapse_ha.rpc import readable, states
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.readable import cpu_text, memory_text


def _error(message: str) -> str:
    return f'<p class="bad">{esc(message)}</p>'


# ------------------------------------------------------------------------- nodes


def _labels(n: pb.Node) -> str:
    return " ".join(f"{t.level}={t.value}" for t in n.topology) or "-"


def _gpus(n: pb.Node, holders: Mapping[tuple[str, int], str]) -> str:
    """Each GPU as a cell, then the jobs holding them by name."""
    allocated = set(n.allocated_gpus)
    faults = {f.gpu: f for f in n.gpu_faults}
    cells = "".join(
        gpu_cell(i, allocated, faults, holders.get((n.node_id, i), ""))
        for i in range(n.capacity.gpu)
    )
    by_job: dict[str, list[int]] = {}
    for i in range(n.capacity.gpu):
        holder = holders.get((n.node_id, i))
        if holder:
            by_job.setdefault(holder, []).append(i)
    held = "; ".join(
        f'<a href="/jobs/{esc(j)}" data-holds="{",".join(map(str, g))}">{esc(j)}</a> '
        f"GPU {','.join(map(str, g))}"
        for j, g in sorted(by_job.items())
    )
    return f"{cells} {len(allocated)}/{n.capacity.gpu}" + (f"<br>{held}" if held else "")


def _health(n: pb.Node, now_ms: int) -> str:
    parts = [f"GPU {f.gpu} {f.code}" + (f": {f.detail}" if f.detail else "") for f in n.gpu_faults]
    parts += [f"{k.name}: {k.message}" for k in n.conditions]
    unfit = [u for u in n.unfit if u.until_ms > now_ms]
    parts += [f"not for {u.owner} until {readable.local_time(u.until_ms)}" for u in unfit]
    return '<span class="bad">' + esc("; ".join(parts)) + "</span>" if parts else "ok"


_SPARE = '<span class="muted" title="kept idle for member replacements">spare</span>'


def render_nodes(
    nodes: Sequence[pb.Node],
    holders: Mapping[tuple[str, int], str],
    now_ms: int,
    viewer: str = "",
    csrf: str = "",
    error: str = "",
    refresh_s: int = REFRESH_S,
) -> str:
    """Every node, by rack then name."""
    rows = []
    for n in sorted(nodes, key=lambda n: (rack_of(n), n.node_id)):
        status = states.shown_node_status(n)
        reason = f" ({n.status_reason})" if n.status_reason else ""
        heartbeat = (
            f"{duration_html(n.last_heartbeat_age_ms)} ago" if n.last_heartbeat_age_ms else "-"
        )
        spare = f" {_SPARE}" if n.spare else ""
        rows.append(
            f'<tr id="node-{esc(n.node_id)}" data-node="{esc(n.node_id)}" '
            f'data-status="{esc(status)}" data-spare="{int(n.spare)}"><td>{esc(n.node_id)}</td>'
            f"<td>{esc(status + reason)}{spare}</td><td>{esc(_labels(n))}</td>"
            f'<td class="gpus">{_gpus(n, holders)}</td>'
            f'<td class="health">{_health(n, now_ms)}</td>'
            f"<td>{cpu_text(n.allocated.cpu_milli)}/{cpu_text(n.capacity.cpu_milli)}</td>"
            f"<td>{memory_text(n.allocated.memory_mib)}/{memory_text(n.capacity.memory_mib)}</td>"
            f"<td>{heartbeat}</td><td>{esc(n.gpu_model or '-')}</td></tr>"
        )
    body = _error(error) if error else ""
    if rows:
        body += (
            '<table id="node-table"><tr><th>node</th><th>status</th><th>labels</th>'
            "<th>GPUs (holder)</th><th>health and conditions</th><th>CPU</th><th>memory</th>"
            "<th>heartbeat</th><th>GPU model</th></tr>" + "".join(rows) + "</table>"
        )
    elif not error:
        body += '<p class="muted">no nodes</p>'
    return page("synapse nodes", body, viewer, csrf, refresh_s, here="/nodes")


# ------------------------------------------------------------------------ queues


def _percent(ppm: int) -> str:
    return f"{ppm / SHARE_SCALE:.0%}"


def _cohorts_above(q: pb.QueueStatus, parents: Mapping[str, str]) -> str:
    """The shares of the cohorts above a queue, each named: from just below the root
    down to the queue's own cohort (the order the API gives them in)."""
    path: list[str] = []
    cohort = q.queue.cohort
    while cohort and cohort not in path and len(path) <= len(parents):
        path.append(cohort)
        cohort = parents.get(cohort, "")
    names = list(reversed(path[:-1]))
    shares = list(q.cohort_shares_ppm)
    if len(names) != len(shares):
        names = [""] * len(shares)
    return ", ".join(f"{n} {_percent(s)}".strip() for n, s in zip(names, shares, strict=True))


def render_queues(
    answer: pb.ListQueuesResponse | None,
    viewer: str = "",
    csrf: str = "",
    error: str = "",
    refresh_s: int = REFRESH_S,
) -> str:
    """Every queue in the fair-share order (first considered first); the cohort tree."""
    if answer is None:
        return page("synapse queues", _error(error or "unavailable"), viewer, csrf, here="/queues")
    ordered = sorted(answer.queues, key=lambda q: (q.fair_share_position, q.queue.name))
    parents = {c.cohort.name: c.cohort.parent for c in answer.cohorts}
    rows = []
    for q in ordered:
        u = q.usage
        quota = q.queue.HasField("gpu")
        nominal = str(q.queue.gpu) if quota else "none"
        share = _percent(q.fair_share_ppm) if quota else "-"
        above = _cohorts_above(q, parents) or "-"
        rows.append(
            f'<tr data-queue="{esc(q.queue.name)}" data-position="{q.fair_share_position}">'
            f'<td class="position">{q.fair_share_position}</td>'
            f"<td>{esc(q.queue.name)}</td>"
            f'<td class="share" data-ppm="{q.fair_share_ppm}">{share}</td>'
            f'<td class="cohort-shares">{esc(above)}</td><td>{esc(q.queue.cohort or "-")}</td>'
            f'<td class="nominal">{nominal}</td><td class="used">{u.used_gpu}</td>'
            f'<td class="borrowed">{u.borrowed_gpu}</td><td>{u.lent_gpu}</td>'
            f"<td>{u.running_jobs}</td>"
            f'<td class="pending">{u.pending_jobs} ({u.pending_gpu} GPU)</td></tr>'
        )
    half_life = readable.clock(answer.fair_share_half_life_ms)
    table = (
        '<table id="queue-table"><tr><th>order</th><th>queue</th><th>fair share</th>'
        "<th>cohorts' shares</th><th>cohort</th><th>nominal GPU</th><th>used</th>"
        "<th>borrowed</th><th>lent</th><th>running</th><th>pending</th></tr>"
        + "".join(rows)
        + "</table>"
        '<p class="muted" id="fair-share-note">In the order the scheduler considers the '
        "queues now, lowest share first. A queue's fair share is its past usage (decayed "
        f"by half every {esc(half_life)}) plus what it holds now, against its nominal "
        "quota (100%: exactly what it is entitled to; by its dominant resource). In a "
        "cohort tree the shares of the cohorts above it are compared first, outermost "
        "first; equal shares go by the first waiting gang's priority, then submission "
        "order.</p>"
    )
    tree = render_cohort_tree(answer)
    if tree:
        table += "<h2>Cohort tree (GPUs)</h2>" + tree
    classes = ", ".join(f"{c.name} ({c.value})" for c in answer.priority_classes)
    table += (
        f'<p class="muted">preemption: {esc(answer.preemption or "-")} · '
        f"priority classes: {esc(classes or 'none')}</p>"
    )
    return page("synapse queues", table, viewer, csrf, refresh_s, here="/queues")


# ----------------------------------------------------------------------- history


@dataclass(frozen=True, slots=True)
class HistoryFilters:
    """The ``/history`` form: each empty means any."""

    user: str = ""
    queue: str = ""
    node: str = ""
    since: str = ""  # a duration back from now (7d, 12h) or a UTC date

    @classmethod
    def of(cls, query: Mapping[str, str]) -> HistoryFilters:
        def value(name: str) -> str:
            return query.get(name, "").strip()[:200]

        return cls(value("user"), value("queue"), value("node"), value("since"))


def _filters_form(f: HistoryFilters) -> str:
    fields = "".join(
        f'<label>{label} <input name="{name}" id="filter-{name}" value="{esc(value)}" '
        f'size="12"></label>'
        for name, label, value in (
            ("user", "user", f.user),
            ("queue", "queue", f.queue),
            ("node", "node", f.node),
            ("since", "finished since (7d, 2026-11-01)", f.since),
        )
    )
    return (
        f'<form class="filters" method="get" action="/history">{fields}'
        '<button type="submit" id="filter">filter</button></form>'
    )


def render_history(
    jobs: Sequence[pb.HistoryJob],
    filters: HistoryFilters,
    now_ms: int,
    viewer: str = "",
    csrf: str = "",
    error: str = "",
) -> str:
    """Finished jobs, newest first, under the filter form."""
    rows = []
    for j in jobs:
        started = j.started_at_ms or None
        wait = max(0, started - j.submitted_at_ms) if started and j.submitted_at_ms else None
        ran = max(0, j.finished_at_ms - started) if started and j.finished_at_ms else None
        rows.append(
            f'<tr data-job="{esc(j.job_id)}"><td>{esc(j.job_id)}</td><td>{esc(j.name)}</td>'
            f"<td>{esc(j.owner)}</td><td>{esc(j.queue)}</td>"
            f"<td>{esc(states.shown_job_state(j))}</td><td>{j.attempts}</td>"
            f"<td>{time_html(j.submitted_at_ms)}</td><td>{duration_html(wait)}</td>"
            f"<td>{duration_html(ran)}</td><td>{time_html(j.finished_at_ms)}</td>"
            f"<td>{j.gpu_ms / 3_600_000:.2f}</td><td>{esc(', '.join(j.nodes[:8]))}</td>"
            f"<td>{esc(j.reason)}</td></tr>"
        )
    body = _filters_form(filters) + (_error(error) if error else "")
    if rows:
        body += (
            '<table id="history"><tr><th>job</th><th>name</th><th>user</th><th>queue</th>'
            "<th>state</th><th>attempts</th><th>submitted</th><th>wait</th><th>ran</th>"
            "<th>ended</th><th>GPU-hours</th><th>nodes</th><th>how it ended</th></tr>"
            + "".join(rows)
            + "</table>"
        )
    elif not error:
        body += '<p class="muted" id="no-history">no finished jobs match</p>'
    return page("synapse history", body, viewer, csrf, here="/history")


# ------------------------------------------------------------------------- usage

USAGE_BY = ("user", "queue", "account")


@dataclass(frozen=True, slots=True)
class UsageFilters:
    """The ``/usage`` form: sum per ``by`` (user or queue) from ``since`` (a duration
    back from now, or a UTC date) to ``until`` (empty: now)."""

    by: str = "user"
    since: str = "7d"
    until: str = ""

    @classmethod
    def of(cls, query: Mapping[str, str]) -> UsageFilters:
        def value(name: str, default: str) -> str:
            return query.get(name, "").strip()[:200] or default

        return cls(value("by", "user"), value("since", "7d"), value("until", ""))


def _usage_form(f: UsageFilters) -> str:
    by = "".join(
        f'<option value="{b}"{" selected" if b == f.by else ""}>{b}</option>' for b in USAGE_BY
    )
    return (
        '<form class="filters" method="get" action="/usage">'
        f'<label>per <select name="by" id="usage-by">{by}</select></label>'
        f'<label>since (7d, 2026-11-01) <input name="since" id="usage-since" '
        f'value="{esc(f.since)}" size="12"></label>'
        f'<label>until (empty: now) <input name="until" id="usage-until" '
        f'value="{esc(f.until)}" size="12"></label>'
        '<button type="submit" id="usage-show">show</button></form>'
    )


def render_usage(
    answer: pb.GetUsageResponse | None,
    filters: UsageFilters,
    viewer: str = "",
    csrf: str = "",
    error: str = "",
) -> str:
    """GPU-hours per user (or queue) over the period, most first, then per UTC day (as
    ``synctl usage``): from the attempts that ended, each counted from its bind to its
    end; a user sees only their own."""
    body = _usage_form(filters) + (_error(error) if error else "")
    if answer is None:
        return page("synapse usage", body, viewer, csrf, here="/usage")
    totals: dict[str, list[int]] = {}
    for r in answer.rows:
        cell = totals.setdefault(r.key, [0, 0])
        cell[0] += r.gpu_ms
        cell[1] += r.attempts
    grand = sum(t[0] for t in totals.values())
    until = answer.until_ms
    body += (
        f'<p id="usage-period">from {time_html(answer.since_ms)} to '
        f"{time_html(until) if until else 'now'} · per {esc(answer.by)} · "
        f'total <b id="usage-total">{grand / 3_600_000:.2f}</b> GPU-hours</p>'
    )
    if not totals:
        body += '<p class="muted" id="no-usage">no GPU usage in that period</p>'
        return page("synapse usage", body, viewer, csrf, here="/usage")
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1][0], kv[0]))
    rows = "".join(
        f'<tr data-key="{esc(key)}"><td>{esc(key)}</td>'
        f'<td class="gpu-hours">{gpu_ms / 3_600_000:.2f}</td>'
        f'<td><meter min="0" max="1" value="{gpu_ms / grand if grand else 0:.4f}"></meter> '
        f"{gpu_ms / grand if grand else 0:.0%}</td><td>{attempts}</td></tr>"
        for key, (gpu_ms, attempts) in ranked
    )
    days = "".join(
        f'<tr data-day="{esc(r.day)}" data-key="{esc(r.key)}"><td>{esc(r.day)}</td>'
        f"<td>{esc(r.key)}</td><td>{r.gpu_ms / 3_600_000:.2f}</td><td>{r.attempts}</td></tr>"
        for r in answer.rows
    )
    body += (
        f'<table id="usage-totals"><tr><th>{esc(answer.by)}</th><th>GPU-hours</th>'
        f"<th>of the total</th><th>attempts</th></tr>{rows}</table>"
        "<h2>Per day (UTC)</h2>"
        f'<table id="usage-days"><tr><th>day</th><th>{esc(answer.by)}</th><th>GPU-hours</th>'
        f"<th>attempts</th></tr>{days}</table>"
        '<p class="muted">From the attempts that ended, each counted from its bind to its '
        "end (its GPUs were nobody else's); one that spans midnight is split between the "
        "days. A user sees only their own usage.</p>"
    )
    return page("synapse usage", body, viewer, csrf, here="/usage")
