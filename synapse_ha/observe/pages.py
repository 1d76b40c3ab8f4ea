"""The dashboard's pages: server-rendered HTML, pure functions of the API's messages.

* the main page (:func:`render_overview`) — cluster health (replicas, roles, terms, the
  leader), the queue (pending jobs with their reasons), the running gangs with their
  nodes, and the nodes as a rack-by-rack map of GPU occupancy (unhealthy GPUs marked,
  each node's title naming its faults);
* one job's page (:func:`render_job`) — its queue, resources, command, time limit,
  times (submitted, started, finished) and durations (wait, elapsed, time left), a
  cancel button when the viewer may manage it, its members (node, GPUs, state, newest
  checkpoint mark), its current attempt on a time axis (:mod:`~synapse_ha.observe.timeline`),
  the attempt's checkpoint mark and the step a restart resumes from, and the tail of each
  member's log;
* the sign-in form (:func:`render_login`) and the short pages that say why a request was
  refused or found nothing;
* the one stylesheet (:data:`STYLE`, served at :data:`STYLESHEET`): the pages carry no
  inline style and no inline script, so the Content-Security-Policy forbids both; the
  one script (:mod:`~synapse_ha.observe.script`) is served from this origin.

The frame every page shares, and times, are in :mod:`~synapse_ha.observe.page_kit`; the
nodes, queues and history pages in :mod:`~synapse_ha.observe.list_pages`.

Every value a page shows is HTML-escaped. Protobuf messages in, HTML out: the benchmark
times :func:`render_overview` on a synthetic cluster.
"""

from __future__ import annotations

import shlex
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from synapse_ha.core.model import JobState
from synapse_ha.observe.cohort_tree_page import render_cohort_tree
from synapse_ha.observe.page_kit import (
    REFRESH_S,
    STYLESHEET,
    duration_html,
    esc,
    page,
    when_html,
)
from synapse_ha.observe.timeline import attempt_timeline
from synapse_ha.rpc import readable, states
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.readable import cpu_text, memory_text

__all__ = ["STYLESHEET"]

RACK_LEVEL = "rack"
GpuHolders = Mapping[tuple[str, int], str]  # (node, GPU index) -> the job holding it

