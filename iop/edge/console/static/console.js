// The IOP live console: polls /status every 2 s and reads /events (Server-Sent Events) with
// fetch(), so that the admin bearer token, when the listener requires one, rides an
// Authorization header (EventSource cannot send one). The token is asked for on the first 401
// and kept in this tab's sessionStorage only. Everything is drawn with DOM calls and
// textContent: no data is ever parsed as HTML.
"use strict";

(() => {
  const TOKEN_KEY = "iop-admin-token";
  const POLL_MS = 2000;
  const RECONNECT_MS = 2000;
  const RENDER_MS = 250;
  const HISTORY_SEC = 300;
  const BUCKET_SEC = 10;
  const RATE_WINDOW_SEC = 60;
  const KEEP_REQUESTS = 50;
  const KEEP_NODE_EVENTS = 20;
  const KEEP_WINDOW = 20000;
  const SVG = "http://www.w3.org/2000/svg";

  const state = {
    status: null,
    connectedSince: {},      // node id -> Edge time (s) it became ready
    totals: {},              // model -> {requests, errors} since the Edge started
    lastErrors: {models: {}, providers: {}},  // -> {at, status, code, ...} of the last error
    requests: [],            // the last requests, oldest first
    window: [],              // every request of the last HISTORY_SEC, for the rates
    nodeEvents: [],          // the last node events, oldest first
    inflight: {},            // "node/provider" -> [[browser time (s), in_flight]]
    skew: 0,                 // browser clock - Edge clock (s), from live events
    stream: "connecting",
    needToken: false,
  };

  const $ = (id) => document.getElementById(id);
  const now = () => Date.now() / 1000;
  const token = () => sessionStorage.getItem(TOKEN_KEY) || "";

  function headers() {
    const t = token();
    return t ? {Authorization: "Bearer " + t} : {};
  }

  function el(tag, text, attrs) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    return node;
  }

  function cell(field, text, cls) {
    const td = el("td", text, {"data-field": field});
    if (cls) td.className = cls;
    return td;
  }

  function isError(r) {
    return r.outcome === "error" || r.outcome === "refused" || (r.status || 0) >= 400;
  }

  function seconds(value) {
    if (value === null || value === undefined) return "";
    return value < 1 ? Math.round(value * 1000) + " ms" : value.toFixed(2) + " s";
  }

  function clock(at) {
    return new Date((at + state.skew) * 1000).toLocaleTimeString();
  }

  function ago(at) {
    const s = Math.max(0, Math.round(now() - (at + state.skew)));
    if (s < 60) return s + "s ago";
    if (s < 3600) return Math.floor(s / 60) + "m ago";
    return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m ago";
  }

  // -- auth -----------------------------------------------------------------------------------

  function askToken(message) {
    state.needToken = true;
    setStream("unauthorized");
    $("auth-message").textContent = message;
    $("auth").hidden = false;
    $("auth-token").focus();
  }

  $("auth").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("auth-token").value.trim());
    $("auth-token").value = "";
    $("auth").hidden = true;
    state.needToken = false;
    poll();
    connect();
  });

  function unauthorized(response) {
    askToken(token()
      ? "The admin token was refused; enter it again."
      : "This admin listener requires its bearer token (admin.auth).");
    return response;
  }

  // -- /status --------------------------------------------------------------------------------

  async function poll() {
    if (state.needToken) return;
    try {
      const r = await fetch("/status", {headers: headers(), cache: "no-store"});
      if (r.status === 401) return unauthorized(r);
      if (!r.ok) throw new Error("status " + r.status);
      state.status = await r.json();
      sample();
      $("updated").textContent = "updated " + new Date().toLocaleTimeString();
      render();
    } catch (e) {
      $("updated").textContent = "status unavailable (" + e.message + ")";
    }
  }

  // -- /limits: each limited key's standing (503: this Edge counts none) ------------------------

  async function pollLimits() {
    if (state.needToken) return;
    try {
      const r = await fetch("/limits", {headers: headers(), cache: "no-store"});
      if (r.status === 401) return unauthorized(r);
      state.limits = r.ok ? (await r.json()).keys : null;
    } catch (e) {
      state.limits = null;
    }
    renderKeys();
  }

  function sample() {
    const t = now();
    for (const p of state.status.providers || []) {
      const key = p.node_id + "/" + p.id;
      const series = state.inflight[key] || (state.inflight[key] = []);
      series.push([t, p.in_flight]);
      while (series.length && series[0][0] < t - HISTORY_SEC) series.shift();
    }
  }

  // -- /events --------------------------------------------------------------------------------

  function setStream(value) {
    state.stream = value;
    document.body.dataset.stream = value;
    $("stream-state").dataset.state = value;
    $("stream-state").textContent = {
      connecting: "connecting", live: "live", reconnecting: "reconnecting",
      unauthorized: "token required",
    }[value] || value;
  }

  let streamId = 0;

  async function connect() {
    const id = ++streamId;
    if (state.needToken) return;
    try {
      const r = await fetch("/events", {headers: headers(), cache: "no-store"});
      if (r.status === 401) return unauthorized(r);
      if (!r.ok || !r.body) throw new Error("events " + r.status);
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const {done, value} = await reader.read();
        if (done || id !== streamId) break;
        buffer += decoder.decode(value, {stream: true}).replace(/\r\n?/g, "\n");
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          dispatch(buffer.slice(0, end));
          buffer = buffer.slice(end + 2);
        }
      }
    } catch (e) {
      // Reconnect below.
    }
    if (id !== streamId || state.needToken) return;
    setStream("reconnecting");
    setTimeout(() => { if (id === streamId) connect(); }, RECONNECT_MS);
  }

  function dispatch(block) {
    let name = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "event") name = value;
      else if (field === "data") data.push(value);
    }
    if (!data.length) return;
    const payload = JSON.parse(data.join("\n"));
    if (name === "snapshot") {
      // Live from the stream's first event on: the page has the Edge's recent past.
      onSnapshot(payload);
      setStream("live");
      return render();
    }
    else if (name === "request") onRequest(payload);
    else if (name === "node") onNode(payload);
    else if (name === "dropped") $("updated").textContent =
      payload.dropped + " events dropped (this console fell behind)";
    scheduleRender();
  }

  // Events can come faster than a page should redraw: at most one redraw per RENDER_MS.
  let renderTimer = null;
  function scheduleRender() {
    if (renderTimer !== null) return;
    renderTimer = setTimeout(() => { renderTimer = null; render(); }, RENDER_MS);
  }

  function onSnapshot(s) {
    state.connectedSince = s.connected_since || {};
    state.totals = s.models || {};
    const last = s.last_errors || {};
    state.lastErrors = {models: last.models || {}, providers: last.providers || {}};
    state.requests = (s.requests || []).slice(-KEEP_REQUESTS);
    state.window = state.requests.slice();
    state.nodeEvents = (s.node_events || []).slice(-KEEP_NODE_EVENTS);
  }

  function onRequest(r) {
    if (r.at) state.skew = now() - r.at;
    const totals = state.totals[r.model] || (state.totals[r.model] = {requests: 0, errors: 0});
    totals.requests += 1;
    if (isError(r)) {
      totals.errors += 1;
      // As the Edge's memory words it (payload.error_reason): the code, else how it ended,
      // else "upstream" (the provider's own error answer, relayed).
      const ended = r.outcome && r.outcome !== "complete" ? r.outcome : "upstream";
      const reason = {at: r.at, status: r.status || 0, code: r.error_code || ended,
        model: r.model, provider_id: r.provider_id, node_id: r.node_id};
      state.lastErrors.models[r.model] = reason;
      if (r.provider_id) state.lastErrors.providers[r.provider_id] = reason;
    }
    state.requests.push(r);
    if (state.requests.length > KEEP_REQUESTS) state.requests.shift();
    state.window.push(r);
    const since = now() - HISTORY_SEC;
    while (state.window.length && (state.window.length > KEEP_WINDOW ||
           state.window[0].at + state.skew < since)) state.window.shift();
  }

  function onNode(e) {
    if (e.at) state.skew = now() - e.at;
    if (e.kind === "node.connected") state.connectedSince[e.node_id] = e.at;
    if (e.kind === "node.disconnected") delete state.connectedSince[e.node_id];
    state.nodeEvents.push(e);
    if (state.nodeEvents.length > KEEP_NODE_EVENTS) state.nodeEvents.shift();
    poll();
  }

  // -- rendering ------------------------------------------------------------------------------

  function recent(windowSec, match) {
    const since = now() - windowSec;
    return state.window.filter((r) => r.at + state.skew >= since && match(r));
  }

  function render() {
    const s = state.status;
    if (s) {
      $("edge-id").textContent = s.edge ? s.edge.id : "";
      $("edge-mode").textContent = s.edge ? s.edge.mode + " mode" : "";
      renderNodes(s);
      renderProviders(s);
    }
    renderModels(s);
    renderRequests();
    renderNodeEvents();
  }

  function replace(tbody, rows) {
    tbody.replaceChildren(...rows);
  }

  function identityText(identity) {
    if (!identity || !identity.checked) return identity && identity.expected
      ? "not checked (" + identity.expected + ")" : "not checked";
    const names = (identity.presented || []).join(", ");
    return (identity.ok ? "verified " : "refused ") + (names || identity.expected) +
      (identity.refusals ? " · " + identity.refusals + " refused" : "");
  }

  // A last error as a person reads it: "503 provider_busy, 12:03:04 (2m ago)".
  function errorText(e) {
    if (!e) return "";
    return [e.status || "", e.code].filter(Boolean).join(" ") +
      (e.at ? ", " + clock(e.at) + " (" + ago(e.at) + ")" : "");
  }

  // Ready: since when; not ready: since when it is down (the registry's time, in ms), or that
  // it has not been ready since the Edge started.
  function sinceText(n) {
    const since = state.connectedSince[n.id];
    const draining = n.draining_since_unix_ms;
    if (n.connected && draining !== null && draining !== undefined) {
      return "draining since " + clock(draining / 1000) + " (" + ago(draining / 1000) + ")";
    }
    if (n.connected) return since ? clock(since) + " (" + ago(since) + ")" : "";
    const down = n.down_since_unix_ms;
    if (down === null || down === undefined) return "never connected";
    return "down since " + clock(down / 1000) + " (" + ago(down / 1000) + ")";
  }

  function renderNodes(s) {
    replace($("nodes").tBodies[0], (s.nodes || []).map((n) => {
      const tr = el("tr", null, {"data-node-id": n.id, "data-state": n.state});
      tr.append(cell("id", n.alias ? n.id + " (" + n.alias + ")" : n.id));
      tr.append(cell("state", n.state, n.state === "ready" ? "good" :
        n.state === "pending" || n.state === "draining" ? "warn" : "bad"));
      tr.append(cell("connected_since", sinceText(n), n.connected ? "" : "bad"));
      const identity = n.identity || {};
      tr.append(cell("identity", identityText(identity),
        identity.checked ? (identity.ok ? "good" : "bad") : ""));
      tr.append(cell("providers", (n.providers || []).join(", ")));
      return tr;
    }));
  }

  function renderProviders(s) {
    replace($("providers").tBodies[0], (s.providers || []).map((p) => {
      const tr = el("tr", null, {"data-provider-id": p.id, "data-node-id": p.node_id,
        "data-status": p.status});
      tr.append(cell("id", p.id));
      tr.append(cell("node", p.node_id));
      tr.append(cell("status", p.status, p.status === "available" ? "good" : "bad"));
      tr.append(cell("health", p.health, p.health === "healthy" ? "good" : "bad"));
      tr.append(cell("capacity", p.capacity, "num"));
      tr.append(cell("in_flight", p.in_flight, "num"));
      tr.append(cell("queued", p.queued, "num"));
      const mine = (r) => r.provider_id === p.id && r.node_id === p.node_id;
      tr.append(cell("rate", recent(RATE_WINDOW_SEC, mine).length, "num"));
      const lastError = state.lastErrors.providers[p.id];
      tr.append(cell("last_error", errorText(lastError), lastError ? "bad" : ""));
      const chart = el("td", null, {"data-field": "chart"});
      chart.append(drawChart(p, mine));
      tr.append(chart);
      return tr;
    }));
  }

  function drawChart(p, mine) {
    const w = 180, h = 36, t = now();
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "chart");
    svg.setAttribute("width", w);
    svg.setAttribute("height", h);
    svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
    svg.setAttribute("data-chart", p.node_id + "/" + p.id);
    const series = state.inflight[p.node_id + "/" + p.id] || [];
    const buckets = new Array(HISTORY_SEC / BUCKET_SEC).fill(0);
    for (const r of recent(HISTORY_SEC, mine)) {
      const i = Math.floor((r.at + state.skew - (t - HISTORY_SEC)) / BUCKET_SEC);
      if (i >= 0 && i < buckets.length) buckets[i] += 1;
    }
    const top = Math.max(1, p.capacity, ...series.map((x) => x[1]), ...buckets);
    const y = (v) => (h - 2 - (v / top) * (h - 4)).toFixed(1);
    const x = (at) => (((at - (t - HISTORY_SEC)) / HISTORY_SEC) * w).toFixed(1);
    const line = (cls, points) => {
      const poly = document.createElementNS(SVG, "polyline");
      poly.setAttribute("class", cls);
      poly.setAttribute("points", points.join(" "));
      svg.append(poly);
    };
    if (p.capacity) line("capacity", [`0,${y(p.capacity)}`, `${w},${y(p.capacity)}`]);
    line("rate", buckets.map((v, i) => `${x(t - HISTORY_SEC + (i + 0.5) * BUCKET_SEC)},${y(v)}`));
    line("inflight", series.map(([at, v]) => `${x(at)},${y(v)}`));
    const title = document.createElementNS(SVG, "title");
    title.textContent = `${p.id}: in flight and requests per ${BUCKET_SEC} s, last ` +
      `${HISTORY_SEC / 60} min`;
    svg.append(title);
    return svg;
  }

  // Whether a client model can be served now, from /status: models[] by their providers,
  // direct routes by their node.
  function availability(s) {
    const out = {};
    for (const m of (s && s.models) || []) {
      const refs = m.providers || [];
      const up = refs.filter((r) => r.status === "available").length;
      out[m.id] = [up > 0, up ? `yes (${up}/${refs.length})` : "no"];
    }
    for (const r of (s && s.routes) || []) {
      out[r.model] = [r.available, (r.available ? "yes" : "no") + " (direct route)"];
    }
    return out;
  }

  function renderModels(s) {
    const models = new Set(Object.keys(state.totals));
    const available = availability(s);
    for (const m of Object.keys(available)) models.add(m);
    replace($("models").tBodies[0], [...models].sort().map((model) => {
      const totals = state.totals[model] || {requests: 0, errors: 0};
      const tr = el("tr", null, {"data-model": model});
      tr.append(cell("model", model || "(none)"));
      const [up, text] = available[model] || [true, ""];
      tr.append(cell("available", text, up ? "" : "bad"));
      tr.append(cell("requests", totals.requests, "num"));
      tr.append(cell("errors", totals.errors, totals.errors ? "num bad" : "num"));
      const mine = (r) => r.model === model;
      tr.append(cell("rate", recent(RATE_WINDOW_SEC, mine).length, "num"));
      tr.append(cell("error_rate", recent(RATE_WINDOW_SEC, (r) => mine(r) && isError(r)).length,
        "num"));
      const last = state.requests.filter(mine).pop();
      tr.append(cell("last_status", last ? (last.status || last.outcome) : "",
        last && isError(last) ? "bad" : ""));
      const lastError = state.lastErrors.models[model];
      tr.append(cell("last_error", errorText(lastError), lastError ? "bad" : ""));
      return tr;
    }));
  }

  function tokens(usage) {
    if (!usage) return "";
    return (usage.input_tokens ?? "") + " / " + (usage.output_tokens ?? "");
  }

  function renderRequests() {
    replace($("requests").tBodies[0], state.requests.slice().reverse().map((r) => {
      const tr = el("tr", null, {"data-request": "", "data-model": r.model,
        "data-outcome": r.outcome});
      tr.append(cell("at", r.at ? clock(r.at) : ""));
      tr.append(cell("model", r.model));
      tr.append(cell("provider", r.provider_id));
      tr.append(cell("node", r.node_id));
      tr.append(cell("surface", [r.surface, r.operation].filter(Boolean).join(" ")));
      tr.append(cell("status", r.status || "", isError(r) ? "num bad" : "num"));
      tr.append(cell("outcome", r.outcome, isError(r) ? "bad" : ""));
      tr.append(cell("duration", seconds(r.duration), "num"));
      tr.append(cell("ttft", seconds(r.time_to_first_token), "num"));
      tr.append(cell("queue_wait", seconds(r.queue_wait), "num"));
      tr.append(cell("tokens", tokens(r.usage), "num"));
      return tr;
    }));
  }

  function amount(a) {
    return a ? `${a.used} / ${a.limit}` : "";
  }

  function money(micros) {
    return (micros / 1e6).toFixed(2);
  }

  function budgetText(b) {
    const parts = [];
    if (b.tokens) parts.push(`${b.tokens.used} / ${b.tokens.limit} tokens`);
    if (b.cost_micros) parts.push(`${money(b.cost_micros.used)} / ${money(b.cost_micros.limit)}`);
    return `${b.period}: ${parts.join(", ")}`;
  }

  function spent(b) {
    return (b.tokens && b.tokens.remaining === 0) || (b.cost_micros && b.cost_micros.remaining === 0);
  }

  function renderKeys() {
    const keys = state.limits;
    $("keys-section").hidden = !keys || !keys.length;
    if (!keys) return;
    const rows = [];
    for (const k of keys) {
      for (const s of k.subjects) {
        const tr = el("tr", null, {"data-key": k.key, "data-subject": s.subject});
        tr.append(cell("key", k.key));
        tr.append(cell("team", k.team));
        tr.append(cell("subject", s.subject));
        tr.append(cell("concurrent", amount(s.concurrent_requests), "num"));
        tr.append(cell("requests_per_minute", amount(s.requests_per_minute), "num"));
        tr.append(cell("tokens_per_minute", amount(s.tokens_per_minute), "num"));
        const exhausted = s.budgets.some(spent);
        tr.append(cell("budgets", s.budgets.map(budgetText).join("; "), exhausted ? "bad" : ""));
        rows.push(tr);
      }
    }
    replace($("keys").tBodies[0], rows);
  }

  function renderNodeEvents() {
    $("node-events").replaceChildren(...state.nodeEvents.slice().reverse().map((e) => {
      const text = `${clock(e.at)} ${e.node_id || "(unknown token)"} ${e.kind}` +
        (e.outcome ? " " + e.outcome : "") + (e.reason ? ": " + e.reason : "");
      return el("li", text, {"data-kind": e.kind, "data-node-id": e.node_id});
    }));
  }

  poll();
  pollLimits();
  connect();
  setInterval(poll, POLL_MS);
  setInterval(pollLimits, POLL_MS);
})();
