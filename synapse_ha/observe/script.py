"""The dashboard's one script, served from the package at
:data:`~synapse_ha.observe.page_kit.SCRIPT` (the Content-Security-Policy allows scripts
from this origin only, never inline ones).

It does two things, and the pages read fully without it:

* rewrites every ``<time data-ms>`` (and SVG ``<text data-ms>``) in the browser's own
  time zone, keeping the ISO-8601 instant as its tooltip;
* on a page whose ``<body>`` has ``data-refresh-s``, fetches the page again that often
  and swaps in the new ``<main>``, so the scroll position stays. It skips a round while
  the tab is hidden or a form control has the focus, and keeps the page as it is when
  the fetch fails or is redirected (a session that ended goes to the sign-in form on
  the next navigation, not under the reader's eyes). ``<body data-refreshed>`` counts
  the swaps, and each swap fires a ``synapse:refreshed`` event on the document (the
  charts page's script, :mod:`synapse_ha.observe.static_files`, redraws on it).
"""

from __future__ import annotations

SCRIPT_JS = """\
"use strict";
(function () {
  var pad = function (n) { return (n < 10 ? "0" : "") + n; };
  function text(ms, fmt) {
    var d = new Date(ms);
    var clock = pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
    if (fmt === "time") { return clock; }
    if (fmt === "hm") { return pad(d.getHours()) + ":" + pad(d.getMinutes()); }
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " + clock;
  }
  function localize(root) {
    root.querySelectorAll("[data-ms]").forEach(function (el) {
      var ms = Number(el.getAttribute("data-ms"));
      if (!ms) { return; }
      el.textContent = text(ms, el.getAttribute("data-fmt"));
      if (el.tagName.toLowerCase() === "time") { el.title = new Date(ms).toISOString(); }
    });
  }
  function busy() {
    var el = document.activeElement;
    return document.hidden || (el && el.closest && el.closest("form") !== null);
  }
  function refresh() {
    if (busy()) { return; }
    fetch(location.href, { credentials: "same-origin", redirect: "manual" })
      .then(function (r) {
        if (r.status !== 200) { throw new Error("status " + r.status); }
        return r.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").querySelector("main");
        var main = document.querySelector("main");
        if (!fresh || !main || busy()) { return; }
        localize(fresh);
        main.replaceWith(fresh);
        var n = Number(document.body.getAttribute("data-refreshed") || 0) + 1;
        document.body.setAttribute("data-refreshed", String(n));
        document.dispatchEvent(new Event("synapse:refreshed"));
      })
      .catch(function () {});
  }
  function start() {
    localize(document);
    var every = Number(document.body.getAttribute("data-refresh-s") || 0);
    if (every > 0) { setInterval(refresh, every * 1000); }
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
"""
