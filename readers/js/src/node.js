// Node layer: files read by byte ranges through fs (the header first, then each tensor's own
// bytes when it is decoded), and sharded checkpoints through *.safetensors.index.json (SPEC.md §14).

import { closeSync, fstatSync, lstatSync, openSync, readSync, readFileSync, realpathSync, statSync } from "node:fs";
import { basename, dirname, join, resolve, sep } from "node:path";
import { createHash } from "node:crypto";
import { QFile, check as coreCheck, initWasm, useWasm } from "./index.js";
import { error, sortedNames, QFormatError } from "./errors.js";
import { JsonError, parseStrict } from "./json.js";
import { LIMITS } from "./tables.js";
import { allocate } from "./alloc.js";

export * from "./index.js";

// libqformat as WebAssembly (src/wasm.js): the decode path for large tensors unless
// QFORMAT_JS_WASM=0 ("always": for every tensor); a missing or uncompilable module leaves the
// JavaScript decoder, which gives the same bits.
if (process.env.QFORMAT_JS_WASM !== "0") {
  try {
    if (initWasm(readFileSync(new URL("../wasm/qformat.wasm", import.meta.url))) && process.env.QFORMAT_JS_WASM === "always") useWasm("always");
  } catch {
    // no module file: the JavaScript path (wasmInfo() says so)
  }
}

/** node:crypto's SHA-256 as hexadecimal (about 30 times the portable one's speed). @param {Uint8Array} bytes */
export function sha256Node(bytes) {
  return createHash("sha256").update(bytes).digest("hex");
}

/**
 * The core check (see index.js), with node:crypto's SHA-256 for `digests: true`.
 * @param {Parameters<typeof coreCheck>[0]} input @param {Parameters<typeof coreCheck>[1]} [opts]
 */
export function check(input, opts = {}) {
  return coreCheck(input, { sha256: sha256Node, ...opts });
}

/**
 * A ByteSource over a file descriptor: reads only the ranges asked for.
 * @param {string} path
 */
export function fileSource(path) {
  let fd;
  try {
    fd = openSync(path, "r");
  } catch (e) {
    throw error("FILE_UNREADABLE", `cannot read ${JSON.stringify(path)}: ${/** @type {Error} */ (e).message}`);
  }
  const big = fstatSync(fd, { bigint: true }).size;
  if (big > BigInt(Number.MAX_SAFE_INTEGER)) {
    closeSync(fd);
    throw error("FILE_UNREADABLE", `${JSON.stringify(path)} is ${big} bytes, past 2^53 - 1, the largest offset this reader addresses exactly`);
  }
  const size = Number(big);
  return {
    size,
    fd,
    read(/** @type {number} */ offset, /** @type {number} */ length) {
      const buf = allocate(Uint8Array, length, `bytes [${offset}, ${offset + length}) of ${JSON.stringify(path)}`);
      let done = 0;
      while (done < length) {
        const n = readSync(/** @type {number} */ (fd), buf, done, length - done, offset + done);
        if (n <= 0) throw error("FILE_UNREADABLE", `${path} ended while reading`);
        done += n;
      }
      return buf;
    },
    close() {
      if (fd !== undefined) closeSync(fd);
      fd = undefined;
    },
  };
}

/** @param {string} path */
function readable(path) {
  let st;
  try {
    st = statSync(path);
  } catch {
    throw error("FILE_UNREADABLE", `${JSON.stringify(path)} does not exist`);
  }
  if (st.isDirectory()) throw error("FILE_UNREADABLE", `${JSON.stringify(path)} is a folder: open its index or one of its .safetensors files`);
}

/**
 * Open a .safetensors file by path (byte ranges are read on demand).  Call close() when done.
 * @param {string} path
 * @param {{verify?: boolean}} [opts]  verify: check a 1.2 file's digests of each tensor before it is read (node:crypto)
 */
export function openFile(path, opts = {}) {
  readable(path);
  const src = fileSource(path);
  try {
    const f = new QFile(src, { sha256: sha256Node, ...opts });
    /** @type {any} */ (f).close = () => src.close();
    return /** @type {QFile & {close(): void}} */ (f);
  } catch (e) {
    src.close();
    throw e;
  }
}

/** Whether the real path `path` is the real path `root` or lies under it. @param {string} path @param {string} root */
function within(path, root) {
  return path === root || path.startsWith(root.endsWith(sep) ? root : root + sep);
}

