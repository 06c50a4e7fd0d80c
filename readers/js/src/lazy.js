// Files whose bytes arrive asynchronously (a Blob, a URL read by range requests, or bytes in
// memory through the same path): the header is fetched first, then, for each call that decodes,
// only the stored tensors it reads, into a RangeCache that the synchronous core (container.js,
// model.js, decode.js, check.js) reads as its ByteSource.  Nothing is parsed or decoded here.

import { QFile, check as coreCheck } from "./index.js";
import { storedOf } from "./model.js";
import { QFormatError, error } from "./errors.js";
import { LIMITS } from "./tables.js";
import { RangeCache, blobSource, bufferSource } from "./source.js";
import { urlSource } from "./http.js";
import { MAX_ARRAY_LENGTH, allocate, checkLength } from "./alloc.js";

/** At most this many reads of one source are in flight at once. */
export const MAX_PARALLEL = 4;
/** A coalesced range is fetched in parts of at most this many bytes (so that parts run in parallel). */
export const PART_BYTES = 8 << 20;

/**
 * Run `tasks` with at most `n` in flight.
 * @param {(() => Promise<void>)[]} tasks @param {number} n
 */
async function pool(tasks, n) {
  let next = 0;
  const worker = async () => {
    while (next < tasks.length) await tasks[next++]();
  };
  await Promise.all(Array.from({ length: Math.min(n, tasks.length) }, worker));
}

/**
 * Fetch the byte ranges `ranges` ([start, end) pairs) that `cache` lacks: adjacent and
 * overlapping ones are coalesced into one range, each range is fetched in parts of at most
 * PART_BYTES, `parallel` parts at a time, into one buffer per range.  Every length comes from
 * a header parseHeader has checked against the file size; a coalesced range stays within
 * `maxLength` (one array's), and a range past it is refused (SHAPE_UNREPRESENTABLE) before
 * anything is fetched.
 * @param {import("./source.js").AsyncByteSource} src @param {RangeCache} cache
 * @param {[number, number][]} ranges @param {number} [parallel] @param {number} [maxLength]
 */
export async function fetchRanges(src, cache, ranges, parallel = MAX_PARALLEL, maxLength = MAX_ARRAY_LENGTH) {
  const todo = ranges.filter(([a, b]) => b > a && !cache.has(a, b - a)).sort((x, y) => x[0] - y[0]);
  for (const [a, b] of todo) checkLength(b - a, `bytes [${a}, ${b}) of the file`, null, maxLength);
  /** @type {{a: number, b: number, held: [number, number][]}[]} coalesced ranges and the asked ones each holds */
  const merged = [];
  for (const [a, b] of todo) {
    const last = merged[merged.length - 1];
    if (last && a <= last.b && Math.max(last.b, b) - last.a <= maxLength) {
      last.b = Math.max(last.b, b);
      last.held.push([a, b]);
    } else merged.push({ a, b, held: [[a, b]] });
  }
  /** @type {(() => Promise<void>)[]} */
  const tasks = [];
  /** @type {[number, Uint8Array, [number, number][]][]} */
  const done = [];
  for (const { a, b, held } of merged) {
    const buf = allocate(Uint8Array, b - a, `bytes [${a}, ${b}) of the file`);
    done.push([a, buf, held]);
    for (let p = a; p < b; p += PART_BYTES) {
      const len = Math.min(PART_BYTES, b - p);
      tasks.push(async () => {
        const got = await src.read(p, len);
        if (got.length !== len) throw error("FILE_UNREADABLE", `asked for ${len} bytes at ${p}, the source gave ${got.length}`);
        buf.set(got, p - a);
      });
    }
  }
  await pool(tasks, parallel);
  for (const [a, buf, held] of done) cache.add(a, buf, held);
}

/** A file opened through an AsyncByteSource: QFile's methods, those that read bytes async. */
export class LazyFile {
  /**
   * @param {import("./source.js").AsyncByteSource} src @param {RangeCache} cache @param {QFile} file
   * @param {{parallel?: number, maxArrayLength?: number}} opts
   */
  constructor(src, cache, file, opts) {
    this.src = src;
    this.cache = cache;
    this.file = file;
    this.parallel = opts.parallel ?? MAX_PARALLEL;
    /** the longest array a read allocates (stored bytes, decoded values); longer ones are refused before they are fetched */
    this.maxArrayLength = opts.maxArrayLength ?? MAX_ARRAY_LENGTH;
  }

