// The fuzzer's regression inputs (test/fuzz-regressions: what fuzz/fuzz.mjs found, and hostile
// files written by hand) through its oracle once more: each decodes, or ends in a coded
// refusal, through the command protocol and the lazy path alike.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readdirSync } from "node:fs";
import { fileURLToPath } from "node:url";

const here = fileURLToPath(new URL(".", import.meta.url));
const dir = here + "fuzz-regressions/";
const inputs = readdirSync(dir).filter((f) => f.endsWith(".safetensors") || f.endsWith(".index.json")).sort();

test("every fuzz regression input decodes or is refused with a code, by every path", () => {
  assert.ok(inputs.length >= 2);
  const p = spawnSync(process.execPath, [here + "../fuzz/fuzz.mjs", "--json", "--replay", ...inputs.map((f) => dir + f)], { encoding: "utf8", timeout: 120000 });
  const lines = p.stdout.trim().split("\n").map((l) => JSON.parse(l));
  const replayed = lines.filter((l) => "replay" in l);
  assert.deepEqual(replayed.map((l) => l.replay.split("/").pop()), inputs);
  assert.deepEqual(replayed.filter((l) => l.finding !== null), []);
  assert.equal(p.status, 0, p.stderr);
});
