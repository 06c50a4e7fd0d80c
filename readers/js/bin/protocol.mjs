// The conformance command protocol (conformance/README.md) as functions: bin/qformat-read.mjs
// runs them for its command line, and the JavaScript fuzzer (fuzz/fuzz.mjs) calls the same ones
// in its own process, so what it exercises is exactly what the command does.
import { readFileSync, writeFileSync } from "node:fs";
import { check, encodeSafetensors, loadCheckpoint, QFormatError } from "../src/node.js";
import { ERRORS } from "../src/tables.js";

/**
 * Decode INPUT (.safetensors, or a *.safetensors.index.json) and write every tensor to OUTPUT as a
 * plain safetensors file.
 * @param {string} input @param {string} output
 */
export function readOne(input, output) {
  const tensors = loadCheckpoint(input);
  const out = [...tensors].map(([name, t]) => [name, { dtype: t.dtype, shape: t.storedShape ?? t.shape, data: t.data }]);
  writeFileSync(output, encodeSafetensors(/** @type {any} */ (out)));
}

/**
 * One line of --batch: "INPUT<TAB>OUTPUT" -> {input, code, crash}: code is the QFormatError's code
 * (null: decoded and written), crash the stack of anything else (a defect of the reader).
 * @param {string} line @returns {{input: string, code: string|null, crash: string|null}}
 */
export function batchEntry(line) {
  const [input, output] = line.split("\t");
  let code = null;
  let crash = null;
  try {
    readOne(input, output);
  } catch (e) {
    if (e instanceof QFormatError) code = e.code;
    else crash = String(/** @type {Error} */ (e)?.stack ?? e);
  }
  return { input, code, crash };
}

/**
 * --check FILE: every problem a checker finds, one "CODE<TAB>message" per line.
 * @param {string} path @returns {string[]}
 */
export function checkLines(path) {
  let bytes;
  try {
    bytes = readFileSync(path);
  } catch (e) {
    return [`FILE_UNREADABLE\tcannot read ${JSON.stringify(path)}: ${/** @type {Error} */ (e).message}`];
  }
  return check(bytes, { digests: true }).map((p) => `${p.code}\t${p.message}`);
}

/**
 * The command line: returns the exit status.
 * @param {string[]} args
 */
export function main(args) {
  if (args[0] === "--batch") {
    const text = readFileSync(args[1] ?? 0, "utf8");
    const lines = [];
    for (const line of text.split("\n")) if (line.trim()) lines.push(JSON.stringify(batchEntry(line)));
    process.stdout.write(lines.join("\n") + (lines.length ? "\n" : ""));
    return 0;
  }
  // exit statuses as qformat's (README, "Exit statuses"): 0 done or no problem, 1 problems in
  // the input, 2 usage (arguments, a file that cannot be read: a usage-category code), 3 internal
  if (args[0] === "--check" && args.length === 2) {
    const lines = checkLines(args[1]);
    for (const l of lines) console.log(l);
    if (!lines.length) return 0;
    return lines.some((l) => ERRORS[l.split("\t")[0]] === "usage") ? 2 : 1;
  }
  if (args.length === 2) {
    try {
      readOne(args[0], args[1]);
    } catch (e) {
      if (e instanceof QFormatError) {
        console.log(e.code);
        console.error(e.message);
        return ERRORS[e.code] === "usage" ? 2 : 1;
      }
      console.error(`qformat-read: internal error: ${e instanceof Error ? e.stack : e}`);
      return 3;
    }
    return 0;
  }
  console.error("usage: qformat-read INPUT OUTPUT | --batch [LIST] | --check FILE");
  return 2;
}
