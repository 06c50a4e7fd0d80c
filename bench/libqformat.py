"""The ``libqformat`` section: the C library's decode (issue 41 items 2 and 8) against memcpy.

libqformat decodes with the same fused kernel as the Python package (libqformat/src/kernel.c,
one C decoder source).  The section writes one file with qformat.quantize + qformat.save_file
(int4 g32, nf4, fp8_e4m3 per row, gguf Q4_K; 2048 x 8192 each), compiles the timing program
bench/libqformat_bench.c against libqformat/src/*.c (gcc -O3 -ffp-contract=off: the flags of the
CMake Release build; at -O2 gcc leaves the parameter loops scalar) and runs it:
each tensor decoded to float32 into a warm caller buffer, 1 and 2 threads (pthreads over row
ranges), next to memcpy of the same output size timed in the same process (``x_memcpy`` =
memcpy time / decode time, median of ``--reps``), through the public ``qf_decode_rows`` and
through ``qf_decode_into`` (the fused whole of a decode that api.c's decode_impl calls once
it is switched over; both checked equal bit for bit); and a row slice (1/16 of the rows) decoded
with every other page of the tensor's stored bytes unreadable, which succeeds only if the
decode reads nothing but its rows' bytes (SPEC.md 8.4).  Target (issue 41): >= 0.8x memcpy on
one thread for the four.  Skipped, with a row saying why, where no C compiler is found.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np

import qformat

from .common import Run

ROOT = Path(__file__).resolve().parent.parent
LIB = ROOT / "libqformat"
SCHEMES = (("int4 g32", "int", {"bits": 4, "group_size": 32}), ("nf4", "nf4", {}), ("fp8_e4m3 per row", "fp8_e4m3", {}),
           ("gguf Q4_K", "gguf", {"type": "Q4_K"}))


def _compile(tmp: str) -> tuple[Path | None, str]:
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if cc is None:
        return None, "no C compiler"
    exe = Path(tmp) / "libqformat_bench"
    srcs = sorted(str(p) for p in (LIB / "src").glob("*.c"))
    cmd = [cc, "-O3", "-std=c11", "-ffp-contract=off", "-D_GNU_SOURCE", "-DNDEBUG", f"-I{LIB / 'include'}", f"-I{LIB / 'src'}",
           str(ROOT / "bench" / "libqformat_bench.c"), *srcs, "-lm", "-lpthread", "-o", str(exe)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return None, "the timing program did not compile: " + p.stderr[-2000:]
    return exe, ""


def bench_libqformat(run: Run, tmp: str, rows: int, cols: int) -> None:
    """libqformat's decode of four schemes against memcpy, 1 and 2 threads, and a row slice."""
    print(f"\n[libqformat] {rows}x{cols} per tensor", flush=True)
    exe, why = _compile(tmp)
    if exe is None:
        print(f"[libqformat] skipped: {why}", flush=True)
        run.rows.append({"section": "libqformat", "name": "libqformat (skipped)", "skipped": why})
        return
    rng = np.random.default_rng(41)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    tensors = {name: qformat.quantize(x, scheme, **kw) for name, scheme, kw in SCHEMES}
    path = Path(tmp) / "libqformat-bench.safetensors"
    qformat.save_file(tensors, path)
    try:
        p = subprocess.run([str(exe), str(path), str(run.reps), *tensors], capture_output=True, text=True, timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"libqformat_bench failed ({p.returncode}): {p.stderr[-2000:]}")
        for line in p.stdout.splitlines():
            r = json.loads(line)
            if "slice" in r:
                name = f"{r['tensor']}: rows {r['slice'][0]}..{r['slice'][1]} of {r['rows']} (others unreadable)"
                row = {"section": "libqformat", "name": name, "ms": r["ms"], "whole_ms": r["whole_ms"],
                       "time_fraction": r["time_fraction"], "row_fraction": r["row_fraction"],
                       "read_only_its_rows": r["read_only_its_rows"], "unreadable_bytes": r["unreadable_bytes"],
                       "component_bytes": r["component_bytes"]}
                run.rows.append(row)
                print(f"  {name:<58} {r['ms']:9.2f} ms  {r['time_fraction']:.3f} of the whole decode's time "
                      f"({r['row_fraction']:.3f} of its rows); {r['unreadable_bytes'] / 2**20:.1f} of "
                      f"{r['component_bytes'] / 2**20:.1f} MiB unreadable; only its rows read: {r['read_only_its_rows']}", flush=True)
                if not r["read_only_its_rows"]:
                    raise RuntimeError(f"libqformat read outside the rows of {r['tensor']}")
                continue
            if not r["same_bits"]:
                raise RuntimeError(f"qf_decode_into and qf_decode_rows differ on {r['tensor']}")
            th = r["threads"]
            name = f"{r['tensor']} -> float32, {r['entry']}, {th} thread{'s' if th > 1 else ''}"
            row = {"section": "libqformat", "name": name, "ms": r["ms"], "out_MB": r["out_MB"], "GBps": r["out_MB"] * 2**20 / r["ms"] / 1e6,
                   "x_memcpy": r["x_memcpy"], "memcpy_ms": r["memcpy_ms"], "threads": th, "entry": r["entry"], "level": r["level"],
                   "ns_per_value": r["ns_per_value"], "note": "memcpy timed in the C process"}
            run.rows.append(row)
            print(f"  {name:<58} {r['ms']:9.2f} ms {row['GBps']:7.2f} GB/s {r['x_memcpy']:6.3f}x memcpy ({r['level']})", flush=True)
            if not run.quick and th == 1 and r["entry"] == "qf_decode_into":
                run.target(f"libqformat {r['tensor']} decode to float32, 1 thread, x memcpy (issue 41)", r["x_memcpy"], 0.8)
    finally:
        path.unlink(missing_ok=True)
