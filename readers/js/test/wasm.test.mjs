// The WebAssembly path (src/wasm.js: libqformat built by libqformat/scripts/build_wasm.py) against
// the JavaScript decoder, on the conformance corpus: the same bits, whole and by rows, and the
// same refusal codes.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { useWasm, wasmInfo } from "../src/node.js";
import { openFile } from "../src/index.js";

const corpus = fileURLToPath(new URL("../../../conformance/v1/", import.meta.url));
const have = existsSync(corpus + "manifest.json");
const cases = have ? JSON.parse(readFileSync(corpus + "manifest.json", "utf8")).cases : [];
const single = cases.filter((c) => c.input.endsWith(".safetensors"));
const built = existsSync(new URL("../wasm/qformat.wasm", import.meta.url));

/** A decode's bytes with every NaN made one pattern: bits are compared NaN by class (the C keeps
 * a NaN's payload where JavaScript's arithmetic may not). */
function nanByClass(t) {
  const bytes = new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength).slice();
  if (t.dtype === "float32") {
    const w = new Uint32Array(bytes.buffer);
    for (let i = 0; i < w.length; i++) if ((w[i] & 0x7fffffff) > 0x7f800000) w[i] = 0x7fc00000;
  } else if (t.dtype === "float16" || t.dtype === "bfloat16") {
    const w = new Uint16Array(bytes.buffer);
    const [inf, nan] = t.dtype === "float16" ? [0x7c00, 0x7e00] : [0x7f80, 0x7fc0];
    for (let i = 0; i < w.length; i++) if ((w[i] & 0x7fff) > inf) w[i] = nan;
  }
  return bytes;
}

/** The bytes of a decode, or its error code, with the path switched on or off. */
function both(fn) {
  const run = (/** @type {boolean|"always"} */ on) => {
    const was = useWasm(on);
    try {
      const t = fn();
      return { bytes: nanByClass(t), dtype: t.dtype, shape: t.shape };
    } catch (e) {
      if (!e.code) throw e;
      return { code: e.code };
    } finally {
      useWasm(was);
    }
  };
  return [run("always"), run(false)];
}

test("the module is loaded in Node and decodes by default", { skip: !built && "readers/js/wasm/qformat.wasm not built" }, () => {
  const env = process.env.QFORMAT_JS_WASM;
  assert.equal(wasmInfo().loaded, env !== "0", JSON.stringify(wasmInfo()));
  assert.equal(wasmInfo().path, env === "0" ? "js" : "wasm", JSON.stringify(wasmInfo()));
});

test("every corpus tensor decodes to the same bits or code through WebAssembly and JavaScript",
  { skip: (!have && "no corpus") || (!wasmInfo().loaded && "the WebAssembly module is not loaded") }, () => {
    const before = wasmInfo().decodes;
    let compared = 0;
    for (const c of single) {
      let f;
      try {
        f = openFile(readFileSync(corpus + c.input));
      } catch {
        continue;  // a file-scope refusal: no tensor reaches either decoder
      }
      for (const name of f.keys()) {
        let quantized;
        try {
          quantized = f.isQuantized(name);
        } catch {
          continue;
        }
        if (!quantized) continue;
        const [w, j] = both(() => f.getTensor(name));
        assert.deepEqual(w, j, `${c.id} ${name}`);
        compared++;
        if (w.shape && w.shape.length && w.shape[0] >= 2) {
          const n = w.shape[0];
          for (const rows of [[1, n], [0, 1], [n >> 1, n - 1]]) {
            const [ws, js] = both(() => f.getSlice(name, rows));
            assert.deepEqual(ws, js, `${c.id} ${name} rows ${rows}`);
          }
        }
      }
    }
    assert.ok(compared > 300, `${compared} tensors compared`);
    assert.ok(wasmInfo().decodes - before > 300, "the WebAssembly path decoded them");
  });

