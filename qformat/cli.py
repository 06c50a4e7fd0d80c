"""The ``qformat`` command line.  It never shows a Python traceback: every failure is a
message with a stable error code, and the exit status says what happened (0 conforming,
1 problems found, 2 usage error or unreadable path)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import TYPE_CHECKING, Iterator, Sequence

from .check import Report, check

if TYPE_CHECKING:
    from .errors import QFormatError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's default exits 2 too; keep its usage line
        self.print_usage(sys.stderr)
        print(f"qformat: error: {message}", file=sys.stderr)
        raise SystemExit(2)


#: Exit statuses, the same for every command (README, "Exit statuses"; the JavaScript
#: qformat-read uses the same numbers).
EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def refusal_status(e: "QFormatError") -> int:
    """The exit status of a command that stopped on ``e``: a usage-category code (arguments, a
    path or URL that cannot be read, a destination) is a usage error, 2; a code about what a
    file holds (malformed, invalid, unsupported) is a problem with the input, 1."""
    return EXIT_USAGE if e.category == "usage" else EXIT_PROBLEMS


class _SubParser(_Parser):
    """A command's parser: :class:`_Help`'s defaults in its help."""

    def __init__(self, **kw: object) -> None:
        kw.setdefault("formatter_class", _Help)
        super().__init__(**kw)  # type: ignore[arg-type]


class _Help(argparse.HelpFormatter):
    """Help that shows each option's default where it has one (not None, not a flag's False) and
    the help text does not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if (d is None or d is False or d is argparse.SUPPRESS or "default" in text or not action.option_strings
                or isinstance(action, (argparse._HelpAction, argparse._VersionAction))):
            return text
        return f"{text} (default: %(default)s)"


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="qformat", formatter_class=_Help,
                description="Check, inspect, compare, quantize, dequantize, convert, merge and export quantized checkpoints "
                            "(qformat in safetensors files; GGUF and other formats through convert and export). Every path "
                            "a command reads may also be an http(s):// URL, read by byte ranges (see docs/remote-and-browser.md).",
                epilog="Exit statuses: 0 done, 1 problems in the input, 2 usage, 3 internal error, 130 interrupted.")
    from . import SPEC_REVISION, __version__

    p.add_argument("--version", action="version", version=f"qformat {__version__} (SPEC.md {SPEC_REVISION})")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_SubParser)
    c = sub.add_parser("check", help="check files, folders or sharded checkpoints (index.json) for conformance")
    c.add_argument("paths", nargs="+", metavar="PATH")
    c.add_argument("--json", action="store_true", help="print one JSON report instead of text")
    c.add_argument("--header-only", action="store_true", help="skip payload checks (padding, parameter values, indices)")
    c.add_argument("--digests", "--verify", dest="digests", action="store_true",
                   help="also verify the sha256 digests 1.2 files record for their stored tensors (SPEC.md §3.8): reads every "
                        "byte once (about the cost of reading the file; without it check reads only what it examines)")
    c.add_argument("--strict", action="store_true", help="also report what readers accept but writers never write (SPEC.md §2.4: "
                                                         "leading whitespace, non-space header padding, an empty tensor name)")
    cv = sub.add_parser("convert", help="convert an existing quantized checkpoint (GPTQ, AWQ, GGUF, ...) into qformat")
    cv.add_argument("src", metavar="SRC", nargs="?", help="a safetensors file, a folder, a *.safetensors.index.json or a .gguf file")
    cv.add_argument("dst", metavar="DST", nargs="?", help="the output: a file for a single-file source, else a folder")
    cv.add_argument("--from", dest="from_format", metavar="FORMAT", help="the source format (default: detected); see --list")
    cv.add_argument("--repack", action="store_true", help="rewrite into qformat's canonical layout instead of describing the source's bytes in place")
    cv.add_argument("--layout", choices=("auto", "hf", "gguf"), default="auto",
                    help="GGUF sources: hf writes a Hugging Face model folder (transformers names, config.json, tokenizer; "
                         "needs qformat[transformers]), gguf one .safetensors file with the GGUF names; auto (default): "
                         "gguf when DST ends in .safetensors, else hf")
    cv.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    cv.add_argument("--json", action="store_true", help="print a JSON summary instead of text")
    cv.add_argument("--quiet", action="store_true", help="no progress bar")
    cv.add_argument("--list", action="store_true", help="list the source formats and exit")
    _split_options(cv)
    _no_check(cv)
    q = sub.add_parser("quantize", help="quantize a plain checkpoint (folder, .safetensors, index.json) into qformat")
    q.add_argument("src", metavar="SRC", help="a model folder (config.json + model.safetensors or a sharded index), a .safetensors file or an index.json")
    q.add_argument("dst", metavar="DST", help="the output: a folder for a folder or sharded source (or with --max-shard-size), else a file")
    q.add_argument("--scheme", metavar="S", help="the scheme for the tensors the default selection rule picks (int, nf4, fp8_e4m3, mxfp4, ...)")
    q.add_argument("--bits", type=int, help="int: bits per code (2-8)")
    q.add_argument("--group-size", type=_int_or_none, default=argparse.SUPPRESS, metavar="N|none", help="int: values per scale along the last axis, or none for per channel")
    q.add_argument("--asymmetric", action="store_true", help="int: unsigned codes with a zero point")
    q.add_argument("--block-size", type=_block_size, default=argparse.SUPPRESS, metavar="N|none|RxC", help="nf4/mx/codebook: block size; fp8: a block such as 128x128")
    q.add_argument("--double-quant", action="store_true", help="nf4: quantize the absmax values too")
    q.add_argument("--values", type=_values, metavar="V,V,...", help="codebook: the table, 2 to 256 comma-separated numbers "
                   "(write --values=-1,-0.5,0,0.5,1 when the first is negative)")
    q.add_argument("--scale-dtype", metavar="D", help="int: the scale dtype (float16, bfloat16, float32); default bfloat16 for a bfloat16 tensor (what torch's CPU kernels take), else float16")
    q.add_argument("--granularity", metavar="G", help="fp8: tensor, channel or block")
    q.add_argument("--dtype", metavar="D", help="the logical dtype (float32, float16, bfloat16); default each tensor's own")
    q.add_argument("--recipe", metavar="FILE", help="a TOML recipe of ordered rules (see docs/quantizing.md)")
    q.add_argument("--type", metavar="T", help="gguf: the llama.cpp block type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)")
    q.add_argument("--preset", metavar="P", help="llama-quantize's mix for this model: Q4_K_M, Q5_K_M, Q3_K_M, Q4_K_S, Q6_K, Q8_0, ... "
                   "(a recipe of scheme gguf; instead of --scheme and --recipe)")
    q.add_argument("--save-recipe", metavar="FILE", help="with --preset: also write the recipe the preset gives this checkpoint "
                   "(TOML, editable, for --recipe)")
    q.add_argument("--imatrix", metavar="FILE", help="llama.cpp's importance matrix (llama-imatrix's GGUF or legacy .dat file), "
                   "applied to scheme gguf's tensors as llama-quantize --imatrix applies it")
    q.add_argument("--max-shard-size", metavar="SIZE", help="shard the output, e.g. 5GB or 500MB (default: the source's files)")
    q.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    q.add_argument("--strict", action="store_true", help="refuse (QUANTIZE_PARTIAL_GROUPS) a group or block size that leaves "
                   "partial groups, which is otherwise a warning naming the export targets that will refuse the result")
    q.add_argument("--json", action="store_true", help="print a JSON summary instead of text")
    q.add_argument("--quiet", action="store_true", help="no progress bar")
    _split_options(q)
    mg = sub.add_parser("merge", help="put the parts of a split quantize or convert (--part K/N) together as DST")
    mg.add_argument("dst", metavar="DST", help="the destination the parts were written for (they are in DST.parts/)")
    mg.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    mg.add_argument("--json", action="store_true", help="print a JSON summary instead of text")
    dq = sub.add_parser("dequantize", help="decode a qformat checkpoint into a plain safetensors checkpoint")
    dq.add_argument("src", metavar="SRC", help="a qformat folder, .safetensors file or index.json")
    dq.add_argument("dst", metavar="DST", help="the output: a folder for a folder or sharded source, else a file")
    dq.add_argument("--dtype", metavar="D", help="cast decoded tensors to float32, float16 or bfloat16 (default: their logical dtype)")
    dq.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    dq.add_argument("--json", action="store_true", help="print a JSON summary instead of text")
    dq.add_argument("--quiet", action="store_true", help="no progress bar")
    _no_check(dq)
    ex = sub.add_parser("export", help="export a checkpoint to GGUF, compressed-tensors, MLX or bitsandbytes, bit-exact or refused")
    ex.add_argument("src", metavar="SRC", nargs="?", help="anything qformat reads: a qformat file, folder or index.json, or a convert source")
    ex.add_argument("dst", metavar="DST", nargs="?", help="the output: a .gguf file for --to gguf; else a folder for a folder or sharded source, a file otherwise")
    ex.add_argument("--to", metavar="FORMAT", help="the target format (required unless --list; see --list)")
    ex.add_argument("--allow-rounding", action="store_true", help="export tensors that do not map exactly anyway, re-encoded where needed; each is reported with its max abs difference and SQNR")
    ex.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    ex.add_argument("--gguf-pre", metavar="NAME", help="--to gguf: the llama.cpp pre-tokenizer to record as tokenizer.ggml.pre "
                    "(default: the one llama.cpp's converter gives the tokenizer's fingerprint; needed when that is unknown; "
                    "'default' accepts llama.cpp's default pre-tokenizer)")
    ex.add_argument("--tensors-only", action="store_true", help="--to gguf: the tensors under their own names and no model "
                    "metadata, a container for gguf-py and other tensor readers (llama.cpp cannot run it); for a model whose "
                    "architecture has no llama.cpp mapping, which is refused otherwise")
    ex.add_argument("--json", action="store_true", help="print a JSON summary instead of text")
    ex.add_argument("--quiet", action="store_true", help="no progress bar")
    ex.add_argument("--list", action="store_true", help="list the export targets and exit")
    _no_check(ex)
    ins = sub.add_parser("inspect", help="list what a checkpoint holds (any kind convert reads), from headers only")
    ins.add_argument("path", metavar="PATH", help="a file, folder, *.safetensors.index.json or .gguf file (qformat, plain, or a convert source)")
    ins.add_argument("--json", action="store_true", help="print JSON (format_version 1; see docs/cli.md) instead of text")
    ins.add_argument("--from", dest="from_format", metavar="FORMAT", help="read PATH as this convert source format (default: detected)")
    _no_check(ins)
    df = sub.add_parser("diff", help="compare two checkpoints tensor by tensor (bit-exactness, max abs/ulp difference, SQNR)")
    df.add_argument("a", metavar="A", help="the reference checkpoint (the signal for SQNR); any kind inspect reads")
    df.add_argument("b", metavar="B", help="the checkpoint compared with A")
    df.add_argument("--json", action="store_true", help="print JSON (format_version 1; see docs/cli.md) instead of text")
    df.add_argument("--fail-below", type=float, metavar="DB", help="exit 1 when any tensor's SQNR is under DB dB (or shapes differ, or a tensor is unreadable)")
    df.add_argument("--plot", metavar="FILE.png", help="draw per-tensor SQNR as a bar chart (needs matplotlib)")
    df.add_argument("--quiet", action="store_true", help="no progress line")
    _no_check(df)
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
    rp = csub.add_parser("report", help="run the corpus against several implementations and write a table of "
                         "cases passed per spec section (conformance/REPORT.md and report.json)")
    from .conformance_report import add_arguments as _report_arguments

    _report_arguments(rp)
    sv = sub.add_parser("serve", help="serve a folder over HTTP with byte ranges, validators and CORS (for remote "
                        "commands and the viewer page; python -m http.server ignores ranges)")
    sv.add_argument("dir", metavar="DIR", help="the folder to serve (files under it only; links out of it are not followed)")
    sv.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: %(default)s, this machine only)")
    sv.add_argument("--port", type=int, default=8000, help="the port (default: %(default)s; 0 picks a free one)")
    sv.add_argument("--quiet", action="store_true", help="no line per request")
    for sp in (c, cv, q, mg, dq, ex, ins, df, r, rd):
        _remote_options(sp)
    return p


