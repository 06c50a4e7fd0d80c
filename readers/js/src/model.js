// The qformat view of a file whose container is valid (SPEC.md §3.7): the qformat object, its
// version, file-scope problems (which refuse the whole file), each descriptor with its own
// problems (which refuse that logical tensor), component claims and name conflicts, plain tensors.

import { LIMITS } from "./tables.js";
import { error, sortedNames } from "./errors.js";
import { JsonError, parseStrict } from "./json.js";
import { describeFailure, descriptorFailures, objectFailures, structuralCode } from "./structure.js";
import { depthOf, descriptorFrom, references } from "./descriptor.js";
import { READER_MINOR, extensionProblems, validateDescriptor } from "./validate.js";

const VERSION_RE = /^(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})$/;
const SUB_BYTE = new Set(["F4", "F6_E2M3", "F6_E3M2"]);
/** Bytes of one element as a plain tensor reads (SPEC.md §2.5, §2.6; F4: one byte a value). */
const PLAIN_BYTES = /** @type {Record<string, number>} */ ({ U16: 2, I16: 2, F16: 2, BF16: 2, U32: 4, I32: 4, F32: 4, U64: 8, I64: 8, F64: 8, C64: 8 });
const TOP_MEMBERS = ["version", "tensors", "extensions"];

/** @typedef {import("./errors.js").QFormatError} QFormatError */
/** @typedef {import("./descriptor.js").Descriptor} Descriptor */

/**
 * @typedef {object} FileModel
 * @property {string|null} version
 * @property {Map<string, Descriptor>} descriptors  valid descriptors by logical name
 * @property {Map<string, any>} raw    every member of `tensors` (raw JSON), in file order
 * @property {string[]} plain          plain tensor names, sorted
 * @property {Map<string, string>} components  component -> its (first) logical owner
 * @property {Map<string, string[]>} parts  logical tensor -> the components it owns (components inverted)
 * @property {Set<string>} plainSet    `plain` as a set (membership in constant time)
 * @property {QFormatError[]} fileProblems
 * @property {Map<string, QFormatError[]>} tensorProblems
 * @property {Map<string, any>|null} [digests]  the qformat object's valid `digests` member (SPEC.md §3.8), if any
 */

/** @param {FileModel} m */
export function problems(m) {
  const out = [...m.fileProblems];
  for (const l of m.tensorProblems.values()) for (const p of l) out.push(p);
  return out;
}

/** The stored tensors that reading `name` uses: a logical tensor's components, or the plain tensor. @param {FileModel} m @param {string} name */
export function storedOf(m, name) {
  return m.raw.has(name) ? m.parts.get(name) ?? [] : [name];
}

/** Fill `parts` and `plainSet` from `components` and `plain`. @param {FileModel} m */
function index(m) {
  for (const [comp, owner] of m.components) {
    const l = m.parts.get(owner);
    if (l) l.push(comp);
    else m.parts.set(owner, [comp]);
  }
  m.plainSet = new Set(m.plain);
  return m;
}

/** Names a reader returns: plain and logical tensors, sorted. @param {FileModel} m */
export function logicalNames(m) {
  return sortedNames([...new Set([...m.plain, ...m.raw.keys()])]);
}

const utf8 = new TextEncoder();

/**
 * @param {import("./container.js").Header} header
 * @returns {FileModel}
 */
export function interpret(header) {
  /** @type {FileModel} */
  const m = { version: null, descriptors: new Map(), raw: new Map(), plain: [], components: new Map(), parts: new Map(), plainSet: new Set(), fileProblems: [], tensorProblems: new Map(), digests: null };
  const info = (/** @type {string} */ name) => {
    const e = header.entries.get(name);
    return e === undefined ? null : { dtype: e.dtype, shape: e.shape };
  };
  const text = header.metadata?.get("qformat");
  if (text === undefined) {
    m.plain = sortedNames([...header.entries.keys()]);
    plainDtypeProblems(m, header);
    return index(m);
  }
  const obj = qformatObject(text, m);
  if (obj === null) return index(m);
  const v = obj.get("version");
  if (typeof v !== "string" || !VERSION_RE.test(v)) {
    m.fileProblems.push(error("VERSION_INVALID", "expected a string MAJOR.MINOR such as \"1.0\"", null, "version"));
    return index(m);
  }
  const [major, minor] = v.split(".").map(Number);
  if (major !== 1) {
    m.fileProblems.push(error("VERSION_UNSUPPORTED", `this reader implements major version 1, the file declares ${v}`, null, "version"));
    return index(m);
  }
  m.version = v;
  const newer = minor > READER_MINOR;
  for (const p of topLevelProblems(obj, newer, minor)) m.fileProblems.push(p);
  if (m.fileProblems.length) return index(m);
  if (obj.has("digests") && (newer || minor >= 2)) m.digests = obj.get("digests");
  /** @type {Map<string, string[]>} */
  const claims = new Map();
  for (const [name, raw] of obj.get("tensors")) {
    m.raw.set(name, raw);
    const [desc, probs] = interpretDescriptor(name, raw, info, newer, minor);
    if (desc !== null) {
      claim(desc, name, claims);
      if (!probs.length) m.descriptors.set(name, desc);
    }
    if (probs.length) m.tensorProblems.set(name, probs);
  }
  const addProblem = (/** @type {string} */ name, /** @type {QFormatError} */ p) => {
    const l = m.tensorProblems.get(name);
    if (l) l.push(p);
    else m.tensorProblems.set(name, [p]);
  };
  for (const [comp, owners] of claims) {
    if (owners.length > 1) {
      for (const owner of sortedNames([...new Set(owners)])) {
        addProblem(owner, error("COMPONENT_CLAIMED_TWICE", `component ${JSON.stringify(comp)} is referenced ${owners.length} times`, owner));
        m.descriptors.delete(owner);
      }
    }
    if (header.entries.has(comp)) m.components.set(comp, owners[0]);
  }
  for (const name of m.raw.keys()) {
    const owner = m.components.get(name);
    if (header.entries.has(name) && owner === undefined && !m.tensorProblems.has(name)) {
      addProblem(name, error("NAME_CONFLICT", `logical tensor ${JSON.stringify(name)} has the name of a plain tensor`, name));
      m.descriptors.delete(name);
    } else if (owner !== undefined && owner !== name) {
      addProblem(name, error("NAME_CONFLICT", `logical tensor ${JSON.stringify(name)} has the name of a component of ${JSON.stringify(owner)}`, name));
      m.descriptors.delete(name);
    }
  }
  m.plain = sortedNames([...header.entries.keys()].filter((n) => !m.components.has(n) && !m.raw.has(n)));
  plainDtypeProblems(m, header);
  return index(m);
}