/**
 * `realpath(repo)/blobs` when `root` is a snapshot of a huggingface_hub cache repository
 * (`.../models--org--name/snapshots/<revision>`) and that `blobs` is a real folder (not a link:
 * a `blobs` linking elsewhere, a home folder say, would let the snapshot's links read anything
 * there); else null.  (qformat/paths.py `hub_blobs`.)
 * @param {string} root
 */
function hubBlobs(root) {
  let real;
  try {
    real = realpathSync(root);
  } catch {
    return null;
  }
  const snapshots = dirname(real);
  if (basename(snapshots) !== "snapshots") return null;
  const blobs = join(dirname(snapshots), "blobs");
  try {
    return lstatSync(blobs).isDirectory() ? blobs : null;
  } catch {
    return null;
  }
}

/**
 * The one path policy (qformat/paths.py, issue 40) for a file name read from inside a file: the
 * path to read for the plain name `name` in the folder `root`.  Refused with `code`: a name that
 * is empty, holds NUL, a backslash or '/', starts with a drive letter, or is '.' or '..'; an
 * entry that is missing, a folder, or not a regular file; a link whose real path is not a
 * regular file inside `root`'s real path, or directly in the real blobs/ folder of the
 * huggingface_hub cache repository whose snapshot `root` is.
 * @param {string} root @param {string} name @param {string} code @param {string} what @param {string | null} [field]
 */
function sourceFile(root, name, code, what, field = null) {
  const refuse = (/** @type {string} */ why) => error(code, `${what} ${JSON.stringify(name)} (in ${root}) ${why}`, null, field);
  if (typeof name !== "string" || name === "" || name === "." || name === "..") throw refuse("is not a plain file name");
  if (name.includes("\0") || name.includes("\\") || name.includes("/") || /^[A-Za-z]:/.test(name)) {
    throw refuse("must be a plain file name inside the folder (no '/', backslash, NUL or drive letter)");
  }
  const path = join(root, name);
  let st;
  try {
    st = lstatSync(path);
  } catch {
    throw refuse("listed in the index does not exist");
  }
  if (st.isSymbolicLink()) {
    let target;
    let realRoot;
    try {
      target = realpathSync(path);
      realRoot = realpathSync(root);
    } catch {
      throw refuse("is a broken link");
    }
    const blobs = hubBlobs(root);
    if (!(within(target, realRoot) || (blobs !== null && dirname(target) === blobs))) {
      throw refuse(`is a link to ${target}, outside the folder${blobs ? " and not directly in its huggingface_hub cache repository's blobs/" : ""}, which qformat does not follow`);
    }
    st = statSync(target);
  }
  if (!st.isFile()) throw refuse(st.isDirectory() ? "is a folder" : "is not a regular file (a device, pipe or socket)");
  return path;
}

/**
 * Parse and validate a sharded checkpoint's index (SPEC.md §14): its weight map and shard names.
 * @param {string} path @returns {{folder: string, weightMap: Map<string, string>, shards: string[]}}
 */
export function readIndex(path) {
  let raw;
  try {
    raw = readFileSync(path);
  } catch (e) {
    throw error("FILE_UNREADABLE", `cannot read ${JSON.stringify(path)}: ${/** @type {Error} */ (e).message}`);
  }
  if (raw.length > LIMITS.max_index_bytes) throw error("INDEX_INVALID", `the index is larger than ${LIMITS.max_index_bytes} bytes`);
  let obj;
  try {
    const text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(raw);
    const r = parseStrict(text, { maxDepth: LIMITS.max_json_depth });
    if (/[^ \t\n\r]/.test(text.slice(r.end))) throw new JsonError("syntax", "text follows the JSON object");
    obj = r.value;
  } catch (e) {
    if (e instanceof QFormatError) throw e;
    throw error("INDEX_INVALID", `the index is not valid JSON: ${/** @type {Error} */ (e).message}`);
  }
  const wm = obj instanceof Map ? obj.get("weight_map") : undefined;
  if (!(wm instanceof Map) || ![...wm.values()].every((v) => typeof v === "string")) {
    throw error("INDEX_INVALID", "expected an object 'weight_map' mapping tensor names to shard file names", null, "weight_map");
  }
  const folder = dirname(resolve(path));
  const shards = sortedNames([...new Set(/** @type {string[]} */ ([...wm.values()]))]);
  // the path policy: a plain name; a regular file in the folder, or a link that stays inside
  // it (or goes into the blobs of the huggingface_hub snapshot the folder is)
  for (const s of shards) sourceFile(folder, s, "INDEX_INVALID", "shard", "weight_map");
  return { folder, weightMap: wm, shards };
}