STYLE = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}
th{background:#f3f3f3}.leader{font-weight:bold;color:#075}
.bad{color:#b00}.muted{color:#777}
.racks{display:flex;flex-wrap:wrap;gap:10px}
.rack{border:1px solid #aaa;padding:4px;border-radius:4px}
.rack h3{margin:0 0 4px;font-size:12px}
.node{display:inline-block;margin:1px;padding:1px;border:1px solid #bbb;vertical-align:top}
.node.dead{border-color:#b00}.node.cordoned,.node.draining{border-color:#d80}
.g{display:inline-block;width:7px;height:7px;margin:0 1px 0 0}
.g.u{background:#2a7}.g.f{background:#ddd}
.g.x{background:#c22;outline:1px solid #600}.node.sick{border-color:#c22}
.node.spare{border-style:dashed;border-color:#48c}
.bar{display:block}.bar .track{fill:#eee}.bar .run{fill:#48c}
.bar .axis,.bar .tick{stroke:#888}.bar .tick-label{font-size:10px;fill:#555}
pre{background:#f7f7f7;padding:6px;max-height:20em;overflow:auto}
form.inline{display:inline}form.inline button{font:inherit;padding:0 4px}
nav{margin:0 0 .6em}nav a{margin-right:.2em}nav a.here{font-weight:bold}
.node .name{display:block;font-size:10px;text-align:center;color:#444}
.g.u.mine{background:#175}
.filters label{margin-right:.8em}
button.danger{color:#fff;background:#b00;border:1px solid #700;padding:2px 10px}
"""


_e = esc


_HOLDING = (JobState.SCHEDULED, JobState.RUNNING)


def _role(replica: pb.ReplicaStatus) -> str:
    return states.shown_replica_role(replica)


_page = page


def _age(now_ms: int, at_ms: int) -> str:
    return readable.relative(at_ms, now_ms) if at_ms else "-"


def gpu_holders(jobs: Sequence[pb.Job]) -> dict[tuple[str, int], str]:
    """Which job holds each GPU: its live attempt's members' GPUs."""
    held: dict[tuple[str, int], str] = {}
    for j in jobs:
        if states.shown_job_state(j) in _HOLDING and j.HasField("attempt"):
            for m in j.attempt.members:
                for g in m.gpus:
                    held[(m.node_id, g)] = j.job_id
    return held


def rack_of(node: pb.Node) -> str:
    labels = {label.level: label.value for label in node.topology}
    if RACK_LEVEL in labels:
        return labels[RACK_LEVEL]
    return node.topology[-1].value if node.topology else "-"


@dataclass(slots=True)
class Overview:
    """What the main page shows; a section the viewer may not read holds its error."""

    status: pb.GetClusterStatusResponse | None = None
    jobs: list[pb.Job] = field(default_factory=list)
    nodes: list[pb.Node] = field(default_factory=list)
    queues: pb.ListQueuesResponse | None = None  # for the cohort tree
    errors: dict[str, str] = field(default_factory=dict)  # section -> why it is empty


def render_health(status: pb.GetClusterStatusResponse) -> str:
    rows = []
    for r in status.replicas:
        is_leader = r.replica_id == status.leader_id
        health = "ok" if r.healthy else f'<span class="bad">{_e(r.error or "unhealthy")}</span>'
        dashboard = r.dashboard_url
        link = f'<a href="{_e(dashboard)}">dashboard</a>' if dashboard else ""
        rows.append(
            f'<tr data-replica="{_e(r.replica_id)}" data-role="{_e(_role(r))}"'
            f"{' class=leader' if is_leader else ''}>"
            f"<td>{_e(r.replica_id)}</td><td>{_e(_role(r))}</td><td>{r.term}</td>"
            f"<td>{r.commit_index}</td><td>{r.last_applied}</td><td>{health}</td>"
            f"<td>{_e(r.grpc_address)}</td><td>{link}</td></tr>"
        )
    return (
        f'<p>leader: <b id="leader">{_e(status.leader_id or "none")}</b> · '
        f"{status.nodes} nodes · {status.running_jobs} running · "
        f"{status.pending_jobs} pending · answered by {_e(status.answered_by)}</p>"
        '<table id="replicas"><tr><th>replica</th><th>role</th><th>term</th>'
        "<th>commit</th><th>applied</th><th>health</th><th>API</th><th></th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _members_nodes(job: pb.Job) -> str:
    nodes = sorted({m.node_id for m in job.attempt.members}) if job.HasField("attempt") else []
    return ", ".join(nodes)


def render_queue(jobs: Sequence[pb.Job]) -> str:
    """Pending gangs; an array's pending tasks as one row, its first task's, naming how
    many wait."""
    pending = [j for j in jobs if states.shown_job_state(j) == JobState.PENDING]
    tasks: dict[str, int] = {}
    for j in pending:
        if j.array_id:
            tasks[j.array_id] = tasks.get(j.array_id, 0) + 1
    shown: set[str] = set()
    rows = []
    for j in pending:
        name = _e(j.spec.name)
        if j.array_id:
            if j.array_id in shown:
                continue
            shown.add(j.array_id)
            name += (
                f' <span class="muted">(array {_e(j.array_id)}: {tasks[j.array_id]} tasks)</span>'
            )
        rows.append(
            f'<tr data-job="{_e(j.job_id)}"><td><a href="/jobs/{_e(j.job_id)}">{_e(j.job_id)}</a>'
            f"</td><td>{name}</td><td>{_e(j.owner or '-')}</td>"
            f"<td>{j.spec.replicas} x {j.spec.resources.gpu} GPU</td><td>{j.spec.priority}</td>"
            f'<td data-reason="{_e(j.reason_code)}">{_e(j.reason)}</td></tr>'
        )
    if not rows:
        return '<p class="muted">no pending jobs</p>'
    return (
        '<table id="queue"><tr><th>job</th><th>name</th><th>owner</th><th>gang</th>'
        "<th>priority</th><th>why it waits</th></tr>" + "".join(rows) + "</table>"
    )


def render_running(jobs: Sequence[pb.Job]) -> str:
    running = [j for j in jobs if states.shown_job_state(j) in _HOLDING]
    rows = [
        f'<tr data-job="{_e(j.job_id)}" data-nodes="{_e(_members_nodes(j))}">'
        f'<td><a href="/jobs/{_e(j.job_id)}">{_e(j.job_id)}</a></td><td>{_e(j.spec.name)}</td>'
        f"<td>{_e(states.shown_job_state(j))}</td><td>{_e(j.owner or '-')}</td>"
        f"<td>{j.spec.replicas} x {j.spec.resources.gpu} GPU</td>"
        f"<td>{_e(_members_nodes(j))}</td></tr>"
        for j in running
    ]
    if not rows:
        return '<p class="muted">no running gangs</p>'
    return (
        '<table id="running"><tr><th>job</th><th>name</th><th>state</th><th>owner</th>'
        "<th>gang</th><th>nodes</th></tr>" + "".join(rows) + "</table>"
    )


def gpu_cell(
    gpu: int, allocated: set[int], faults: Mapping[int, pb.GpuFault], holder: str = ""
) -> str:
    """One GPU: unhealthy (``g x``, whatever holds it), in use (``g u``, titled with the
    job holding it when known) or free (``g f``)."""
    fault = faults.get(gpu)
    if fault is not None:
        what = f"GPU {gpu} {fault.code}" + (f": {fault.detail}" if fault.detail else "")
        return (
            f'<i class="g x" data-gpu="{gpu}" data-fault="{_e(fault.code)}" title="{_e(what)}"></i>'
        )
    if gpu not in allocated:
        return f'<i class="g f" data-gpu="{gpu}" title="GPU {gpu} free"></i>'
    title = f"GPU {gpu}: {holder}" if holder else f"GPU {gpu} in use"
    job = f' data-job="{_e(holder)}"' if holder else ""
    return f'<i class="g u" data-gpu="{gpu}"{job} title="{_e(title)}"></i>'


def _node_cell(n: pb.Node, holders: GpuHolders) -> str:
    """A node of the map: its GPUs (each titled with the job holding it), its name, and
    a title naming its status, use, faults and failing checks."""
    allocated = set(n.allocated_gpus)
    faults = {f.gpu: f for f in n.gpu_faults}
    status = states.shown_node_status(n)
    cells = "".join(
        gpu_cell(i, allocated, faults, holders.get((n.node_id, i), ""))
        for i in range(n.capacity.gpu)
    )
    title = f"{n.node_id} {status} {len(allocated)}/{n.capacity.gpu} GPU"
    if faults:
        title += "; unhealthy: " + ", ".join(
            f"GPU {f.gpu} {f.code}" for f in sorted(faults.values(), key=lambda f: f.gpu)
        )
    if n.conditions:
        title += "; failing: " + ", ".join(f"{k.name}: {k.message}" for k in n.conditions)
    if n.spare:
        title += "; kept idle as a spare for member replacements"
    sick = " sick" if faults else ""
    sick += " spare" if n.spare else ""
    return (
        f'<span class="node {_e(status)}{sick}" data-node="{_e(n.node_id)}" '
        f'data-used="{len(allocated)}" data-unhealthy="{len(faults)}" title="{_e(title)}">'
        f'{cells}<a class="name" href="/nodes#node-{_e(n.node_id)}">{_e(n.node_id)}</a></span>'
    )


def render_node_map(nodes: Sequence[pb.Node], holders: GpuHolders | None = None) -> str:
    by_rack: dict[str, list[pb.Node]] = defaultdict(list)
    for node in nodes:
        by_rack[rack_of(node)].append(node)
    out = ['<div class="racks" id="nodes">']
    for rack in sorted(by_rack):
        members = sorted(by_rack[rack], key=lambda n: n.node_id)
        used = sum(len(n.allocated_gpus) for n in members)
        total = sum(n.capacity.gpu for n in members)
        out.append(
            f'<section class="rack" data-rack="{_e(rack)}"><h3>{_e(rack)} · {used}/{total} GPU</h3>'
        )
        out.extend(_node_cell(n, holders or {}) for n in members)
        out.append("</section>")
    out.append("</div>")
    return "".join(out)


def render_overview(
    overview: Overview, viewer: str = "", csrf: str = "", refresh_s: int = REFRESH_S
) -> str:
    """The main page: health, queue, running gangs, node map, and the cohort tree when
    the cluster has cohorts."""
    parts = ["<h2>Cluster</h2>"]
    if overview.status is not None:
        parts.append(render_health(overview.status))
    else:
        parts.append(f'<p class="bad">{_e(overview.errors.get("status", "unavailable"))}</p>')
    jobs_error = overview.errors.get("jobs")
    parts.append("<h2>Queue</h2>")
    parts.append(
        f'<p class="bad">{_e(jobs_error)}</p>' if jobs_error else render_queue(overview.jobs)
    )
    parts.append("<h2>Running gangs</h2>")
    parts.append(
        f'<p class="bad">{_e(jobs_error)}</p>' if jobs_error else render_running(overview.jobs)
    )
    parts.append("<h2>Nodes (GPU occupancy by rack)</h2>")
    nodes_error = overview.errors.get("nodes")
    parts.append(
        f'<p class="bad">{_e(nodes_error)}</p>'
        if nodes_error
        else render_node_map(overview.nodes, gpu_holders(overview.jobs))
    )
    tree = render_cohort_tree(overview.queues) if overview.queues is not None else ""
    if tree:
        parts.append("<h2>Cohort tree (GPUs)</h2>")
        parts.append(tree)
    return _page("synapse cluster", "".join(parts), viewer, csrf, refresh_s, here="/")


def _mark_text(mark: pb.Checkpoint, now_ms: int) -> str:
    """``step 1200, 3m ago`` (or ``3m ago, no step``)."""
    ago = _age(now_ms, mark.at_ms)
    return f"step {mark.step}, {ago}" if mark.HasField("step") else f"{ago}, no step"


def _checkpoint_rows(job: pb.Job, now_ms: int) -> list[str]:
    """The attempt's checkpoint mark (the oldest of its members' newest) and the step a
    restart resumes from, when there are."""
    rows = []
    if job.HasField("attempt") and job.attempt.HasField("checkpoint"):
        rows.append(
            '<tr><th>checkpoint</th><td id="checkpoint">'
            f"{_e(_mark_text(job.attempt.checkpoint, now_ms))}</td></tr>"
        )
    if job.HasField("resume_step"):
        rows.append(
            f'<tr><th>resumes from</th><td id="resume-step">step {job.resume_step}</td></tr>'
        )
    return rows


def _command_text(job: pb.Job) -> str:
    spec = job.spec
    if job.redacted:
        return "(withheld: not your job)"
    if spec.WhichOneof("command") == "argv":
        return shlex.join(spec.argv.args)
    return spec.shell_command


def _times_rows(job: pb.Job, now_ms: int) -> list[str]:
    """Submitted, started, finished (times and how long ago); the wait in the queue, the
    elapsed run time and what the time limit leaves (as ``synctl status`` counts them)."""
    attempt = job.attempt if job.HasField("attempt") else None
    waiting = states.shown_job_state(job) == JobState.PENDING
    started = 0 if waiting or attempt is None else attempt.started_at_ms or attempt.bound_at_ms
    ended = 0 if waiting or attempt is None else attempt.ended_at_ms or job.finished_at_ms
    d = readable.job_durations(
        submitted_ms=job.submitted_at_ms or None,
        started_ms=started or None,
        ended_ms=ended or job.finished_at_ms or None,
        time_limit_ms=job.spec.time_limit_ms,
        now_ms=now_ms,
    )
    limit = job.spec.time_limit_ms
    left = d["time_left_ms"]
    rows = [
        ("submitted", "submitted", when_html(job.submitted_at_ms, now_ms)),
        ("started", "started", when_html(started, now_ms)),
        ("finished", "finished", when_html(job.finished_at_ms, now_ms)),
        ("wait", "waiting" if waiting else "waited", duration_html(d["wait_ms"])),
        ("elapsed", "elapsed", duration_html(d["elapsed_ms"])),
        ("time-limit", "time limit", duration_html(limit) if limit else "none"),
    ]
    if left is not None:
        rows.append(("time-left", "time left", duration_html(left)))
    return [f'<tr><th>{label}</th><td id="{key}">{value}</td></tr>' for key, label, value in rows]


def _cancel_form(job: pb.Job, csrf: str) -> str:
    """The cancel button, for a live job the viewer may manage (the API withholds
    nothing of it: the viewer owns it or is an admin); the API judges the post again."""
    if job.redacted or states.shown_job_state(job) not in (JobState.PENDING, *_HOLDING):
        return ""
    return (
        f'<form method="post" action="/jobs/{_e(job.job_id)}/cancel" id="cancel-form">'
        f'<input type="hidden" name="csrf" value="{_e(csrf)}">'
        '<button type="submit" class="danger" id="cancel">cancel this job</button></form>'
    )


def render_job(
    job: pb.Job,
    logs: dict[int, str],
    now_ms: int,
    viewer: str = "",
    csrf: str = "",
    refresh_s: int = REFRESH_S,
) -> str:
    """One job's page: summary, times, attempt on a time axis, members, log tails
    (``logs``: rank → text, or the reason the log could not be read)."""
    spec = job.spec
    r = spec.resources
    per_member = f"{r.gpu} GPU, {cpu_text(r.cpu_milli)} CPU, {memory_text(r.memory_mib)} memory"
    parts = [
        '<table id="job" data-state="' + _e(states.shown_job_state(job)) + '">',
        f"<tr><th>id</th><td>{_e(job.job_id)}</td></tr>",
        f"<tr><th>name</th><td>{_e(spec.name)}</td></tr>",
        f"<tr><th>owner</th><td>{_e(job.owner or '-')}</td></tr>",
        f'<tr><th>queue</th><td id="queue-name">{_e(spec.queue or "default")}</td></tr>',
        f'<tr><th>state</th><td id="state">{_e(states.shown_job_state(job))}</td></tr>',
        f"<tr><th>reason</th><td>{_e(job.reason)}</td></tr>",
        f'<tr><th>gang</th><td id="gang">{spec.replicas} members x {_e(per_member)}</td></tr>',
        f'<tr><th>command</th><td><code id="command">{_e(_command_text(job))}</code></td></tr>',
        *_times_rows(job, now_ms),
        f"<tr><th>attempts</th><td>{job.attempts_made} (retries used {job.retries_used}, "
        f"requeues {job.requeues})</td></tr>",
        *_checkpoint_rows(job, now_ms),
        "</table>",
        _cancel_form(job, csrf),
    ]
    if job.HasField("attempt"):
        a = job.attempt
        parts.append(
            f"<h2>Attempt {a.number} (fencing token {a.fencing_token})</h2>"
            + attempt_timeline(a, now_ms)
            + (f"<p>outcome: {_e(a.outcome)}</p>" if a.outcome else "")
        )
        rows = [
            f'<tr data-rank="{m.rank}" data-node="{_e(m.node_id)}"><td>{m.rank}</td>'
            f"<td>{_e(m.node_id)}</td><td>{_e(','.join(str(g) for g in m.gpus) or '-')}</td>"
            f"<td>{_e(states.shown_member_state(m))}</td>"
            f"<td>{m.exit_code if m.has_exit_code else '-'}</td>"
            f"<td>{_mark_text(m.checkpoint, now_ms) if m.HasField('checkpoint') else '-'}</td></tr>"
            for m in a.members
        ]
        parts.append(
            '<table id="members"><tr><th>rank</th><th>node</th><th>GPUs</th><th>state</th>'
            "<th>exit</th><th>checkpoint</th></tr>" + "".join(rows) + "</table>"
        )
        parts.append("<h2>Logs (tail)</h2>")
        for m in a.members:
            parts.append(
                f'<h3>rank {m.rank} on {_e(m.node_id)}</h3><pre data-log-rank="{m.rank}">'
                f"{_e(logs.get(m.rank, ''))}</pre>"
            )
    else:
        parts.append('<p class="muted">not bound yet</p>')
    live = states.shown_job_state(job) in (JobState.PENDING, *_HOLDING)
    return _page(f"job {job.job_id}", "".join(parts), viewer, csrf, refresh_s if live else 0)


def render_login(message: str = "", csrf: str = "") -> str:
    """The sign-in form; ``csrf`` is the value of the :data:`LOGIN_COOKIE` set with it."""
    error = f'<p class="bad" id="login-error">{_e(message)}</p>' if message else ""
    form = (
        '<form method="post" action="/login">'
        f'<input type="hidden" name="csrf" value="{_e(csrf)}"><label>API token '
        '<input type="password" name="token" id="token" size="60" autocomplete="off">'
        '</label> <button type="submit" id="sign-in">sign in</button></form>'
        '<p class="muted">A token from <code>synctl token create</code>. It stays on this '
        "replica; your browser keeps only a session cookie, which ends when you sign out, "
        "after 30 minutes idle, or after 8 hours.</p>"
    )
    return _page("synapse: sign in", error + form)


def render_not_found(path: str) -> str:
    return _page("not found", f"<p>no page {_e(path)}</p>")


def render_job_error(job_id: str, message: str) -> str:
    """The page of a job that could not be read: ``message`` says why."""
    return _page(f"job {job_id}", f'<p class="bad">{_e(message)}</p>')


def render_refused(message: str) -> str:
    """The page of a refused form post: ``message`` says why."""
    return _page("synapse: refused", f'<p class="bad" id="refused">{_e(message)}</p>')
