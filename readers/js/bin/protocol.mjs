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

/** The exit statuses, the same numbers as qformat's (qformat/cli.py EXIT_*; README, "Exit statuses"). */
export const EXIT_OK = 0;
export const EXIT_PROBLEMS = 1;
export const EXIT_USAGE = 2;
export const EXIT_INTERNAL = 3;

/**
 * The exit status of a refusal or of a checker's problems, by their codes' categories (SPEC.md
 * §16): a usage-category code (FILE_UNREADABLE, ...) is a usage error, 2; a code about what a file
 * holds (malformed, invalid, unsupported: NOT_SAFETENSORS is malformed since 1.2.1) is 1.
 * @param {string[]} codes
 */
export function statusOf(codes) {
  if (!codes.length) return EXIT_OK;
  return codes.some((c) => ERRORS[c] === "usage") ? EXIT_USAGE : EXIT_PROBLEMS;
}

export const USAGE = `usage: qformat-read INPUT OUTPUT | --batch [LIST] | --check FILE... | --help

  qformat-read INPUT OUTPUT   decode INPUT (.safetensors, or a *.safetensors.index.json) and write
                              every tensor to OUTPUT as a plain safetensors file; on a refusal print
                              its error code on standard output (the message on standard error)
  qformat-read --batch [LIST] the same for many files in one process: each line of LIST (or of
                              standard input) is "INPUT<TAB>OUTPUT"; one JSON line per input:
                              {"input": ..., "code": null | "CODE", "crash": null | "stack"}
  qformat-read --check FILE...
                              print every problem a checker finds, one "CODE<TAB>message" per line
                              (digests verified)

Exit statuses (the same as qformat's): 0 done, or --check found no problem; 1 problems in the
input (a refusal or a problem with a malformed, invalid or unsupported code, NOT_SAFETENSORS
included); 2 usage (bad arguments, a file that cannot be read: FILE_UNREADABLE or another
usage-category code); 3 internal error (a bug in the reader). --batch exits 0 once it answered
every line (each answer carries its own code).`;

/**
 * The command line: returns the exit status.
 * @param {string[]} args
 */
export function main(args) {
  if (args[0] === "--help" || args[0] === "-h") {
    console.log(USAGE);
    return EXIT_OK;
  }
  if (args[0] === "--batch" && args.length <= 2) {
    const text = readFileSync(args[1] ?? 0, "utf8");
    const lines = [];
    for (const line of text.split("\n")) if (line.trim()) lines.push(JSON.stringify(batchEntry(line)));
    process.stdout.write(lines.join("\n") + (lines.length ? "\n" : ""));
    return EXIT_OK;
  }
  if (args[0] === "--check" && args.length >= 2 && !args.slice(1).some((a) => a.startsWith("--"))) {
    /** @type {string[]} */
    const codes = [];
    try {
      for (const path of args.slice(1)) {
        for (const l of checkLines(path)) {
          console.log(args.length > 2 ? `${path}\t${l}` : l);
          codes.push(l.split("\t")[0]);
        }
      }
    } catch (e) {
      console.error(`qformat-read: internal error: ${e instanceof Error ? e.stack : e}`);
      return EXIT_INTERNAL;
    }
    return statusOf(codes);
  }
  if (args.length === 2 && !args.some((a) => a.startsWith("--"))) {
    try {
      readOne(args[0], args[1]);
    } catch (e) {
      if (e instanceof QFormatError) {
        console.log(e.code);
        console.error(e.message);
        return statusOf([e.code]);
      }
      console.error(`qformat-read: internal error: ${e instanceof Error ? e.stack : e}`);
      return EXIT_INTERNAL;
    }
    return EXIT_OK;
  }
  console.error(USAGE);
  return EXIT_USAGE;
}
