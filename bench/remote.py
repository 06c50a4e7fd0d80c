"""Remote checkpoints on loopback: bytes fetched and seconds of ``inspect``, ``check`` and one
layer's slice of an http:// sharded checkpoint, next to downloading its files whole.

``python -m bench --only remote`` (not in the default run).  The checkpoint is two shards of
Llama-shaped int4 g32 layers (random codes, fp16 scales) served by the tests' loopback range
server (tests/range_server.py); every row counts the bytes the server sent, so the numbers say
how much of a checkpoint each operation reads, independent of the network.  Each repetition
opens the URLs afresh (nothing fetched earlier is reused).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

import qformat

MB = 1 << 20


def _layer(rng: np.random.Generator, rows: int, cols: int) -> qformat.QTensor:
    d = {"shape": [rows, cols], "dtype": "bfloat16",
         "codes": {"tensor": "codes", "element": {"type": "int", "bits": 4, "signedness": "twos_complement"},
                   "packing": {"container": 8, "bit_order": "lsb_first", "axis": 1}},
         "scale": {"blocks": {"type": "grid", "size": [1, 32]}, "op": "multiply", "tensor": "scale"}}
    comps = {"codes": rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8),
             "scale": (rng.random((rows, cols // 32), np.float32) * 0.02 + 1e-3).astype(np.float16)}
    return qformat.QTensor(d, comps)


def build(folder: Path, layers: int, rows: int, cols: int) -> int:
    """Two shards of ``layers`` [rows, cols] int4 tensors each, and their index; returns the bytes."""
    rng = np.random.default_rng(11)
    weight_map: dict[str, str] = {}
    for s in range(2):
        name = f"model-{s + 1:05d}-of-00002.safetensors"
        tensors = {f"model.layers.{s * layers + i}.mlp.up_proj.weight": _layer(rng, rows, cols) for i in range(layers)}
        qformat.save_file(tensors, folder / name)
        with qformat.safe_open(folder / name) as f:
            weight_map.update({n: name for n in list(f.header.entries) + f.keys()})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def _measure(url: Any, reps: int, fn: Callable[[], Any]) -> tuple[float, int]:
    """Median seconds and the server's bytes of ``fn``, each repetition with nothing cached."""
    from qformat import remote

    times, sent = [], []
    remote.forget_opened()
    fn()  # warm-up: first-use imports (the converters inspect consults) are not the network's time
    for _ in range(reps):
        remote.forget_opened()
        url.log.reset()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        sent.append(url.log.bytes_sent)
    return statistics.median(times), max(sent)


def bench_remote(run: Any, tmp: str, quick: bool) -> None:
    import requests

    from qformat.check import check
    from qformat.inspection import inspect_checkpoint
    from tests.range_server import serve_ranges

    layers, rows, cols = (2, 64, 256) if quick else (8, 4096, 8192)
    folder = Path(tmp) / "remote-ckpt"
    folder.mkdir()
    total = build(folder, layers, rows, cols)
    index = "model.safetensors.index.json"
    one = "model.layers.0.mlp.up_proj.weight"
    with serve_ranges(folder) as url:
        def download() -> None:
            for p in sorted(folder.glob("*.safetensors")):
                with requests.get(url + p.name, stream=True, timeout=60) as r:
                    for _ in r.iter_content(1 << 20):
                        pass

        def layer_slice() -> None:
            with qformat.safe_open(url + index) as f:
                f.get_slice(one)[: rows // 8]

        def whole_layer() -> None:
            with qformat.safe_open(url + index) as f:
                f.get_tensor(one)

        cases = [("download every shard whole (requests)", download),
                 ("qformat inspect (headers only)", lambda: inspect_checkpoint(url + index)),
                 ("qformat check (every payload byte)", lambda: check(url + index)),
                 ("safe_open + one layer, whole", whole_layer),
                 (f"safe_open + one layer, rows 0:{rows // 8} (get_slice)", layer_slice)]
        for name, fn in cases:
            seconds, sent = _measure(url, run.reps, fn)
            run.rows.append({"section": "remote", "name": name, "ms": seconds * 1e3, "MB_fetched": sent / MB,
                             "fraction_of_checkpoint": sent / total, "checkpoint_MB": total / MB})
            print(f"[remote] {name:<52} {seconds * 1e3:9.1f} ms  {sent / MB:9.3f} MB fetched "
                  f"({100 * sent / total:.3f}% of {total / MB:.1f} MB)", flush=True)
