"""The web dashboard every replica serves: server-rendered HTML that refreshes itself.

Pages:

* ``/`` — cluster health (replicas, roles, terms, the leader), the queue (pending jobs
  with their reasons), the running gangs with their nodes, the nodes as a
  rack-by-rack map of GPU occupancy (each GPU titled with the job holding it), and the
  cohort tree when there is one;
* ``/jobs/<id>`` — one job: queue, resources, command, time limit, its times and
  durations, its members (node, GPUs, state), its current attempt on a time axis, the
  tail of each member's log, and a cancel button for those who may cancel it;
  ``POST /jobs/<id>/cancel`` cancels it through the API's ``CancelJob`` as the viewer
  (the API's own access check decides);
* ``/nodes``, ``/queues``, ``/history`` (``?user=&queue=&node=&since=``), ``/usage``
  (``?by=&since=&until=``) — see :mod:`synapse_ha.observe.list_pages`;
* ``/charts`` (``?window=``) — GPUs allocated and pending, and the queue wait per queue,
  over the last hours (:mod:`synapse_ha.observe.chart_pages`);
* ``/login`` (GET: the form; POST: sign in) and ``/logout`` (POST only);
* ``/static/dashboard.css`` and ``/static/dashboard.js`` — the one stylesheet and the
  script every page loads (:mod:`synapse_ha.observe.script`: times in the browser's
  zone, and the live pages' refresh); the charts page's script and the charting library
  (:mod:`synapse_ha.observe.static_files`). The pages carry no inline style and no
  inline script, so the Content-Security-Policy forbids both.

**Who is signed in** is named by the user and role the token proves (``alice (user)``)
when the replica says (``identify``), else by the token's id.

**Same data, same rules as the API.** The dashboard is a client of the cluster's own
gRPC API (:class:`~synapse_ha.client.cluster.ClusterClient`), so it follows the leader for
fresh data exactly as ``synctl`` does and survives a leader change. Each request is made
with the *viewer's* bearer token (over this replica's TLS transport), so the replica that
answers judges the viewer, not the dashboard: a ``user`` sees what the API lets a user
see (other owners' jobs redacted, another user's logs refused). An ``--insecure`` replica
has no tokens: every viewer is the anonymous admin, as on its API.

**Who is viewing.** Scripts send ``Authorization: Bearer <token>`` with each request. A
browser signs in once: the form posts the token, the dashboard checks it with the API
and opens a session (:mod:`synapse_ha.observe.sessions`, which says when one ends), and
the browser gets only the session's random id in a cookie (``__Host-`` prefixed,
``HttpOnly``, ``Secure``, ``SameSite=Strict``). The token itself stays in this replica's
memory and never goes back to the browser.

**Forgery.** Sign-in, sign-out and cancel are POSTs that must come from this
dashboard's own pages: a request whose ``Origin`` is another site is refused, and each
form carries a random value that must match — for sign-in, a short-lived cookie set
with the form (double submit), for sign-out and cancel, the session's own value. So
another site can neither sign a browser in as someone else (login CSRF), nor sign it
out, nor cancel a job in its name; a GET changes nothing.

**Cheap refusals.** Everything that needs no API call — the form, the stylesheet, a
request without a credential, a forged form, a malformed token — is answered by
:meth:`Dashboard.triage` on the HTTP server's event loop, never on its worker pool (see
:mod:`synapse_ha.observe.http`).

The pages themselves are rendered by :mod:`synapse_ha.observe.pages`, and member logs
are read by :mod:`synapse_ha.observe.member_logs`.
"""

from __future__ import annotations

import hmac
import re
import secrets
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from synapse_ha.client.cluster import ClusterClient, ClusterUnavailable
from synapse_ha.core.identity.access import split_token
from synapse_ha.observe.chart_pages import CHARTS_REFRESH_FACTOR
from synapse_ha.observe.http import Request, Response
from synapse_ha.observe.list_pages import render_nodes, render_queues
from synapse_ha.observe.member_logs import read_log_tail
from synapse_ha.observe.page_kit import REFRESH_S, SCRIPT
from synapse_ha.observe.page_reads import (
    LIVE_STATES,
    charts_page,
    history_page,
    query_of,
    usage_page,
)
from synapse_ha.observe.pages import (
    STYLE,
    STYLESHEET,
    Overview,
    gpu_holders,
    render_job,
    render_job_error,
    render_login,
    render_not_found,
    render_overview,
    render_refused,
)
from synapse_ha.observe.script import SCRIPT_JS
from synapse_ha.observe.sessions import Session, Sessions, token_label
from synapse_ha.observe.static_files import STATIC_PREFIX, StaticFile, load_static
from synapse_ha.rpc.errors import Reason, failure_of
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.security.tls import Transport

