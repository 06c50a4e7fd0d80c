// Opens a URL with the JavaScript reader's range source and decodes every tensor (or those named
// in the options' "tensors"); prints one JSON line:
// {"ok": true, "keys": [...], "sums": {name: sum of decoded values}, "bytes": N, "maxArrayLength": N}
// or {"code": CODE, "message": ..., "bytes": N}.  Used by tests/test_js_remote.py and
// tests/test_js_hostile.py against tests/range_server.py.
//   node js_remote_probe.mjs URL [OPTIONS_JSON]
import { openUrl, MAX_ARRAY_LENGTH } from "../readers/js/src/index.js";
import { toNumbers } from "../readers/js/web/stats.js";

const [url, optsText] = process.argv.slice(2);
const opts = { retries: 2, backoffMs: 10, ...(optsText ? JSON.parse(optsText) : {}) };
let f = null;
try {
  f = await openUrl(url, opts);
  const sums = {};
  for (const name of opts.tensors ?? f.keys()) sums[name] = toNumbers(await f.getTensor(name)).reduce((a, b) => a + b, 0);
  process.stdout.write(JSON.stringify({ ok: true, keys: f.keys(), sums, bytes: f.bytesFetched, maxArrayLength: MAX_ARRAY_LENGTH }) + "\n");
} catch (e) {
  if (!e.code) throw e;
  process.stdout.write(JSON.stringify({ code: e.code, message: e.message, bytes: f?.bytesFetched ?? null, maxArrayLength: MAX_ARRAY_LENGTH }) + "\n");
}
