// Lists a GGUF file's header with the viewer's reader (readers/js/web/gguf.js) as one JSON line:
// {"version", "alignment", "dataStart", "kv": {key: value or {type, count}}, "tensors": [...]}
// or {"code": CODE}.  Used by tests/test_web_page.py.   node js_gguf_probe.mjs FILE
import { readFileSync } from "node:fs";
import { bufferSource } from "../readers/js/src/index.js";
import { readGguf } from "../readers/js/web/gguf.js";

try {
  const g = await readGguf(bufferSource(readFileSync(process.argv[2])));
  const kv = Object.fromEntries([...g.kv].map(([k, v]) => [k, typeof v === "bigint" ? Number(v) : v && typeof v === "object" ? { type: v.type, count: v.count } : v]));
  process.stdout.write(JSON.stringify({ version: g.version, alignment: g.alignment, dataStart: g.dataStart, kv, tensors: g.tensors }) + "\n");
} catch (e) {
  if (!e.code) throw e;
  process.stdout.write(JSON.stringify({ code: e.code, message: e.message }) + "\n");
}
