import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { check, f16ToF32, f32ToBf16Bits, f32ToF16Bits, floatLut, openFile } from "../src/index.js";
import { f32Bits, f32FromBits } from "../src/floats.js";
import { qfile } from "./helpers.mjs";

test("src/tables.js is generated from qformat/tables", () => {
  execFileSync(process.execPath, [fileURLToPath(new URL("../scripts/gen-tables.mjs", import.meta.url)), "--check"]);
});

test("float16: every binary16 value round-trips; ties to even; overflow; subnormals", () => {
  for (let h = 0; h < 0x10000; h++) {
    const x = f16ToF32(h);
    if (Number.isNaN(x)) assert.ok((f32ToF16Bits(x) & 0x7c00) === 0x7c00 && f32ToF16Bits(x) & 0x3ff);
    else assert.equal(f32ToF16Bits(x), h, `0x${h.toString(16)}`);
  }
  // midpoints between consecutive binary16 values round to the even one
  for (const h of [0x0000, 0x0001, 0x03ff, 0x0400, 0x3c00, 0x3c01, 0x7bfe]) {
    const mid = (f16ToF32(h) + f16ToF32(h + 1)) / 2; // exact in binary32
    assert.equal(f32ToF16Bits(Math.fround(mid)), h % 2 ? h + 1 : h);
  }
  assert.equal(f32ToF16Bits(65519.99), 0x7bff);
  assert.equal(f32ToF16Bits(65520), 0x7c00);
  assert.equal(f32ToF16Bits(-1e30), 0xfc00);
  assert.equal(f32ToF16Bits(2 ** -25), 0); // half of the smallest subnormal: ties to even (0)
  assert.equal(f32ToF16Bits(Math.fround(2 ** -25 * 1.0000001)), 1);
  assert.equal(f32ToF16Bits(f32FromBits(1)), 0); // binary32 subnormal
  assert.equal(f32ToF16Bits(-0), 0x8000);
});

test("bfloat16: SPEC.md §10.3's integer rule", () => {
  assert.equal(f32ToBf16Bits(f32FromBits(0x7f7fffff)), 0x7f80); // rounds up to +Inf
  assert.equal(f32ToBf16Bits(f32FromBits(0x3f808000)), 0x3f80); // tie, even stays
  assert.equal(f32ToBf16Bits(f32FromBits(0x3f818000)), 0x3f82); // tie, odd rounds up
  assert.equal(f32ToBf16Bits(f32FromBits(0x00008001)), 0x0001); // subnormal kept
  assert.equal(f32ToBf16Bits(-Infinity), 0xff80);
  assert.ok((f32ToBf16Bits(NaN) & 0x7f80) === 0x7f80 && f32ToBf16Bits(NaN) & 0x7f);
});

test("float element formats decode as SPEC.md §6.3's worked examples", () => {
  assert.equal(floatLut("e2m1fn")[0x3], 1.5);
  assert.equal(floatLut("e2m1fn")[0x9], -0.5);
  assert.ok(Object.is(floatLut("e2m1fn")[0x8], -0));
  assert.equal(floatLut("e4m3fn")[0x7e], 448);
  assert.equal(floatLut("e4m3fn")[0x01], 2 ** -9);
  assert.ok(Number.isNaN(floatLut("e4m3fn")[0xff]) && Number.isNaN(floatLut("e4m3fn")[0x7f]));
  assert.equal(floatLut("e5m2")[0x7c], Infinity);
  assert.equal(floatLut("e8m0fnu")[0x7f], 1);
  assert.equal(f32Bits(floatLut("e8m0fnu")[0x00]), 0x00400000); // 2^-127, a binary32 subnormal
  assert.equal(floatLut("e3m2fn")[0x1f], 28);
  assert.equal(floatLut("e2m3fn")[0x1f], 7.5);
});

const pk = (container, bit_order, axis, extra = {}) => ({ container, bit_order, axis, ...extra });
const decode1 = (shape, element, packing, bytes, dtype = "U8", extra = {}) => {
  const d = { shape, dtype: "float32", codes: { tensor: "c", element, packing }, ...extra.desc };
  const f = openFile(qfile({ c: { dtype, shape: [bytes.length / ({ U8: 1, U16: 2, U32: 4 }[dtype])], data: bytes }, ...(extra.tensors ?? {}) }, { w: d }));
  return [...f.getTensor("w").data];
};
const uint = (bits) => ({ type: "int", bits, signedness: "unsigned" });

