#!/usr/bin/env node
// qformat-read: the conformance command protocol (conformance/README.md).
//
//   qformat-read INPUT OUTPUT     decode INPUT (.safetensors, or a *.safetensors.index.json) and
//                                 write every tensor to OUTPUT as a plain safetensors file (exit 0),
//                                 or print the error code on standard output (exit 1)
//   qformat-read --batch [LIST]   the same for many files in one process: each line of LIST (or of
//                                 standard input) is "INPUT<TAB>OUTPUT"; one JSON line per input:
//                                 {"input": ..., "code": null | "CODE", "crash": null | "stack"}
//   qformat-read --check FILE     print every problem a checker finds (one code per line)
//
// The commands are bin/protocol.mjs's functions (the fuzzer calls the same ones).
import { main } from "./protocol.mjs";

process.exitCode = main(process.argv.slice(2));
