"""Peak resident memory of one qformat command, measured in a fresh interpreter.

Whole-checkpoint commands (convert, quantize, dequantize) must hold about one tensor at a time:
tests run a command on synthetic checkpoints of two sizes and check that the peak stays within a
stated bound above an interpreter that only imports what the command imports, and that doubling
the checkpoint does not move it.  The child reports its own ``VmHWM`` (the high-water mark of its
own address space, made fresh by exec); ``wait4``'s ``ru_maxrss`` would also count the parent's
peak, which a vfork-then-exec child inherits.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Iterable

import numpy as np

from qformat.container import write_file

MB = 1 << 20

_CHILD = """
import sys
args = sys.argv[1:]
if args:
    from qformat.cli import main
    rc = main(args)
    if rc:
        raise SystemExit(rc)
else:
    import numpy, qformat, qformat.convert, qformat.check, qformat.checkpoint.quantize, qformat.checkpoint.dequantize, qformat.schemes
with open("/proc/self/status") as f:
    print(next(line for line in f if line.startswith("VmHWM:")).split()[1])
"""


def peak(args: list[str]) -> int:
    """Peak RSS (bytes) of ``qformat ARGS`` in a fresh interpreter (no args: the imports only,
    the baseline every command is compared with)."""
    p = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    return int(p.stdout.split()[-1]) * 1024


def assert_flat(what: str, peaks: list[int], sizes: list[int], baseline: int, allowance: int, scale: int = 1) -> str:
    """Both peaks below ``baseline + allowance`` (a few working sets of the largest tensor), the
    larger checkpoint (``sizes[-1]``, times ``scale`` for outputs larger than inputs) at least
    twice the allowance, so a command holding it would break the bound, and the larger
    checkpoint's peak within 8 MB of the smaller's.  Returns the measurement line."""
    msg = f"{what}: baseline {baseline / MB:.0f} MB; " + ", ".join(
        f"checkpoint {s / MB:.0f} MB -> peak {p / MB:.0f} MB" for s, p in zip(sizes, peaks))
    print(msg)
    assert scale * sizes[-1] > 2 * allowance, f"the checkpoint is too small to tell: {msg}"
    assert max(peaks) < baseline + allowance, msg
    assert peaks[1] - peaks[0] < 8 * MB, msg
    return msg


def write_sharded(folder: Path, shards: Iterable[tuple[dict[str, np.ndarray], dict[str, dict]]], config: dict,
                  metadata: dict[str, str] | None = None) -> int:
    """A sharded checkpoint from (arrays, descriptors) per shard, with its index and config.json;
    returns the tensor bytes.  Each shard's arrays are written, then dropped by the caller's
    generator, so building a large checkpoint holds one shard at a time."""
    folder.mkdir()
    weight_map: dict[str, str] = {}
    total = 0
    for s, (arrays, descs) in enumerate(shards):
        fname = f"model-{s + 1:05d}.safetensors"
        meta = dict(metadata or {})
        if descs:
            meta["qformat"] = json.dumps({"version": "1.0", "tensors": descs})
        write_file(folder / fname, arrays, meta or None)
        for k, a in arrays.items():
            weight_map[k] = fname
            total += a.nbytes
        weight_map.update({n: fname for n in descs})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(config))
    return total


def int4_g32(name: str, rows: int, cols: int, rng: np.random.Generator, dtype: str = "float32") -> tuple[dict[str, np.ndarray], dict]:
    """A random 4-bit tensor with an F16 scale per 32 along rows (arrays, descriptor), not encoded."""
    arrays = {f"{name}.codes": rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8),
              f"{name}.scale": np.full((rows, cols // 32), 0.01, np.float16)}
    desc = {"shape": [rows, cols], "dtype": dtype,
            "codes": {"tensor": f"{name}.codes", "element": {"type": "int", "bits": 4, "signedness": "twos_complement"},
                      "packing": {"container": 8, "bit_order": "lsb_first", "axis": 1}},
            "scale": {"blocks": {"type": "grid", "size": [1, 32]}, "op": "multiply", "tensor": f"{name}.scale"}}
    return arrays, desc
