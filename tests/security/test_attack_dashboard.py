"""Attacks on the web dashboard, on a real replica (its HTTPS dashboard and API on
127.0.0.1), each written as the attack: another site framing the pages, signing a
browser in as the attacker (login CSRF) or out, a stolen cookie replayed, a session kept
past its life, and an anonymous client holding hundreds of slow connections. Each test
asserts the refusal and that nothing changed (the victim's browser and sessions).

Browsers are played by :class:`Browser`: a cookie jar and the headers a browser sends
(``Origin`` on a POST); the framing test also uses a real headless chromium, as the
dashboard browser test does. The session-expiry test runs the dashboard in-process on a
fake clock, in front of the same real replica's API.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import select
import socket
import ssl
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
import pytest

from synapse_ha.client.cluster import ClusterClient
from synapse_ha.observe.dashboard import COOKIE, LOGIN_COOKIE, Dashboard
from synapse_ha.observe.http import CONTENT_SECURITY_POLICY, ObserveServer
from synapse_ha.observe.sessions import SessionLimits, Sessions
from synapse_ha.rpc.errors import Reason, failure_of
from synapse_ha.security.bundle import ClusterCredentials
from synapse_ha.security.tls import Transport
from tests.integration.cluster import LocalCluster
from tests.observe.world import tls_context

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
EVIL = "https://evil.example"
WAIT_S = 30.0  # bound on every HTTP exchange here


@dataclass
class Answer:
    status: int
    headers: list[tuple[str, str]]  # lower-case names, in order
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name), None)

    @property
    def set_cookies(self) -> dict[str, str]:
        out = {}
        for name, value in self.headers:
            if name == "set-cookie":
                key, _, rest = value.partition("=")
                out[key] = rest.split(";", 1)[0]
        return out


@dataclass
class Browser:
    """A browser's view of one dashboard: its cookie jar, and ``Origin`` on POSTs (its
    own origin, unless the page that posts is another site's)."""

    base: str  # https://host:port
    context: ssl.SSLContext
    jar: dict[str, str] = field(default_factory=dict)

    @property
    def origin(self) -> str:
        return self.base

    def request(
        self,
        method: str,
        path: str,
        *,
        form: dict[str, str] | None = None,
        origin: str | None = "own",
        send_cookies: bool = True,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        url = urllib.parse.urlsplit(self.base)
        sent = dict(headers or {})
        if send_cookies and self.jar:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.jar.items())
        body = None
        if form is not None:
            body = urllib.parse.urlencode(form)
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        if method == "POST" and origin is not None:
            sent["Origin"] = self.origin if origin == "own" else origin
        connection = http.client.HTTPSConnection(
            url.hostname or "", url.port, context=self.context, timeout=WAIT_S
        )
        try:
            connection.request(method, path, body=body, headers=sent)
            response = connection.getresponse()
            answer = Answer(
                response.status,
                [(k.lower(), v) for k, v in response.getheaders()],
                response.read(),
            )
        finally:
            connection.close()
        for name, value in answer.set_cookies.items():
            if value:
                self.jar[name] = value
            else:
                self.jar.pop(name, None)
        return answer

    def sign_in(self, token: str) -> Answer:
        """What a person does: open the form, type the token, press the button."""
        form = self.request("GET", "/login")
        assert form.status == 200, form
        nonce = _hidden_csrf(form.body)
        return self.request("POST", "/login", form={"csrf": nonce, "token": token})

    def sees_the_cluster(self) -> bool:
        page = self.request("GET", "/")
        return page.status == 200 and b'id="replicas"' in page.body


def _hidden_csrf(body: bytes) -> str:
    match = re.search(rb'name="csrf" value="([^"]+)"', body)
    assert match, body
    return match.group(1).decode()


@dataclass
class Site:
    cluster: LocalCluster
    credentials: ClusterCredentials
    url: str  # the replica's dashboard, https://127.0.0.1:port/
    metrics_url: str

    @property
    def base(self) -> str:
        return self.url.rstrip("/")

    def browser(self) -> Browser:
        return Browser(self.base, tls_context(self.credentials.ca, None))

    def user_token(self, name: str) -> str:
        with self.cluster.client(timeout_s=WAIT_S) as admin:
            return admin.create_token(user=name, role="user").token


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    cluster = LocalCluster(tmp_path_factory.mktemp("dashboard-attacks") / "cluster", size=1)
    try:
        cluster.start()
        leader = cluster.serving_leader(timeout_s=60)
        status = cluster.local_status(leader)
        assert cluster.credentials is not None
        yield Site(cluster, cluster.credentials, status.dashboard_url, status.metrics_url)
    finally:
        cluster.close()


