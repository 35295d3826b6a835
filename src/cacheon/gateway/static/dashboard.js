// The Cacheon gateway dashboard: polls ./dashboard/state (admin token as a bearer header) and draws
// the workers, two plain-SVG charts and the recent refusals. No framework, no network but this gateway.
"use strict";

const POLL_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);

function takeToken() {
  const match = location.hash.match(/token=([^&]+)/);
  if (match) {
    sessionStorage.setItem("cacheon-admin-token", decodeURIComponent(match[1]));
    history.replaceState(null, "", location.pathname + location.search);  // the token leaves the URL bar
  }
  return sessionStorage.getItem("cacheon-admin-token");
}

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);  // never markup from the state
  if (cls) node.className = cls;
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

function ago(now, then) {
  if (!then) return "";
  const s = Math.max(0, now - then);
  if (s < 90) return `${s.toFixed(0)} s ago`;
  if (s < 5400) return `${(s / 60).toFixed(0)} min ago`;
  return `${(s / 3600).toFixed(1)} h ago`;
}

function clock(epoch) {
  return new Date(epoch * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z";
}

function seconds(s) {
  if (s === null) return "+Inf";
  return s < 1 ? `${(s * 1000).toFixed(s < 0.01 ? 1 : 0)} ms` : `${s} s`;
}

function workers(state) {
  const body = $("workers").tBodies[0];
  body.replaceChildren();
  for (const w of state.workers) {
    const row = el("tr");
    row.dataset.worker = w.id;
    const ladder = w.draining ? "DRAINING" : w.ladder.state;
    const p = w.precision;
    row.append(
      el("td", w.id, "id"),
      el("td", ladder, `state state-${w.ladder.state}${w.draining ? " draining" : ""}`),
      el("td", [w.ladder.reason, w.ladder.detail].filter(Boolean).join(": "), "reason"),
      el("td", ago(state.now, w.ladder.since), "since"),
      el("td", w.contract ?? "—", "contract"),
      el("td", w.model ?? "—"),
      el("td", w.page_size ?? "—", "page"),
      el("td", w.indexed_blocks, "blocks"),
      el("td", w.index_digest ?? "—", "digest"),
      el("td", p.scored ? `${(100 * p.exact_ratio).toFixed(1)}% exact of ${p.scored}` : "not scored yet", "precision"),
      el("td", w.in_flight, "in-flight"),
      el("td", w.breaker_open ? "open" : "closed", w.breaker_open ? "breaker open" : "breaker closed"),
      el("td", w.healthy ? "up" : "down", w.healthy ? "up" : "down"),
    );
    body.append(row);
  }
}

function axes(chart, top) {
  chart.append(svg("line", {x1: 40, y1: 120, x2: 475, y2: 120, class: "axis"}),
               svg("line", {x1: 40, y1: 10, x2: 40, y2: 120, class: "axis"}),
               svg("text", {x: 36, y: 16, "text-anchor": "end"}, top),
               svg("text", {x: 36, y: 123, "text-anchor": "end"}, "0"));
}

function rate(state) {
  const chart = $("rate");
  chart.replaceChildren();
  const points = state.rate;
  const peak = Math.max(1, ...points.map((p) => p.requests_per_s));
  axes(chart, peak.toFixed(peak < 10 ? 1 : 0));
  // the x axis spans what has been sampled, up to the window: it fills as the gateway runs
  const span = Math.max(state.interval_s, Math.min(state.window_s, state.now - state.since));
  chart.append(svg("text", {x: 44, y: 135}, `${ago(state.now, state.now - span).replace(" ago", "")} ago`),
               svg("text", {x: 475, y: 135, "text-anchor": "end"}, "now"));
  const x = (at) => 40 + 435 * Math.max(0, 1 - (state.now - at) / span);
  const y = (v) => 120 - 110 * (v / peak);
  for (const [key, cls] of [["requests_per_s", "series"], ["refusals_per_s", "refused"]]) {
    if (points.length) {
      chart.append(svg("polyline", {class: cls, points: points.map((p) => `${x(p.at).toFixed(1)},${y(p[key]).toFixed(1)}`).join(" ")}));
    }
  }
  const last = points[points.length - 1];
  $("rate-now").textContent = last ? `(now ${last.requests_per_s.toFixed(2)}/s, refused ${last.refusals_per_s.toFixed(2)}/s)` : "";
}

function latency(state) {
  const chart = $("latency");
  chart.replaceChildren();
  const bars = state.latency;
  const total = bars.reduce((n, b) => n + b.count, 0);
  const peak = Math.max(1, ...bars.map((b) => b.count));
  axes(chart, String(peak));
  const width = 435 / bars.length;
  bars.forEach((b, i) => {
    const h = 110 * (b.count / peak);
    const bar = svg("rect", {class: "bar", x: 41 + i * width, y: 120 - h, width: width - 2, height: h});
    bar.append(svg("title", {}, `≤ ${seconds(b.le)}: ${b.count}`));
    chart.append(bar);
    if (i % 3 === 0) chart.append(svg("text", {x: 41 + i * width, y: 132}, seconds(b.le)));
  });
  $("latency-n").textContent = `(${total} requests since ${clock(state.since)})`;
}

function refusals(state) {
  const body = $("refusals").tBodies[0];
  body.replaceChildren();
  if (!state.refusals.length) {
    const none = el("tr");
    none.append(el("td", "none recorded", "muted"));
    body.append(none);
  }
  for (const r of state.refusals) {
    const row = el("tr");
    row.append(el("td", clock(r.at)), el("td", r.request_id, "request-id"), el("td", r.reason),
               el("td", r.status), el("td", r.endpoint), el("td", r.model ?? "—"));
    body.append(row);
  }
}

async function poll() {
  const token = takeToken();
  try {
    const answer = await fetch("dashboard/state", {headers: token ? {Authorization: `Bearer ${token}`} : {},
                                                  cache: "no-store"});
    if (answer.status === 401) {
      $("board").hidden = true;
      $("login").hidden = false;
      $("login-why").textContent = token ? "that token was refused" : "";
      $("updated").textContent = "the admin token is needed";
      return;
    }
    const state = await answer.json();
    $("login").hidden = true;
    $("board").hidden = false;
    $("policy").textContent = `policy ${state.policy}, ${state.workers.length} worker(s)`;
    workers(state);
    rate(state);
    latency(state);
    refusals(state);
    $("updated").textContent = `updated ${clock(state.now)}`;
    document.body.dataset.updated = String(state.now);
  } catch (err) {
    $("updated").textContent = `cannot reach the gateway (${err})`;
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem("cacheon-admin-token", $("token").value);
  });
  poll();
});
