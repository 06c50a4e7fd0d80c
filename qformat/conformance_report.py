"""``qformat conformance report``: the corpus against several readers at once, as a table.

For each implementation (the three built-in ones, the Python reference, the JavaScript reader
and libqformat's ``qformat-c``, plus any ``--reader NAME=CMD`` / ``--python NAME=MODULE:FUNC``)
every selected case is run through :mod:`qformat.conformance` (its ``run_python`` and
``run_command``: this module compares nothing itself) and counted per spec section.  A case
counts under every section its ``spec`` lists and, once, under each of those sections'
top-level section (``3.7`` -> ``§3``; ``A.1`` -> ``§A``).

Two files come out: a Markdown page for people (``conformance/REPORT.md``: a table with a row
per section and a column per implementation, cells ``passed/total``, the failing ids) and a JSON
document for programs (``conformance/report.json``, ``format_version`` 1, keys sorted).
The exit status is 0 when both are written, whatever the readers scored (the failures are the
report's content), 2 for usage errors.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from .errors import QFormatError, error

if TYPE_CHECKING:
    from types import ModuleType

REPORT_FORMAT_VERSION = 1

#: The repository this package sits in (the built-in readers and SPEC.md are found from here).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,39}$")
_HEADING = re.compile(r"^#{2,4} (?:Appendix )?([0-9]+|[A-Z])((?:\.[0-9]+)*)\.? +(.+?)\s*$")


@dataclass
class Impl:
    """One column of the report."""

    name: str
    label: str
    kind: str  # "python" (in-process) or "command"
    target: str  # MODULE:FUNC or the command line as given
    version: str | None = None
    skipped: str | None = None
    notes: list[str] = field(default_factory=list)
    runner: Callable[[dict], dict[str, Any]] | None = None
    results: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


def _conf() -> "ModuleType":
    """qformat.conformance (numpy, jsonschema), imported when a report runs, not when the CLI
    builds its parser."""
    from . import conformance

    return conformance


# ----------------------------------------------------------------------------------- sections


def top_level(section: str) -> str:
    """``3.7.5`` -> ``3``; ``A.1`` -> ``A``."""
    return section.split(".")[0]


def section_key(section: str) -> tuple:
    """Numeric order; appendices (letters) after the numbered sections."""
    parts = section.split(".")
    head = parts[0]
    first = (0, int(head), "") if head.isdigit() else (1, 0, head)
    return (first, *(int(p) if p.isdigit() else 10**9 for p in parts[1:]))


def case_sections(c: dict) -> tuple[list[str], list[str]]:
    """(the sections the case lists, their top-level sections), each without duplicates."""
    listed = sorted(set(c["spec"]), key=section_key)
    tops = sorted({top_level(s) for s in listed}, key=section_key)
    return listed, tops


def spec_titles(corpus: str) -> dict[str, str]:
    """Section number -> heading text, from the SPEC.md beside the corpus (or this checkout's)."""
    for path in (os.path.join(corpus, os.pardir, os.pardir, "SPEC.md"), os.path.join(ROOT, "SPEC.md")):
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            continue
        titles: dict[str, str] = {}
        for line in text.splitlines():
            m = _HEADING.match(line)
            if m:
                titles.setdefault(m.group(1) + m.group(2), m.group(3))
        return titles
    return {}


# ------------------------------------------------------------------------------ implementations


def _rel(path: str) -> str:
    """A path as shown in the report: relative to the working folder when under it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith(os.pardir) else rel


def _output(cmd: list[str], timeout: float = 30) -> str | None:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = (p.stdout or p.stderr).strip()
    return out.splitlines()[0] if p.returncode == 0 and out else None


def _python_impl(name: str, spec: str, label: str | None = None) -> Impl:
    impl = Impl(name, label or name, "python", spec)
    try:
        fn = _conf().resolve_python(spec)
    except QFormatError as e:
        raise error("FILE_UNREADABLE", f"--python {name}={spec}: {e.message}") from None
    mod = sys.modules.get(spec.partition(":")[0])
    root = (getattr(mod, "__package__", None) or "").split(".")[0]
    ver = getattr(sys.modules.get(root), "__version__", None) if root else None
    impl.version = f"{root} {ver}" if ver else None
    return impl


def _command_impl(name: str, cmdline: str, label: str | None = None) -> Impl:
    try:
        argv = shlex.split(cmdline)
    except ValueError as e:
        raise error("FILE_UNREADABLE", f"--reader {name}={cmdline}: cannot split the command: {e}") from None
    if not argv:
        raise error("FILE_UNREADABLE", f"--reader {name}=: the command is empty")
    if shutil.which(argv[0]) is None and not os.path.exists(argv[0]):
        raise error("FILE_UNREADABLE", f"--reader {name}={cmdline}: {argv[0]!r} was not found (not on PATH, not a file)")
    return Impl(name, label or name, "command", cmdline)


def _builtin_python() -> Impl:
    from . import SPEC_VERSION, __version__

    impl = _python_impl("python", "qformat.conformance:reference_reader", "Python (reference)")
    impl.version = f"qformat {__version__} (SPEC {SPEC_VERSION})"
    return impl


def _builtin_js() -> Impl:
    script = os.path.join(ROOT, "readers", "js", "bin", "qformat-read.mjs")
    impl = Impl("javascript", "JavaScript", "command", f"node {shlex.quote(_rel(script))}")
    node = shutil.which("node")
    if not os.path.isfile(script):
        impl.skipped = f"{_rel(script)} is not there (this installation has no JavaScript reader)"
        return impl
    if node is None:
        impl.skipped = "node was not found on PATH"
        return impl
    try:
        with open(os.path.join(ROOT, "readers", "js", "package.json"), encoding="utf-8") as f:
            pkg = json.load(f)
        ver = f"{pkg.get('name', 'qformat-reader')} {pkg.get('version', '?')}"
    except (OSError, ValueError):
        ver = "qformat-reader (version unknown)"
    impl.version = f"{ver}, node {_output([node, '--version']) or '?'}"
    impl.target = f"node {shlex.quote(_rel(script))}"
    return impl


def _compiler() -> str | None:
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return shutil.which(cc)
    return None


def _builtin_c(build: bool, jobs: int, emit: Callable[[str], None]) -> Impl:
    """libqformat's ``qformat-c read``, from ``libqformat/build`` (configured with CMake when it
    is not yet; rebuilt incrementally unless ``build`` is False)."""
    src = os.path.join(ROOT, "libqformat")
    bdir = os.path.join(src, "build")
    exe = os.path.join(bdir, "qformat-c")
    impl = Impl("c", "C (libqformat)", "command", f"{shlex.quote(_rel(exe))} read")
    if not os.path.isfile(os.path.join(src, "CMakeLists.txt")):
        impl.skipped = f"{_rel(src)} is not there (this installation has no C library)"
        return impl
    cmake, cc = shutil.which("cmake"), _compiler()
    if build and cmake and cc:
        steps = []
        if not os.path.isfile(os.path.join(bdir, "CMakeCache.txt")):
            gen = ["-G", "Ninja"] if shutil.which("ninja") else []
            steps.append([cmake, "-S", src, "-B", bdir, *gen, "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_C_COMPILER={cc}"])
        steps.append([cmake, "--build", bdir, f"-j{max(1, jobs)}", "--target", "qformat-c"])
        emit(f"building {_rel(exe)} with cmake ...")
        for cmd in steps:
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
            except (OSError, subprocess.TimeoutExpired) as e:
                impl.skipped = f"building libqformat failed: {e}"
                return impl
            if p.returncode != 0:
                tail = " ".join((p.stdout + p.stderr).strip().splitlines()[-3:])
                impl.skipped = f"building libqformat failed (`{' '.join(shlex.quote(_rel(a)) for a in cmd)}`): {tail[-300:]}"
                return impl
    elif not os.path.isfile(exe):
        missing = " and ".join(n for n, ok in (("cmake", cmake), ("a C compiler", cc)) if not ok)
        why = "--no-build was given" if not build else f"{missing} not found on PATH"
        impl.skipped = f"libqformat is not built ({_rel(exe)} is missing) and {why}; see libqformat/README.md"
        return impl
    else:
        impl.notes.append("used as built (not rebuilt: " + ("--no-build" if not build else "cmake or a C compiler missing") + ")")
    if not os.access(exe, os.X_OK):
        impl.skipped = f"{_rel(exe)} is missing or not executable after the build"
        return impl
    impl.version = _output([exe, "--version"])
    return impl


def _named(value: str, option: str) -> tuple[str, str]:
    name, sep, rest = value.partition("=")
    name = name.strip()
    if not sep or not _NAME.match(name) or not rest.strip():
        raise error("FILE_UNREADABLE", f"{option} expects NAME={'CMD' if option == '--reader' else 'MODULE:FUNC'} "
                    f"(NAME: letters, digits, '_.+-', at most 40), found {value!r}")
    return name, rest.strip()


def implementations(args: Any, emit: Callable[[str], None]) -> list[Impl]:
    """The columns, in order: the built-in ones (unless --no-builtin), then --python, then --reader."""
    impls: list[Impl] = []
    if args.builtin:
        impls += [_builtin_python(), _builtin_js(), _builtin_c(not args.no_build, args.jobs, emit)]
    for value in args.python or []:
        impls.append(_python_impl(*_named(value, "--python")))
    for value in args.reader or []:
        impls.append(_command_impl(*_named(value, "--reader")))
    seen: set[str] = set()
    for impl in impls:
        if impl.name in seen:
            raise error("FILE_UNREADABLE", f"two implementations are named {impl.name!r} (the built-in ones are python, javascript, c)")
        seen.add(impl.name)
    if not impls:
        raise error("FILE_UNREADABLE", "no implementation to run: give --reader NAME=CMD or --python NAME=MODULE:FUNC, or drop --no-builtin")
    return impls


# ---------------------------------------------------------------------------------------- runs


def run_all(impls: list[Impl], corpus: str, cases: list[dict], jobs: int, timeout: float,
            emit: Callable[[str], None]) -> None:
    """Run every case for every implementation not skipped.  In-process readers run one case at
    a time on one thread; command readers ``jobs`` at a time, beside it."""
    active = [i for i in impls if not i.skipped]
    for impl in active:
        if impl.kind == "python":
            fn = _conf().resolve_python(impl.target)
            impl.runner = lambda c, fn=fn: _conf().run_python(fn, corpus, c)
        else:
            argv = shlex.split(impl.target)
            impl.runner = lambda c, argv=argv: _conf().run_command(argv, corpus, c, timeout)
        impl.results = [{}] * len(cases)
    lock = threading.Lock()
    done = {i.name: 0 for i in active}
    started: dict[str, float] = {}  # an implementation's time runs from its first case's start
    step = max(100, len(cases) // 5)

    def one(impl: Impl, k: int) -> None:
        assert impl.runner is not None
        with lock:
            started.setdefault(impl.name, time.perf_counter())
        res = impl.runner(cases[k])
        with lock:
            impl.results[k] = res
            done[impl.name] += 1
            n = done[impl.name]
            if n == len(cases):
                impl.seconds = round(time.perf_counter() - started[impl.name], 1)
                failed = sum(r["result"] != "pass" for r in impl.results)
                emit(f"{impl.name}: {n - failed}/{n} passed ({impl.seconds} s)")
            elif n % step == 0:
                emit(f"{impl.name}: {n}/{len(cases)} ...")

    def serial(impl_list: list[Impl]) -> None:
        for impl in impl_list:
            for k in range(len(cases)):
                one(impl, k)

    in_process = [i for i in active if i.kind == "python"]
    commands = [i for i in active if i.kind == "command"]
    with ThreadPoolExecutor(1) as py_pool, ThreadPoolExecutor(max(1, jobs)) as pool:
        py_future = py_pool.submit(serial, in_process)
        futures = [pool.submit(one, impl, k) for impl in commands for k in range(len(cases))]
        for f in futures:
            f.result()
        py_future.result()


# -------------------------------------------------------------------------------------- tables


def build_report(impls: list[Impl], manifest: dict, corpus: str, cases: list[dict], command: str,
                 filters: dict[str, list[str]], titles: dict[str, str], now: datetime.datetime) -> dict[str, Any]:
    """The JSON document (format_version 1)."""
    per_case = [case_sections(c) for c in cases]
    keys: set[str] = set()
    for listed, tops in per_case:
        keys.update(listed)
        keys.update(tops)
    tops_all = sorted({top_level(k) for k in keys}, key=section_key)
    order: list[str] = []
    for t in tops_all:
        order.append(t)
        order += sorted((k for k in keys if top_level(k) == t and k != t), key=section_key)

    def counted(listed: list[str], tops: list[str]) -> list[str]:
        # a case listing "9" itself counts once under §9 (top level) and not again as a subsection row
        return [f"§{t}" for t in tops] + [s for s in listed if s not in tops]

    rows = []
    for key in order:
        is_top = key == top_level(key)
        rows.append({"section": key, "top_level": is_top, "title": titles.get(key),
                     "row": f"§{key}" if is_top else key, "cases": 0, "passed": {}})
    index = {r["row"]: r for r in rows}
    for listed, tops in per_case:
        for k in counted(listed, tops):
            index[k]["cases"] += 1
    impl_docs = []
    for impl in impls:
        doc: dict[str, Any] = {"name": impl.name, "label": impl.label, "kind": impl.kind,
                               "command" if impl.kind == "command" else "function": impl.target,
                               "version": impl.version, "notes": impl.notes, "skipped": impl.skipped}
        if impl.skipped:
            doc.update(passed=None, failed=None, total=len(cases), failures=[], seconds=None)
            for r in rows:
                r["passed"][impl.name] = None
        else:
            for r in rows:
                r["passed"][impl.name] = 0
            failures = []
            for c, res, (listed, tops) in zip(cases, impl.results, per_case):
                if res["result"] == "pass":
                    for k in counted(listed, tops):
                        index[k]["passed"][impl.name] += 1
                else:
                    failures.append({"id": c["id"], "spec": sorted(set(c["spec"]), key=section_key), "expect": c["expect"],
                                     "expected_error": c["error"], "got": res.get("got"), "detail": res.get("detail")})
            doc.update(passed=len(cases) - len(failures), failed=len(failures), total=len(cases), failures=failures,
                       seconds=impl.seconds)
        impl_docs.append(doc)
    return {
        "format_version": REPORT_FORMAT_VERSION,
        "generated": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
        "qformat_commit": _git_commit(),
        "corpus": {"path": _rel(corpus), "corpus_version": manifest["corpus_version"],
                   "spec_version": manifest["spec_version"], "cases_in_corpus": len(manifest["cases"]),
                   "cases_selected": len(cases), "filters": filters},
        "counting": "a case counts under every section its spec lists and once under each of their top-level sections (§N)",
        "implementations": impl_docs,
        "sections": rows,
    }


def _git_commit() -> str | None:
    if not os.path.isdir(os.path.join(ROOT, ".git")) or not shutil.which("git"):
        return None
    head = _output(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"])
    if head is None:
        return None
    try:
        p = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True, timeout=30, stdin=subprocess.DEVNULL)
        dirty = bool(p.stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        dirty = False
    return head + (" (with local changes)" if dirty else "")


def _cell(passed: int | None, total: int, bold: bool = False) -> str:
    if passed is None:
        return "–"
    text = f"{passed}/{total}"
    if bold:
        text = f"**{text}**"
    return f"{text} ✅" if passed == total and total else text


def _md_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def render_markdown(doc: dict[str, Any]) -> str:
    impls = doc["implementations"]
    cor = doc["corpus"]
    out = ["# qformat conformance report", ""]
    sel = f"{cor['cases_selected']} cases" if cor["cases_selected"] == cor["cases_in_corpus"] else \
        f"{cor['cases_selected']} of its {cor['cases_in_corpus']} cases"
    out.append(f"Corpus **{cor['corpus_version']}** (SPEC.md {cor['spec_version']}, `{cor['path']}`), {sel}; "
               f"generated {doc['generated']}" + (f" at qformat commit `{doc['qformat_commit']}`" if doc["qformat_commit"] else "")
               + " by:")
    out += ["", "```sh", doc["command"], "```", ""]
    active = [f"--{k.replace('_', '-')} {v}" for k, vs in doc["corpus"]["filters"].items() for v in vs]
    if active:
        out += [f"Only the cases selected by {', '.join(f'`{a}`' for a in active)}.", ""]
    out += ["This file is generated: do not edit it; see [README.md](README.md#conformance-report).", ""]

    out += ["## Summary", "", "| Implementation | Passed | Failed | Cases | |", "| --- | ---: | ---: | ---: | :---: |"]
    for i in impls:
        if i["skipped"]:
            out.append(f"| {_md_escape(i['label'])} | – | – | {i['total']} | not run |")
        else:
            mark = "✅" if i["failed"] == 0 else "❌"
            out.append(f"| {_md_escape(i['label'])} | {i['passed']} | {i['failed']} | {i['total']} | {mark} |")
    out.append("")

    out += ["## By spec section", "",
            "A cell is cases passed / cases in that section. A case counts under every section its `spec` lists and "
            "once under each of their top-level sections (**§N**), so the rows do not add up to the total. ✅: all pass.", ""]
    out.append("| Section | " + " | ".join(_md_escape(i["label"]) for i in impls) + " |")
    out.append("| --- | " + " | ".join("---:" for _ in impls) + " |")
    for r in doc["sections"]:
        title = f" {_md_escape(r['title'])}" if r["title"] else ""
        if r["top_level"]:
            name = f"Appendix {r['section']}" if not r["section"].isdigit() else f"§{r['section']}"
            head = f"**{name}**{title}"
        else:
            head = f"&emsp;{r['section']}{title}"
        cells = [_cell(r["passed"][i["name"]], r["cases"], r["top_level"]) for i in impls]
        out.append(f"| {head} | " + " | ".join(cells) + " |")
    out.append("| **Total** | " + " | ".join(_cell(i["passed"], i["total"], True) for i in impls) + " |")
    out.append("")

    out += ["## Implementations", ""]
    for i in impls:
        how = f"command `{i['command']} INPUT OUTPUT`" if i["kind"] == "command" else f"in-process `{i['function']}`"
        line = f"- **{_md_escape(i['label'])}** (`{i['name']}`): {how}"
        if i["version"]:
            line += f"; {_md_escape(i['version'])}"
        if i["seconds"] is not None:
            line += f"; {i['seconds']} s"
        for n in i["notes"]:
            line += f"; {_md_escape(n)}"
        if i["skipped"]:
            line += f". **Not run:** {_md_escape(i['skipped'])}"
        out.append(line)
    out.append("")

    out += ["## Failures", ""]
    any_fail = False
    for i in impls:
        if not i["failures"]:
            continue
        any_fail = True
        out += [f"<details><summary><b>{_md_escape(i['label'])}</b>: {len(i['failures'])} failing case"
                f"{'s' if len(i['failures']) != 1 else ''}</summary>", ""]
        for f in i["failures"]:
            want = "decode" if f["expect"] == "valid" else f"error:{f['expected_error']}"
            detail = f" ({_md_escape(str(f['detail'])[:160])})" if f["detail"] and f["got"] == "crash" else ""
            out.append(f"- `{f['id']}` (§{', '.join(f['spec'])}): got {_md_escape(str(f['got']))}, expected {want}{detail}")
        out += ["", "</details>", ""]
    if not any_fail:
        out += ["None: every implementation that ran passes every selected case.", ""]
    out.append("The details of every failure (the runner's `detail`) are in [report.json](report.json).")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------ command


def _command_line(args: Any) -> str:
    parts = ["qformat", "conformance", "report"]
    if args.corpus:
        parts += ["--corpus", args.corpus]
    if not args.builtin:
        parts.append("--no-builtin")
    if args.no_build:
        parts.append("--no-build")
    for opt in ("python", "reader", "id", "feature", "skip_feature"):
        for v in getattr(args, opt) or []:
            parts += [f"--{opt.replace('_', '-')}", v]
    if args.out != DEFAULT_OUT:
        parts += ["--out", args.out]
    if args.json != DEFAULT_JSON:
        parts += ["--json", args.json]
    if args.jobs != DEFAULT_JOBS:
        parts += ["--jobs", str(args.jobs)]
    if args.timeout != _conf().CASE_TIMEOUT_S:
        parts += ["--timeout", f"{args.timeout:g}"]
    if args.no_verify:
        parts.append("--no-verify")
    return " ".join(shlex.quote(p) for p in parts)


DEFAULT_OUT = os.path.join("conformance", "REPORT.md")
DEFAULT_JSON = os.path.join("conformance", "report.json")
DEFAULT_JOBS = 2


def add_arguments(p: Any) -> None:
    """The options of ``qformat conformance report`` (qformat.cli wires the parser)."""
    import argparse

    p.add_argument("--corpus", metavar="DIR", help="corpus folder holding manifest.json (default: QFORMAT_CORPUS or conformance/v1)")
    p.add_argument("--builtin", action=argparse.BooleanOptionalAction, default=True,
                   help="run the built-in implementations: python (the reference), javascript (node readers/js/bin/"
                        "qformat-read.mjs) and c (libqformat/build/qformat-c read, built with cmake when needed)")
    p.add_argument("--no-build", action="store_true", help="do not run cmake for the C column: use libqformat/build/qformat-c as it is")
    p.add_argument("--reader", action="append", metavar="NAME=CMD",
                   help="another implementation, a command: the runner appends INPUT OUTPUT (repeatable)")
    p.add_argument("--python", action="append", metavar="NAME=MODULE:FUNC",
                   help="another implementation, in-process: FUNC(path) -> {name: array} (repeatable)")
    p.add_argument("--id", action="append", metavar="GLOB", help="only cases whose id matches (repeatable)")
    p.add_argument("--feature", action="append", metavar="TAG", help="only cases having this feature tag (repeatable: all must hold)")
    p.add_argument("--skip-feature", action="append", metavar="TAG", help="leave out cases having this tag (repeatable)")
    p.add_argument("--out", metavar="FILE.md", default=DEFAULT_OUT, help="the Markdown report (- for standard output)")
    p.add_argument("--json", metavar="FILE.json", default=DEFAULT_JSON, help="the JSON report (- for standard output)")
    p.add_argument("--jobs", type=int, default=DEFAULT_JOBS, help="cases run at once by the command readers (in-process readers run beside them, a case at a time)")
    p.add_argument("--timeout", type=float, default=float(_conf().CASE_TIMEOUT_S), help="seconds per case for command readers")
    p.add_argument("--no-verify", action="store_true", help="skip the sha256 check of the corpus files")


def _write(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        return
    from .atomic import atomic_write

    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with atomic_write(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def main(args: Any) -> int:
    """``qformat conformance report``: 0 written, 2 usage (message with its code on stderr)."""
    def emit(msg: str) -> None:
        print(f"qformat conformance report: {msg}", file=sys.stderr, flush=True)

    if args.jobs < 1:
        emit("[FILE_UNREADABLE] --jobs must be at least 1")
        return 2
    if args.timeout <= 0:
        emit("[FILE_UNREADABLE] --timeout must be positive")
        return 2
    corpus = args.corpus or _conf().default_corpus()
    try:
        man = _conf().load_manifest(corpus, verify=not args.no_verify)
        cases = _conf().select(man["cases"], args.id or [], args.feature or [], args.skip_feature or [])
        if not cases:
            raise error("FILE_UNREADABLE", "no case matches the filters")
        impls = implementations(args, emit)
    except QFormatError as e:
        emit(str(e))
        return 2
    for impl in impls:
        if impl.skipped:
            emit(f"{impl.name}: not run: {impl.skipped}")
    emit(f"corpus {man['corpus_version']}: {len(cases)} cases x {sum(not i.skipped for i in impls)} implementations")
    run_all(impls, corpus, cases, args.jobs, args.timeout, emit)
    filters = {k: list(getattr(args, k) or []) for k in ("id", "feature", "skip_feature") if getattr(args, k)}
    now = datetime.datetime.now(datetime.timezone.utc)
    doc = build_report(impls, man, corpus, cases, _command_line(args), filters, spec_titles(corpus), now)
    try:
        _write(args.json, json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
        _write(args.out, render_markdown(doc))
    except OSError as e:
        emit(f"[FILE_UNREADABLE] cannot write the report: {e.strerror or e}: {e.filename}")
        return 2
    emit(f"wrote {args.out} and {args.json}")
    return 0
