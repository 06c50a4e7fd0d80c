// Semantic validation of a structurally valid descriptor against the component headers (SPEC.md §5-§9,
// §11, §12.2-§12.3), in the check order of the reference implementation: shape size, tensor-scope
// extensions, layout, element, packing, codes component, then each parameter (blocks, tensor or
// nested descriptor).  Only dtypes and shapes are read here, never payload bytes.

import { CODEBOOKS, LAYOUTS, LIMITS } from "./tables.js";
import { error } from "./errors.js";
import { codesGeometry, gridShape, isPermutation, params, prod, storedGridShape, usesSlots, blocksKey } from "./descriptor.js";
import { deviceShape, layoutSpec } from "./layouts.js";

export const READER_MINOR = 2;
export const EXTENSION_NAME = /^[a-z0-9][a-z0-9_-]*(\.[a-z0-9][a-z0-9_-]*)+$/;
/** Extensions this reader implements (none in 1.1). */
export const KNOWN_EXTENSIONS = new Set();

export const CONTAINER_DTYPES = /** @type {Record<number, Set<string>>} */ ({
  8: new Set(["U8", "I8", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"]),
  16: new Set(["U16", "I16", "F16", "BF16"]),
  32: new Set(["U32", "I32", "F32"]),
});
export const PARAM_DTYPES = new Set(["F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "I8", "U8", "I16", "U16", "I32", "U32"]);
export const INDEX_DTYPES = new Set(["I8", "U8", "I16", "U16", "I32", "U32", "I64"]);
export const TABLE_DTYPES = new Set(["F32", "F16", "BF16"]);

/** @typedef {import("./descriptor.js").Descriptor} Descriptor */
/** @typedef {import("./descriptor.js").Param} Param */
/** @typedef {import("./errors.js").QFormatError} QFormatError */
/** @typedef {(name: string) => {dtype: string, shape: bigint[]} | null} Info */

/**
 * Problems of one extensions list (SPEC.md §3.5).
 * @param {{name: string, must_understand: boolean}[]} exts @param {boolean} newer @param {string} scope @param {string|null} tensor
 */
export function extensionProblems(exts, newer, scope, tensor) {
  const out = [];
  const seen = new Set();
  for (const e of exts) {
    if (!EXTENSION_NAME.test(e.name)) {
      out.push(error("EXTENSION_NAME_INVALID", `expected a dotted lower-case namespaced name, found ${JSON.stringify(e.name)}`, tensor, "extensions"));
      continue;
    }
    if (seen.has(e.name)) {
      out.push(error("EXTENSION_NAME_INVALID", `extension ${JSON.stringify(e.name)} appears twice in one list`, tensor, "extensions"));
      continue;
    }
    seen.add(e.name);
    if (KNOWN_EXTENSIONS.has(e.name)) continue;
    if (e.name.startsWith("qformat.") && !newer) {
      out.push(error("EXTENSION_NAME_INVALID", `${JSON.stringify(e.name)} is in the reserved 'qformat.' namespace`, tensor, "extensions"));
    } else if (e.must_understand) {
      out.push(error("EXTENSION_UNKNOWN", `${scope} extension ${JSON.stringify(e.name)} is must_understand and this reader does not implement it`, tensor, "extensions"));
    }
  }
  return out;
}

/** @param {string} v */
const minorOf = (v) => Number(v.split(".")[1]);

/** @param {any} v */
const isJsonInt = (v) => (typeof v === "number" && Number.isInteger(v)) || typeof v === "bigint";

/**
 * Layout problems (SPEC.md §11.1), everything except the codes component's shape.
 * @param {Descriptor} desc @param {number} minor @param {number} depth @param {string|null} tensor
 */
export function layoutProblems(desc, minor, depth, tensor) {
  /** @type {QFormatError[]} */
  const out = [];
  const add = (/** @type {string} */ code, /** @type {string} */ field, /** @type {string} */ msg) => out.push(error(code, msg, tensor, field));
  const name = desc.layout;
  const prm = desc.layout_parameters;
  const info = Object.hasOwn(LAYOUTS, name) ? LAYOUTS[/** @type {keyof typeof LAYOUTS} */ (name)] : null;
  if (info === null || minorOf(info.since) > minor) {
    add("LAYOUT_UNKNOWN", "layout.name", `layout ${JSON.stringify(name)} is not defined in version 1.${minor}`);
    return out;
  }
  if (info.status === "forbidden") {
    add("LAYOUT_FORBIDDEN", "layout.name", `layout ${JSON.stringify(name)} is not portable; store the canonical codes instead`);
    return out;
  }
  /** @type {Record<string, number[]>} */
  const allowed = info.parameters;
  const bad = minor > READER_MINOR ? "FEATURE_UNSUPPORTED" : "LAYOUT_INVALID";
  const allowedNames = Object.keys(allowed);
  if (!allowedNames.length && prm.size) {
    add(bad, "layout.parameters", `layout ${JSON.stringify(name)} takes no parameters`);
    return out;
  }
  // 1.2.1: a missing required argument (LAYOUT_INVALID in every minor) before unknown members
  // and values outside the list (FEATURE_UNSUPPORTED in a newer minor)
  for (const p of Object.keys(allowed)) {
    if (!prm.has(p)) add("LAYOUT_INVALID", `layout.parameters.${p}`, `layout ${JSON.stringify(name)} requires parameter ${JSON.stringify(p)}`);
  }
  for (const p of [...prm.keys()].filter((k) => !allowedNames.includes(k)).sort()) add(bad, `layout.parameters.${p}`, `unknown layout parameter ${JSON.stringify(p)}`);
  for (const [p, values] of Object.entries(allowed)) {
    if (!prm.has(p)) continue;
    const v = prm.get(p);
    if (!isJsonInt(v) || !values.some((x) => BigInt(x) === BigInt(v))) add(bad, `layout.parameters.${p}`, `expected one of ${JSON.stringify(values)}`);
  }
  if (out.length || name === "canonical") return out;
  if (depth > 0) {
    add("LAYOUT_MISMATCH", "layout.name", `device layout ${JSON.stringify(name)} is allowed only in a top-level descriptor`);
    return out;
  }
  if (desc.shape.length !== 2) {
    add("LAYOUT_SHAPE", "shape", `layout ${JSON.stringify(name)} needs a rank-2 logical weight [N, K]`);
    return out;
  }
  const spec = layoutSpec(desc);
  const el = desc.codes.element;
  if (el.type !== "int" || !spec.bits.includes(el.bits) || el.signedness !== "offset_binary" || el.code_offset || el.frac_bits) {
    add("LAYOUT_MISMATCH", "codes.element", `layout ${JSON.stringify(name)} needs an offset_binary int element of ${spec.bits.join(" or ")} bits`);
  }
  const p = desc.codes.packing;
  const orderOk = p.order === null || (p.order.length === 2 && p.order[0] === 0 && p.order[1] === 1);
  if (p.container !== 32 || p.bit_order !== "lsb_first" || p.axis !== 1 || !orderOk || p.slot_order !== null || p.planes_span !== null || p.row_alignment !== 1) {
    add("LAYOUT_MISMATCH", "codes.packing", `layout ${JSON.stringify(name)} needs the canonical packing {container 32, lsb_first, axis 1}`);
  }
  const [n, k] = desc.shape;
  if (spec.shapeProblem(n, k)) add("LAYOUT_SHAPE", "shape", `layout ${JSON.stringify(name)}: ${spec.shapeProblem(n, k)}, found [N, K] = [${n}, ${k}]`);
  // parameters
  if (desc.zero !== null) add("LAYOUT_MISMATCH", "zero", `layout ${JSON.stringify(name)} has no zero point`);
  if (!spec.bias && desc.bias !== null) add("LAYOUT_MISMATCH", "bias", `layout ${JSON.stringify(name)} has no bias`);
  const s = desc.scale;
  if (s === null) {
    add("LAYOUT_MISMATCH", "scale", `layout ${JSON.stringify(name)} needs a 'scale' parameter`);
    return out;
  }
  /** @type {[Param|null, string, string][]} */
  const roles = [[desc.scale, "scale", "multiply"]];
  if (spec.bias) roles.push([desc.bias, "bias", "add"]);
  for (const [q, role, op] of roles) {
    if (q === null) continue;
    const b = q.blocks;
    if (q.tensor === null || q.op !== op || b.type !== "grid" || b.index !== null || b.size.length !== 2 || b.size[0] !== 1) {
      add("LAYOUT_MISMATCH", role, `layout ${JSON.stringify(name)} needs '${role}' as a plain tensor with op ${op} and grid blocks [1, G]`);
      continue;
    }
    if (spec.paramOrder !== null && !(q.order !== null && q.order.length === 2 && q.order[0] === spec.paramOrder[0] && q.order[1] === spec.paramOrder[1])) {
      add("LAYOUT_MISMATCH", `${role}.order`, `layout ${JSON.stringify(name)} stores the scale as [K/G, N]: 'order' must be [1, 0]`);
    }
    const g = b.size[1];
    const ok = spec.perChannel && (g === null || g >= k);
    if (!ok && !(g !== null && spec.groupSizes.includes(g) && k % g === 0)) add("LAYOUT_GROUP_SIZE", `${role}.blocks.size`, `group size ${g} is not allowed by layout ${JSON.stringify(name)}`);
  }
  if (spec.bias && desc.bias !== null && blocksKey(desc.bias.blocks) !== blocksKey(s.blocks)) {
    add("LAYOUT_MISMATCH", "bias.blocks", `layout ${JSON.stringify(name)} stores scale and bias as pairs: their blocks must be equal`);
  }
  return out;
}

/** @param {bigint[]} a @param {bigint[]} b */
const sameShape = (a, b) => a.length === b.length && a.every((v, i) => v === b[i]);
/** @param {bigint[]} s */
const squeeze = (s) => s.filter((v) => v !== 1n);

/**
 * Every semantic problem of `desc` against the components (their headers), in check order.
 * @param {string} name @param {Descriptor} desc @param {Info} info @param {number} depth @param {boolean} newer @param {number} minor
 * @returns {QFormatError[]}
 */
export function validateDescriptor(name, desc, info, depth, newer, minor) {
  /** @type {QFormatError[]} */
  const probs = [];
  const add = (/** @type {string} */ code, /** @type {string} */ field, /** @type {string} */ msg) => probs.push(error(code, msg, name, field));
  const rank = desc.shape.length;
  if (rank > LIMITS.max_rank) {
    add("SHAPE_INVALID", "shape", `rank must be at most ${LIMITS.max_rank}`);
    return probs;
  }
  if (prod(desc.shape) >= 1n << 64n) {
    add("SHAPE_INVALID", "shape", "the element count reaches 2^64");
    return probs;
  }
  // §5.2 (A10 of 1.2.1): an empty logical shape must be representable as §2.2 says, with the
  // logical dtype's size: right after the size check (nested descriptors too, as the reference)
  if (desc.shape.includes(0)) {
    let span = desc.dtype === "float32" ? 4n : 2n;
    for (const s of desc.shape) span *= BigInt(s || 1);
    if (span >= 1n << 63n) {
      add("SHAPE_UNREPRESENTABLE", "shape", `a logical ${desc.dtype} tensor of shape [${desc.shape}] is empty but too large for an array: ${span} bytes, expected below 2^63`);
      return probs;
    }
  }
  for (const p of extensionProblems(desc.extensions, newer, "tensor", name)) probs.push(p);
  for (const p of layoutProblems(desc, minor, depth, name)) probs.push(p);
  if (probs.length) return probs;
  // element
  const el = desc.codes.element;
  if (el.type === "int" && el.code_offset >= 2 ** el.bits) add("ELEMENT_INVALID", "codes.element", `code_offset must be below 2^bits = ${2 ** el.bits}`);
  if (el.type === "codebook") {
    if (el.table != null) {
      const len = CODEBOOKS[/** @type {keyof typeof CODEBOOKS} */ (el.table)].values_f32.length;
      if (len > 2 ** el.bits) add("CODEBOOK_INVALID", "codes.element.table", `table ${el.table} has ${len} entries, more than 2^${el.bits}`);
    } else {
      const t = info(el.table_tensor ?? "");
      if (t === null) add("COMPONENT_MISSING", "codes.element.table_tensor", `no tensor named ${JSON.stringify(el.table_tensor)} in the file`);
      else if (!TABLE_DTYPES.has(t.dtype)) add("CODEBOOK_INVALID", "codes.element.table_tensor", `table dtype must be F32, F16 or BF16, found ${t.dtype}`);
      else if (t.shape.length !== 1 || !(t.shape[0] >= 1n && t.shape[0] <= 2n ** BigInt(el.bits))) add("CODEBOOK_INVALID", "codes.element.table_tensor", `table must be 1-D with 1..${2 ** el.bits} entries`);
    }
  }
  // packing
  const p = desc.codes.packing;
  const bits = el.bits;
  if (bits > p.container) add("PACKING_INVALID", "codes.packing", `container of ${p.container} bits is narrower than ${bits}-bit codes`);
  else {
    const n = Math.floor(p.container / bits);
    if (!usesSlots(p, bits)) {
      if (p.slot_order !== null) add("PACKING_INVALID", "codes.packing", "slot_order needs whole slots (set straddle false)");
      if (p.planes_span !== null) add("PACKING_INVALID", "codes.packing", "planes need whole slots (set straddle false)");
    }
    if (p.slot_order !== null && !isPermutation(p.slot_order, n)) add("PACKING_INVALID", "codes.packing", `slot_order must be a permutation of 0..${n - 1}`);
  }
  if (!isPermutation(p.order, rank)) add("PACKING_INVALID", "codes.packing.order", `expected a permutation of 0..${rank - 1}`);
  if (p.axis !== null) {
    if (rank === 0) add("PACKING_INVALID", "codes.packing.axis", "a rank-0 tensor must be packed with axis null");
    else if (p.axis >= rank) add("PACKING_INVALID", "codes.packing.axis", `expected a storage axis below ${rank}`);
  }
  if (!probs.length) {
    const t = info(desc.codes.tensor);
    if (t === null) add("COMPONENT_MISSING", "codes.tensor", `no tensor named ${JSON.stringify(desc.codes.tensor)} in the file`);
    else {
      if (!CONTAINER_DTYPES[p.container].has(t.dtype)) add("COMPONENT_DTYPE", "codes.tensor", `a ${p.container}-bit container cannot be stored as ${t.dtype}`);
      const geo = codesGeometry(desc);
      if (desc.layout !== "canonical") {
        const want = deviceShape(desc).map(BigInt);
        if (!sameShape(t.shape, want)) add("COMPONENT_SHAPE", "codes.tensor", `layout ${desc.layout} stores the codes as [${want}], found [${t.shape}]`);
      } else if (p.axis === null) {
        if (prod(t.shape) !== geo.words) add("COMPONENT_SHAPE", "codes.tensor", `expected ${geo.words} containers in all, found shape [${t.shape}]`);
      } else {
        const want = [...geo.stored];
        want[p.axis] = geo.words;
        if (!sameShape(t.shape, want)) add("COMPONENT_SHAPE", "codes.tensor", `expected shape [${want}], found [${t.shape}]`);
      }
    }
  }
  for (const prm of params(desc)) for (const p of paramProblems(name, desc, prm, info, depth, newer, minor)) probs.push(p);
  return probs;
}

/**
 * @param {string} name @param {Descriptor} desc @param {Param} prm @param {Info} info
 * @param {number} depth @param {boolean} newer @param {number} minor @returns {QFormatError[]}
 */
function paramProblems(name, desc, prm, info, depth, newer, minor) {
  /** @type {QFormatError[]} */
  const probs = [];
  const add = (/** @type {string} */ code, /** @type {string} */ field, /** @type {string} */ msg) => probs.push(error(code, msg, name, field));
  const role = prm.role;
  const b = prm.blocks;
  const rank = desc.shape.length;
  if (b.type === "grid") {
    if (b.size.length !== rank) {
      add("BLOCKS_INVALID", `${role}.blocks.size`, `expected ${rank} entries, found ${b.size.length}`);
      return probs;
    }
    const gi = b.index;
    if (gi !== null) {
      if (gi.axis >= rank) {
        add("BLOCKS_INVALID", `${role}.blocks.index.axis`, `expected an axis below ${rank}`);
        return probs;
      }
      if (b.size[gi.axis] !== null) add("BLOCKS_INVALID", `${role}.blocks.size`, `the indexed axis ${gi.axis} must have size null`);
      const t = info(gi.tensor);
      if (t === null) add("COMPONENT_MISSING", `${role}.blocks.index.tensor`, `no tensor named ${JSON.stringify(gi.tensor)} in the file`);
      else if (!INDEX_DTYPES.has(t.dtype)) add("COMPONENT_DTYPE", `${role}.blocks.index.tensor`, `a group index needs an integer dtype, found ${t.dtype}`);
      else if (!sameShape(t.shape, [BigInt(desc.shape[gi.axis])])) add("COMPONENT_SHAPE", `${role}.blocks.index.tensor`, `expected shape [${desc.shape[gi.axis]}], found [${t.shape}]`);
    }
  }
  if (probs.length) return probs;
  if (prm.tensor !== null) {
    const grid = gridShape(b, desc.shape);
    if (!isPermutation(prm.order, grid.length)) {
      add("BLOCKS_INVALID", `${role}.order`, `expected a permutation of 0..${grid.length - 1}`);
      return probs;
    }
    const t = info(prm.tensor);
    if (t === null) {
      add("COMPONENT_MISSING", `${role}.tensor`, `no tensor named ${JSON.stringify(prm.tensor)} in the file`);
      return probs;
    }
    if (!PARAM_DTYPES.has(t.dtype)) add("COMPONENT_DTYPE", `${role}.tensor`, `a parameter cannot be stored as ${t.dtype}`);
    const stored = storedGridShape(prm, desc.shape);
    if (!sameShape(squeeze(t.shape), squeeze(stored)) || prod(t.shape) !== prod(stored)) {
      add("COMPONENT_SHAPE", `${role}.tensor`, `expected the parameter grid [${stored}] (size-1 axes may differ), found [${t.shape}]`);
    }
    return probs;
  }
  const enc = /** @type {import("./descriptor.js").Descriptor} */ (prm.encoded);
  if (depth + 1 > LIMITS.max_nesting_depth) return [error("DEPTH_EXCEEDED", `nesting depth ${depth + 1} exceeds the limit`, name, `${role}.encoded`)];
  const grid = gridShape(b, desc.shape);
  if (!sameShape(enc.shape.map(BigInt), grid)) return [error("SHAPE_INVALID", `an encoded parameter's shape must equal its grid [${grid}]`, name, `${role}.encoded.shape`)];
  return validateDescriptor(name, enc, info, depth + 1, newer, minor).map((e) => {
    e.field = e.field ? `${role}.encoded.${e.field}` : `${role}.encoded`;
    return e;
  });
}
