import Foundation

/// The dashboard page: one self-contained HTML document (inline CSS, script and SVG; no request leaves the server).
/// The first summary is rendered into the page, then the script fetches `/api/summary` every two seconds.
public enum DashboardPage {
    /// `1234567` -> `1,234,567`.
    public static func grouped(_ n: Int) -> String {
        let digits = String(n.magnitude)
        var out = ""
        for (i, c) in digits.enumerated() {
            if i > 0 && (digits.count - i) % 3 == 0 { out.append(",") }
            out.append(c)
        }
        return (n < 0 ? "-" : "") + out
    }

    public static func render(_ summary: DashboardSummary) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let json = (try? encoder.encode(summary)).map { String(decoding: $0, as: UTF8.self) } ?? "null"
        // Inside <script>: `<` escaped so no string in the data can close the element.
        let safe = json.replacingOccurrences(of: "<", with: "\\u003c")
        let active = summary.activeEntitlements.values.reduce(0, +)
        return template
            .replacingOccurrences(of: "{{INITIAL}}", with: safe)
            .replacingOccurrences(of: "{{EVENTS}}", with: grouped(summary.events))
            .replacingOccurrences(of: "{{ACTIVE}}", with: grouped(active))
            .replacingOccurrences(of: "{{REJECTED}}", with: grouped(summary.rejectedTotal))
            .replacingOccurrences(of: "{{STALE}}", with: grouped(summary.stale))
            .replacingOccurrences(of: "{{DUPLICATES}}", with: grouped(summary.records.duplicates))
    }

    static let template = #"""
