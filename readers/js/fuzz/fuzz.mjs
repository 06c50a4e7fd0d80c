#!/usr/bin/env node
// A coverage-guided fuzzer of the JavaScript reader, in Node itself (atheris cannot see
// JavaScript coverage).  Each input goes through the reader's command protocol
// (bin/protocol.mjs: the --batch decode of qformat-read, the --check checker) and through the
// lazy path (src/lazy.js: openBytesAsync, loadAll, check); V8's block coverage
// (node:inspector, Profiler.startPreciseCoverage {detailed, callCount}) of readers/js/src and bin
// says which blocks it reached, with hit counts in AFL-style buckets; an input that reaches a
// new one joins the corpus and is mutated further.
//
// The oracle: every input decodes, or ends in a QFormatError (whose code is registered: the
// class refuses any other).  A finding is anything else: an exception without a code ("crash":
// TypeError, RangeError, a stack overflow ...), a decode and a lazy read that disagree
// ("differs"), a run past --timeout-ms ("hang"), an array over 256 MiB or a JavaScript heap past
// 1 GiB from an input of at most 1 MiB ("memory").
//
//   node readers/js/fuzz/fuzz.mjs [--seed N] [--execs N] [--seconds S] [--seeds DIR]...
//        [--findings DIR] [--timeout-ms MS] [--report-s S] [--json] [--replay FILE...]
//
// Seeds: every conformance case (conformance/v1: single files, and each sharded case's index
// with its shards), plus every file under each --seeds DIR.  It prints a status line every
// --report-s seconds (executions, executions/s, corpus, blocks, features, findings) and at the
// end one JSON line with the totals; findings are written to --findings (default: a temporary
// folder), one input file and one .txt per distinct finding.  --replay runs files through the
// same oracle once (no mutation) and reports each (the regression test's use).
// Exit status: 0 without findings, 1 with.

