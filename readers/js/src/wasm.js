// The fast decode path: libqformat (the C library in libqformat/) built as WebAssembly
// (readers/js/wasm/qformat.wasm, by libqformat/scripts/build_wasm.py), so that the JavaScript
// reader decodes through the same C as the Python package and native runtimes.  It is the
// default where the module is loaded (Node's layer loads it at import; a page calls
// initWasmAsync) for tensors of at least MIN_VALUES values: there it is 1.2 to 3.9 times as fast
// as decode.js (readers/js/README.md, "The WebAssembly path"); below that the copy in and out of
// the module's memory costs more than it saves.  useWasm(false) (Node: QFORMAT_JS_WASM=0; the
// viewer: ?decoder=js) keeps the JavaScript decoder; useWasm("always") takes the module for every
// tensor (the tests).  The JavaScript decoder stays the fallback and the reference this path is
// tested against: where the module is not loaded or cannot be compiled, or for what it does not
// take (a box that is not whole rows, a file of a newer minor version, a tensor past the 32-bit
// memory), read() decodes in JavaScript.  Both give the same bits (NaN by class: the C keeps a
// NaN's payload where JavaScript's arithmetic may not).
//
// One logical tensor at a time: its descriptor and the stored tensors it references are written
// into the module's memory as a small safetensors file of their own (a qformat object holding
// that one descriptor), which the C library opens and decodes as it would any file.  The
// JavaScript side has already checked the file and the tensor; what the C side can still refuse
// are the decode-time rules of SPEC.md §10.6, which come back as the same QFormatError codes.

import { error } from "./errors.js";
import { references } from "./descriptor.js";

const OUT_KIND = { float32: 0, float16: 1, bfloat16: 2 };
/** Files of these minor versions take the path (a newer minor's leniency is the JavaScript reader's to apply). */
const MAX_MINOR = 2;
/** The module's memory is 32-bit: a tensor whose stored bytes and output pass this decodes in JavaScript. */
const MAX_BYTES = 2 ** 31;

/** @type {{exports: any, memory: WebAssembly.Memory} | null} */
let mod = null;
/** @type {boolean|"always"} */
let enabled = true;
/** Tensors with fewer values decode in JavaScript unless useWasm("always"). */
export const MIN_VALUES = 65536;
/** Values per chunk of a decode (wasmDecode): 1 MiB of float32, which stays in a core's L2 cache. */
const CHUNK_VALUES = 2 ** 18;
/** Tensors the module has decoded (wasmInfo().decodes): the tests' proof that the path ran. */
let decodes = 0;
/** @type {string|null} */
let failure = null;

/** The three WASI imports wasi-libc keeps in a reactor module: no environment, no exit. */
const WASI = {
  wasi_snapshot_preview1: {
    environ_get: () => 0,
    environ_sizes_get: (/** @type {number} */ countPtr, /** @type {number} */ sizePtr) => {
      const v = new DataView(/** @type {any} */ (mod).memory.buffer);
      v.setUint32(countPtr, 0, true);
      v.setUint32(sizePtr, 0, true);
      return 0;
    },
    proc_exit: (/** @type {number} */ code) => {
      throw new Error(`libqformat called exit(${code})`);
    },
  },
};

/**
 * Load the module from its bytes (or a compiled WebAssembly.Module), synchronously: Node and
 * workers allow any size; on a browser's main thread use initWasmAsync.  A module that does not
 * compile (a runtime without SIMD128, say) leaves the JavaScript path, and wasmInfo() says why.
 * @param {BufferSource|WebAssembly.Module} source @returns {boolean} whether the path is ready
 */
export function initWasm(source) {
  try {
    const m = source instanceof WebAssembly.Module ? source : new WebAssembly.Module(source);
    return ready(new WebAssembly.Instance(m, WASI));
  } catch (e) {
    failure = String(/** @type {Error} */ (e).message ?? e);
    mod = null;
    return false;
  }
}

/** initWasm for a browser: from a Response (fetch) or bytes. @param {Response|BufferSource|PromiseLike<Response>} source */
export async function initWasmAsync(source) {
  try {
    const src = await source;
    // (the bytes, not instantiateStreaming: a server that labels the file other than
    // application/wasm would make that refuse it, and the module is small)
    const bytes = typeof Response !== "undefined" && src instanceof Response ? await src.arrayBuffer() : src;
    const { instance } = await WebAssembly.instantiate(/** @type {BufferSource} */ (bytes), WASI);
    return ready(instance);
  } catch (e) {
    failure = String(/** @type {Error} */ (e).message ?? e);
    mod = null;
    return false;
  }
}

