"""The conformance runner: drives any reader over the corpus and compares bits.

Two ways to plug a reader in (conformance/README.md is the contract):

* ``--reader CMD``: for each case the runner executes ``CMD INPUT OUTPUT``.  The reader decodes
  INPUT (a .safetensors file, or a sharded checkpoint's index.json) and writes every tensor, in
  its logical dtype, to OUTPUT as a plain safetensors file, exiting 0; or it exits non-zero and
  prints the error code as the first word of the last non-empty line of its standard output.
* ``--python module:function``: in-process; ``function(path)`` returns a mapping name -> array
  (NumPy, or anything ``numpy.asarray`` accepts) or raises an exception whose ``code`` attribute
  is the error code.

Valid cases pass when the reader returns exactly the expected tensors, same names, dtypes,
shapes and bits (NaN compared by class); failing cases pass when the reader fails with exactly
the expected code.  One JSON line per case, then a summary line; exit status 1 on any failure.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from importlib import resources
from typing import Any, Callable, Iterable, Mapping

import jsonschema
import numpy as np

from .errors import QFormatError, error

CASE_TIMEOUT_S = 120


def default_corpus() -> str:
    """QFORMAT_CORPUS, else ./conformance/v1, else the corpus beside this package's checkout."""
    env = os.environ.get("QFORMAT_CORPUS")
    if env:
        return env
    here = os.path.join(os.getcwd(), "conformance", "v1")
    if os.path.isdir(here):
        return here
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conformance", "v1")


def load_manifest(corpus: str, verify: bool = True) -> dict[str, Any]:
    """Read and validate ``corpus/manifest.json`` (and the sha256 of every file when ``verify``)."""
    from .container import strict_json

    path = os.path.join(corpus, "manifest.json")
    try:
        with open(path, encoding="utf-8") as f:
            man, _ = strict_json(f.read())
    except OSError as e:
        raise error("FILE_UNREADABLE", f"cannot read the corpus manifest {path!r}: {e.strerror or e}") from None
    except Exception as e:  # a corrupt manifest is a usage problem for the runner
        raise error("FILE_UNREADABLE", f"the corpus manifest {path!r} is not valid JSON: {e}") from None
    schema = json.loads((resources.files("qformat") / "schema" / "conformance-manifest-1.schema.json").read_text(encoding="utf-8"))
    errs = sorted(jsonschema.Draft202012Validator(schema).iter_errors(man), key=lambda e: list(map(str, e.path)))
    if errs:
        raise error("FILE_UNREADABLE", f"the corpus manifest does not match its schema: {errs[0].message}"[:300])
    if verify:
        for c in man["cases"]:
            for f in c["files"] + ([c["expected"]] if c["expected"] else []):
                with open(os.path.join(corpus, f["path"]), "rb") as fh:
                    if hashlib.sha256(fh.read()).hexdigest() != f["sha256"]:
                        raise error("FILE_UNREADABLE", f"corpus file {f['path']} does not match its sha256 in the manifest")
    return man


def select(cases: Iterable[dict], ids: list[str], features: list[str], skip_features: list[str]) -> list[dict]:
    """Cases whose id matches any ``ids`` glob (all if none), having every ``features`` tag and
    none of ``skip_features`` (a tag ending in ':' or '*' matches by prefix/glob)."""
    def has(c: dict, tag: str) -> bool:
        return any(fnmatch.fnmatchcase(f, tag) or (tag.endswith(":") and f.startswith(tag)) for f in c["features"])

    out = []
    for c in cases:
        if ids and not any(fnmatch.fnmatchcase(c["id"], p) for p in ids):
            continue
        if any(not has(c, t) for t in features) or any(has(c, t) for t in skip_features):
            continue
        out.append(c)
    return out


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    if a.size == 0 and b.size == 0:  # shapes compared already; an empty shape may be too large to convert (SPEC.md §2.2)
        return True
    if a.dtype.kind in "fc" or a.dtype.name in ("bfloat16",) or "float" in a.dtype.name:
        ua = np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}")
        ub = np.ascontiguousarray(b).view(f"u{b.dtype.itemsize}")
        with np.errstate(all="ignore"):
            na = np.isnan(a.astype(np.float32)) if a.dtype.kind != "c" else np.isnan(a)
            nb = np.isnan(b.astype(np.float32)) if b.dtype.kind != "c" else np.isnan(b)
        return bool(((ua == ub) | (na & nb)).all())
    return bool((a == b).all())


