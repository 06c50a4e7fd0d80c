"""Section ``encode_native`` (issue 45 item 5): encoder rates on one layer set, in one run.

``python -m bench.encode_native [--reps 3] [--json PATH]`` (default output:
bench/results_encode_native.json).  The tensors: one Llama-shaped layer's four large weights
(2048x2048 attn_q and attn_output, 5632x2048 ffn_up, 2048x5632 ffn_down; seeded normal values
times 0.02, each row times a log-uniform factor in [1/4, 4] so groups differ in range), float32,
120 MiB (MB in the rows: 2^20 bytes).  Every rate is MB/s of float32 input: all four tensors over the
seconds of encoding all four, median of ``--reps``, both wall seconds and CPU seconds (this
process's and its children's user + system time; on a shared, loaded machine the steadier
figure; for 2 threads it is the sum over both).  Ratios are taken within the run:

- qformat ``int`` int4 g32 symmetric / asymmetric and int8 g32 symmetric, on the native path
  (``qformat.kernels``, when built) and the NumPy path (``kernels.use("numpy")``), each on 1 and
  2 threads (``qformat.schemes._common.THREADS``); the two paths' bytes are compared first;
- qformat ``gguf`` for each type in :data:`GGUF_TYPES`, 1 and 2 threads;
- gguf-py's ``gguf.quants.quantize`` Q4_0 and Q8_0 (NumPy, one thread) on the same arrays;
- ``llama-quantize --pure IN OUT TYPE 1`` (one thread) and ``... TYPE 2`` on an F32 GGUF of the
  same tensors: the process's seconds (wall and CPU), less those of ``llama-quantize --pure IN
  OUT COPY`` on as many threads (read, parse and write with no quantization: it writes the F32
  data again, more bytes than any quantized type, so the difference overstates llama-quantize's
  quantizing rate, in its favour).  The
  llama.cpp build is the tests' (tests/llama_cpp.py: GGML_NATIVE=OFF, no AVX); its quantizers
  are ggml's scalar reference functions, which that flag does not change much.  qformat's GGUF
  blocks are checked equal (decoded bits) to llama-quantize's for every type.

- ggml's own ``quantize_<type>`` (llama.cpp's ggml-quants.c, the function llama-quantize's worker
  threads call, built -O3 for the baseline ISA as the tests' llama-quantize is), in this process
  through ctypes, one thread: the quantizing rate without any file I/O.

SQNR (dB, over all four tensors) is printed for every int row and for gguf-py's Q4_0 / Q8_0.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .gguf_quantize import llama_quantize_tool

MB = 1 << 20
SHAPES = {"blk.0.attn_q.weight": (2048, 2048), "blk.0.attn_output.weight": (2048, 2048),
          "blk.0.ffn_up.weight": (5632, 2048), "blk.0.ffn_down.weight": (2048, 5632)}
GGUF_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
INT_CASES = [("int4 g32 sym", {"bits": 4, "group_size": 32}), ("int4 g32 asym", {"bits": 4, "group_size": 32, "symmetric": False}),
             ("int8 g32 sym", {"bits": 8, "group_size": 32})]
RESULTS = Path(__file__).with_name("results_encode_native.json")


def tensors(quick: bool = False) -> dict[str, np.ndarray]:
    """The layer's weights (``quick``: 64-row slices, for the smoke test)."""
    rng = np.random.default_rng(45)
    out = {}
    for name, shape in SHAPES.items():
        shape = (64, shape[1]) if quick else shape
        f = np.exp(rng.uniform(np.log(0.25), np.log(4.0), (shape[0], 1)))
        out[name] = (rng.standard_normal(shape) * 0.02 * f).astype(np.float32)
    return out


