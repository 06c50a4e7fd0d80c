"""The ``kernels`` section: the native fused decode (qformat.kernels, issue 23) per scheme,
against ``np.copyto`` of the output and against the NumPy reference decoder, 1 and 2 threads.

Imports only :mod:`bench.common` in bench/ (no import cycle).  Every scheme's native output is
checked bit for bit against the NumPy path before it is timed.  Targets (issue 23 item 2):
int4 g32 and nf4 decode to float32 at >= 0.8x memcpy and >= 4x the NumPy decoder, on 1 and
2 threads.  The output is allocated as ``decode()`` allocates its own
(:func:`qformat.kernels.aligned_empty`: 64-byte aligned from 16 MiB, where the kernel streams it).
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from typing import Any

import numpy as np

from qformat import kernels
from qformat.decode import decode
from qformat.descriptor import parse_descriptor
from qformat.dtypes import logical_numpy
from qformat.sources import ArraySource

from .common import MB, Run, _require, _same_bits


def _pk(**kw: Any) -> dict[str, Any]:
    return dict({"container": 8, "bit_order": "lsb_first", "axis": 1}, **kw)


def _grid(g: int, tensor: str, **kw: Any) -> dict[str, Any]:
    return dict({"blocks": {"type": "grid", "size": [1, g]}, "tensor": tensor}, **kw)


def case(kind: str, rows: int, cols: int, rng: np.random.Generator, dtype: str) -> tuple[Any, ArraySource]:
    """(descriptor, source) of one scheme with random codes and realistic parameters."""
    import ml_dtypes

    def nib() -> np.ndarray:
        return rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)

    def sc(g: int, dt: Any = np.float16) -> np.ndarray:
        return (rng.random((rows, cols // g), np.float32) * 0.02 + 1e-3).astype(dt)

    i4 = {"type": "int", "bits": 4, "signedness": "twos_complement"}
    d: dict[str, Any] = {"shape": [rows, cols], "dtype": dtype}
    if kind == "int4 g32":
        d.update(codes={"tensor": "c", "element": i4, "packing": _pk()}, scale=_grid(32, "s", op="multiply"))
        comps = {"c": nib(), "s": sc(32)}
    elif kind == "int4 g128 asym":
        d.update(codes={"tensor": "c", "element": {"type": "int", "bits": 4, "signedness": "unsigned"}, "packing": _pk()},
                 zero=_grid(128, "z"), scale=_grid(128, "s", op="multiply"))
        comps = {"c": nib(), "z": rng.integers(0, 16, (rows, cols // 128), dtype=np.uint8), "s": sc(128)}
    elif kind == "nf4 b64":
        d.update(codes={"tensor": "c", "element": {"type": "codebook", "bits": 4, "table": "nf4"}, "packing": _pk()},
                 scale={"blocks": {"type": "flat", "size": 64}, "op": "multiply", "tensor": "s"})
        comps = {"c": nib(), "s": rng.random(rows * cols // 64, np.float32)}
    elif kind == "int8 g32":
        d.update(codes={"tensor": "c", "element": {"type": "int", "bits": 8, "signedness": "twos_complement"}, "packing": _pk()},
                 scale=_grid(32, "s", op="multiply"))
        comps = {"c": rng.integers(0, 256, (rows, cols), dtype=np.uint8), "s": sc(32)}
    elif kind == "mxfp4":
        d.update(codes={"tensor": "c", "element": {"type": "float", "format": "e2m1fn"}, "packing": _pk()},
                 scale=_grid(32, "s", op="multiply"))
        comps = {"c": nib(), "s": rng.integers(117, 130, (rows, cols // 32), dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)}
    elif kind == "nvfp4":
        g16 = cols // 16
        d.update(codes={"tensor": "c", "element": {"type": "float", "format": "e2m1fn"}, "packing": _pk()},
                 scale={"blocks": {"type": "grid", "size": [1, 16]}, "op": "multiply",
                        "encoded": {"shape": [rows, g16], "dtype": "float32",
                                    "codes": {"tensor": "sc", "element": {"type": "float", "format": "e4m3fn"}, "packing": _pk()},
                                    "scale": {"blocks": {"type": "grid", "size": [None, None]}, "op": "multiply", "tensor": "ss"}}})
        comps = {"c": nib(), "sc": rng.integers(0x20, 0x60, (rows, g16), dtype=np.uint8).view(ml_dtypes.float8_e4m3fn),
                 "ss": np.array(0.0123, np.float32)}
    elif kind == "fp8 e4m3 per-row":
        c = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
        c[(c & 0x7F) == 0x7F] = 0x30  # no NaN codes
        d.update(codes={"tensor": "c", "element": {"type": "float", "format": "e4m3fn"}, "packing": _pk()},
                 scale=_grid(None, "s", op="multiply"))  # type: ignore[arg-type]
        comps = {"c": c.view(ml_dtypes.float8_e4m3fn), "s": rng.random((rows, 1), np.float32)}
    elif kind == "q4_0 planes (GGUF order)":
        d.update(codes={"tensor": "c", "element": {"type": "int", "bits": 4, "signedness": "offset_binary"}, "packing": _pk(planes={"span": 32})},
                 scale=_grid(32, "s", op="multiply"))
        comps = {"c": nib(), "s": sc(32)}
    elif kind == "int3 g64 (stream)":
        d.update(codes={"tensor": "c", "element": {"type": "int", "bits": 3, "signedness": "twos_complement"}, "packing": _pk()},
                 scale=_grid(64, "s", op="multiply"))
        comps = {"c": rng.integers(0, 256, (rows, cols * 3 // 8), dtype=np.uint8), "s": sc(64)}
    else:
        raise KeyError(kind)
    return parse_descriptor("w", d), ArraySource(comps)


KINDS = ["int4 g32", "nf4 b64", "int4 g128 asym", "int8 g32", "mxfp4", "nvfp4", "fp8 e4m3 per-row", "q4_0 planes (GGUF order)",
         "int3 g64 (stream)"]
TARGET_KINDS = ("int4 g32", "nf4 b64")


def bench_kernels(run: Run, rows: int, cols: int) -> None:
    """Native fused decode against memcpy of the output and the NumPy decoder, per scheme."""
    info = kernels.info()
    print(f"\n[kernels] {rows}x{cols}; {info}", flush=True)
    if info["path"] != "native":
        print("  the native kernel is not in use: no rows", flush=True)
        return
    rng = np.random.default_rng(0)
    kinds = ["int4 g32", "nf4 b64"] if run.quick else KINDS
    for kind in kinds:
        for dtype in ("float32", "bfloat16", "float16") if kind in TARGET_KINDS else ("float32",):
            desc, src = case(kind, rows, cols, rng, dtype)
            out = kernels.aligned_empty((rows, cols), logical_numpy(dtype))  # as decode() allocates its output
            nbytes = out.nbytes
            with kernels.use("numpy"):
                ref = decode(desc, src, threads=1)
            _require(_same_bits(decode(desc, src, threads=2), ref), f"native decode of {kind} to {dtype}")
            sec = f"kernels {kind} -> {dtype}"
            print(f" {kind} -> {dtype} ({nbytes / MB:.0f} MB)", flush=True)
            for th in (1, 2):
                with kernels.use("numpy"):
                    run.row(sec, f"numpy decoder, {th} thread{'s' if th > 1 else ''}", run.time(lambda: decode(desc, src, out=out, threads=th)), nbytes)
            for th in (1, 2):
                name = f"native ({info['level']}), {th} thread{'s' if th > 1 else ''}"
                run.row(sec, name, run.time(lambda: decode(desc, src, out=out, threads=th)), nbytes,
                        ref=f"numpy decoder, {th} thread{'s' if th > 1 else ''}")
            _require(_same_bits(out, ref), f"native decode of {kind} to {dtype} into out")
            if kind in TARGET_KINDS and dtype == "float32" and not run.quick:
                for th in (1, 2):
                    r = next(x for x in run.rows if x["section"] == sec and x["name"].endswith(f"{th} thread{'s' if th > 1 else ''}")
                             and x["name"].startswith("native"))
                    run.target(f"native {kind} decode to float32, {th} thread(s), x memcpy (issue 23)", r["x_memcpy"], 0.8)
                    run.target(f"native {kind} decode to float32, {th} thread(s), x the NumPy decoder (issue 23)", r["x_vs"], 4.0)
            del desc, src, out, ref
            gc.collect()


# -- issue 45 item 4: decode into a caller's buffer (out=) and into a fresh array -----------------
#: Schemes of the ``decode out=`` rows: (row name, qformat scheme, its parameters).
OUT_SCHEMES = [("int4 g32", "int", {"bits": 4, "group_size": 32}), ("int8", "int", {"bits": 8, "group_size": None}),
               ("nf4", "nf4", {}), ("mxfp4", "mxfp4", {}), ("fp8 e4m3", "fp8_e4m3", {}),
               ("Q4_K", "gguf", {"type": "Q4_K"}), ("Q6_K", "gguf", {"type": "Q6_K"})]


def _halves(fn: Any, n: int, rows: int) -> None:
    """``fn(lo, hi)`` on ``n`` threads of the decoder's own pool, rows split in ``n`` parts."""
    step = -(-rows // n)
    for _ in kernels.pool(n).map(lambda lo: fn(lo, min(rows, lo + step)), range(0, rows, step)):
        pass


def bench_decode_out(run: Run, rows: int, cols: int, threads: int = 2) -> None:
    """Issue 45 item 4: ``qformat.dequantize(qt, out=buf)`` against ``np.copyto(buf, x)`` of the
    same output (target >= 0.9x), and ``qformat.dequantize(qt)`` into a fresh array against
    ``x.copy()`` (target >= 0.8x; the decode's threads share the fresh array's first touch), per
    scheme, float32 output.

    Both sides are measured the same way: the decode at 1 thread and at ``threads``, and each
    NumPy baseline as NumPy runs it (one thread) and split over ``threads`` threads of the same
    pool (``np.copyto`` of row ranges; for ``x.copy()``: ``np.empty`` and each thread copying its
    rows, so the threads share the first touch as the decode's do).  ``x_vs`` compares with the
    one-thread NumPy baseline (the issue's target), ``x_same_threads`` with the baseline at the
    decode's own thread count.  Also after and before issue 45 (``qformat.decode._BEFORE_ISSUE45``:
    two-level parameters decoded per chunk, 6-bit codes unpacked in NumPy), at ``threads``.  Every
    function is timed in turn in each repetition, so every ratio is paired: ``x_*`` are the
    medians (``min_x_vs`` / ``max_x_vs`` the extremes) of the per-repetition ratios.  The
    one-thread rows also record the calling thread's CPU time (``cpu_ms``, ``cpu_x_vs``: page
    faults included, preemption not), which a loaded machine leaves nearly unchanged where
    wall time doubles.  Every decode is checked bit for bit against the NumPy reference."""
    import qformat
    import qformat.decode as qd

    info = kernels.info()
    print(f"\n[decode out=] {rows}x{cols} float32, 1 and {threads} threads; {info['path']} {info['level']}", flush=True)
    rng = np.random.default_rng(45)
    w = (rng.standard_normal((rows, cols), np.float32) * 0.02).astype(np.float32)
    reps = max(run.reps, 3 if run.quick else 9)
    th = f"{threads} threads"
    for name, scheme, kw in OUT_SCHEMES[:3] if run.quick else OUT_SCHEMES:
        qt = qformat.quantize(w, scheme, **kw)
        with kernels.use("numpy"):
            ref = qt.dequantize()
        buf = np.empty(qt.shape, np.float32)
        x = np.ones(qt.shape, np.float32)
        for t in (1, threads):
            _require(_same_bits(qformat.dequantize(qt, out=buf, threads=t), ref), f"dequantize(out=) of {name}, {t} threads")
            _require(_same_bits(qformat.dequantize(qt, threads=t), ref), f"dequantize of {name}, {t} threads")

        def before(out: Any) -> Any:
            qd._BEFORE_ISSUE45 = True
            try:
                return qformat.dequantize(qt, out=out, threads=threads)
            finally:
                qd._BEFORE_ISSUE45 = False

        def copy_threads() -> np.ndarray:
            y = np.empty_like(x)
            _halves(lambda lo, hi: np.copyto(y[lo:hi], x[lo:hi]), threads, rows)
            return y

        fns = {"np.copyto(buf, x)": lambda: np.copyto(buf, x),
               f"np.copyto(buf, x), {th}": lambda: _halves(lambda lo, hi: np.copyto(buf[lo:hi], x[lo:hi]), threads, rows),
               "dequantize(out=buf), 1 thread": lambda: qformat.dequantize(qt, out=buf, threads=1),
               f"dequantize(out=buf), {th}": lambda: qformat.dequantize(qt, out=buf, threads=threads),
               f"dequantize(out=buf), {th}, before issue 45": lambda: before(buf),
               "x.copy()": lambda: x.copy(),
               f"x.copy(), {th}": copy_threads,
               "dequantize() fresh, 1 thread": lambda: qformat.dequantize(qt, threads=1),
               f"dequantize() fresh, {th}": lambda: qformat.dequantize(qt, threads=threads),
               f"dequantize() fresh, {th}, before issue 45": lambda: before(None)}
        ts: dict[str, list[float]] = {k: [] for k in fns}
        cpu: dict[str, list[float]] = {k: [] for k in fns}
        for f in fns.values():
            f()  # warm-up
        for _ in range(reps):
            for k, f in fns.items():
                c0, t0 = time.thread_time(), time.perf_counter()
                f()
                ts[k].append(time.perf_counter() - t0)
                cpu[k].append(time.thread_time() - c0)
        _require(_same_bits(before(buf), ref), f"dequantize(out=) of {name} before issue 45")
        sec = f"decode out= {name}"
        # row: (one-thread NumPy baseline, baseline at the row's own thread count)
        base = {"dequantize(out=buf), 1 thread": ("np.copyto(buf, x)", "np.copyto(buf, x)"),
                f"dequantize(out=buf), {th}": ("np.copyto(buf, x)", f"np.copyto(buf, x), {th}"),
                f"dequantize(out=buf), {th}, before issue 45": ("np.copyto(buf, x)", f"np.copyto(buf, x), {th}"),
                "dequantize() fresh, 1 thread": ("x.copy()", "x.copy()"),
                f"dequantize() fresh, {th}": ("x.copy()", f"x.copy(), {th}"),
                f"dequantize() fresh, {th}, before issue 45": ("x.copy()", f"x.copy(), {th}")}
        print(f" {name} ({buf.nbytes / MB:.0f} MB out, {reps} paired reps; load average {os.getloadavg()[0]:.1f})", flush=True)
        for k, t in ts.items():
            one = k in ("np.copyto(buf, x)", "x.copy()") or k.endswith("1 thread")
            r = {"section": sec, "name": k, "ms": statistics.median(t) * 1e3, "min_ms": min(t) * 1e3, "out_MB": buf.nbytes / MB,
                 "GBps": buf.nbytes / statistics.median(t) / 1e9, "threads": 1 if one else threads, "reps": reps, "note": ""}
            if one:
                r["cpu_ms"] = statistics.median(cpu[k]) * 1e3
            line = f"  {k:<46} {r['ms']:8.2f} ms (min {r['min_ms']:7.2f})"
            if k in base:
                b1, bt = base[k]
                ratios = [b / a for a, b in zip(t, ts[b1])]
                same = [b / a for a, b in zip(t, ts[bt])]
                r.update(vs=b1, x_vs=statistics.median(ratios), min_x_vs=min(ratios), max_x_vs=max(ratios),
                         vs_same_threads=bt, x_same_threads=statistics.median(same))
                line += f"  {r['x_vs']:5.2f}x {b1} ({min(ratios):.2f}-{max(ratios):.2f})"
                if bt != b1:
                    line += f", {r['x_same_threads']:5.2f}x at {th}"
                if one:
                    r["cpu_x_vs"] = statistics.median(cpu[b1]) / statistics.median(cpu[k])
                    line += f"; CPU {r['cpu_ms']:.2f} ms, {r['cpu_x_vs']:.2f}x"
            elif one:
                line += f"; CPU {r['cpu_ms']:.2f} ms"
            print(line, flush=True)
            run.rows.append(r)
        if not run.quick:
            rr = {x["name"]: x for x in run.rows if x["section"] == sec}
            run.target(f"decode {name} to float32 into out=, {th}, x np.copyto (issue 45)", rr[f"dequantize(out=buf), {th}"]["x_vs"], 0.9)
            run.target(f"decode {name} to float32 into a fresh array, {th}, x x.copy() (issue 45)",
                       rr[f"dequantize() fresh, {th}"]["x_vs"], 0.8)
        del qt, ref, buf, x
        gc.collect()
