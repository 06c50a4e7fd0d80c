#!/usr/bin/env node
// qformat-read: the conformance command protocol (conformance/README.md).
//
//   qformat-read INPUT OUTPUT     decode INPUT (.safetensors, or a *.safetensors.index.json) and
//                                 write every tensor to OUTPUT as a plain safetensors file (exit 0),
//                                 or print the error code on standard output (exit 1)
//   qformat-read --batch [LIST]   the same for many files in one process: each line of LIST (or of
//                                 standard input) is "INPUT<TAB>OUTPUT"; one JSON line per input:
//                                 {"input": ..., "code": null | "CODE"}
//   qformat-read --check FILE     print every problem a checker finds (one code per line)
import { readFileSync, writeFileSync } from "node:fs";
import { check, encodeSafetensors, loadCheckpoint, QFormatError } from "../src/node.js";

/** @param {string} input @param {string} output */
function readOne(input, output) {
  const tensors = loadCheckpoint(input);
  const out = [...tensors].map(([name, t]) => [name, { dtype: t.dtype, shape: t.storedShape ?? t.shape, data: t.data }]);
  writeFileSync(output, encodeSafetensors(/** @type {any} */ (out)));
}

const args = process.argv.slice(2);
if (args[0] === "--batch") {
  const text = readFileSync(args[1] ?? 0, "utf8");
  const lines = [];
  for (const line of text.split("\n")) {
    if (!line.trim()) continue;
    const [input, output] = line.split("\t");
    let code = null;
    let crash = null;
    try {
      readOne(input, output);
    } catch (e) {
      if (e instanceof QFormatError) code = e.code;
      else crash = String(/** @type {Error} */ (e)?.stack ?? e);
    }
    lines.push(JSON.stringify({ input, code, crash }));
  }
  process.stdout.write(lines.join("\n") + (lines.length ? "\n" : ""));
} else if (args[0] === "--check" && args.length === 2) {
  for (const p of check(readFileSync(args[1]), { digests: true })) console.log(`${p.code}\t${p.message}`);
} else if (args.length === 2) {
  try {
    readOne(args[0], args[1]);
  } catch (e) {
    if (e instanceof QFormatError) {
      console.log(e.code);
      console.error(e.message);
      process.exit(1);
    }
    throw e;
  }
} else {
  console.error("usage: qformat-read INPUT OUTPUT | --batch [LIST] | --check FILE");
  process.exit(2);
}