# --------------------------------------------------------------------- framing


def assert_unframeable(answer: Answer, what: str) -> None:
    assert answer.header("x-frame-options") == "DENY", what
    csp = answer.header("content-security-policy") or ""
    assert csp == CONTENT_SECURITY_POLICY, what
    assert "frame-ancestors 'none'" in csp, what
    # Scripts only from the dashboard itself (its one file): nothing inline, nothing
    # from elsewhere, no eval.
    assert "script-src 'self';" in csp and "unsafe" not in csp, what
    assert answer.header("x-content-type-options") == "nosniff", what
    assert answer.header("referrer-policy") in ("no-referrer", "same-origin"), what


def test_no_answer_of_the_dashboard_can_be_framed_or_sniffed(site: Site) -> None:
    """Clickjacking needs the page inside another site's frame; every answer — pages,
    the form, redirects, refusals, errors, the stylesheet, /metrics — forbids it."""
    viewer = site.browser()
    assert viewer.sign_in(site.credentials.admin_token).status == 303
    stranger = site.browser()
    answers = {
        "overview": viewer.request("GET", "/"),
        "unknown job": viewer.request("GET", "/jobs/job-999999"),
        "no page": viewer.request("GET", "/nope"),
        "stylesheet": viewer.request("GET", "/static/dashboard.css"),
        "login form": stranger.request("GET", "/login"),
        "to the form": stranger.request("GET", "/"),
        "forged sign-in": stranger.request("POST", "/login", form={"token": "x"}, origin=EVIL),
        "logout by GET": viewer.request("GET", "/logout"),
        "not a token": stranger.request("GET", "/", headers={"Authorization": "Bearer x"}),
        "a write": viewer.request("POST", "/", form={}),
        "metrics, no certificate": stranger.request("GET", "/metrics"),
    }
    statuses = {what: a.status for what, a in answers.items()}
    assert statuses == {
        "overview": 200,
        "unknown job": 404,
        "no page": 404,
        "stylesheet": 200,
        "login form": 200,
        "to the form": 303,
        "forged sign-in": 403,
        "logout by GET": 405,
        "not a token": 401,
        "a write": 405,
        "metrics, no certificate": 401,
    }
    for what, answer in answers.items():
        assert_unframeable(answer, what)
    assert b"<style" not in answers["overview"].body and b"style=" not in answers["overview"].body
    # Even an answer to a request the server will not parse.
    raw = _raw_exchange(site, b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n")
    head = raw.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
    assert head.startswith("http/1.1 431") and "x-frame-options: deny" in head


def _raw_exchange(site: Site, data: bytes) -> bytes:
    url = urllib.parse.urlsplit(site.url)
    context = tls_context(site.credentials.ca, None)
    with (
        socket.create_connection((url.hostname, url.port), timeout=WAIT_S) as sock,
        context.wrap_socket(sock, server_hostname=url.hostname) as tls,
    ):
        tls.sendall(data)
        out = b""
        while chunk := tls.recv(65536):
            out += chunk
        return out


def test_another_sites_page_cannot_frame_the_dashboard_in_a_real_browser(site: Site) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs it (apt-get install chromium)")
    from tests.integration.test_dashboard_browser import CHROMIUM_ARGS

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(ignore_https_errors=True).new_page()
            # The attacker's page (about:blank here: any origin but the dashboard's).
            page.set_content(
                f'<iframe id="victim" src="{site.url}login" width="600" height="400"></iframe>'
            )
            page.wait_for_timeout(500)
            page.wait_for_load_state("load", timeout=WAIT_S * 1000)
            frames = [f for f in page.frames if f is not page.main_frame]
            assert len(frames) == 1
            # Blocked: the frame holds the browser's error page, never the sign-in form.
            assert frames[0].query_selector("#token") is None
            assert frames[0].query_selector("#sign-in") is None
        finally:
            browser.close()


# ------------------------------------------------------------------ login CSRF


def test_a_cross_origin_sign_in_is_refused_and_sets_no_cookie(site: Site) -> None:
    """Login CSRF: the attacker's page posts the attacker's own (valid) token to the
    victim's dashboard, so that the victim works in the attacker's account."""
    attacker_token = site.user_token("mallory")
    victim = site.browser()
    # Strongest case: the post carries a form value and its cookie that match (as if the
    # attacker had them planted); only the Origin gives it away.
    victim.request("GET", "/login")
    nonce = victim.jar[LOGIN_COOKIE]
    before = dict(victim.jar)
    forged = victim.request(
        "POST", "/login", form={"csrf": nonce, "token": attacker_token}, origin=EVIL
    )
    assert forged.status == 403 and b"another site" in forged.body
    assert COOKIE not in forged.set_cookies and victim.jar == before
    # A browser that sends no Origin: the attacker cannot make it send the form's cookie
    # (SameSite=Strict, __Host-), and a value of its own does not match.
    other = site.browser()
    attackers_form = _hidden_csrf(other.request("GET", "/login").body)
    no_origin = victim.request(
        "POST",
        "/login",
        form={"csrf": attackers_form, "token": attacker_token},
        origin=None,
        send_cookies=False,
    )
    assert no_origin.status == 403 and COOKIE not in no_origin.set_cookies
    # Nothing changed: the victim is not signed in as anyone.
    assert COOKIE not in victim.jar
    assert victim.request("GET", "/").status == 303
    # The same post from the dashboard's own page signs in (the refusals were the origin
    # and the form value, nothing else).
    assert victim.sign_in(attacker_token).status == 303 and COOKIE in victim.jar


# ---------------------------------------------------------------------- logout


def test_logout_by_get_or_from_another_site_does_nothing(site: Site) -> None:
    victim = site.browser()
    assert victim.sign_in(site.credentials.admin_token).status == 303
    session = victim.jar[COOKIE]
    # <img src="https://dashboard/logout">, and an auto-submitted form on another site.
    by_get = victim.request("GET", "/logout")
    assert by_get.status == 405 and COOKIE not in by_get.set_cookies
    by_form = victim.request("POST", "/logout", form={"csrf": "guess"}, origin=EVIL)
    assert by_form.status == 403 and COOKIE not in by_form.set_cookies
    no_value = victim.request("POST", "/logout", form={}, origin=None)
    assert no_value.status == 403
    # Nothing changed: the same session still shows the cluster.
    assert victim.jar[COOKIE] == session
    assert victim.sees_the_cluster()


# -------------------------------------------------------------- cookie, session


def test_the_cookie_is_a_session_not_the_token_and_dies_at_sign_out(site: Site) -> None:
    token = site.user_token("carol")
    carol = site.browser()
    signed_in = carol.sign_in(token)
    assert signed_in.status == 303
    cookie = carol.jar[COOKIE]
    secret = token.split("_", 2)[2]
    assert secret not in cookie and cookie not in token
    page = carol.request("GET", "/")
    assert page.status == 200
    assert secret.encode() not in page.body and not any(secret in v for _, v in page.headers)
    assert list(carol.jar) == [COOKIE]  # the form's value is cleared at sign-in
    # Someone who copies the cookie does not hold an API credential ...
    with (
        ClusterClient(
            site.cluster.grpc_addresses,
            timeout_s=10.0,
            token=cookie,
            channel_factory=Transport(site.credentials.client_tls()).channel,
        ) as thief,
        pytest.raises(grpc.RpcError) as refused,
    ):
        thief.list_jobs()
    assert failure_of(refused.value).reason is Reason.UNAUTHENTICATED
    as_header = site.browser().request("GET", "/", headers={"Authorization": f"Bearer {cookie}"})
    assert as_header.status == 401
    # ... and the copy stops working when carol signs out.
    thief_browser = site.browser()
    thief_browser.jar[COOKIE] = cookie
    assert thief_browser.sees_the_cluster()
    csrf = _hidden_csrf(page.body)
    out = carol.request("POST", "/logout", form={"csrf": csrf})
    assert out.status == 303 and COOKIE not in carol.jar
    replayed = thief_browser.request("GET", "/")
    assert replayed.status == 303 and replayed.header("location") == "/login"
    assert not thief_browser.sees_the_cluster()
    # Signing out ends the session, not the token: carol signs in again.
    assert carol.sign_in(token).status == 303 and carol.sees_the_cluster()


class FakeClock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def dashboard_on_a_fake_clock(site: Site) -> Iterator[tuple[Browser, FakeClock, Sessions]]:
    """The dashboard app in this process on a fake clock, served over HTTPS by the real
    server, reading the real replica's API."""
    from prometheus_client import CollectorRegistry

    clock = FakeClock(1_800_000_000_000)
    sessions = Sessions(clock, SessionLimits(ttl_ms=3_600_000, idle_ms=600_000))
    app = Dashboard(
        site.cluster.grpc_addresses,
        Transport(site.credentials.client_tls()),
        clock_ms=clock,
        sessions=sessions,
    )
    server = ObserveServer(
        "127.0.0.1:0",
        CollectorRegistry(),
        site.credentials.replica_tls("dash"),
        app=app,
    )
    server.start()
    try:
        base = f"https://127.0.0.1:{server.port}"
        yield Browser(base, tls_context(site.credentials.ca, None)), clock, sessions
    finally:
        server.stop()
        app.close()


def test_a_session_expires_idle_and_at_its_lifetime(
    site: Site, dashboard_on_a_fake_clock: tuple[Browser, FakeClock, Sessions]
) -> None:
    browser, clock, sessions = dashboard_on_a_fake_clock
    assert browser.sign_in(site.credentials.admin_token).status == 303
    stolen = browser.jar[COOKIE]
    clock.now_ms += sessions.limits.idle_ms - 1
    assert browser.sees_the_cluster()
    clock.now_ms += sessions.limits.idle_ms  # idle too long
    expired = browser.request("GET", "/")
    assert expired.status == 303 and expired.header("location") == "/login"
    assert COOKIE not in browser.jar and len(sessions) == 0  # cleared here, closed there
    # Kept busy, a session still ends at its lifetime.
    assert browser.sign_in(site.credentials.admin_token).status == 303
    busy = browser.jar[COOKIE]
    for _ in range(sessions.limits.ttl_ms // (sessions.limits.idle_ms // 2) - 1):
        clock.now_ms += sessions.limits.idle_ms // 2
        assert browser.sees_the_cluster()
    clock.now_ms += sessions.limits.idle_ms // 2
    assert browser.request("GET", "/").status == 303
    # Replaying either old cookie opens nothing.
    for cookie in (stolen, busy):
        thief = Browser(browser.base, browser.context, {COOKIE: cookie})
        assert not thief.sees_the_cluster()
    assert len(sessions) == 0


# ------------------------------------------------------------------- slowloris


def _handshake_all(socks: list[ssl.SSLSocket], within_s: float) -> list[ssl.SSLSocket]:
    """Drive the TLS handshakes of non-blocking ``socks`` side by side; those done within
    ``within_s`` (the rest stay stalled mid-handshake, which suits the attack too)."""
    pending, done = list(socks), []
    deadline = time.monotonic() + within_s
    while pending and time.monotonic() < deadline:
        for tls in list(pending):
            try:
                tls.do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                continue
            except OSError:  # closed by the server: no longer held
                pending.remove(tls)
                continue
            pending.remove(tls)
            done.append(tls)
        if pending:
            select.select(pending, [], [], 0.05)
    return done


def test_slow_anonymous_connections_do_not_starve_a_signed_in_viewer(site: Site) -> None:
    """An anonymous client holds more connections than the server keeps, in every
    phase a connection can stall: before the TLS handshake, inside a request head, inside
    a request body. A signed-in viewer and a Prometheus scrape are still answered."""
    viewer = site.browser()
    assert viewer.sign_in(site.credentials.admin_token).status == 303
    url = urllib.parse.urlsplit(site.url)
    address = (url.hostname or "", url.port or 0)
    context = tls_context(site.credentials.ca, None)
    held: list[socket.socket] = []
    try:
        tls_socks = []
        for i in range(300):
            sock = socket.create_connection(address, timeout=WAIT_S)
            if i % 3 == 0:
                held.append(sock)  # silent: not even a TLS ClientHello
                continue
            sock.setblocking(False)
            tls = context.wrap_socket(
                sock, server_hostname=url.hostname, do_handshake_on_connect=False
            )
            held.append(tls)
            tls_socks.append(tls)
        for i, tls in enumerate(_handshake_all(tls_socks, within_s=10.0)):
            tls.settimeout(WAIT_S)
            with contextlib.suppress(OSError):  # closed to make room already
                if i % 2:
                    tls.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: a")
                else:
                    tls.sendall(
                        b"POST /login HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\nt"
                    )
        page = viewer.request("GET", "/")
        assert page.status == 200 and b'id="replicas"' in page.body
        scraper = tls_context(site.credentials.ca, site.credentials.client_tls())
        metrics = urllib.parse.urlsplit(site.metrics_url)
        connection = http.client.HTTPSConnection(
            metrics.hostname or "", metrics.port, context=scraper, timeout=WAIT_S
        )
        try:
            connection.request("GET", "/metrics")
            scrape = connection.getresponse()
            assert scrape.status == 200 and b"synapse_raft_term" in scrape.read()
        finally:
            connection.close()
    finally:
        for sock in held:
            sock.close()
    assert site.cluster.replicas[0].alive
