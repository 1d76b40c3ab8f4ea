"use strict";
// The dashboard's charts page: draws the series the page carries in
// <script type="application/json" id="chart-data"> (data, never run) with uPlot, on time
// axes in the browser's own zone. Redrawn when the page's script swaps in a fresh <main>
// (the "synapse:refreshed" event). Each drawn chart's element gets data-points (how
// many buckets it drew) and data-series (its series' labels).
(function () {
  var charts = [];
  var PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                 "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"];
  var pad = function (n) { return (n < 10 ? "0" : "") + n; };

  function duration(s) {
    if (s === null || s === undefined) { return "-"; }
    s = Math.round(s);
    if (s < 60) { return s + "s"; }
    var m = Math.floor(s / 60);
    if (m < 60) { return m + "m" + pad(s % 60) + "s"; }
    var h = Math.floor(m / 60);
    if (h < 48) { return h + "h" + pad(m % 60) + "m"; }
    return Math.floor(h / 24) + "d" + pad(h % 24) + "h";
  }

  function day(d) {
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate());
  }

  function clock(d) { return pad(d.getHours()) + ":" + pad(d.getMinutes()); }

  // The time axis: 24-hour times in the browser's zone, the date under the first tick of
  // each day; the legend: the bucket's start, date and time.
  var TIME_AXIS = {
    values: function (u, splits) {
      var shown = null;
      return splits.map(function (s) {
        var d = new Date(s * 1000);
        var label = day(d) !== shown ? clock(d) + "\n" + day(d) : clock(d);
        shown = day(d);
        return label;
      });
    },
  };
  var TIME_SERIES = {
    value: function (u, s) {
      if (s === null || s === undefined) { return "--"; }
      var d = new Date(s * 1000);
      return day(d) + " " + clock(d);
    },
  };
  var WAIT_STEPS = [1, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800,
                    21600, 43200, 86400, 172800, 604800];

  function width(el) {
    var room = el.parentNode ? el.parentNode.clientWidth : 0;
    return Math.max(360, Math.min(1200, (room || 900) - 20));
  }

  function stepped() {
    return uPlot.paths && uPlot.paths.stepped ? uPlot.paths.stepped({ align: 1 }) : undefined;
  }

  function gpuChart(el, data, x) {
    var gpus = function (u, v) { return v === null || v === undefined ? "-" : v.toFixed(1); };
    return new uPlot({
      width: width(el),
      height: 260,
      scales: {
        x: { time: true },
        y: { range: function (u, lo, hi) { return [0, Math.max(1, Math.ceil(hi * 1.1))]; } },
      },
      series: [
        TIME_SERIES,
        { label: "GPUs allocated", stroke: "#1a8a5a", fill: "rgba(26,138,90,0.15)",
          width: 2, paths: stepped(), points: { show: false }, value: gpus },
        { label: "GPUs pending", stroke: "#d07000", width: 2, dash: [6, 4],
          paths: stepped(), points: { show: false }, value: gpus },
      ],
      axes: [TIME_AXIS, { label: "GPUs" }],
    }, [x, data.allocated, data.pending], el);
  }

  function waitChart(el, data, x) {
    var queues = Object.keys(data.wait_s).sort();
    var series = [TIME_SERIES];
    var columns = [x];
    queues.forEach(function (q, i) {
      series.push({
        label: q,
        stroke: PALETTE[i % PALETTE.length],
        width: 2,
        points: { show: true, size: 6 },
        value: function (u, v) { return duration(v); },
      });
      columns.push(data.wait_s[q]);
    });
    return new uPlot({
      width: width(el),
      height: 260,
      scales: {
        x: { time: true },
        y: { range: function (u, lo, hi) { return [0, Math.max(60, (hi || 0) * 1.1)]; } },
      },
      series: series,
      axes: [TIME_AXIS, {
        label: "wait",
        size: 70,
        incrs: WAIT_STEPS,
        values: function (u, ticks) { return ticks.map(duration); },
      }],
    }, columns, el);
  }

  function mark(el, chart, labels) {
    el.setAttribute("data-points", String(chart.data[0].length));
    el.setAttribute("data-series", labels.join(","));
  }

  function draw() {
    charts.forEach(function (chart) { chart.destroy(); });
    charts = [];
    var source = document.getElementById("chart-data");
    if (!source || typeof uPlot === "undefined") { return; }
    var data = JSON.parse(source.textContent);
    var x = data.times_ms.map(function (ms) { return ms / 1000; });
    var gpus = document.getElementById("chart-gpus");
    if (gpus) {
      var g = gpuChart(gpus, data, x);
      mark(gpus, g, ["allocated", "pending"]);
      charts.push(g);
    }
    var wait = document.getElementById("chart-wait");
    if (wait && Object.keys(data.wait_s).length) {
      var w = waitChart(wait, data, x);
      mark(wait, w, Object.keys(data.wait_s).sort());
      charts.push(w);
    }
    document.body.setAttribute("data-charts", String(charts.length));
  }

  document.addEventListener("synapse:refreshed", draw);
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", draw);
  } else {
    draw();
  }
})();
