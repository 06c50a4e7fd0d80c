// Long lists through the JavaScript reader (issue 40): a qformat 1.2 file of N plain tensors
// whose `digests` lists every one, read by each path that walks the lists.  For each operation
// it counts the blocks of readers/js/src that ran (V8's block coverage with call counts:
// deterministic, unlike a clock; builtins such as Array.prototype.includes are not counted, so
// the CPU time is reported too) and prints one JSON line:
//   {"n": N, "ops": {op: {"blocks": executed blocks, "cpu_ms": ..., "ms": wall, "result": ...}}}
// Used by tests/test_js_hostile.py, which compares the counts at two sizes.
//   node tests/js_hostile_probe.mjs N
import { Session } from "node:inspector";
import { createHash } from "node:crypto";

const n = Number(process.argv[2]);
const session = new Session();
session.connect();
const post = (method, params = {}) => {
  let out;
  let err;
  session.post(method, params, (e, r) => {
    err = e;
    out = r;
  });
  if (err) throw err;
  return out;
};
post("Profiler.enable");
post("Profiler.startPreciseCoverage", { callCount: true, detailed: true });
// imported after coverage starts: every function has its block counters
const { check, sha256Node } = await import("../readers/js/src/node.js");
const { openFile, openBytesAsync } = await import("../readers/js/src/index.js");
const SRC = new URL("../readers/js/src/", import.meta.url).href;

/** Executed blocks of readers/js/src since the last call (the counters reset on each take). */
function blocks() {
  let total = 0;
  for (const script of post("Profiler.takePreciseCoverage").result) {
    if (!script.url.startsWith(SRC)) continue;
    // a count is 32 bits: one past 2^31 reads negative (a quadratic path at 50,000 entries did)
    for (const fn of script.functions) for (const r of fn.ranges) total += r.count < 0 ? r.count + 2 ** 32 : r.count;
  }
  return total;
}

/** The file: tensors p0..p{n-1}, F32 [1]; digests of all of them (wrong ones when `bad`). */
function manyTensors(count, bad) {
  const header = {};
  const digests = {};
  const data = new Uint8Array(4 * count);
  const dv = new DataView(data.buffer);
  for (let i = 0; i < count; i++) {
    dv.setFloat32(4 * i, i, true);
    header[`p${i}`] = { dtype: "F32", shape: [1], data_offsets: [4 * i, 4 * i + 4] };
    digests[`p${i}`] = bad ? "0".repeat(64) : createHash("sha256").update(data.subarray(4 * i, 4 * i + 4)).digest("hex");
  }
  header.__metadata__ = { qformat: JSON.stringify({ version: "1.2", tensors: {}, digests: { algorithm: "sha256", tensors: digests } }) };
  let h = new TextEncoder().encode(JSON.stringify(header));
  const padded = new Uint8Array(h.length + ((8 - (h.length % 8)) % 8)).fill(0x20);
  padded.set(h);
  h = padded;
  const out = new Uint8Array(8 + h.length + data.length);
  new DataView(out.buffer).setBigUint64(0, BigInt(h.length), true);
  out.set(h, 8);
  out.set(data, 8 + h.length);
  return out;
}

const good = manyTensors(n, false);
const bad = manyTensors(n, true);
const ops = {
  // every listed digest wrong: n problems (a spread of them overflowed the stack)
  "check-digests": () => check(bad, { digests: true }).length,
  // the reader's verify path: each tensor's digest looked up when it is read
  "load-verify": () => openFile(good, { verify: true, sha256: sha256Node }).loadAll().size,
  // the lazy path (URLs, Blobs): all at once, then one by one
  "lazy-load-verify": async () => (await (await openBytesAsync(good, { verify: true, sha256: sha256Node })).loadAll()).size,
  "lazy-one-by-one": async () => {
    const f = await openBytesAsync(good);
    let k = 0;
    for (const name of f.keys()) k += (await f.getTensor(name)).data.length === 4 ? 1 : 0;  // one F32 each
    return k;
  },
};
const result = { n, ops: {} };
for (const [name, op] of Object.entries(ops)) {
  blocks();
  const t = performance.now();
  const cpu = process.cpuUsage();
  const value = await op();
  const used = process.cpuUsage(cpu);
  result.ops[name] = { blocks: blocks(), cpu_ms: Math.round((used.user + used.system) / 1000), ms: Math.round(performance.now() - t), result: value };
}
process.stdout.write(JSON.stringify(result) + "\n");