/** @param {WebAssembly.Instance} instance */
function ready(instance) {
  const x = /** @type {any} */ (instance.exports);
  mod = { exports: x, memory: x.memory };
  x._initialize?.();
  failure = null;
  return true;
}

/**
 * Switch the path: true (the default: tensors of at least MIN_VALUES values), "always" (every
 * tensor it can take), false (never).  Returns the previous setting.
 * @param {boolean|"always"} on
 */
export function useWasm(on) {
  const was = enabled;
  enabled = on === "always" ? "always" : Boolean(on);
  return was;
}

/** Which path decodes ({path: "wasm"|"js", reason}), whether the module is loaded, and how many tensors it has decoded. */
export function wasmInfo() {
  const loaded = mod !== null;
  if (!loaded) return { path: "js", reason: failure ?? "the WebAssembly module is not loaded (initWasm)", loaded, decodes };
  if (!enabled) return { path: "js", reason: "switched off (useWasm(false))", loaded, decodes };
  return { path: "wasm", reason: enabled === "always" ? null : `tensors of ${MIN_VALUES} values or more`, loaded, decodes };
}

/**
 * JSON text of a parsed qformat value (Maps in member order; BigInt integers exact; -0 kept as a
 * float, whose sign a constant parameter's arithmetic can see).
 * @param {any} v @returns {string}
 */
function json(v) {
  if (v instanceof Map) {
    let s = "{";
    let first = true;
    for (const [k, x] of v) {
      s += (first ? "" : ",") + JSON.stringify(k) + ":" + json(x);
      first = false;
    }
    return s + "}";
  }
  if (Array.isArray(v)) {
    let s = "[";
    for (let i = 0; i < v.length; i++) s += (i ? "," : "") + json(v[i]);
    return s + "]";
  }
  if (typeof v === "bigint") return v.toString();
  if (typeof v === "number") return Object.is(v, -0) ? "-0.0" : JSON.stringify(v);
  return JSON.stringify(v);
}

/**
 * Whether a descriptor and those nested in it are all of the canonical layout (whose rows the C
 * library decodes reading only those rows).
 * @param {import("./descriptor.js").Descriptor} d @returns {boolean}
 */
function canonical(d) {
  if (d.layout !== "canonical") return false;
  for (const p of [d.zero, d.scale, d.bias]) if (p && p.encoded && !canonical(p.encoded)) return false;
  return true;
}

/**
 * A logical tensor's values through the module, or null where this path does not take it.
 * `file` is a QFile (index.js) whose checks the tensor has passed.
 * @param {any} file @param {string} name @param {import("./descriptor.js").Descriptor} desc
 * @param {[number, number][]|null} box @param {(n: number) => Float32Array|Uint16Array} alloc
 * @returns {Float32Array|Uint16Array|null}
 */
