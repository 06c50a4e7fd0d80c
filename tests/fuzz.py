"""Hostile input at scale (issue 24, item 7): one mutant stream through every reader and every
command that reads a checkpoint, differential where two readers read the same file.

Mutants come from tests/test_js_differential.py's generators (bytes flipped, set, inserted,
deleted, truncated, extended; the qformat object's leaves and subtrees replaced, deleted or
given extra members; tensor entries re-typed, re-shaped, renamed; payload bytes overwritten)
over the corpus's valid single-file inputs and tests/test_errors.py's seeds.  For each mutant:

- ``numpy`` (``qformat.load_file``) is the reference: it decodes or refuses with a code;
- the other readers (``torch``, ``jax`` with its jitted decoder; ``js`` through
  ``qformat-read.mjs --batch``) must do the same: the same code, or the same tensors bit for bit
  (NaN by class);
- ``qlinear``: every 2-D quantized tensor of a file the reference decodes becomes a torch
  ``QLinear`` (its default path: a native matmul kernel where one maps, qformat's own included)
  and its output on seeded activations must stay within ``qformat_torch.kernels.error_bound`` of
  the float64 product with the reference's decoded weight (and be NaN exactly where that is);
  a refusal must carry the reference's code;
- every command (``convert``, ``dequantize``, ``export:<target>`` for each registered export
  target, ``diff``, ``inspect``, ``check``) must succeed or refuse with a QFormatError, and when
  ``qformat check`` refuses the file, the commands that read payload (convert, dequantize,
  export, diff) must refuse it too and write nothing (the one rule, item 1);
- anything else is a finding: an exception without a code (``crash``), a run longer than the
  time limit (``hang``), a disagreement (``differs``), a refused file a command accepted
  (``silent``), or a file left behind by a refusal (``left``).

``scripts/fuzz_all.py`` runs it at scale and prints the totals per target; the test suite runs
a seeded 10^4 (tests/test_fuzz_all.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

import qformat
from qformat.conformance import compare
from qformat.errors import QFormatError

ROOT = Path(__file__).resolve().parent.parent
JS_READER = ROOT / "readers" / "js" / "bin" / "qformat-read.mjs"
#: seconds one target may take on one mutant before it counts as a hang (the corpus seeds are
#: kilobytes; a decode or export of one takes milliseconds)
TIME_LIMIT = 20


class Hang(Exception):
    pass


def _alarm(_sig: int, _frame: Any) -> None:
    raise Hang()


# -- readers ----------------------------------------------------------------------------------
def _numpy(path: Path) -> dict[str, np.ndarray]:
    return qformat.load_file(path)


def _torch(path: Path) -> dict[str, np.ndarray]:
    import qformat.torch as qt
    from qformat_torch.dtypes import torch_to_numpy

    return {k: torch_to_numpy(v) for k, v in qt.load_file(path).items()}


def _jax(path: Path) -> dict[str, np.ndarray]:
    import qformat.jax as qj

    # the jitted jax.numpy decoder: on a CPU device the default decodes with the NumPy path's
    # kernel, which would make this no second reader
    return {k: np.asarray(v) for k, v in qj.load_file(path, decoder="jax").items()}


def _qlinear(path: Path, ref: dict[str, np.ndarray]) -> str | None:
    """The file's 2-D quantized tensors through QLinear's default forward (see the module doc):
    None, or a finding.  Raises QFormatError where loading refuses."""
    import torch

    import qformat.torch as qt
    from qformat_torch import kernels
    from qformat_torch.nn import QLinear

    gen = torch.Generator().manual_seed(0)
    with qt.safe_open(path) as f:
        for name in f.keys():
            if not f.is_quantized(name) or len(f.shape(name)) != 2 or 0 in f.shape(name):
                continue
            w = np.asarray(ref[name], np.float64)
            layer = QLinear(f.get_qtensor(name), None)
            for dt in (torch.float32, torch.bfloat16):
                x = torch.randn(3, w.shape[1], generator=gen).to(dt)
                with torch.no_grad():
                    y = layer(x).double().numpy()
                xd = x.double().numpy()
                with np.errstate(all="ignore"):
                    want = xd @ w.T
                    bound = kernels.error_bound(torch.from_numpy(want), torch.from_numpy(np.abs(xd) @ np.abs(w).T), w.shape[1], dt,
                                                layer._native.roundings if layer._native is not None else 0).numpy()
                nan = ~np.isfinite(want)
                # where |x| @ |W| reaches the output dtype's range, a sum may overflow in binary32
                # (or the output rounds to infinity) although the float64 product is finite
                with np.errstate(all="ignore"):
                    may_overflow = ~(np.abs(xd) @ np.abs(w).T < float(torch.finfo(dt).max) / 2)
                inf_y = ~np.isfinite(y)
                if np.any(nan & ~inf_y) or np.any(inf_y & ~nan & ~may_overflow):
                    return f"differs: {name} ({layer.kernel_path}, {dt}): non-finite outputs where the exact product is finite or not"
                # plus an absolute term: BLAS kernels may flush subnormal weights, products and sums
                # to zero (FTZ/DAZ), each worth less than the smallest normal binary32 value
                bound = bound + (np.abs(xd).sum(1)[:, None] + 2) * 2.0**-126
                fin = ~nan & ~inf_y
                if not np.all(np.abs(y - want)[fin] <= bound[fin]):
                    return f"differs: {name} ({layer.kernel_path}, {dt}): outside the error bound"
    return None


def _f4_unpaired(arrays: dict[str, np.ndarray]) -> bool:
    """Whether a plain F4 tensor torch cannot hold is among ``arrays`` (rank 0 or an odd last
    axis: torch keeps F4 values in pairs, float4_e2m1fn_x2; the torch reader refuses it as
    safetensors' torch binding does, conformance tag ``plain:f4-odd``)."""
    import ml_dtypes

    return any(a.dtype == ml_dtypes.float4_e2m1fn and (a.ndim == 0 or a.shape[-1] % 2) for a in arrays.values())


READERS: dict[str, Callable[[Path], dict[str, np.ndarray]]] = {"numpy": _numpy, "torch": _torch, "jax": _jax}


def _qlinear_refuses(path: Path) -> None:
    """A file the reference refuses: opening it for QLinear must refuse too (with its code)."""
    import qformat.torch as qt
    from qformat_torch.nn import QLinear

    with qt.safe_open(path) as f:
        for name in f.keys():
            if f.is_quantized(name) and len(f.shape(name)) == 2:
                QLinear(f.get_qtensor(name), None)
    qt.load_file(path)  # the reference refused: reading every tensor refuses too (its code)


# -- commands ---------------------------------------------------------------------------------
def _convert(src: Path, out: Path) -> Any:
    from qformat.convert import convert

    return convert(src, out / "x.safetensors")


def _dequantize(src: Path, out: Path) -> Any:
    return qformat.dequantize_checkpoint(src, out / "x.safetensors")


def _exporter(target: str) -> Callable[[Path, Path], Any]:
    def run(src: Path, out: Path) -> Any:
        from qformat.export import export

        return export(src, out / ("x.gguf" if target == "gguf" else "x.safetensors"), to=target)
    return run


def _diff(src: Path, out: Path) -> Any:
    from qformat.diff import diff_checkpoints

    return diff_checkpoints(src, src)


def _inspect(src: Path, out: Path) -> Any:
    from qformat.inspection import inspect_checkpoint

    return inspect_checkpoint(src)


def _check(src: Path, out: Path) -> Any:
    return qformat.check(src, digests=True)


def commands() -> dict[str, tuple[Callable[[Path, Path], Any], bool]]:
    """name -> (run(src, out_folder), whether the one rule binds it: it reads payload)."""
    from qformat.export.registry import targets

    out: dict[str, tuple[Callable[[Path, Path], Any], bool]] = {
        "convert": (_convert, True), "dequantize": (_dequantize, True), "diff": (_diff, True),
        "inspect": (_inspect, False), "check": (_check, False)}
    for t in targets():
        out[f"export:{t}"] = (_exporter(t), True)
    return out


def all_targets() -> list[str]:
    return [*READERS, "qlinear", "js", *commands()]


# -- the stream -------------------------------------------------------------------------------
def mutants(n: int, seed: int, start: int = 0, step: int = 1) -> Iterator[tuple[str, bytes]]:
    """Mutants ``start``, ``start + step``, ... of the seeded stream of ``n`` (every kind of
    tests/test_js_differential.py's generators; a worker of ``step`` takes its share)."""
    import random

    from tests.test_js_differential import _seeds, mutate_bytes, mutate_entries, mutate_json, mutate_payload

    seeds = _seeds()
    names = sorted(seeds)
    kinds = [mutate_bytes, mutate_json, mutate_json, mutate_json, mutate_entries, mutate_payload]
    for i in range(start, n, step):
        rng = random.Random(seed * 1_000_003 + i)  # mutant i is the same whichever worker draws it
        name = rng.choice(names)
        kind = rng.choice(kinds)
        yield f"{i} ({kind.__name__} of {name})", kind(rng, seeds[name])


def _timed(fn: Callable[[], Any]) -> tuple[str, Any]:
    """("ok", value) | ("code", code) | ("crash", text) | ("hang", None)."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIME_LIMIT)
    try:
        with np.errstate(all="ignore"):
            return "ok", fn()
    except QFormatError as e:
        return "code", e.code
    except Hang:
        return "hang", None
    except Exception as e:  # noqa: BLE001 - the finding itself
        return "crash", f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


class Totals:
    """Per target: how many mutants, outcomes by code, and findings (each with its mutant)."""

    def __init__(self) -> None:
        self.runs: Counter = Counter()
        self.outcomes: dict[str, Counter] = defaultdict(Counter)
        self.findings: list[str] = []
        self.by_kind: dict[str, Counter] = defaultdict(Counter)

    def add(self, target: str, outcome: str, finding: str | None = None, label: str = "") -> None:
        self.runs[target] += 1
        self.outcomes[target][outcome] += 1
        if finding is not None:
            kind = finding.split(":", 1)[0]
            self.by_kind[target][kind] += 1
            self.findings.append(f"{target} {label}: {finding}")

    def merge(self, other: "Totals") -> None:
        self.runs.update(other.runs)
        for k, c in other.outcomes.items():
            self.outcomes[k].update(c)
        for k, c in other.by_kind.items():
            self.by_kind[k].update(c)
        self.findings.extend(other.findings)

    def to_dict(self) -> dict[str, Any]:
        return {"runs": dict(self.runs), "findings": {k: dict(v) for k, v in self.by_kind.items()},
                "outcomes": {k: dict(sorted(v.items())) for k, v in self.outcomes.items()},
                "examples": self.findings[:50]}


def run_one(label: str, data: bytes, targets: list[str], work: Path, totals: Totals, js_jobs: list | None = None) -> None:
    """Every target in ``targets`` on one mutant (``js``: queued into ``js_jobs`` for a batch)."""
    src = work / "m.safetensors"
    src.write_bytes(data)
    kind, ref = _timed(lambda: _numpy(src))
    ref_out = "valid" if kind == "ok" else (ref if kind == "code" else kind)
    if "numpy" in targets:
        totals.add("numpy", ref_out, None if kind in ("ok", "code") else f"{kind}: {ref}", label)
    if kind not in ("ok", "code"):
        return  # the reference itself failed: the finding is recorded, nothing to compare with
    for name in [t for t in targets if t in READERS and t != "numpy"]:
        k, got = _timed(lambda fn=READERS[name]: fn(src))
        out = "valid" if k == "ok" else (got if k == "code" else k)
        finding = None
        if k in ("crash", "hang"):
            finding = f"{k}: {got}"
        elif (kind == "code") != (k == "code") or (k == "code" and got != ref):
            if not (name == "torch" and got == "PLAIN_DTYPE_UNSUPPORTED" and kind == "ok" and _f4_unpaired(ref)):
                finding = f"differs: numpy {ref if kind == 'code' else 'decodes'}, {name} {got if k == 'code' else 'decodes'}"
        elif k == "ok":
            diff = compare(ref, got)
            if diff:
                finding = f"differs: {diff}"
        totals.add(name, out, finding, label)
    if "qlinear" in targets:
        k, got = _timed(lambda: _qlinear(src, ref) if kind == "ok" else _qlinear_refuses(src))
        out = ("valid" if kind == "ok" else "refused") if k == "ok" else (got if k == "code" else k)
        finding = None
        if k in ("crash", "hang"):
            finding = f"{k}: {got}"
        elif k == "ok" and got is not None:
            finding = got
        elif k == "code" and kind == "ok":  # a refused file may be refused per tensor, with that tensor's code (§1.4)
            finding = f"differs: numpy decodes, qlinear {got}"
        totals.add("qlinear", out, finding, label)
    if "js" in targets and js_jobs is not None:
        keep = work / f"js-{len(js_jobs)}.safetensors"
        shutil.copyfile(src, keep)
        js_jobs.append((label, keep, ref_out, ref if kind == "ok" else None))
    cmds = commands()
    chosen = [t for t in targets if t in cmds]
    refused = None
    if chosen:
        rep = _timed(lambda: qformat.check(src))
        refused = rep[0] == "ok" and not rep[1].ok
    for name in chosen:
        fn, bound = cmds[name]
        out_dir = work / "out"
        if out_dir.exists():
            shutil.rmtree(out_dir)
        out_dir.mkdir()
        k, got = _timed(lambda fn=fn: fn(src, out_dir))
        out = "done" if k == "ok" else (got if k == "code" else k)
        finding = None
        if k in ("crash", "hang"):
            finding = f"{k}: {got}"
        elif bound and refused and k == "ok":
            finding = "silent: qformat check refuses the file and the command succeeded"
        elif k == "code" and any(out_dir.iterdir()):
            finding = f"left: refused with {got} and left {sorted(p.name for p in out_dir.iterdir())}"
        totals.add(name, out, finding, label)


def run_js(jobs: list, totals: Totals, node: str | None = None) -> None:
    """The queued mutants through one ``qformat-read.mjs --batch`` process, against numpy."""
    node = node or shutil.which("node")
    if not jobs or node is None:
        return
    listing = "".join(f"{p}\t{p}.out\n" for _, p, _, _ in jobs)
    proc = subprocess.run([node, str(JS_READER), "--batch"], input=listing, capture_output=True, text=True,
                          timeout=TIME_LIMIT * max(1, len(jobs) // 50))
    results = [json.loads(x) for x in proc.stdout.splitlines() if x.strip()]
    if proc.returncode != 0 or len(results) != len(jobs):
        totals.add("js", "crash", f"crash: the batch ended with {proc.returncode} after {len(results)} of {len(jobs)}: {proc.stderr[-300:]}", "batch")
        return
    for (label, p, ref_out, ref), res in zip(jobs, results):
        finding = None
        if res["crash"]:
            out = "crash"
            finding = f"crash: {res['crash'][:300]}"
        elif res["code"] is not None:
            out = res["code"]
            if out != ref_out:  # every code must match (NOT_SAFETENSORS is required, SPEC.md 1.2.1)
                finding = f"differs: numpy {ref_out}, js {out}"
        else:
            out = "valid"
            if ref is None:
                finding = f"differs: numpy {ref_out}, js decodes"
            else:
                diff = compare(ref, qformat.load_file(f"{p}.out"))
                if diff:
                    finding = f"differs: {diff}"
        totals.add("js", out, finding, label)
        for f in (p, Path(f"{p}.out")):
            if f.exists():
                f.unlink()


def run(n: int, seed: int, targets: list[str], start: int = 0, step: int = 1, js_batch: int = 1000) -> Totals:
    """``n`` mutants of the seeded stream (this worker's share) through ``targets``."""
    totals = Totals()
    with tempfile.TemporaryDirectory(prefix="qformat-fuzz-") as tmp:
        work = Path(tmp)
        jobs: list = []
        for label, data in mutants(n, seed, start, step):
            run_one(label, data, targets, work, totals, jobs)
            if len(jobs) >= js_batch:
                run_js(jobs, totals)
                jobs = []
        run_js(jobs, totals)
    return totals