test("a box that is not whole rows decodes in JavaScript, with the same bits as the rows it cuts",
  { skip: (!have && "no corpus") || (!wasmInfo().loaded && "the WebAssembly module is not loaded") }, () => {
    const c = single.find((x) => x.id === "int4-twos-complement") ?? single.find((x) => x.expect === "valid");
    const f = openFile(readFileSync(corpus + c.input));
    const name = f.keys().find((n) => f.isQuantized(n) && f.shape(n).length === 2 && f.shape(n)[1] >= 2);
    const [rows, cols] = f.shape(name);
    const was = useWasm("always");
    let part;
    const before = wasmInfo().decodes;
    try {
      part = f.read(name, [[0, rows], [1, cols]]);
    } finally {
      useWasm(was);
    }
    assert.equal(wasmInfo().decodes, before, "a column box is not the module's");
    const whole = f.getTensor(name);
    for (let r = 0; r < rows; r++) {
      for (let k = 1; k < cols; k++) assert.equal(Object.is(part.data[r * (cols - 1) + k - 1], whole.data[r * cols + k]), true);
    }
  });

test("a tensor of several decode chunks: the same bits whole and by rows, and a late bad code the same code",
  { skip: !wasmInfo().loaded && "the WebAssembly module is not loaded" }, async () => {
    const { qfile } = await import("./helpers.mjs");
    const [R, C] = [1100, 512];  // 563,200 values: three chunks of 2^18, the last a part
    let seed = 41;
    const rnd = () => ((seed = (seed * 1103515245 + 12345) >>> 0) >>> 16) & 255;
    const codes = Uint8Array.from({ length: (R * C) / 2 }, rnd);
    const scales = new Uint16Array((R * C) / 32).map(() => 0x3000 + (rnd() << 2));
    const desc = {
      shape: [R, C], dtype: "float32",
      codes: { tensor: "c", element: { type: "int", bits: 4, signedness: "twos_complement" }, packing: { container: 8, bit_order: "lsb_first", axis: 1 } },
      scale: { op: "multiply", tensor: "s", blocks: { type: "grid", size: [1, 32] } },
    };
    const f = openFile(qfile({ c: { dtype: "U8", shape: [R, C / 2], data: codes }, s: { dtype: "F16", shape: [R, C / 32], data: scales } }, { w: desc }));
    for (const dtype of [null, "float16", "bfloat16"]) {
      const d = dtype ? { ...desc, dtype } : desc;
      const g = dtype ? openFile(qfile({ c: { dtype: "U8", shape: [R, C / 2], data: codes }, s: { dtype: "F16", shape: [R, C / 32], data: scales } }, { w: d })) : f;
      const before = wasmInfo().decodes;
      const [w, j] = both(() => g.getTensor("w"));
      assert.equal(wasmInfo().decodes, before + 1, "the module decoded it");
      assert.deepEqual(w, j, `whole, ${dtype ?? "float32"}`);
      for (const rows of [[3, 1097], [0, 513], [600, 1100]]) {
        const [ws, js] = both(() => g.getSlice("w", rows));
        assert.deepEqual(ws, js, `rows ${rows}, ${dtype ?? "float32"}`);
      }
    }
    // an in-file codebook of 15 values: a code 15 in the last chunk only
    const bad = codes.map((b) => ((b & 15) === 15 ? b - 1 : b) & ((b >> 4) === 15 ? 0xef : 0xff));
    bad[bad.length - 3] = 0x0f;
    const table = Float32Array.from({ length: 15 }, (_, i) => i - 7);
    const cb = { ...desc, codes: { ...desc.codes, element: { type: "codebook", bits: 4, table_tensor: "t" } } };
    const h = openFile(qfile({ c: { dtype: "U8", shape: [R, C / 2], data: bad }, s: { dtype: "F16", shape: [R, C / 32], data: scales },
      t: { dtype: "F32", shape: [15], data: table } }, { w: cb }));
    const [wb, jb] = both(() => h.getTensor("w"));
    assert.deepEqual(wb, { code: "CODE_OUT_OF_RANGE" });
    assert.deepEqual(jb, wb);
    const [wr, jr] = both(() => h.getSlice("w", [0, 1000]));
    assert.deepEqual(wr, jr, "rows without the bad code");
  });
