// Descriptors (SPEC.md §5-§9) as plain objects built from structurally valid JSON (Maps, SPEC.md §5.5), and their
// geometry: storage order, rows, words per row, parameter grids.  Sizes that come from a file
// are BigInt until they have been checked against the bytes that hold them.

import { FLOAT_FORMATS } from "./tables.js";

/**
 * @typedef {{type: "int"|"float"|"codebook", bits: number, signedness?: string, code_offset: number,
 *            frac_bits: number, format?: string, table?: string|null, table_tensor?: string|null}} Element
 * @typedef {{container: number, bit_order: string, axis: number|null, order: number[]|null, straddle: boolean,
 *            slot_order: number[]|null, planes_span: number|null, row_alignment: number}} Packing
 * @typedef {{axis: number, tensor: string, count: number}} GroupIndex
 * @typedef {{type: "grid", size: (number|null)[], index: GroupIndex|null} | {type: "flat", size: number, index: null}} Blocks
 * @typedef {{role: string, blocks: Blocks, op: string|null, tensor: string|null, order: number[]|null, encoded: Descriptor|null}} Param
 * @typedef {{name: string, must_understand: boolean}} Extension
 * @typedef {{shape: number[], dtype: string, codes: {tensor: string, element: Element, packing: Packing},
 *            zero: Param|null, scale: Param|null, bias: Param|null, layout: string, layout_parameters: Map<string, any>,
 *            allow_nonfinite_params: boolean, scheme: string|null, extensions: Extension[]}} Descriptor
 */

/** @param {any} v */
const int = (v) => Number(v);

/** @param {Map<string, any>} d @returns {Element} */
function elementFrom(d) {
  const t = d.get("type");
  if (t === "int") {
    return { type: "int", bits: int(d.get("bits")), signedness: d.get("signedness"), code_offset: int(d.get("code_offset") ?? 0), frac_bits: int(d.get("frac_bits") ?? 0) };
  }
  if (t === "float") {
    const f = d.get("format");
    return { type: "float", bits: FLOAT_FORMATS[f].bits, format: f, code_offset: 0, frac_bits: 0 };
  }
  return { type: "codebook", bits: int(d.get("bits")), table: d.get("table") ?? null, table_tensor: d.get("table_tensor") ?? null, code_offset: 0, frac_bits: 0 };
}

/** @param {Map<string, any>} d @returns {Packing} */
function packingFrom(d) {
  const order = d.get("order");
  const so = d.get("slot_order");
  const planes = d.get("planes");
  return {
    container: int(d.get("container")),
    bit_order: d.get("bit_order"),
    axis: d.get("axis") === null ? null : int(d.get("axis")),
    order: order === undefined ? null : order.map(int),
    straddle: d.get("straddle") ?? true,
    slot_order: so === undefined ? null : so.map(int),
    planes_span: planes === undefined ? null : int(planes.get("span")),
    row_alignment: int(d.get("row_alignment") ?? 1),
  };
}

/** @param {Map<string, any>} d @returns {Blocks} */
function blocksFrom(d) {
  if (d.get("type") === "flat") return { type: "flat", size: int(d.get("size")), index: null };
  const idx = d.get("index");
  return {
    type: "grid",
    size: d.get("size").map((/** @type {any} */ s) => (s === null ? null : int(s))),
    index: idx === undefined ? null : { axis: int(idx.get("axis")), tensor: idx.get("tensor"), count: int(idx.get("count")) },
  };
}

/** @param {string} role @param {Map<string, any>} d @returns {Param} */
function paramFrom(role, d) {
  const enc = d.get("encoded");
  const order = d.get("order");
  return {
    role,
    blocks: blocksFrom(d.get("blocks")),
    op: d.get("op") ?? null,
    tensor: d.get("tensor") ?? null,
    order: order === undefined ? null : order.map(int),
    encoded: enc === undefined ? null : descriptorFrom(enc),
  };
}

/**
 * A structurally valid raw descriptor (Map) -> Descriptor.
 * @param {Map<string, any>} d @returns {Descriptor}
 */
export function descriptorFrom(d) {
  const codes = d.get("codes");
  const lay = d.get("layout");
  return {
    shape: d.get("shape").map(int),
    dtype: d.get("dtype"),
    codes: { tensor: codes.get("tensor"), element: elementFrom(codes.get("element")), packing: packingFrom(codes.get("packing")) },
    zero: d.has("zero") ? paramFrom("zero", d.get("zero")) : null,
    scale: d.has("scale") ? paramFrom("scale", d.get("scale")) : null,
    bias: d.has("bias") ? paramFrom("bias", d.get("bias")) : null,
    layout: lay === undefined ? "canonical" : lay.get("name"),
    layout_parameters: lay === undefined ? new Map() : (lay.get("parameters") ?? new Map()),
    allow_nonfinite_params: d.get("allow_nonfinite_params") ?? false,
    scheme: d.get("scheme") ?? null,
    extensions: (d.get("extensions") ?? []).map((/** @type {Map<string, any>} */ e) => ({ name: e.get("name"), must_understand: e.get("must_understand") ?? true })),
  };
}

