// The structural checks of SPEC.md, written from its text: §3.2's Q1-Q5 for the qformat object
// without its descriptors, and §5.5's D1-D14 (with the variants E-int, E-float, E-codebook,
// B-grid, B-flat) for a descriptor.  They decide both validity and the code, so the reader needs
// no JSON Schema library: the code of an invalid descriptor comes from which checks fail, never
// from where a validator reports a failure.
//
// Values are the parsed JSON of src/json.js: objects are Maps, arrays are Arrays, integers are
// Numbers or BigInts (exact), numbers written with a fraction or an exponent are Numbers.

import { CODEBOOKS, FLOAT_FORMATS, LIMITS } from "./tables.js";
import { DIGESTS_SINCE_MINOR, digestsFailures } from "./digest.js";

const MAX_SAFE = 2n ** 53n - 1n;
/**
 * The longest packing `order`, parameter `order` and grid `size` (D8, D10, B-grid): the schema's
 * maxItems, 64 (SPEC.md 1.2.1 pins the schema's limit; 1.2's prose said 16).  A longer `order`
 * than 16 can never be a permutation (its items are 0..15): the semantic checks refuse it.
 */
const MAX_ARRAY = 64;
const DTYPES = ["float32", "float16", "bfloat16"];
const DESCRIPTOR_MEMBERS = ["shape", "dtype", "codes", "zero", "scale", "bias", "layout", "allow_nonfinite_params", "scheme", "extensions"];
const PACKING_MEMBERS = ["container", "bit_order", "axis", "order", "straddle", "slot_order", "planes", "row_alignment"];
const PARAM_MEMBERS = ["blocks", "op", "tensor", "order", "encoded"];
const OPS = /** @type {Record<string, string[]|null>} */ ({ zero: null, scale: ["multiply", "divide"], bias: ["add", "subtract"] });

/** @typedef {{check: string, code: string, at: string, message: string}} Failure */

/** @param {any} v @returns {v is Map<string, any>} */
const isObject = (v) => v instanceof Map;

/** An integer: a JSON number with an integral value, however written; never a boolean (§5.5). @param {any} v */
const isInteger = (v) => typeof v === "bigint" || (typeof v === "number" && Number.isInteger(v));

/** @param {any} v @param {bigint} lo @param {bigint} hi */
const intIn = (v, lo, hi) => isInteger(v) && BigInt(v) >= lo && BigInt(v) <= hi;

/** Length in Unicode code points. @param {string} s */
function codePoints(s) {
  let n = 0;
  for (const _ of s) n++; // eslint-disable-line no-unused-vars
  return n;
}

/** A string of `lo..hi` code points. @param {any} v @param {number} lo @param {number} hi */
const stringOf = (v, lo, hi) => typeof v === "string" && codePoints(v) >= lo && codePoints(v) <= hi;

/** A name: a string of at least one character. @param {any} v */
const isName = (v) => typeof v === "string" && v.length > 0;

/** An array of `lo..hi` entries, each satisfying `each`. @param {any} v @param {number} lo @param {number} hi @param {(x: any) => boolean} each */
const arrayOf = (v, lo, hi, each) => Array.isArray(v) && v.length >= lo && v.length <= hi && v.every(each);

/** No member outside `allowed`. @param {Map<string, any>} o @param {string[]} allowed */
const onlyMembers = (o, allowed) => [...o.keys()].every((k) => allowed.includes(k));

/** Every member of `required` is present. @param {Map<string, any>} o @param {string[]} required */
const hasMembers = (o, required) => required.every((k) => o.has(k));

/** "Exactly the members M": the required ones present, nothing outside M. @param {Map<string, any>} o @param {string[]} required @param {string[]} optional */
const exactly = (o, required, optional = []) => hasMembers(o, required) && onlyMembers(o, [...required, ...optional]);

/** @param {any} v */
const index = (v) => intIn(v, 0n, 15n);

