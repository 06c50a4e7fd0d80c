import { test } from "node:test";
import assert from "node:assert/strict";
import { check, openFile, parseStrict, JsonError } from "../src/index.js";
import { rawFile } from "./helpers.mjs";

const code = (bytes) => {
  try {
    openFile(bytes);
    return "ok";
  } catch (e) {
    return e.code;
  }
};
const ent = (s = '"dtype":"U8","shape":[4],"data_offsets":[0,4]') => `{"t":{${s}}}`;
const D4 = new Uint8Array(4);

test("a valid plain file opens and reads", () => {
  const f = openFile(rawFile(ent(), Uint8Array.of(1, 2, 3, 4)));
  assert.deepEqual(f.keys(), ["t"]);
  const t = f.getTensor("t");
  assert.equal(t.dtype, "U8");
  assert.deepEqual([...t.data], [1, 2, 3, 4]);
  assert.deepEqual([...f.getSlice("t", [1, 3]).data], [2, 3]);
});

test("container checks of SPEC.md §2.3, each with its code", () => {
  const cases = [
    ["HEADER_TOO_SMALL", new Uint8Array(7)],
    ["HEADER_TOO_LARGE", (() => { const b = new Uint8Array(16); new DataView(b.buffer).setBigUint64(0, 100000001n, true); return b; })()],
    ["HEADER_LENGTH_INVALID", new Uint8Array(8)],
    ["HEADER_LENGTH_INVALID", (() => { const b = new Uint8Array(16); new DataView(b.buffer).setBigUint64(0, 9n, true); return b; })()],
    ["HEADER_NOT_UTF8", rawFile('{"a\xff":1}'.replace("\xff", "X")).map((v, i, a) => (a[i - 1] === 0x61 && v === 0x58 ? 0xff : v))],
    ["HEADER_INVALID_JSON", rawFile("\ufeff" + ent(), D4)],
    ["ok", rawFile(" " + ent(), D4)],  // spec 1.2: read as safetensors reads it (check --strict: HEADER_LEADING_WHITESPACE)
    ["ok", rawFile("\n" + ent(), D4)],
    ["ok", rawFile(ent() + "\t", D4, false)],  // spec 1.2 (check --strict: HEADER_PADDING_NOT_SPACE)
    ["HEADER_INVALID_JSON", rawFile("\x0b" + ent(), D4)],
    ["HEADER_INVALID_JSON", rawFile(ent() + "\0", D4, false)],
    ["HEADER_INVALID_JSON", rawFile("[]", new Uint8Array(0))],
    ["HEADER_INVALID_JSON", rawFile('{"t":NaN}')],
    ["HEADER_INVALID_JSON", rawFile('{"a":"\\ud800"}')],
    ["HEADER_INVALID_JSON", rawFile(`{"a":${"[".repeat(64)}${"]".repeat(64)}}`)],
    ["HEADER_DUPLICATE_KEY", rawFile(`{"t":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"t":{"dtype":"U8","shape":[0],"data_offsets":[4,4]}}`, D4)],
    ["HEADER_DUPLICATE_KEY", rawFile(`{"__metadata__":{"a":"1","a":"2"}}`)],
    ["METADATA_INVALID", rawFile(`{"__metadata__":{"a":1}}`)],
    ["ok", rawFile(`{"":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}`, D4)],  // spec 1.2 (check --strict: TENSOR_NAME_INVALID)
    ["TENSOR_ENTRY_INVALID", rawFile(ent('"dtype":"U8","shape":[4],"data_offsets":[0,4],"x":1'), D4)],
    ["TENSOR_ENTRY_INVALID", rawFile(ent('"dtype":"U8","shape":[4.0],"data_offsets":[0,4]'), D4)],
    ["TENSOR_ENTRY_INVALID", rawFile(ent('"dtype":"U8","shape":[4],"data_offsets":[0,4e0]'), D4)],
    ["ok", rawFile(ent(`"dtype":"U8","shape":[${Array(64).fill(1)}],"data_offsets":[0,1]`), new Uint8Array(1))],
    ["TENSOR_ENTRY_INVALID", rawFile(ent(`"dtype":"U8","shape":[${Array(65).fill(1)}],"data_offsets":[0,1]`), new Uint8Array(1))],
    ["DTYPE_UNKNOWN", rawFile(ent('"dtype":"u8","shape":[4],"data_offsets":[0,4]'), D4)],
    ["SIZE_OVERFLOW", rawFile(ent('"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,4]'), D4)],
    ["SIZE_OVERFLOW", rawFile(ent('"dtype":"U64","shape":[4611686018427387904],"data_offsets":[0,4]'), D4)],
    ["SUB_BYTE_MISALIGNED", rawFile(ent('"dtype":"F4","shape":[3],"data_offsets":[0,2]'), new Uint8Array(2))],
    ["TENSOR_SIZE_MISMATCH", rawFile(ent('"dtype":"U8","shape":[4],"data_offsets":[0,3]'), new Uint8Array(3))],
    ["TENSOR_SIZE_MISMATCH", rawFile(ent('"dtype":"U8","shape":[4],"data_offsets":[0,18446744073709551620]'), D4)],
    ["OFFSETS_INVALID", rawFile(ent('"dtype":"U8","shape":[4],"data_offsets":[1,5]'), new Uint8Array(5))],
    ["DATA_TRUNCATED", rawFile(ent(), new Uint8Array(3))],
    ["TRAILING_BYTES", rawFile(ent(), new Uint8Array(5))],
  ];
  for (const [want, bytes] of cases) assert.equal(code(bytes), want, `${want}: ${new TextDecoder().decode(bytes.subarray(8, 120))}`);
});

