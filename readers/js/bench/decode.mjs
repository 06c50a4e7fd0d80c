#!/usr/bin/env node
// Decode speed of the JavaScript reader: every quantized tensor of each FILE decoded to its
// logical dtype with QFile.getTensor (the public API: a new output array per call), timed
// `--reps` times after `--warmup` calls; one JSON line per tensor on stdout.
//
//   node readers/js/bench/decode.mjs [--reps 7] [--warmup 2] [--out DIR] FILE...
//
// --out DIR also writes each tensor's decoded bytes (little-endian) to DIR/<file>.<tensor>.bin,
// so a driver can check them bit for bit against another decoder (readers/js/bench/run.py).
// The file's bytes are read once, into memory, before timing: what is timed is the decode.

import { readFileSync, writeFileSync } from "node:fs";
import { basename, join } from "node:path";
import { openFile } from "../src/index.js";
// the Node layer as users import it: it loads libqformat's WebAssembly build, the default decode
// path for large tensors (QFORMAT_JS_WASM=0: the JavaScript decoder alone)
import { wasmInfo } from "../src/node.js";

const args = process.argv.slice(2);
let reps = 7;
let warmup = 2;
let outDir = null;
const files = [];
for (let i = 0; i < args.length; i++) {
  const a = args[i];
  if (a === "--reps") reps = Number(args[++i]);
  else if (a === "--warmup") warmup = Number(args[++i]);
  else if (a === "--out") outDir = args[++i];
  else if (a === "-h" || a === "--help") {
    console.log("usage: node decode.mjs [--reps N] [--warmup N] [--out DIR] FILE...");
    process.exit(0);
  } else files.push(a);
}
if (!files.length || !(reps >= 1) || !(warmup >= 0)) {
  console.error("usage: node decode.mjs [--reps N] [--warmup N] [--out DIR] FILE...");
  process.exit(2);
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

for (const file of files) {
  const f = openFile(readFileSync(file));
  for (const name of f.keys()) {
    if (!f.isQuantized(name)) continue;
    let t = null;
    for (let i = 0; i < warmup; i++) t = f.getTensor(name);
    const ms = [];
    for (let i = 0; i < reps; i++) {
      t = null;
      const t0 = process.hrtime.bigint();
      t = f.getTensor(name);
      ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
    }
    const n = t.data.length;
    const med = median(ms);
    if (outDir) {
      const d = t.data;
      writeFileSync(join(outDir, `${basename(file)}.${name}.bin`), new Uint8Array(d.buffer, d.byteOffset, d.byteLength));
    }
    console.log(JSON.stringify({ file, tensor: name, dtype: t.dtype, shape: t.shape, values: n, reps, ms, median_ms: med, mvals_per_s: n / med / 1e3, path: n >= 65536 ? wasmInfo().path : "js" }));
  }
}