export function wasmDecode(file, name, desc, box, alloc) {
  if (mod === null || !enabled) return null;
  const version = file.model.version;
  if (typeof version !== "string" || Number(version.split(".")[1]) > MAX_MINOR) return null;
  const shape = desc.shape;
  let row0 = 0;
  let nrows = shape.length ? shape[0] : 1;
  if (box !== null) {
    if (!shape.length || box.slice(1).some(([lo, hi], a) => lo !== 0 || hi !== shape[a + 1])) return null;
    [row0, nrows] = [box[0][0], box[0][1] - box[0][0]];
  }
  let count = nrows;
  for (let a = 1; a < shape.length; a++) count *= shape[a];
  if (count === 0 || (enabled !== "always" && count < MIN_VALUES)) return null;
  const outBytes = count * (desc.dtype === "float32" ? 4 : 2);

  // the stored tensors it references, each once, laid end to end
  const names = [...new Set(references(desc).map(([, n]) => n))];
  const entries = [];
  let dataBytes = 0;
  for (const n of names) {
    const e = file.store.entry(n);
    const len = Number(e.end - e.begin);
    entries.push([n, e, dataBytes, len]);
    dataBytes += len;
  }
  if (dataBytes + outBytes >= MAX_BYTES) return null;
  const qf = `{"version":${JSON.stringify(version)},"tensors":{${JSON.stringify(name)}:${json(file.model.raw.get(name))}}}`;
  let head = `{"__metadata__":{"qformat":${JSON.stringify(qf)}}`;
  for (const [n, e, at, len] of entries) {
    head += `,${JSON.stringify(n)}:{"dtype":${JSON.stringify(e.dtype)},"shape":[${e.shape.join(",")}],"data_offsets":[${at},${at + len}]}`;
  }
  head += "}";
  const hb = new TextEncoder().encode(head);
  const hlen = Math.ceil(hb.length / 8) * 8;
  const fileBytes = 8 + hlen + dataBytes;

  const out = alloc(count);
  const x = mod.exports;
  const errSize = x.qfw_error_size();
  const kind = OUT_KIND[/** @type {"float32"} */ (desc.dtype)];
  const item = desc.dtype === "float32" ? 4 : 2;
  // Rows in chunks of about CHUNK_VALUES values, each decoded into one small buffer of the
  // module's memory that stays in cache and copied from there into `out`: the output is written
  // once (not decoded into the module's memory and read back), and the module's memory holds the
  // stored bytes and one chunk, not the whole output.  A rank-0 tensor, a layout other than
  // canonical (whose codes the C library unpacks whole per call) or an error decodes in one call.
  const rowValues = nrows ? count / nrows : count;
  const step = shape.length && canonical(desc) ? Math.max(1, Math.floor(CHUNK_VALUES / rowValues)) : nrows;
  const chunkBytes = Math.min(nrows, step) * rowValues * item;
  const buf = x.qfw_malloc(fileBytes);
  const dst = x.qfw_malloc(chunkBytes);
  const err = x.qfw_malloc(errSize);
  let f = 0;
  let big = 0;
  try {
    if (!buf || !dst || !err) return null;  // the module's memory could not grow: decode in JavaScript
    let mem = new Uint8Array(mod.memory.buffer);
    new DataView(mod.memory.buffer).setBigUint64(buf, BigInt(hlen), true);
    mem.set(hb, buf + 8);
    mem.fill(0x20, buf + 8 + hb.length, buf + 8 + hlen);
    for (const [n, , at, len] of entries) if (len) mem.set(file.store.bytes(n), buf + 8 + hlen + at);
    f = x.qfw_open(buf, fileBytes, err);
    let status = f ? 0 : -1;
    /** @type {any} */
    let view = null;
    for (let r = 0; status === 0 && r < nrows; r += step) {
      const n = Math.min(step, nrows - r);
      status = x.qfw_decode_rows(f, 0, row0 + r, n, kind, dst, n * rowValues * item, err);
      if (status !== 0) break;
      // (a decode may grow the memory, which detaches the views of its old buffer)
      if (view === null || view.buffer !== mod.memory.buffer) {
        view = item === 4 ? new Float32Array(mod.memory.buffer, dst, chunkBytes / 4) : new Uint16Array(mod.memory.buffer, dst, chunkBytes / 2);
      }
      out.set(n === step ? view : view.subarray(0, n * rowValues), r * rowValues);
    }
    if (status !== 0 && f && step < nrows) {
      // the error the whole request gives (a chunk may meet a later rule first): decode it in one call
      big = x.qfw_malloc(outBytes);
      status = big ? x.qfw_decode_rows(f, 0, row0, nrows, kind, big, outBytes, err) : status;
      if (status === 0) out.set(item === 4 ? new Float32Array(mod.memory.buffer, big, count) : new Uint16Array(mod.memory.buffer, big, count));
    }
    if (status !== 0) {
      mem = new Uint8Array(mod.memory.buffer);
      const text = (/** @type {number} */ at, /** @type {number} */ max) => {
        let end = at;
        while (end < at + max && mem[end] !== 0) end++;
        return new TextDecoder().decode(mem.subarray(at, end));
      };
      const code = text(err, 40);
      if (!code) throw new Error(`libqformat returned status ${status} without an error code for ${JSON.stringify(name)}`);
      throw error(code, text(err + 40, errSize - 40), name);
    }
    decodes++;
    return out;
  } finally {
    if (f) x.qfw_close(f);
    if (big) x.qfw_free(big);
    x.qfw_free(err);
    x.qfw_free(dst);
    x.qfw_free(buf);
  }
}
