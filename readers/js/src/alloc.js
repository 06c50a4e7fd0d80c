// Allocations sized by a file: a tensor's stored bytes, its decoded values.  Their sizes are
// checked against the file's size before this is reached; what remains is the platform's own
// limit (a typed array of at most 2^32 elements in Node 20, 2^53 - 1 in later V8; browsers vary),
// refused with a coded error instead of a RangeError.

import { error } from "./errors.js";

/** The longest typed array this platform allocates (Node: buffer.constants.MAX_LENGTH; elsewhere unknown, so 2^53 - 1). */
export const MAX_ARRAY_LENGTH = platformLimit();

function platformLimit() {
  try {
    const n = /** @type {any} */ (globalThis).process?.getBuiltinModule?.("node:buffer")?.constants?.MAX_LENGTH;
    if (Number.isSafeInteger(n) && n > 0) return n;
  } catch {
    // not Node, or a Node without getBuiltinModule: the allocation itself says
  }
  return Number.MAX_SAFE_INTEGER;
}

/**
 * Throw SHAPE_UNREPRESENTABLE unless an array of `length` elements can be made: a safe integer
 * within `limit` (default: the platform's).  Called before anything is fetched or allocated.
 * @param {number} length @param {string} what  what the array would hold (for the message)
 * @param {string|null} [tensor] @param {number} [limit]
 */
export function checkLength(length, what, tensor = null, limit = MAX_ARRAY_LENGTH) {
  if (!Number.isSafeInteger(length) || length < 0) {
    throw error("SHAPE_UNREPRESENTABLE", `${what} would need ${length} elements, past 2^53 - 1: no array can hold them`, tensor);
  }
  if (length > limit) {
    throw error("SHAPE_UNREPRESENTABLE", `${what} would need an array of ${length} elements; this platform's arrays hold at most ${limit}`, tensor);
  }
}

/**
 * `new Ctor(length)`, or SHAPE_UNREPRESENTABLE where the platform cannot make it (checkLength,
 * then the allocation's own RangeError: out of memory, or a limit checkLength did not know).
 * @template {Uint8Array|Uint16Array|Float32Array|Float64Array|Int32Array|Uint32Array} T
 * @param {{new (n: number): T}} Ctor @param {number} length @param {string} what @param {string|null} [tensor]
 * @returns {T}
 */
export function allocate(Ctor, length, what, tensor = null) {
  checkLength(length, what, tensor);
  try {
    return new Ctor(length);
  } catch (e) {
    if (!(e instanceof RangeError)) throw e;
    throw error("SHAPE_UNREPRESENTABLE", `${what} would need an array of ${length} elements, which this platform could not allocate (${e.message})`, tensor);
  }
}
