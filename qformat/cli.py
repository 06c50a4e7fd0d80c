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
    cv = sub.add_parser("convert", help="convert an existing quantized checkpoint (GPTQ, AWQ, GGUF, ...) into qformat")
    cv.add_argument("src", metavar="SRC", nargs="?", help="a safetensors file, a folder, a *.safetensors.index.json or a .gguf file")
    cv.add_argument("dst", metavar="DST", nargs="?", help="the output: a file for a single-file source, else a folder")
    cv.add_argument("--from", dest="from_format", metavar="FORMAT", help="the source format (default: detected); see --list")
    cv.add_argument("--repack", action="store_true", help="rewrite into qformat's canonical layout instead of describing the source's bytes in place")
    cv.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    cv.add_argument("--quiet", action="store_true", help="no progress bar")
    cv.add_argument("--list", action="store_true", help="list the source formats and exit")
    conf = sub.add_parser("conformance", help="run the conformance corpus against a reader")
    csub = conf.add_subparsers(dest="conf_command", metavar="SUBCOMMAND", required=True)
    r = csub.add_parser("run", help="run the corpus against a reader (one JSON line per case, then a summary)")
    who = r.add_mutually_exclusive_group(required=True)
    who.add_argument("--reader", metavar="CMD", help="a command; the runner appends INPUT OUTPUT (see conformance/README.md)")
    who.add_argument("--python", metavar="MODULE:FUNCTION", help="an in-process reader: FUNCTION(path) -> {name: array}")
    r.add_argument("--corpus", metavar="DIR", help="corpus folder holding manifest.json (default: QFORMAT_CORPUS or conformance/v1)")
    r.add_argument("--id", action="append", metavar="GLOB", help="only cases whose id matches (repeatable)")
    r.add_argument("--feature", action="append", metavar="TAG", help="only cases having this feature tag (repeatable: all must hold)")
    r.add_argument("--skip-feature", action="append", metavar="TAG", help="leave out cases having this tag (repeatable)")
    r.add_argument("--timeout", type=float, default=120.0, help="seconds per case for --reader (default 120)")
    r.add_argument("--jobs", type=int, default=1, help="cases run at once with --reader (default 1)")
    r.add_argument("--no-verify", action="store_true", help="skip the sha256 check of the corpus files")
    rd = csub.add_parser("read", help="the reference reader in the command protocol: decode INPUT, write OUTPUT")
    rd.add_argument("input", metavar="INPUT")
    rd.add_argument("output", metavar="OUTPUT")
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


def _convert(args: argparse.Namespace) -> int:
    from . import convert as cv
    from .errors import QFormatError

    if args.list:
        for name in cv.formats():
            print(f"{name:20s} {cv.get(name).title}")
        return 0
    if not args.src or not args.dst:
        print("qformat: error: convert needs SRC and DST (or --list)", file=sys.stderr)
        return 2
    try:
        s = cv.convert(args.src, args.dst, from_format=args.from_format, repack=args.repack,
                       overwrite=args.overwrite, progress=None if args.quiet else sys.stderr)
    except QFormatError as e:
        print(f"qformat: {e}", file=sys.stderr)
        return 2 if e.category == "usage" else 1
    except Exception as e:  # never a traceback
        print(f"qformat: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        return 3
    print(f"{args.dst}: wrote {s.logical} quantized tensors, {s.stored} stored tensors, {s.bytes / 1e6:,.1f} MB in {len(s.files)} file(s)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "conformance":
        from . import conformance

        try:
            return conformance.main(args)
        except Exception as e:  # never a traceback
            print(f"qformat: internal error: {type(e).__name__}: {e}", file=sys.stderr)
            return 3
    if args.command == "convert":
        return _convert(args)
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
