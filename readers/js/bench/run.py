"""JavaScript reader vs the NumPy reference: decode speed on one core, same files, same machine.

    .venv/bin/python readers/js/bench/run.py [--rounds 3] [--reps 5] [--shapes 4096x4096,2048x8192] [--cpu N]

Quantizes one float32 array per shape (standard normal, seed 0) with each scheme (int4 g32, nf4,
mxfp4, fp8_e4m3, gguf Q4_K), saves each with ``qformat.save_file``, then decodes each file's
tensor to float32 with
  * the NumPy reference: the Python package's pure-NumPy path (``QFORMAT_KERNELS=numpy``, here
    ``qformat.kernels.use("numpy")``; ``safe_open(...).get_tensor``, one decode thread, BLAS/OpenMP
    pools at one thread), the baseline of issue 41 item 8;
  * the JavaScript reader through libqformat's WebAssembly build (``readers/js/bench/decode.mjs``:
    ``openFile(bytes).getTensor``, a new Float32Array per call; the default path for tensors of
    at least 65,536 values);
  * the JavaScript reader's own decoder (``QFORMAT_JS_WASM=0``), for reference.
Both sides allocate their output and have the file's bytes in memory (NumPy: memory-mapped,
page cache).  Each of ``--rounds`` rounds times ``--reps`` calls of each side after warm-up,
NumPy then JS, so that load from other jobs on a shared machine falls on both; the figures are
medians (and minima) over all rounds.  Every JS output is checked bit for bit against NumPy's
before anything is reported.  The process (and so the node child) is pinned to one CPU
(``--cpu``, default the first allowed; -1: none).

NumPy asks for transparent huge pages for large arrays (``madvise``), so its 64 MB output costs
a few page faults; Node's allocator does not, and first-touch faults of 4 KB pages are a large
part of a JS decode.  So each side is also run on the other's kind of pages and the ratios
compare like with like: JS with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (glibc >= 2.35: malloc
asks for huge pages too) against NumPy as it runs, and NumPy with its ``madvise`` off against JS
as it runs (``--no-thp``: skip both; the ratio is then JS as it runs over NumPy as it runs).
Prints a Markdown table (ms, M values/s and JS / NumPy) and, with ``--json``, writes the rows.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS"):
    os.environ[_v] = "1"  # before NumPy is imported

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import qformat
from qformat import decode as qdecode
from qformat import kernels as qkernels

HERE = Path(__file__).resolve().parent

try:  # NumPy's switch for madvise(MADV_HUGEPAGE) on large arrays (on by default)
    from numpy._core.multiarray import _set_madvise_hugepage
except ImportError:  # NumPy < 2
    from numpy.core.multiarray import _set_madvise_hugepage  # type: ignore[no-redef]
SCHEMES = [  # (label, scheme, quantize parameters)
    ("int4 g32", "int", {"bits": 4, "group_size": 32}),
    ("nf4", "nf4", {}),
    ("mxfp4", "mxfp4", {}),
    ("fp8_e4m3", "fp8_e4m3", {}),
    ("gguf Q4_K", "gguf", {"type": "Q4_K"}),
]


def _median_time(fn, reps: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts


def _node(a, path: str, env: dict[str, str], out: str | None, reps: int) -> dict:
    cmd = [a.node, str(HERE / "decode.mjs"), "--reps", str(reps), "--warmup", str(a.warmup)]
    if out:
        cmd += ["--out", out]
    proc = subprocess.run(cmd + [path], capture_output=True, text=True, env=env)
    if proc.returncode:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"node bench failed on {path}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _mins_meds(xs: list[float]) -> tuple[float, float]:
    return min(xs), statistics.median(xs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="4096x4096,2048x8192", help="comma-separated ROWSxCOLS (default: 4096x4096,2048x8192)")
    ap.add_argument("--rows", type=int, default=None, help="one shape: ROWS (with --cols; overrides --shapes)")
    ap.add_argument("--cols", type=int, default=None)
    ap.add_argument("--reps", type=int, default=5, help="timed calls per side per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each timing NumPy then JS (interleaved, so load on a shared machine hits both)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--cpu", type=int, default=None, help="CPU to pin to (default: the first allowed; -1: no pinning)")
    ap.add_argument("--only", nargs="*", help="scheme labels to run (default: all)")
    ap.add_argument("--no-thp", action="store_true", help="skip the like-for-like page runs (JS with huge pages, NumPy with 4 KB pages)")
    ap.add_argument("--no-js-pure", action="store_true", help="skip the JavaScript decoder's own column (QFORMAT_JS_WASM=0)")
    ap.add_argument("--node", default="node")
    ap.add_argument("--json", help="write the rows to this file")
    a = ap.parse_args(argv)
    if a.rows is not None or a.cols is not None:
        shapes = [(a.rows or 4096, a.cols or 4096)]
    else:
        shapes = [tuple(int(v) for v in sh.lower().split("x")) for sh in a.shapes.split(",") if sh]

    if a.cpu != -1 and hasattr(os, "sched_setaffinity"):
        cpu = a.cpu if a.cpu is not None else min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})  # inherited by the node child
    qdecode.THREADS = 1  # the reference's own chunk pool: one thread

    node_version = subprocess.run([a.node, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    print(f"# float32 out; NumPy reference (QFORMAT_KERNELS=numpy) {np.__version__}, 1 decode thread; node {node_version}; "
          f"CPUs {sorted(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else '?'}; {platform.processor() or platform.machine()}; "
          f"median (min) of {a.rounds} x {a.reps} calls per side", flush=True)
    env = dict(os.environ)
    env.pop("GLIBC_TUNABLES", None)
    env.pop("QFORMAT_JS_WASM", None)
    thp_env = dict(env, GLIBC_TUNABLES="glibc.malloc.hugetlb=1")
    pure_env = dict(env, QFORMAT_JS_WASM="0")
    rows = []
    tmp = tempfile.mkdtemp(prefix="qformat-js-bench-")
    try:
        for R, C in shapes:
            x = np.random.default_rng(0).standard_normal((R, C)).astype(np.float32)
            for label, scheme, kw in SCHEMES:
                if a.only and label not in a.only and scheme not in a.only:
                    continue
                path = os.path.join(tmp, f"{scheme}.safetensors")
                qformat.save_file({"w": qformat.quantize(x, scheme, **kw)}, path)
                out = os.path.join(tmp, "out")
                os.makedirs(out, exist_ok=True)
                ts: dict[str, list[float]] = {k: [] for k in ("numpy", "numpy_4k", "js", "js_thp", "js_pure")}
                paths: dict[str, str] = {}

                def check(kind: str, r: dict) -> None:  # that JS output, bit for bit
                    got = np.fromfile(os.path.join(out, f"{scheme}.safetensors.w.bin"), np.uint32)
                    if ref.dtype != np.float32 or not np.array_equal(got, ref.reshape(-1).view(np.uint32)):
                        raise SystemExit(f"{label} {R}x{C}: the JavaScript output ({kind}) differs from the NumPy reference")
                    paths[kind] = r["path"]

                with qformat.safe_open(path) as f, qkernels.use("numpy"):
                    ref = f.get_tensor("w")
                    for rnd in range(a.rounds):
                        ts["numpy"] += [t * 1e3 for t in _median_time(lambda: f.get_tensor("w"), a.reps, a.warmup)]
                        if not a.no_thp:
                            _set_madvise_hugepage(False)
                            try:
                                ts["numpy_4k"] += [t * 1e3 for t in _median_time(lambda: f.get_tensor("w"), a.reps, a.warmup)]
                            finally:
                                _set_madvise_hugepage(True)
                        for kind, e in (("js", env), ("js_thp", thp_env), ("js_pure", pure_env)):
                            if (kind == "js_thp" and a.no_thp) or (kind == "js_pure" and a.no_js_pure):
                                continue
                            r = _node(a, path, e, out if rnd == 0 else None, a.reps)
                            ts[kind] += r["ms"]
                            if rnd == 0:
                                check(kind, r)
                n = ref.size
                row: dict = {"scheme": label, "shape": [R, C], "values": n, "bit_identical": True, "paths": paths}
                for k, v in ts.items():
                    if v:
                        mn, md = _mins_meds(v)
                        row.update({f"{k}_ms": md, f"{k}_min_ms": mn, f"{k}_mvals": n / md / 1e3, f"{k}_runs_ms": v})
                # like with like: JS over NumPy on the same kind of output pages (huge: JS with the
                # glibc tunable against NumPy as it runs; 4 KB: JS as it runs against NumPy without madvise)
                row["js_over_numpy"] = row["numpy_ms"] / row["js_ms"]
                row["js_over_numpy_min"] = row["numpy_min_ms"] / row["js_min_ms"]
                if "js_thp_ms" in row:
                    row["js_thp_over_numpy"] = row["numpy_ms"] / row["js_thp_ms"]
                    row["js_thp_over_numpy_min"] = row["numpy_min_ms"] / row["js_thp_min_ms"]
                    row["js_over_numpy_4k"] = row["numpy_4k_ms"] / row["js_ms"]
                    row["js_over_numpy_4k_min"] = row["numpy_4k_min_ms"] / row["js_min_ms"]
                if "js_pure_ms" in row:
                    row["js_pure_over_numpy"] = row["numpy_ms"] / row["js_pure_ms"]
                rows.append(row)
                msg = (f"  {label:<10} {R}x{C}  NumPy ref {row['numpy_ms']:8.2f} ms  JS-wasm {row['js_ms']:8.2f} ms ({paths.get('js')}) "
                       f"{row['js_over_numpy']:4.2f}x")
                if "js_thp_ms" in row:
                    msg += (f"  | huge pages: NumPy {row['numpy_ms']:.2f} JS-wasm {row['js_thp_ms']:.2f} ms {row['js_thp_over_numpy']:4.2f}x"
                            f"  | 4 KB pages: NumPy {row['numpy_4k_ms']:.2f} JS-wasm {row['js_ms']:.2f} ms {row['js_over_numpy_4k']:4.2f}x")
                if "js_pure_ms" in row:
                    msg += f"  | JS pure {row['js_pure_ms']:.2f} ms {row['js_pure_over_numpy']:4.2f}x"
                print(msg + "  bit-identical", flush=True)
                os.remove(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    thp = any("js_thp_ms" in r for r in rows)
    if thp:  # like with like: the same kind of output pages on both sides
        print("\nms per decode, median (min); JS / NumPy = NumPy time / JS time, median (from minima)")
        print("\n| scheme | shape | NumPy ref, huge pages | JS-wasm, huge pages | JS / NumPy | NumPy ref, 4 KB pages | JS-wasm, 4 KB pages | JS / NumPy |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['scheme']} | {r['shape'][0]}x{r['shape'][1]} | {r['numpy_ms']:.2f} ({r['numpy_min_ms']:.2f}) | {r['js_thp_ms']:.2f} ({r['js_thp_min_ms']:.2f}) |"
                  f" {r['js_thp_over_numpy']:.2f}x ({r['js_thp_over_numpy_min']:.2f}x) | {r['numpy_4k_ms']:.2f} ({r['numpy_4k_min_ms']:.2f}) |"
                  f" {r['js_ms']:.2f} ({r['js_min_ms']:.2f}) | {r['js_over_numpy_4k']:.2f}x ({r['js_over_numpy_4k_min']:.2f}x) |")
    print("\n| scheme | shape | NumPy, 1 thread | JavaScript | JS / NumPy | JS pure | JS pure / NumPy |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        pure = f"{r['js_pure_ms']:.2f} ms | {r['js_pure_over_numpy']:.2f}x" if "js_pure_ms" in r else "- | -"
        print(f"| {r['scheme']} | {r['shape'][0]}x{r['shape'][1]} | {r['numpy_ms']:.2f} ms | {r['js_ms']:.2f} ms | {r['js_over_numpy']:.2f}x | {pure} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "shapes": shapes, "reps": a.reps, "rounds": a.rounds,
                                            "reference": "QFORMAT_KERNELS=numpy", "node": node_version, "numpy": np.__version__}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
