"""A sharded checkpoint loaded by 1, 2 and 4 JAX processes (the multi-controller runtime on
loopback): bytes each process reads and the wall time of the slowest, next to one process.

``python -m bench --only multihost_jax`` (not in the default run).  The checkpoint is bench/remote.py's:
two shards of Llama-shaped int4 g32 layers (random codes, fp16 scales, bfloat16 logical dtype)
and an index.  Each process starts with ``JAX_PLATFORMS=cpu`` and one CPU device, joins
``jax.distributed.initialize`` (gloo), and loads every layer with
``qformat.jax.load_checkpoint(index, sharding=NamedSharding(mesh, P("x", None)))`` on the global
mesh of all processes' devices (rows split: each process holds 1/N of every layer), decoded (the
native kernel on the host) and ``packed=True`` (only the blocks, no decode).  A repetition is
timed from a barrier to the moment every array of that process is ready; its time is the
slowest process's; the row is the median over repetitions.  Bytes read are the union of the
byte ranges of that process's ``read_log`` (what qformat slices from the memory map, before the
kernel's page-granular reads; the files are in the page cache: this measures the loader, not a
disk or a network file system).  All processes share this machine's cores, so N processes do
not get N times the CPU: the rows say what each process reads and how the work divides, not
the speed-up of N hosts.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent
PROCESSES = (1, 2, 4)
TIMEOUT_S = 900


def _worker(pid: int, nproc: int, port: int, folder: str, reps: int, out_path: str) -> None:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc, process_id=pid)
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import qformat

    devs = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    rows = NamedSharding(Mesh(np.array(devs), ("x",)), P("x", None))
    index = os.path.join(folder, "model.safetensors.index.json")
    out: dict[str, Any] = {"pid": pid}
    for mode in ("decoded", "packed"):
        times, read = [], 0
        for rep in range(reps + 1):  # the first: warm-up (imports, first-use setup), not timed
            log: list = []
            multihost_utils.sync_global_devices(f"{mode}-{rep}-start")
            t0 = time.perf_counter()
            arrays = qformat.jax.load_checkpoint(index, sharding=rows, packed=mode == "packed", read_log=log)
            jax.block_until_ready(jax.tree_util.tree_leaves(arrays))
            t = time.perf_counter() - t0
            # union of the ranges per component (offsets are per file; component names are
            # unique in a checkpoint; a range read twice counts once)
            ranges = sorted((rd.tensor, rd.offset, rd.end) for r in log for rd in r["reads"])
            total, last, end = 0, None, -1
            for comp, lo, hi in ranges:
                if comp != last:
                    last, end = comp, -1
                if hi > end:
                    total += hi - max(lo, end)
                    end = hi
            if rep:
                times.append(t)
                read = total
            del arrays
            multihost_utils.sync_global_devices(f"{mode}-{rep}-end")
        out[mode] = {"seconds": times, "bytes_read": read}
    with open(out_path, "w") as fh:
        json.dump(out, fh)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(folder: Path, nproc: int, reps: int) -> list[dict[str, Any]]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "bench.multihost_jax", str(i), str(nproc), str(port), str(folder), str(reps),
                               str(folder / f"result-{nproc}-{i}.json")], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for i in range(nproc)]
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        errs = [p.communicate(timeout=30)[1] for p in procs]
    if any(p.returncode != 0 for p in procs):
        tails = "\n".join(f"--- process {i} ---\n{e[-3000:]}" for i, e in enumerate(errs))
        raise RuntimeError(f"multihost_jax: {nproc} processes, return codes {[p.returncode for p in procs]}\n{tails}")
    return [json.loads((folder / f"result-{nproc}-{i}.json").read_text()) for i in range(nproc)]


def bench_multihost_jax(run: Any, tmp: str, quick: bool) -> None:
    from .remote import build

    layers, rows, cols = (2, 64, 256) if quick else (8, 4096, 8192)
    folder = Path(tmp) / "multihost-jax-ckpt"
    folder.mkdir()
    total = build(folder, layers, rows, cols)
    reps = run.reps if quick else min(run.reps, 3)
    base: dict[str, float] = {}
    for nproc in PROCESSES:
        results = _launch(folder, nproc, reps)
        for mode in ("decoded", "packed"):
            per_rep = [max(r[mode]["seconds"][k] for r in results) for k in range(reps)]  # the slowest process
            seconds = statistics.median(per_rep)
            read = [r[mode]["bytes_read"] for r in results]
            base.setdefault(mode, seconds)
            row = {"section": "multihost_jax", "name": f"{nproc} process{'es' if nproc > 1 else ''}, {mode}", "processes": nproc,
                   "ms": seconds * 1e3, "MB_read_per_process_max": max(read) / MB, "MB_read_all_processes": sum(read) / MB,
                   "fraction_per_process_max": max(read) / total, "checkpoint_MB": total / MB,
                   "x_vs_1_process": base[mode] / seconds}
            run.rows.append(row)
            print(f"[multihost_jax] {row['name']:<26} {row['ms']:9.1f} ms (slowest process)  {max(read) / MB:9.2f} MB read "
                  f"per process at most ({100 * max(read) / total:.2f}% of {total / MB:.1f} MB; all: {sum(read) / MB:.2f} MB)  "
                  f"{row['x_vs_1_process']:.2f}x 1 process", flush=True)


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[6])