def compare(expected: Mapping[str, np.ndarray], got: Mapping[str, Any]) -> str | None:
    """None when ``got`` matches ``expected`` bit for bit; else a sentence saying where it differs."""
    en, gn = set(expected), set(got)
    if en != gn:
        return f"tensor names differ: missing {sorted(en - gn)}, unexpected {sorted(gn - en)}"
    for name in sorted(en):
        e = expected[name]
        try:
            g = np.asarray(got[name])
        except Exception as ex:  # the reader returned something numpy cannot take
            return f"{name}: numpy.asarray failed on the returned value: {ex}"
        if g.dtype != e.dtype:
            return f"{name}: dtype {g.dtype}, expected {e.dtype}"
        if g.shape != e.shape:
            return f"{name}: shape {list(g.shape)}, expected {list(e.shape)}"
        if not _same_bits(e, g):
            ue = np.ascontiguousarray(e).reshape(-1)
            ug = np.ascontiguousarray(g).reshape(-1)
            bad = [i for i in range(ue.size) if not _same_bits(ue[i : i + 1], ug[i : i + 1])]
            i = bad[0]
            return f"{name}: {len(bad)} of {ue.size} elements differ; first at flat index {i}: got {ug[i]!r}, expected {ue[i]!r}"
    return None


def _expected(corpus: str, c: dict) -> dict[str, np.ndarray]:
    from .io import load_file

    return load_file(os.path.join(corpus, c["expected"]["path"]))


def _verdict(c: dict, got: dict[str, Any] | None, code: str | None, crash: str | None, corpus: str) -> dict[str, Any]:
    res: dict[str, Any] = {"id": c["id"], "expect": c["expect"], "expected_error": c["error"]}
    if crash is not None:
        res.update(result="fail", got="crash", detail=crash)
        return res
    if got is not None:
        res["got"] = "valid"
        if c["expect"] != "valid":
            res.update(result="fail", detail=f"the reader decoded the file; expected it to fail with {c['error']}")
            return res
        diff = compare(_expected(corpus, c), got)
        res.update(result="fail" if diff else "pass", detail=diff)
        return res
    res["got"] = f"error:{code}"
    if c["expect"] == "valid":
        res.update(result="fail", detail=f"the reader failed with {code}; expected it to decode")
    elif code != c["error"]:
        res.update(result="fail", detail=f"the reader failed with {code}; expected {c['error']}")
    else:
        res.update(result="pass", detail=None)
    return res


def run_python(fn: Callable[[str], Mapping[str, Any]], corpus: str, c: dict) -> dict[str, Any]:
    path = os.path.join(corpus, c["input"])
    try:
        out = fn(path)
        got = dict(out)
    except Exception as e:  # the reader's failure is data here
        code = getattr(e, "code", None)
        if not isinstance(code, str):
            return _verdict(c, None, None, f"{type(e).__name__} without a 'code' attribute: {e}"[:500], corpus)
        return _verdict(c, None, code, None, corpus)
    return _verdict(c, got, None, None, corpus)