def timed(fn: Callable[[], Any], reps: int) -> tuple[float, float]:
    """(median wall seconds, median CPU seconds of this process and its finished children) of
    ``reps`` calls after one warm-up call.  CPU seconds are the steadier figure on a shared
    machine: other processes' load stretches wall time, not CPU time (for several threads they
    are the sum over threads)."""
    fn()
    ts, cs = [], []
    for _ in range(reps):
        c0 = _cpu()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
        cs.append(_cpu() - c0)
    return statistics.median(ts), statistics.median(cs)


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def sqnr(xs: dict[str, np.ndarray], ys: dict[str, np.ndarray]) -> float:
    num = sum(float(np.sum(np.square(x, dtype=np.float64))) for x in xs.values())
    den = sum(float(np.sum(np.square(x.astype(np.float64) - ys[k].astype(np.float64)))) for k, x in xs.items())
    return 10 * np.log10(num / den)


def write_f32_gguf(path: Path, xs: dict[str, np.ndarray]) -> Path:
    """An F32 GGUF llama-quantize accepts: architecture llama, its hyperparameters, the tensors."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("encode-bench")
    w.add_context_length(2048)
    w.add_embedding_length(2048)
    w.add_block_count(1)
    w.add_feed_forward_length(5632)
    w.add_head_count(16)
    w.add_head_count_kv(16)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(128)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    for name, x in xs.items():
        w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def ggml_quants() -> Any:
    """llama.cpp's ggml-quants.c (the sdist the tests use) built here as llama.cpp's Release build
    compiles it (-O3, no -march: the baseline ISA, as the tests' llama-quantize), with
    tests/test_gguf_types.py's stubs; None without the source or a compiler."""
    import ctypes
    import hashlib
    import shutil

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests import llama_cpp_source as src
    from tests.test_gguf_types import _stubs

    cc = shutil.which("cc") or shutil.which("gcc")
    try:
        tree = src.source_dir("ggml/src", "ggml/include")
    except Exception:  # noqa: BLE001 - no source: those rows are skipped
        return None
    if cc is None:
        return None
    stubs = _stubs()
    key = hashlib.sha256((tree / "ggml/src/ggml-quants.c").read_bytes() + stubs.encode()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / f"qformat-bench-ggml-quants-O3-{key}"
    lib = out / "libggml_quants.so"
    if not lib.exists():
        out.mkdir(parents=True, exist_ok=True)
        (out / "stubs.c").write_text(stubs)
        subprocess.run([cc, "-O3", "-shared", "-fPIC", "-std=gnu11", "-DNDEBUG", f"-I{tree}/ggml/include", f"-I{tree}/ggml/src",
                        str(tree / "ggml/src/ggml-quants.c"), str(out / "stubs.c"), "-lm", "-o", str(out / "tmp.so")], check=True,
                       capture_output=True, timeout=600)
        (out / "tmp.so").replace(lib)
    return ctypes.CDLL(str(lib))


def ggml_rate(c: Any, t: str, xs: dict[str, np.ndarray], reps: int) -> tuple[float, float]:
    """Seconds of ggml's ``quantize_<type>`` (what llama-quantize's workers call, no importance
    matrix) over the tensors, one thread, and the blocks of the last call for a check."""
    import ctypes

    from qformat.schemes.ggml_blocks import SIZES

    fn = getattr(c, "quantize_" + (t[:-2].lower() + "_K" if t.endswith("_K") else t.lower()))
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    block, size = SIZES[t]
    outs = {k: np.empty(x.size // block * size, np.uint8) for k, x in xs.items()}

    def once() -> None:
        for k, x in xs.items():
            fn(x.ctypes.data, outs[k].ctypes.data, x.shape[0], x.shape[1], None)
    return timed(once, reps)


def run_tool(tool: Path, src: Path, dst: Path, typ: str, threads: int, reps: int) -> tuple[float, float]:
    def once() -> None:
        r = subprocess.run([str(tool), "--pure", str(src), str(dst), typ, str(threads)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-2000:])
    return timed(once, reps)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.encode_native", description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=str(RESULTS))
    ap.add_argument("--types", default=",".join(GGUF_TYPES))
    ap.add_argument("--quick", action="store_true", help="64-row tensors, Q4_0 only, no llama.cpp rows (the smoke test)")
    a = ap.parse_args(argv)
    if a.quick:
        a.types, a.reps = "Q4_0", 1
    import gguf
    from gguf import GGUFReader
    from gguf.quants import dequantize, quantize

    import qformat
    from qformat import kernels
    from qformat.schemes import _common

    xs = tensors(a.quick)
    mb = sum(x.nbytes for x in xs.values()) / MB
    rows: list[dict[str, Any]] = []
    info = {"python": sys.version.split()[0], "numpy": np.__version__, "cpus": os.cpu_count(), "reps": a.reps,
            "kernels": kernels.info()["path"], "level": kernels.info()["level"], "MB_in": mb,
            "encode_native": getattr(kernels, "encode_available", lambda: False)()}
    print(json.dumps(info), flush=True)

    def add(name: str, wc: tuple[float, float], **extra: Any) -> dict[str, Any]:
        r = {"section": "encode_native", "name": name, "s": wc[0], "cpu_s": wc[1], "MBps": mb / wc[0], "MBps_cpu": mb / wc[1], **extra}
        rows.append(r)
        more = "".join(f"  {k}={v:.2f}" if isinstance(v, float) else f"  {k}={v}" for k, v in extra.items())
        print(f"  {name:<46} wall {wc[0]:7.3f} s {r['MBps']:7.1f} MB/s   CPU {wc[1]:7.3f} s {r['MBps_cpu']:7.1f} MB/s{more}", flush=True)
        return r

    def by_threads(fn: Callable[[], Any], threads: int) -> tuple[float, float]:
        before = _common.THREADS
        _common.THREADS = threads
        try:
            return timed(fn, a.reps)
        finally:
            _common.THREADS = before

    T = gguf.GGMLQuantizationType
    base = {}
    for t in ("Q4_0", "Q8_0"):
        ys = {k: dequantize(quantize(x, T[t]), T[t]) for k, x in xs.items()}
        base[t] = add(f"gguf-py quantize {t} (NumPy)", timed(lambda: [quantize(x, T[t]) for x in xs.values()], a.reps),
                      sqnr_dB=sqnr(xs, ys))
    q40 = base["Q4_0"]
    for name, kw in INT_CASES:
        want = {k: qformat.quantize(x, "int", **kw) for k, x in xs.items()}
        s = sqnr(xs, {k: q.dequantize() for k, q in want.items()})
        paths = [("native", "auto"), ("numpy", "numpy")] if info["encode_native"] else [("numpy", "numpy")]
        for pname, choice in paths:
            with kernels.use(choice):
                got = {k: qformat.quantize(x, "int", **kw) for k, x in xs.items()}
                same = all(got[k].components[c].tobytes() == want[k].components[c].tobytes() for k in xs for c in want[k].components)
                if not same:
                    raise AssertionError(f"{name}: {pname} path's bytes differ")
                for th in (1, 2):
                    r = add(f"qformat {name} {pname}, {th} thread{'s' * (th > 1)}",
                            by_threads(lambda: [qformat.quantize(x, "int", **kw) for x in xs.values()], th), sqnr_dB=s)
                    # wall ratio against gguf-py's (one thread) wall; CPU ratio on one thread only
                    r["x_gguf_py_q4_0"] = q40["s"] / r["s"]
                    if th == 1:
                        r["x_gguf_py_q4_0_cpu"] = q40["cpu_s"] / r["cpu_s"]
                    print(f"    {r['x_gguf_py_q4_0']:.2f}x gguf-py Q4_0 (wall)" + (f", {r['x_gguf_py_q4_0_cpu']:.2f}x (CPU)" if th == 1 else "")
                          + f"; SQNR {s:.2f} dB, gguf-py Q4_0 {q40['sqnr_dB']:.2f} dB", flush=True)
    types = [t for t in a.types.split(",") if t]
    tool = None if a.quick else llama_quantize_tool()
    with tempfile.TemporaryDirectory(prefix="qformat-encode-bench-") as tmp:
        src = write_f32_gguf(Path(tmp) / "f32.gguf", xs) if tool else None
        io_s = {}
        if tool:
            for th in (1, 2):
                io_s[th] = run_tool(tool, src, Path(tmp) / "copy.gguf", "COPY", th, a.reps)
                add(f"llama-quantize COPY (I/O only), {th} thread{'s' * (th > 1)}", io_s[th])
        cq = None if a.quick else ggml_quants()
        for t in types:
            ref = None
            for th in (1, 2):
                r = add(f"qformat gguf {t}, {th} thread{'s' * (th > 1)}", by_threads(lambda: [qformat.quantize(x, "gguf", type=t) for x in xs.values()], th))
            if cq is not None:
                g1 = add(f"ggml quantize_{t} (llama.cpp's C, -O3), 1 thread", ggml_rate(cq, t, xs, a.reps))
                q1 = next(r for r in rows if r["name"] == f"qformat gguf {t}, 1 thread")
                q2 = next(r for r in rows if r["name"] == f"qformat gguf {t}, 2 threads")
                q1["x_ggml_1t"], q1["x_ggml_1t_cpu"] = g1["s"] / q1["s"], g1["cpu_s"] / q1["cpu_s"]
                q2["x_ggml_1t"] = g1["s"] / q2["s"]
                print(f"    {t}: qformat 1 thread {q1['x_ggml_1t']:.2f}x ggml's 1 thread (wall), {q1['x_ggml_1t_cpu']:.2f}x (CPU); "
                      f"qformat 2 threads {q2['x_ggml_1t']:.2f}x ggml's 1 thread (wall)", flush=True)
            if tool:
                out = Path(tmp) / f"{t}.gguf"
                for th in (1, 2):
                    w = run_tool(tool, src, out, t, th, a.reps)
                    add(f"llama-quantize {t}, {th} thread{'s' * (th > 1)} (less COPY)", (w[0] - io_s[th][0], w[1] - io_s[th][1]),
                        process_wall_s=w[0], process_cpu_s=w[1])
                # decoded bits: gguf-py's dequantize of llama-quantize's blocks against qformat's decode
                ref = {tt.name: dequantize(np.asarray(tt.data), T[t]).astype(np.float32) for tt in GGUFReader(str(out)).tensors}
                for k, x in xs.items():
                    mine = qformat.quantize(x, "gguf", type=t).dequantize().astype(np.float32)
                    if mine.reshape(ref[k].shape).tobytes() != ref[k].tobytes():
                        raise AssertionError(f"{t} {k}: qformat's blocks differ from llama-quantize's")
                q1 = next(r for r in rows if r["name"] == f"qformat gguf {t}, 1 thread")
                q2 = next(r for r in rows if r["name"] == f"qformat gguf {t}, 2 threads")
                l1 = next(r for r in rows if r["name"] == f"llama-quantize {t}, 1 thread (less COPY)")
                l2 = next(r for r in rows if r["name"] == f"llama-quantize {t}, 2 threads (less COPY)")
                q1["x_llama_quantize_1t"] = l1["s"] / q1["s"]
                q1["x_llama_quantize_1t_cpu"] = l1["cpu_s"] / q1["cpu_s"]
                q2["x_llama_quantize_2t"] = l2["s"] / q2["s"]
                q2["x_llama_quantize_1t"] = l1["s"] / q2["s"]
                print(f"    {t}: blocks equal; 1 thread: {q1['x_llama_quantize_1t']:.2f}x llama-quantize (wall), "
                      f"{q1['x_llama_quantize_1t_cpu']:.2f}x (CPU); 2 threads: {q2['x_llama_quantize_2t']:.2f}x llama-quantize 2 threads (wall), "
                      f"{q2['x_llama_quantize_1t']:.2f}x its 1 thread", flush=True)
    res = {"info": info, "rows": rows}
    Path(a.json).write_text(json.dumps(res, indent=1))
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
