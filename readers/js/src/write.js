// Writing a plain safetensors file (the conformance protocol's OUTPUT; SPEC.md §2.1).

const LOGICAL_TO_STORAGE = /** @type {Record<string, string>} */ ({ float32: "F32", float16: "F16", bfloat16: "BF16" });

/**
 * @typedef {object} OutTensor
 * @property {string} dtype  a safetensors dtype, or a logical dtype (float32, float16, bfloat16)
 * @property {(number|bigint)[]} shape
 * @property {ArrayBufferView} data  the little-endian element bytes (typed arrays are viewed as bytes)
 */

/**
 * Encode tensors (name -> tensor, in the given order) as one safetensors file.
 * @param {Iterable<[string, OutTensor]>} tensors @param {Record<string, string>|null} [metadata]
 * @returns {Uint8Array}
 */
export function encodeSafetensors(tensors, metadata = null) {
  const parts = [];
  const bodies = [];
  let off = 0;
  if (metadata && Object.keys(metadata).length) parts.push(`"__metadata__":${JSON.stringify(metadata)}`);
  for (const [name, t] of tensors) {
    const bytes = new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
    const dt = LOGICAL_TO_STORAGE[t.dtype] ?? t.dtype;
    parts.push(`${JSON.stringify(name)}:{"dtype":${JSON.stringify(dt)},"shape":[${t.shape.map(String).join(",")}],"data_offsets":[${off},${off + bytes.length}]}`);
    bodies.push(bytes);
    off += bytes.length;
  }
  let header = new TextEncoder().encode(`{${parts.join(",")}}`);
  const pad = (8 - (header.length % 8)) % 8;
  const out = new Uint8Array(8 + header.length + pad + off);
  new DataView(out.buffer).setBigUint64(0, BigInt(header.length + pad), true);
  out.set(header, 8);
  out.fill(0x20, 8 + header.length, 8 + header.length + pad);
  let at = 8 + header.length + pad;
  for (const b of bodies) {
    out.set(b, at);
    at += b.length;
  }
  return out;
}