/** §5.5 E-int, E-float, E-codebook: the element variants (check D7). @param {any} e */
function isElement(e) {
  if (!isObject(e)) return false;
  switch (e.get("type")) {
    case "int":
      return exactly(e, ["type", "bits", "signedness"], ["code_offset", "frac_bits"])
        && intIn(e.get("bits"), 1n, 8n)
        && ["unsigned", "twos_complement", "offset_binary"].includes(e.get("signedness"))
        && (!e.has("code_offset") || intIn(e.get("code_offset"), 0n, 255n))
        && (!e.has("frac_bits") || intIn(e.get("frac_bits"), 0n, 16n));
    case "float":
      return exactly(e, ["type", "format"]) && typeof e.get("format") === "string" && Object.hasOwn(FLOAT_FORMATS, e.get("format"));
    case "codebook":
      return exactly(e, ["type", "bits"], ["table", "table_tensor"])
        && e.has("table") !== e.has("table_tensor")
        && intIn(e.get("bits"), 1n, 8n)
        && (!e.has("table") || (typeof e.get("table") === "string" && Object.hasOwn(CODEBOOKS, e.get("table"))))
        && (!e.has("table_tensor") || isName(e.get("table_tensor")));
    default:
      return false;
  }
}

/** §5.5 B-grid, B-flat: the blocks variants (check D11). @param {any} b */
function isBlocks(b) {
  if (!isObject(b)) return false;
  switch (b.get("type")) {
    case "grid": {
      if (!exactly(b, ["type", "size"], ["index"])) return false;
      // at most 64 entries (the schema's maxItems; 1.2.1): exactly r of them, the rank, by §8.1
      if (!arrayOf(b.get("size"), 0, MAX_ARRAY, (s) => s === null || intIn(s, 1n, MAX_SAFE))) return false;
      if (!b.has("index")) return true;
      const i = b.get("index");
      return isObject(i) && exactly(i, ["axis", "tensor", "count"]) && index(i.get("axis")) && isName(i.get("tensor")) && intIn(i.get("count"), 1n, MAX_SAFE);
    }
    case "flat":
      return exactly(b, ["type", "size"]) && intIn(b.get("size"), 1n, MAX_SAFE);
    default:
      return false;
  }
}

/** Check D8 on a present `codes.packing`: the messages of its failures (every one PACKING_INVALID). @param {any} p */
function packingFailures(p) {
  if (!isObject(p)) return ["is not an object"];
  const out = [];
  for (const m of ["container", "bit_order", "axis"]) if (!p.has(m)) out.push(`has no '${m}'`);
  const has = (/** @type {string} */ m, /** @type {(v: any) => boolean} */ ok, /** @type {string} */ what) => {
    if (p.has(m) && !ok(p.get(m))) out.push(`'${m}' is not ${what}`);
  };
  has("container", (v) => isInteger(v) && [8n, 16n, 32n].includes(BigInt(v)), "the integer 8, 16 or 32");
  has("bit_order", (v) => v === "lsb_first" || v === "msb_first", "lsb_first or msb_first");
  has("axis", (v) => v === null || index(v), "null or an integer 0..15");
  has("order", (v) => arrayOf(v, 0, MAX_ARRAY, index), `an array of at most ${MAX_ARRAY} integers 0..15`);
  has("straddle", (v) => typeof v === "boolean", "a boolean");
  has("slot_order", (v) => arrayOf(v, 1, 256, (x) => intIn(x, 0n, 255n)), "an array of 1 to 256 integers 0..255");
  has("planes", (v) => isObject(v) && intIn(v.get("span"), 1n, MAX_SAFE), "an object with an integer 'span' 1..2^53-1");
  has("row_alignment", (v) => intIn(v, 1n, 65536n), "an integer 1..65536");
  return out;
}