import { Worker, isMainThread, parentPort, workerData } from "node:worker_threads";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, statSync, writeFileSync, copyFileSync, rmSync } from "node:fs";
import { createHash } from "node:crypto";
import { tmpdir } from "node:os";
import { basename, dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const HERE = dirname(fileURLToPath(import.meta.url));
const JS = resolve(HERE, "..");
const ROOT = resolve(JS, "..", "..");
/** Inputs are cut to this length. */
const MAX_INPUT = 1 << 20;
/**
 * Whether two plain safetensors files the command wrote hold the same tensors bit for bit, NaN by
 * class (any NaN matches any NaN: the JavaScript decoder's arithmetic canonicalizes a NaN's
 * payload, the C library's keeps it).  Returns null, or where they differ.
 * @param {Buffer} a @param {Buffer} b @returns {string|null}
 */
function sameBits(a, b) {
  if (a.equals(b)) return null;
  const parse = (/** @type {Buffer} */ f) => {
    const n = Number(f.readBigUInt64LE(0));
    return { head: f.subarray(0, 8 + n), meta: JSON.parse(f.subarray(8, 8 + n).toString("utf8")), data: f.subarray(8 + n) };
  };
  const [x, y] = [parse(a), parse(b)];
  if (!x.head.equals(y.head)) return "the headers differ";
  const nan = { F32: [4, (/** @type {number} */ w) => (w & 0x7fffffff) > 0x7f800000], F16: [2, (/** @type {number} */ w) => (w & 0x7fff) > 0x7c00],
                BF16: [2, (/** @type {number} */ w) => (w & 0x7fff) > 0x7f80] };
  for (const [name, e] of Object.entries(x.meta)) {
    if (name === "__metadata__") continue;
    const [lo, hi] = e.data_offsets;
    const [p, q] = [x.data.subarray(lo, hi), y.data.subarray(lo, hi)];
    if (p.equals(q)) continue;
    const rule = /** @type {any} */ (nan)[e.dtype];
    if (!rule) return `${name} (${e.dtype})`;
    const [size, isNan] = rule;
    for (let i = 0; i < p.length; i += size) {
      const [u, v] = size === 4 ? [p.readUInt32LE(i), q.readUInt32LE(i)] : [p.readUInt16LE(i), q.readUInt16LE(i)];
      if (u !== v && !(isNan(u) && isNan(v))) return `${name} element ${i / size}: ${u.toString(16)} against ${v.toString(16)}`;
    }
  }
  return null;
}

/** One typed array past this from an input of at most MAX_INPUT bytes is a finding. */
const MAX_ARRAY_BYTES = 256 << 20;
const HEAP_MB = 1024;

// ---------------------------------------------------------------------------------------------
// seeds

/**
 * @typedef {{kind: "file", bytes: Uint8Array, name: string} | {kind: "index", bytes: Uint8Array, name: string, dir: string}} Input
 * kind "index": bytes are a *.safetensors.index.json read next to the shards of folder `dir`
 */

/** @param {string[]} extra @returns {Input[]} */
function loadSeeds(extra) {
  /** @type {Input[]} */
  const out = [];
  const corpus = join(ROOT, "conformance", "v1");
  if (existsSync(join(corpus, "manifest.json"))) {
    for (const c of JSON.parse(readFileSync(join(corpus, "manifest.json"), "utf8")).cases) {
      const p = join(corpus, c.input);
      if (!existsSync(p)) continue;
      if (c.input.endsWith(".json")) out.push({ kind: "index", bytes: readFileSync(p), name: c.id, dir: dirname(p) });
      else out.push({ kind: "file", bytes: readFileSync(p), name: c.id });
    }
  }
  for (const d of extra) {
    for (const f of readdirSync(d).sort()) {
      const p = join(d, f);
      if (!statSync(p).isFile()) continue;
      out.push({ kind: "file", bytes: readFileSync(p).subarray(0, MAX_INPUT), name: `${basename(d)}/${f}` });
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// mutations (seeded: the same --seed gives the same inputs)

/** mulberry32 */
function rng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    next,
    int: (/** @type {number} */ n) => Math.floor(next() * n),
    pick: (/** @type {any[]} */ xs) => xs[Math.floor(next() * xs.length)],
  };
}

const INTERESTING_BYTES = [0x00, 0x01, 0x20, 0x22, 0x2c, 0x2d, 0x2e, 0x30, 0x31, 0x39, 0x3a, 0x5b, 0x5c, 0x5d, 0x65, 0x7b, 0x7d, 0x7f, 0x80, 0xc0, 0xed, 0xf0, 0xfe, 0xff];
const INTERESTING_INTS = [0n, 1n, 2n, 7n, 8n, 9n, 15n, 16n, 31n, 32n, 63n, 64n, 127n, 128n, 255n, 256n, 1023n, 1024n, 4095n, 65535n, 65536n,
  2n ** 24n, 2n ** 31n - 1n, 2n ** 31n, 2n ** 32n - 1n, 2n ** 32n, 2n ** 53n - 1n, 2n ** 53n, 2n ** 53n + 1n, 2n ** 63n - 1n, 2n ** 63n, 2n ** 64n - 1n, 2n ** 64n,
  100000000n, 100000001n, 16777216n, 16777217n];
const NUMBERS_TEXT = ["-1", "0", "1", "2", "3", "4", "7", "8", "16", "32", "64", "65", "255", "256", "-0", "0.5", "1e3", "1.0", "1e308", "-1e308", "1e-320",
  "9007199254740991", "9007199254740992", "9007199254740993", "18446744073709551615", "18446744073709551616", "4294967296", "4294967297",
  "100000000", "340282366920938463463374607431768211456", "1" + "0".repeat(120), "2147483648", "-2147483649"];
const KEYS = ["version", "tensors", "extensions", "digests", "algorithm", "shape", "dtype", "codes", "zero", "scale", "bias", "layout", "parameters",
  "allow_nonfinite_params", "scheme", "element", "packing", "tensor", "type", "bits", "signedness", "code_offset", "frac_bits", "format", "table",
  "table_tensor", "container", "bit_order", "axis", "order", "straddle", "slot_order", "planes", "row_alignment", "blocks", "size", "index", "count",
  "op", "encoded", "name", "must_understand", "span", "data_offsets", "__metadata__", "qformat", "weight_map", "metadata"];
const STRINGS = ["", "int", "float", "codebook", "unsigned", "twos_complement", "offset_binary", "lsb_first", "msb_first", "grid", "flat", "multiply",
  "divide", "add", "subtract", "float32", "float16", "bfloat16", "canonical", "marlin_dense", "tinygemm_int4_cuda", "tinygemm_int4_cpu", "nf4", "fp4",
  "e4m3fn", "e5m2", "e8m0fnu", "e2m1fn", "1.0", "1.1", "1.2", "1.3", "2.0", "sha256", "sha512", "org.example.x", "qformat.x", "F32", "F16", "BF16", "U8",
  "I8", "U16", "I16", "U32", "I32", "I64", "U64", "F64", "F4", "F6_E2M3", "F8_E4M3", "F8_E8M0", "BOOL", "C64", "w", "w.codes", "w.scale", "w.zero",
  "\ud800", "\u0000", "__metadata__", "a/../b", "x".repeat(300)];

/** @param {Uint8Array} b */
function splitFile(b) {
  if (b.length < 8) return null;
  const n = new DataView(b.buffer, b.byteOffset, 8).getBigUint64(0, true);
  if (n === 0n || n > BigInt(b.length - 8)) return null;
  return { head: new TextDecoder().decode(b.subarray(8, 8 + Number(n))), body: b.subarray(8 + Number(n)) };
}

/** @param {string} head @param {Uint8Array} body @param {boolean} pad */
function joinFile(head, body, pad = true) {
  let h = new TextEncoder().encode(head);
  if (pad && h.length % 8) {
    const p = new Uint8Array(h.length + (8 - (h.length % 8))).fill(0x20);
    p.set(h);
    h = p;
  }
  const out = new Uint8Array(8 + h.length + body.length);
  new DataView(out.buffer).setBigUint64(0, BigInt(h.length), true);
  out.set(h, 8);
  out.set(body, 8 + h.length);
  return out;
}

/** A random JSON value (small). */
function randomValue(r, depth = 0) {
  const k = r.int(10);
  if (k === 0 && depth < 2) return Array.from({ length: r.int(4) }, () => randomValue(r, depth + 1));
  if (k === 1 && depth < 2) return Object.fromEntries(Array.from({ length: r.int(3) }, () => [r.pick(KEYS), randomValue(r, depth + 1)]));
  if (k <= 4) return { __num: r.pick(NUMBERS_TEXT) };
  if (k <= 7) return r.pick(STRINGS);
  return r.pick([null, true, false, [], {}, [0], [1, 0], [0, 1], [1, 32], [32, 1], { type: "grid", size: [1, 32] }]);
}

/** JSON text of a value from randomValue (numbers keep their text: exact big integers). */
function toText(v) {
  return JSON.stringify(v, (_, x) => (x && typeof x === "object" && "__num" in x ? `\u0001${x.__num}\u0001` : x)).replace(/"\\u0001([^"]*)\\u0001"/g, "$1");
}

/** Every path (list of keys) to a node of a parsed JSON value. */
function paths(v, at = [], out = []) {
  out.push(at);
  if (Array.isArray(v)) v.forEach((x, i) => paths(x, [...at, i], out));
  else if (v && typeof v === "object") for (const k of Object.keys(v)) paths(v[k], [...at, k], out);
  return out;
}

/** One edit of a parsed JSON object: replace, delete or add a member. @returns {boolean} */
function editJson(r, obj) {
  const ps = paths(obj).filter((p) => p.length);
  if (!ps.length) return false;
  const p = r.pick(ps);
  let parent = obj;
  for (const k of p.slice(0, -1)) parent = parent[k];
  const last = p[p.length - 1];
  const op = r.int(6);
  if (op <= 2) parent[last] = randomValue(r);
  else if (op === 3) {
    if (Array.isArray(parent)) parent.splice(last, 1);
    else delete parent[last];
  } else if (op === 4 && parent && typeof parent === "object" && !Array.isArray(parent)) parent[r.pick(KEYS)] = randomValue(r);
  else if (op === 5 && Array.isArray(parent)) parent.push(randomValue(r));
  else parent[last] = randomValue(r);
  return true;
}

/**
 * A mutant of `input` (sometimes crossed with `other`).
 * @param {ReturnType<typeof rng>} r @param {Uint8Array} input @param {Uint8Array} other @param {"file"|"index"} kind
 */
function mutate(r, input, other, kind) {
  let b = input;
  const rounds = 1 + r.int(r.next() < 0.8 ? 2 : 6);
  for (let i = 0; i < rounds; i++) {
    const op = r.int(kind === "index" ? 9 : 14);
    if (op >= 9) b = mutateStructured(r, b, op) ?? b;
    else b = mutateBytes(r, b, other, op);
  }
  return b.length > MAX_INPUT ? b.subarray(0, MAX_INPUT) : b;
}

/** @param {ReturnType<typeof rng>} r @param {Uint8Array} b @param {Uint8Array} other @param {number} op */
function mutateBytes(r, b, other, op) {
  const out = Uint8Array.from(b);
  const at = r.int(Math.max(1, out.length));
  switch (op) {
    case 0: // flip a bit
      if (out.length) out[at] ^= 1 << r.int(8);
      return out;
    case 1: // an interesting byte
      if (out.length) out[at] = r.pick(INTERESTING_BYTES);
      return out;
    case 2: { // an interesting integer, 1/2/4/8 bytes little-endian
      const w = r.pick([1, 2, 4, 8]);
      const v = r.pick(INTERESTING_INTS) * (r.next() < 0.2 ? -1n : 1n);
      const bytes = new Uint8Array(8);
      new DataView(bytes.buffer).setBigUint64(0, BigInt.asUintN(64, v), true);
      const pos = r.next() < 0.3 ? 0 : at;
      for (let k = 0; k < w && pos + k < out.length; k++) out[pos + k] = bytes[k];
      return out;
    }
    case 3: { // insert random bytes
      const n = 1 + r.int(r.next() < 0.9 ? 8 : 256);
      const ins = Uint8Array.from({ length: n }, () => (r.next() < 0.5 ? r.pick(INTERESTING_BYTES) : r.int(256)));
      return concat(out.subarray(0, at), ins, out.subarray(at));
    }
    case 4: // delete a range
      return concat(out.subarray(0, at), out.subarray(Math.min(out.length, at + 1 + r.int(16))));
    case 5: // truncate
      return out.subarray(0, at);
    case 6: { // duplicate a range
      const n = 1 + r.int(Math.min(64, Math.max(1, out.length - at)));
      return concat(out.subarray(0, at), out.subarray(at, at + n), out.subarray(at));
    }
    case 7: { // splice with another input
      const cut = r.int(Math.max(1, other.length));
      return concat(out.subarray(0, at), other.subarray(cut, cut + 1 + r.int(256)));
    }
    default: { // overwrite with a range of another input
      const from = r.int(Math.max(1, other.length));
      const piece = other.subarray(from, from + 1 + r.int(64));
      out.set(piece.subarray(0, Math.max(0, out.length - at)), at);
      return out;
    }
  }
}

/** @param {...Uint8Array} parts */
function concat(...parts) {
  let n = 0;
  for (const p of parts) n += p.length;
  const out = new Uint8Array(n);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/**
 * Mutations that know the layout: JSON edits of the header (tensor entries, metadata) or of the
 * qformat object inside it; a number in the header text replaced; payload bytes; the length
 * prefix set to the header's own length or off by a little.
 * @param {ReturnType<typeof rng>} r @param {Uint8Array} b @param {number} op
 */
function mutateStructured(r, b, op) {
  const parts = splitFile(b);
  if (!parts) return null;
  const { head, body } = parts;
  if (op === 9 || op === 10) { // JSON edit of the header or of the qformat object
    let h;
    try {
      h = JSON.parse(head);
    } catch {
      return null;
    }
    if (!h || typeof h !== "object") return null;
    const q = h.__metadata__?.qformat;
    let target = h;
    let qobj = null;
    if (typeof q === "string" && r.next() < 0.8) {
      try {
        qobj = JSON.parse(q);
        target = qobj;
      } catch {
        qobj = null;
      }
    }
    if (!target || typeof target !== "object") return null;
    for (let i = 1 + r.int(3); i > 0; i--) editJson(r, target);
    if (qobj !== null) h.__metadata__.qformat = toText(qobj);
    return joinFile(toText(h), body, r.next() < 0.95);
  }
  if (op === 11) { // a number in the header text
    const nums = [...head.matchAll(/-?\d+(\.\d+)?([eE][-+]?\d+)?/g)];
    if (!nums.length) return null;
    const m = r.pick(nums);
    const text = head.slice(0, m.index) + r.pick(NUMBERS_TEXT) + head.slice(/** @type {number} */ (m.index) + m[0].length);
    return joinFile(text, body, r.next() < 0.9);
  }
  if (op === 12) { // payload bytes
    if (!body.length) return null;
    const out = Uint8Array.from(b);
    const start = b.length - body.length;
    for (let i = 1 + r.int(8); i > 0; i--) out[start + r.int(body.length)] = r.next() < 0.5 ? r.pick(INTERESTING_BYTES) : r.int(256);
    return out;
  }
  // the length prefix
  const out = Uint8Array.from(b);
  const n = BigInt(head.length) + BigInt(r.pick([-9, -8, -1, 0, 1, 8, 9]));
  new DataView(out.buffer).setBigUint64(0, BigInt.asUintN(64, n), true);
  return out;
}

// ---------------------------------------------------------------------------------------------
// the worker: runs inputs through the reader with coverage

async function workerMain() {
  const { seed, execs: maxExecs, seconds, seeds, corpus: saved, replay, shared, dirs } = workerData;
  const state = new Int32Array(shared, 0, 4);  // [executions, input length, running, 0 | 1 + index folder]
  const current = new Uint8Array(shared, 16);
  capTypedArrays();
  const { Session } = await import("node:inspector");
  const session = new Session();
  session.connect();
  const post = (/** @type {string} */ m, /** @type {any} */ p = {}) => {
    let out;
    let err;
    session.post(m, p, (e, r) => {
      err = e;
      out = r;
    });
    if (err) throw err;
    return /** @type {any} */ (out);
  };
  post("Profiler.enable");
  post("Profiler.startPreciseCoverage", { callCount: true, detailed: true });
  // imported after coverage starts, so that every function has block counters
  const protocol = await import(join(JS, "bin", "protocol.mjs"));
  const core = await import(join(JS, "src", "node.js"));
  const { QFormatError, openBytesAsync, openUrl } = core;
  const work = mkdtempSync(join(existsSync("/dev/shm") ? "/dev/shm" : tmpdir(), "qformat-jsfuzz-"));
  parentPort?.postMessage({ type: "work", dir: work });  // removed by the main thread when this worker ends, however it ends
  const shardDirs = new Map();
  post("Profiler.takePreciseCoverage");

  /** The folder an index input is read in: a copy of its case's shards. @param {string} dir */
  const shardsFor = (dir) => {
    let d = shardDirs.get(dir);
    if (!d) {
      d = join(work, `shards-${shardDirs.size}`);
      mkdirSync(d);
      for (const f of readdirSync(dir)) if (f.endsWith(".safetensors")) copyFileSync(join(dir, f), join(d, f));
      shardDirs.set(dir, d);
    }
    return d;
  };

  const srcPrefix = "file://" + join(JS, "src") + "/";
  const binPrefix = "file://" + join(JS, "bin") + "/";
  /** feature -> true; blocks seen */
  const features = new Set();
  const blocks = new Set();
  const bucket = (/** @type {number} */ c) => (c <= 3 ? c : c < 8 ? 4 : c < 16 ? 5 : c < 32 ? 6 : c < 128 ? 7 : 8);
  /** The features of the coverage since the last take: new ones are added; returns how many were new. */
  const newFeatures = () => {
    const cov = post("Profiler.takePreciseCoverage").result;
    let fresh = 0;
    for (const script of cov) {
      if (!script.url.startsWith(srcPrefix) && !script.url.startsWith(binPrefix)) continue;
      const sid = script.url.slice(script.url.lastIndexOf("/") + 1);
      for (const fn of script.functions) {
        for (const rg of fn.ranges) {
          if (rg.count === 0) continue;
          const key = `${sid}:${rg.startOffset}:${rg.endOffset}`;
          if (!blocks.has(key)) blocks.add(key);
          const f = `${key}:${bucket(rg.count)}`;
          if (!features.has(f)) {
            features.add(f);
            fresh++;
          }
        }
      }
    }
    return fresh;
  };

  const inPath = join(work, "input.safetensors");
  const outPath = join(work, "output.safetensors");
  /** A finding's kind and message for a thrown value that is not a QFormatError. */
  const uncoded = (/** @type {any} */ e) => (e?.name === "FuzzArrayLimit" ? ["memory", String(e.message)] : ["crash", String(e?.stack ?? e)]);

  /**
   * Run one input through the command protocol and the lazy path.  Returns null, or the
   * finding {kind, message}.
   * @param {Input} inp
   */
  const run = async (inp) => {
    state[1] = inp.bytes.length;
    current.set(inp.bytes.subarray(0, current.length));
    state[3] = inp.kind === "index" ? 1 + dirs.indexOf(inp.dir) : 0;
    state[2] = 1;
    try {
      if (inp.kind === "index") {
        const dir = shardsFor(inp.dir);
        const idx = join(dir, "fuzz.safetensors.index.json");
        writeFileSync(idx, inp.bytes);
        const res = protocol.batchEntry(`${idx}\t${outPath}`);
        if (res.crash) return { kind: "crash", message: res.crash };
        return null;
      }
      writeFileSync(inPath, inp.bytes);
      // in JavaScript (the WebAssembly path is compared with it below, for every tensor)
      const wasWasm = core.useWasm(false);
      let res;
      try {
        res = protocol.batchEntry(`${inPath}\t${outPath}`);
      } finally {
        core.useWasm(wasWasm);
      }
      if (res.crash) return { kind: "crash", message: res.crash };
      // the WebAssembly decoder (libqformat, src/wasm.js), for every tensor, against the
      // JavaScript one above: the same code, or the same bits written (NaN by class)
      if (core.wasmInfo().loaded) {
        const jsOut = res.code === null ? readFileSync(outPath) : null;
        const was = core.useWasm("always");
        let wasm;
        try {
          wasm = protocol.batchEntry(`${inPath}\t${outPath}`);
        } finally {
          core.useWasm(was);
        }
        if (wasm.crash) return { kind: "crash", message: `through WebAssembly: ${wasm.crash}` };
        if (wasm.code !== res.code) return { kind: "differs", message: `in JavaScript ${res.code ?? "decoded"}, through WebAssembly ${wasm.code ?? "decoded"}` };
        const diff = jsOut === null ? null : sameBits(readFileSync(outPath), jsOut);
        if (diff !== null) return { kind: "differs", message: `WebAssembly and JavaScript decoded different bits: ${diff}` };
      }
      let checked;
      try {
        checked = core.check(inp.bytes, { digests: true }).map((/** @type {any} */ p) => p.code);
        for (const l of protocol.checkLines(inPath)) if (!/^[A-Z][A-Z0-9_]*\t/.test(l)) return { kind: "crash", message: `--check printed ${JSON.stringify(l)}` };
      } catch (e) {
        const [kind, message] = uncoded(e);
        return { kind, message: `check: ${message}` };
      }
      // the lazy path (URLs, Blobs): the same answers as the command's.  loadAll through bytes in
      // memory or src/http.js's range reads (answered in process, as a range server would, with
      // a probe that covers the header or not); check through bytes in memory
      let lazyCode = null;
      let lazyChecked = null;
      try {
        // (one input in four by URL: a Response costs more than the reader's work on a small file)
        const viaUrl = inp.bytes.length % 4 === 0;
        const probeBytes = inp.bytes.length % 3 === 0 ? 65536 : 8 + (inp.bytes.length % 61);
        const f = viaUrl ? await openUrl("http://fuzz.invalid/input.safetensors", { fetch: rangeServer(inp.bytes), probeBytes, retries: 0, parallel: 2 })
          : await openBytesAsync(inp.bytes, { parallel: 2 });
        try {
          await f.loadAll();
        } catch (e) {
          if (!(e instanceof QFormatError)) throw e;
          lazyCode = e.code;
        }
      } catch (e) {
        if (!(e instanceof QFormatError)) {
          const [kind, message] = uncoded(e);
          return { kind, message: `lazy: ${message}` };
        }
        lazyCode = e.code;
      }
      try {
        const f = await openBytesAsync(inp.bytes, { parallel: 2 });
        lazyChecked = (await f.check({ digests: true })).map((/** @type {any} */ p) => p.code);
      } catch (e) {
        if (!(e instanceof QFormatError)) {
          const [kind, message] = uncoded(e);
          return { kind, message: `lazy check: ${message}` };
        }
        lazyChecked = [e.code];
      }
      if (lazyCode !== res.code) return { kind: "differs", message: `the command says ${res.code ?? "decoded"}, the lazy path ${lazyCode ?? "decoded"}` };
      if (lazyChecked !== null && lazyChecked.join() !== checked.join()) return { kind: "differs", message: `check: ${checked} but through the lazy path ${lazyChecked}` };
      // one input in eight also through a server that misbehaves on one of its answers
      // (src/http.js's checks): a decode or a coded refusal, nothing else
      const h = hash32(inp.bytes);
      if (h % 8 === 1) {
        const fault = FAULTS[(h >>> 3) % FAULTS.length];
        try {
          const f = await openUrl("http://fuzz.invalid/input.safetensors", { fetch: rangeServer(inp.bytes, fault, (h >>> 9) % 3), probeBytes: 8 + (h >>> 11) % 64, retries: 1, backoffMs: 0, parallel: 2 });
          await f.loadAll();
        } catch (e) {
          if (!(e instanceof QFormatError)) {
            const [kind, message] = uncoded(e);
            return { kind, message: `server fault ${fault}: ${message}` };
          }
        }
      }
      return null;
    } catch (e) {
      const [kind, message] = uncoded(e);
      return { kind, message: `harness: ${message}` };
    } finally {
      state[2] = 0;
      Atomics.add(state, 0, 1);
    }
  };

  if (replay) {
    for (const inp of replay) {
      const f = await run(inp);
      parentPort?.postMessage({ type: "replayed", name: inp.name, finding: f });
    }
    return;
  }

  /** @type {Input[]} */
  const corpus = [];
  const r = rng(seed);
  let execs = 0;
  const start = Date.now();
  const add = async (/** @type {Input} */ inp, /** @type {boolean} */ keepAnyway) => {
    const f = await run(inp);
    execs++;
    const fresh = newFeatures();
    if (f) parentPort?.postMessage({ type: "finding", ...f, input: inp });
    if (fresh > 0 || keepAnyway) {
      corpus.push(inp);
      if (!keepAnyway) parentPort?.postMessage({ type: "corpus", input: inp });
    }
  };
  for (const s of [...seeds, ...saved]) await add(s, true);
  let lastReport = Date.now();
  while (execs < maxExecs && Date.now() - start < seconds * 1000) {
    // newer corpus entries (they found something) are picked more often
    const i = r.next() < 0.5 ? corpus.length - 1 - r.int(Math.min(corpus.length, 64)) : r.int(corpus.length);
    const base = corpus[i];
    const other = corpus[r.int(corpus.length)];
    const bytes = mutate(r, base.bytes, other.kind === base.kind ? other.bytes : base.bytes, base.kind);
    await add({ ...base, bytes, name: `${base.name}+` }, false);
    if (Date.now() - lastReport > 1000) {
      lastReport = Date.now();
      parentPort?.postMessage({ type: "status", execs, corpus: corpus.length, blocks: blocks.size, features: features.size });
    }
  }
  parentPort?.postMessage({ type: "status", execs, corpus: corpus.length, blocks: blocks.size, features: features.size, final: true });
}

/** FNV-1a of the bytes: picks an input's server fault, the same on every run. @param {Uint8Array} b */
function hash32(b) {
  let h = 0x811c9dc5;
  for (let i = 0; i < b.length; i++) h = Math.imul(h ^ b[i], 16777619);
  return h >>> 0;
}

/** What the in-process server does wrong on one answer. */
const FAULTS = ["200", "503", "404", "416", "short", "long", "no-length-short", "no-length-long", "etag", "total-huge", "total-other",
  "range-garbage", "range-other", "network", "redirect-other", "redirect-self", "redirect-bad", "redirect-scheme"];
const GARBAGE_RANGES = ["", "bytes 0-0/0", "bytes 5-2/10", "bytes */10", "bytes 0-99999999999999999999/1", "bytes 0-1/-1", "items 0-1/2",
  "bytes 0-1/99999999999999999999", "bytes 1-0/0", "bytes -1-2/3", "bytes 0-1/1e3", "bytes 0x0-0x1/2", "bytes 0-1 / 2"];

/**
 * A fetch that answers range requests for `bytes` as a range server does (206 with
 * Content-Range, 416 past the end), in process; with `fault`, its answer number `at` is wrong
 * that way.
 * @param {Uint8Array} bytes @param {string|null} [fault] @param {number} [at] @returns {typeof fetch}
 */
function rangeServer(bytes, fault = null, at = 0) {
  let n = 0;
  return /** @type {any} */ (async (/** @type {string} */ url, /** @type {any} */ init) => {
    const f = n++ === at ? fault : null;
    const m = /^bytes=(\d+)-(\d+)$/.exec(init.headers.Range);
    const a = Number(m?.[1]);
    if (f === "network") throw new TypeError(`fetch failed (${url})`);
    if (f?.startsWith("redirect")) {
      const to = { "redirect-other": "http://other.invalid/x", "redirect-self": url, "redirect-bad": "http://[bad", "redirect-scheme": "file:///etc/passwd" }[f];
      return new Response(null, { status: 302, headers: { Location: /** @type {string} */ (to) } });
    }
    if (f === "503" || f === "404") return new Response("no", { status: Number(f) });
    if (f === "200") return new Response(bytes, { status: 200, headers: { "Content-Length": String(bytes.length) } });
    if (!m || a >= bytes.length || f === "416") return new Response(null, { status: 416, headers: { "Content-Range": `bytes */${f === "416" ? bytes.length + 1 : bytes.length}` } });
    const b = Math.min(Number(m[2]), bytes.length - 1);
    let body = bytes.slice(a, b + 1);
    if (f === "short" || f === "no-length-short") body = body.slice(0, Math.max(0, body.length - 1));
    if (f === "long" || f === "no-length-long") body = concat(body, Uint8Array.of(0));
    const total = f === "total-huge" ? "1152921504606846976" : f === "total-other" ? String(bytes.length + 1) : String(bytes.length);
    const range = f === "range-garbage" ? GARBAGE_RANGES[(a + b + bytes.length) % GARBAGE_RANGES.length] : f === "range-other" ? `bytes ${a + 1}-${b + 1}/${total}` : `bytes ${a}-${b}/${total}`;
    /** @type {Record<string, string>} */
    const headers = { "Content-Range": range, ETag: f === "etag" ? '"other"' : '"fuzz"' };
    if (!f?.startsWith("no-length")) headers["Content-Length"] = String(body.length);
    return new Response(body, { status: 206, headers });
  });
}

/** Typed arrays past MAX_ARRAY_BYTES throw a "FuzzArrayLimit" (allocation not bounded by the input). */
function capTypedArrays() {
  for (const name of ["Uint8Array", "Int8Array", "Uint16Array", "Int16Array", "Uint32Array", "Int32Array", "Float32Array", "Float64Array", "BigInt64Array", "BigUint64Array", "ArrayBuffer"]) {
    const C = /** @type {any} */ (globalThis)[name];
    const per = C.BYTES_PER_ELEMENT ?? 1;
    /** @type {any} */ (globalThis)[name] = new Proxy(C, {
      construct(target, args, newTarget) {
        const n = args[0];
        if (typeof n === "number" && n * per > MAX_ARRAY_BYTES) {
          const e = new Error(`new ${name}(${n}): ${n * per} bytes from an input of at most ${MAX_INPUT}`);
          e.name = "FuzzArrayLimit";
          throw e;
        }
        return Reflect.construct(target, args, newTarget === globalThis[name] ? target : newTarget);
      },
    });
  }
}

// ---------------------------------------------------------------------------------------------
// the main thread: runs the worker, watches it for hangs and memory, keeps the findings

/** @param {string[]} argv */
function parseArgs(argv) {
  const o = { seed: 1, execs: Infinity, seconds: Infinity, seeds: /** @type {string[]} */ ([]), findings: "", timeoutMs: 10000, reportS: 10, json: false, replay: /** @type {string[]} */ ([]) };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const v = () => argv[++i];
    if (a === "--seed") o.seed = Number(v());
    else if (a === "--execs") o.execs = Number(v());
    else if (a === "--seconds") o.seconds = Number(v());
    else if (a === "--seeds") o.seeds.push(v());
    else if (a === "--findings") o.findings = v();
    else if (a === "--timeout-ms") o.timeoutMs = Number(v());
    else if (a === "--report-s") o.reportS = Number(v());
    else if (a === "--json") o.json = true;
    else if (a === "--replay") {
      while (i + 1 < argv.length && !argv[i + 1].startsWith("--")) o.replay.push(argv[++i]);
    } else throw new Error(`unknown option ${a}`);
  }
  if (o.execs === Infinity && o.seconds === Infinity && !o.replay.length) o.execs = 10000;
  return o;
}

/**
 * Replay inputs: a file "NAME.safetensors" is a single file; "NAME.index.json" an index read
 * next to the shards of the conformance case named in NAME.txt's first line ("shards: CASE").
 * @param {string} p @returns {Input}
 */
function replayInput(p) {
  const bytes = readFileSync(p);
  if (p.endsWith(".index.json")) {
    const note = readFileSync(p.replace(/\.index\.json$/, ".txt"), "utf8");
    const m = /^shards: (\S+)/m.exec(note);
    return { kind: "index", bytes, name: basename(p), dir: join(ROOT, "conformance", "v1", "cases", m ? m[1] : "") };
  }
  return { kind: "file", bytes, name: basename(p) };
}

async function mainThread() {
  const o = parseArgs(process.argv.slice(2));
  const seeds = o.replay.length ? [] : loadSeeds(o.seeds);
  /** where findings are written: made at the first one */
  let findingsDir = o.findings;
  const findingsFolder = () => {
    if (!findingsDir) findingsDir = mkdtempSync(join(tmpdir(), "qformat-jsfuzz-findings-"));
    mkdirSync(findingsDir, { recursive: true });
    return findingsDir;
  };
  const shared = new SharedArrayBuffer(16 + MAX_INPUT);
  const state = new Int32Array(shared, 0, 4);  // [executions, input length, running, 0 | 1 + index folder]
  const current = new Uint8Array(shared, 16);
  const replay = o.replay.map((p) => ({ ...replayInput(p), name: resolve(p) }));
  /** the shard folders index inputs are read next to (state[3] names one) */
  const dirs = [...new Set([...seeds, ...replay].filter((x) => x.kind === "index").map((x) => /** @type {any} */ (x).dir))];
  /** @type {Input[]} inputs that found new coverage: a restarted worker starts from them */
  const corpus = [];
  /** @type {Map<string, {kind: string, message: string, file: string, count: number}>} */
  const findings = new Map();
  const totals = { corpus: 0, blocks: 0, features: 0, restarts: 0 };
  const started = Date.now();
  const execs = () => Atomics.load(state, 0);
  const say = (/** @type {string} */ s) => process.stderr.write(s + "\n");

  const record = (/** @type {string} */ kind, /** @type {string} */ message, /** @type {Input} */ inp) => {
    // one finding per kind and place: the message's first line (numbers blurred) and its first frame in readers/js
    const frame = /(file:\/\/\S*readers\/js\/(?:src|bin)\/[^:)\s]*:\d+)/.exec(message);
    const sig = `${kind}|${message.split("\n")[0].replace(/\d+/g, "N").slice(0, 160)}|${frame ? frame[1] : ""}`;
    const f = findings.get(sig);
    if (f) {
      f.count++;
      return;
    }
    const hash = createHash("sha1").update(inp.bytes).digest("hex").slice(0, 12);
    const file = join(findingsFolder(), `${kind}-${hash}${inp.kind === "index" ? ".index.json" : ".safetensors"}`);
    writeFileSync(file, inp.bytes);
    const shards = inp.kind === "index" ? `shards: ${basename(inp.dir)}\n` : "";
    writeFileSync(join(findingsDir, `${kind}-${hash}.txt`), `${shards}seed input: ${inp.name}\n${message}\n`);
    findings.set(sig, { kind, message: message.slice(0, 2000), file, count: 1 });
    say(`FINDING ${kind}: ${message.split("\n")[0].slice(0, 300)} -> ${file}`);
  };

  /** The input the worker was running (from the shared buffer). @returns {Input} */
  const currentInput = () => {
    const bytes = current.slice(0, Atomics.load(state, 1));
    const d = Atomics.load(state, 3);
    return d ? { kind: "index", bytes, name: "(running)", dir: dirs[d - 1] } : { kind: "file", bytes, name: "(running)" };
  };

  /** Run one worker until it ends: true when it finished, false after a hang or a death (then it is restarted). */
  const runWorker = (/** @type {any} */ data) => new Promise((done) => {
    const w = new Worker(fileURLToPath(import.meta.url), { workerData: { ...data, dirs, shared }, resourceLimits: { maxOldGenerationSizeMb: HEAP_MB } });
    let last = execs();
    let since = Date.now();
    let ended = false;
    /** @type {string|null} */
    let work = null;
    const clean = () => work && rmSync(work, { recursive: true, force: true });
    const end = (/** @type {boolean} */ ok) => {
      if (ended) return false;
      ended = true;
      clearInterval(watch);
      clean();
      done(ok);
      return true;
    };
    const watch = setInterval(() => {
      if (execs() !== last || !Atomics.load(state, 2)) {
        last = execs();
        since = Date.now();
      } else if (Date.now() - since > o.timeoutMs && !ended) {
        record("hang", `no answer within ${o.timeoutMs} ms`, currentInput());
        ended = true;
        clearInterval(watch);
        w.terminate().then(() => {
          clean();
          done(false);
        });
      }
    }, 100);
    w.on("message", (m) => {
      if (m.type === "work") work = m.dir;
      else if (m.type === "finding") record(m.kind, m.message, m.input);
      else if (m.type === "corpus") corpus.push(m.input);
      else if (m.type === "status") Object.assign(totals, { corpus: m.corpus, blocks: m.blocks, features: m.features });
      else if (m.type === "replayed") {
        if (m.finding) record(m.finding.kind, m.finding.message, replayInput(m.name));
        if (o.json) process.stdout.write(JSON.stringify({ replay: m.name, finding: m.finding }) + "\n");
      }
    });
    w.on("error", (e) => {
      if (ended) return;
      const oom = /** @type {any} */ (e).code === "ERR_WORKER_OUT_OF_MEMORY";
      record(oom ? "memory" : "crash", oom ? `the JavaScript heap passed ${HEAP_MB} MiB` : String(e?.stack ?? e), currentInput());
      end(false);
    });
    w.on("exit", () => end(true));
  });

  if (replay.length) await runWorker({ seed: o.seed, execs: 0, seconds: 0, seeds: [], corpus: [], replay });
  else {
    const report = setInterval(() => {
      const s = (Date.now() - started) / 1000;
      say(`[${s.toFixed(0)} s] execs ${execs()} (${(execs() / s).toFixed(0)}/s), corpus ${totals.corpus}, blocks ${totals.blocks}, features ${totals.features}, findings ${findings.size}`);
    }, o.reportS * 1000);
    for (let seed = o.seed; ; seed++) {  // after a hang or a worker's death: go on from the corpus so far, a new stream
      const secondsLeft = o.seconds - (Date.now() - started) / 1000;
      if (execs() >= o.execs || secondsLeft <= 0) break;
      if (await runWorker({ seed, execs: o.execs - execs(), seconds: secondsLeft, seeds, corpus })) break;
      totals.restarts++;
    }
    clearInterval(report);
  }
  const summary = {
    execs: execs(),
    seconds: Number(((Date.now() - started) / 1000).toFixed(1)),
    corpus: totals.corpus,
    blocks: totals.blocks,
    features: totals.features,
    restarts: totals.restarts,
    seeds: seeds.length,
    findings: [...findings.values()].map((f) => ({ kind: f.kind, count: f.count, file: f.file, message: f.message.split("\n")[0].slice(0, 300) })),
    findings_dir: findingsDir || null,
  };
  process.stdout.write(JSON.stringify(summary) + "\n");
  process.exitCode = findings.size ? 1 : 0;
}

if (isMainThread) await mainThread();
else await workerMain();
