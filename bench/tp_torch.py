"""Tensor-parallel loading with torch.distributed (issue 27): bytes each rank reads and the
load time of the slowest rank, for 1, 2 and 4 ranks of ``qformat_torch.load_tensor_parallel``.

``python -m bench --only tp_torch`` (not in the default run).  The checkpoint is Llama-shaped
layers of int4 g32 weights (random codes, bfloat16 scales per 32 columns; hidden 4096,
intermediate 11008, 3 layers: about 330 MB; ``--quick``: hidden 256, 2 layers) and the model a
skeleton of Linears on the meta device, split with the Megatron plan (q/k/v/gate/up colwise,
o/down rowwise).  Each world size runs as one ``torchrun --standalone`` group of CPU processes
(gloo); every repetition loads into a fresh skeleton after the file has been evicted from the
page cache (``posix_fadvise(DONTNEED)``), behind a barrier, and the row's time is the median
over repetitions of the slowest rank's load.  Bytes are the loader's own log of the ranges it
copied out of the file (``TPStats``), per rank.  Two series: the default kernel policy (each
bfloat16 int4 layer is repacked for torch's int4 CPU kernel as it is built, which dominates)
and ``kernel="decode"`` (the load only reads and copies the rank's bytes).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .common import drop_cache

MB = 1 << 20
WORLDS = (1, 2, 4)


def _weight(rng: np.random.Generator, rows: int, cols: int) -> Any:
    import qformat

    d = {"shape": [rows, cols], "dtype": "bfloat16",
         "codes": {"tensor": "codes", "element": {"type": "int", "bits": 4, "signedness": "twos_complement"},
                   "packing": {"container": 8, "bit_order": "lsb_first", "axis": 1}},
         "scale": {"blocks": {"type": "grid", "size": [1, 32]}, "op": "multiply", "tensor": "scale"}}
    scale = (rng.random((rows, cols // 32), np.float32) * 0.02 + 1e-3).astype(np.float16).astype(np.float32)
    import ml_dtypes  # bfloat16 scales, as qformat quantize writes for a bfloat16 model

    comps = {"codes": rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8), "scale": scale.astype(ml_dtypes.bfloat16)}
    return qformat.QTensor(d, comps)


def shapes(hidden: int, inter: int) -> dict[str, tuple[int, int]]:
    return {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (hidden, hidden), "self_attn.v_proj": (hidden, hidden),
            "self_attn.o_proj": (hidden, hidden), "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden),
            "mlp.down_proj": (hidden, inter)}


def build(path: Path, layers: int, hidden: int, inter: int) -> int:
    """One file of ``layers`` Llama decoder layers' Linear weights in int4 g32; returns its size."""
    import qformat

    rng = np.random.default_rng(27)
    tensors = {f"model.layers.{i}.{name}.weight": _weight(rng, *shape)
               for i in range(layers) for name, shape in shapes(hidden, inter).items()}
    qformat.save_file(tensors, path)
    return path.stat().st_size


def _skeleton(layers: int, hidden: int, inter: int, heads: int) -> Any:
    """Modules named as a Llama's, on the meta device (nothing allocated)."""
    from torch import nn

    root = nn.Module()
    root.model = nn.Module()
    root.model.layers = nn.ModuleList()
    for _ in range(layers):
        layer = nn.Module()
        layer.self_attn, layer.mlp = nn.Module(), nn.Module()
        layer.self_attn.head_dim = hidden // heads  # lets the loader check that heads stay whole
        for name, (o, i) in shapes(hidden, inter).items():
            part, attr = name.split(".")
            setattr(getattr(layer, part), attr, nn.Linear(i, o, bias=False, device="meta"))
        root.model.layers.append(layer)
    return root