def run_command(cmd: list[str], corpus: str, c: dict, timeout: float = CASE_TIMEOUT_S) -> dict[str, Any]:
    from .io import load_file

    path = os.path.join(corpus, c["input"])
    with tempfile.TemporaryDirectory(prefix="qformat-conf-") as tmp:
        out = os.path.join(tmp, "output.safetensors")
        try:
            p = subprocess.run(cmd + [path, out], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return _verdict(c, None, None, f"timed out after {timeout} s", corpus)
        except OSError as e:
            return _verdict(c, None, None, f"cannot run {cmd[0]!r}: {e}", corpus)
        if p.returncode == 0:
            try:
                got = load_file(out)
            except QFormatError as e:
                return _verdict(c, None, None, f"exit 0 but the output is not a readable safetensors file: {e}", corpus)
            return _verdict(c, got, None, None, corpus)
        lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
        code = lines[-1].split()[0] if lines else None
        if code is None:
            return _verdict(c, None, None, f"exit {p.returncode} without an error code on stdout; stderr: {p.stderr[-300:]}", corpus)
        return _verdict(c, None, code, None, corpus)


def resolve_python(spec: str) -> Callable[[str], Mapping[str, Any]]:
    """``module:function`` -> the callable (the user names the module explicitly)."""
    import importlib

    mod, _, fn = spec.partition(":")
    if not mod or not fn:
        raise error("FILE_UNREADABLE", f"--python expects module:function, found {spec!r}")
    try:
        obj: Any = importlib.import_module(mod)
        for part in fn.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise error("FILE_UNREADABLE", f"cannot load the reader {spec!r}: {e}") from None
    return obj


def run(corpus: str, cases: list[dict], runner: Callable[[dict], dict[str, Any]], emit: Callable[[str], None],
        label: str, jobs: int = 1) -> dict[str, Any]:
    """Run every case (``jobs`` at a time for command readers), emitting lines in case order."""
    counts = {"passed": 0, "failed": 0}
    t0 = time.perf_counter()
    if jobs > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(jobs) as pool:
            results: Iterable[dict[str, Any]] = list(pool.map(runner, cases))
    else:
        results = (runner(c) for c in cases)
    for res in results:
        counts["passed" if res["result"] == "pass" else "failed"] += 1
        emit(json.dumps(res, sort_keys=True))
    summary = {"summary": {"reader": label, "corpus": corpus, "cases": len(cases), **counts,
                           "seconds": round(time.perf_counter() - t0, 2)}}
    emit(json.dumps(summary, sort_keys=True))
    return summary["summary"]


def reference_reader(path: str) -> dict[str, np.ndarray]:
    """The NumPy reference reader in the in-process protocol (files or sharded index)."""
    from .io import load_checkpoint

    return load_checkpoint(path)


def read_command(inp: str, out: str) -> int:
    """``qformat conformance read INPUT OUTPUT``: the reference reader in the command protocol."""
    from .container import write_file

    try:
        tensors = reference_reader(inp)
    except QFormatError as e:
        print(e.code)
        print(e, file=sys.stderr)
        return 1
    write_file(out, tensors, None)
    return 0


def main(args: Any) -> int:
    """The ``qformat conformance`` subcommands (parsed by qformat.cli)."""
    if args.conf_command == "read":
        return read_command(args.input, args.output)
    corpus = args.corpus or default_corpus()
    try:
        man = load_manifest(corpus, verify=not args.no_verify)
        if args.reader:
            cmd = shlex.split(args.reader)
            runner = lambda c: run_command(cmd, corpus, c, args.timeout)  # noqa: E731
            label = args.reader
        else:
            fn = resolve_python(args.python)
            runner = lambda c: run_python(fn, corpus, c)  # noqa: E731
            label = args.python
    except QFormatError as e:
        print(f"qformat conformance: {e}", file=sys.stderr)
        return 2
    cases = select(man["cases"], args.id or [], args.feature or [], args.skip_feature or [])
    if not cases:
        print("qformat conformance: no case matches the filters", file=sys.stderr)
        return 2
    s = run(corpus, cases, runner, print, label, jobs=max(1, args.jobs) if args.reader else 1)
    print(f"corpus {man['corpus_version']} (spec {man['spec_version']}): {s['passed']} passed, {s['failed']} failed", file=sys.stderr)
    return 1 if s["failed"] else 0
