"""The web dashboard every replica serves: server-rendered HTML, read-only.

Pages:

* ``/`` — cluster health (replicas, roles, terms, the leader), the queue (pending jobs
  with their reasons), the running gangs with their nodes, and the nodes as a
  rack-by-rack map of GPU occupancy;
* ``/jobs/<id>`` — one job: its members (node, GPUs, state), its current attempt on a
  timeline, and the tail of each member's log;
* ``/login`` and ``/logout``.

**Same data, same rules as the API.** The dashboard is a client of the cluster's own
gRPC API (:class:`~synapse_ha.rpc.client.ClusterClient`), so it follows the leader for
fresh data exactly as ``synctl`` does and survives a leader change. Each request is made
with the *viewer's* bearer token (over this replica's TLS transport), so the replica that
answers judges the viewer, not the dashboard: a ``user`` sees what the API lets a user
see (other owners' jobs redacted, another user's logs refused). The token comes from the
``Authorization: Bearer`` header or from the cookie the login form sets (``HttpOnly``,
``Secure``, ``SameSite=Strict``); a request without one is sent to the login form. An
``--insecure`` replica has no tokens: every viewer is the anonymous admin, as on its API.

Member logs are read as ``synctl logs`` reads them: a grant from ``GrantLogAccess``, then
the tail of the log from the member's worker (``ReadLog`` with a negative offset).

The render functions (:func:`render_overview`, :func:`render_job`) are pure: protobuf
messages in, HTML out; the benchmark times them on a synthetic cluster.
"""

from __future__ import annotations

import html
import threading
import time
import urllib.parse
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.cookies import SimpleCookie

import grpc

from synapse_ha.observe.http import Request, Response
from synapse_ha.rpc.client import ClusterClient, ClusterUnavailable
from synapse_ha.rpc.errors import Reason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2 as wpb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2_grpc as wpb_grpc
from synapse_ha.security.grants import GRANT_METADATA_KEY
from synapse_ha.security.tls import Transport

COOKIE = "synapse_token"
LOG_TAIL_BYTES = 4096
LIVE_STATES = ("PENDING", "SCHEDULED", "RUNNING")
MAX_CLIENTS = 32  # one API client per viewer token, least recently used dropped
RACK_LEVEL = "rack"

_STYLE = """
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
.bar{position:relative;height:10px;background:#eee;width:400px}
.bar span{position:absolute;height:10px;background:#48c}
pre{background:#f7f7f7;padding:6px;max-height:20em;overflow:auto}
"""


# ------------------------------------------------------------------- rendering


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _page(title: str, body: str, viewer: str = "") -> str:
    who = (
        f'<p class="muted">signed in as {_e(viewer)} · <a href="/logout">sign out</a></p>'
        if viewer
        else ""
    )
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>{_e(title)}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{_e(title)}</h1>{who}{body}</body></html>"
    )


def _age(now_ms: int, at_ms: int) -> str:
    if not at_ms:
        return "-"
    seconds = max(0, now_ms - at_ms) // 1000
    if seconds < 120:
        return f"{seconds}s ago"
    if seconds < 7200:
        return f"{seconds // 60}m ago"
    return f"{seconds // 3600}h ago"


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
    errors: dict[str, str] = field(default_factory=dict)  # section -> why it is empty