/** @param {string} text @param {FileModel} m @returns {Map<string, any>|null} */
function qformatObject(text, m) {
  if (utf8.encode(text).length > LIMITS.max_qformat_json_bytes) {
    m.fileProblems.push(error("QFORMAT_JSON_INVALID", `the qformat metadata value is larger than ${LIMITS.max_qformat_json_bytes} bytes`));
    return null;
  }
  let obj;
  try {
    const r = parseStrict(text, { maxDepth: LIMITS.max_json_depth });
    obj = r.value;
    if (/[^ \t\n\r]/.test(text.slice(r.end))) throw new JsonError("syntax", "text follows the JSON object");
  } catch (e) {
    if (!(e instanceof JsonError)) throw e;
    m.fileProblems.push(error("QFORMAT_JSON_INVALID", `the qformat metadata value is not valid JSON: ${e.message}`));
    return null;
  }
  if (!(obj instanceof Map)) {
    m.fileProblems.push(error("QFORMAT_JSON_INVALID", "expected a JSON object"));
    return null;
  }
  if (!obj.has("version")) {
    m.fileProblems.push(error("VERSION_MISSING", "the qformat object has no 'version'", null, "version"));
    return null;
  }
  return obj;
}

/** §3.7 steps 3 and 4. @param {Map<string, any>} obj @param {boolean} newer @param {number} minor @returns {QFormatError[]} */
function topLevelProblems(obj, newer, minor) {
  const failures = objectFailures(obj, newer, minor);
  if (failures.length) return [error(newer ? "FEATURE_UNSUPPORTED" : "SCHEMA_VIOLATION", failures.join("; "))];
  const exts = (obj.get("extensions") ?? []).map((/** @type {Map<string, any>} */ e) => ({ name: e.get("name"), must_understand: e.get("must_understand") ?? true }));
  return extensionProblems(exts, newer, "file", null);
}

/**
 * @param {string} name @param {any} raw @param {import("./validate.js").Info} info @param {boolean} newer @param {number} minor
 * @returns {[Descriptor|null, QFormatError[]]}
 */
function interpretDescriptor(name, raw, info, newer, minor) {
  const isObj = raw instanceof Map;
  const deep = isObj && depthOf(raw) > LIMITS.max_nesting_depth;
  // §3.2: an empty logical name, or the header's reserved name __metadata__, refuses that tensor
  if (name === "" || name === "__metadata__") return [null, [error("SCHEMA_VIOLATION", "a logical tensor name must not be empty or __metadata__", name)]];
  if (deep) return [null, [error("DEPTH_EXCEEDED", `encoded parameters nest deeper than ${LIMITS.max_nesting_depth}`, name)]];
  const failures = descriptorFailures(raw);
  if (failures.length) {
    const code = newer ? "FEATURE_UNSUPPORTED" : /** @type {string} */ (structuralCode(failures));
    return [null, [error(code, failures.slice(0, 5).map(describeFailure).join("; "), name)]];
  }
  const desc = descriptorFrom(raw);
  return [desc, validateDescriptor(name, desc, info, 0, newer, minor)];
}

/**
 * Record which stored tensors `name` references; a group index counts once per tensor.
 * @param {Descriptor} desc @param {string} name @param {Map<string, string[]>} claims
 */
function claim(desc, name, claims) {
  /** @type {Map<string, boolean>} */
  const own = new Map();
  for (const [path, comp] of references(desc)) {
    const isIndex = path.endsWith("blocks.index.tensor");
    if (own.has(comp) && own.get(comp) && isIndex) continue;
    own.set(comp, isIndex);
    const l = claims.get(comp);
    if (l) l.push(name);
    else claims.set(comp, [name]);
  }
}

/** @param {FileModel} m @param {import("./container.js").Header} header */
function plainDtypeProblems(m, header) {
  // §2.2: an empty plain tensor whose element bytes times its non-zero entries reach 2^63 has no
  // array (every storage dtype has a plain reading since 1.2, §2.6; F6_* reads as 1-D bytes)
  for (const n of m.plain) {
    const e = /** @type {import("./container.js").Entry} */ (header.entries.get(n));
    if (!e.shape.includes(0n) || SUB_BYTE.has(e.dtype) && e.dtype !== "F4") continue;
    let span = BigInt(PLAIN_BYTES[e.dtype] ?? 1);
    for (const s of e.shape) span *= s || 1n;
    if (span >= 1n << 63n) {
      const p = error("SHAPE_UNREPRESENTABLE", `plain tensor of ${e.dtype} of shape [${e.shape}] is empty but too large for an array: ${span} bytes, expected below 2^63`, n, "shape");
      const l = m.tensorProblems.get(n);
      if (l) l.push(p);
      else m.tensorProblems.set(n, [p]);
    }
  }
}
