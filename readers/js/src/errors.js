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

/** Compare strings by Unicode code points (Python's order), not UTF-16 code units. */
export function cmpCodePoints(/** @type {string} */ a, /** @type {string} */ b) {
  const ia = a[Symbol.iterator]();
  const ib = b[Symbol.iterator]();
  for (;;) {
    const x = ia.next();
    const y = ib.next();
    if (x.done) return y.done ? 0 : -1;
    if (y.done) return 1;
    const cx = /** @type {number} */ (x.value.codePointAt(0));
    const cy = /** @type {number} */ (y.value.codePointAt(0));
    if (cx !== cy) return cx < cy ? -1 : 1;
  }
}

/** @param {string[]} names */
export function sortedNames(names) {
  return [...names].sort(cmpCodePoints);
}