def worker(path: str, out: str, layers: int, hidden: int, inter: int, heads: int, reps: int, kernel: str) -> None:
    """One rank (under torchrun): ``reps`` TP loads, each timed behind a barrier."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    import qformat_torch
    from qformat_torch.distributed import llama_tp_plan

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    times, stats = [], None
    for rep in range(reps + 1):  # the first load warms imports and the allocator; not timed
        model = _skeleton(layers, hidden, inter, heads)
        if rank == 0:
            drop_cache(path)
        dist.barrier()
        log: list = []
        t0 = time.perf_counter()
        qformat_torch.load_tensor_parallel(model, path, llama_tp_plan(), read_log=log, kernel=kernel)
        dt = time.perf_counter() - t0
        slowest = [0.0] * world
        dist.all_gather_object(slowest, dt)
        if rep:
            times.append(max(slowest))
        stats = log[0]
        del model
    per_rank: list = [None] * world
    dist.all_gather_object(per_rank, {"bytes_read": stats.bytes_read, "packed_bytes": stats.packed_bytes})
    if rank == 0:
        Path(out).write_text(json.dumps({"world": world, "seconds": times, "ranks": per_rank}))
    dist.destroy_process_group()


def bench_tp_torch(run: Any, tmp: str, quick: bool) -> None:
    """Rows of section "tp_torch": per world size, bytes read per rank and the slowest rank's load."""
    layers, hidden, inter, heads = (2, 256, 512, 4) if quick else (3, 4096, 11008, 32)
    path = Path(tmp) / "tp-int4.safetensors"
    size = build(path, layers, hidden, inter)
    root = Path(__file__).resolve().parents[1]
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(root), str(root / "readers"), os.environ.get("PYTHONPATH", "")]))
    print(f"\n[tp_torch] {layers} layers, hidden {hidden}, intermediate {inter}: int4 g32 file {size / MB:.1f} MB", flush=True)
    for kernel in ("auto", "decode"):
        _series(run, tmp, path, size, kernel, [str(layers), str(hidden), str(inter), str(heads), str(run.reps), kernel], torchrun, root, env)
    path.unlink()


def _series(run: Any, tmp: str, path: Path, size: int, kernel: str, args: list[str], torchrun: Path, root: Path, env: dict) -> None:
    # kernel "auto": each bfloat16 int4 layer is repacked for torch's int4 CPU kernel as it is
    # built (part of making the model runnable); "decode": the load reads and copies, nothing else
    label = "kernel auto (repacked for the int4 CPU kernel)" if kernel == "auto" else "kernel decode (read + copy only)"
    base = None
    for world in WORLDS:
        out = Path(tmp) / f"tp-{world}.json"
        cmd = [str(torchrun), "--standalone", f"--nproc_per_node={world}", "-m", "bench.tp_torch", "--worker", str(path),
               str(out), *args]
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"torchrun with {world} ranks failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        res = json.loads(out.read_text())
        seconds = statistics.median(res["seconds"])
        most = max(r["bytes_read"] for r in res["ranks"])
        base = base or (seconds, most)
        run.rows.append({"section": "tp_torch", "name": f"load_tensor_parallel, {world} rank{'s' * (world > 1)}, {label}",
                         "ms": seconds * 1e3, "ranks": world, "MB_read_per_rank": [r["bytes_read"] / MB for r in res["ranks"]],
                         "fraction_of_checkpoint": most / size, "checkpoint_MB": size / MB,
                         "speedup_vs_1_rank": base[0] / seconds, "times_ms": [t * 1e3 for t in res["seconds"]]})
        print(f"[tp_torch] {kernel:<6} {world} rank(s): slowest rank {seconds * 1e3:9.1f} ms (x{base[0] / seconds:.2f} of 1 rank), "
              f"per rank {most / MB:8.2f} MB read ({100 * most / size:.1f}% of {size / MB:.1f} MB)", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        p, o, *nums, kern = sys.argv[2:]
        worker(p, o, *(int(x) for x in nums), kern)
    else:  # standalone: python -m bench.tp_torch [--quick]
        import tempfile

        from .common import Run

        quick = "--quick" in sys.argv
        r = Run(1 if quick else 5, quick)
        with tempfile.TemporaryDirectory(prefix="qformat-bench-") as d:
            bench_tp_torch(r, d, quick)
        print(json.dumps(r.rows, indent=1))