def _remote_options(p: argparse.ArgumentParser) -> None:
    """The options every command that takes a path has: how URLs are shown and read."""
    g = p.add_argument_group("remote files (http(s)://, s3://, hf://, ...)")
    g.add_argument("--show-secrets", action="store_true",
                   help="show URLs in full in reports, --json and messages (by default a URL is shown as scheme://host/path, "
                        "without user:password@ and with ?... for its query); bearer tokens are never shown")
    g.add_argument("--deadline", type=_deadline, metavar="SECONDS",
                   help="the most one remote read may take, retries included, plus 1 s per 64 KiB it receives "
                        "(default 60, or QFORMAT_HTTP_DEADLINE); past it: REMOTE_UNREACHABLE")


def _deadline(text: str) -> float:
    from .errors import QFormatError
    from .remote_deadline import deadline_seconds

    try:
        return deadline_seconds(text, "--deadline")
    except QFormatError as e:
        raise argparse.ArgumentTypeError(e.message) from None


def _split_options(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--part", metavar="K/N", help="write only part K of N of the output's shards, into DST.parts/ "
                   "(the same N on every host; then `qformat merge DST`); parts are assigned from the plan alone, balanced by bytes")
    g.add_argument("--workers", type=int, metavar="N", help="write the output as N parts in N processes on this machine, then merge them")


