// Tests over the project's conformance corpus (skipped when the package is used outside the repo).
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { check, loadCheckpoint, openFile as openPath } from "../src/node.js";
import { openFile } from "../src/index.js";

const corpus = fileURLToPath(new URL("../../../conformance/v1/", import.meta.url));
const have = existsSync(corpus + "manifest.json");
const cases = have ? JSON.parse(readFileSync(corpus + "manifest.json", "utf8")).cases : [];
const single = cases.filter((c) => c.input.endsWith(".safetensors"));

test("check() reports exactly the corpus's expected checker codes", { skip: !have && "no corpus" }, () => {
  for (const c of single) {
    const got = [...new Set(check(readFileSync(corpus + c.input), { digests: true }).map((p) => p.code))].sort();
    assert.deepEqual(got, [...new Set(c.check)].sort(), c.id);
  }
});

test("check({strict: true}) reports exactly the corpus's strict codes (check --strict --digests, corpus 1.5.0)", { skip: !have && "no corpus" }, () => {
  const withStrict = single.filter((c) => Array.isArray(c.strict));
  for (const c of withStrict) {
    const got = [...new Set(check(readFileSync(corpus + c.input), { digests: true, strict: true }).map((p) => p.code))].sort();
    assert.deepEqual(got, [...new Set(c.strict)].sort(), c.id);
  }
});

test("rows decoded by getSlice equal the rows of the whole tensor", { skip: !have && "no corpus" }, () => {
  let n = 0;
  for (const c of single.filter((x) => x.expect === "valid")) {
    const f = openFile(readFileSync(corpus + c.input));
    for (const name of f.keys()) {
      const full = f.getTensor(name);
      if (!full.shape.length || full.shape[0] < 2) continue;
      if (full.dtype === "F4") continue;  // two values a byte: a row may end mid-byte (container.test.mjs checks F4 boxes)
      const row = full.data.length / full.shape[0];
      for (const [lo, hi] of [[1, full.shape[0]], [0, 1], [Math.floor(full.shape[0] / 2), full.shape[0] - 1]]) {
        const part = f.getSlice(name, [lo, hi]);
        const per = full.data.BYTES_PER_ELEMENT;
        const want = new Uint8Array(full.data.buffer, full.data.byteOffset + lo * row * per, (hi - lo) * row * per);
        const got = new Uint8Array(part.data.buffer, part.data.byteOffset, part.data.byteLength);
        assert.deepEqual(got, want, `${c.id} ${name} [${lo}, ${hi})`);
        n++;
      }
    }
  }
  assert.ok(n > 50);
});

test("the Node layer opens by path, and sharded checkpoints through their index", { skip: !have && "no corpus" }, () => {
  const c = single.find((x) => x.expect === "valid" && x.features.includes("element:codebook"));
  const f = openPath(corpus + c.input);
  try {
    const mem = openFile(readFileSync(corpus + c.input));
    for (const name of f.keys()) assert.deepEqual(f.getTensor(name).data, mem.getTensor(name).data);
  } finally {
    f.close();
  }
  const sharded = cases.find((x) => x.id === "sharded-two-shards");
  const all = loadCheckpoint(corpus + sharded.input);
  assert.ok(all.size >= 2);
  for (const bad of cases.filter((x) => x.features.includes("sharded") && x.expect !== "valid")) {
    assert.throws(() => loadCheckpoint(corpus + bad.input), (e) => e.code === bad.error, bad.id);
  }
  assert.throws(() => openPath(corpus + "no-such-file.safetensors"), (e) => e.code === "FILE_UNREADABLE");
});
