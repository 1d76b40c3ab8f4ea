"""The web dashboard every replica serves: server-rendered HTML, read-only.

Pages:

* ``/`` — cluster health (replicas, roles, terms, the leader), the queue (pending jobs
  with their reasons), the running gangs with their nodes, and the nodes as a
  rack-by-rack map of GPU occupancy;
* ``/jobs/<id>`` — one job: its members (node, GPUs, state), its current attempt on a
  timeline, and the tail of each member's log;
* ``/login`` (GET: the form; POST: sign in) and ``/logout`` (POST only);
* ``/static/dashboard.css`` — the one stylesheet (the pages carry no inline style and no
  script, so the Content-Security-Policy forbids both).

**Same data, same rules as the API.** The dashboard is a client of the cluster's own
gRPC API (:class:`~synapse_ha.client.cluster.ClusterClient`), so it follows the leader for
fresh data exactly as ``synctl`` does and survives a leader change. Each request is made
with the *viewer's* bearer token (over this replica's TLS transport), so the replica that
answers judges the viewer, not the dashboard: a ``user`` sees what the API lets a user
see (other owners' jobs redacted, another user's logs refused). An ``--insecure`` replica
has no tokens: every viewer is the anonymous admin, as on its API.

**Who is viewing.** Scripts send ``Authorization: Bearer <token>`` with each request. A
browser signs in once: the form posts the token, the dashboard checks it with the API
and opens a :class:`Sessions` entry, and the browser gets only the session's random id
in a cookie (``__Host-`` prefixed, ``HttpOnly``, ``Secure``, ``SameSite=Strict``). The
token itself stays in this replica's memory and never goes back to the browser. A
session ends at sign-out, after :data:`SESSION_IDLE_MS` without a request, at the latest
:data:`SESSION_TTL_MS` after sign-in, when the API refuses its token (revoked, expired),
or when the replica restarts; sessions are this replica's own.

**Forgery.** Sign-in and sign-out are POSTs that must come from this dashboard's own
pages: a request whose ``Origin`` is another site is refused, and each form carries a
random value that must match — for sign-in, a short-lived cookie set with the form
(double submit), for sign-out, the session's own value. So another site can neither sign
a browser in as someone else (login CSRF) nor sign it out; a GET changes nothing.

**Cheap refusals.** Everything that needs no API call — the form, the stylesheet, a
request without a credential, a forged form, a malformed token — is answered by
:meth:`Dashboard.triage` on the HTTP server's event loop, never on its worker pool (see
:mod:`synapse_ha.observe.http`).

Member logs are read as ``synctl logs`` reads them: a grant from ``GrantLogAccess``, then
the tail of the log from the member's worker (``ReadLog`` with a negative offset).

The render functions (:func:`render_overview`, :func:`render_job`) are pure: protobuf
messages in, HTML out; the benchmark times them on a synthetic cluster.
"""

from __future__ import annotations

import hmac
import html
import re
import secrets
import threading
import time
import urllib.parse
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc

from synapse_ha.client.cluster import ClusterClient, ClusterUnavailable
from synapse_ha.core.access import split_token
from synapse_ha.observe.http import Request, Response
from synapse_ha.rpc.errors import Reason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2 as wpb
from synapse_ha.rpc.gen.synapse.v1 import worker_pb2_grpc as wpb_grpc
from synapse_ha.security.grants import GRANT_METADATA_KEY
from synapse_ha.security.tls import Transport