def _no_check(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-check", action="store_true",
                   help="read a source that `qformat check` refuses anyway, at your own risk (by default check's rules "
                        "apply: header rules on opening, a qformat file's payload rules per tensor as it is read)")


def _int_or_none(text: str) -> int | None:
    if text.lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'none', found {text!r}") from None


def _values(text: str) -> list[float]:
    try:
        return [float(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as -1,-0.5,0,0.5,1, found {text!r}") from None


def _block_size(text: str) -> int | list[int] | None:
    if "x" in text.lower() or "," in text:
        try:
            return [int(p) for p in text.lower().replace(",", "x").split("x")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected N, none or RxC (such as 128x128), found {text!r}") from None
    return _int_or_none(text)


def _print_text(report: Report) -> None:
    from .redact import shown

    for f in report.files:
        if f.ok:
            what = f"{f.quantized} quantized and {f.plain} plain tensors" if f.quantized else f"no quantized tensors, {f.plain} plain tensors"
            if f.digests_verified is not None:
                what += (f"; digests of {f.digests_verified} of {f.stored} stored tensors verified" if f.digests_verified
                         else "; no digests recorded")
            print(f"{shown(f.path)}: OK ({what})")
        else:
            print(f"{shown(f.path)}: {len(f.problems)} problem(s)")
            for p in f.problems:
                where = f" {p.tensor}" if p.tensor else ""
                fld = f" [{p.field}]" if p.field else ""
                print(f"  {p.code}{where}{fld}: {p.message}")
    listed = {id(p) for f in report.files for p in f.problems}
    for p in report.problems:
        if id(p) not in listed:
            where = f" {p.tensor}" if p.tensor else ""
            print(f"{p.file if p.file is None else shown(p.file)}: {p.code}{where}: {p.message}")
    if report.digests_verified is not None and len(report.files) > 1:
        stored = sum(f.stored for f in report.files)
        print(f"digests: {report.digests_verified} of {stored} stored tensors verified in {len(report.files)} files")


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
        layout = _gguf_layout(args)
        split = args.part is not None or args.workers is not None
        if layout == "hf":
            if split:
                from .errors import error

                raise error("SPLIT_PART_INVALID", "a GGUF model is one file written as one model.safetensors: "
                            "--part and --workers split a sharded output; run without them", field="part")
            return _convert_hf(args)
        if split:
            from .checkpoint.split import convert as split_convert

            s = split_convert(args.src, args.dst, from_format=args.from_format, repack=args.repack, overwrite=args.overwrite,
                              progress=None if (args.quiet or args.json) else sys.stderr, part=args.part, workers=args.workers)
        else:
            s = cv.convert(args.src, args.dst, from_format=args.from_format, repack=args.repack,
                           overwrite=args.overwrite, progress=None if (args.quiet or args.json) else sys.stderr)
    except QFormatError as e:
        print(f"qformat: {e}", file=sys.stderr)
        return refusal_status(e)
    except BrokenPipeError:  # stdout closed (`| head`): main() ends quietly
        raise
    except Exception as e:  # never a traceback
        print(f"qformat: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        return 3
    if args.json:
        print(json.dumps(_summary_json("convert", args.dst, s), indent=2))
        return 0
    if args.part is not None:
        _print_part(args.dst, s.parts[0])
        return 0
    print(f"{args.dst}: wrote {s.logical} quantized tensors, {s.stored} stored tensors, {s.bytes / 1e6:,.1f} MB in {len(s.files)} file(s)")
    _print_parts(s.parts)
    return 0


def _print_part(dst: str, p: dict) -> None:  # type: ignore[type-arg]
    print(f"{dst}: part {p['part']}/{p['parts']} written to {p['folder']}: {len(p['files'])} file(s), {p['bytes'] / 1e6:,.1f} MB "
          f"in {p['seconds']:.1f} s; when every part is done: qformat merge {dst}")


def _print_parts(parts: list) -> None:  # type: ignore[type-arg]
    for p in parts:
        print(f"  part {p['part']}/{p['parts']}: {len(p['files'])} file(s), {p['bytes'] / 1e6:,.1f} MB, "
              f"{p['seconds']:.1f} s wall, {p['cpu_seconds']:.1f} s CPU")


def _gguf_layout(args: argparse.Namespace) -> str | None:
    """The layout a GGUF source is written in (None: not a GGUF source); ``--layout hf`` of
    another source is a usage error."""
    from .checkpoint.source import Checkpoint
    from .errors import error

    gguf = args.from_format == "gguf" or (args.from_format is None and Checkpoint(args.src).kind == "gguf")
    if not gguf:
        if args.layout == "hf":
            raise error("CONVERT_UNSUPPORTED", "--layout hf is for GGUF model files (other sources keep their own tensor names)")
        return None
    if args.layout != "auto":
        return str(args.layout)
    return "gguf" if str(args.dst).endswith(".safetensors") else "hf"


def _summary_json(command: str, dst: str, summary: object) -> dict:
    """A command's summary dataclass as ``--json`` prints it (``format_version`` 1: members are
    only added, never changed)."""
    import dataclasses

    fields = dataclasses.asdict(summary) if dataclasses.is_dataclass(summary) and not isinstance(summary, type) else dict(vars(summary))
    return {"format_version": 1, "command": command, "destination": dst, **fields}


def _convert_hf(args: argparse.Namespace) -> int:
    """``qformat convert model.gguf out/``: the Hugging Face model folder (qformat_transformers)."""
    from .errors import error

    try:
        from qformat_transformers.gguf_layout import convert_gguf
    except ImportError as e:
        raise error("DEPENDENCY_MISSING", f"a GGUF model as a Hugging Face folder needs transformers and torch "
                    f"(pip install 'qformat[transformers]'): {e}; or give a DST ending in .safetensors to keep the GGUF names") from None
    s = convert_gguf(args.src, args.dst, overwrite=args.overwrite, progress=None if (args.quiet or args.json) else sys.stderr)
    if args.json:
        print(json.dumps(_summary_json("convert", args.dst, s), indent=2))
        return 0
    print(f"{args.dst}: {s.model_class} ({s.architecture}) for transformers: {s.quantized} quantized tensors kept packed, "
          f"{s.plain} plain, {s.bytes / 1e6:,.1f} MB; {', '.join(s.side_files)}")
    if s.permuted:
        print(f"  rows of {len(s.permuted)} q/k weights put back in transformers' order (whole rows moved, exact)")
    if s.left_out:
        print(f"  left out (transformers does not load them either): {', '.join(s.left_out)}")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    """``qformat inspect``: 0 on success; 2 when PATH cannot be read (a usage code), 1 when what
    it holds is refused (malformed, invalid, unsupported)."""
    from .errors import QFormatError
    from .inspection import inspect_checkpoint

    try:
        r = inspect_checkpoint(args.path, from_format=args.from_format)
    except QFormatError as e:
        print(f"qformat: {e}", file=sys.stderr)
        return refusal_status(e)
    except BrokenPipeError:  # stdout closed (`| head`): main() ends quietly
        raise
    except Exception as e:  # never a traceback
        print(f"qformat: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        return 3
    print(json.dumps(r.to_dict(), indent=2) if args.json else "\n".join(r.lines()))
    return 0


def _diff(args: argparse.Namespace) -> int:
    """``qformat diff``: 0 compared (and the gate passed), 1 the ``--fail-below`` gate failed,
    2 a checkpoint cannot be read or ``--plot`` cannot be drawn (DEPENDENCY_MISSING)."""
    from . import diff as qd
    from .errors import QFormatError

    show = not (args.quiet or args.json) and sys.stderr.isatty()
    done = [0]

    def progress(t: qd.TensorDiff) -> None:
        done[0] += 1
        if show:
            sys.stderr.write(f"\r{done[0]} tensors compared  {t.name[:80]:<80}")
            sys.stderr.flush()

    try:
        if args.plot:
            qd.require_matplotlib()  # before any decoding: fail fast
        r = qd.diff_checkpoints(args.a, args.b, fail_below=args.fail_below, progress=progress)
        if show:
            sys.stderr.write("\r" + " " * 100 + "\r")
        if args.plot:
            qd.plot(r, args.plot)
    except QFormatError as e:
        print(f"qformat: {e}", file=sys.stderr)
        return refusal_status(e)
    except KeyboardInterrupt:
        print("qformat: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed (`| head`): main() ends quietly
        raise
    except Exception as e:  # never a traceback
        print(f"qformat: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        return 3
    print(json.dumps(r.to_dict(), indent=2) if args.json else "\n".join(r.lines()))
    if args.plot and not args.json:
        print(f"plot: {args.plot}")
    return 0 if r.ok else 1


def _run_job(args: argparse.Namespace, job) -> int:  # type: ignore[no-untyped-def]
    """Run a whole-checkpoint job: SIGTERM interrupts it like Ctrl-C (the temporary folder is
    removed); errors are one line with their code, never a traceback."""
    import signal

    from .errors import QFormatError

    def _term(signum, frame):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    try:
        old = signal.signal(signal.SIGTERM, _term)
    except ValueError:  # not the main thread
        old = None
    try:
        return job()
    except QFormatError as e:
        print(f"qformat: {e}", file=sys.stderr)
        return refusal_status(e)
    except KeyboardInterrupt:
        print("qformat: interrupted; nothing was written", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed (`| head`): main() ends quietly
        raise
    except Exception as e:  # never a traceback
        print(f"qformat: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        return 3
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


def _quantize(args: argparse.Namespace) -> int:
    from .checkpoint.output import stderr_notice
    from .checkpoint.quantize import quantize_checkpoint

    params: dict[str, object] = {}
    for key, value in (("bits", args.bits), ("scale_dtype", args.scale_dtype), ("granularity", args.granularity), ("dtype", args.dtype),
                       ("values", args.values), ("type", args.type)):
        if value is not None:
            params[key] = value
    for key in ("group_size", "block_size"):  # given (None for "none") or absent (the scheme's default)
        if hasattr(args, key):
            params[key] = getattr(args, key)
    if args.asymmetric:
        params["symmetric"] = False
    if args.double_quant:
        params["double_quant"] = True
    if args.preset is not None and (args.scheme is not None or args.recipe is not None or params):
        print("qformat: error: --preset is a whole recipe; give it without --scheme, --recipe or scheme options", file=sys.stderr)
        return 2
    if args.save_recipe is not None and args.preset is None:
        print("qformat: error: --save-recipe goes with --preset", file=sys.stderr)
        return 2
    if args.scheme is None and args.recipe is None and args.preset is None:
        print("qformat: error: quantize needs --scheme, --recipe or --preset", file=sys.stderr)
        return 2
    if args.scheme is None and params:
        print(f"qformat: error: scheme options ({', '.join(sorted(params))}) need --scheme (in a recipe, put them in its rules)", file=sys.stderr)
        return 2

    def job() -> int:
        if args.save_recipe is not None:
            from . import gguf_presets
            from .atomic import atomic_write
            from .checkpoint.quantize import preset_recipe

            text = gguf_presets.recipe_toml(preset_recipe(args.src, args.preset, args.imatrix))
            with atomic_write(args.save_recipe, "w", encoding="utf-8") as f:
                f.write(text)
        s = quantize_checkpoint(args.src, args.dst, scheme=args.scheme, recipe=args.recipe, max_shard_size=args.max_shard_size,
                                overwrite=args.overwrite, progress=None if (args.quiet or args.json) else sys.stderr,
                                notice=stderr_notice, strict=args.strict, preset=args.preset, imatrix=args.imatrix,
                                part=args.part, workers=args.workers, **params)
        if args.json:
            print(json.dumps(s.to_dict(), indent=2))
        elif args.part is not None:
            _print_part(args.dst, s.parts[0])
        else:
            print(f"{args.dst}: quantized {s.quantized_tensors} tensors, kept {s.kept['tensors']}")
            print("\n".join(s.lines()))
            _print_parts(s.parts)
        return 0

    return _run_job(args, job)


def _merge(args: argparse.Namespace) -> int:
    from .checkpoint.output import stderr_notice
    from .checkpoint.split import merge

    def job() -> int:
        m = merge(args.dst, overwrite=args.overwrite, notice=stderr_notice)
        if args.json:
            print(json.dumps(m.to_dict(), indent=2))
        else:
            print(f"{args.dst}: merged {len(m.parts)} parts of {m.command}: {len(m.files)} file(s), {m.bytes / 1e6:,.1f} MB")
            _print_parts(m.parts)
        return 0

    return _run_job(args, job)


def _dequantize(args: argparse.Namespace) -> int:
    from .checkpoint.output import stderr_notice
    from .checkpoint.dequantize import dequantize_checkpoint

    def job() -> int:
        s = dequantize_checkpoint(args.src, args.dst, dtype=args.dtype, overwrite=args.overwrite,
                                  progress=None if (args.quiet or args.json) else sys.stderr, notice=stderr_notice)
        if args.json:
            print(json.dumps(s.to_dict(), indent=2))
        else:
            print(f"{args.dst}: dequantized {s.dequantized} tensors, copied {s.kept} plain tensors, "
                  f"{s.source_bytes / 1e6:,.1f} MB -> {s.bytes / 1e6:,.1f} MB in {len(s.files)} file(s)")
        return 0

    return _run_job(args, job)


def _export(args: argparse.Namespace) -> int:
    from . import export as ex

    if args.list:
        for name in ex.targets():
            print(f"{name:20s} {ex.get(name).title}")
        return 0
    if not args.src or not args.dst or not args.to:
        print("qformat: error: export needs SRC, DST and --to FORMAT (or --list)", file=sys.stderr)
        return 2
    options: dict[str, object] = {}
    if args.gguf_pre is not None:
        if args.to != "gguf":
            print("qformat: error: --gguf-pre applies to --to gguf only", file=sys.stderr)
            return 2
        options["gguf_pre"] = args.gguf_pre
    if args.tensors_only:
        if args.to != "gguf":
            print("qformat: error: --tensors-only applies to --to gguf only", file=sys.stderr)
            return 2
        options["tensors_only"] = True

    def job() -> int:
        r = ex.export(args.src, args.dst, to=args.to, allow_rounding=args.allow_rounding, overwrite=args.overwrite,
                      progress=None if (args.quiet or args.json) else sys.stderr, **options)
        if args.json:
            print(json.dumps(r.to_dict(), indent=2))
            return 0
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(r.kinds().items(), key=lambda kv: (-kv[1], kv[0])))
        print(f"{args.dst}: exported {len(r.results)} tensors to {r.target} ({kinds}), {r.bytes / 1e6:,.1f} MB in {len(r.files)} file(s)")
        if r.rounded:
            print(f"  rounded {len(r.rounded)} tensor(s) (--allow-rounding):")
            for t in r.rounded:
                how = f" re-encoded with {t.reencoded}" if t.reencoded else ""
                print(f"    {t.name}: {t.kind}{how}, max abs difference {t.max_abs:.4g}, SQNR {t.sqnr_db:.2f} dB")
        else:
            print("  every tensor bit-exact (decoded by the target's rule and compared with qformat's values)")
        return 0

    return _run_job(args, job)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command.  Everything it prints passes through :func:`qformat.redact.scrub` (URLs
    without user-info or query unless ``--show-secrets``; bearer tokens never)."""
    from .redact import redacted_output

    args = _parser().parse_args(argv)
    fetched_before = _fetched()
    with redacted_output(getattr(args, "show_secrets", False)), _deadline_option(getattr(args, "deadline", None)):
        try:
            if getattr(args, "no_check", False):
                from .checkpoint.source import unchecked

                with unchecked():
                    return _dispatch(args)
            return _dispatch(args)
        except BrokenPipeError:
            return _closed_pipe(args)
        finally:
            _remote_note(fetched_before)


@contextlib.contextmanager
def _deadline_option(seconds: float | None) -> Iterator[None]:
    """``--deadline``: the remote reads of this command get that total deadline."""
    if seconds is None:
        yield
        return
    import dataclasses

    from . import remote

    old = remote.DEFAULT_OPTIONS
    remote.DEFAULT_OPTIONS = dataclasses.replace(remote._options(None), deadline_s=seconds)
    try:
        yield
    finally:
        remote.DEFAULT_OPTIONS = old


def _fetched() -> tuple[int, int]:
    """(bytes, requests) fetched over HTTP by this process so far; (0, 0) before any remote read."""
    remote = sys.modules.get("qformat.remote")
    return (0, 0) if remote is None else remote.fetched_total()


def _remote_note(before: tuple[int, int]) -> None:
    """For http(s) arguments: how much this command fetched (on stderr, so --json output stays
    JSON).  The process's running total minus what it was when the command started: a program
    that calls :func:`main` more than once hears only about each command's own fetches."""
    total = _fetched()
    nbytes, requests = total[0] - before[0], total[1] - before[1]
    if requests:
        print(f"qformat: fetched {nbytes:,} bytes in {requests} HTTP request(s)", file=sys.stderr)


def _serve(args: argparse.Namespace) -> int:
    """``qformat serve DIR``: until interrupted (exit 0 on Ctrl-C); 2 when DIR is not a folder
    or the address cannot be bound."""
    import os

    from .serve import make_server

    if not os.path.isdir(args.dir):
        print(f"qformat serve: {args.dir!r} is not a folder", file=sys.stderr)
        return 2
    try:
        server = make_server(args.dir, args.host, args.port, quiet=args.quiet)
    except OSError as e:
        print(f"qformat serve: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 2
    host, port = server.server_address[:2]
    print(f"qformat serve: {os.path.realpath(args.dir)} at http://{host}:{port}/ (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


#: Commands whose work is a written checkpoint: done before their report is printed.
_WRITERS = ("convert", "quantize", "dequantize", "export", "merge")


def _closed_pipe(args: argparse.Namespace) -> int:
    """The reader of stdout went away (``qformat export ... | head -1``): no message, no
    traceback.  A writing command's checkpoint is already in place, so it exits 0; a reading
    command (check, inspect, diff, conformance), whose output is its result, exits 141
    (128 + SIGPIPE, as a shell tool killed by the closed pipe)."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail again
    except (OSError, ValueError):
        pass
    return 0 if args.command in _WRITERS else 141


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "quantize":
        return _quantize(args)
    if args.command == "dequantize":
        return _dequantize(args)
    if args.command == "merge":
        return _merge(args)
    if args.command == "conformance":
        from . import conformance

        try:
            if args.conf_command == "report":
                from . import conformance_report

                return conformance_report.main(args)
            return conformance.main(args)
        except BrokenPipeError:  # stdout closed (`| head`): main() ends quietly
            raise
        except Exception as e:  # never a traceback
            print(f"qformat: internal error: {type(e).__name__}: {e}", file=sys.stderr)
            return 3
    if args.command == "serve":
        return _serve(args)
    if args.command == "convert":
        return _convert(args)
    if args.command == "inspect":
        return _inspect(args)
    if args.command == "export":
        return _export(args)
    if args.command == "diff":
        return _diff(args)
    if args.command != "check":
        _parser().print_help()
        return 2
    try:
        report = check(args.paths, payload=not args.header_only, strict=args.strict, digests=args.digests)
    except BrokenPipeError:
        raise
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
