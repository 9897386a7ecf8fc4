// The dashboard page: polls /api/snapshot once a second and /api/history every 5 s (the
// cookie carries the token) and draws them.  No framework and nothing fetched from
// elsewhere: this file is all there is.
"use strict";
const POLL_MS = 1000;
const HISTORY_MS = 5000; // the server fetches the daemon's history at most this often anyway
const SVG = "http://www.w3.org/2000/svg";
const HISTORY = 300; // points of throughput kept (one per poll)
const history = [];
let last = null; // [time ms, tasks ended] of the previous poll

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}
function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + units[i];
}
function secs(s) { return s === null || s === undefined ? "–" : s < 1 ? (s * 1000).toFixed(1) + " ms" : s.toFixed(2) + " s"; }

function drawStates(snap) {
  const cards = document.getElementById("state-cards");
  cards.replaceChildren();
  for (const [state, n] of Object.entries(snap.tasks_by_state)) {
    const card = el("div", undefined, "card");
    const num = el("span", String(n), "n");
    num.id = "state-" + state;
    card.append(num, el("span", state));
    cards.append(card);
  }
  for (const key of ["submitted", "finished", "failed", "cancelled"]) {
    document.getElementById("count-" + key).textContent = String(snap.counters[key] || 0);
  }
}

function drawThroughput(snap) {
  const ended = (snap.counters.finished || 0) + (snap.counters.failed || 0);
  const now = Date.now();
  if (last !== null && now > last[0]) history.push(Math.max(0, (ended - last[1]) * 1000 / (now - last[0])));
  last = [now, ended];
  while (history.length > HISTORY) history.shift();
  const svg = document.getElementById("throughput");
  svg.replaceChildren();
  const top = Math.max(1, ...history);
  const line = document.createElementNS(SVG, "polyline");
  const span = Math.max(history.length, 60) - 1; // the first minute fills the width, then it scrolls
  line.setAttribute("points", history.map((v, i) => `${(i * 600 / span).toFixed(1)},${(118 - v * 112 / top).toFixed(1)}`).join(" "));
  svg.append(line);
  const w = snap.windows[0];
  document.getElementById("throughput-now").textContent =
    `peak on chart ${top.toFixed(1)}/s` + (w ? ` · last ${w.seconds} s: ${w.throughput.toFixed(1)}/s, mean task ${secs(w.mean_seconds)}` : "");
}

function drawWorkers(snap) {
  const body = document.querySelector("#workers tbody");
  body.replaceChildren();
  document.getElementById("worker-count").textContent = `(${snap.workers.length})`;
  for (const w of snap.workers) {
    const row = el("tr");
    const state = w.broken ? "broken: " + w.broken : w.draining ? "draining" : "ok";
    const cpu = w.cpu === null || w.cpu === undefined ? "–" : w.cpu.toFixed(2);
    const memory = bytes(w.memory) + (w.memory_limit ? " / " + bytes(w.memory_limit) : "");
    // The host store it maps (shared with the other workers of its host), or none.
    const store = w.store ? `${bytes(w.store_bytes)} / ${bytes(w.store_capacity)}` : "–";
    for (const v of [w.name, w.host, w.pid, w.processors, w.tasks, w.running, w.queued, w.load.toFixed(2), cpu,
                     memory, store, secs(w.mean_task_seconds), bytes(w.peak_memory), secs(w.last_heard), state]) row.append(el("td", String(v)));
    body.append(row);
  }
}

function drawStore(snap) {
  const s = snap.store;
  document.getElementById("store").textContent = s.capacity === undefined ? "the daemon has no store" :
    `the daemon's: ${bytes(s.data_bytes)} in ${s.objects} objects of ${bytes(s.capacity)} (${bytes(s.in_use)} allocated)`;
  const body = document.querySelector("#stores tbody");
  body.replaceChildren();
  for (const u of snap.stores) {
    const row = el("tr");
    for (const v of [u.name + (u.daemon ? " (daemon)" : ""), `${bytes(u.bytes)} / ${bytes(u.capacity)}`, u.objects,
                     u.workers, u.hosts.join(", ")]) row.append(el("td", String(v)));
    body.append(row);
  }
}

function drawManagers(snap) {
  document.getElementById("managers-section").hidden = !snap.managers.length;
  document.getElementById("manager-count").textContent = `(${snap.managers.length})`;
  const body = document.querySelector("#managers tbody");
  body.replaceChildren();
  for (const g of snap.managers) {
    const row = el("tr");
    const why = [g.pending_reason ? "waiting: " + g.pending_reason : "",
                 g.last_error ? `last error ${g.last_error_ago.toFixed(0)} s ago: ${g.last_error}` : ""].filter(Boolean).join(" · ");
    for (const v of [g.name, g.kind || "–", g.connected ? "yes" : "no", g.requested, g.starting, g.running, g.draining,
                     g.failed, g.max_workers, g.pending_keys, g.infrastructure_ends, g.interrupted_tasks, why || "–"]) {
      row.append(el("td", String(v)));
    }
    body.append(row);
  }
}

