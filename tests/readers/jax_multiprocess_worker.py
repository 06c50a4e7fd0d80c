"""One process of tests/readers/test_jax_multiprocess.py (and bench/multihost_jax.py's layout).

Run as ``python -m tests.readers.jax_multiprocess_worker PROCESS_ID NUM_PROCESSES PORT FOLDER
OUT_JSON`` with ``JAX_PLATFORMS=cpu`` and ``XLA_FLAGS=--xla_force_host_platform_device_count=L``:
it joins JAX's multi-controller runtime (``jax.distributed.initialize`` on 127.0.0.1:PORT, gloo
collectives), loads the sharded checkpoint FOLDER/model.safetensors.index.json (written by
:func:`write_checkpoint`) onto a global mesh of every process's devices, checks its own
addressable shards bit for bit against the NumPy reference (``qformat.load_file``) and writes
what it read and what it computed to OUT_JSON, for the parent to check against bounds it
computes itself.  Any failed check raises (the parent shows this process's stderr).

This module imports neither jax nor qformat at import time: the test imports :data:`PLAN`.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

#: tensor -> (scheme or "plain", quantize kwargs, shape, shard file, placement).  Placements:
#: "rows" / "cols": split over every device of the global 1-D mesh ("x"); "grid": the 2 x 2
#: mesh ("x", "y") splits both axes; "replicated": every device holds all of it; "stage": only
#: the last process's devices hold it (rows split over them): the others hold no part.
PLAN: dict[str, tuple[str, dict[str, Any], tuple[int, ...], int, str]] = {
    "mlp.up.weight": ("int", {"bits": 4, "group_size": 32}, (128, 256), 1, "rows"),
    "mlp.up.bias": ("plain", {}, (128,), 1, "rows"),
    "mlp.down.weight": ("mxfp4", {}, (256, 128), 1, "cols"),
    "mlp.down.bias": ("plain", {}, (256,), 1, "replicated"),
    "nf4.rows": ("nf4", {}, (64, 256), 1, "rows"),
    "fp8.grid": ("fp8_e4m3", {"granularity": "channel"}, (64, 256), 2, "grid"),
    "int4.grid": ("int", {"bits": 4, "group_size": 32}, (64, 256), 2, "grid"),
    "int4.cols": ("int", {"bits": 4, "group_size": 32}, (64, 256), 2, "cols"),
    "u.cols": ("int", {"bits": 4, "group_size": 32}, (64, 320), 2, "cols"),  # 80 columns per device: not a multiple of 32
    "stage": ("nvfp4", {}, (32, 64), 2, "stage"),
    "emb": ("plain", {}, (64, 32), 2, "rows"),
}
#: the tensor loaded packed with a misaligned column split (must be SLICE_INVALID)
MISALIGNED = "u.cols"
#: packed=True placements: the misaligned one split by rows instead (aligned)
PACKED_PLACEMENT = {MISALIGNED: "rows"}
INDEX = "model.safetensors.index.json"
DEVICES = 4  # global devices in every configuration: 2 processes x 2, or 4 x 1


def write_checkpoint(folder: str, seed: int = 0, scale: int = 1) -> dict[str, str]:
    """The PLAN's two shards and their index, written with qformat.save_file; returns the
    weight map (``scale`` multiplies every first axis, for the benchmark)."""
    import numpy as np

    import qformat

    rng = np.random.default_rng(seed)
    files: dict[int, dict[str, Any]] = {1: {}, 2: {}}
    for name, (scheme, kw, shape, shard, _) in PLAN.items():
        shape = (shape[0] * scale,) + shape[1:]
        x = rng.normal(size=shape).astype(np.float32)
        files[shard][name] = x if scheme == "plain" else qformat.quantize(x, scheme, **kw)
    weight_map: dict[str, str] = {}
    for shard, tensors in files.items():
        fname = f"model-{shard:05d}-of-00002.safetensors"
        qformat.save_file(tensors, os.path.join(folder, fname))
        with qformat.safe_open(os.path.join(folder, fname)) as f:
            weight_map.update({n: fname for n in list(f.header.entries) + f.keys()})
    with open(os.path.join(folder, INDEX), "w") as fh:
        json.dump({"metadata": {}, "weight_map": weight_map}, fh)
    return weight_map


def shardings(jax: Any, np: Any, placements: dict[str, str]) -> dict[str, Any]:
    """name -> NamedSharding on the global mesh (devices ordered by process, then id)."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    devs = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    assert len(devs) == DEVICES, devs
    line = Mesh(np.array(devs), ("x",))
    grid = Mesh(np.array(devs).reshape(2, 2), ("x", "y"))
    last = max(d.process_index for d in devs)
    stage = Mesh(np.array([d for d in devs if d.process_index == last]), ("s",))
    out = {}
    for name, (_, _, shape, _, _) in PLAN.items():
        where = placements[name]
        rank = len(shape)
        out[name] = {
            "rows": NamedSharding(line, P("x", *([None] * (rank - 1)))),
            "cols": NamedSharding(line, P(None, "x")),
            "grid": NamedSharding(grid, P("x", "y")),
            "replicated": NamedSharding(line, P()),
            "stage": NamedSharding(stage, P("s", None)),
        }[where]
    return out


def same_bits(a: Any, b: Any) -> bool:
    """Equal dtype, shape and bits (viewed as unsigned integers; NaN payloads included)."""
    import numpy as np

    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    u = np.dtype(f"u{a.dtype.itemsize}")
    return bool(np.array_equal(a.view(u), b.view(u)))


def _reads(log: list) -> dict[str, list]:
    from tests.readers.jax_processes import reads_of

    return reads_of(log)