<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="color-scheme" content="light dark">
<title>Entitlement fleet · live dashboard</title>
<link rel="icon" href="data:,">
<style>
:root {
  --bg: #f6f7f9; --panel: #ffffff; --text: #1b1f24; --muted: #57606a; --line: #d0d7de; --grid: #eaeef2;
  --accent: #0b5cad; --good: #1a7f37; --bad: #b42318; --warn: #9a6700;
  --c0: #2f6fde; --c1: #d4522a; --c2: #1f9e6e; --c3: #8a4fd0; --c4: #c28a00; --c5: #0f8fa8; --c6: #c43d7e; --c7: #6b7d1e; --c8: #7a5230; --c9: #5c6b7a;
}
@media (prefers-color-scheme: dark) {
  :root {
    --bg: #0f1419; --panel: #171d24; --text: #e6edf3; --muted: #9aa7b4; --line: #30363d; --grid: #232a32;
    --accent: #6cb6ff; --good: #4ac26b; --bad: #ff7b72; --warn: #e3b341;
    --c0: #6ca4ff; --c1: #ff8a5c; --c2: #3fd49a; --c3: #b88cff; --c4: #f0c040; --c5: #40c8e0; --c6: #ff7ab8; --c7: #b5cc4a; --c8: #d39a6a; --c9: #9fb0c0;
  }
}
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--text); font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Noto Sans", sans-serif; }
header { display: flex; flex-wrap: wrap; gap: 12px 24px; align-items: center; justify-content: space-between; padding: 16px 24px; border-bottom: 1px solid var(--line); background: var(--panel); }
h1 { font-size: 20px; margin: 0; }
h2 { font-size: 15px; margin: 0 0 10px; }
.status { color: var(--muted); font-size: 13px; font-variant-numeric: tabular-nums; min-width: 22em; }
.status b { color: var(--text); }
.dot { display: inline-block; width: 9px; height: 9px; border-radius: 50%; background: var(--good); margin-right: 6px; vertical-align: 1px; }
.dot.stale { background: var(--warn); }
fieldset { border: 0; margin: 0; padding: 0; display: flex; gap: 4px; align-items: center; }
legend { float: left; margin-right: 8px; color: var(--muted); font-size: 13px; }
fieldset label { border: 1px solid var(--line); border-radius: 6px; padding: 3px 10px; cursor: pointer; font-size: 13px; }
fieldset input { position: absolute; opacity: 0; }
fieldset input:checked + span { font-weight: 600; }
fieldset label:has(input:checked) { background: var(--accent); border-color: var(--accent); color: var(--panel); }
fieldset label:has(input:focus-visible) { outline: 2px solid var(--accent); outline-offset: 2px; }
main { padding: 20px 24px 32px; display: grid; gap: 16px; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr)); max-width: 1500px; margin: 0 auto; }
.kpis { grid-column: 1 / -1; display: grid; gap: 12px; grid-template-columns: repeat(auto-fit, minmax(170px, 1fr)); margin: 0; }
.kpi { background: var(--panel); border: 1px solid var(--line); border-radius: 10px; padding: 12px 16px; }
.kpi dt { color: var(--muted); font-size: 13px; }
.kpi dd { margin: 2px 0 0; font-size: 28px; font-weight: 650; font-variant-numeric: tabular-nums; letter-spacing: -0.01em; }
section.card { background: var(--panel); border: 1px solid var(--line); border-radius: 10px; padding: 14px 16px; min-width: 0; }
section.wide { grid-column: 1 / -1; }
figure { margin: 0; }
svg.chart { width: 100%; height: 220px; display: block; }
svg text { fill: var(--muted); font-size: 11px; font-variant-numeric: tabular-nums; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 14px; margin: 8px 0 0; padding: 0; list-style: none; font-size: 12px; color: var(--muted); min-height: 18px; }
.legend i { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 5px; vertical-align: -1px; }
table { width: 100%; border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; }
caption { text-align: left; color: var(--muted); font-size: 12px; padding-bottom: 4px; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid var(--grid); white-space: nowrap; }
th { color: var(--muted); font-weight: 600; }
td.n, th.n { text-align: right; }
.scroll { overflow-x: auto; }
.empty { color: var(--muted); font-size: 13px; padding: 8px 0; }
.bar { height: 10px; border-radius: 3px; background: var(--bad); display: inline-block; vertical-align: middle; }
.effect-GRANT, .effect-RESTORE { color: var(--good); } .effect-REVOKE { color: var(--bad); } .effect-EXTEND { color: var(--accent); } .effect-STATE { color: var(--warn); } .effect-INFO { color: var(--muted); }
footer { color: var(--muted); font-size: 12px; text-align: center; padding: 0 24px 24px; }
</style>
</head>
<body>
<header>
  <div>
    <h1>Entitlement fleet · live</h1>
    <p class="status" id="status" aria-live="polite"><span class="dot" id="dot"></span>Loading…</p>
  </div>
  <fieldset id="envs"><legend>Environment</legend></fieldset>
