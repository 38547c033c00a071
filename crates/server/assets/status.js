// The status page: polls /api/status about once a second and renders it.
// Everything is written with textContent, never as HTML, since gate
// reasons, errors and holders are free text.
"use strict";

const POLL_MS = 1000;
const REQUEST_TIMEOUT_MS = 5000;
const TOKEN_KEY = "leasehold.status.token";

const $ = (id) => document.getElementById(id);
let refreshes = 0;

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function cell(row, field, text, className) {
  const td = el("td", text, className);
  td.dataset.field = field;
  row.appendChild(td);
  return td;
}

function duration(ms) {
  if (ms === null || ms === undefined) return "–";
  if (ms < 1000) return ms + " ms";
  const s = ms / 1000;
  if (s < 60) return s.toFixed(1) + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + Math.floor(s % 60) + " s";
  return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
}

function clock(ms) {
  if (!ms) return "–";
  return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

// "12:00:05 UTC (3.0 s ago)" or "(in 0.4 s)", relative to cluster time.
function moment(ms, now) {
  if (!ms) return "–";
  const delta = ms - now;
  const rel = delta >= 0 ? "in " + duration(delta) : duration(-delta) + " ago";
  return clock(ms).slice(11) + " (" + rel + ")";
}

function fill(tableId, rows, columns, render) {
  const body = $(tableId).tBodies[0];
  const fresh = document.createElement("tbody");
  if (rows.length === 0) {
    const tr = el("tr");
    const td = el("td", "none", "empty");
    td.colSpan = columns;
    tr.appendChild(td);
    fresh.appendChild(tr);
  }
  for (const row of rows) fresh.appendChild(render(row));
  body.replaceWith(fresh);
}

function render(status) {
  const now = status.cluster_time_ms;
  $("leader").textContent = status.leader === null ? "none" : "node " + status.leader;
  $("answering").textContent = "node " + status.node_id;
  $("cluster-time").textContent = clock(now);

  fill("members", status.nodes, 9, (node) => {
    const tr = el("tr");
    tr.dataset.nodeId = node.id;
    cell(tr, "id", node.id);
    cell(tr, "role", node.role, "role-" + node.role);
    cell(tr, "term", node.term, "num");
    cell(tr, "applied_index", node.applied_index, "num");
    const ready = node.ready ? "ready" : !node.reachable ? "unreachable" : "not ready";
    const td = cell(tr, "ready", ready, node.ready ? "ok" : "bad");
    if (node.not_ready.length) td.title = node.not_ready.join("\n");
    if (!node.ready && node.not_ready.length) td.appendChild(el("div", node.not_ready.join("; "), "muted"));
    cell(tr, "advert_age", node.advert_age_ms === null ? "this node" : duration(node.advert_age_ms), "num");
    cell(tr, "gate_path", node.gate ? node.gate.path : "–", node.gate && node.gate.path === "journal" ? "ok" : "warn");
    cell(tr, "gate_reason", node.gate ? node.gate.reason : "–");
    cell(tr, "addr", node.addr, "mono muted");
    return tr;
  });

  const shown = $("queues-shown");
  shown.hidden = !(status.queue_count > status.queues.length);
  shown.textContent = "the " + status.queues.length + " queues holding the most jobs, of " + status.queue_count;
  fill("queues", status.queues, 7, (queue) => {
    const tr = el("tr");
    tr.dataset.queue = queue.queue;
    cell(tr, "queue", queue.queue, "mono");
    for (const field of ["ready", "delayed", "claimed", "dead", "acked"]) {
      cell(tr, field, queue[field], "num" + (field === "dead" && queue.dead > 0 ? " bad" : ""));
    }
    cell(tr, "oldest_ready", duration(queue.oldest_ready_age_ms));
    return tr;
  });

  fill("schedules", status.schedules, 8, (schedule) => {
    const tr = el("tr");
    tr.dataset.schedule = schedule.name;
    cell(tr, "name", schedule.name + (schedule.paused ? " (paused)" : ""), "mono");
    cell(tr, "cron", schedule.cron + (schedule.timezone ? " " + schedule.timezone : ""), "mono");
    cell(tr, "next_tick", moment(schedule.next_tick_ms, now));
    const last = cell(tr, "last_fired", moment(schedule.last_fired_ms, now));
    if (schedule.last_fired_ms) last.dataset.ms = schedule.last_fired_ms;
    cell(tr, "expected", schedule.expected === null ? "–" : schedule.expected, "num");
    cell(tr, "fired", schedule.fired, "num");
    cell(tr, "skipped", schedule.skipped, "num" + (schedule.skipped > 0 ? " warn" : ""));
    const skips = schedule.skips.map((s) => s.reason + (s.ticks > 1 ? " ×" + s.ticks : "") + " at " + clock(s.bucket_ms).slice(11, 19));
    cell(tr, "skips", skips.length ? skips.join(", ") : "–");
    return tr;
  });

  fill("expiries", status.recent_expiries, 5, (e) => {
    const tr = el("tr");
    tr.dataset.jobId = e.job_id;
    cell(tr, "job_id", e.job_id, "num");
    cell(tr, "queue", e.queue, "mono");
    cell(tr, "attempts", e.attempts, "num");
    cell(tr, "state", e.state === "claimed" ? "redelivered" : e.state, e.state === "dead" ? "bad" : "");
    cell(tr, "expired_at", e.expired_at_ms === null ? "–" : moment(e.expired_at_ms, now));
    return tr;
  });

  fill("redeliveries", status.recent_redeliveries, 6, (r) => {
    const tr = el("tr");
    tr.dataset.jobId = r.job_id;
    cell(tr, "job_id", r.job_id, "num");
    cell(tr, "queue", r.queue, "mono");
    cell(tr, "delivery", r.delivery, "num");
    cell(tr, "holder", r.holder, "mono");
    cell(tr, "granted_at", moment(r.granted_at_ms, now));
    cell(tr, "last_error", r.last_error);
    return tr;
  });

  refreshes += 1;
  const updated = $("updated");
  updated.textContent = new Date().toISOString().slice(11, 19) + " UTC";
  updated.dataset.refreshes = refreshes;
}

function showProblem(text) {
  const problem = $("problem");
  problem.textContent = text;
  problem.hidden = !text;
}

// True while the page waits for a token: a refused request is not
// repeated every second (each would be counted and logged as a refusal);
// the next poll is the form's submit.
let waitingForToken = false;

async function poll() {
  const headers = { "Accept": "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers["Authorization"] = "Bearer " + token;
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), REQUEST_TIMEOUT_MS);
  try {
    const reply = await fetch("/api/status", { headers, cache: "no-store", signal: abort.signal });
    let body = null;
    try { body = await reply.json(); } catch (_) { body = null; }
    if (reply.status === 401 || reply.status === 403) {
      $("token-form").hidden = false;
      showProblem((body && body.error) || "the node refused the token (" + reply.status + ")");
      waitingForToken = true;
    } else if (!reply.ok) {
      showProblem((body && body.error) || "the node answered " + reply.status);
    } else {
      $("token-form").hidden = true;
      showProblem("");
      render(body);
    }
  } catch (error) {
    showProblem("no answer from the node: " + error.message + " (showing the last data)");
  } finally {
    clearTimeout(timer);
    if (!waitingForToken) setTimeout(poll, POLL_MS);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $("token").value.trim();
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    $("token").value = "";
    if (waitingForToken) {
      waitingForToken = false;
      poll();
    }
  });
  poll();
});