def main(pid: int, nproc: int, port: int, folder: str, out_path: str) -> None:
    import jax

    # gloo is the default CPU collectives implementation of recent jax; set it explicitly, as
    # the cross-process all-reduce of the MLP's second layer needs one.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc, process_id=pid,
                               initialization_timeout=120)
    import numpy as np
    from jax.experimental import multihost_utils

    import qformat
    from qformat import kernels
    from qformat.errors import QFormatError

    assert jax.process_count() == nproc and jax.process_index() == pid
    index = os.path.join(folder, INDEX)
    with kernels.use("numpy"):  # the reference: the NumPy core's own decode, one process, whole tensors
        ref = qformat.load_file(index)
    report: dict[str, Any] = {"pid": pid, "local_devices": [d.id for d in jax.local_devices()],
                              "mesh_devices": [d.id for d in sorted(jax.devices(), key=lambda d: (d.process_index, d.id))]}
    placements = {n: p[4] for n, p in PLAN.items()}
    shard = shardings(jax, np, placements)

    # 1. decoded: every tensor a global jax.Array; this process's shards equal the reference bits
    log: list = []
    out = qformat.jax.load_checkpoint(index, sharding=lambda n, s: shard[n], read_log=log)
    assert sorted(out) == sorted(PLAN), sorted(out)
    held = {}
    for name, arr in out.items():
        assert arr.shape == ref[name].shape and arr.dtype == ref[name].dtype, (name, arr.shape, arr.dtype)
        assert arr.sharding == shard[name], (name, arr.sharding)
        want_devs = {d.id for d in shard[name].addressable_devices}
        assert {s.device.id for s in arr.addressable_shards} == want_devs, name
        for s in arr.addressable_shards:
            assert same_bits(np.asarray(s.data), ref[name][s.index]), (name, s.device, s.index)
        held[name] = len(arr.addressable_shards)
    report["held_shards"] = held
    report["reads"] = _reads(log)

    # 2. packed: QArrays whose blocks stay packed on their devices; dequantize() on the mesh
    plog: list = []
    pshard = shardings(jax, np, {**placements, **PACKED_PLACEMENT})
    packed = qformat.jax.load_checkpoint(index, sharding=lambda n, s: pshard[n], packed=True, read_log=plog)
    deq = {}
    for name, q in packed.items():
        if not isinstance(q, qformat.jax.QArray):
            continue
        if not pshard[name].addressable_devices:  # no block here: its leaves hold nothing local
            assert all(not leaf.addressable_shards for leaf in q.components.values()), name
            deq[name] = "none held"
            continue
        y = jax.jit(lambda q: q.dequantize())(q)
        assert y.sharding.is_equivalent_to(pshard[name], len(q.shape)), (name, y.sharding)
        for s in y.addressable_shards:
            assert same_bits(np.asarray(s.data), ref[name][s.index]), (name, s.device, s.index)
        deq[name] = "bits equal"
    report["packed_dequantized"] = deq
    report["packed_reads"] = _reads(plog)

    # 3. the misaligned column split, packed: every process refuses it before reading it
    rlog: list = []
    try:
        qformat.jax.load_checkpoint(index, sharding={MISALIGNED: shard[MISALIGNED]}, packed=True, read_log=rlog)
    except QFormatError as e:
        report["refused"] = {"code": e.code, "message": str(e), "tensor": e.tensor,
                             "read_records": sum(r["tensor"] == MISALIGNED for r in rlog)}
    else:
        report["refused"] = None

    # 4. a 2-layer MLP on the global mesh, weights packed and sharded, against one device
    x_np = np.random.default_rng(1).normal(size=(8, 256)).astype(np.float32)
    line = shard["mlp.up.bias"].mesh
    rep = jax.sharding.NamedSharding(line, jax.sharding.PartitionSpec())
    x = jax.make_array_from_callback(x_np.shape, rep, lambda idx: x_np[idx])

    def forward(w1, b1, w2, b2, x):  # column-parallel then row-parallel: one all-reduce
        h = jax.nn.relu(x @ w1.T + b1)
        return h @ w2.T + b2, h

    def global_fwd(p, x):  # global arrays must be arguments (closing over them is refused)
        return forward(p["mlp.up.weight"].dequantize(), p["mlp.up.bias"], p["mlp.down.weight"].dequantize(),
                       p["mlp.down.bias"], x)

    mlp = ("mlp.up.weight", "mlp.up.bias", "mlp.down.weight", "mlp.down.bias")
    y, h = jax.jit(global_fwd)({k: packed[k] for k in mlp}, x)
    y_all = np.asarray(multihost_utils.process_allgather(y, tiled=True))
    h_all = np.asarray(multihost_utils.process_allgather(h, tiled=True))
    one = jax.local_devices()[0]
    yr, hr = jax.jit(forward)(*(jax.device_put(ref[k], one) for k in mlp),
                              jax.device_put(x_np, one))
    yr, hr = np.asarray(yr), np.asarray(hr)
    np.savez(os.path.join(folder, f"mlp-{pid}.npz"), y=y_all, y_ref=yr, h=h_all, h_ref=hr, x=x_np)
    report["mlp"] = {"h_bits_equal": same_bits(h_all, hr), "y_bits_equal": same_bits(y_all, yr),
                     "h_max_abs_diff": float(np.max(np.abs(h_all - hr))), "y_max_abs_diff": float(np.max(np.abs(y_all - yr)))}
    multihost_utils.sync_global_devices("qformat-test-done")
    with open(out_path, "w") as fh:
        json.dump(report, fh)


if __name__ == "__main__":
    from tests.readers.jax_processes import run_worker

    run_worker(main, int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
