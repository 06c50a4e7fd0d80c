// Byte sources: where a file's bytes come from.  The core reads only through this interface,
// so the same decoder runs on an in-memory buffer (browser) or on byte ranges of a file (Node).

/**
 * @typedef {object} ByteSource
 * @property {number} size  total number of bytes
 * @property {(offset: number, length: number) => Uint8Array} read  the bytes [offset, offset+length)
 */

/**
 * A ByteSource over bytes in memory.
 * @param {ArrayBuffer|ArrayBufferView} bytes
 * @returns {ByteSource}
 */
export function memorySource(bytes) {
  const u8 = bytes instanceof Uint8Array ? bytes
    : ArrayBuffer.isView(bytes) ? new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength)
    : new Uint8Array(bytes);
  return { size: u8.length, read: (off, len) => u8.subarray(off, off + len) };
}

// Asynchronous byte sources: bytes that arrive later (a Blob in the browser, a URL read by HTTP
// range requests).  The decoder stays synchronous: src/lazy.js fetches the ranges a call needs
// through one of these first, into a RangeCache, which is the ByteSource the decoder reads.

/**
 * @typedef {object} AsyncByteSource
 * @property {number} size  total number of bytes
 * @property {(offset: number, length: number) => Promise<Uint8Array>} read  the bytes [offset, offset+length)
 * @property {number} bytesFetched  how many bytes read() has produced so far
 */

/**
 * An AsyncByteSource over bytes in memory: the in-memory case of the path Blobs and URLs take.
 * @param {ArrayBuffer|ArrayBufferView} bytes
 * @returns {AsyncByteSource}
 */
export function bufferSource(bytes) {
  const mem = memorySource(bytes);
  const src = {
    size: mem.size,
    bytesFetched: 0,
    async read(/** @type {number} */ off, /** @type {number} */ len) {
      src.bytesFetched += len;
      return mem.read(off, len);
    },
  };
  return src;
}

/**
 * An AsyncByteSource over a Blob (a File from a picker or a drop): each read is Blob.slice of
 * just that range, so a large local file is never read whole.
 * @param {Blob} blob
 * @returns {AsyncByteSource}
 */
export function blobSource(blob) {
  const src = {
    size: blob.size,
    bytesFetched: 0,
    async read(/** @type {number} */ off, /** @type {number} */ len) {
      const u8 = new Uint8Array(await blob.slice(off, off + len).arrayBuffer());
      src.bytesFetched += u8.length;
      return u8;
    },
  };
  return src;
}

/**
 * A ByteSource over the ranges fetched so far: the synchronous view the decoder reads.  Every
 * read must fall inside one fetched range; src/lazy.js fetches whole entries, so it always does.
 * A chunk added with the ranges it was fetched for is found by their starts in constant time (a
 * file of many tensors read one by one stays linear); chunks added without (the probe, the
 * header: a few) are searched.
 */
export class RangeCache {
  /** @param {number} size */
  constructor(size) {
    this.size = size;
    /** @type {{start: number, bytes: Uint8Array}[]} chunks found by search */
    this.spans = [];
    /** @type {Map<number, {start: number, bytes: Uint8Array}>} a fetched range's start -> its chunk */
    this.byStart = new Map();
  }

  /**
   * @param {number} start @param {Uint8Array} bytes
   * @param {[number, number][]} [ranges]  the [begin, end) ranges (inside the chunk) it was fetched for
   */
  add(start, bytes, ranges) {
    const c = { start, bytes };
    if (!ranges) {
      this.spans.push(c);
      return;
    }
    this.byStart.set(start, c);
    for (const [a] of ranges) this.byStart.set(a, c);
  }

  /** The chunk holding [off, off + len), or null. @param {number} off @param {number} len */
  _find(off, len) {
    const inside = (/** @type {{start: number, bytes: Uint8Array}|undefined} */ c) => c !== undefined && c.start <= off && off + len <= c.start + c.bytes.length;
    const c = this.byStart.get(off);
    if (inside(c)) return /** @type {{start: number, bytes: Uint8Array}} */ (c);
    for (const s of this.spans) if (inside(s)) return s;
    return null;
  }

  /** @param {number} off @param {number} len */
  has(off, len) {
    return len === 0 || this._find(off, len) !== null;
  }

  /** @param {number} off @param {number} len @returns {Uint8Array} */
  read(off, len) {
    if (len === 0) return new Uint8Array(0);  // an empty tensor: no bytes to have fetched
    const c = this._find(off, len);
    if (c !== null) return c.bytes.subarray(off - c.start, off - c.start + len);
    // a bug of the caller (lazy.js fetches before it decodes), not a property of the file
    throw new Error(`bytes [${off}, ${off + len}) were read before they were fetched`);
  }

  /** Forget every range that does not start before `keep` (the header stays). @param {number} keep */
  release(keep) {
    this.spans = this.spans.filter((c) => c.start < keep);
    for (const [a, c] of this.byStart) if (c.start >= keep) this.byStart.delete(a);
  }
}