/** The names the index places in each shard (one pass over the weight map, not one per shard). @param {Map<string, string>} weightMap */
function byShard(weightMap) {
  /** @type {Map<string, Set<string>>} */
  const out = new Map();
  for (const [n, s] of weightMap) {
    const l = out.get(s);
    if (l) l.add(n);
    else out.set(s, new Set([n]));
  }
  return out;
}

/**
 * INDEX_MISMATCH problems between an index and one opened shard.
 * @param {Map<string, Set<string>>} placed  byShard(weight map) @param {string} shard @param {QFile} f
 */
function mismatches(placed, shard, f) {
  const out = [];
  const visible = new Set([...f.header.entries.keys(), ...f.model.raw.keys()]);
  const listed = placed.get(shard) ?? new Set();
  for (const n of sortedNames([...listed].filter((x) => !visible.has(x)))) out.push(error("INDEX_MISMATCH", `the index places ${JSON.stringify(n)} in ${JSON.stringify(shard)}, which has no such tensor`, n, "weight_map"));
  for (const n of sortedNames([...f.header.entries.keys()].filter((x) => !listed.has(x)))) out.push(error("INDEX_MISMATCH", `shard ${JSON.stringify(shard)} holds ${JSON.stringify(n)}, which the index does not list`, n, "weight_map"));
  return out;
}

/**
 * @typedef {import("./index.js").Tensor & {storedShape?: bigint[]}} LoadedTensor
 */

/**
 * Every tensor of a file, or of a sharded checkpoint given its index (a path ending in .json),
 * decoded; throws the first problem, as the reference reader does.
 * @param {string} path @returns {Map<string, LoadedTensor>}
 */
export function loadCheckpoint(path) {
  readable(path);
  if (!path.endsWith(".json")) return loadOne(path);
  const idx = readIndex(path);
  const placed = byShard(idx.weightMap);
  /** @type {Map<string, LoadedTensor>} */
  const out = new Map();
  /** @type {Map<string, string>} name -> the first shard exposing it */
  const exposed = new Map();
  for (const shard of idx.shards) {
    const p = join(idx.folder, shard);
    const src = fileSource(p);
    try {
      let f;
      try {
        f = new QFile(src);
      } catch (e) {
        // a file-scope problem is raised after the index comparison; a container one before
        if (e instanceof QFormatError && e.category === "malformed") throw e;
        f = null;
      }
      if (f === null) {
        // re-interpret without raising, to compare with the index first
        const { parseHeader } = /** @type {any} */ (containerModule);
        const { interpret } = /** @type {any} */ (modelModule);
        const header = parseHeader(src);
        const model = interpret(header);
        const mm = mismatches(placed, shard, /** @type {any} */ ({ header, model }));
        if (mm.length) throw mm[0];
        throw model.fileProblems[0];
      }
      const mm = mismatches(placed, shard, f);
      if (mm.length) throw mm[0];
      // SPEC.md 1.2.1 §14: with the listing rules, before the shard's own content: a name two
      // shards expose (its plain tensors and every member name of its `tensors`, refused at
      // step 5 or not, once steps 1 to 4 passed) is INDEX_MISMATCH
      const names = f.keys();
      for (const name of names) {
        const first = exposed.get(name);
        if (first !== undefined) throw error("INDEX_MISMATCH", `tensor ${JSON.stringify(name)} appears in both ${JSON.stringify(first)} and ${JSON.stringify(shard)}`, name, "weight_map");
      }
      for (const name of names) exposed.set(name, shard);
      for (const [name, t] of loadFrom(f)) out.set(name, t);
    } finally {
      src.close();
    }
  }
  return out;
}

import * as containerModule from "./container.js";
import * as modelModule from "./model.js";

/** @param {string} path */
function loadOne(path) {
  const f = openFile(path);
  try {
    return loadFrom(f);
  } finally {
    f.close();
  }
}

/** @param {QFile} f @returns {Map<string, LoadedTensor>} */
function loadFrom(f) {
  const all = f.loadAll();
  for (const [name, t] of all) {
    const e = /** @type {any} */ (f.header.entries.get(name));
    if (!t.quantized && t.dtype === e.dtype) /** @type {LoadedTensor} */ (t).storedShape = e.shape;  // exact (bigint) shape
  }
  return all;
}

export { basename };
