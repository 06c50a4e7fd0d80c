// The fast decode path (src/fast.js) against the general path of src/decode.js: random
// descriptors of the packings and blocks the fast path takes (and some it declines), whole
// tensors and random boxes, compared bit for bit.
import { test } from "node:test";
import assert from "node:assert/strict";
import { openFile } from "../src/index.js";
import { setFastPath } from "../src/fast.js";
import { qfile } from "./helpers.mjs";

let seed = 12345;
const rnd = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32);
const ri = (n) => Math.floor(rnd() * n);
const pick = (xs) => xs[ri(xs.length)];

function randomCase() {
  const rank = 1 + ri(3);
  const shape = Array.from({ length: rank }, (_, a) => (a === rank - 1 ? (rnd() < 0.4 ? pick([8, 16, 32, 64, 128]) : 1 + ri(70)) : 1 + ri(6)));
  const elements = [
    { type: "int", bits: 4, signedness: "twos_complement" },
    { type: "int", bits: 8, signedness: "unsigned" },
    { type: "int", bits: 2, signedness: "offset_binary" },
    { type: "int", bits: 1, signedness: "unsigned" },
    { type: "int", bits: 3, signedness: "unsigned" },
    { type: "float", format: "e2m1fn" },
    { type: "float", format: "e4m3fn" },
    { type: "codebook", bits: 4, table: "nf4" },
  ];
  const element = pick(elements);
  const bits = element.bits ?? (element.format === "e2m1fn" ? 4 : 8);
  const container = pick([8, 8, 16, 32]);
  const packing = { container, bit_order: pick(["lsb_first", "lsb_first", "msb_first"]), axis: rnd() < 0.8 ? rank - 1 : null };
  const n = shape.reduce((a, b) => a * b, 1);
  const C = shape[rank - 1];
  const words = packing.axis === null ? [Math.ceil((n * bits) / container)] : [...shape.slice(0, -1), Math.ceil((C * bits) / container)];
  const nbytes = (words.reduce((a, b) => a * b, 1) * container) / 8;
  const codes = new Uint8Array(nbytes).map(() => ri(256));
  const cdt = { 8: "U8", 16: "U16", 32: "U32" }[container];
  const tensors = { c: { dtype: cdt, shape: words, data: codes } };
  const desc = { shape, dtype: "float32", codes: { tensor: "c", element, packing } };
  const grid = () => {
    if (rnd() < 0.3) {
      const size = 1 + ri(40);
      return { blocks: { type: "flat", size }, gshape: [Math.ceil(n / size)] };
    }
    const size = shape.map((d, a) => (rnd() < 0.2 ? null : a === rank - 1 ? pick([1, 2, 3, 8, 16, 32, 64]) : 1 + ri(3)));
    return { blocks: { type: "grid", size }, gshape: shape.map((d, a) => (size[a] === null ? 1 : Math.ceil(d / size[a]))) };
  };
  const count = (s) => s.reduce((a, b) => a * b, 1);
  if (rnd() < 0.3) {
    const g = grid();
    tensors.z = { dtype: "U8", shape: g.gshape, data: new Uint8Array(count(g.gshape)).map(() => ri(16)) };
    desc.zero = { blocks: g.blocks, tensor: "z" };
  }
  if (rnd() < 0.9) {
    const g = grid();
    const v = new Float32Array(count(g.gshape)).map(() => Math.fround((0.01 + rnd()) * 2 ** (ri(20) - 10)));
    tensors.s = { dtype: "F32", shape: g.gshape, data: v };
    desc.scale = { blocks: g.blocks, op: pick(["multiply", "multiply", "divide"]), tensor: "s" };
  }
  if (rnd() < 0.2) {
    const g = grid();
    tensors.b = { dtype: "F32", shape: g.gshape, data: new Float32Array(count(g.gshape)).map(() => rnd() - 0.5) };
    desc.bias = { blocks: g.blocks, op: pick(["add", "subtract"]), tensor: "b" };
  }
  return { tensors, desc, shape };
}

const bits = (t) => Array.from(new Uint32Array(t.data.buffer, t.data.byteOffset, t.data.length));

test("fast path = general path, bit for bit (random descriptors, whole tensors and boxes)", () => {
  let decoded = 0;
  for (let i = 0; i < 400; i++) {
    const { tensors, desc, shape } = randomCase();
    const bytes = qfile(tensors, { w: desc });
    const f = openFile(bytes);
    const boxes = [null, shape.map((d) => { const lo = ri(d); return [lo, lo + 1 + ri(d - lo)]; })];
    for (const box of boxes) {
      let want;
      let wantErr = null;
      setFastPath(false);
      try {
        want = f.read("w", box);
      } catch (e) {
        wantErr = e.code ?? String(e);
      } finally {
        setFastPath(true);
      }
      let got;
      let gotErr = null;
      try {
        got = f.read("w", box);
      } catch (e) {
        gotErr = e.code ?? String(e);
      }
      assert.equal(gotErr, wantErr, JSON.stringify(desc));
      if (wantErr === null) {
        assert.deepEqual(bits(got), bits(want), `${JSON.stringify(desc)} box ${JSON.stringify(box)}`);
        decoded++;
      }
    }
  }
  assert.ok(decoded > 600, `only ${decoded} decodes succeeded`);
});

test("fast path = general path on the word loops (4- and 8-bit codes, group sizes 8 to 128, flat blocks)", () => {
  let n = 0;
  for (const element of [{ type: "int", bits: 4, signedness: "twos_complement" }, { type: "float", format: "e2m1fn" }, { type: "codebook", bits: 4, table: "nf4" }, { type: "float", format: "e4m3fn" }]) {
    const b = element.bits ?? (element.format === "e2m1fn" ? 4 : 8);
    for (const bit_order of ["lsb_first", "msb_first"]) {
      for (const shape of [[3, 64], [2, 3, 128], [5, 256]]) {
        for (const blocks of [8, 16, 32, 64, 128, null, "flat64", "flat32"]) {
          const C = shape[shape.length - 1];
          const rows = shape.slice(0, -1).reduce((a, x) => a * x, 1);
          const codes = new Uint8Array((rows * C * b) / 8).map(() => ri(256));
          const total = rows * C;
          const bl = typeof blocks === "string" ? { type: "flat", size: Number(blocks.slice(4)) } : { type: "grid", size: [...shape.slice(0, -1).map(() => 1), blocks] };
          const gshape = bl.type === "flat" ? [Math.ceil(total / bl.size)] : [...shape.slice(0, -1), blocks === null ? 1 : Math.ceil(C / blocks)];
          const s = new Float32Array(gshape.reduce((a, x) => a * x, 1)).map(() => Math.fround(0.01 + rnd()));
          const desc = { shape, dtype: "float32", codes: { tensor: "c", element, packing: { container: 8, bit_order, axis: shape.length - 1 } }, scale: { blocks: bl, op: "multiply", tensor: "s" } };
          const f = openFile(qfile({ c: { dtype: "U8", shape: [...shape.slice(0, -1), (C * b) / 8], data: codes }, s: { dtype: "F32", shape: gshape, data: s } }, { w: desc }));
          for (const box of [null, shape.map((d, a) => (a === 0 ? [1, d] : [0, d]))]) {
            setFastPath(false);
            let want;
            try {
              want = f.read("w", box);
            } finally {
              setFastPath(true);
            }
            assert.deepEqual(bits(f.read("w", box)), bits(want), `${JSON.stringify(desc)} box ${JSON.stringify(box)}`);
            n++;
          }
        }
      }
    }
  }
  assert.equal(n, 4 * 2 * 3 * 8 * 2);
});
