"""One process of tests/readers/test_jax_multiprocess_minilm.py: all-MiniLM-L6-v2 on a global mesh.

``python -m tests.readers.jax_multiprocess_minilm_worker PROCESS_ID NUM_PROCESSES PORT FOLDER OUT_JSON``
(``JAX_PLATFORMS=cpu``, ``XLA_FLAGS=--xla_force_host_platform_device_count=L``) joins JAX's
multi-controller runtime (``jax.distributed.initialize`` on 127.0.0.1:PORT, gloo collectives),
loads the quantized checkpoint FOLDER/quantized (written by the test with the example's
``quantize_demo_checkpoint``) with ``qformat.jax.load_file(path, sharding=<callable>)`` onto a
1-D mesh ("x") of every process's devices, the linear weights split tensor-parallel style
(:data:`SPLITS`), everything else replicated, and runs examples/jax_minilm.py's jitted forward on
the global arrays, decoded and then packed (``packed=True``: sharded QArrays decoded inside the
jitted forward), on the token arrays FOLDER/tokens.npz.  The embeddings, gathered with
``process_allgather``, go to FOLDER/emb-N-PID.npz; the addressable shards of the split weights
and the read log go to OUT_JSON, for the parent to check against bounds it computes itself.

``python -m tests.readers.jax_multiprocess_minilm_worker ref FOLDER OUT_NPZ`` (one device, no
``jax.distributed``) is the single-process reference: the same forward on whole, unsharded
arrays in float32 (decoded and packed) and, for the scale of float32 rounding, in float64.

Any failed check raises; the process then exits at once (see jax_multiprocess_worker.py).
This module imports neither jax nor qformat at import time: the test imports :data:`SPLITS`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "jax_minilm.py")
DEVICES = 4  # global devices in every configuration: 2 processes x 2, or 4 x 1
AXIS = "x"
#: tensor name pattern -> the axis of the weight split over the mesh: Megatron-style tensor
#: parallelism.  q/k/v and the FFN in-projection by output rows (384 / 4 = 96 rows: 3 heads of 32;
#: 1536 / 4 = 384 FFN units), the attention output and FFN out-projection by input columns (96
#: and 384), so each attention head and FFN unit lives on one device and the two row-parallel
#: matmuls end in a cross-device sum.  Everything else (embeddings, biases, LayerNorms, the
#: unused pooler) is replicated.
SPLITS = {
    r"encoder\.layer\.\d+\.attention\.self\.(query|key|value)\.weight": 0,
    r"encoder\.layer\.\d+\.attention\.output\.dense\.weight": 1,
    r"encoder\.layer\.\d+\.intermediate\.dense\.weight": 0,
    r"encoder\.layer\.\d+\.output\.dense\.weight": 1,
}
TOKENS = "tokens.npz"
QUANTIZED = "quantized"


def split_axis(name: str) -> int | None:
    for pattern, axis in SPLITS.items():
        if re.fullmatch(pattern, name):
            return axis
    return None


def load_example() -> Any:
    """examples/jax_minilm.py as a module (quantize_demo_checkpoint, build_params, make_forward)."""
    spec = importlib.util.spec_from_file_location("qformat_example_jax_minilm", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _model(folder: str) -> tuple[Any, str, dict, dict]:
    import numpy as np

    ex = load_example()
    path = ex.safetensors_file(os.path.join(folder, QUANTIZED))
    with open(os.path.join(folder, QUANTIZED, "config.json")) as fh:
        cfg = json.load(fh)
    with np.load(os.path.join(folder, TOKENS)) as z:
        tokens = {k: np.asarray(z[k], np.int32) for k in ("input_ids", "token_type_ids", "attention_mask")}
    return ex, path, cfg, tokens


def _reads(log: list) -> dict[str, list]:
    from tests.readers.jax_processes import reads_of

    return reads_of(log)


def _box(index: tuple, shape: tuple[int, ...]) -> list[list[int]]:
    return [list(s.indices(n)[:2]) for s, n in zip(index, shape)]


def main(pid: int, nproc: int, port: int, folder: str, out_path: str) -> None:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # the row-parallel sums cross processes
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc, process_id=pid,
                               initialization_timeout=120)
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import qformat
    from tests.readers.jax_multiprocess_worker import same_bits

    assert jax.process_count() == nproc and jax.process_index() == pid
    ex, path, cfg, tokens = _model(folder)
    devs = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    assert len(devs) == DEVICES, devs
    mesh = Mesh(np.array(devs), (AXIS,))
    replicated = NamedSharding(mesh, P())

    def sharding(name: str, shape: tuple[int, ...]) -> Any:
        axis = split_axis(name)
        if axis is None:
            return replicated
        spec = [None] * len(shape)
        spec[axis] = AXIS
        return NamedSharding(mesh, P(*spec))

    batch = {k: jax.make_array_from_callback(v.shape, replicated, lambda idx, v=v: v[idx]) for k, v in tokens.items()}
    forward = ex.make_forward(cfg["num_attention_heads"], cfg["layer_norm_eps"])
    ref = qformat.load_file(path)  # the NumPy core's decode, whole tensors: the shards' bits
    report: dict[str, Any] = {"pid": pid, "local_devices": [d.id for d in jax.local_devices()],
                              "mesh_devices": [d.id for d in devs], "timings": {}}
    for packed in (False, True):
        mode = "packed" if packed else "decoded"
        log: list = []
        t0 = time.perf_counter()
        tensors = qformat.jax.load_file(path, sharding=sharding, packed=packed, read_log=log)
        t_load = time.perf_counter() - t0
        shards: dict[str, Any] = {}
        for name, a in tensors.items():
            if split_axis(name) is None:
                continue
            if packed:
                assert isinstance(a, qformat.jax.QArray), (name, type(a))
                assert a.sharding == sharding(name, a.shape), (name, a.sharding)
                # each leaf: one packed block per mesh position, this process's blocks only
                shards[name] = {c: [[s.device.id, list(s.data.shape)] for s in leaf.addressable_shards]
                                for c, leaf in a.components.items()}
            else:
                assert a.sharding == sharding(name, a.shape), (name, a.sharding)
                for s in a.addressable_shards:
                    assert same_bits(np.asarray(s.data), ref[name][s.index]), (name, s.index)
                shards[name] = [[s.device.id, _box(s.index, a.shape), list(s.data.shape)] for s in a.addressable_shards]
        params = ex.build_params(tensors, cfg["num_hidden_layers"])
        t0 = time.perf_counter()
        emb = forward(params, batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        full = np.asarray(multihost_utils.process_allgather(emb, tiled=True))
        t_fwd = time.perf_counter() - t0
        np.save(os.path.join(folder, f"emb-{nproc}-{pid}-{mode}.npy"), full)
        report[mode] = {"shards": shards, "reads": _reads(log), "out_spec": str(getattr(emb.sharding, "spec", emb.sharding))}
        report["timings"][mode] = {"load_s": t_load, "forward_s": t_fwd}
    multihost_utils.sync_global_devices("qformat-minilm-done")
    with open(out_path, "w") as fh:
        json.dump(report, fh)


def reference(folder: str, out_path: str) -> None:
    """One process, one device, no sharding: the example's forward in float32 (tensors loaded
    decoded, and packed as the example loads them) and in float64 (the float32-decoded weights
    widened: the same model, its sums rounded 2^29 times more finely)."""
    import jax
    import numpy as np

    import qformat

    assert jax.device_count() == 1, jax.devices()
    ex, path, cfg, tokens = _model(folder)
    args = (tokens["input_ids"], tokens["token_type_ids"], tokens["attention_mask"])
    out: dict[str, Any] = {}
    timings = {}
    t0 = time.perf_counter()
    decoded = qformat.jax.load_file(path)
    out["f32"] = np.asarray(ex.make_forward(cfg["num_attention_heads"], cfg["layer_norm_eps"])(
        ex.build_params(decoded, cfg["num_hidden_layers"]), *args))
    timings["f32"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    packed = qformat.jax.load_file(path, packed=True)
    out["f32_packed"] = np.asarray(ex.make_forward(cfg["num_attention_heads"], cfg["layer_norm_eps"])(
        ex.build_params(packed, cfg["num_hidden_layers"]), *args))
    timings["f32_packed"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    host = {n: np.asarray(a) for n, a in decoded.items()}
    jax.config.update("jax_enable_x64", True)
    wide = {n: (a.astype(np.float64) if a.dtype.kind == "f" else a) for n, a in host.items()}
    wide = {n: jax.device_put(a) for n, a in wide.items()}
    assert all(a.dtype == np.float64 for n, a in wide.items() if host[n].dtype.kind == "f")
    out["f64"] = np.asarray(ex.make_forward(cfg["num_attention_heads"], cfg["layer_norm_eps"])(
        ex.build_params(wide, cfg["num_hidden_layers"]), *args))
    assert out["f64"].dtype == np.float64
    timings["f64"] = time.perf_counter() - t0
    np.savez(out_path, timings=json.dumps(timings), **out)


if __name__ == "__main__":
    from tests.readers.jax_processes import run_worker

    if sys.argv[1] == "ref":
        run_worker(reference, sys.argv[2], sys.argv[3])
    else:
        run_worker(main, int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
