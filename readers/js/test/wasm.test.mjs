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
