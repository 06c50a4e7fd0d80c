// Digests (SPEC.md §3.8, spec 1.2): the portable SHA-256, check({digests: true}) and openFile({verify: true}).
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { check, openFile, sha256Hex } from "../src/index.js";
import { check as nodeCheck, openFile as openPath } from "../src/node.js";

const corpus = fileURLToPath(new URL("../../../conformance/v1/cases/", import.meta.url));
const have = existsSync(corpus + "digests-sha256-valid/input.safetensors");

test("sha256Hex equals node:crypto's SHA-256 at every padding boundary", () => {
  for (const n of [0, 1, 3, 55, 56, 57, 63, 64, 65, 119, 120, 128, 1000, 4097]) {
    const b = new Uint8Array(n).map((_, i) => (i * 131 + n) & 255);
    assert.equal(sha256Hex(b), createHash("sha256").update(b).digest("hex"), `length ${n}`);
  }
});

test("a damaged tensor: check reports DIGEST_MISMATCH only with digests; verify refuses only that tensor", { skip: !have && "no corpus" }, () => {
  const bytes = readFileSync(corpus + "digests-mismatch-one-tensor-of-two/input.safetensors");
  assert.deepEqual(check(bytes).map((p) => p.code), []);
  for (const c of [check, nodeCheck]) {
    const probs = c(bytes, { digests: true });
    assert.deepEqual(probs.map((p) => [p.code, p.tensor]), [["DIGEST_MISMATCH", "v"]]);
  }
  const f = openFile(bytes, { verify: true });
  f.getTensor("w");
  f.getTensor("b");
  assert.throws(() => f.getTensor("v"), (e) => e.code === "DIGEST_MISMATCH");
  openFile(bytes).getTensor("v"); // without verify the bytes decode as they are
  const g = openPath(corpus + "digests-mismatch-one-tensor-of-two/input.safetensors", { verify: true });
  assert.throws(() => g.getTensor("v"), (e) => e.code === "DIGEST_MISMATCH");
  g.close();
});

test("an unknown algorithm: verify refuses the file, check reports DIGEST_UNSUPPORTED", { skip: !have && "no corpus" }, () => {
  const bytes = readFileSync(corpus + "digests-unknown-algorithm/input.safetensors");
  assert.throws(() => openFile(bytes, { verify: true }), (e) => e.code === "DIGEST_UNSUPPORTED");
  assert.deepEqual(check(bytes, { digests: true }).map((p) => p.code), ["DIGEST_UNSUPPORTED"]);
  openFile(bytes).getTensor("w");
});