test("packing: SPEC.md §7.12 worked examples", () => {
  // a) 4-bit offset_binary in 32-bit lsb_first words
  assert.deepEqual(decode1([1, 8], { type: "int", bits: 4, signedness: "offset_binary" }, pk(32, "lsb_first", null), Uint8Array.of(0x10, 0x98, 0xba, 0xfc), "U32"),
    [-8, -7, 0, 1, 2, 3, 4, 7]);
  // b) 4-bit msb_first slots in bytes, and lsb_first
  assert.deepEqual(decode1([3], uint(4), pk(8, "msb_first", 0), Uint8Array.of(0x12, 0x30)), [1, 2, 3]);
  assert.deepEqual(decode1([3], uint(4), pk(8, "lsb_first", 0), Uint8Array.of(0x21, 0x03)), [1, 2, 3]);
  // c) 3-bit codes straddling bytes, both bit orders; 16-bit msb_first containers
  assert.deepEqual(decode1([6], uint(3), pk(8, "lsb_first", 0), Uint8Array.of(0x9d, 0x73, 0x01)), [5, 3, 6, 1, 7, 2]);
  assert.deepEqual(decode1([6], uint(3), pk(8, "msb_first", 0), Uint8Array.of(0xaf, 0x1e, 0x80)), [5, 3, 6, 1, 7, 2]);
  assert.deepEqual(decode1([6], uint(3), pk(16, "msb_first", 0), Uint8Array.of(0x1e, 0xaf, 0x00, 0x80), "U16"), [5, 3, 6, 1, 7, 2]);
  // d) AWQ slot order
  assert.deepEqual(decode1([8], uint(4), pk(32, "lsb_first", 0, { slot_order: [0, 2, 4, 6, 1, 3, 5, 7] }), Uint8Array.of(0x20, 0x64, 0x31, 0x75), "U32"),
    [0, 1, 2, 3, 4, 5, 6, 7]);
  // e) GGUF split halves: planes of span 32, a short last segment
  const bytes = Uint8Array.of(0xf0, 0xe1, 0xd2, 0xc3, 0xb4, 0xa5, 0x96, 0x87, 0x78, 0x69, 0x5a, 0x4b, 0x3c, 0x2d, 0x1e, 0x0f, 0x51, 0x62, 0x73, 0x84);
  const want = [...Array(16).keys(), ...Array.from({ length: 16 }, (_, i) => 15 - i), 1, 2, 3, 4, 5, 6, 7, 8];
  assert.deepEqual(decode1([40], uint(4), pk(8, "lsb_first", 0, { planes: { span: 32 } }), bytes), want);
});

