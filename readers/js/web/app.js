// The viewer page: two file slots (A, and B to compare with it), each opened from a local file
// (picker or drop; read lazily by Blob.slice) or a URL (HTTP range requests), through the
// reader's lazy path (src/lazy.js).  Each finished step sets data-state="done" on its element,
// which is what a test (or a person) waits for.  ?a=URL&b=URL opens URLs on load.

import { JFloat } from "../src/json.js";
import { blobSource, initWasmAsync, openAsync, redactUrl, urlSource, useWasm, wasmInfo } from "../src/index.js";
import { isGguf, readGguf } from "./gguf.js";
import { histogram, human, sqnr, tensorRow, toNumbers } from "./stats.js";
import { barChartSvg, histogramSvg } from "./charts.js";


/** @typedef {{f: import("../src/lazy.js").LazyFile|null, gguf?: Awaited<ReturnType<typeof readGguf>>|null, label: string, error: any}} Slot */
/** @type {Record<string, Slot|null>} */
const slots = { a: null, b: null };
let active = "a";
/** Bumped by every open: view work (a check, a histogram, the SQNR chart) started for an older
 * state drops its result. */
let generation = 0;
/** Bumped by each slot's own opens: an open superseded in its slot drops its result (one per
 * slot, so that opening B does not cancel A: ?a=...&b=... opens both). */
const opened = { a: 0, b: 0 };

const $ = (/** @type {string} */ s) => /** @type {HTMLElement} */ (document.querySelector(s));

/** @param {any} e */
function describe(e) {
  return e && e.code ? `${e.code}: ${e.message.replace(/^\[[A-Z0-9_]+\]\s*/, "")}` : String(e);
}

/** @param {string} slot @param {string} text @param {boolean} [bad] */
function status(slot, text, bad = false) {
  const p = $(`#slot-${slot} .status`);
  p.textContent = text;
  p.classList.toggle("error", bad);
}

/** @param {string} slot */
function summary(slot) {
  const s = /** @type {Slot} */ (slots[slot]);
  if (!s.f) return;
  status(slot, `${s.label}: ${s.f.keys().length} tensors, ${human(s.f.size)}; ${human(s.f.bytesFetched)} read so far`);
}

/** @param {HTMLElement} node @param {string} state */
const mark = (node, state) => node.setAttribute("data-state", state);

/** The descriptor as JSON text: exact integers and floats as the file wrote them. @param {unknown} d */
function jsonText(d) {
  return JSON.stringify(d, (_, v) => (v instanceof JFloat ? v.value : typeof v === "bigint" ? (Number.isSafeInteger(Number(v)) ? Number(v) : String(v)) : v), 2);
}

/** @param {string} slot @param {Blob|string} what @param {string} label */
async function open(slot, what, label) {
  if (typeof what === "string") label = redactUrl(label);  // user-info and a signed query are credentials: never on the page
  const gen = ++opened[/** @type {"a"|"b"} */ (slot)];
  generation++;
  slots[slot] = null;
  status(slot, `opening ${label}…`);
  mark($(`#slot-${slot}`), "opening");
  /** @type {Slot} */
  let s;
  try {
    const src = typeof what === "string" ? await urlSource(what) : blobSource(what);
    const head = src.size < 4 ? new Uint8Array(0) : "prefix" in src && src.prefix.length >= 4 ? src.prefix : await src.read(0, 4);
    // a GGUF file is listed from its own header; everything else is read as safetensors
    s = isGguf(head) ? { f: null, gguf: await readGguf(src), label, error: null } : { f: await openAsync(src), label, error: null };
  } catch (e) {
    s = { f: null, label, error: e };
  }
  if (gen !== opened[/** @type {"a"|"b"} */ (slot)]) return;
  slots[slot] = s;
  if (s.f) summary(slot);
  else if (s.gguf) status(slot, `${label}: GGUF version ${s.gguf.version}, ${s.gguf.tensors.length} tensors, ${s.gguf.kv.size} metadata keys`);
  else status(slot, `${label}: ${describe(s.error)}`, true);
  mark($(`#slot-${slot}`), "done");
  show(slot);
  compare();
}

