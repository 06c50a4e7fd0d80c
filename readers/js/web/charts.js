// Inline SVG charts: a histogram and a labelled bar chart.  Each mark carries its number in a
// data- attribute, so what is drawn can be read back (the browser test does).

const NS = "http://www.w3.org/2000/svg";

/** @param {string} tag @param {Record<string, string|number>} attrs @param {string} [text] */
function el(tag, attrs, text) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

/** @param {number} x */
const fmt = (x) => (Math.abs(x) >= 1e4 || (Math.abs(x) < 1e-3 && x !== 0) ? x.toExponential(2) : String(+x.toFixed(4)));

/**
 * The histogram of web/stats.js's histogram() as an SVG element.
 * @param {{lo: number, hi: number, counts: number[], nonfinite: number}} h
 */
export function histogramSvg(h, width = 640, height = 220) {
  const pad = { l: 48, r: 12, t: 10, b: 34 };
  const svg = el("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "histogram", role: "img" });
  let max = 1;  // a loop: Math.max(...list) overflows the stack on long lists
  for (const c of h.counts) if (c > max) max = c;
  const bw = (width - pad.l - pad.r) / h.counts.length;
  const ih = height - pad.t - pad.b;
  h.counts.forEach((c, i) => {
    const bh = (c / max) * ih;
    const r = el("rect", { x: pad.l + i * bw, y: pad.t + ih - bh, width: Math.max(1, bw - 1), height: bh, "data-count": c, class: "bar" });
    r.appendChild(el("title", {}, `[${fmt(h.lo + (i * (h.hi - h.lo)) / h.counts.length)}, ${fmt(h.lo + ((i + 1) * (h.hi - h.lo)) / h.counts.length)}): ${c}`));
    svg.appendChild(r);
  });
  svg.appendChild(el("line", { x1: pad.l, y1: pad.t + ih, x2: width - pad.r, y2: pad.t + ih, stroke: "#444" }));
  svg.appendChild(el("text", { x: pad.l, y: height - 12, "font-size": 11 }, fmt(h.lo)));
  svg.appendChild(el("text", { x: width - pad.r, y: height - 12, "font-size": 11, "text-anchor": "end" }, fmt(h.hi)));
  svg.appendChild(el("text", { x: pad.l - 4, y: pad.t + 10, "font-size": 11, "text-anchor": "end" }, String(max)));
  return svg;
}

/**
 * Horizontal bars, one per [label, value] (NaN: no bar; Infinity: a full bar marked "∞").
 * @param {[string, number][]} rows @param {string} unit
 */
export function barChartSvg(rows, unit, width = 640) {
  const rowH = 20;
  const labelW = 260;
  const height = rows.length * rowH + 20;
  const svg = el("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "bars", role: "img" });
  let max = 1;  // a loop: Math.max(...list) overflows the stack with one row per tensor of a large file
  for (const [, v] of rows) if (Number.isFinite(v) && Math.abs(v) > max) max = Math.abs(v);
  const span = width - labelW - 80;
  // the largest finite value takes 80 % of the span, so an exact (infinite) value, drawn at the
  // whole span in its own class, is visibly longer than any finite one
  const finiteSpan = 0.8 * span;
  rows.forEach(([label, v], i) => {
    const y = 10 + i * rowH;
    svg.appendChild(el("text", { x: labelW - 6, y: y + 14, "font-size": 12, "text-anchor": "end" }, label.length > 40 ? "…" + label.slice(-39) : label));
    const len = Number.isNaN(v) ? 0 : Number.isFinite(v) ? (Math.max(0, v) / max) * finiteSpan : span;
    const cls = v === Infinity ? "bar exact" : "bar";
    const bar = el("rect", { x: labelW, y: y + 3, width: Math.max(len, 0), height: rowH - 6, class: cls, "data-label": label, "data-value": String(v) });
    svg.appendChild(bar);
    const text = Number.isNaN(v) ? "n/a" : Number.isFinite(v) ? `${v.toFixed(2)} ${unit}` : `∞ (identical)`;
    svg.appendChild(el("text", { x: labelW + len + 6, y: y + 14, "font-size": 12 }, text));
  });
  return svg;
}