def render_health(status: pb.GetClusterStatusResponse) -> str:
    rows = []
    for r in status.replicas:
        is_leader = r.replica_id == status.leader_id
        health = "ok" if r.healthy else f'<span class="bad">{_e(r.error or "unhealthy")}</span>'
        dashboard = r.dashboard_url
        link = f'<a href="{_e(dashboard)}">dashboard</a>' if dashboard else ""
        rows.append(
            f'<tr data-replica="{_e(r.replica_id)}" data-role="{_e(r.role)}"'
            f"{' class=leader' if is_leader else ''}>"
            f"<td>{_e(r.replica_id)}</td><td>{_e(r.role)}</td><td>{r.term}</td>"
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
    pending = [j for j in jobs if j.state == "PENDING"]
    rows = [
        f'<tr data-job="{_e(j.job_id)}"><td><a href="/jobs/{_e(j.job_id)}">{_e(j.job_id)}</a>'
        f"</td><td>{_e(j.spec.name)}</td><td>{_e(j.owner or '-')}</td>"
        f"<td>{j.spec.replicas} x {j.spec.resources.gpu} GPU</td><td>{j.spec.priority}</td>"
        f'<td data-reason="{_e(j.reason_code)}">{_e(j.reason)}</td></tr>'
        for j in pending
    ]
    if not rows:
        return '<p class="muted">no pending jobs</p>'
    return (
        '<table id="queue"><tr><th>job</th><th>name</th><th>owner</th><th>gang</th>'
        "<th>priority</th><th>why it waits</th></tr>" + "".join(rows) + "</table>"
    )


def render_running(jobs: Sequence[pb.Job]) -> str:
    running = [j for j in jobs if j.state in ("SCHEDULED", "RUNNING")]
    rows = [
        f'<tr data-job="{_e(j.job_id)}" data-nodes="{_e(_members_nodes(j))}">'
        f'<td><a href="/jobs/{_e(j.job_id)}">{_e(j.job_id)}</a></td><td>{_e(j.spec.name)}</td>'
        f"<td>{_e(j.state)}</td><td>{_e(j.owner or '-')}</td>"
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


def render_node_map(nodes: Sequence[pb.Node]) -> str:
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
        for n in members:
            allocated = set(n.allocated_gpus)
            cells = "".join(
                '<i class="g u"></i>' if i in allocated else '<i class="g f"></i>'
                for i in range(n.capacity.gpu)
            )
            out.append(
                f'<span class="node {_e(n.status)}" data-node="{_e(n.node_id)}" '
                f'data-used="{len(allocated)}" title="{_e(n.node_id)} {_e(n.status)} '
                f'{len(allocated)}/{n.capacity.gpu} GPU">{cells or _e(n.node_id)}</span>'
            )
        out.append("</section>")
    out.append("</div>")
    return "".join(out)


def render_overview(overview: Overview, viewer: str = "") -> str:
    """The main page: health, queue, running gangs, node map."""
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
        f'<p class="bad">{_e(nodes_error)}</p>' if nodes_error else render_node_map(overview.nodes)
    )
    return _page("synapse cluster", "".join(parts), viewer)


def _timeline(attempt: pb.Attempt, now_ms: int) -> str:
    start = attempt.bound_at_ms
    end = attempt.ended_at_ms or now_ms
    span = max(1, end - start)

    def pos(at_ms: int) -> float:
        return 100.0 * (at_ms - start) / span

    run_from = attempt.started_at_ms or end
    return (
        f'<div class="bar" title="bound → started → ended">'
        f'<span style="left:{pos(run_from):.1f}%;width:{100 - pos(run_from):.1f}%"></span>'
        f"</div><small>bound {attempt.bound_at_ms} · started {attempt.started_at_ms or '-'} · "
        f"ended {attempt.ended_at_ms or '-'} (ms since the epoch)</small>"
    )


def render_job(job: pb.Job, logs: dict[int, str], now_ms: int, viewer: str = "") -> str:
    """One job's page: summary, attempt timeline, members, log tails (``logs``: rank →
    text, or the reason the log could not be read)."""
    parts = [
        '<p><a href="/">← cluster</a></p>',
        f'<table id="job" data-state="{_e(job.state)}">',
        f"<tr><th>id</th><td>{_e(job.job_id)}</td></tr>",
        f"<tr><th>name</th><td>{_e(job.spec.name)}</td></tr>",
        f"<tr><th>owner</th><td>{_e(job.owner or '-')}</td></tr>",
        f'<tr><th>state</th><td id="state">{_e(job.state)}</td></tr>',
        f"<tr><th>reason</th><td>{_e(job.reason)}</td></tr>",
        f"<tr><th>gang</th><td>{job.spec.replicas} x {job.spec.resources.gpu} GPU</td></tr>",
        f"<tr><th>submitted</th><td>{_age(now_ms, job.submitted_at_ms)}</td></tr>",
        f"<tr><th>attempts</th><td>{job.attempts_made} (retries used {job.retries_used}, "
        f"requeues {job.requeues})</td></tr>",
        "</table>",
    ]
    if job.HasField("attempt"):
        a = job.attempt
        parts.append(
            f"<h2>Attempt {a.number} (fencing token {a.fencing_token})</h2>"
            + _timeline(a, now_ms)
            + (f"<p>outcome: {_e(a.outcome)}</p>" if a.outcome else "")
        )
        rows = [
            f'<tr data-rank="{m.rank}" data-node="{_e(m.node_id)}"><td>{m.rank}</td>'
            f"<td>{_e(m.node_id)}</td><td>{_e(','.join(str(g) for g in m.gpus) or '-')}</td>"
            f"<td>{_e(m.state)}</td><td>{m.exit_code if m.has_exit_code else '-'}</td></tr>"
            for m in a.members
        ]
        parts.append(
            '<table id="members"><tr><th>rank</th><th>node</th><th>GPUs</th><th>state</th>'
            "<th>exit</th></tr>" + "".join(rows) + "</table>"
        )
        parts.append("<h2>Logs (tail)</h2>")
        for m in a.members:
            parts.append(
                f'<h3>rank {m.rank} on {_e(m.node_id)}</h3><pre data-log-rank="{m.rank}">'
                f"{_e(logs.get(m.rank, ''))}</pre>"
            )
    else:
        parts.append('<p class="muted">not bound yet</p>')
    return _page(f"job {job.job_id}", "".join(parts), viewer)


def render_login(message: str = "") -> str:
    error = f'<p class="bad" id="login-error">{_e(message)}</p>' if message else ""
    form = (
        '<form method="post" action="/login"><label>API token '
        '<input type="password" name="token" id="token" size="60" autocomplete="off">'
        '</label> <button type="submit" id="sign-in">sign in</button></form>'
        '<p class="muted">A token from <code>synctl token create</code>; it is kept in a '
        "cookie for this site only.</p>"
    )
    return _page("synapse: sign in", error + form)


# ----------------------------------------------------------------------- serving


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.RpcError):
        return failure_of(exc).describe()
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _refused(exc: BaseException) -> bool:
    return isinstance(exc, grpc.RpcError) and failure_of(exc).reason is Reason.UNAUTHENTICATED


