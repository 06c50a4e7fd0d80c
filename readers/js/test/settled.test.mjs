// The points SPEC.md 1.2.1 pins (issue 43; decisions A1-A16 of the spec-1.2 review) that are API
// behaviour or building blocks rather than one file's code through the command protocol (those are
// tests/test_js_settled.py): A3's text rule and its async path, A7 (verifying whole-file reads),
// A8's exact comparison of offsets past EXACT_DIGITS, A16 (a shard that is a folder).
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { check, encodeSafetensors, openBytesAsync, openFile, sha256Hex } from "../src/index.js";
import { isText, notSafetensors } from "../src/container.js";
import { EXACT_DIGITS } from "../src/json.js";
import { loadCheckpoint, readIndex } from "../src/node.js";
import { rawFile } from "./helpers.mjs";

const codeOf = (fn) => {
  try {
    fn();
    return "ok";
  } catch (e) {
    if (!e.code) throw e;
    return e.code;
  }
};
const bytes = (...xs) => Uint8Array.from(xs);
const ascii = (s) => new TextEncoder().encode(s);
const pad = (b, n = 24) => {
  const out = new Uint8Array(Math.max(n, b.length));
  out.set(b);
  return out;
};

test("A3: NOT_SAFETENSORS only where check 2 or 3 fails and the first 8 bytes match (a)-(d)", () => {
  const cases = [
    ["NOT_SAFETENSORS", ascii("# A README file\n")],
    ["NOT_SAFETENSORS", pad(ascii("GGUF\x03\0\0\0"))],
    ["NOT_SAFETENSORS", pad(bytes(0x50, 0x4b, 3, 4, 0x14, 0, 0, 0))],
    ["NOT_SAFETENSORS", pad(bytes(0x80, 2, 0x7d, 0x71, 0, 0x28, 0x58, 1))],  // pickle protocol 2
    ["HEADER_TOO_LARGE", pad(bytes(0x80, 6, 0x7d, 0x71, 0, 0x28, 0x58, 1))],  // protocol 6: not (c)
    ["NOT_SAFETENSORS", pad(bytes(0x80, 5, 0x95, 0x10, 0, 0, 0, 0))],  // framed: N < 2^48, rule (c) needs no bound
    ["NOT_SAFETENSORS", pad(bytes(0x80, 2, 0, 0, 0, 0, 0, 0))],  // N < 2^48: rule (c) still applies
    ["HEADER_TOO_SMALL", ascii("GGUF")],
    ["HEADER_TOO_LARGE", pad(bytes(0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff))],
  ];
  for (const [want, b] of cases) {
    assert.equal(codeOf(() => openFile(b)), want, `${[...b.slice(0, 8)]}`);
    assert.deepEqual(check(b).map((p) => p.code), [want]);  // checkers alike
  }
});

test("A3: a ZIP whose length passes checks 2 and 3 gets the later container codes", () => {
  const b = new Uint8Array(0x04034b50 + 8 + 16);
  b.set(bytes(0x50, 0x4b, 3, 4, 0, 0, 0, 0));  // N = 0x04034B50 <= max_header_bytes, 8 + N <= F
  assert.equal(codeOf(() => openFile(b)), "HEADER_INVALID_JSON");
});

test("A3 (d): text after dropping a cut UTF-8 sequence; controls, C1, DEL and ill-formed UTF-8 are not text", () => {
  const yes = ["a\tb\r\nc d", "abcd\xc2\xa0ef", "abcde\xf0\x9f\x98", "abcdef\xe2\x82", "abcdefg\xc3", "abcd\xf0\x9f\x98\x80"];
  const no = ["abcd\xc2\x85ef", "abcdefg\x7f", "abc\x01defg", "abcd\xc0\x80ef", "ab\xed\xa0\x80efg", "abcdef\xe0\x80", "abcde\xf4\x90\x80", "abcdefg\xff", "abcd\x80efg"];
  const raw = (s) => Uint8Array.from(s, (c) => c.charCodeAt(0));
  for (const s of yes) assert.equal(isText(raw(s)), true, JSON.stringify(s));
  for (const s of no) assert.equal(isText(raw(s)), false, JSON.stringify(s));
  assert.equal(notSafetensors(raw("abcdefgh")), "a text file");
  assert.equal(notSafetensors(raw("ab\0\0\0\0\0\0")), null);  // N < 2^48
});

test("A3: the async path (URL, Blob) refuses a text file with NOT_SAFETENSORS before fetching a header", async () => {
  await assert.rejects(openBytesAsync(ascii("<!DOCTYPE html><html>...</html>\n")), (e) => e.code === "NOT_SAFETENSORS");
});

