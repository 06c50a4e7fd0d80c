// Building small safetensors files for the unit tests.
import { encodeSafetensors } from "../src/index.js";

/** A file from raw header JSON text and a data buffer. */
export function rawFile(headerText, data = new Uint8Array(0), pad = true) {
  let h = new TextEncoder().encode(headerText);
  if (pad && h.length % 8) {
    const p = new Uint8Array(h.length + ((8 - (h.length % 8)) % 8)).fill(0x20);
    p.set(h);
    h = p;
  }
  const out = new Uint8Array(8 + h.length + data.length);
  new DataView(out.buffer).setBigUint64(0, BigInt(h.length), true);
  out.set(h, 8);
  out.set(data, 8 + h.length);
  return out;
}

/** A qformat file: tensors name -> {dtype, shape, data (typed array)}, descriptors name -> descriptor. */
export function qfile(tensors, descriptors, version = "1.0") {
  const meta = descriptors ? { qformat: JSON.stringify({ version, tensors: descriptors }) } : null;
  return encodeSafetensors(Object.entries(tensors), meta);
}

export const u8 = (...xs) => Uint8Array.from(xs);
export const f32bits = (x) => new Uint32Array(Float32Array.of(x).buffer)[0];