class Dashboard:
    """The dashboard app for :class:`~synapse_ha.observe.http.ObserveServer`.

    ``addresses``: the replicas' gRPC addresses (this replica's first); ``transport``:
    this replica's TLS transport (the channel presents its certificate; the viewer's
    token names the viewer)."""

    def __init__(
        self,
        addresses: Sequence[str],
        transport: Transport,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        timeout_s: float = 5.0,
    ) -> None:
        self._addresses = list(addresses)
        self._transport = transport
        self._clock_ms = clock_ms
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._clients: OrderedDict[str, ClusterClient] = OrderedDict()

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), OrderedDict()
        for client in clients:
            client.close()

    def _client(self, token: str) -> ClusterClient:
        with self._lock:
            client = self._clients.get(token)
            if client is not None:
                self._clients.move_to_end(token)
                return client
            client = ClusterClient(
                self._addresses,
                timeout_s=self._timeout_s,
                per_try_timeout_s=min(2.0, self._timeout_s),
                token=token or None,
                channel_factory=self._transport.channel,
                credentials_version=self._transport.version,
            )
            self._clients[token] = client
            dropped = []
            while len(self._clients) > MAX_CLIENTS:
                dropped.append(self._clients.popitem(last=False)[1])
        for old in dropped:
            old.close()
        return client

    # -- routing

    def __call__(self, request: Request) -> Response:
        path = urllib.parse.urlsplit(request.path).path
        if path == "/login":
            return self._login(request)
        if path == "/logout":
            return _redirect("/login", clear_cookie=True)
        if request.method not in ("GET", "HEAD"):
            return Response(405, b"read-only\n", "text/plain; charset=utf-8")
        token = self._token(request)
        if token is None:
            return _redirect("/login")
        viewer = "token " + token.split("_")[1] if token.count("_") >= 2 else "anonymous"
        if path == "/":
            overview = self.overview(token)
            if _refused_overview(overview):
                return _html(401, render_login(overview.errors.get("status", "")))
            return _html(200, render_overview(overview, viewer))
        if path.startswith("/jobs/"):
            return self._job_page(token, urllib.parse.unquote(path[len("/jobs/") :]), viewer)
        return _html(404, _page("not found", f"<p>no page {_e(path)}</p>"))

    def _token(self, request: Request) -> str | None:
        if not self._transport.secure:
            return ""  # an insecure cluster has no tokens: everyone is the admin
        header = request.headers.get("authorization", "")
        if header.startswith("Bearer "):
            return header[len("Bearer ") :].strip() or None
        cookie = SimpleCookie()
        try:
            cookie.load(request.headers.get("cookie", ""))
        except Exception:
            return None
        morsel = cookie.get(COOKIE)
        return morsel.value if morsel is not None and morsel.value else None

    def _login(self, request: Request) -> Response:
        if request.method != "POST":
            return _html(200, render_login())
        form = urllib.parse.parse_qs(request.body.decode("utf-8", errors="replace"))
        token = (form.get("token") or [""])[0].strip()
        if not token:
            return _html(400, render_login("enter a token"))
        try:
            self._client(token).cluster_status()
        except (grpc.RpcError, ClusterUnavailable) as exc:
            return _html(401, render_login(_describe(exc)))
        cookie = f"{COOKIE}={token}; Path=/; HttpOnly; Secure; SameSite=Strict"
        return Response(303, b"", headers=(("Location", "/"), ("Set-Cookie", cookie)))

    # -- data

    def overview(self, token: str) -> Overview:
        """Everything the main page shows, through the API as the viewer."""
        client = self._client(token)
        overview = Overview()
        try:
            overview.status = client.cluster_status()
        except (grpc.RpcError, ClusterUnavailable) as exc:
            overview.errors["status"] = _describe(exc)
            if _refused(exc):
                overview.errors["refused"] = "1"
                return overview
        try:
            overview.jobs = client.list_jobs(states=list(LIVE_STATES))
        except (grpc.RpcError, ClusterUnavailable) as exc:
            overview.errors["jobs"] = _describe(exc)
        try:
            overview.nodes = client.list_nodes()
        except (grpc.RpcError, ClusterUnavailable) as exc:
            overview.errors["nodes"] = _describe(exc)
        return overview

    def _job_page(self, token: str, job_id: str, viewer: str) -> Response:
        client = self._client(token)
        try:
            job = client.get_job(job_id)
        except (grpc.RpcError, ClusterUnavailable) as exc:
            status = (
                404
                if isinstance(exc, grpc.RpcError) and (exc.code() is grpc.StatusCode.NOT_FOUND)
                else 502
            )
            return _html(status, _page(f"job {job_id}", f'<p class="bad">{_e(_describe(exc))}</p>'))
        logs = self.log_tails(client, job) if job.HasField("attempt") else {}
        return _html(200, render_job(job, logs, self._clock_ms(), viewer))

    def log_tails(self, client: ClusterClient, job: pb.Job) -> dict[int, str]:
        """The end of each member's log of the job's current attempt, or why not."""
        tails: dict[int, str] = {}
        for m in job.attempt.members:
            try:
                tails[m.rank] = self._tail(client, job, m)
            except (grpc.RpcError, ClusterUnavailable, LookupError) as exc:
                tails[m.rank] = f"(no log: {_describe(exc)})"
        return tails

    def _tail(self, client: ClusterClient, job: pb.Job, member: pb.Member) -> str:
        request = pb.GrantLogAccessRequest(
            job_id=job.job_id, attempt=job.attempt.number, rank=member.rank
        )
        grant: str | None = None
        address = ""
        try:
            answer = client.call(
                "GrantLogAccess",
                lambda a, t: client.scheduler(a).GrantLogAccess(request, timeout=t),
            )
            grant, address = answer.grant, answer.node_address
        except grpc.RpcError as exc:
            if failure_of(exc).reason is not Reason.NEEDS_TLS:
                raise
        if not address:
            nodes = {n.node_id: n.address for n in client.list_nodes()}
            address = nodes.get(member.node_id, "")
        if not address:
            raise LookupError(f"node {member.node_id} is not known")
        read = wpb.ReadLogRequest(
            job_id=job.job_id, attempt=job.attempt.number, rank=member.rank, offset=-LOG_TAIL_BYTES
        )
        metadata = ((GRANT_METADATA_KEY, grant),) if grant else ()
        data = bytearray()
        with self._transport.channel(address) as channel:
            stub = wpb_grpc.WorkerServiceStub(channel)  # type: ignore[no-untyped-call]
            for chunk in stub.ReadLog(read, timeout=self._timeout_s, metadata=metadata):
                data += chunk.data
                if len(data) >= LOG_TAIL_BYTES:
                    break
        return data[-LOG_TAIL_BYTES:].decode("utf-8", errors="replace")


def _refused_overview(overview: Overview) -> bool:
    return "refused" in overview.errors


def _html(status: int, text: str) -> Response:
    return Response(status, text.encode())


def _redirect(location: str, clear_cookie: bool = False) -> Response:
    headers: tuple[tuple[str, str], ...] = (("Location", location),)
    if clear_cookie:
        headers += (("Set-Cookie", f"{COOKIE}=; Path=/; Max-Age=0; HttpOnly; Secure"),)
    return Response(303, b"", headers=headers)