  get size() {
    return this.src.size;
  }

  /** Bytes read from the source so far (the header included). */
  get bytesFetched() {
    return this.src.bytesFetched;
  }

  keys() { return this.file.keys(); }
  metadata() { return this.file.metadata(); }
  fileOrder() { return this.file.fileOrder(); }
  problems() { return this.file.problems(); }
  /** @param {string} name */
  descriptor(name) { return this.file.descriptor(name); }
  /** @param {string} name */
  isQuantized(name) { return this.file.isQuantized(name); }
  /** @param {string} name */
  shape(name) { return this.file.shape(name); }

  /** The stored tensors (components, or the plain tensor itself) that decoding `name` reads. @param {string} name */
  stored(name) {
    return [...storedOf(this.file.model, name)];
  }

  /** The byte range of each stored tensor in `names`. @param {string[]} names @returns {[number, number][]} */
  _ranges(names) {
    const h = this.file.header;
    return names.map((n) => {
      const e = /** @type {import("./container.js").Entry} */ (h.entries.get(n));
      return [h.dataStart + e.begin, h.dataStart + e.end];
    });
  }

  /** Fetch what decoding each of `names` needs (one coalesced batch). @param {string[]} names */
  async fetchTensors(names) {
    for (const n of names) {
      this.file.shape(n);  // unknown or refused: throw before fetching anything
      for (const [a, b] of this._ranges(this.stored(n))) checkLength(b - a, `the ${b - a} stored bytes of ${JSON.stringify(n)}`, n, this.maxArrayLength);
    }
    await fetchRanges(this.src, this.cache, this._ranges(names.flatMap((n) => this.stored(n))), this.parallel, this.maxArrayLength);
  }

  /**
   * SHAPE_UNREPRESENTABLE, before anything is fetched, where the values `box` (null: all) of
   * `name` need a longer array than maxArrayLength.  A malformed box is left to QFile.read.
   * @param {string} name @param {any} box
   */
  _checkOutput(name, box) {
    const shape = this.file.shape(name);
    const reg = box ?? shape.map((s) => [0, s]);
    if (!Array.isArray(reg) || !reg.every((r) => Array.isArray(r) && r.length === 2 && r.every(Number.isSafeInteger))) return;
    const n = reg.reduce((acc, [lo, hi]) => acc * Math.max(0, hi - lo), 1);
    checkLength(n, `the ${n} values of ${JSON.stringify(name)}`, name, this.maxArrayLength);
  }

  /**
   * Fetch what `names` need, then run the synchronous `use` with nothing awaited in between: a
   * release() by another call while the fetch was in flight makes it fetch again.
   * @template T @param {string[]} names @param {() => T} use @returns {Promise<T>}
   */
  async _with(names, use) {
    for (;;) {
      await this.fetchTensors(names);
      if (this._ranges(names.flatMap((n) => this.stored(n))).every(([a, b]) => b === a || this.cache.has(a, b - a))) return use();
    }
  }

  /** @param {string} name @param {[number, number][]|null} [box] */
  async read(name, box = null) {
    this._checkOutput(name, box);
    return this._with([name], () => this.file.read(name, box));
  }

  /** @param {string} name */
  async getTensor(name) {
    return this.read(name, null);
  }

  /** @param {string} name @param {[number, number]} rows */
  async getSlice(name, rows) {
    this._checkOutput(name, [rows, ...this.file.shape(name).slice(1).map((s) => [0, s])]);
    return this._with([name], () => this.file.getSlice(name, rows));
  }

  /** Every tensor, decoded (throws the file's first problem, as QFile.loadAll). */
  async loadAll() {
    const probs = this.problems();
    if (probs.length) throw probs[0];
    for (const n of this.keys()) this._checkOutput(n, null);
    return this._with(this.keys(), () => this.file.loadAll());
  }

