// The live console: GET / answers one self-contained page (no script,
// style or font from anywhere else) that reads the server's own routes
// every two seconds (/v1/shards, /v1/sinks and /metrics) and shows each
// shard (frontiers, size, the holds on its since, its writers), the
// append rate and mean commit latency as small charts of the last two
// minutes, each shard's appender (queue bytes, records committed, rate,
// commits, and its own commit latency: the median and 99th percentile of
// its last 10 to 20 s, from enqueue to durable and of the commit call
// alone), the memory pools (the server's budget and the pools under it:
// use, peak, capacity) and each sink (status, frontier, lag, the error
// that stopped it or that its destination keeps retrying). The page keeps
// 60 samples per chart: its memory is bounded however long it stays open.
//
// Every value from the server is put in the page as text (textContent),
// never as markup, so a shard or sink name cannot inject anything. The
// page itself holds no data and needs no token; with --token-file its
// reads send the token typed into it (kept in the tab's sessionStorage).
#include "server/console.h"

namespace tidemark {

std::string_view console_page() {
  return R"html(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Tidemark</title>
<link rel="icon" href="data:,">
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1d2430; }
  h1 { font-size: 1.3em; margin: 0 0 .2em; }
  h2 { font-size: 1.05em; margin: 1.4em 0 .4em; }
  table { border-collapse: collapse; min-width: 40em; }
  th, td { text-align: left; padding: .25em .8em .25em 0; border-bottom: 1px solid #e3e6ea;
           vertical-align: top; }
  th { font-weight: 600; color: #566070; }
  td.n { text-align: right; font-variant-numeric: tabular-nums; }
  .muted { color: #7a8494; }
  .failed, .error { color: #b3261e; }
  .running { color: #1b7a3a; }
  #state { margin-left: .6em; }
  #auth { display: none; margin: .8em 0; }
  .charts { display: flex; gap: 2em; flex-wrap: wrap; }
  .chart svg { width: 320px; height: 70px; background: #f6f7f9; display: block; }
  .chart polyline { fill: none; stroke: #2f5fb3; stroke-width: 1.5; }
  .bar { background: #e3e6ea; width: 10em; height: .7em; display: inline-block; }
  .bar span { background: #2f5fb3; height: 100%; display: block; }
</style>
</head>
<body>
<h1>Tidemark <span id="state" class="muted">connecting…</span></h1>
<div class="muted">Refreshed every 2 s from <code>/v1/shards</code>, <code>/v1/sinks</code> and <code>/metrics</code>.
Times are as the shards keep them (milliseconds since 1970 for managed appends).</div>
<form id="auth">This server needs its bearer token:
  <input id="token" type="password" autocomplete="off"> <button>Use</button></form>
<h2>Shards <span id="shard-count" class="muted"></span></h2>
<table id="shards">
  <thead><tr><th>name</th><th>upper</th><th>since</th><th>batches</th><th>parts</th>
  <th>updates</th><th>bytes</th><th>holds on the since</th><th>writers</th></tr></thead>
  <tbody></tbody>
</table>
<h2>Appends</h2>
<div class="charts">
  <div class="chart"><div>records appended per second: <b id="rate-now">–</b></div>
    <svg id="rate-chart" viewBox="0 0 60 100" preserveAspectRatio="none"><polyline></polyline></svg></div>
  <div class="chart"><div>mean commit latency: <b id="latency-now">–</b></div>
    <svg id="latency-chart" viewBox="0 0 60 100" preserveAspectRatio="none"><polyline></polyline></svg></div>
</div>
<table id="appenders">
  <thead><tr><th>shard</th><th>queue bytes</th><th>records committed</th><th>records/s</th>
  <th>commits</th>
  <th title="From a record's enqueue to its commit being durable, over the last 10 to 20 s">commit latency p50 / p99</th>
  <th title="The commit's compare_and_append call alone, over the last 10 to 20 s">commit call p50 / p99</th></tr></thead>
  <tbody></tbody>
</table>
<h2>Memory pools</h2>
<table id="pools">
  <thead><tr><th>pool</th><th>used</th><th>peak</th><th>capacity</th><th></th></tr></thead>
  <tbody></tbody>
</table>
<h2>Sinks <span id="sink-count" class="muted"></span></h2>
<table id="sinks">
  <thead><tr><th>name</th><th>shard</th><th>to</th><th>status</th><th>runner</th>
  <th>frontier</th><th>lag</th><th>error</th></tr></thead>
  <tbody></tbody>
</table>
<script>
"use strict";
const token = () => sessionStorage.getItem("tidemark-token");
document.getElementById("auth").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem("tidemark-token", document.getElementById("token").value);
  refresh();
});

async function read(path, asText) {
  const headers = token() ? { Authorization: "Bearer " + token() } : {};
  const answer = await fetch(path, { headers, cache: "no-store" });
  if (answer.status === 401) {
    document.getElementById("auth").style.display = "block";
    throw new Error("the server wants its token");
  }
  if (!answer.ok) throw new Error(path + ": HTTP " + answer.status);
  return asText ? answer.text() : answer.json();
}

// Prometheus text: name -> [{labels, value}].
function parseMetrics(text) {
  const out = new Map();
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$/.exec(line);
    if (!m) continue;
    const labels = {};
    for (const pair of (m[3] || "").matchAll(/([a-zA-Z_]+)="((?:[^"\\]|\\.)*)"/g)) {
      labels[pair[1]] = pair[2];
    }
    if (!out.has(m[1])) out.set(m[1], []);
    out.get(m[1]).push({ labels, value: Number(m[4]) });
  }
  return out;
}

const sum = (metrics, name) => (metrics.get(name) || []).reduce((a, s) => a + s.value, 0);
const byShard = (metrics, name) =>
  new Map((metrics.get(name) || []).map((s) => [s.labels.shard, s.value]));
// A summary's median and 99th percentile by shard, as "p50 / p99 ms"
// (absent when the shard's appender had no commit lately).
function quantiles(metrics, name) {
  const out = new Map();
  for (const s of metrics.get(name) || []) {
    if (s.labels.quantile !== "0.5" && s.labels.quantile !== "0.99") continue;
    if (!out.has(s.labels.shard)) out.set(s.labels.shard, {});
    out.get(s.labels.shard)[s.labels.quantile] = s.value;
  }
  const text = new Map();
  for (const [shard, q] of out) {
    if (q["0.5"] === undefined || q["0.99"] === undefined) continue;
    text.set(shard, (1000 * q["0.5"]).toFixed(2) + " / " + (1000 * q["0.99"]).toFixed(2) + " ms");
  }
  return text;
}

// The last 60 samples of each chart, and the previous reading to diff.
const history = { rate: [], latency: [] };
let previous = null;

function plot(id, values) {
  const max = Math.max(...values, 1e-9);
  const points = values.map((v, i) => (i + 60 - values.length) + "," + (100 - 95 * v / max));
  document.querySelector("#" + id + " polyline").setAttribute("points", points.join(" "));
}

function remember(series, value) {
  series.push(value);
  if (series.length > 60) series.shift();
}

function showMetrics(metrics) {
  const now = performance.now();
  const records = byShard(metrics, "tidemark_appender_records_committed_total");
  const commits = byShard(metrics, "tidemark_appender_commits_total");
  const queue = byShard(metrics, "tidemark_appender_queue_bytes");
  const waits = quantiles(metrics, "tidemark_appender_commit_latency_seconds");
  const calls = quantiles(metrics, "tidemark_appender_commit_call_seconds");
  const latencySum = sum(metrics, "tidemark_append_commit_seconds_sum");
  const latencyCount = sum(metrics, "tidemark_append_commit_seconds_count");
  const rates = new Map();
  if (previous) {
    const seconds = (now - previous.at) / 1000;
    let total = 0;
    for (const [shard, n] of records) {
      const rate = Math.max(0, n - (previous.records.get(shard) || 0)) / seconds;
      rates.set(shard, rate);
      total += rate;
    }
    const count = latencyCount - previous.latencyCount;
    const latency = count > 0 ? 1000 * (latencySum - previous.latencySum) / count : 0;
    remember(history.rate, total);
    remember(history.latency, latency);
    document.getElementById("rate-now").textContent = total.toFixed(1);
    document.getElementById("latency-now").textContent =
      count > 0 ? latency.toFixed(2) + " ms" : "no commits";
    plot("rate-chart", history.rate);
    plot("latency-chart", history.latency);
  }
  previous = { at: now, records, latencySum, latencyCount };
  fill("appenders", [...records.keys()].sort(), (row, shard) => {
    cell(row, shard);
    cell(row, queue.get(shard) || 0, "n");
    cell(row, records.get(shard), "n");
    cell(row, rates.has(shard) ? rates.get(shard).toFixed(1) : null, "n");
    cell(row, commits.get(shard), "n");
    cell(row, waits.get(shard), "n");
    cell(row, calls.get(shard), "n");
  });
  const pools = new Map();
  for (const [name, field] of [["tidemark_pool_used_bytes", "used"],
                               ["tidemark_pool_peak_bytes", "peak"],
                               ["tidemark_pool_capacity_bytes", "capacity"]]) {
    for (const s of metrics.get(name) || []) {
      if (!pools.has(s.labels.pool)) pools.set(s.labels.pool, {});
      pools.get(s.labels.pool)[field] = s.value;
    }
  }
  // "server" is the whole budget; the others are drawn from it.
  const names = [...pools.keys()].sort((a, b) => (a === "server" ? -1 : b === "server" ? 1 : 0));
  fill("pools", names, (row, name) => {
    const p = pools.get(name);
    cell(row, name === "server" ? name : "\u2514 " + name);
    cell(row, p.used, "n");
    cell(row, p.peak, "n");
    cell(row, p.capacity, "n");
    const bar = document.createElement("div");
    bar.className = "bar";
    const fillPart = document.createElement("span");
    fillPart.style.width = (p.capacity ? Math.min(100, 100 * p.used / p.capacity) : 0) + "%";
    bar.appendChild(fillPart);
    row.insertCell().appendChild(bar);
  });
}

function cell(row, value, className) {
  const td = row.insertCell();
  td.textContent = value === null || value === undefined ? "–" : String(value);
  if (className) td.className = className;
  return td;
}

function fill(tableId, items, render) {
  const body = document.querySelector("#" + tableId + " tbody");
  const rows = document.createDocumentFragment();
  for (const item of items) {
    const row = document.createElement("tr");
    render(row, item);
    rows.appendChild(row);
  }
  body.replaceChildren(rows);
}

function holds(shard) {
  return (shard.readers || []).map((r) =>
    r.id + " at " + (r.since === null ? "closed" : r.since) + (r.critical ? " (critical)" : "")
  ).join(", ") || "none";
}

async function refresh() {
  const state = document.getElementById("state");
  try {
    const [shards, sinks, metrics] = await Promise.all(
      [read("/v1/shards"), read("/v1/sinks"), read("/metrics", true)]);
    showMetrics(parseMetrics(metrics));
    document.getElementById("auth").style.display = "none";
    document.getElementById("shard-count").textContent = "(" + shards.length + ")";
    document.getElementById("sink-count").textContent = "(" + sinks.length + ")";
    fill("shards", shards, (row, s) => {
      cell(row, s.name);
      cell(row, s.upper === null ? "closed" : s.upper, "n");
      cell(row, s.since === null ? "closed" : s.since, "n");
      cell(row, s.batches, "n");
      cell(row, s.parts, "n");
      cell(row, s.updates, "n");
      cell(row, s.bytes, "n");
      cell(row, holds(s));
      cell(row, (s.writers || []).length, "n");
    });
    fill("sinks", sinks, (row, k) => {
      cell(row, k.name);
      cell(row, k.shard);
      cell(row, k.to);
      cell(row, k.status, k.status);
      cell(row, k.runner === null ? "none" : k.runner, k.runner === null ? "muted" : "");
      cell(row, k.frontier, "n");
      cell(row, k.lag, "n");
      cell(row, k.error, k.error ? "error" : "muted");
    });
    state.textContent = "updated " + new Date().toLocaleTimeString();
    state.className = "muted";
  } catch (e) {
    state.textContent = "cannot read the server: " + e.message;
    state.className = "error";
  }
}

refresh();
setInterval(refresh, 2000);
</script>
</body>
</html>
)html";
}

}  // namespace tidemark
