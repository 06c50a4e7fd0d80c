"""The ``qformat`` command line.  It never shows a Python traceback: every failure is a
message with a stable error code, and the exit status says what happened (0 conforming,
1 problems found, 2 usage error or unreadable path)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from .check import Report, check


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's default exits 2 too; keep its usage line
        self.print_usage(sys.stderr)
        print(f"qformat: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="qformat", description="Validate and inspect qformat / safetensors files.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    c = sub.add_parser("check", help="check files, folders or sharded checkpoints (index.json) for conformance")
    c.add_argument("paths", nargs="+", metavar="PATH")
    c.add_argument("--json", action="store_true", help="print one JSON report instead of text")
    c.add_argument("--header-only", action="store_true", help="skip payload checks (padding, parameter values, indices)")
    return p


def _print_text(report: Report) -> None:
    for f in report.files:
        if f.ok:
            what = f"{f.quantized} quantized and {f.plain} plain tensors" if f.quantized else f"no quantized tensors, {f.plain} plain tensors"
            print(f"{f.path}: OK ({what})")
        else:
            print(f"{f.path}: {len(f.problems)} problem(s)")
            for p in f.problems:
                where = f" {p.tensor}" if p.tensor else ""
                fld = f" [{p.field}]" if p.field else ""
                print(f"  {p.code}{where}{fld}: {p.message}")
    listed = {id(p) for f in report.files for p in f.problems}
    for p in report.problems:
        if id(p) not in listed:
            where = f" {p.tensor}" if p.tensor else ""
            print(f"{p.file}: {p.code}{where}: {p.message}")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command != "check":
        _parser().print_help()
        return 2
    try:
        report = check(args.paths, payload=not args.header_only)
    except Exception as e:  # a bug must still not print a traceback to users
        print(f"qformat: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        return 3
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        _print_text(report)
    if report.unreadable:
        return 2
    return 0 if report.ok else 1


def entry() -> None:
    try:
        code = main()
    except KeyboardInterrupt:
        code = 130
    raise SystemExit(code)


if __name__ == "__main__":
    entry()