</header>
<main>
  <dl class="kpis" aria-label="Totals">
    <div class="kpi"><dt>Events (distinct)</dt><dd id="total-events" data-testid="total-events">{{EVENTS}}</dd></div>
    <div class="kpi"><dt>Active entitlements now</dt><dd id="total-active">{{ACTIVE}}</dd></div>
    <div class="kpi"><dt>Rejected inputs</dt><dd id="total-rejected">{{REJECTED}}</dd></div>
    <div class="kpi"><dt>Stale events (ignored for state)</dt><dd id="total-stale">{{STALE}}</dd></div>
    <div class="kpi"><dt>Duplicates (replays)</dt><dd id="total-duplicates">{{DUPLICATES}}</dd></div>
  </dl>
  <section class="card wide" aria-labelledby="h-minute">
    <h2 id="h-minute">Events per minute, by kind <span class="status" id="env-events"></span></h2>
    <figure><svg class="chart" id="chart-minute" role="img" aria-labelledby="h-minute"></svg><ul class="legend" id="legend-minute"></ul></figure>
  </section>
  <section class="card" aria-labelledby="h-active">
    <h2 id="h-active">Active entitlements over time</h2>
    <figure><svg class="chart" id="chart-active" role="img" aria-labelledby="h-active"></svg><ul class="legend" id="legend-active"></ul></figure>
    <div class="scroll"><table id="table-active"><caption>Entitled now, per product</caption><thead><tr><th scope="col">Product</th><th scope="col" class="n">Subjects</th></tr></thead><tbody></tbody></table></div>
  </section>
  <section class="card" aria-labelledby="h-life">
    <h2 id="h-life">Starts, renewals, expiries and refunds per day</h2>
    <figure><svg class="chart" id="chart-life" role="img" aria-labelledby="h-life"></svg><ul class="legend" id="legend-life"></ul></figure>
  </section>
  <section class="card" aria-labelledby="h-revenue">
    <h2 id="h-revenue">Revenue per currency per day (gross)</h2>
    <figure><svg class="chart" id="chart-revenue" role="img" aria-labelledby="h-revenue"></svg><ul class="legend" id="legend-revenue"></ul></figure>
    <div class="scroll"><table id="table-revenue"><caption>Totals over the days shown</caption><thead><tr><th scope="col">Currency</th><th scope="col" class="n">Amount</th></tr></thead><tbody></tbody></table></div>
  </section>
  <section class="card" aria-labelledby="h-rejected">
    <h2 id="h-rejected">Rejections by reason</h2>
    <div class="scroll"><table id="table-rejected"><caption>Records on the rejected topic, by their reason header (all environments)</caption><thead><tr><th scope="col">Reason</th><th scope="col" class="n">Records</th><th scope="col"><span hidden>Share</span></th></tr></thead><tbody></tbody></table></div>
  </section>
  <section class="card" aria-labelledby="h-units">
    <h2 id="h-units">Consumable units per product</h2>
    <div class="scroll"><table id="table-units"><caption>Refunded: units debited by refunds; net includes re-credits of reversed refunds</caption><thead><tr><th scope="col">Product</th><th scope="col" class="n">Credited</th><th scope="col" class="n">Refunded</th><th scope="col" class="n">Net</th></tr></thead><tbody></tbody></table></div>
  </section>
  <section class="card" aria-labelledby="h-kinds">
    <h2 id="h-kinds">Events by kind</h2>
    <div class="scroll"><table id="table-kinds"><thead><tr><th scope="col">Kind</th><th scope="col" class="n">Events</th></tr></thead><tbody></tbody></table></div>
  </section>
  <section class="card wide" aria-labelledby="h-latest">
    <h2 id="h-latest">Latest events read</h2>
    <div class="scroll"><table id="table-latest"><thead><tr><th scope="col">Verified (UTC)</th><th scope="col">Kind</th><th scope="col">Effect</th><th scope="col">Product</th><th scope="col">Subject</th><th scope="col">Valid until (UTC)</th></tr></thead><tbody></tbody></table></div>
  </section>
