// The kbroker console: hash-routed pages over the broker's /api (console/server.py). No build step, no libraries.
"use strict";

const main = document.getElementById("main");
const COLORS = ["#2f6fde", "#e67e22", "#27ae60", "#8e44ad", "#c0392b", "#16a085", "#7f8c8d"];
let refreshTimer = null;

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}
function fmtBytes(n) {
  if (n == null) return "";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + units[i];
}
function fmtNum(n) { return n == null ? "" : Number(n).toLocaleString("en-US"); }
function fmtTime(ms) { return ms == null || ms < 0 ? "" : new Date(ms).toISOString().replace("T", " ").replace("Z", ""); }
function enc(s) { return encodeURIComponent(s); }

async function api(path, options) {
  const resp = await fetch("/api/" + path, Object.assign({headers: {"Content-Type": "application/json"}}, options || {}));
  const body = await resp.json().catch(() => ({error: resp.statusText}));
  if (!resp.ok) throw new Error(body.error || resp.statusText);
  return body;
}

function table(columns, rows, empty) {
  if (!rows.length) return `<p class="muted">${esc(empty || "Nothing here yet.")}</p>`;
  const head = columns.map(c => `<th class="${c.num ? "num" : ""}">${esc(c.title)}</th>`).join("");
  const body = rows.map(r => "<tr>" + columns.map(c => {
    const v = c.html ? c.html(r) : esc(c.value(r));
    return `<td class="${c.num ? "num" : ""}">${v}</td>`;
  }).join("") + "</tr>").join("");
  return `<table><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>`;
}

// A line chart: series = [{name, points: [[t_ms, value], ...]}].
function chart(series, unit) {
  const W = 900, H = 220, L = 60, B = 24, T = 10, R = 10;
  const all = series.flatMap(s => s.points);
  if (all.length < 2) return `<p class="muted">Collecting samples (one every few seconds)...</p>`;
  const t0 = Math.min(...all.map(p => p[0])), t1 = Math.max(...all.map(p => p[0]));
  const vmax = Math.max(1, ...all.map(p => p[1]));
  const x = t => L + (W - L - R) * (t1 === t0 ? 0 : (t - t0) / (t1 - t0));
  const y = v => T + (H - T - B) * (1 - v / vmax);
  const lines = series.map((s, i) => `<polyline fill="none" stroke="${COLORS[i % COLORS.length]}" stroke-width="1.8"
      points="${s.points.map(p => x(p[0]).toFixed(1) + "," + y(p[1]).toFixed(1)).join(" ")}"/>`).join("");
  const ticks = [0, 0.5, 1].map(f => `<text x="${L - 6}" y="${y(vmax * f) + 3}" text-anchor="end">${esc(fmtNum(Math.round(vmax * f)))}</text>
      <line x1="${L}" x2="${W - R}" y1="${y(vmax * f)}" y2="${y(vmax * f)}" stroke="#eef0f5"/>`).join("");
  const times = `<text x="${L}" y="${H - 6}">${esc(new Date(t0).toLocaleTimeString())}</text>
      <text x="${W - R}" y="${H - 6}" text-anchor="end">${esc(new Date(t1).toLocaleTimeString())}</text>`;
  const legend = series.map((s, i) => `<span><i style="background:${COLORS[i % COLORS.length]}"></i>${esc(s.name)}</span>`).join("");
  return `<svg class="chart" viewBox="0 0 ${W} ${H}" width="100%" role="img" aria-label="${esc(unit)}">${ticks}${lines}${times}</svg>
      <div class="legend">${legend} <span class="muted">${esc(unit)}</span></div>`;
}

function showValue(v) {
  if (v == null) return `<span class="muted">null</span>`;
  // Decoded through the schema registry: say which schema, then show the datum.
  const schema = v.schema_id == null ? "" :
    `<span class="badge" title="schema id ${v.schema_id}">${esc(v.schema_type)} schema ${v.schema_id}</span>`;
  if (v.encoding === "json") {
    try { return `${schema}<pre>${esc(JSON.stringify(JSON.parse(v.data), null, 2))}</pre>`; } catch (e) { /* shown as text below */ }
  }
  if (v.encoding === "base64") return `<pre class="muted">base64 ${esc(v.data)}</pre>`;
  return `<pre>${esc(v.data)}</pre>`;
}

