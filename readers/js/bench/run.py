"""JavaScript reader vs the NumPy reference: decode speed on one core, same files, same machine.

    .venv/bin/python readers/js/bench/run.py [--rounds 3] [--reps 5] [--rows 4096 --cols 4096] [--cpu N]

Quantizes one float32 array (standard normal, seed 0) with each scheme (int4 g32, nf4, mxfp4,
fp8_e4m3), saves each with ``qformat.save_file``, then decodes each file's tensor to float32
with the NumPy reference (``safe_open(...).get_tensor``, one decode thread, BLAS/OpenMP pools
at one thread) and with the JavaScript reader (``readers/js/bench/decode.mjs``:
``openFile(bytes).getTensor``, a new Float32Array per call).  Both sides allocate their output
and have the file's bytes in memory (NumPy: memory-mapped, page cache).  Each of ``--rounds``
rounds times ``--reps`` calls of each side after warm-up, NumPy then JS, so that load from
other jobs on a shared machine falls on both; the figures are medians over all rounds.  The
JS output is checked bit for bit against NumPy's before anything is reported.  The process
(and so the node child) is pinned to one CPU (``--cpu``, default the first allowed; -1: none).

NumPy asks for transparent huge pages for large arrays (``madvise``), so its 64 MB output costs
a few page faults; Node's allocator does not, and first-touch faults of 4 KB pages are a large
part of a JS decode.  A second JS column runs node with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``
(glibc >= 2.35: malloc asks for huge pages too), and a second NumPy column turns NumPy's
``madvise`` off, so that each side is also compared with the other on the same kind of pages
(``--no-thp``: skip both).
Prints a Markdown table (M values/s and JS / NumPy) and, with ``--json``, writes the rows.
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5, help="timed calls per side per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each timing NumPy then JS (interleaved, so load on a shared machine hits both)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--cpu", type=int, default=None, help="CPU to pin to (default: the first allowed; -1: no pinning)")
    ap.add_argument("--only", nargs="*", help="scheme labels to run (default: all)")
    ap.add_argument("--no-thp", action="store_true", help="skip the JS run with GLIBC_TUNABLES=glibc.malloc.hugetlb=1")
    ap.add_argument("--node", default="node")
    ap.add_argument("--json", help="write the rows to this file")
    a = ap.parse_args(argv)

    if a.cpu != -1 and hasattr(os, "sched_setaffinity"):
        cpu = a.cpu if a.cpu is not None else min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})  # inherited by the node child
    qdecode.THREADS = 1  # the reference's own chunk pool: one thread

    node_version = subprocess.run([a.node, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    print(f"# {a.rows} x {a.cols} float32 out; NumPy {np.__version__}, 1 decode thread; node {node_version}; "
          f"CPUs {sorted(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else '?'}; {platform.processor() or platform.machine()}; "
          f"median of {a.rounds} x {a.reps} calls per side", flush=True)
    env = dict(os.environ)
    env.pop("GLIBC_TUNABLES", None)
    thp_env = dict(env, GLIBC_TUNABLES="glibc.malloc.hugetlb=1")
    x = np.random.default_rng(0).standard_normal((a.rows, a.cols)).astype(np.float32)
    rows = []
    tmp = tempfile.mkdtemp(prefix="qformat-js-bench-")
    try:
        for label, scheme, kw in SCHEMES:
            if a.only and label not in a.only and scheme not in a.only:
                continue
            path = os.path.join(tmp, f"{scheme}.safetensors")
            qformat.save_file({"w": qformat.quantize(x, scheme, **kw)}, path)
            out = os.path.join(tmp, "out")
            os.makedirs(out, exist_ok=True)
            np_ts: list[float] = []
            np4k_ts: list[float] = []
            js_ms: list[float] = []
            thp_ms: list[float] = []
            with qformat.safe_open(path) as f:
                ref = f.get_tensor("w")
                for rnd in range(a.rounds):
                    np_ts += _median_time(lambda: f.get_tensor("w"), a.reps, a.warmup)
                    if not a.no_thp:
                        _set_madvise_hugepage(False)
                        try:
                            np4k_ts += _median_time(lambda: f.get_tensor("w"), a.reps, a.warmup)
                        finally:
                            _set_madvise_hugepage(True)
                    js_ms += _node(a, path, env, out if rnd == 0 else None, a.reps)["ms"]
                    if rnd == 0:  # the JS output, bit for bit
                        got = np.fromfile(os.path.join(out, f"{scheme}.safetensors.w.bin"), np.uint32)
                        if ref.dtype != np.float32 or not np.array_equal(got, ref.reshape(-1).view(np.uint32)):
                            raise SystemExit(f"{label}: the JavaScript output differs from the NumPy reference")
                    if not a.no_thp:
                        thp_ms += _node(a, path, thp_env, None, a.reps)["ms"]
            n = ref.size
            np_med = statistics.median(np_ts) * 1e3
            js_med = statistics.median(js_ms)
            row = {"scheme": label, "values": n, "numpy_ms": np_med, "js_ms": js_med,
                   "numpy_mvals": n / np_med / 1e3, "js_mvals": n / js_med / 1e3, "js_over_numpy": np_med / js_med,
                   "numpy_runs_ms": [t * 1e3 for t in np_ts], "js_runs_ms": js_ms, "bit_identical": True}
            msg = f"  {label:<10} NumPy {row['numpy_mvals']:7.1f} M/s  JS {row['js_mvals']:7.1f} M/s ({row['js_over_numpy']:4.2f}x)"
            if thp_ms:
                thp_med = statistics.median(thp_ms)
                np4k_med = statistics.median(np4k_ts) * 1e3
                row.update(js_thp_ms=thp_med, js_thp_mvals=n / thp_med / 1e3, js_thp_over_numpy=np_med / thp_med, js_thp_runs_ms=thp_ms,
                           numpy_4k_ms=np4k_med, numpy_4k_mvals=n / np4k_med / 1e3, js_over_numpy_4k=np4k_med / js_med,
                           numpy_4k_runs_ms=[t * 1e3 for t in np4k_ts])
                msg += (f"  JS, THP output {row['js_thp_mvals']:7.1f} M/s ({row['js_thp_over_numpy']:4.2f}x)"
                        f"  NumPy, 4 KB pages {row['numpy_4k_mvals']:7.1f} M/s (JS {row['js_over_numpy_4k']:4.2f}x)")
            rows.append(row)
            print(msg + "  bit-identical", flush=True)
            os.remove(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    thp = any("js_thp_mvals" in r for r in rows)
    if thp:  # like with like: the same kind of output pages on both sides
        print("\n| scheme | NumPy (default: huge pages) | JavaScript, huge pages | JS / NumPy | NumPy, 4 KB pages | JavaScript (default: 4 KB pages) | JS / NumPy |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['scheme']} | {r['numpy_mvals']:.0f} | {r['js_thp_mvals']:.0f} | {r['js_thp_over_numpy']:.2f}x |"
                  f" {r['numpy_4k_mvals']:.0f} | {r['js_mvals']:.0f} | {r['js_over_numpy_4k']:.2f}x |")
    print("\n| scheme | NumPy, 1 thread | JavaScript | JS / NumPy |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['scheme']} | {r['numpy_mvals']:.0f} | {r['js_mvals']:.0f} | {r['js_over_numpy']:.2f}x |")
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "rows_x_cols": [a.rows, a.cols], "reps": a.reps, "rounds": a.rounds,
                                            "node": node_version, "numpy": np.__version__}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