function drawFailures(snap) {
  const list = document.getElementById("failures");
  list.replaceChildren();
  for (const f of snap.failures.slice().reverse()) {
    const item = el("li");
    item.append(el("strong", `${f.kind} task ${f.task_id}`), el("span", ` on ${f.where || "?"}, ${f.ago.toFixed(0)} s ago: ${f.cause}`));
    if (f.detail) item.append(el("pre", f.detail));
    list.append(item);
  }
  if (!snap.failures.length) list.append(el("li", "none"));
}

function svgEl(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}

function drawStream(hist) {
  // One row per worker, a bar per run (or per runs merged: the server merges a worker's runs of
  // one status less than 0.3 s apart); times are seconds relative to the server's now (≤ 0).
  // The span: whole minutes back to the oldest bar (at least one, at most the server's window).
  const ROW = 16, LABEL = 140, WIDTH = 900;
  const oldest = Math.max(0, ...hist.bars.map((b) => -b[1]));
  const span = Math.min(hist.stream_seconds, Math.max(60, Math.ceil(oldest / 60) * 60));
  const svg = document.getElementById("stream");
  const height = Math.max(1, hist.workers.length) * ROW + 14;
  svg.setAttribute("viewBox", `0 0 ${WIDTH} ${height}`);
  svg.replaceChildren();
  hist.workers.forEach((name, i) => {
    const label = svgEl("text", { x: 4, y: i * ROW + 12 });
    label.textContent = name.length > 22 ? name.slice(0, 21) + "…" : name;
    svg.append(label);
  });
  const x = (t) => LABEL + (1 + Math.max(-span, Math.min(0, t)) / span) * (WIDTH - LABEL);
  let runs = 0;
  const ok = hist.bars.filter((b) => b[3] === "ok"); // drawn first: the rarer outcomes on top, 2 px at least
  for (const [worker, start, end, status, n] of ok.concat(hist.bars.filter((b) => b[3] !== "ok"))) {
    svg.append(svgEl("rect", { x: x(start).toFixed(1), y: worker * ROW + 2, height: ROW - 4,
      width: Math.max(status === "ok" ? 1 : 2, x(end) - x(start)).toFixed(1), "data-status": status, "data-runs": n,
      class: status === "ok" || status === "error" ? status : "other" }));
    runs += n;
  }
  for (const t of [-span, -span / 2, 0]) {
    const tick = svgEl("text", { x: Math.min(x(t), WIDTH - 30), y: height - 2 });
    tick.textContent = t ? `${+(t / 60).toFixed(1)} min` : "now";
    svg.append(tick);
  }
  document.getElementById("stream-legend").textContent = hist.runs_recorded === false
    ? " · task runs are not recorded (the daemon's history_runs is 0)"
    : ` · ${runs} runs in ${hist.bars.length} bars; ${hist.runs_kept} kept of ${hist.runs_seen} since the start`;
}

function drawMemory(hist) {
  // The most memory in each bucket, as steps; the width spans the last hour (or the run so far).
  const span = Math.max(60, Math.min(hist.series_seconds, hist.uptime));
  const top = Math.max(1, ...hist.series.map((b) => b[1]));
  const x = (t) => ((1 + Math.max(-span, t) / span) * 600).toFixed(1);
  const y = (v) => (118 - v * 100 / top).toFixed(1);
  const points = hist.series.flatMap(([start, memory]) =>
    [`${x(start)},${y(memory)}`, `${x(Math.min(0, start + hist.bucket_seconds))},${y(memory)}`]);
  const svg = document.getElementById("memory");
  svg.replaceChildren(svgEl("polyline", { points: points.join(" "), "data-buckets": hist.series.length }));
  const last = hist.series[hist.series.length - 1];
  document.getElementById("memory-now").textContent = last === undefined ? "no series yet" :
    `peak on chart ${bytes(top)} · latest bucket ${bytes(last[1])} over ${last[2]} worker(s) · buckets of ${hist.bucket_seconds} s`;
}

async function pollHistory() {
  try {
    const reply = await fetch("/api/history", { cache: "no-store", credentials: "same-origin" });
    if (!reply.ok) throw new Error(`${reply.status} ${await reply.text()}`);
    const hist = await reply.json();
    drawStream(hist); drawMemory(hist);
  } catch (err) {
    document.getElementById("stream-legend").textContent = " · no history: " + err.message;
  }
  setTimeout(pollHistory, HISTORY_MS);
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const reply = await fetch("/api/snapshot", { cache: "no-store", credentials: "same-origin" });
    if (!reply.ok) throw new Error(`${reply.status} ${await reply.text()}`);
    const snap = await reply.json();
    drawStates(snap); drawThroughput(snap); drawWorkers(snap); drawStore(snap); drawManagers(snap); drawFailures(snap);
    status.textContent = `up ${snap.uptime.toFixed(0)} s · ${snap.clients.length} client(s) · updated ${new Date().toLocaleTimeString()}`;
    status.className = "";
  } catch (err) {
    status.textContent = "no data: " + err.message;
    status.className = "bad";
  }
  setTimeout(poll, POLL_MS);
}
poll();
pollHistory();
