// The report's page: CSS and JavaScript, with the data spliced in where %DATA% stands (see
// report.cc). Kept apart from the C++ that fills it so that both stay readable.
#pragma once

namespace headlight::viz::detail {

inline constexpr const char* kPageHead = R"HTML(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<title>headlight report</title>
<style>
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd}
.summary li{margin:3px 0}.muted{color:#777}
#headview{display:flex;gap:8px;align-items:flex-start}
.tok{font-family:monospace;font-size:13px;height:18px;line-height:18px;white-space:pre;cursor:default;padding:0 4px}
.tok:hover,.tok.on{background:#ffe9a8}
#grid{display:grid;gap:6px}
#grid canvas{border:3px solid #ccc;cursor:pointer;image-rendering:pixelated}
table{border-collapse:collapse;font-size:13px}th,td{padding:3px 8px;border-bottom:1px solid #eee;text-align:right}
th{cursor:pointer;background:#f5f5f5;position:sticky;top:0}td.l{text-align:left}
.legend span{display:inline-block;margin-right:12px}.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:middle}
svg text{font-size:11px}
</style></head><body>
<script type="application/json" id="data">)HTML";

inline constexpr const char* kPageTail = R"HTML(</script>
<h1 id="title"></h1>
<p class="muted" id="model"></p>
<p id="text"></p>
<ul class="summary" id="summary"></ul>
<h2>Head view</h2>
<p>Layer <select id="layer"></select> Head <select id="head"></select> <span id="role" class="muted"></span>
<span class="muted"> · lines from each query token (left) to the keys it attends to (right); opacity is the weight; hover a token for numbers</span></p>
<div id="headview"><div id="left"></div><svg id="lines" width="300"></svg><div id="right"></div></div>
<p id="hover" class="muted"></p>
<h2>Model view</h2>
<p class="legend" id="legend"></p>
<div id="grid"></div>
<h2>Heads</h2>
<table id="table"></table>
<h2>Pruning</h2>
<div id="curve"></div>
<h2>Head-count sweep</h2>
<div id="sweep"></div>
<script>
"use strict";
let errors = 0;
window.addEventListener("error", () => { errors++; document.body.dataset.errors = errors; });
document.body.dataset.errors = 0;
const D = JSON.parse(document.getElementById("data").textContent);
const C = D.capture, T = C.seq, H = C.n_head, L = C.n_layer;
const ROLE_COLOURS = {previous_token:"#1f77b4", first_token:"#7f7f7f", induction:"#d62728",
  coreference:"#2ca02c", local:"#ff7f0e", self:"#9467bd", mixed:"#cccccc"};
const rows = {};
for (const r of D.heads) rows[r.layer + "," + r.head] = r;
const roleOf = (l, h) => (rows[l + "," + h] || {}).role || "mixed";
const P = (l, h, i, j) => { const r = C.probs[l][h][i]; return j < r.length ? r[j] : 0; };
const el = (tag, attrs, text) => { const e = document.createElement(tag);
  for (const k in attrs || {}) e.setAttribute(k, attrs[k]); if (text !== undefined) e.textContent = text; return e; };
const show = s => s.replace(/\n/g, "\u21b5");
const num = (v, d) => v === null || v === undefined ? "n/a" : v.toFixed(d);

document.getElementById("title").textContent = D.title;
document.getElementById("model").textContent = D.model;
document.getElementById("text").innerHTML = "";
document.getElementById("text").append(el("b", {}, C.token_text.join("")), el("span", {style: "color:#2ca02c"}, D.continuation));
for (const line of D.summary) document.getElementById("summary").append(el("li", {}, line));

// Head view.
const layerSel = document.getElementById("layer"), headSel = document.getElementById("head");
for (let l = 0; l < L; l++) layerSel.append(el("option", {value: l}, l));
for (let h = 0; h < H; h++) headSel.append(el("option", {value: h}, h));
const left = document.getElementById("left"), right = document.getElementById("right");
const svg = document.getElementById("lines");
for (let i = 0; i < T; i++) {
  left.append(el("div", {class: "tok", "data-i": i, style: "text-align:right"}, show(C.token_text[i])));
  right.append(el("div", {class: "tok", "data-j": i}, show(C.token_text[i])));
}
svg.setAttribute("height", T * 18);
let lineCount = 0;
function drawHead() {
  const l = +layerSel.value, h = +headSel.value;
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  lineCount = 0;
  for (let i = 0; i < T; i++) for (let j = 0; j < T; j++) {
    const w = P(l, h, i, j);
    if (w < 0.02) continue;
    const ln = document.createElementNS("http://www.w3.org/2000/svg", "line");
    ln.setAttribute("x1", 0); ln.setAttribute("y1", i * 18 + 9);
    ln.setAttribute("x2", 300); ln.setAttribute("y2", j * 18 + 9);
    ln.setAttribute("stroke", ROLE_COLOURS[roleOf(l, h)] === "#cccccc" ? "#4a6fa5" : ROLE_COLOURS[roleOf(l, h)]);
    ln.setAttribute("stroke-width", 2); ln.setAttribute("stroke-opacity", w.toFixed(3));
    ln.setAttribute("data-i", i);
    const t = document.createElementNS("http://www.w3.org/2000/svg", "title");
    t.textContent = `${show(C.token_text[i])} → ${show(C.token_text[j])}: ${w.toFixed(3)}`;
    ln.append(t); svg.append(ln); lineCount++;
  }
  const r = rows[l + "," + h];
  document.getElementById("role").textContent = r ? `role: ${r.role}, importance ${num(r.importance, 3)}, key/value head ${r.kv_head}` : "";
  document.body.dataset.lines = lineCount;
}
left.addEventListener("mouseover", e => {
  const i = e.target.dataset.i; if (i === undefined) return;
  const l = +layerSel.value, h = +headSel.value, ws = [];
  for (let j = 0; j < T; j++) ws.push([P(l, h, +i, j), j]);
  ws.sort((a, b) => b[0] - a[0]);
  document.getElementById("hover").textContent = `"${show(C.token_text[i])}" attends to ` +
    ws.slice(0, 5).filter(x => x[0] > 0).map(x => `"${show(C.token_text[x[1]])}" ${x[0].toFixed(3)}`).join(", ");
  for (const ln of svg.children) ln.style.display = ln.dataset.i === i ? "" : "none";
});
left.addEventListener("mouseleave", () => { for (const ln of svg.children) ln.style.display = ""; });
layerSel.onchange = headSel.onchange = drawHead;
if (D.focus) { layerSel.value = D.focus[0]; headSel.value = D.focus[1]; }
drawHead();

// Model view.
const grid = document.getElementById("grid");
grid.style.gridTemplateColumns = `repeat(${H}, auto)`;
const px = Math.max(1, Math.floor(96 / T));
for (let l = 0; l < L; l++) for (let h = 0; h < H; h++) {
  const c = el("canvas", {width: T * px, height: T * px, title: `layer ${l} head ${h}: ${roleOf(l, h)}`});
  c.style.borderColor = ROLE_COLOURS[roleOf(l, h)];
  const g = c.getContext("2d");
  g.fillStyle = "#fff"; g.fillRect(0, 0, T * px, T * px);
  for (let i = 0; i < T; i++) for (let j = 0; j < T; j++) {
    const w = P(l, h, i, j); if (w <= 0) continue;
    g.fillStyle = `rgba(8,48,107,${Math.min(1, w).toFixed(3)})`; g.fillRect(j * px, i * px, px, px);
  }
  c.onclick = () => { layerSel.value = l; headSel.value = h; drawHead(); window.scrollTo(0, 0); };
  grid.append(c);
}
for (const k in ROLE_COLOURS) { const s = el("span"); const i = el("i"); i.style.background = ROLE_COLOURS[k]; s.append(i, k); document.getElementById("legend").append(s); }

// Head table.
const cols = [["layer", r => r.layer], ["head", r => r.head], ["kv head", r => r.kv_head], ["role", r => r.role],
  ["importance", r => r.importance], ["ablation (loss +)", r => r.ablation],
  ["previous token", r => r.scores.previous_token], ["prev. token (text)", r => r.scores.previous_token_text], ["first token", r => r.scores.first_token],
  ["local", r => r.scores.local], ["induction", r => r.scores.induction],
  ["coreference", r => r.scores.coreference], ["coref. accuracy", r => r.scores.coreference_accuracy],
  ["coref. by sentence", r => r.scores.coreference_sentence_accuracy]];
let sortCol = 0, sortDir = 1;
function drawTable() {
  const t = document.getElementById("table"); t.innerHTML = "";
  const hr = el("tr"); cols.forEach((c, k) => { const th = el("th", {}, c[0] + (k === sortCol ? (sortDir > 0 ? " ▲" : " ▼") : ""));
    th.onclick = () => { sortDir = sortCol === k ? -sortDir : 1; sortCol = k; drawTable(); }; hr.append(th); });
  t.append(hr);
  const data = D.heads.slice().sort((a, b) => { const x = cols[sortCol][1](a), y = cols[sortCol][1](b);
    return (x < y ? -1 : x > y ? 1 : 0) * sortDir; });
  for (const r of data) { const tr = el("tr"); cols.forEach((c, k) => { const v = c[1](r);
    const td = el("td", {class: k === 3 ? "l" : ""}, v === null || v === undefined ? "n/a" : typeof v === "number" && !Number.isInteger(v) ? v.toFixed(3) : v);
    if (k === 3) td.style.color = ROLE_COLOURS[v]; tr.append(td); }); t.append(tr); }
}
drawTable();

// Plots.
function plot(target, series, xLabel, yLabel) {
  const W = 520, Hh = 260, m = 40, all = series.flatMap(s => s.points);
  if (!all.length) { document.getElementById(target).append(el("p", {class: "muted"}, "not measured for this report")); return; }
  const xs = all.map(p => p[0]), ys = all.map(p => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  const X = x => m + (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5) * (W - 2 * m);
  const Y = y => Hh - m - (y1 > y0 ? (y - y0) / (y1 - y0) : 0.5) * (Hh - 2 * m);
  let s = `<svg width="${W}" height="${Hh}" xmlns="http://www.w3.org/2000/svg">` +
    `<line x1="${m}" y1="${Hh - m}" x2="${W - m}" y2="${Hh - m}" stroke="#999"/><line x1="${m}" y1="${m}" x2="${m}" y2="${Hh - m}" stroke="#999"/>` +
    `<text x="${W / 2}" y="${Hh - 8}" text-anchor="middle">${xLabel}</text><text x="10" y="${m - 10}">${yLabel}</text>` +
    `<text x="${m}" y="${Hh - m + 14}" text-anchor="middle">${x0}</text><text x="${W - m}" y="${Hh - m + 14}" text-anchor="middle">${x1}</text>` +
    `<text x="${m - 4}" y="${Y(y0)}" text-anchor="end">${y0.toFixed(3)}</text><text x="${m - 4}" y="${Y(y1) + 8}" text-anchor="end">${y1.toFixed(3)}</text>`;
  series.forEach((ser, k) => {
    s += `<polyline fill="none" stroke="${ser.colour}" stroke-width="2" points="${ser.points.map(p => X(p[0]) + "," + Y(p[1])).join(" ")}"/>`;
    for (const p of ser.points) s += `<circle cx="${X(p[0])}" cy="${Y(p[1])}" r="3" fill="${ser.colour}"><title>${ser.name}: ${p[0]} → ${p[1].toFixed(4)}</title></circle>`;
    s += `<text x="${W - m + 4}" y="${m + 14 * k}" fill="${ser.colour}">${ser.name}</text>`;
  });
  document.getElementById(target).innerHTML = s + "</svg>";
}
const curveColours = {importance: "#2ca02c", ablation: "#1f77b4", random: "#d62728"};
plot("curve", Object.keys(curveColours).map(k => ({name: k, colour: curveColours[k],
  points: D.curve.filter(p => p.method === k).map(p => [p.fraction, p.loss])})), "fraction of heads removed", D.curve_measure);
plot("sweep", [{name: "val loss", colour: "#1f77b4", points: D.sweep.map(r => [r.heads, r.val_loss])}], "heads (equal n_embd)", "validation loss");
if (D.sweep.length) {
  const t = el("table"); t.append(el("tr"));
  t.innerHTML = "<tr><th>heads</th><th>val loss</th><th>tokens/s</th><th>best previous-token</th><th>best induction</th><th>best coreference</th></tr>" +
    D.sweep.map(r => `<tr><td>${r.heads}</td><td>${r.val_loss.toFixed(4)}</td><td>${Math.round(r.tokens_per_second)}</td><td>${r.best_scores.previous_token.toFixed(3)}</td><td>${r.best_scores.induction.toFixed(3)}</td><td>${r.best_scores.coreference.toFixed(3)}</td></tr>`).join("");
  document.getElementById("sweep").append(t);
}
document.body.dataset.rendered = "ok";
</script></body></html>
)HTML";

}  // namespace headlight::viz::detail
