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
