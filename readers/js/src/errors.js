import { ERRORS } from "./tables.js";

/** A qformat error: `code` is the stable code of SPEC.md §16; the message is documentation. */
export class QFormatError extends Error {
  /**
   * @param {string} code
   * @param {string} message
   * @param {{tensor?: string|null, field?: string|null}} [where]
   */
  constructor(code, message, where = {}) {
    if (!(code in ERRORS)) throw new Error(`unregistered qformat error code ${code}`);
    const parts = [];
    if (where.tensor != null) parts.push(`tensor ${JSON.stringify(where.tensor)}`);
    if (where.field) parts.push(`field ${where.field}`);
    super(`[${code}] ${parts.length ? parts.join(", ") + ": " : ""}${message}`);
    this.code = code;
    this.category = ERRORS[code];
    this.tensor = where.tensor ?? null;
    this.field = where.field ?? null;
  }
}

/** @param {string} code @param {string} message @param {string|null} [tensor] @param {string|null} [field] */
export function error(code, message, tensor = null, field = null) {
  return new QFormatError(code, message, { tensor, field });
}

/**
 * Compare strings by Unicode code points (Python's order), not UTF-16 code units.  Units are
 * compared until the first that differs (no allocation: names are sorted by the hundred
 * thousand); where a surrogate is involved there, the code points from that position decide.
 */
export function cmpCodePoints(/** @type {string} */ a, /** @type {string} */ b) {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const x = a.charCodeAt(i);
    const y = b.charCodeAt(i);
    if (x === y) continue;
    const surrogate = (/** @type {number} */ u) => u >= 0xd800 && u <= 0xdfff;
    if (!surrogate(x) && !surrogate(y)) return x < y ? -1 : 1;
    // the code point this unit belongs to starts one unit back when it is a pair's low half
    const at = i > 0 && a.charCodeAt(i - 1) >= 0xd800 && a.charCodeAt(i - 1) <= 0xdbff ? i - 1 : i;
    const cx = /** @type {number} */ (a.codePointAt(at));
    const cy = /** @type {number} */ (b.codePointAt(at));
    if (cx !== cy) return cx < cy ? -1 : 1;
    return cmpCodePoints(a.slice(at + (cx > 0xffff ? 2 : 1)), b.slice(at + (cy > 0xffff ? 2 : 1)));
  }
  return a.length === b.length ? 0 : a.length < b.length ? -1 : 1;
}

/** @param {string[]} names */
export function sortedNames(names) {
  return [...names].sort(cmpCodePoints);
}