test("one decode per element kind, with parameters, order and a codebook", () => {
  const tensors = {
    c: { dtype: "U8", shape: [2, 2], data: Uint8Array.of(0x10, 0x32, 0x54, 0x76) }, // codes 0..7, [2 rows][4] stored [K=4? no]
    s: { dtype: "F16", shape: [2], data: Uint16Array.of(0x4000, 0x3800) }, // 2, 0.5
    z: { dtype: "I8", shape: [1], data: Int8Array.of(1) },
    b: { dtype: "BF16", shape: [], data: Uint16Array.of(0x3f80) }, // 1
  };
  const desc = {
    shape: [2, 4], dtype: "float32",
    codes: { tensor: "c", element: { type: "int", bits: 4, signedness: "twos_complement", frac_bits: 1 }, packing: pk(8, "lsb_first", 1) },
    zero: { blocks: { type: "grid", size: [null, null] }, tensor: "z" },
    scale: { blocks: { type: "grid", size: [1, null] }, op: "divide", tensor: "s" },
    bias: { blocks: { type: "flat", size: 8 }, op: "add", tensor: "b" },
  };
  const got = [...openFile(qfile(tensors, { w: desc })).getTensor("w").data];
  const e = [0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5];
  assert.deepEqual(got, e.map((x, i) => Math.fround(Math.fround((x - 1) / (i < 4 ? 2 : 0.5)) + 1)));
  // float element, float16 output
  const f = openFile(qfile({ c: { dtype: "F8_E4M3", shape: [2], data: Uint8Array.of(0x7e, 0x01) } },
    { w: { shape: [2], dtype: "float16", codes: { tensor: "c", element: { type: "float", format: "e4m3fn" }, packing: pk(8, "lsb_first", 0) } } }));
  const t = f.getTensor("w");
  assert.equal(t.dtype, "float16");
  assert.deepEqual([...t.data], [f32ToF16Bits(448), f32ToF16Bits(2 ** -9)]);
  // named codebook, bfloat16 output, storage order [1, 0]
  const g = openFile(qfile({ c: { dtype: "U8", shape: [2, 1], data: Uint8Array.of(0xf0, 0x87) } },
    { w: { shape: [2, 2], dtype: "bfloat16", codes: { tensor: "c", element: { type: "codebook", bits: 4, table: "nf4" }, packing: pk(8, "lsb_first", 1, { order: [1, 0] }) } } }));
  const nf4 = (u) => f32ToBf16Bits(f32FromBits(parseInt(["BF800000", "BF3239B1", "BF066B30", "BECA32A0", "BE91A24D", "BE3D353F", "BDBA7871", "00000000", "3DA2FAFF", "3E24CAE3", "3E7C04DD", "3EAD033A", "3EE1A4B8", "3F1007AB", "3F3913B3", "3F800000"][u], 16)));
  // stored [K=2][N=2]: row k holds (n=0, n=1); logical [n][k]
  assert.deepEqual([...g.getTensor("w").data], [nf4(0), nf4(7), nf4(15), nf4(8)]);
  // an in-file codebook shorter than 2^bits: a code past its end refuses the tensor
  const h = qfile({ c: { dtype: "U8", shape: [1], data: Uint8Array.of(0x21) }, t: { dtype: "F32", shape: [2], data: Float32Array.of(1, 2) } },
    { w: { shape: [2], dtype: "float32", codes: { tensor: "c", element: { type: "codebook", bits: 4, table_tensor: "t" }, packing: pk(8, "lsb_first", 0) } } });
  assert.throws(() => openFile(h).getTensor("w"), (e) => e.code === "CODE_OUT_OF_RANGE");
  assert.deepEqual(check(h).map((p) => p.code), ["CODE_OUT_OF_RANGE"]);
});

test("device layouts: SPEC.md §11.3 and §11.4 examples", () => {
  // tinygemm_int4_cuda, N = 8, K = 32, T = 2, q[n, k] = (n + k) mod 16: D[0,0,0,0] = 0x91918080, D[0,0,5,0] = 0xC4C4B3B3
  const N = 8, K = 32;
  const { unpackDevice } = awaitImport();
  const words = new Map([[0, 0x91918080], [5, 0xc4c4b3b3]]);
  const d = { shape: [N, K], layout: "tinygemm_int4_cuda", layout_parameters: new Map([["inner_k_tiles", 2]]), codes: { element: { bits: 4 } } };
  const q = unpackDevice(d, (i) => words.get(i) ?? 0);
  assert.deepEqual([0, 8, 16, 24, 1, 9, 17, 25].map((k) => q[k]), [0, 8, 0, 8, 1, 9, 1, 9]);
  assert.deepEqual([2, 10, 18, 26, 3, 11, 19, 27].map((k) => q[K + k]), [3, 11, 3, 11, 4, 12, 4, 12]);
  // marlin_dense b = 4: D[0, 0] = 0x19910880 holds q[0,0], q[0,8], q[8,0], q[8,8], q[0,1], q[0,9], q[8,1], q[8,9]
  const m = { shape: [64, 128], layout: "marlin_dense", layout_parameters: new Map(), codes: { element: { bits: 4 } } };
  const qm = unpackDevice(m, (i) => (i === 0 ? 0x19910880 : 0));
  assert.deepEqual([[0, 0], [0, 8], [8, 0], [8, 8], [0, 1], [0, 9], [8, 1], [8, 9]].map(([n, k]) => qm[n * 128 + k]), [0, 8, 8, 0, 1, 9, 9, 1]);
  const m8 = { ...m, codes: { element: { bits: 8 } } };
  const q8 = unpackDevice(m8, (i) => (i === 0 ? 0x09010800 : 0));
  assert.deepEqual([[0, 0], [0, 8], [0, 1], [0, 9]].map(([n, k]) => q8[n * 128 + k]), [0, 8, 1, 9]);
});

import * as layouts from "../src/layouts.js";
function awaitImport() {
  return layouts;
}