# ``__Host-``: the browser keeps it only for this exact origin, set Secure with Path=/, so
# no sibling host can plant or overwrite it.
COOKIE = "__Host-synapse_session"
LOGIN_COOKIE = "__Host-synapse_login"  # the sign-in form's double-submit value
# Earlier releases kept the bearer token itself in this cookie; it is never read, and
# cleared wherever a browser still sends it.
LEGACY_TOKEN_COOKIE = "synapse_token"
LOGIN_FORM_TTL_S = 600
_NONCE = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32)
MAX_CLIENTS = 32  # one API client per viewer token, least recently used dropped
PAGES = ("/", "/charts", "/nodes", "/queues", "/history", "/usage")
FORM_PAGES = {"/history": history_page, "/usage": usage_page}
CANCEL_SUFFIX = "/cancel"


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
    ``clock_ms`` by default); ``identify``: the name a token proves (``alice (user)``;
    "" when it proves nobody), from the replica's own copy of the tokens;
    ``refresh_s``: how often the live pages refresh themselves; ``charts_refresh_s``: how
    often ``/charts`` does (by default :data:`CHARTS_REFRESH_FACTOR` times less often)."""

    def __init__(
        self,
        addresses: Sequence[str],
        transport: Transport,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        timeout_s: float = 5.0,
        sessions: Sessions | None = None,
        identify: Callable[[str], str] | None = None,
        refresh_s: int = REFRESH_S,
        charts_refresh_s: int = 0,
    ) -> None:
        self._addresses = list(addresses)
        self._transport = transport
        self._clock_ms = clock_ms
        self._timeout_s = timeout_s
        self.sessions = sessions if sessions is not None else Sessions(clock_ms)
        self._scheme = "https" if transport.secure else "http"
        self._lock = threading.Lock()
        self._clients: OrderedDict[str, ClusterClient] = OrderedDict()
        self._identify = identify
        self.refresh_s = refresh_s
        self.charts_refresh_s = charts_refresh_s or refresh_s * CHARTS_REFRESH_FACTOR
        self._static: dict[str, StaticFile] = load_static()

    def _name(self, token: str) -> str:
        """How the pages name the viewer of ``token``: the user and role it proves,
        else its id."""
        name = self._identify(token) if self._identify is not None and token else ""
        return name or token_label(token)

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
            return Response(200, STYLE.encode(), "text/css; charset=utf-8")
        if path == SCRIPT:
            if request.method not in ("GET", "HEAD"):
                return _not_allowed("GET, HEAD")
            return Response(200, SCRIPT_JS.encode(), "text/javascript; charset=utf-8")
        if path.startswith(STATIC_PREFIX):
            found = self._static.get(path)
            if found is None:
                return _html(404, render_not_found(path))
            if request.method not in ("GET", "HEAD"):
                return _not_allowed("GET, HEAD")
            return Response(200, found.body, found.content_type)
        if path == "/login":
            return self._login_form(request)
        if path == "/logout":
            return self._logout(request)
        if path not in PAGES and not path.startswith("/jobs/"):
            return _html(404, render_not_found(path))
        if path.startswith("/jobs/") and path.endswith(CANCEL_SUFFIX):
            if request.method != "POST":
                return _not_allowed("POST")
            if not self._same_origin(request):
                return _forbidden("cancel refused: the form was posted from another site")
        elif request.method not in ("GET", "HEAD"):
            return _not_allowed("GET, HEAD")
        viewer = self._viewer(request)
        if isinstance(viewer, Response):
            return viewer
        session = viewer.session
        if (
            request.method == "POST"
            and session is not None
            and not _same(form_of(request).get("csrf", ""), session.csrf)
        ):
            return _forbidden("cancel refused: the form is not this dashboard's")
        return None

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
            page = render_overview(overview, viewer.label, viewer.csrf, self.refresh_s)
            return _html(200, page)
        if path in PAGES:
            return self._list_page(request, viewer, path)
        job_id = urllib.parse.unquote(path[len("/jobs/") :])
        if request.method == "POST":
            return self._cancel(request, viewer, job_id.removesuffix(CANCEL_SUFFIX))
        return self._job_page(request, viewer, job_id)

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
            return Viewer(token, self._name(token))
        session_id = cookies_of(request).get(COOKIE, "")
        session = self.sessions.get(session_id) if session_id else None
        if session is None:
            return _redirect("/login", clear=COOKIE if session_id else "")
        return Viewer(session.token, self._name(session.token), session)

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
        max_age = self.sessions.limits.ttl_ms // 1000
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
        try:
            overview.queues = client.list_queues()
        except (grpc.RpcError, ClusterUnavailable):
            overview.queues = None  # the tree is left out; the other sections still show
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
            return _html(status, render_job_error(job_id, _describe(exc)))
        logs = self.log_tails(client, job) if job.HasField("attempt") else {}
        page = render_job(job, logs, self._clock_ms(), viewer.label, viewer.csrf, self.refresh_s)
        return _html(200, page)

    def _list_page(self, request: Request, viewer: Viewer, path: str) -> Response:
        """``/nodes``, ``/queues``, ``/history``, ``/usage`` or ``/charts``, read through
        the API as the viewer."""
        client = self._client(viewer.token)
        label, csrf, now = viewer.label, viewer.csrf, self._clock_ms()
        try:
            if path == "/nodes":
                nodes = client.list_nodes()
                try:
                    holders = gpu_holders(client.list_jobs(states=["SCHEDULED", "RUNNING"]))
                except (grpc.RpcError, ClusterUnavailable):
                    holders = {}  # the GPUs still show, without their holders
                page = render_nodes(nodes, holders, now, label, csrf, refresh_s=self.refresh_s)
            elif path == "/queues":
                page = render_queues(client.list_queues(), label, csrf, refresh_s=self.refresh_s)
            elif path == "/charts":
                query, every = query_of(request.path), self.charts_refresh_s
                page = charts_page(client, query, now, label, csrf, every)
            else:
                page = FORM_PAGES[path](client, query_of(request.path), now, label, csrf)
        except (grpc.RpcError, ClusterUnavailable) as exc:
            if _refused(exc):
                return self._signed_out(request, viewer, _describe(exc))
            return _html(502, render_job_error(path.strip("/"), _describe(exc)))
        return _html(200, page)

    def _cancel(self, request: Request, viewer: Viewer, job_id: str) -> Response:
        """Cancel through the API as the viewer: the API decides who may (the owner,
        operators and admins), as for ``synctl cancel``; its refusal is shown."""
        client = self._client(viewer.token)
        try:
            client.cancel_job(job_id, reason=f"cancelled from the dashboard by {viewer.label}")
        except (grpc.RpcError, ClusterUnavailable) as exc:
            if _refused(exc):
                return self._signed_out(request, viewer, _describe(exc))
            status = 403 if isinstance(exc, grpc.RpcError) else 502
            if isinstance(exc, grpc.RpcError) and exc.code() is grpc.StatusCode.NOT_FOUND:
                status = 404
            return _html(status, render_refused(f"job {job_id} not cancelled: {_describe(exc)}"))
        return _redirect(f"/jobs/{urllib.parse.quote(job_id)}")

    def log_tails(self, client: ClusterClient, job: pb.Job) -> dict[int, str]:
        """The end of each member's log of the job's current attempt, or why not."""
        tails: dict[int, str] = {}
        for m in job.attempt.members:
            try:
                tails[m.rank] = read_log_tail(client, self._transport, job, m, self._timeout_s)
            except (grpc.RpcError, ClusterUnavailable, LookupError) as exc:
                tails[m.rank] = f"(no log: {_describe(exc)})"
        return tails


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
    return _html(403, render_refused(message))


def _clearing(name: str) -> str:
    return f"{name}=; Path=/; Max-Age=0; HttpOnly; Secure; SameSite=Strict"


def _redirect(location: str, clear: str = "") -> Response:
    headers: tuple[tuple[str, str], ...] = (("Location", location),)
    if clear:
        headers += (("Set-Cookie", _clearing(clear)),)
    return Response(303, b"", headers=headers)