/** Show slot `slot`'s table and check. @param {string} slot */
function show(slot) {
  active = slot;
  for (const k of Object.keys(slots)) $(`#slot-${k}`).classList.toggle("active", k === slot);
  const s = slots[slot];
  const tbody = /** @type {HTMLElement} */ ($("#tensors tbody"));
  tbody.replaceChildren();
  $("#showing").textContent = s ? `of ${slot.toUpperCase()} (${s.label})` : "";
  $("#descriptor").textContent = "Select a tensor.";
  $("#selected").textContent = "";
  $("#histogram").replaceChildren();
  $("#histogram").removeAttribute("data-state");
  $("#histogram-note").textContent = "";
  const problems = $("#problems");
  problems.replaceChildren();
  problems.removeAttribute("data-state");
  problems.classList.remove("ok");
  const button = /** @type {HTMLButtonElement} */ ($("#run-check"));
  button.hidden = true;
  if (!s) return;
  if (s.gguf) {
    showGguf(s.gguf, tbody);
    return;
  }
  if (!s.f) {  // refused when opened: that is the check's one problem
    listProblems([s.error]);
    return;
  }
  const f = s.f;
  for (const name of f.keys()) {
    const r = tensorRow(f, name);
    const tr = document.createElement("tr");
    tr.dataset.name = name;
    if (r.error) tr.classList.add("refused");
    const cells = [name, r.scheme, r.error ? `refused: ${r.error}` : `[${/** @type {number[]} */ (r.shape).join(", ")}]`, r.dtype,
      r.bitsPerWeight === null ? "" : r.bitsPerWeight.toFixed(3), human(r.bytes)];
    cells.forEach((c, i) => {
      const td = document.createElement("td");
      td.textContent = c;
      if (i >= 4) td.className = "num";
      tr.appendChild(td);
    });
    tr.addEventListener("click", () => select(slot, name, tr));
    tbody.appendChild(tr);
  }
  mark(tbody, "done");
  // what the header shows (no tensor bytes read); the full check reads every byte: on request
  listProblems(f.problems(), "No problems in the header. Run check to read every byte (payload rules and digests).");
  button.hidden = false;
}

/**
 * A GGUF file's tensors (listed from its header, not decoded) and what qformat's check says of it.
 * @param {Awaited<ReturnType<typeof readGguf>>} g @param {HTMLElement} tbody
 */
function showGguf(g, tbody) {
  for (const t of g.tensors) {
    const tr = document.createElement("tr");
    tr.dataset.name = t.name;
    const cells = [t.name, `gguf ${t.typeName}`, `[${t.shape.join(", ")}]`, "", t.bitsPerWeight.toFixed(3), human(t.bytes)];
    cells.forEach((c, i) => {
      const td = document.createElement("td");
      td.textContent = c;
      if (i >= 4) td.className = "num";
      tr.appendChild(td);
    });
    tr.addEventListener("click", () => {
      for (const row of document.querySelectorAll("#tensors tr.selected")) row.classList.remove("selected");
      tr.classList.add("selected");
      $("#selected").textContent = t.name;
      $("#descriptor").textContent = jsonText({ gguf_tensor: { type: t.typeName, shape: t.shape, offset: t.offset, bytes: t.bytes } });
      $("#histogram").replaceChildren();
      $("#histogram-note").textContent = "GGUF tensors are listed from the header, not decoded (convert the file with qformat convert).";
      mark($("#histogram"), "done");
    });
    tbody.appendChild(tr);
  }
  mark(tbody, "done");
  const arch = g.kv.get("general.architecture");
  listProblems([{ code: "NOT_SAFETENSORS", tensor: null, message: `a GGUF file (version ${g.version}${typeof arch === "string" ? `, ${arch}` : ""}): qformat checks safetensors files; qformat convert reads GGUF` }]);
}

/** @param {any[]} probs @param {string} [none] what an empty list says */
function listProblems(probs, none = "No problems: check passes.") {
  const ul = $("#problems");
  ul.replaceChildren();
  ul.classList.toggle("ok", probs.length === 0);
  if (!probs.length) ul.appendChild(Object.assign(document.createElement("li"), { textContent: none }));
  for (const p of probs) {
    const li = document.createElement("li");
    li.dataset.code = p.code ?? "";
    const code = Object.assign(document.createElement("span"), { className: "code", textContent: p.code ?? "error" });
    li.append(code, " ", p.tensor != null ? `(${p.tensor}) ` : "", describe(p).replace(/^[A-Z0-9_]+: /, ""));
    ul.appendChild(li);
  }
  mark(ul, "done");
}

/** @param {string} slot */
async function runCheck(slot) {
  const s = slots[slot];
  if (!s?.f) return;
  const gen = generation;
  mark($("#problems"), "running");
  let probs;
  try {
    probs = await s.f.check();
  } catch (e) {  // the transfer failed: shown as the one problem
    probs = [e];
  }
  s.f.release();
  if (gen !== generation || active !== slot) return;
  listProblems(probs);
  summary(slot);
}