/** Check D10 on a present parameter `role`: the messages of its failures. @param {string} role @param {any} q */
function paramFailures(role, q) {
  if (!isObject(q)) return ["is not an object"];
  const out = [];
  if (!q.has("blocks")) out.push("has no 'blocks'");
  if (!onlyMembers(q, PARAM_MEMBERS)) out.push(`has a member other than ${PARAM_MEMBERS.join(", ")}`);
  if (q.has("tensor") === q.has("encoded")) out.push("needs exactly one of 'tensor' and 'encoded'");
  if (q.has("order") && q.has("encoded")) out.push("has 'order' next to 'encoded'");
  const ops = OPS[role];
  if (ops === null) {
    if (q.has("op")) out.push("has an 'op' (a zero point has none)");
  } else if (!ops.includes(q.get("op"))) out.push(`needs 'op' ${ops.join(" or ")}`);
  if (q.has("tensor") && !isName(q.get("tensor"))) out.push("'tensor' is not a name");
  if (q.has("order") && !arrayOf(q.get("order"), 0, MAX_ARRAY, index)) out.push(`'order' is not an array of at most ${MAX_ARRAY} integers 0..15`);
  return out;
}

/** An `extensions` list as check D14 (and Q4) requires. @param {any} v */
const isExtensions = (v) => arrayOf(v, 0, LIMITS.max_extensions, (e) => isObject(e)
  && exactly(e, ["name"], ["must_understand", "configuration"])
  && stringOf(e.get("name"), 1, 256)
  && (!e.has("must_understand") || typeof e.get("must_understand") === "boolean")
  && (!e.has("configuration") || isObject(e.get("configuration"))));

/**
 * Every failing check D1-D14 of SPEC.md §5.5 on a descriptor (empty: structurally valid).
 * A check applies only when the member it names is present in an object that should hold it.
 * @param {any} d @param {string} [at] where `d` sits, for messages @returns {Failure[]}
 */
export function descriptorFailures(d, at = "") {
  /** @type {Failure[]} */
  const out = [];
  const path = (/** @type {string} */ m) => (at ? `${at}.${m}` : m);
  const fail = (/** @type {string} */ check, /** @type {string} */ code, /** @type {string} */ where, /** @type {string} */ message) => out.push({ check, code, at: where, message });
  if (!isObject(d)) {
    fail("D1", "SCHEMA_VIOLATION", at, "a descriptor must be a JSON object");
    return out;
  }
  if (!hasMembers(d, ["shape", "dtype", "codes"])) fail("D2", "SCHEMA_VIOLATION", at, "a descriptor needs 'shape', 'dtype' and 'codes'");
  const extra = [...d.keys()].filter((k) => !DESCRIPTOR_MEMBERS.includes(k));
  if (extra.length) fail("D2", "SCHEMA_VIOLATION", at, `unknown descriptor members ${JSON.stringify(extra)}`);
  if (d.has("shape") && !arrayOf(d.get("shape"), 0, LIMITS.max_rank, (s) => intIn(s, 0n, MAX_SAFE))) {
    fail("D3", "SHAPE_INVALID", path("shape"), `expected an array of at most ${LIMITS.max_rank} integers 0..2^53-1`);
  }
  if (d.has("dtype") && !DTYPES.includes(d.get("dtype"))) fail("D4", "DTYPE_INVALID", path("dtype"), `expected one of ${DTYPES.join(", ")}`);
  if (d.has("codes")) {
    const c = d.get("codes");
    if (!isObject(c) || !exactly(c, ["tensor", "element", "packing"])) {
      fail("D5", "SCHEMA_VIOLATION", path("codes"), "expected an object with exactly the members tensor, element, packing");
    }
    if (isObject(c)) {
      if (c.has("tensor") && !isName(c.get("tensor"))) fail("D6", "SCHEMA_VIOLATION", path("codes.tensor"), "expected a name (a non-empty string)");
      if (c.has("element") && !isElement(c.get("element"))) fail("D7", "ELEMENT_INVALID", path("codes.element"), "not an int, float or codebook element as §5.5 describes them");
      if (c.has("packing")) {
        const p = c.get("packing");
        for (const m of packingFailures(p)) fail("D8", "PACKING_INVALID", path("codes.packing"), m);
        if (isObject(p)) {
          if (!onlyMembers(p, PACKING_MEMBERS)) fail("D9", "SCHEMA_VIOLATION", path("codes.packing"), `a member other than ${PACKING_MEMBERS.join(", ")}`);
          const pl = p.get("planes");
          if (isObject(pl) && !onlyMembers(pl, ["span"])) fail("D9", "SCHEMA_VIOLATION", path("codes.packing.planes"), "a member other than 'span'");
        }
      }
    }
  }
  for (const role of ["zero", "scale", "bias"]) {
    if (!d.has(role)) continue;
    const q = d.get(role);
    for (const m of paramFailures(role, q)) fail("D10", "SCHEMA_VIOLATION", path(role), m);
    if (!isObject(q)) continue;
    if (q.has("blocks") && !isBlocks(q.get("blocks"))) fail("D11", "BLOCKS_INVALID", path(`${role}.blocks`), "not grid or flat blocks as §5.5 describes them");
    if (q.has("encoded")) {
      const inner = descriptorFailures(q.get("encoded"), path(`${role}.encoded`));
      if (inner.length) fail("D12", "SCHEMA_VIOLATION", path(`${role}.encoded`), `the nested descriptor fails ${inner[0].check} (${describeFailure(inner[0])})`);
    }
  }
  if (d.has("layout")) {
    const l = d.get("layout");
    if (!isObject(l) || !isName(l.get("name")) || (l.has("parameters") && !isObject(l.get("parameters")))) {
      fail("D13", "LAYOUT_INVALID", path("layout"), "expected an object with a name 'name' and an object 'parameters'");
    }
    if (isObject(l) && !onlyMembers(l, ["name", "parameters"])) fail("D13'", "SCHEMA_VIOLATION", path("layout"), "a member other than name and parameters");
  }
  if (d.has("allow_nonfinite_params") && typeof d.get("allow_nonfinite_params") !== "boolean") fail("D14", "SCHEMA_VIOLATION", path("allow_nonfinite_params"), "expected a boolean");
  if (d.has("scheme") && !stringOf(d.get("scheme"), 1, 64)) fail("D14", "SCHEMA_VIOLATION", path("scheme"), "expected a string of 1 to 64 characters");
  if (d.has("extensions") && !isExtensions(d.get("extensions"))) fail("D14", "SCHEMA_VIOLATION", path("extensions"), "expected a list of extensions as §3.5 describes them");
  return out;
}