// ------------------------------------------------------------------ pages

const pages = {
  async brokers() {
    const d = await api("brokers");
    return `<h1>Brokers</h1>
      <div class="cards"><div class="card"><div class="muted">Cluster</div><div class="v" id="cluster-id">${esc(d.cluster_id)}</div></div>
      <div class="card"><div class="muted">Controller</div><div class="v">${esc(d.controller_id)}</div></div>
      <div class="card"><div class="muted">Brokers</div><div class="v">${d.brokers.length}</div></div></div>` +
      table([{title: "Node", value: b => b.node_id, num: true}, {title: "Host", value: b => b.host},
             {title: "Port", value: b => b.port, num: true}, {title: "Rack", value: b => b.rack || ""},
             {title: "Role", value: b => b.controller ? "controller" : ""}], d.brokers);
  },

  async topics() {
    const d = await api("topics");
    return `<h1>Topics</h1>
      <form class="inline" id="create-topic"><label>Name<input name="name" required></label>
        <label>Partitions<input name="partitions" type="number" value="1" min="1" style="width:80px"></label>
        <label>Replication<input name="replication_factor" type="number" value="1" min="1" style="width:80px"></label>
        <button>Create topic</button><span id="create-result" class="muted"></span></form>` +
      table([{title: "Topic", html: t => `<a href="#/topic/${enc(t.name)}">${esc(t.name)}</a>${t.internal ? ' <span class="muted">internal</span>' : ""}`},
             {title: "Partitions", value: t => t.partitions, num: true},
             {title: "Replication", value: t => t.replication_factor, num: true},
             {title: "Under-replicated", value: t => t.under_replicated, num: true},
             {title: "Messages", value: t => fmtNum(t.messages), num: true},
             {title: "Size", value: t => fmtBytes(t.size_bytes), num: true}], d.topics, "No topics.");
  },

  async topic(name) {
    const [d, prod] = await Promise.all([api("topics/" + enc(name)), api("topics/" + enc(name) + "/producers").catch(() => ({producers: []}))]);
    return `<h1>Topic ${esc(name)}</h1>
      <p><a href="#/messages/${enc(name)}/0">Browse messages</a> &middot; <button class="danger" id="delete-topic" data-topic="${esc(name)}">Delete topic</button> <span id="delete-result" class="muted"></span></p>
      <h2>Partitions</h2>` +
      table([{title: "Partition", value: p => p.partition, num: true}, {title: "Leader", value: p => p.leader, num: true},
             {title: "Epoch", value: p => p.leader_epoch, num: true}, {title: "Replicas", value: p => p.replicas.join(", ")},
             {title: "ISR", value: p => p.isr.join(", ")}, {title: "Offline", value: p => p.offline.join(", ")},
             {title: "Start offset", value: p => fmtNum(p.start_offset), num: true},
             {title: "End offset", value: p => fmtNum(p.end_offset), num: true},
             {title: "Size", value: p => fmtBytes(p.size_bytes), num: true}], d.partitions) +
      `<h2>Active producers</h2>` +
      table([{title: "Partition", value: p => p.partition, num: true}, {title: "Producer id", value: p => p.producer_id, num: true},
             {title: "Epoch", value: p => p.producer_epoch, num: true}, {title: "Last sequence", value: p => p.last_sequence, num: true},
             {title: "Last write", value: p => fmtTime(p.last_timestamp)},
             {title: "Open transaction from", value: p => p.current_txn_start_offset >= 0 ? p.current_txn_start_offset : "", num: true}],
            prod.producers, "No idempotent or transactional producer state.") +
      `<h2>Configs</h2>` +
      table([{title: "Name", value: c => c.name}, {title: "Value", value: c => c.value ?? "(sensitive)"},
             {title: "Source", value: c => c.default ? "default" : "topic"}], d.configs);
  },

  async messages(name, partition) {
    const q = new URLSearchParams(location.hash.split("?")[1] || "");
    const params = new URLSearchParams({partition: partition || "0", limit: q.get("limit") || "50"});
    if (q.get("offset")) params.set("offset", q.get("offset"));
    if (q.get("time")) params.set("timestamp", String(Date.parse(q.get("time") + "Z")));
    const [t, d] = await Promise.all([api("topics/" + enc(name)), api(`topics/${enc(name)}/messages?${params}`)]);
    const options = t.partitions.map(p => `<option ${String(p.partition) === String(partition) ? "selected" : ""}>${p.partition}</option>`).join("");
    return `<h1>Messages of <a href="#/topic/${enc(name)}">${esc(name)}</a></h1>
      <form class="inline" id="seek" data-topic="${esc(name)}"><label>Partition<select name="partition">${options}</select></label>
        <label>From offset<input name="offset" type="number" min="0" value="${esc(q.get("offset") || "")}" style="width:120px"></label>
        <label>or from time (UTC)<input name="time" type="datetime-local" step="1" value="${esc(q.get("time") || "")}"></label>
        <label>Limit<input name="limit" type="number" min="1" max="500" value="${esc(q.get("limit") || "50")}" style="width:80px"></label>
        <button>Show</button></form>
      <p class="muted">Offsets ${fmtNum(d.start_offset)} to ${fmtNum(d.end_offset)}; showing ${d.records.length} from ${fmtNum(d.from_offset)}.</p>` +
      table([{title: "Offset", value: r => r.offset, num: true}, {title: "Timestamp", value: r => fmtTime(r.timestamp)},
             {title: "Key", html: r => showValue(r.key)}, {title: "Value", html: r => showValue(r.value)},
             {title: "Headers", html: r => r.headers.map(h => `${esc(h.key)}: ${showValue(h.value)}`).join("")}],
            d.records, "No records in this range.");
  },

  async groups() {
    const d = await api("groups");
    return `<h1>Consumer groups</h1>` +
      table([{title: "Group", html: g => `<a href="#/group/${enc(g.group_id)}">${esc(g.group_id)}</a>`},
             {title: "Type", value: g => g.type === "consumer" ? "consumer (KIP-848)" : g.type}, {title: "State", value: g => g.state},
             {title: "Lag", value: g => fmtNum(g.lag), num: true}], d.groups, "No groups.");
  },

  async group(id) {
    const d = await api("groups/" + enc(id));
    const total = d.offsets.reduce((s, p) => s + (p.lag || 0), 0);
    return `<h1>Group ${esc(id)}</h1>
      <div class="cards"><div class="card"><div class="muted">Type</div><div class="v" id="group-type">${esc(d.type === "consumer" ? "consumer (KIP-848)" : d.type)}</div></div>
      <div class="card"><div class="muted">State</div><div class="v">${esc(d.state)}</div></div>
      <div class="card"><div class="muted">Assignor</div><div class="v" id="assignor">${esc(d.assignor || "-")}</div></div>
      <div class="card"><div class="muted">Members</div><div class="v">${d.members.length}</div></div>
      <div class="card"><div class="muted">Total lag</div><div class="v" id="total-lag">${fmtNum(total)}</div></div></div>
      <h2>Lag over the last minutes</h2>${chart([{name: "lag", points: d.lag_history.map(s => [s.at, s.lag])}], "records behind")}
      <h2>Members</h2>` +
      table([{title: "Member", value: m => m.member_id}, {title: "Client", value: m => m.client_id},
             {title: "Host", value: m => m.host}, {title: "Epoch", value: m => m.epoch ?? "", num: true},
             {title: "Assignment", value: m => Object.entries(m.assignment).map(([t, ps]) => `${t}: ${ps.join(",")}`).join("; ")}],
            d.members, "No members.") +
      `<h2>Offsets and lag</h2>` +
      table([{title: "Topic", html: p => `<a href="#/topic/${enc(p.topic)}">${esc(p.topic)}</a>`},
             {title: "Partition", value: p => p.partition, num: true},
             {title: "Committed", value: p => fmtNum(p.committed_offset), num: true},
             {title: "End offset", value: p => fmtNum(p.end_offset), num: true},
             {title: "Lag", value: p => fmtNum(p.lag), num: true}], d.offsets, "No committed offsets.");
  },

  async transactions() {
    const d = await api("transactions");
    return `<h1>Transactions</h1>` +
      table([{title: "Transactional id", value: t => t.transactional_id}, {title: "Producer id", value: t => t.producer_id, num: true},
             {title: "Epoch", value: t => t.producer_epoch ?? "", num: true}, {title: "State", value: t => t.state},
             {title: "Started", value: t => fmtTime(t.start_time_ms)}, {title: "Timeout ms", value: t => fmtNum(t.timeout_ms), num: true},
             {title: "Partitions", value: t => t.partitions.join(", ")}], d.transactions, "No transactional producers.");
  },

  async throughput() {
    const d = await api("throughput");
    const topics = Object.keys(d.topics).filter(t => !t.startsWith("__")).sort();
    const series = key => topics.map(t => ({name: t, points: d.topics[t].map(s => [s.at, s[key]])}));
    return `<h1>Throughput</h1><p class="muted">From the broker's BytesIn/BytesOut/MessagesIn counters, every ${d.interval_s} s.</p>
      <h2>Records in per second</h2>${chart(series("records_in"), "records/s")}
      <h2>Bytes in per second</h2>${chart(series("bytes_in"), "bytes/s")}
      <h2>Bytes out per second</h2>${chart(series("bytes_out"), "bytes/s")}`;
  },
};

