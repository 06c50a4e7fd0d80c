// Strict JSON for qformat (SPEC.md §1.2, §2.3 check 6-7, §3.1, §14).
//
// JSON.parse cannot meet the specification: it keeps the last of two repeated member names,
// rounds large integers, accepts lone surrogate escapes and has no depth limit.  This parser
// reads one JSON value from the start of a string (no leading whitespace skipped) and reports
// problems in the order the reference implementation does:
//   1. nesting deeper than the limit anywhere in the text (brackets outside strings): "depth";
//   2. while parsing, a repeated member name when its object closes: "duplicate"; any syntax
//      error, NaN/Infinity literals included: "syntax";
//   3. after parsing, a lone surrogate escape in any string or member name: "surrogate".
// Objects are returned as Map (member order kept, no prototype keys).  Integers (no fraction,
// no exponent) are Numbers when safe, else BigInt; other numbers are Numbers, or JFloat in header
// mode.  In the qformat JSON a literal of 100 characters or more is read as +-2^64 (every such
// value fails a range check); in the header (offsets, SPEC.md 1.2.1 §2.1) integers stay exact:
// BigInt up to EXACT_DIGITS characters, a HugeInt (its decimal digits) beyond, since V8 converts
// a decimal string to a BigInt in quadratic time.

/** A JSON parse failure; `kind` is "depth", "duplicate", "syntax" or "surrogate". */
export class JsonError extends Error {
  /** @param {string} kind @param {string} message */
  constructor(kind, message) {
    super(message);
    this.kind = kind;
  }
}

/** A number written with a fraction or exponent (header mode only, SPEC.md §2.1). */
export class JFloat {
  /** @param {number} value */
  constructor(value) {
    this.value = value;
  }
}

const TWO64 = 1n << 64n;
/** Header integer literals up to this many characters become BigInts; longer ones HugeInts. */
export const EXACT_DIGITS = 4096;

/**
 * An integer literal of the header too long to convert (more than EXACT_DIGITS characters): kept
 * as its sign and decimal digits (JSON: no leading zeros), compared and added exactly by
 * src/container.js.  Its magnitude is at least 10^4095.
 */
export class HugeInt {
  /** @param {string} lit */
  constructor(lit) {
    this.negative = lit[0] === "-";
    this.digits = this.negative ? lit.slice(1) : lit;
  }

  toString() {
    return (this.negative ? "-" : "") + this.digits;
  }
}

/**
 * True when brackets outside strings nest at most `limit` deep in the whole text.
 * @param {string} text @param {number} limit
 */
export function depthOk(text, limit) {
  let depth = 0;
  let inStr = false;
  let esc = false;
  for (let i = 0; i < text.length; i++) {
    const ch = text.charCodeAt(i);
    if (inStr) {
      if (esc) esc = false;
      else if (ch === 0x5c) esc = true;
      else if (ch === 0x22) inStr = false;
    } else if (ch === 0x22) inStr = true;
    else if (ch === 0x5b || ch === 0x7b) {
      if (++depth > limit) return false;
    } else if (ch === 0x5d || ch === 0x7d) depth--;
  }
  return true;
}

const LONE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** @param {string} s */
export function isWellFormed(s) {
  return !LONE.test(s);
}

/** @param {any} v @returns {boolean} */
function wellFormedValue(v) {
  if (typeof v === "string") return isWellFormed(v);
  if (v instanceof Map) {
    for (const [k, x] of v) if (!isWellFormed(k) || !wellFormedValue(x)) return false;
    return true;
  }
  if (Array.isArray(v)) return v.every(wellFormedValue);
  return true;
}

const NUMBER = /-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?/y;

/**
 * Parse one JSON value at the start of `text`.
 * @param {string} text
 * @param {{maxDepth?: number, header?: boolean}} [opts] header: numbers with a fraction or exponent become JFloat
 * @returns {{value: any, end: number}}
 */