# ``__Host-``: the browser keeps it only for this exact origin, set Secure with Path=/, so
# no sibling host can plant or overwrite it.
COOKIE = "__Host-synapse_session"
LOGIN_COOKIE = "__Host-synapse_login"  # the sign-in form's double-submit value
# Earlier releases kept the bearer token itself in this cookie; it is never read, and
# cleared wherever a browser still sends it.
LEGACY_TOKEN_COOKIE = "synapse_token"
LOGIN_FORM_TTL_S = 600
SESSION_TTL_MS = 8 * 3_600_000  # from sign-in, however active
SESSION_IDLE_MS = 30 * 60_000  # without a request
MAX_SESSIONS = 4096  # on this replica; the least recently used goes first
MAX_SESSIONS_PER_TOKEN = 16  # one credential cannot push out everyone else's sessions
STYLESHEET = "/static/dashboard.css"
_NONCE = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32)
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
.bar{display:block}.bar .track{fill:#eee}.bar .run{fill:#48c}
pre{background:#f7f7f7;padding:6px;max-height:20em;overflow:auto}
form.inline{display:inline}form.inline button{font:inherit;padding:0 4px}
"""


# ------------------------------------------------------------------- rendering


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _page(title: str, body: str, viewer: str = "", csrf: str = "") -> str:
    """A whole page. ``csrf``: the viewer's session value, for the sign-out form (none
    without a session: a bearer header has nothing to sign out of)."""
    sign_out = (
        ' · <form class="inline" method="post" action="/logout">'
        f'<input type="hidden" name="csrf" value="{_e(csrf)}">'
        '<button type="submit" id="sign-out">sign out</button></form>'
        if csrf
        else ""
    )
    who = f'<p class="muted">signed in as {_e(viewer)}{sign_out}</p>' if viewer else ""
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>{_e(title)}</title>"
        f'<link rel="stylesheet" href="{STYLESHEET}"></head>'
        f"<body><h1>{_e(title)}</h1>{who}{body}</body></html>"
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


def render_overview(overview: Overview, viewer: str = "", csrf: str = "") -> str:
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
    return _page("synapse cluster", "".join(parts), viewer, csrf)


def _timeline(attempt: pb.Attempt, now_ms: int) -> str:
    start = attempt.bound_at_ms
    end = attempt.ended_at_ms or now_ms
    span = max(1, end - start)
    run_from = attempt.started_at_ms or end
    left = min(100.0, max(0.0, 100.0 * (run_from - start) / span))
    # SVG attributes, not inline style: the Content-Security-Policy allows no inline style.
    return (
        '<svg class="bar" width="400" height="10" role="img" aria-label="bound, started, ended">'
        '<rect class="track" x="0" y="0" width="100%" height="10"></rect>'
        f'<rect class="run" x="{left:.1f}%" y="0" width="{100 - left:.1f}%" height="10"></rect>'
        f"</svg><small>bound {attempt.bound_at_ms} · started {attempt.started_at_ms or '-'} · "
        f"ended {attempt.ended_at_ms or '-'} (ms since the epoch)</small>"
    )


def render_job(
    job: pb.Job, logs: dict[int, str], now_ms: int, viewer: str = "", csrf: str = ""
) -> str:
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
    return _page(f"job {job.job_id}", "".join(parts), viewer, csrf)


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


# ---------------------------------------------------------------------- sessions


@dataclass(slots=True)
class Session:
    session_id: str  # the cookie's value: random, never derived from the token
    token: str
    csrf: str  # the sign-out form's value
    created_ms: int
    seen_ms: int

    @property
    def label(self) -> str:
        return _label(self.token)


class Sessions:
    """Signed-in browsers on this replica: a random id (the cookie) → the viewer's token.

    A session ends at :meth:`close` (sign-out), :meth:`close_token` (the API refused the
    token), ``idle_ms`` after its last request, or ``ttl_ms`` after it was opened, by
    ``clock_ms``. At most ``max_sessions`` live (opening one more closes the least
    recently used) and at most ``per_token`` per token (opening one more closes that
    token's oldest), so one credential signing in again and again cannot push out the
    sessions of others. Thread-safe."""

    def __init__(
        self,
        clock_ms: Callable[[], int],
        ttl_ms: int = SESSION_TTL_MS,
        idle_ms: int = SESSION_IDLE_MS,
        max_sessions: int = MAX_SESSIONS,
        per_token: int = MAX_SESSIONS_PER_TOKEN,
    ) -> None:
        self._clock_ms = clock_ms
        self.ttl_ms = ttl_ms
        self.idle_ms = idle_ms
        self._max = max_sessions
        self._per_token = per_token
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # least recently used first

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def open(self, token: str) -> Session:
        now = self._clock_ms()
        session = Session(secrets.token_urlsafe(32), token, secrets.token_urlsafe(32), now, now)
        with self._lock:
            same = [s for s in self._sessions.values() if s.token == token]
            for old in sorted(same, key=lambda s: s.created_ms)[
                : max(0, len(same) - self._per_token + 1)
            ]:
                del self._sessions[old.session_id]
            while len(self._sessions) >= self._max:
                self._sessions.popitem(last=False)
            self._sessions[session.session_id] = session
        return session

    def get(self, session_id: str) -> Session | None:
        """The live session with this id (its idle clock restarts), else None; an
        expired one is closed."""
        now = self._clock_ms()
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return None
            if now - session.seen_ms >= self.idle_ms or now - session.created_ms >= self.ttl_ms:
                del self._sessions[session_id]
                return None
            session.seen_ms = now
            self._sessions.move_to_end(session_id)
            return session

    def close(self, session_id: str) -> Session | None:
        with self._lock:
            return self._sessions.pop(session_id, None)

    def close_token(self, token: str) -> int:
        """Close every session of ``token``; how many there were."""
        with self._lock:
            gone = [sid for sid, s in self._sessions.items() if s.token == token]
            for sid in gone:
                del self._sessions[sid]
        return len(gone)

    def holds(self, token: str) -> bool:
        with self._lock:
            return any(s.token == token for s in self._sessions.values())


# ----------------------------------------------------------------------- serving


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who a request is from: the token the API calls carry ("" on an insecure cluster),
    the name the pages show, and the session when it came with one."""

    token: str
    label: str
    session: Session | None = None

    @property
    def csrf(self) -> str:
        return self.session.csrf if self.session is not None else ""


def _label(token: str) -> str:
    parsed = split_token(token)
    return f"token {parsed[0]}" if parsed else "anonymous"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.RpcError):
        return failure_of(exc).describe()
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _refused(exc: BaseException) -> bool:
    return isinstance(exc, grpc.RpcError) and failure_of(exc).reason is Reason.UNAUTHENTICATED


def cookies_of(request: Request) -> dict[str, str]:
    """The request's cookies, ``name → value``; the first of a repeated name wins."""
    found: dict[str, str] = {}
    for part in request.headers.get("cookie", "").split(";"):
        name, sep, value = part.strip().partition("=")
        if sep and name and name not in found:
            found[name] = value.strip()
    return found


def form_of(request: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body, first value of each field."""
    fields = urllib.parse.parse_qs(request.body.decode("utf-8", errors="replace"))
    return {name: values[0] for name, values in fields.items() if values}


def _same(a: str, b: str) -> bool:
    return bool(a) and bool(b) and hmac.compare_digest(a.encode(), b.encode())


class Dashboard:
    """The dashboard app for :class:`~synapse_ha.observe.http.ObserveServer`.

    ``addresses``: the replicas' gRPC addresses (this replica's first); ``transport``:
    this replica's TLS transport (the channel presents its certificate; the viewer's
    token names the viewer); ``sessions``: the signed-in browsers (a fresh store on
    ``clock_ms`` by default)."""

    def __init__(
        self,
        addresses: Sequence[str],
        transport: Transport,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        timeout_s: float = 5.0,
        sessions: Sessions | None = None,
    ) -> None:
        self._addresses = list(addresses)
        self._transport = transport
        self._clock_ms = clock_ms
        self._timeout_s = timeout_s
        self.sessions = sessions if sessions is not None else Sessions(clock_ms)
        self._scheme = "https" if transport.secure else "http"
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

    def _forget(self, token: str) -> None:
        """The API refused ``token``: end its sessions and drop its client."""
        self.sessions.close_token(token)
        with self._lock:
            client = self._clients.pop(token, None)
        if client is not None:
            client.close()

    # -- routing

    def triage(self, request: Request) -> Response | None:
        """The answer to every request that needs no API call (see the module
        docstring); None for the rest. Never blocks."""
        path = urllib.parse.urlsplit(request.path).path
        if path == STYLESHEET:
            if request.method not in ("GET", "HEAD"):
                return _not_allowed("GET, HEAD")
            return Response(200, _STYLE.encode(), "text/css; charset=utf-8")
        if path == "/login":
            return self._login_form(request)
        if path == "/logout":
            return self._logout(request)
        if path != "/" and not path.startswith("/jobs/"):
            return _html(404, _page("not found", f"<p>no page {_e(path)}</p>"))
        if request.method not in ("GET", "HEAD"):
            return _not_allowed("GET, HEAD")
        viewer = self._viewer(request)
        return viewer if isinstance(viewer, Response) else None

    def __call__(self, request: Request) -> Response:
        quick = self.triage(request)
        if quick is not None:
            return quick
        path = urllib.parse.urlsplit(request.path).path
        if path == "/login":
            return self._sign_in(request)
        viewer = self._viewer(request)
        if isinstance(viewer, Response):
            return viewer
        if path == "/":
            overview = self.overview(viewer.token)
            if _refused_overview(overview):
                return self._signed_out(request, viewer, overview.errors.get("status", ""))
            return _html(200, render_overview(overview, viewer.label, viewer.csrf))
        return self._job_page(request, viewer, urllib.parse.unquote(path[len("/jobs/") :]))

    def _viewer(self, request: Request) -> Viewer | Response:
        """Who the request is from, or the answer for a request from nobody."""
        if not self._transport.secure:
            return Viewer("", "anonymous")  # an insecure cluster has no tokens
        header = request.headers.get("authorization")
        if header is not None:
            scheme, _, token = header.partition(" ")
            token = token.strip()
            if scheme.lower() != "bearer" or split_token(token) is None:
                return Response(
                    401,
                    b"the Authorization header holds no synapse token (Bearer syn_<id>_<secret>)\n",
                    "text/plain; charset=utf-8",
                    (("WWW-Authenticate", "Bearer"),),
                )
            return Viewer(token, _label(token))
        session_id = cookies_of(request).get(COOKIE, "")
        session = self.sessions.get(session_id) if session_id else None
        if session is None:
            return _redirect("/login", clear=COOKIE if session_id else "")
        return Viewer(session.token, session.label, session)

    def _same_origin(self, request: Request) -> bool:
        """Whether a form post comes from this dashboard's own pages: its ``Origin`` is
        this origin; without one (an older browser, a script), its ``Sec-Fetch-Site``
        does not name another site."""
        origin = request.headers.get("origin")
        if origin is None:
            site = request.headers.get("sec-fetch-site", "same-origin")
            return site in ("same-origin", "none")
        host = request.headers.get("host", "")
        return bool(host) and origin.lower() == f"{self._scheme}://{host}".lower()

    # -- signing in and out

    def _login_page(self, request: Request, status: int, message: str = "") -> Response:
        """The form with its double-submit value, in the form and in its cookie: the
        value the browser already holds (another tab's form stays valid), else a new
        one."""
        cookies = cookies_of(request)
        held = cookies.get(LOGIN_COOKIE, "")
        nonce = held if _NONCE.fullmatch(held) else secrets.token_urlsafe(32)
        cookie = (
            f"{LOGIN_COOKIE}={nonce}; Path=/; Max-Age={LOGIN_FORM_TTL_S}; "
            "HttpOnly; Secure; SameSite=Strict"
        )
        headers: tuple[tuple[str, str], ...] = (("Set-Cookie", cookie),)
        if LEGACY_TOKEN_COOKIE in cookies:  # a bearer token a browser still holds: drop it
            headers += (("Set-Cookie", _clearing(LEGACY_TOKEN_COOKIE)),)
        return _html(status, render_login(message, nonce), headers)

    def _login_form(self, request: Request) -> Response | None:
        """GET: the form. POST: refused here when forged or malformed; None to check
        the token with the API (:meth:`_sign_in`)."""
        if not self._transport.secure:
            return _redirect("/")
        if request.method in ("GET", "HEAD"):
            return self._login_page(request, 200)
        if request.method != "POST":
            return _not_allowed("GET, HEAD, POST")
        if not self._same_origin(request):
            return _forbidden("sign-in refused: the form was posted from another site")
        form = form_of(request)
        if not _same(form.get("csrf", ""), cookies_of(request).get(LOGIN_COOKIE, "")):
            return _forbidden(
                "sign-in refused: the form is not this dashboard's or has expired; "
                "reload the sign-in page"
            )
        token = form.get("token", "").strip()
        if not token:
            return self._login_page(request, 400, "enter a token")
        if split_token(token) is None:
            return self._login_page(request, 401, "that is not a synapse token (syn_<id>_<secret>)")
        return None

    def _sign_in(self, request: Request) -> Response:
        token = form_of(request).get("token", "").strip()
        try:
            self._client(token).cluster_status()
        except (grpc.RpcError, ClusterUnavailable) as exc:
            if _refused(exc):
                self._forget(token)
            return self._login_page(request, 401, _describe(exc))
        session = self.sessions.open(token)
        max_age = self.sessions.ttl_ms // 1000
        headers = (
            ("Location", "/"),
            (
                "Set-Cookie",
                f"{COOKIE}={session.session_id}; Path=/; Max-Age={max_age}; "
                "HttpOnly; Secure; SameSite=Strict",
            ),
            ("Set-Cookie", _clearing(LOGIN_COOKIE)),
        )
        return Response(303, b"", headers=headers)

    def _logout(self, request: Request) -> Response:
        if not self._transport.secure:
            return _redirect("/")
        if request.method != "POST":
            return _not_allowed("POST")
        if not self._same_origin(request):
            return _forbidden("sign-out refused: the form was posted from another site")
        session_id = cookies_of(request).get(COOKIE, "")
        session = self.sessions.get(session_id) if session_id else None
        if session is None:
            return _redirect("/login", clear=COOKIE)
        if not _same(form_of(request).get("csrf", ""), session.csrf):
            return _forbidden("sign-out refused: the form is not this dashboard's")
        self.sessions.close(session.session_id)
        if not self.sessions.holds(session.token):
            with self._lock:
                client = self._clients.pop(session.token, None)
            if client is not None:
                client.close()
        return _redirect("/login", clear=COOKIE)

    def _signed_out(self, request: Request, viewer: Viewer, message: str) -> Response:
        """The API refused the viewer's token: its sessions end, the form says why."""
        self._forget(viewer.token)
        page = self._login_page(request, 401, message)
        if viewer.session is None:
            return page
        return Response(
            page.status,
            page.body,
            page.content_type,
            (*page.headers, ("Set-Cookie", _clearing(COOKIE))),
        )

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

    def _job_page(self, request: Request, viewer: Viewer, job_id: str) -> Response:
        client = self._client(viewer.token)
        try:
            job = client.get_job(job_id)
        except (grpc.RpcError, ClusterUnavailable) as exc:
            if _refused(exc):
                return self._signed_out(request, viewer, _describe(exc))
            status = (
                404
                if isinstance(exc, grpc.RpcError) and (exc.code() is grpc.StatusCode.NOT_FOUND)
                else 502
            )
            return _html(status, _page(f"job {job_id}", f'<p class="bad">{_e(_describe(exc))}</p>'))
        logs = self.log_tails(client, job) if job.HasField("attempt") else {}
        page = render_job(job, logs, self._clock_ms(), viewer.label, viewer.csrf)
        return _html(200, page)

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
        with self._transport.channel(address, worker=member.node_id) as channel:
            stub = wpb_grpc.WorkerServiceStub(channel)  # type: ignore[no-untyped-call]
            for chunk in stub.ReadLog(read, timeout=self._timeout_s, metadata=metadata):
                data += chunk.data
                if len(data) >= LOG_TAIL_BYTES:
                    break
        return data[-LOG_TAIL_BYTES:].decode("utf-8", errors="replace")


def _refused_overview(overview: Overview) -> bool:
    return "refused" in overview.errors


def _html(status: int, text: str, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(status, text.encode(), headers=headers)


def _not_allowed(allow: str) -> Response:
    return Response(
        405,
        f"method not allowed; use {allow}\n".encode(),
        "text/plain; charset=utf-8",
        (("Allow", allow),),
    )


def _forbidden(message: str) -> Response:
    return _html(403, _page("synapse: refused", f'<p class="bad" id="refused">{_e(message)}</p>'))


def _clearing(name: str) -> str:
    return f"{name}=; Path=/; Max-Age=0; HttpOnly; Secure; SameSite=Strict"


def _redirect(location: str, clear: str = "") -> Response:
    headers: tuple[tuple[str, str], ...] = (("Location", location),)
    if clear:
        headers += (("Set-Cookie", _clearing(clear)),)
    return Response(303, b"", headers=headers)