/** The parameters present, in decode order. @param {Descriptor} d @returns {Param[]} */
export function params(d) {
  return /** @type {Param[]} */ ([d.zero, d.scale, d.bias].filter((p) => p !== null));
}

/**
 * Every (role path, component name) a descriptor and its nested ones reference (SPEC.md §4.2).
 * @param {Descriptor} d @returns {[string, string][]}
 */
export function references(d) {
  /** @type {[string, string][]} */
  const out = [["codes.tensor", d.codes.tensor]];
  if (d.codes.element.table_tensor != null) out.push(["codes.element.table_tensor", d.codes.element.table_tensor]);
  for (const p of params(d)) {
    if (p.blocks.index !== null) out.push([`${p.role}.blocks.index.tensor`, p.blocks.index.tensor]);
    if (p.tensor !== null) out.push([`${p.role}.tensor`, p.tensor]);
    else if (p.encoded !== null) for (const [path, name] of references(p.encoded)) out.push([`${p.role}.encoded.${path}`, name]);
  }
  return out;
}

/** Nesting depth of a raw descriptor (bounded walk). @param {Map<string, any>} d @returns {number} */
export function depthOf(d) {
  let best = 0;
  for (const role of ["zero", "scale", "bias"]) {
    const p = d.get(role);
    if (p instanceof Map && p.get("encoded") instanceof Map) {
      best = Math.max(best, 1 + depthOf(p.get("encoded")));
      if (best > 64) return best;
    }
  }
  return best;
}

// -- geometry -------------------------------------------------------------------------------
/** @param {bigint} a @param {bigint} b */
export const ceilDiv = (a, b) => (a + b - 1n) / b;

/** @param {(number|bigint)[]} s */
export const prod = (s) => s.reduce((/** @type {bigint} */ a, b) => a * BigInt(b), 1n);

/** @param {Packing} p @param {number} bits */
export const usesSlots = (p, bits) => p.container % bits === 0 || !p.straddle;

/**
 * Containers per row of `length` codes, alignment included (SPEC.md §7.6-§7.9).
 * @param {Packing} p @param {bigint} length @param {number} bits @param {boolean} [aligned]
 */
export function wordsPerRow(p, length, bits, aligned = true) {
  let w;
  if (usesSlots(p, bits)) {
    const n = BigInt(Math.floor(p.container / bits));
    if (p.planes_span === null) w = ceilDiv(length, n);
    else {
      const t = BigInt(p.planes_span);
      const full = length / t;
      const rest = length % t;
      w = full * ceilDiv(t, n) + (rest ? ceilDiv(rest, n) : 0n);
    }
  } else w = ceilDiv(length * BigInt(bits), BigInt(p.container));
  if (!aligned) return w;
  const a = BigInt(p.row_alignment);
  return ceilDiv(w, a) * a;
}

/**
 * The stored shape (logical shape in storage order), the row length and the words per row.
 * @param {Descriptor} d
 */
export function codesGeometry(d) {
  const p = d.codes.packing;
  const order = p.order && p.order.length ? p.order : d.shape.map((_, i) => i);
  const stored = order.map((a) => BigInt(d.shape[a]));
  const length = p.axis === null ? prod(d.shape) : stored[p.axis];
  return { stored, length, words: wordsPerRow(p, length, d.codes.element.bits) };
}

/** The parameter grid shape G (SPEC.md §8). @param {Blocks} b @param {number[]} shape @returns {bigint[]} */
export function gridShape(b, shape) {
  if (b.type === "flat") return [ceilDiv(prod(shape), BigInt(b.size))];
  return shape.map((n, a) => {
    if (b.index !== null && a === b.index.axis) return BigInt(b.index.count);
    const s = b.size[a];
    return s === null ? 1n : ceilDiv(BigInt(n), BigInt(s));
  });
}

/** The grid in stored axis order. @param {Param} prm @param {number[]} shape */
export function storedGridShape(prm, shape) {
  const g = gridShape(prm.blocks, shape);
  return prm.order && prm.order.length ? prm.order.map((a) => g[a]) : g;
}

/** @param {number[]|null} order @param {number} rank */
export function isPermutation(order, rank) {
  if (order === null) return true;
  if (order.length !== rank) return false;
  const s = [...order].sort((a, b) => a - b);
  return s.every((v, i) => v === i);
}

/** Blocks as a canonical JSON text, to compare two blocks objects. @param {Blocks} b */
export const blocksKey = (b) => JSON.stringify(b);