/** A 1.2 file: `a` (a 2-bit in-file codebook of 3 entries whose codes include 3: CODE_OUT_OF_RANGE) and plain `b`; digests as given. */
function digestFile(digests) {
  const aCodes = bytes(0b11100100);  // codes 0, 1, 2, 3
  const table = Float32Array.of(1, 2, 3);
  const b = bytes(7, 8, 9);
  const desc = { shape: [4], dtype: "float32", codes: { tensor: "a.codes", element: { type: "codebook", bits: 2, table_tensor: "a.table" }, packing: { container: 8, bit_order: "lsb_first", axis: 0 } } };
  const tensors = [["a.codes", { dtype: "U8", shape: [1], data: aCodes }], ["a.table", { dtype: "F32", shape: [3], data: table }], ["b", { dtype: "U8", shape: [3], data: b }]];
  const all = { "a.codes": sha256Hex(aCodes), "a.table": sha256Hex(new Uint8Array(table.buffer)), b: sha256Hex(b) };
  const q = { version: "1.2", tensors: { a: desc }, digests: { algorithm: "sha256", tensors: digests(all) } };
  return encodeSafetensors(tensors, { qformat: JSON.stringify(q) });
}

test("A7: a listed name that is no stored tensor fails a verifying whole-file read; other tensors still read", () => {
  const f = digestFile((d) => ({ b: d.b, ghost: d.b }));
  const v = openFile(f, { verify: true });
  assert.throws(() => v.loadAll(), (e) => e.code === "DIGEST_MISMATCH" && e.tensor === "ghost");
  assert.deepEqual([...v.getTensor("b").data], [7, 8, 9]);
  assert.equal(codeOf(() => v.getTensor("a")), "CODE_OUT_OF_RANGE");  // its own decode-time code
  assert.deepEqual(check(f, { digests: true }).map((p) => [p.code, p.tensor]), [["CODE_OUT_OF_RANGE", "a"], ["DIGEST_MISMATCH", "ghost"]]);
  assert.equal(codeOf(() => openFile(f).loadAll()), "CODE_OUT_OF_RANGE");  // not verifying: no digest is read
});

test("A7: verification comes before the decode-time checks: a damaged file reports DIGEST_MISMATCH, not the symptom", () => {
  const f = digestFile((d) => ({ ...d, b: "0".repeat(64) }));
  assert.equal(codeOf(() => openFile(f, { verify: true }).loadAll()), "DIGEST_MISMATCH");
  assert.equal(codeOf(() => openFile(f).loadAll()), "CODE_OUT_OF_RANGE");
  const g = digestFile((d) => d);  // every digest right: the decode-time code
  assert.equal(codeOf(() => openFile(g, { verify: true }).loadAll()), "CODE_OUT_OF_RANGE");
});

test("A8: offsets are compared exactly past EXACT_DIGITS (no sentinel), in linear time", () => {
  const big = "1" + "0".repeat(EXACT_DIGITS + 10);
  const plus = (k) => big.slice(0, -3) + String(k).padStart(3, "0");  // big + k, k < 1000
  const minus2 = "9".repeat(EXACT_DIGITS + 9) + "8";                  // 10^(EXACT_DIGITS+10) - 2
  const one = (b, e) => rawFile(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[${b},${e}]}}`, new Uint8Array(4));
  assert.equal(codeOf(() => openFile(one(plus(5), plus(9)))), "OFFSETS_INVALID");  // passes check 14, fails the tiling
  assert.equal(codeOf(() => openFile(one(plus(9), plus(5)))), "OFFSETS_INVALID");  // reversed
  assert.equal(codeOf(() => openFile(one(plus(5), plus(6)))), "TENSOR_SIZE_MISMATCH");
  assert.equal(codeOf(() => openFile(one(minus2, plus(2)))), "OFFSETS_INVALID");  // END - BEGIN = 4 across the carry
  assert.equal(codeOf(() => openFile(one(minus2, plus(3)))), "TENSOR_SIZE_MISMATCH");
  assert.equal(codeOf(() => openFile(one(0, big))), "TENSOR_SIZE_MISMATCH");
  assert.equal(codeOf(() => openFile(one(big, 4))), "OFFSETS_INVALID");
  assert.equal(codeOf(() => openFile(one("-" + big, 4))), "TENSOR_ENTRY_INVALID");
  assert.equal(codeOf(() => openFile(one("-0", 4))), "ok");
  const t0 = Date.now();
  const huge = "1" + "0".repeat(2_000_000);  // a BigInt of it would take V8 seconds
  assert.equal(codeOf(() => openFile(one(huge, huge.slice(0, -1) + "4"))), "OFFSETS_INVALID");
  assert.ok(Date.now() - t0 < 5000, `${Date.now() - t0} ms`);
});

test("A16: an index's shard that is a folder is INDEX_INVALID", () => {
  const root = mkdtempSync(join(tmpdir(), "qf-a16-"));
  try {
    mkdirSync(join(root, "b.safetensors"));
    writeFileSync(join(root, "m.safetensors.index.json"), JSON.stringify({ weight_map: { w: "b.safetensors" } }));
    assert.equal(codeOf(() => readIndex(join(root, "m.safetensors.index.json"))), "INDEX_INVALID");
    assert.equal(codeOf(() => loadCheckpoint(join(root, "m.safetensors.index.json"))), "INDEX_INVALID");
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});