/**
 * The code of a descriptor in a file not newer than the reader (§5.5 steps 2-3): null when it is
 * structurally valid; the failures' code when they all share one; SCHEMA_VIOLATION otherwise.
 * @param {Failure[]} failures
 */
export function structuralCode(failures) {
  if (!failures.length) return null;
  const codes = new Set(failures.map((f) => f.code));
  return codes.size === 1 ? failures[0].code : "SCHEMA_VIOLATION";
}

/** @param {Failure} f */
export function describeFailure(f) {
  return `${f.check} at ${f.at || "(descriptor)"}: ${f.message}`;
}

/**
 * The checks Q1-Q5 of §3.2 on the qformat object without its descriptors (its `version` has
 * passed §3.3): the messages of the failing ones.  Q3 is not checked in a file newer than the
 * reader, whose unknown top-level members are ignored (§3.4); `digests` is a member from 1.2 on.
 * @param {Map<string, any>} obj @param {boolean} newer @param {number} [minor] @returns {string[]}
 */
export function objectFailures(obj, newer, minor = 0) {
  const out = [];
  const withDigests = newer || minor >= DIGESTS_SINCE_MINOR;
  if (!obj.has("tensors")) out.push("Q1: the qformat object has no 'tensors'");
  else if (!isObject(obj.get("tensors"))) out.push("Q2: 'tensors' is not an object");
  if (!newer) {
    const known = ["version", "tensors", "extensions", ...(withDigests ? ["digests"] : [])];
    const extra = [...obj.keys()].filter((k) => !known.includes(k));
    if (extra.length) out.push(`Q3: unknown top-level members ${JSON.stringify(extra)}`);
  }
  if (obj.has("extensions") && !isExtensions(obj.get("extensions"))) out.push("Q4: 'extensions' is not a list of extensions as §3.5 describes them");
  if (withDigests && obj.has("digests")) for (const f of digestsFailures(obj.get("digests"))) out.push(f);
  return out;
}
