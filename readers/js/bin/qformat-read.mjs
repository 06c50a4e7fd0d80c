#!/usr/bin/env node
// qformat-read: the conformance command protocol (conformance/README.md).
//
//   qformat-read INPUT OUTPUT     decode INPUT (.safetensors, or a *.safetensors.index.json) and
//                                 write every tensor to OUTPUT as a plain safetensors file (exit 0),
//                                 or print the error code on standard output (exit 1; 2 for a
//                                 usage-category code such as FILE_UNREADABLE)
//   qformat-read --batch [LIST]   the same for many files in one process: each line of LIST (or of
//                                 standard input) is "INPUT<TAB>OUTPUT"; one JSON line per input:
//                                 {"input": ..., "code": null | "CODE", "crash": null | "stack"}
//   qformat-read --check FILE...  print every problem a checker finds, "CODE<TAB>message" per line
//                                 (with several files, "FILE<TAB>CODE<TAB>message"); exit 0 when
//                                 there is none, 1 when there are problems, 2 when a file cannot be read
//   qformat-read --help           the usage and the exit statuses
//
// Exit statuses are qformat's (qformat/cli.py EXIT_*): 0 done / no problem, 1 problems in the
// input, 2 usage, 3 internal error (bin/protocol.mjs statusOf, USAGE).
// The commands are bin/protocol.mjs's functions (the fuzzer calls the same ones).
import { main } from "./protocol.mjs";

process.exitCode = main(process.argv.slice(2));