/** @param {string} slot @param {string} name @param {HTMLElement} tr */
async function select(slot, name, tr) {
  const s = slots[slot];
  if (!s?.f) return;
  const f = s.f;
  for (const row of document.querySelectorAll("#tensors tr.selected")) row.classList.remove("selected");
  tr.classList.add("selected");
  $("#selected").textContent = name;
  const desc = f.descriptor(name);
  $("#descriptor").textContent = desc ? jsonText(desc) : `(a plain tensor: ${jsonText(Object.fromEntries([["dtype", tensorRow(f, name).dtype], ["shape", tensorRow(f, name).shape]]))})`;
  const box = $("#histogram");
  box.replaceChildren();
  mark(box, "running");
  const note = $("#histogram-note");
  note.textContent = "decoding…";
  const gen = generation;
  try {
    const t = await f.getTensor(name);
    const xs = toNumbers(t);
    if (gen !== generation) return;
    if (!xs) {
      note.textContent = `${t.dtype} values have no histogram here`;
    } else {
      const h = histogram(xs);
      box.appendChild(histogramSvg(h));
      let sum = 0;
      for (const x of xs) if (Number.isFinite(x)) sum += x;
      note.textContent = `${xs.length} values in [${h.lo}, ${h.hi}], mean ${(sum / Math.max(1, xs.length - h.nonfinite)).toPrecision(6)}` + (h.nonfinite ? `, ${h.nonfinite} NaN or infinite` : "");
    }
  } catch (e) {
    note.textContent = `not decoded: ${describe(e)}`;
    box.dataset.code = /** @type {any} */ (e).code ?? "";
  }
  f.release();
  summary(slot);
  mark(box, "done");
}

/** The SQNR of B against A for every tensor both have with the same shape. */
async function compare() {
  const out = $("#sqnr");
  const a = slots.a?.f;
  const b = slots.b?.f;
  out.removeAttribute("data-state");
  if (!a || !b) {
    out.replaceChildren(Object.assign(document.createElement("p"), { className: "note", textContent: "Open two safetensors files with tensors of the same names and shapes." }));
    return;
  }
  const gen = generation;
  out.replaceChildren(Object.assign(document.createElement("p"), { className: "note", textContent: "decoding both files…" }));
  const shape = (/** @type {import("../src/lazy.js").LazyFile} */ f, /** @type {string} */ n) => {
    try {
      return f.shape(n).join(",");
    } catch {
      return null;
    }
  };
  const names = a.keys().filter((n) => b.keys().includes(n) && shape(a, n) !== null && shape(a, n) === shape(b, n));
  /** @type {[string, number][]} */
  const rows = [];
  for (const n of names) {
    let v = NaN;
    try {
      const x = toNumbers(await a.getTensor(n));
      const y = toNumbers(await b.getTensor(n));
      if (x && y) v = sqnr(x, y);
    } catch {
      v = NaN;  // a tensor either file refuses has no SQNR
    }
    a.release();
    b.release();
    if (gen !== generation) return;
    rows.push([n, v]);
  }
  out.replaceChildren();
  if (!rows.length) out.appendChild(Object.assign(document.createElement("p"), { className: "note", textContent: "No tensor of A has a tensor of B with its name and shape." }));
  else out.appendChild(barChartSvg(rows, "dB"));
  if (slots.a) summary("a");
  if (slots.b) summary("b");
  mark(out, "done");
}

for (const slot of Object.keys(slots)) {
  const root = $(`#slot-${slot}`);
  const picker = /** @type {HTMLInputElement} */ (root.querySelector(".picker"));
  picker.addEventListener("change", () => {
    const file = picker.files?.[0];
    if (file) open(slot, file, file.name);
  });
  const drop = /** @type {HTMLElement} */ (root.querySelector(".drop"));
  root.addEventListener("dragover", (e) => {
    e.preventDefault();
    drop.classList.add("over");
  });
  root.addEventListener("dragleave", () => drop.classList.remove("over"));
  root.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    const file = e.dataTransfer?.files?.[0];
    if (file) open(slot, file, file.name);
  });
  const form = /** @type {HTMLFormElement} */ (root.querySelector("form.url"));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const url = /** @type {HTMLInputElement} */ (form.querySelector("input")).value.trim();
    if (url) open(slot, new URL(url, location.href).href, url);
  });
  root.addEventListener("click", (e) => {
    if (slots[slot] && active !== slot && !(e.target instanceof HTMLInputElement || e.target instanceof HTMLButtonElement)) show(slot);
  });
}
$("#run-check").addEventListener("click", () => {
  /** @type {HTMLButtonElement} */ ($("#run-check")).hidden = true;
  runCheck(active);
});
const params = new URLSearchParams(location.search);
// libqformat as WebAssembly decodes what the page shows (src/wasm.js; ?decoder=js: the
// JavaScript decoder; ?decoder=wasm: the module for every tensor, small ones too); where it does
// not load, the JavaScript decoder does, with the same bits.  data-decoder on <html> says which.
const decoder = params.get("decoder");
if (decoder !== "js" && (await initWasmAsync(fetch(new URL("../wasm/qformat.wasm", import.meta.url))))) useWasm(decoder === "wasm" ? "always" : true);
else useWasm(false);
document.documentElement.dataset.decoder = wasmInfo().path;
for (const slot of Object.keys(slots)) {
  const u = params.get(slot);
  if (u) /** @type {HTMLInputElement} */ ($(`#slot-${slot} form.url input`)).value = u;
  if (u) open(slot, new URL(u, location.href).href, u);
}