</main>
<footer>Counts are distinct eventIds read from the result topic; “active” is judged like <code>entitlements_current.entitled_now</code>. Updates every 2 s.</footer>
<script id="initial" type="application/json">{{INITIAL}}</script>
<script>
"use strict";
const NF = new Intl.NumberFormat("en-US");
const fmt = n => NF.format(n || 0);
const $ = id => document.getElementById(id);
const SVGNS = "http://www.w3.org/2000/svg";
const COLORS = Array.from({length: 10}, (_, i) => `var(--c${i})`);
let env = null, last = null, colorOf = {};
function color(key) { if (!(key in colorOf)) colorOf[key] = COLORS[Object.keys(colorOf).length % COLORS.length]; return colorOf[key]; }
function el(tag, attrs, text) { const e = document.createElementNS(SVGNS, tag); for (const k in attrs) e.setAttribute(k, attrs[k]); if (text != null) e.textContent = text; return e; }
function cell(tr, text, cls) { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; tr.appendChild(td); return td; }
function utc(ms) { if (ms == null) return "–"; const d = new Date(ms); return d.toISOString().slice(0, 19).replace("T", " "); }
function hm(ms) { return new Date(ms).toISOString().slice(11, 16); }
function fillRows(id, rows, empty) {
  const tb = $(id).tBodies[0]; tb.replaceChildren();
  if (!rows.length) { const tr = tb.insertRow(); const td = cell(tr, empty || "Nothing yet."); td.colSpan = 9; td.className = "empty"; return; }
  for (const r of rows) { const tr = tb.insertRow(); r(tr); }
}
function legend(id, keys, label) {
  const ul = $(id); ul.replaceChildren();
  for (const k of keys) { const li = document.createElement("li"); const i = document.createElement("i"); i.style.background = color(k); li.append(i, label ? label(k) : k); ul.appendChild(li); }
}
/* Stacked (or grouped) bars: series = [{key, values[]}], labels[] along x. */
function bars(svg, labels, series, opts) {
  svg.replaceChildren();
  const W = svg.clientWidth || 600, H = svg.clientHeight || 220, L = 48, B = 22, T = 8, R = 8;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const n = labels.length, grouped = opts && opts.grouped;
  let max = 0;
  for (let i = 0; i < n; i++) {
    if (grouped) for (const s of series) max = Math.max(max, s.values[i] || 0);
    else max = Math.max(max, series.reduce((a, s) => a + (s.values[i] || 0), 0));
  }
  const top = niceMax(max), ph = H - T - B, pw = W - L - R, slot = pw / Math.max(1, n);
  axis(svg, top, L, T, pw, ph, opts && opts.unit);
  for (let i = 0; i < n; i++) {
    let y = T + ph;
    const bw = grouped ? Math.max(1, (slot * 0.8) / series.length) : Math.max(1, slot * 0.75);
    series.forEach((s, j) => {
      const v = s.values[i] || 0; if (!v) return;
      const h = v / top * ph;
      const x = L + i * slot + (grouped ? slot * 0.1 + j * bw : (slot - bw) / 2);
      const r = el("rect", {x: x.toFixed(1), y: (grouped ? T + ph - h : y - h).toFixed(1), width: bw.toFixed(1), height: Math.max(0.5, h).toFixed(1), fill: color(s.key)});
      r.appendChild(el("title", {}, `${labels[i]} · ${s.key}: ${opts && opts.format ? opts.format(v) : fmt(v)}`));
      svg.appendChild(r);
      if (!grouped) y -= h;
    });
  }
  const every = Math.max(1, Math.ceil(n / Math.max(1, Math.floor(pw / 56))));
  for (let i = 0; i < n; i += every) svg.appendChild(el("text", {x: (L + i * slot + slot / 2).toFixed(1), y: H - 6, "text-anchor": "middle"}, labels[i]));
}
function lines(svg, times, series) {
  svg.replaceChildren();
  const W = svg.clientWidth || 600, H = svg.clientHeight || 220, L = 48, B = 22, T = 8, R = 8;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  let max = 0; for (const s of series) for (const v of s.values) max = Math.max(max, v || 0);
  const top = niceMax(max), ph = H - T - B, pw = W - L - R, n = times.length;
  axis(svg, top, L, T, pw, ph);
  const xAt = i => L + (n <= 1 ? pw / 2 : i / (n - 1) * pw), yAt = v => T + ph - (v || 0) / top * ph;
  for (const s of series) {
    const pts = s.values.map((v, i) => `${xAt(i).toFixed(1)},${yAt(v).toFixed(1)}`).join(" ");
    const p = el("polyline", {points: pts, fill: "none", stroke: color(s.key), "stroke-width": 2, "stroke-linejoin": "round"});
    p.appendChild(el("title", {}, `${s.key}: ${fmt(s.values[s.values.length - 1])} now`)); svg.appendChild(p);
    if (n) svg.appendChild(el("circle", {cx: xAt(n - 1), cy: yAt(s.values[n - 1]), r: 3, fill: color(s.key)}));
  }
  if (n) { svg.appendChild(el("text", {x: L, y: H - 6}, hm(times[0]))); svg.appendChild(el("text", {x: W - R, y: H - 6, "text-anchor": "end"}, hm(times[n - 1]))); }
}
function niceMax(v) { if (v <= 4) return 4; const p = Math.pow(10, Math.floor(Math.log10(v))); for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p; return 10 * p; }
function axis(svg, top, L, T, pw, ph, unit) {
  const steps = Number.isInteger(top / 4) ? 4 : 5;
  for (let k = 0; k <= steps; k++) {
    const y = T + ph - k / steps * ph, v = top * k / steps;
    svg.appendChild(el("line", {x1: L, x2: L + pw, y1: y, y2: y, stroke: "var(--grid)"}));
    svg.appendChild(el("text", {x: L - 6, y: y + 4, "text-anchor": "end"}, unit ? unit(v) : compact(v)));
  }
}
function compact(v) { const a = Math.abs(v); return a >= 1e6 ? +(v / 1e6).toFixed(1) + "M" : a >= 1e3 ? +(v / 1e3).toFixed(1) + "k" : fmt(Math.round(v)); }
function money(milli, cur) { return (milli / 1000).toLocaleString("en-US", {minimumFractionDigits: 2, maximumFractionDigits: 2}) + (cur ? " " + cur : ""); }
function envSwitch(s) {
  const names = Object.keys(s.environments || {}).sort();
  if (!env || !names.includes(env)) env = s.defaultEnvironment || names[0] || null;
  const fs = $("envs"), want = names.join("|");
  if (fs.dataset.names !== want) {
    fs.dataset.names = want; fs.querySelectorAll("label").forEach(l => l.remove());
    for (const name of names) {
      const label = document.createElement("label"), input = document.createElement("input"), span = document.createElement("span");
      input.type = "radio"; input.name = "env"; input.value = name; input.checked = name === env;
      input.addEventListener("change", () => { env = name; render(last); });
      span.textContent = name; label.append(input, span); fs.appendChild(label);
    }
  }
  fs.hidden = names.length === 0;
}
function render(s) {
  if (!s) return; last = s;
  envSwitch(s);
  $("total-events").textContent = fmt(s.events);
  $("total-rejected").textContent = fmt(s.rejectedTotal);
  $("total-stale").textContent = fmt(s.stale);
  $("total-duplicates").textContent = fmt(s.records && s.records.duplicates);
  const e = (s.environments || {})[env] || {events: 0, byKind: {}, activeEntitlements: {}, activeByProduct: {}, activeHistory: [], perMinute: [], lifecycleByDay: [], revenueByDay: [], consumables: {}, latest: []};
  $("total-active").textContent = fmt(Object.values(e.activeEntitlements).reduce((a, b) => a + b, 0));
  $("env-events").textContent = env ? `· ${env}: ${fmt(e.events)} events` : "";
  const lag = s.lag || {};
  const lagText = lag.total == null ? "lag unknown" : `lag ${fmt(lag.total)} record${lag.total === 1 ? "" : "s"}`;
  $("dot").className = "dot" + (lag.total ? " stale" : "");
  $("status").lastChild.textContent = `Updated ${utc(s.generatedAt)} UTC · ${lagText} · reading from ${s.readingFrom === "beginning" ? "the beginning" : utc(+s.readingFrom)}`;
  // Events per minute, stacked by kind (the kinds with the most events get their own colour).
  const kinds = Object.entries(e.byKind).sort((a, b) => b[1] - a[1]).map(x => x[0]);
  const shown = kinds.slice(0, 9), rest = kinds.slice(9);
  const series = shown.map(k => ({key: k, values: e.perMinute.map(m => m.byKind[k] || 0)}));
  if (rest.length) series.push({key: "other kinds", values: e.perMinute.map(m => rest.reduce((a, k) => a + (m.byKind[k] || 0), 0))});
  bars($("chart-minute"), e.perMinute.map(m => hm(m.t)), series);
  legend("legend-minute", series.map(s => s.key));
  // Active entitlements over time.
  const ents = Object.keys(e.activeEntitlements).concat(...e.activeHistory.map(p => Object.keys(p.counts))).filter((v, i, a) => a.indexOf(v) === i).sort();
  lines($("chart-active"), e.activeHistory.map(p => p.t), ents.map(k => ({key: k, values: e.activeHistory.map(p => p.counts[k] || 0)})));
  legend("legend-active", ents, k => `${k}: ${fmt(e.activeEntitlements[k] || 0)}`);
  fillRows("table-active", Object.entries(e.activeByProduct).sort((a, b) => b[1] - a[1]).map(([p, n]) => tr => { cell(tr, p); cell(tr, fmt(n), "n"); }));
  // Lifecycle per day.
  const life = e.lifecycleByDay.slice(-14), lk = ["starts", "renewals", "expiries", "refunds"];
  bars($("chart-life"), life.map(d => d.day.slice(5)), lk.map(k => ({key: k, values: life.map(d => d[k])})), {grouped: true});
  legend("legend-life", lk, k => `${k} ${fmt(life.reduce((a, d) => a + d[k], 0))}`);
  // Revenue per currency per day.
  const rev = e.revenueByDay.slice(-14), curs = [...new Set(rev.flatMap(d => Object.keys(d.byCurrency)))].sort();
  bars($("chart-revenue"), rev.map(d => d.day.slice(5)), curs.map(c => ({key: c, values: rev.map(d => d.byCurrency[c] || 0)})), {grouped: true, format: v => money(v), unit: v => compact(v / 1000)});
  legend("legend-revenue", curs);
  fillRows("table-revenue", curs.map(c => tr => { cell(tr, c); cell(tr, money(rev.reduce((a, d) => a + (d.byCurrency[c] || 0), 0)), "n"); }), "No priced transactions yet.");
  // Rejections.
  const rj = Object.entries(s.rejected || {}).sort((a, b) => b[1] - a[1]), rmax = rj.length ? rj[0][1] : 1;
  fillRows("table-rejected", rj.map(([r, n]) => tr => { cell(tr, r); cell(tr, fmt(n), "n"); const td = cell(tr, ""); td.style.width = "35%"; const b = document.createElement("span"); b.className = "bar"; b.style.width = Math.max(2, n / rmax * 100) + "%"; td.appendChild(b); }), "No rejections.");
  // Consumables.
  fillRows("table-units", Object.entries(e.consumables).sort().map(([p, u]) => tr => { cell(tr, p); cell(tr, fmt(u.credited), "n"); cell(tr, fmt(u.debited - u.recredited), "n"); cell(tr, fmt(u.credited - u.debited + u.recredited), "n"); }), "No consumables.");
  fillRows("table-kinds", Object.entries(e.byKind).sort((a, b) => b[1] - a[1]).map(([k, n]) => tr => { cell(tr, k); cell(tr, fmt(n), "n"); }));
  fillRows("table-latest", e.latest.map(x => tr => { cell(tr, utc(x.verifiedAt)); cell(tr, x.kind); cell(tr, x.effect, "effect-" + x.effect); cell(tr, x.productId || "–"); cell(tr, x.subject || "–"); cell(tr, utc(x.validUntil)); }));
  document.body.dataset.updated = String(s.generatedAt);
}
async function refresh() {
  try {
    const r = await fetch("/api/summary", {cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    render(await r.json());
    document.body.dataset.live = "true";
  } catch (err) {
    $("dot").className = "dot stale";
    $("status").lastChild.textContent = `Cannot reach the dashboard server (${err.message}); retrying…`;
  }
}
try { render(JSON.parse($("initial").textContent)); } catch (e) {}
refresh();
setInterval(refresh, 2000);
window.addEventListener("resize", () => render(last));
</script>
</body>
</html>
"""#
}
