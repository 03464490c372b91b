// The live console: GET / answers one self-contained page (no script,
// style or font from anywhere else) that reads the server's own JSON
// routes every two seconds and shows each shard (frontiers, size, the
// holds on its since, its writers) and each sink (status, frontier, lag,
// the error that stopped it or that its destination keeps retrying).
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
</style>
</head>
<body>
<h1>Tidemark <span id="state" class="muted">connecting…</span></h1>
<div class="muted">Refreshed every 2 s from <code>/v1/shards</code> and <code>/v1/sinks</code>.
Times are as the shards keep them (milliseconds since 1970 for managed appends).</div>
<form id="auth">This server needs its bearer token:
  <input id="token" type="password" autocomplete="off"> <button>Use</button></form>
<h2>Shards <span id="shard-count" class="muted"></span></h2>
<table id="shards">
  <thead><tr><th>name</th><th>upper</th><th>since</th><th>batches</th><th>parts</th>
  <th>updates</th><th>bytes</th><th>holds on the since</th><th>writers</th></tr></thead>
  <tbody></tbody>
</table>
<h2>Sinks <span id="sink-count" class="muted"></span></h2>
<table id="sinks">
  <thead><tr><th>name</th><th>shard</th><th>to</th><th>status</th><th>frontier</th>
  <th>lag</th><th>error</th></tr></thead>
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

async function read(path) {
  const headers = token() ? { Authorization: "Bearer " + token() } : {};
  const answer = await fetch(path, { headers, cache: "no-store" });
  if (answer.status === 401) {
    document.getElementById("auth").style.display = "block";
    throw new Error("the server wants its token");
  }
  if (!answer.ok) throw new Error(path + ": HTTP " + answer.status);
  return answer.json();
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
    const [shards, sinks] = await Promise.all([read("/v1/shards"), read("/v1/sinks")]);
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