  /** The checker's problems (index.js check): reads every stored byte. @param {Parameters<typeof coreCheck>[1]} [opts] */
  async check(opts = {}) {
    const all = this._ranges([...this.file.header.entries.keys()]);
    for (;;) {  // as _with: no release() between the fetch and the check
      await fetchRanges(this.src, this.cache, all, this.parallel, this.maxArrayLength);
      if (all.every(([a, b]) => b === a || this.cache.has(a, b - a))) return coreCheck(this.cache, opts);
    }
  }

  /** Drop every fetched tensor's bytes (the header stays); later reads fetch them again. */
  release() {
    this.cache.release(this.file.header.dataStart);
    this.file._bytes.clear();
  }
}

/**
 * Open a file through an AsyncByteSource: reads the 8-byte header length, then the header when
 * that length passes the container's checks (the same ones parseHeader makes, which then throws
 * their codes), and nothing else.
 * @param {import("./source.js").AsyncByteSource & {prefix?: Uint8Array}} src
 * @param {{verify?: boolean, sha256?: (bytes: Uint8Array) => string, parallel?: number}} [opts]
 * @returns {Promise<LazyFile>}
 */
export async function openAsync(src, opts = {}) {
  const cache = new RangeCache(src.size);
  if (!Number.isSafeInteger(src.size) || src.size < 0) throw error("FILE_UNREADABLE", `the source is ${src.size} bytes: expected a size from 0 to 2^53 - 1, the largest offset this reader addresses exactly`);
  if (src.prefix?.length) cache.add(0, src.prefix);
  if (src.size >= 8) {
    await fetchRanges(src, cache, [[0, 8]]);
    const pre = cache.read(0, 8);
    const n = new DataView(pre.buffer, pre.byteOffset, 8).getBigUint64(0, true);
    // an unchecked length is never fetched (nor allocated): parseHeader refuses it below
    if (n > 0n && n <= BigInt(LIMITS.max_header_bytes) && 8n + n <= BigInt(src.size)) {
      const end = 8 + Number(n);
      const from = Math.max(src.prefix?.length ?? 0, 8);  // what the probe (or the length read) already holds
      if (from < end) {  // the header's rest, joined to those bytes: parseHeader reads the header as one range
        const head = new Uint8Array(end);
        head.set(cache.read(0, from));
        const rest = await src.read(from, end - from);
        if (rest.length !== end - from) throw error("FILE_UNREADABLE", `the header's bytes ${from}-${end} came short`);
        head.set(rest, from);
        cache.add(0, head);
      }
    }
  }
  return new LazyFile(src, cache, new QFile(cache, opts), opts);
}

/** Open `url` by HTTP range requests (see http.js for the options and refusals). @param {string|URL} url @param {any} [opts] */
export async function openUrl(url, opts = {}) {
  return openAsync(await urlSource(url, opts), opts);
}

/** Open a Blob (a browser File), read by Blob.slice as needed. @param {Blob} blob @param {any} [opts] */
export async function openBlob(blob, opts = {}) {
  return openAsync(blobSource(blob), opts);
}

/** Open bytes in memory by the same path as Blobs and URLs. @param {ArrayBuffer|ArrayBufferView} bytes @param {any} [opts] */
export async function openBytesAsync(bytes, opts = {}) {
  return openAsync(bufferSource(bytes), opts);
}

/** Codes of the transport, not of the file: checkAsync throws them instead of reporting them. */
const TRANSPORT = new Set(["REMOTE_UNREACHABLE", "REMOTE_HTTP_ERROR", "REMOTE_RANGE_IGNORED", "REMOTE_RANGE_INVALID", "REMOTE_CHANGED", "REMOTE_REDIRECT_REFUSED", "FILE_UNREADABLE"]);

/**
 * index.js's check through an AsyncByteSource: a file the container refuses gives that one
 * problem, as check(bytes) does; a failed transfer throws its QFormatError.
 * @param {import("./source.js").AsyncByteSource} src @param {Parameters<typeof coreCheck>[1]} [opts]
 */
export async function checkAsync(src, opts = {}) {
  let f;
  try {
    f = await openAsync(src);
  } catch (e) {
    if (e instanceof QFormatError && !TRANSPORT.has(e.code)) return [e];
    throw e;
  }
  return f.check(opts);
}
