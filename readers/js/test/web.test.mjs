// The viewer page's numbers (web/stats.js), without a browser.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { encodeSafetensors, f32ToBf16Bits, f32ToF16Bits, openBytesAsync } from "../src/index.js";
import { histogram, sqnr, tensorRow, toNumbers } from "../web/stats.js";

test("SQNR is 10 log10(sum x^2 / sum (x - y)^2)", () => {
  assert.ok(Math.abs(sqnr(Float64Array.of(1, 1), Float64Array.of(1, 0)) - 10 * Math.log10(2)) < 1e-12);
  assert.ok(Math.abs(sqnr(Float64Array.of(3, 4), Float64Array.of(3.3, 4)) - 10 * Math.log10(25 / 0.09)) < 1e-9);
  assert.equal(sqnr(Float64Array.of(1, 2), Float64Array.of(1, 2)), Infinity);
  assert.ok(Number.isNaN(sqnr(Float64Array.of(1, NaN), Float64Array.of(1, 2))));
  assert.ok(Number.isNaN(sqnr(Float64Array.of(1), Float64Array.of(1, 2))));
});

test("the histogram counts every finite value once, the others apart", () => {
  const xs = Float64Array.of(0, 1, 2, 3, 4, 4, NaN, Infinity);
  const h = histogram(xs, 4);
  assert.deepEqual(h.counts, [1, 1, 1, 3]);
  assert.equal(h.nonfinite, 2);
  assert.deepEqual([h.lo, h.hi], [0, 4]);
  assert.deepEqual(histogram(Float64Array.of(5, 5), 3).counts, [2, 0, 0]);
});

test("decoded tensors become numbers for each dtype", () => {
  const vals = [1.5, -2, 0.25];
  assert.deepEqual([...toNumbers({ dtype: "float16", data: Uint16Array.from(vals, f32ToF16Bits) })], vals);
  assert.deepEqual([...toNumbers({ dtype: "bfloat16", data: Uint16Array.from(vals, f32ToBf16Bits) })], vals);
  assert.deepEqual([...toNumbers({ dtype: "F32", data: new Uint8Array(Float32Array.from(vals).buffer) })], vals);
  assert.deepEqual([...toNumbers({ dtype: "I8", data: Uint8Array.of(255, 1) })], [-1, 1]);
  assert.deepEqual([...toNumbers({ dtype: "F8_E4M3", data: Uint8Array.of(0x38, 0xb8) })], [1, -1]);
  assert.equal(toNumbers({ dtype: "C64", data: new Uint8Array(8) }), null);
});

const corpus = fileURLToPath(new URL("../../../conformance/v1/cases/codebook-nf4-flat64/input.safetensors", import.meta.url));
test("a table row gives scheme, shape, dtype, stored bytes and bits per weight", { skip: !existsSync(corpus) && "no corpus" }, async () => {
  const f = await openBytesAsync(readFileSync(corpus));
  const [name] = f.keys();
  const r = tensorRow(f, name);
  const numel = r.shape.reduce((a, b) => a * b, 1);
  const stored = f.stored(name).reduce((s, c) => s + f.file.header.entries.get(c).end - f.file.header.entries.get(c).begin, 0);
  assert.equal(r.bytes, stored);
  assert.equal(r.bitsPerWeight, (stored * 8) / numel);
  assert.ok(r.bitsPerWeight > 4 && r.bitsPerWeight < 5.5, `nf4 with a float32 absmax per 64: ${r.bitsPerWeight}`);
  assert.equal(r.dtype, "float16");
  const p = await openBytesAsync(encodeSafetensors([["w", { dtype: "bfloat16", shape: [2, 2], data: new Uint16Array(4) }]]));
  assert.deepEqual(tensorRow(p, "w"), { name: "w", scheme: "plain", dtype: "BF16", bytes: 8, shape: [2, 2], bitsPerWeight: 16, error: null });
});