export function parseStrict(text, opts = {}) {
  const maxDepth = opts.maxDepth ?? 64;
  const header = !!opts.header;
  if (!depthOk(text, maxDepth)) throw new JsonError("depth", `nesting deeper than ${maxDepth}`);
  let i = 0;
  const n = text.length;
  const fail = (/** @type {string} */ msg) => {
    throw new JsonError("syntax", `${msg} at character ${i}`);
  };
  const ws = () => {
    while (i < n) {
      const c = text.charCodeAt(i);
      if (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) i++;
      else break;
    }
  };
  const str = () => {
    // text[i] === '"'
    i++;
    let out = "";
    let start = i;
    for (;;) {
      if (i >= n) fail("unterminated string");
      const c = text.charCodeAt(i);
      if (c === 0x22) {
        out += text.slice(start, i);
        i++;
        return out;
      }
      if (c < 0x20) fail("invalid control character in a string");
      if (c === 0x5c) {
        out += text.slice(start, i);
        const e = text[i + 1];
        switch (e) {
          case '"': out += '"'; i += 2; break;
          case "\\": out += "\\"; i += 2; break;
          case "/": out += "/"; i += 2; break;
          case "b": out += "\b"; i += 2; break;
          case "f": out += "\f"; i += 2; break;
          case "n": out += "\n"; i += 2; break;
          case "r": out += "\r"; i += 2; break;
          case "t": out += "\t"; i += 2; break;
          case "u": {
            const h = text.slice(i + 2, i + 6);
            if (!/^[0-9a-fA-F]{4}$/.test(h)) fail("invalid \\u escape");
            out += String.fromCharCode(parseInt(h, 16));
            i += 6;
            break;
          }
          default:
            fail("invalid escape");
        }
        start = i;
      } else i++;
    }
  };
  /** @param {number} depth @returns {any} */
  const value = (depth) => {
    if (i >= n) fail("expecting a value");
    const c = text[i];
    if (c === "{") {
      i++;
      /** @type {[string, any][]} */
      const members = [];
      ws();
      if (text[i] === "}") {
        i++;
        return new Map();
      }
      for (;;) {
        if (text[i] !== '"') fail("expecting a member name");
        const k = str();
        ws();
        if (text[i] !== ":") fail("expecting ':'");
        i++;
        ws();
        const v = value(depth + 1);
        members.push([k, v]);
        ws();
        if (text[i] === "}") {
          i++;
          break;
        }
        if (text[i] !== ",") fail("expecting ',' or '}'");
        i++;
        ws();
      }
      const m = new Map();
      for (const [k, v] of members) {
        if (m.has(k)) throw new JsonError("duplicate", `member ${JSON.stringify(k)} appears twice in one object`);
        m.set(k, v);
      }
      return m;
    }
    if (c === "[") {
      i++;
      const arr = [];
      ws();
      if (text[i] === "]") {
        i++;
        return arr;
      }
      for (;;) {
        arr.push(value(depth + 1));
        ws();
        if (text[i] === "]") {
          i++;
          return arr;
        }
        if (text[i] !== ",") fail("expecting ',' or ']'");
        i++;
        ws();
      }
    }
    if (c === '"') return str();
    if (text.startsWith("true", i)) {
      i += 4;
      return true;
    }
    if (text.startsWith("false", i)) {
      i += 5;
      return false;
    }
    if (text.startsWith("null", i)) {
      i += 4;
      return null;
    }
    NUMBER.lastIndex = i;
    const m = NUMBER.exec(text);
    if (!m) fail("expecting a value (NaN and Infinity are not JSON)");
    const lit = /** @type {RegExpExecArray} */ (m)[0];
    i += lit.length;
    if (m && (m[1] !== undefined || m[2] !== undefined)) {
      const v = Number(lit);
      return header ? new JFloat(v) : v;
    }
    if (lit.length >= 100) {
      if (!header) return lit[0] === "-" ? -TWO64 : TWO64;
      return lit.length <= EXACT_DIGITS ? BigInt(lit) : new HugeInt(lit);
    }
    const v = Number(lit);
    if (Number.isSafeInteger(v)) return v;
    return BigInt(lit);
  };
  const v = value(1);
  if (!wellFormedValue(v)) throw new JsonError("surrogate", "a string holds a lone surrogate escape");
  return { value: v, end: i };
}

/**
 * Exact integer value of a JSON number (Number, BigInt, or integral JFloat is NOT one), or null.
 * In qformat JSON (not the header), a number with an integral value is an integer (SPEC.md §3.2).
 * @param {any} v @returns {bigint|null}
 */
export function asInteger(v) {
  if (typeof v === "bigint") return v;
  if (typeof v === "number" && Number.isInteger(v)) return BigInt(v);
  return null;
}
