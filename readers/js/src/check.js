// Payload checks of a checker (SPEC.md §12.4) for a descriptor that passed §12.2-§12.3, as the
// reference checker reports them: per descriptor (nested ones too) PADDING_NONZERO and
// CODE_OUT_OF_RANGE over the whole codes component, then per parameter GROUP_INDEX_RANGE and the
// value checks (PARAM_INT_RANGE, PARAM_NONFINITE, PARAM_DIVISOR_ZERO).

import { LIMITS } from "./tables.js";
import { error } from "./errors.js";
import { params } from "./descriptor.js";
import { decode, elementTable, readCodes, widen } from "./decode.js";
import { f16ToF32, bf16ToF32 } from "./floats.js";
import { scaleToCanonical } from "./layouts.js";

const INT_DTYPES = new Set(["I8", "U8", "I16", "U16", "I32", "U32"]);

/** @typedef {import("./errors.js").QFormatError} QFormatError */

/**
 * @param {string} name @param {import("./descriptor.js").Descriptor} desc @param {import("./decode.js").Store} store
 * @param {string} [prefix] @param {number} [depth] @returns {QFormatError[]}
 */
export function checkPayload(name, desc, store, prefix = "", depth = 0) {
  /** @type {QFormatError[]} */
  const probs = [];
  const region = desc.shape.map((n) => /** @type {[number, number]} */ ([0, n]));
  const bytes = store.bytes(desc.codes.tensor);
  const c = desc.codes.packing.container;
  let codes;
  if (desc.layout === "canonical") {
    const used = new Uint8Array(bytes.length);
    codes = readCodes(desc, store, region, (word, shift, nbits) => {
      for (let t = shift; t < shift + nbits; t++) used[(word * c) / 8 + (t >> 3)] |= 1 << (t & 7);
    });
    if (bytes.some((v, i) => (v & ~used[i]) !== 0)) probs.push(error("PADDING_NONZERO", "padding bits of the codes component are set", name, `${prefix}codes.tensor`));
  } else codes = readCodes(desc, store, region); // device layouts have no padding (§11.1)
  const { table, valid } = elementTable(desc, store);
  if (valid < table.length && codes.some((u) => u >= valid)) probs.push(error("CODE_OUT_OF_RANGE", `a code is past the end of a ${valid}-entry codebook`, name, `${prefix}codes.tensor`));
  for (const prm of params(desc)) {
    const f = `${prefix}${prm.role}`;
    const gi = prm.blocks.index;
    if (gi !== null) {
      const e = store.entry(gi.tensor);
      const b = store.bytes(gi.tensor);
      const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
      const w = { I8: 1, U8: 1, I16: 2, U16: 2, I32: 4, U32: 4, I64: 8 }[/** @type {string} */ (e.dtype)] ?? 1;
      for (let k = 0; k < b.length / w; k++) {
        const v = e.dtype === "I64" ? dv.getBigInt64(8 * k, true) : BigInt(readInt(dv, e.dtype, k));
        if (v < 0n || v >= BigInt(gi.count)) {
          probs.push(error("GROUP_INDEX_RANGE", `group index ${k} is outside 0..${gi.count - 1}`, name, `${f}.blocks.index.tensor`));
          break;
        }
      }
    }
    if (prm.tensor !== null) {
      const e = store.entry(prm.tensor);
      if (INT_DTYPES.has(e.dtype)) {
        const b = store.bytes(prm.tensor);
        const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
        const w = { I8: 1, U8: 1, I16: 2, U16: 2, I32: 4, U32: 4 }[/** @type {string} */ (e.dtype)] ?? 1;
        const vals = Array.from({ length: b.length / w }, (_, k) => readInt(dv, e.dtype, k));
        if (vals.some((v) => Math.abs(v) > LIMITS.max_int_param_magnitude)) probs.push(error("PARAM_INT_RANGE", "an integer parameter exceeds max_int_param_magnitude", name, `${f}.tensor`));
        if (prm.op === "divide" && vals.some((v) => v === 0)) probs.push(error("PARAM_DIVISOR_ZERO", "a divisor scale value is zero", name, `${f}.tensor`));
      } else {
        let vals = widen(store, prm.tensor);
        if (depth === 0 && prm === desc.scale) vals = scaleToCanonical(desc, vals);
        for (const p of valueProblems(name, desc, prm, vals, `${f}.tensor`)) probs.push(p);
      }
    } else if (prm.encoded !== null) {
      const sub = checkPayload(name, prm.encoded, store, `${f}.encoded.`, depth + 1);
      for (const p of sub) probs.push(p);
      if (!sub.length) {
        let vals;
        try {
          const out = decode(prm.encoded, store, null, name);
          const dt = prm.encoded.dtype;
          vals = dt === "float32" ? out : Float32Array.from(out, (h) => (dt === "float16" ? f16ToF32(h) : bf16ToF32(h)));
        } catch (e) {
          probs.push(/** @type {QFormatError} */ (e));
          continue;
        }
        for (const p of valueProblems(name, desc, prm, /** @type {Float32Array} */ (vals), `${f}.encoded`)) probs.push(p);
      }
    }
  }
  return probs;
}

/** @param {DataView} dv @param {string} dtype @param {number} k */
function readInt(dv, dtype, k) {
  switch (dtype) {
    case "I8": return dv.getInt8(k);
    case "U8": return dv.getUint8(k);
    case "I16": return dv.getInt16(2 * k, true);
    case "U16": return dv.getUint16(2 * k, true);
    case "I32": return dv.getInt32(4 * k, true);
    default: return dv.getUint32(4 * k, true);
  }
}

/**
 * @param {string} name @param {import("./descriptor.js").Descriptor} desc @param {import("./descriptor.js").Param} prm
 * @param {Float32Array} vals @param {string} field
 */
function valueProblems(name, desc, prm, vals, field) {
  const out = [];
  if (!desc.allow_nonfinite_params && vals.some((v) => !Number.isFinite(v))) out.push(error("PARAM_NONFINITE", `a ${prm.role} value is NaN or infinite`, name, field));
  if (prm.op === "divide" && vals.some((v) => v === 0)) out.push(error("PARAM_DIVISOR_ZERO", "a divisor scale value is zero", name, field));
  return out;
}