test("check --strict reports what readers accept but writers never write (SPEC.md §2.4)", () => {
  const strict = (bytes) => check(bytes, { strict: true }).map((p) => p.code);
  assert.deepEqual(strict(rawFile(" \t" + ent(), D4)), ["HEADER_LEADING_WHITESPACE"]);
  assert.deepEqual(strict(rawFile(ent() + "\r\n", D4, false)), ["HEADER_PADDING_NOT_SPACE"]);
  assert.deepEqual(strict(rawFile(`{"":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}`, D4)), ["TENSOR_NAME_INVALID"]);
  assert.deepEqual(check(rawFile(" " + ent(), D4)), []);
  assert.deepEqual(strict(rawFile(ent(), D4)), []);
});

test("plain F4, F6 and empty shapes read as SPEC.md §2.2 and §2.6 say; metadata is null without __metadata__", () => {
  const f4 = openFile(rawFile(ent('"dtype":"F4","shape":[2,3],"data_offsets":[0,3]'), Uint8Array.of(0x21, 0x43, 0x65)));
  assert.deepEqual([...f4.getTensor("t").data], [0x21, 0x43, 0x65]);
  assert.deepEqual([...f4.read("t", [[1, 2], [0, 3]]).data], [0x54, 0x06]);  // values 4, 5, 6 packed low nibble first
  assert.equal(f4.metadata(), null);
  const f6 = openFile(rawFile(ent('"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]'), Uint8Array.of(1, 2, 3)));
  const t6 = f6.getTensor("t");
  assert.deepEqual([t6.dtype, t6.shape, [...t6.data]], ["U8", [3], [1, 2, 3]]);
  const big = openFile(rawFile(ent('"dtype":"F32","shape":[0,1099511627776,1099511627776],"data_offsets":[0,0]')));
  assert.deepEqual(big.problems().map((p) => p.code), ["SHAPE_UNREPRESENTABLE"]);
  const ok = openFile(rawFile(ent('"dtype":"U8","shape":[9223372036854775807,0],"data_offsets":[0,0]')));
  assert.deepEqual(ok.problems(), []);
});

test("a shape entry of 2^64 or more is SIZE_OVERFLOW even in an empty tensor (SPEC.md §2.2)", () => {
  assert.throws(() => openFile(rawFile(ent('"dtype":"U8","shape":[0,100000000000000000000],"data_offsets":[0,0]'))),
    (e) => e.code === "SIZE_OVERFLOW");
});

test("the element count is the exact product: no overflow from partial products (SPEC.md §2.2)", () => {
  const f = openFile(rawFile(ent('"dtype":"U8","shape":[1099511627776,1099511627776,0],"data_offsets":[0,0]')));
  assert.deepEqual(f.header.entries.get("t").shape, [1099511627776n, 1099511627776n, 0n]);
});

test("strict JSON: duplicates, exact integers, depth, surrogates, literals", () => {
  assert.throws(() => parseStrict('{"a":1,"a":2}'), (e) => e instanceof JsonError && e.kind === "duplicate");
  assert.throws(() => parseStrict('{"a":[1,{"b":1,"b":2}],"c":}'), (e) => e.kind === "duplicate"); // inner object closes first
  assert.throws(() => parseStrict('{"a":{"b":1,}}'), (e) => e.kind === "syntax");
  assert.equal(parseStrict("9007199254740993").value, 9007199254740993n);
  assert.equal(parseStrict("-9007199254740993").value, -9007199254740993n);
  assert.equal(parseStrict("1" + "0".repeat(99)).value, 1n << 64n);
  assert.equal(parseStrict("4.0").value, 4);
  assert.throws(() => parseStrict("[".repeat(65) + "]".repeat(65)), (e) => e.kind === "depth");
  assert.ok(parseStrict("[".repeat(64) + "]".repeat(64)));
  assert.throws(() => parseStrict('"\\udc00\\ud800"'), (e) => e.kind === "surrogate");
  assert.equal(parseStrict('"\\ud83d\\ude00"').value, "\u{1F600}");
  // not one complete JSON value: a syntax error, or (raw_decode semantics) text left over
  for (const bad of ["NaN", "Infinity", "-Infinity", " {}", "01", "1.", ".5", "+1", '"\t"', "'a'", '"\\x41"', "tru", "[1,]"]) {
    let complete = false;
    try {
      complete = parseStrict(bad).end === bad.length;
    } catch (e) {
      assert.ok(e instanceof JsonError, bad);
    }
    assert.equal(complete, false, bad);
  }
  const m = parseStrict('{"2":1,"1":2,"__proto__":3}').value;
  assert.deepEqual([...m.keys()], ["2", "1", "__proto__"]);
});