// ------------------------------------------------------------------ routing and forms

async function route() {
  clearTimeout(refreshTimer);
  const [path] = location.hash.replace(/^#\/?/, "").split("?");
  const [page, ...args] = path.split("/").map(decodeURIComponent);
  const name = pages[page] ? page : "brokers";
  for (const a of document.querySelectorAll("nav a")) {
    const active = a.dataset.page === name || (a.dataset.page === "topics" && (name === "topic" || name === "messages")) ||
      (a.dataset.page === "groups" && name === "group");
    a.classList.toggle("active", active);
  }
  document.body.dataset.page = name;
  try {
    main.innerHTML = await pages[name](...args);
    main.dataset.loaded = name;
  } catch (e) {
    main.innerHTML = `<div class="error">${esc(e.message)}</div>`;
    main.dataset.loaded = "error";
  }
  if (name === "group" || name === "throughput") refreshTimer = setTimeout(route, 5000);
}

document.addEventListener("submit", async ev => {
  const form = ev.target;
  ev.preventDefault();
  const data = Object.fromEntries(new FormData(form));
  if (form.id === "create-topic") {
    const out = document.getElementById("create-result");
    try {
      await api("topics", {method: "POST", body: JSON.stringify({name: data.name, partitions: Number(data.partitions),
        replication_factor: Number(data.replication_factor)})});
      route();
    } catch (e) { out.textContent = e.message; out.className = "error"; }
  } else if (form.id === "seek") {
    const q = new URLSearchParams();
    for (const k of ["offset", "time", "limit"]) if (data[k]) q.set(k, data[k]);
    location.hash = `#/messages/${enc(form.dataset.topic)}/${data.partition}?${q}`;
  }
});

document.addEventListener("click", async ev => {
  const b = ev.target.closest("#delete-topic");
  if (!b || !confirm(`Delete topic ${b.dataset.topic}?`)) return;
  try {
    await api("topics/" + enc(b.dataset.topic), {method: "DELETE"});
    location.hash = "#/topics";
  } catch (e) { const out = document.getElementById("delete-result"); out.textContent = e.message; out.className = "error"; }
});

window.addEventListener("hashchange", route);
api("whoami").then(w => { document.getElementById("whoami").textContent = w.user ? `signed in as ${w.user}` : ""; }).catch(() => {});
route();
