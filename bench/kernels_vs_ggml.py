"""Section ``kernels_vs_ggml`` (issue 45 item 1): qformat's packed-weight matmul kernels against
ggml's, torch's and the machine's own read bandwidth, on real layer shapes, in one run.

``python -m bench --only kernels_vs_ggml [--quick]``.  For each weight shape ``N x K`` (out x in
features: SmolLM2-135M 576x1536 and 1536x576, Gemma 3 270M 640x2048 and 2048x640, 7B-sized
4096x14336 and 14336x4096) and batch ``M`` in :data:`BATCHES` (1, 2, 4, 8, 512):

- qformat: :func:`qformat.kernels.matmul` on the operands ``QLinear`` prepares for a bfloat16
  model's weight quantized with int4 g32, int8 (per channel), nf4, mxfp4, Q4_K and Q6_K (the
  K-quants only where K is a multiple of 256), float32 activations holding bfloat16 values and
  ``bf16`` as QLinear passes it; 1 thread and all (:data:`THREADS`);
- ggml: ``test-backend-ops perf -o MUL_MAT --test-file`` (its console lines: its CSV has no
  times) with one MUL_MAT case per (type, shape,
  batch), the equivalent types q4_0, q8_0, iq4_nl, mxfp4, q4_K, q6_K (and bf16), float32
  activations, built from llama-cpp-python's sdist by tests/llama_cpp.py (:data:`FLAGS`: the
  ``llama_cpp_speed`` native build with llama.cpp's tests on).  test-backend-ops runs its CPU
  backend on ``hardware_concurrency() / 2`` threads (1 on a 2-CPU machine), so ggml's rows say
  their thread count; its timing repeats the op in one graph, the weight staying in cache where
  it fits, as the Python rows here repeat theirs;
- torch: ``F.linear`` in bfloat16, and torch's own int4 / int8 CPU kernels
  (``_weight_int4pack_mm_for_cpu``, ``_weight_int8pack_mm``) through qformat_torch's kernel paths,
  each only where its capability probe passes (qformat_torch.kernels.probe);
- the read bandwidth: ``numpy`` sum of a uint64 view of the same number of bytes as each row's
  weight operand (split over the threads), repeated like the kernels.

Every row: time (median of the repetitions; ``min_ms`` too), the weight operand's bytes and the
GB/s they were read at, ``x_bw`` (that over the streaming read's GB/s at the same thread count)
and ``x_ggml`` (ggml's time of the equivalent type, same shape and batch, over this row's;
threads as each ran).  The Markdown table: :func:`markdown`.  The machine: CPU model and flags in
the section's ``machine`` row.

``python -m bench.kernels_vs_ggml batch [OUT.json]`` (issue 45 item 3): :func:`batch_vs_bf16`, the
ratios against torch's bfloat16 ``F.linear`` alone, on one thread timed by the thread's CPU time
(a shared, loaded machine preempts a thread; its CPU time is what the work took), the baseline
timed again next to every qformat row, with the few-rows path switched off too (the rows_* paths).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

SECTION = "kernels_vs_ggml"
ROOT = Path(__file__).resolve().parents[1]

#: cmake options of the ``test-backend-ops`` build (with :data:`TOOLS`, the build cache's key):
#: bench/llama_cpp_speed.py's native speed build (GGML_NATIVE=ON, static, ggml's own threads, no
#: AMX) with llama.cpp's tests switched on, since ``test-backend-ops`` is one of them.
FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=ON",
    "-DGGML_OPENMP=OFF", "-DGGML_CCACHE=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=ON",
    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
    "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
    "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
)
TOOLS = ("test-backend-ops",)
# built by bench/llama_cpp_speed.py's builder (its JOBS and NICE), the same Skip
from .llama_cpp_speed import Skip, _lc, build_tools  # noqa: E402


def tools_dir(build: bool) -> tuple[Path, dict[str, Any]]:
    """(folder of ``test-backend-ops``, the build's record), building it (niced) when ``build`` and missing."""
    return build_tools(SECTION, FLAGS, TOOLS, build, "ggml's test-backend-ops", "10-20")


# -- the measurement ---------------------------------------------------------------------------------
import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

import numpy as np  # noqa: E402

#: (model, N out features, K in features)
SHAPES = [("SmolLM2-135M", 576, 1536), ("SmolLM2-135M", 1536, 576), ("Gemma 3 270M", 640, 2048), ("Gemma 3 270M", 2048, 640),
          ("7B", 4096, 14336), ("7B", 14336, 4096)]
BATCHES = (1, 2, 4, 8, 512)
THREADS = (1, 2)
#: (row name, qformat scheme, parameters, ggml type)
SCHEMES = [("int4 g32", "int", {"bits": 4, "group_size": 32}, "q4_0"), ("int8", "int", {"bits": 8, "group_size": None}, "q8_0"),
           ("nf4", "nf4", {}, "iq4_nl"), ("mxfp4", "mxfp4", {}, "mxfp4"), ("Q4_K", "gguf", {"type": "Q4_K"}, "q4_K"),
           ("Q6_K", "gguf", {"type": "Q6_K"}, "q6_K")]
#: ggml's block size and bytes per block of the types here
GGML_BLOCKS = {"q4_0": (32, 18), "q8_0": (32, 34), "iq4_nl": (32, 18), "mxfp4": (32, 17), "q4_K": (256, 144), "q6_K": (256, 210),
               "bf16": (1, 2), "f32": (1, 4)}


def machine() -> dict[str, Any]:
    """CPU model, flags (the ones that matter here) and count, from /proc/cpuinfo."""
    model, flags = platform.processor(), set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and model in ("", "x86_64"):
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    keep = sorted(f for f in flags if re.match(r"(avx|amx|fma|f16c|sse4_2|bmi2|vnni)", f))
    return {"cpu": model, "cpus": os.cpu_count(), "flags": keep}


def _timeit(fn: Any, reps: int) -> list[float]:
    """Seconds of ``reps`` calls after one warm-up call."""
    fn()
    ts: list[float] = []
    while len(ts) < reps:
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts


_POOL: dict[int, ThreadPoolExecutor] = {}


def read_bandwidth(nbytes: int, threads: int, reps: int) -> float:
    """Seconds (median) to read ``nbytes`` (a uint64 sum, split over ``threads``), repeated like the kernels."""
    a = np.ones(max(1, nbytes // 8), np.uint64)
    parts = np.array_split(a, threads)
    if threads == 1:
        return statistics.median(_timeit(lambda: a.sum(), reps))
    pool = _POOL.setdefault(threads, ThreadPoolExecutor(threads))
    return statistics.median(_timeit(lambda: list(pool.map(np.sum, parts)), reps))


def _ggml_enums(src: Path) -> tuple[int, dict[str, int]]:
    """(GGML_OP_MUL_MAT's number, type name -> number) from the source's ggml.h."""
    h = (src / "ggml" / "include" / "ggml.h").read_text()
    types = {m.group(1).lower().replace("q4_k", "q4_K").replace("q6_k", "q6_K"): int(m.group(2))
             for m in re.finditer(r"GGML_TYPE_(\w+)\s*=\s*(\d+)", h)}
    body = h[h.index("enum ggml_op {"):]
    body = body[: body.index("};")]
    ops = re.findall(r"^\s*(GGML_OP_\w+)", body, re.M)
    return ops.index("GGML_OP_MUL_MAT") - ops.index("GGML_OP_NONE"), types


def ggml_times(cases: list[tuple[str, int, int, int]], tools: Path, src: Path) -> dict[tuple[str, int, int, int], float]:
    """Seconds per MUL_MAT of ggml for each (type, N, K, M): ``test-backend-ops perf`` on a test
    file of generic MUL_MAT cases (src0: the N x K weight of the type, src1: K x M float32)."""
    op, types = _ggml_enums(src)
    lines, names = [], {}
    for i, (t, n, k, m) in enumerate(cases):
        blk, size = GGML_BLOCKS[t]
        rb = k // blk * size
        name = f"c{i}"
        names[name] = (t, n, k, m)
        lines.append(" ".join(str(v) for v in [op, types["f32"], n, m, 1, 1, 0, 2,
                                                 types[t], k, n, 1, 1, size, rb, rb * n, rb * n,
                                                 types["f32"], k, m, 1, 1, 4, 4 * k, 4 * k * m, 4 * k * m, name]))
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "cases.txt"
        f.write_text("\n".join(lines) + "\n")
        p = subprocess.run([str(tools / "test-backend-ops"), "perf", "-b", "CPU", "-o", "MUL_MAT", "--test-file", str(f)],
                           capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise Skip(f"test-backend-ops failed ({p.returncode}): {p.stderr[-1500:]}")
    # console lines: "MUL_MAT(name=c0,type=f32,...):   565248 runs -     1.78 us/run - ..." (its CSV has no times)
    out: dict[tuple[str, int, int, int], float] = {}
    for mm in re.finditer(r"MUL_MAT\(name=(c\d+),.*?\):\s+\d+ runs -\s+([0-9.]+) us/run", p.stdout):
        if mm.group(1) in names:
            out[names[mm.group(1)]] = float(mm.group(2)) * 1e-6
    if not out:
        raise Skip(f"test-backend-ops printed no MUL_MAT timings: {p.stdout[-1500:]} {p.stderr[-800:]}")
    return out


def _ggml_threads() -> int:
    return max(1, (os.cpu_count() or 1) // 2)


def bench_kernels_vs_ggml(run: Any, quick: bool = False) -> None:
    """The section (see the module docstring)."""
    import ml_dtypes
    import torch

    import qformat
    from qformat import kernels as qk
    from qformat_torch import kernels as tk
    from qformat_torch.nn import QLinear

    mach = machine()
    print(f"\n[{SECTION}] {json.dumps(mach)}", flush=True)
    run.rows.append({"section": SECTION, "name": "machine", **mach, "ggml_threads": _ggml_threads(), "note": "CPU model and flags"})
    shapes = [("tiny", 64, 512)] if quick else SHAPES
    batches = (1, 4) if quick else BATCHES
    reps = 2 if quick else max(5, run.reps)
    rng = np.random.default_rng(45)
    pending: list[dict[str, Any]] = []
    cases: list[tuple[str, int, int, int]] = []
    for model, n, k in shapes:
        w = (rng.standard_normal((n, k), np.float32) * 0.02).astype(ml_dtypes.bfloat16)
        wt = torch.from_numpy(w.view(np.uint16)).view(torch.bfloat16)
        xs = {m: rng.standard_normal((m, k), np.float32).astype(ml_dtypes.bfloat16).astype(np.float32) for m in batches}
        shape = f"{n}x{k}"

        def add(name: str, m: int, th: Any, secs: list[float], wbytes: int, ggml: str | None, note: str = "") -> None:
            pending.append({"section": SECTION, "shape": shape, "model": model, "batch": m, "threads": th, "name": name,
                            "ms": statistics.median(secs) * 1e3, "min_ms": min(secs) * 1e3, "weight_MB": wbytes / 1e6,
                            "GBps": wbytes / statistics.median(secs) / 1e9, "ggml_type": ggml, "note": note})

        # torch bf16
        for th in THREADS:
            torch.set_num_threads(th)
            for m in batches:
                xt = torch.from_numpy(xs[m]).to(torch.bfloat16)
                with torch.inference_mode():
                    add("torch bf16 F.linear", m, th, _timeit(lambda: torch.nn.functional.linear(xt, wt), reps), wt.numel() * 2, "bf16")
        cases += [("bf16", n, k, m) for m in batches]
        for name, scheme, kw, gtype in SCHEMES:
            if scheme == "gguf" and k % 256:
                print(f"  {shape} {name}: n/a (K = {k} is not a multiple of 256)", flush=True)
                continue
            q = qformat.quantize(w, scheme, **kw)
            layer = QLinear(q, kernel="native")
            p = layer._native
            cases += [(gtype, n, k, m) for m in batches]
            if p is None or p.path.name != "lut_grouped":
                print(f"  {shape} {name}: qformat's kernel does not take it ({p and p.path.name})", flush=True)
            else:
                t = p.tensors
                arr = lambda nm: t[nm].numpy() if nm in t else None  # noqa: E731
                args = (t["codes"].numpy(), p.meta["kind"], t["table"].numpy(), p.meta["group"], arr("zero"), arr("scale"), arr("bias"))
                wbytes = sum(int(a.nbytes) for a in (args[0], args[4], args[5], args[6]) if a is not None)
                for th in THREADS:
                    for m in batches:
                        out = np.empty((m, n), np.float32)
                        x = xs[m]
                        secs = _timeit(lambda: qk.matmul(x, *args, out, threads=th, bf16=bool(p.meta.get("bf16_normal"))), reps)
                        add(f"qformat {name} ({p.meta['kind']}, g{p.meta['group']})", m, th, secs, wbytes, gtype,
                            f"stored {q.nbytes / 1e6:.1f} MB")
            # torch's own int4 / int8 kernels where their probe passes and the weight maps
            comps = layer.component_tensors()
            for path in tk.PATHS:
                if path.name == "lut_grouped" or not path.match(layer._parsed, torch.device("cpu")) or not tk.probe(path):
                    continue
                tp = path.prepare(layer._parsed, comps, "native")
                if tp is None:
                    continue
                wbytes = sum(int(v.numel() * v.element_size()) for v in tp.tensors.values())
                for th in THREADS:
                    torch.set_num_threads(th)
                    for m in batches:
                        xt = torch.from_numpy(xs[m]).to(torch.bfloat16)
                        with torch.inference_mode():
                            add(f"torch {path.name} ({name})", m, th, _timeit(lambda: path.forward(tp, xt), reps), wbytes, gtype)
            del layer, p, q
        torch.set_num_threads(max(THREADS))
    # the streaming read of each row's bytes, per thread count
    bw: dict[tuple[int, int], float] = {}
    for r in pending:
        key = (int(r["weight_MB"] * 1e6), r["threads"])
        if key not in bw:
            bw[key] = key[0] / read_bandwidth(key[0], key[1], reps) / 1e9
        r["read_GBps"] = bw[key]
        r["x_bw"] = r["GBps"] / bw[key]
    # ggml (its build, when missing, after the rows above: a first run builds while nothing is timed)
    try:
        tools, rec = tools_dir(build=not quick)
        src = _lc().source_dir()
        ggml_err = None
    except Skip as e:
        tools, rec, src, ggml_err = None, None, None, str(e)
        print(f"  ggml skipped: {e}", flush=True)
    if rec:
        run.rows.append({"section": SECTION, "name": "ggml build", "note": json.dumps(rec)})
    gt: dict[tuple[str, int, int, int], float] = {}
    if tools is not None and src is not None:
        try:
            print(f"  ggml: {len(cases)} MUL_MAT cases on {_ggml_threads()} thread(s) ...", flush=True)
            gt = ggml_times(cases, tools, src)
        except (Skip, OSError, subprocess.SubprocessError) as e:
            ggml_err = str(e)
            print(f"  ggml skipped: {e}", flush=True)
    for (t, n, k, m), secs in sorted(gt.items()):
        blk, size = GGML_BLOCKS[t]
        wbytes = k // blk * size * n
        key = (wbytes, _ggml_threads())
        if key not in bw:
            bw[key] = wbytes / read_bandwidth(wbytes, key[1], reps) / 1e9
        model = next(s[0] for s in shapes if s[1] == n and s[2] == k)
        pending.append({"section": SECTION, "shape": f"{n}x{k}", "model": model, "batch": m, "threads": _ggml_threads(),
                        "name": f"ggml {t}", "ms": secs * 1e3, "min_ms": secs * 1e3, "weight_MB": wbytes / 1e6,
                        "GBps": wbytes / secs / 1e9, "ggml_type": t, "read_GBps": bw[key], "x_bw": wbytes / secs / 1e9 / bw[key],
                        "note": "test-backend-ops perf (mean over its runs)"})
    if ggml_err:
        run.rows.append({"section": SECTION, "name": "ggml (skipped)", "note": ggml_err})
    for r in pending:
        g = gt.get((r["ggml_type"], *map(int, r["shape"].split("x")), r["batch"])) if r["ggml_type"] else None
        if g is not None and not r["name"].startswith("ggml"):
            r["x_ggml"] = g * 1e3 / r["ms"]
        run.rows.append(r)
        print(f"  {r['shape']:>11} M={r['batch']:<4} t={r['threads']} {r['name']:<40} {r['ms']:9.3f} ms {r['GBps']:7.2f} GB/s "
              f"{r['x_bw']:5.2f}x read" + (f" {r['x_ggml']:5.2f}x ggml" if 'x_ggml' in r else ""), flush=True)
    print(markdown(run.rows), flush=True)


def markdown(rows: list[dict[str, Any]]) -> str:
    """The section's rows as one Markdown table (plus the machine line)."""
    mach = next((r for r in rows if r.get("section") == SECTION and r.get("name") == "machine"), None)
    skipped = next((r for r in rows if r.get("section") == SECTION and r.get("name") == "ggml (skipped)"), None)
    lines = []
    if mach:
        lines.append(f"Machine: {mach['cpu']}, {mach['cpus']} CPUs; flags: {' '.join(mach['flags'])}; ggml ran on {mach['ggml_threads']} thread(s).")
    if skipped:
        lines.append(f"ggml: not measured ({skipped['note']}).")
    lines += ["", "| shape (N x K) | batch | threads | kernel | ms | weight MB | GB/s | x read bw | x ggml |",
              "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    data = [r for r in rows if r.get("section") == SECTION and "shape" in r]
    data.sort(key=lambda r: (SHAPES.index(next(s for s in SHAPES if f"{s[1]}x{s[2]}" == r["shape"])) if any(f"{s[1]}x{s[2]}" == r["shape"] for s in SHAPES) else 0,
                             r["batch"], r["name"], r["threads"]))
    for r in data:
        xg = f"{r['x_ggml']:.2f}" if "x_ggml" in r else ""
        lines.append(f"| {r['model']} {r['shape']} | {r['batch']} | {r['threads']} | {r['name']} | {r['ms']:.3f} | {r['weight_MB']:.1f} | "
                     f"{r['GBps']:.1f} | {r['x_bw']:.2f} | {xg} |")
    return "\n".join(lines)


# -- issue 45 item 3: batch 2-8 and 512 against torch bf16, one thread, CPU time -----------------------
BATCH_SHAPES = [("7B", 4096, 14336), ("7B", 14336, 4096)]
BATCH_SCHEMES = ["int4 g32", "nf4", "mxfp4", "int8", "Q4_K"]


def batch_vs_bf16(batches: tuple[int, ...] = (1, 2, 4, 8, 512), schemes: list[str] | None = None, reps: int = 5,
                  shapes: list[tuple[str, int, int]] | None = None) -> list[dict[str, Any]]:
    """Rows of (shape, batch, scheme): qformat's kernel time (median of ``reps`` after a warm-up,
    the thread's CPU time, one thread), GB/s of its weight operand, torch bf16's time measured
    around it (the mean of the medians before and after) and the ratio; ``few_off_ms``: the same
    call with the few-rows path switched off (``_matmul.few(0)``), where the batch takes it;
    ``table_off_ms``: with the bfloat16-table path switched off (``_matmul.bf1(0)``: the binary32
    and bfloat16-weight paths), at 1 to 8 rows."""
    import ml_dtypes
    import torch

    import qformat
    from qformat import kernels as qk
    from qformat.kernels import _matmul
    from qformat_torch.nn import QLinear

    torch.set_num_threads(1)
    clk = time.thread_time

    def med(fn: Any) -> float:
        fn()
        ts = []
        for _ in range(reps):
            t0 = clk()
            fn()
            ts.append(clk() - t0)
        return statistics.median(ts)

    names = {s[0]: s for s in SCHEMES}
    rng = np.random.default_rng(45)
    rows: list[dict[str, Any]] = []
    for model, n, k in shapes or BATCH_SHAPES:
        w = (rng.standard_normal((n, k), np.float32) * 0.02).astype(ml_dtypes.bfloat16)
        wt = torch.from_numpy(w.view(np.uint16)).view(torch.bfloat16)
        preps = {}
        for name in schemes or BATCH_SCHEMES:
            _, scheme, kw, _ = names[name]
            p = QLinear(qformat.quantize(w, scheme, **kw), kernel="native")._native
            t = p.tensors
            arr = lambda nm: t[nm].numpy() if nm in t else None  # noqa: E731
            args = (t["codes"].numpy(), p.meta["kind"], t["table"].numpy(), p.meta["group"], arr("zero"), arr("scale"), arr("bias"))
            preps[name] = (args, sum(int(a.nbytes) for a in (args[0], args[4], args[5], args[6]) if a is not None),
                           bool(p.meta.get("bf16_normal")), f"{p.meta['kind']}, g{p.meta['group']}")
        for m in batches:
            x = rng.standard_normal((m, k), np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
            xt = torch.from_numpy(x).to(torch.bfloat16)
            with torch.inference_mode():
                bf_before = med(lambda: torch.nn.functional.linear(xt, wt))
            for name, (args, wbytes, bf, desc) in preps.items():
                out = np.empty((m, n), np.float32)
                call = lambda: qk.matmul(x, *args, out, threads=1, bf16=bf)  # noqa: E731
                tq = med(call)
                off = toff = None
                if 2 <= m <= 4:  # the few-rows path's batches (FEWMAX in _matmul.c)
                    _matmul.few(0)
                    try:
                        off = med(call)
                    finally:
                        _matmul.few(1)
                if m <= 8:  # the bfloat16-table path's batches (BFS_MAX)
                    _matmul.bf1(0)
                    try:
                        toff = med(call)
                    finally:
                        _matmul.bf1(1)
                with torch.inference_mode():
                    bf_after = med(lambda: torch.nn.functional.linear(xt, wt))
                tb = (bf_before + bf_after) / 2
                bf_before = bf_after
                r = {"section": SECTION + " batch", "shape": f"{n}x{k}", "model": model, "batch": m, "threads": 1,
                     "name": f"qformat {name} ({desc})", "ms": tq * 1e3, "GBps": wbytes / tq / 1e9, "weight_MB": wbytes / 1e6,
                     "bf16_ms": tb * 1e3, "bf16_GBps": wt.numel() * 2 / tb / 1e9, "x_bf16": tb / tq, "clock": "thread CPU time"}
                if off is not None:
                    r["few_off_ms"] = off * 1e3
                    r["few_off_x_bf16"] = tb / off
                if toff is not None:
                    r["table_off_ms"] = toff * 1e3
                    r["table_off_x_bf16"] = tb / toff
                rows.append(r)
                print(f"  {r['shape']:>11} M={m:<4} {name:<9} {r['ms']:9.3f} ms {r['GBps']:6.2f} GB/s  torch bf16 {r['bf16_ms']:9.3f} ms  "
                      f"x{r['x_bf16']:5.2f}" + (f"  (few off {r['few_off_ms']:8.3f} ms x{r['few_off_x_bf16']:5.2f})" if off else "")
                      + (f"  (table off {r['table_off_ms']:8.3f} ms x{r['table_off_x_bf16']:5.2f})" if toff else ""), flush=True)
    return rows


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 1 and sys.argv[1] == "batch":
        out = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "bench" / "results_batch_avx512.json"
        res = batch_vs_bf16()
        out.write_text(json.dumps({"machine": machine(), "rows": res}, indent=1) + "\n")
        print(f"wrote {out}")
    else:
        sys.exit("usage: python -m bench.kernels_vs_ggml batch [OUT.json]  (the section itself: python -m bench --only kernels_vs_ggml)")
