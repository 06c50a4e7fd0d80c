"""Shared pieces of the benchmark sections: the :class:`Run` (rows, targets, memcpy baselines),
the equality check, and the child processes that time ``qformat`` CLI commands.

Every section module (harness, generate, llama, gguf_hf) imports from here and from nowhere
else in bench/, and this module imports no section: the package has no import cycle
(tests/test_import_graph.py checks it).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

MB = 1 << 20


# -- timing ---------------------------------------------------------------------------------
class Run:
    """Rows, targets and the memcpy baselines of one run."""

    def __init__(self, reps: int, quick: bool):
        self.reps = reps
        self.quick = quick
        self.rows: list[dict[str, Any]] = []
        self.targets: list[dict[str, Any]] = []
        self._memcpy: dict[int, float] = {}

    def time(self, fn: Callable[[], Any], reps: int | None = None) -> float:
        """Median seconds of ``reps`` calls after one warm-up call."""
        fn()
        ts = []
        for _ in range(reps or self.reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    def memcpy(self, nbytes: int) -> float:
        """Median seconds of np.copyto of ``nbytes`` into a preallocated array (measured once per size)."""
        if nbytes not in self._memcpy:
            a = np.ones(nbytes // 4, np.float32)
            b = np.empty_like(a)
            self._memcpy[nbytes] = self.time(lambda: np.copyto(b, a), max(self.reps, 5))
            del a, b
        return self._memcpy[nbytes]

    def row(self, section: str, name: str, seconds: float, out_bytes: int, ref: str | None = None, note: str = "") -> dict[str, Any]:
        base = self.memcpy(out_bytes)
        r = {"section": section, "name": name, "ms": seconds * 1e3, "out_MB": out_bytes / MB,
             "GBps": out_bytes / seconds / 1e9, "x_memcpy": base / seconds, "memcpy_ms": base * 1e3, "note": note}
        if ref is not None:
            other = next(x for x in self.rows if x["section"] == section and x["name"] == ref)
            r["vs"] = ref
            r["x_vs"] = other["ms"] / r["ms"]
        self.rows.append(r)
        vs = f"  {r['x_vs']:6.2f}x {ref}" if ref else ""
        print(f"  {name:<44} {r['ms']:9.2f} ms {r['GBps']:7.2f} GB/s {r['x_memcpy']:6.3f}x memcpy{vs}", flush=True)
        return r

    def target(self, what: str, measured: float, required: float, unit: str = "x") -> None:
        met = measured >= required
        self.targets.append({"target": what, "measured": measured, "required": required, "unit": unit, "met": met})


class BenchCheckFailed(RuntimeError):
    """An equality check of the harness failed: a row would time a wrong result."""


def drop_cache(path: str) -> None:
    """Evict a file from the page cache (clean pages; no privileges needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _require(ok: bool, what: Any) -> None:
    if not ok:
        raise BenchCheckFailed(f"check failed: {what}")


def _same_bits(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype.itemsize != b.dtype.itemsize:
        return False
    u = {2: np.uint16, 4: np.uint32}[a.dtype.itemsize]
    return bool(np.array_equal(a.view(u), b.view(u)))


# -- qformat CLI commands in child processes (issue 11, item 7) --------------------------------------------------------
CKPT_CHILD = r"""
import json, sys, time
import qformat.cli, qformat.convert, qformat.check, qformat.checkpoint.quantize, qformat.checkpoint.dequantize
def hwm():  # this process's peak resident set (VmHWM); reset before each command
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1])
for args in json.loads(sys.argv[1]):
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS (Linux)
    t0 = time.perf_counter()
    rc = qformat.cli.main(args)
    dt = time.perf_counter() - t0
    print(json.dumps({"args": args, "rc": rc, "seconds": dt, "maxrss_kb": hwm()}), flush=True)
"""


def _ckpt_children(commands: list[list[str]], one_each: bool) -> list[dict[str, Any]]:
    """Run qformat CLI commands in child interpreters (one each, or all in one for --quick);
    each result has the command's own seconds (imports excluded) and its peak RSS."""
    out = []
    for batch in ([[c] for c in commands] if one_each else [commands]):
        r = subprocess.run([sys.executable, "-c", CKPT_CHILD, json.dumps(batch)], capture_output=True, text=True,
                           cwd=str(Path(__file__).resolve().parents[1]))
        _require(r.returncode == 0, r.stderr[-2000:])
        res = [json.loads(line) for line in r.stdout.splitlines() if line.startswith('{"args"')]
        _require(len(res) == len(batch) and all(x["rc"] == 0 for x in res), (res, r.stderr[-2000:]))
        out += res
    return out


def _tree_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path) if n.endswith(".safetensors"))


def _copy_seconds(path: str, tmp: str, reps: int, durable: bool = False) -> float:
    """Best of ``reps`` plain copies (shutil.copyfile: the kernel's copy) of a file or folder's
    files; ``durable``: each copy also fsynced, as qformat's writer does before its rename."""
    import shutil

    files = [path] if os.path.isfile(path) else sorted(os.path.join(path, n) for n in os.listdir(path))
    dst = os.path.join(tmp, "copy-of-source")
    best = float("inf")
    for _ in range(reps):
        os.makedirs(dst, exist_ok=True)
        os.sync()  # start from no dirty pages, as each command does (writeback throttling is noise)
        t0 = time.perf_counter()
        for f in files:
            shutil.copyfile(f, os.path.join(dst, os.path.basename(f)))
            if durable:
                fd = os.open(os.path.join(dst, os.path.basename(f)), os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
        best = min(best, time.perf_counter() - t0)
        shutil.rmtree(dst)
    return best
