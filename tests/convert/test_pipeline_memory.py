"""Peak memory of ``qformat convert`` does not grow with the checkpoint (issue 16, item 4).

Synthetic checkpoints of two sizes (the second with twice the tensors) are converted in a
subprocess (in place, ``--repack``, and from GGUF) and the child's peak resident set is compared
with an interpreter that only imports qformat (tests/peak_memory.py): the pipeline holds about
one tensor at a time and drops the source's mapped pages after each, so the peak stays within a
few largest-tensor sizes of that baseline, far below the checkpoint, and doubling the checkpoint
moves it by at most a small margin.  A writer that held every tensor (or let every mapped page
stay resident) would grow by the checkpoint's size and fail.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from ..peak_memory import MB, assert_flat, int4_g32, peak, write_sharded

TENSOR = 4 * MB  # every big tensor; the largest the conversion handles
ROWS, COLS = 64, 2048  # quantized tensors: 4-bit codes [64, 2048], one F16 scale per 32


def _qformat_source(folder: Path, shards: int, plain_per_shard: int, quant_per_shard: int, seed: int = 0) -> int:
    """A sharded qformat checkpoint of random data; returns its tensor bytes."""
    rng = np.random.default_rng(seed)

    def shard(s: int):
        arrays, descs = {}, {}
        for i in range(plain_per_shard):
            arrays[f"s{s}.plain{i}"] = rng.integers(0, 1 << 16, TENSOR // 2, dtype=np.uint16).view(np.float16)
        for i in range(quant_per_shard):
            a, d = int4_g32(f"s{s}.q{i}", ROWS, COLS, rng)
            arrays.update(a)
            descs[f"s{s}.q{i}"] = d
        return arrays, descs

    return write_sharded(folder, (shard(s) for s in range(shards)), {})


def _gguf_source(path: Path, tensors: int, seed: int = 0) -> int:
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch="test")
    rows, cols = 128, 8192  # Q8_0: 34 bytes per 32 values -> 1.1 MB per tensor, 1M codes
    raw = rng.integers(0, 256, (rows, cols // 32 * 34), dtype=np.uint8)
    raw.reshape(rows, -1, 34)[:, :, 1] &= 0x3B  # f16 d: keep the exponent below Inf/NaN
    for i in range(tensors):
        w.add_tensor(f"blk.{i}.weight", raw, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors * raw.nbytes


def _convert(src: Path, dst: Path, *extra: str) -> int:
    return peak(["convert", "--quiet", *extra, str(src), str(dst)])


@pytest.fixture(scope="module")
def baseline() -> int:
    return peak([])


@pytest.mark.parametrize("mode", ["in_place", "repack"])
def test_convert_peak_memory_is_bounded(tmp_path, baseline, mode):
    extra = ("--repack",) if mode == "repack" else ()
    peaks, sizes = [], []
    for k, (shards, plain) in enumerate([(4, 10), (8, 10)]):
        src = tmp_path / f"src{k}"
        sizes.append(_qformat_source(src, shards, plain, quant_per_shard=2, seed=k))
        peaks.append(_convert(src, tmp_path / f"out{k}", *extra))
        assert (tmp_path / f"out{k}" / "model.safetensors.index.json").is_file()
        os.sync()
    # Imports the baseline does not make, plus a few transient copies of one 4 MB tensor
    # (repack unpacks codes to wider integers); a writer holding the checkpoint needs 160+ MB more.
    assert_flat(mode, peaks, sizes, baseline, 16 * TENSOR)


def test_gguf_convert_peak_memory_is_bounded(tmp_path, baseline):
    peaks, sizes = [], []
    for k, n in enumerate([64, 128]):
        src = tmp_path / f"m{k}.gguf"
        sizes.append(_gguf_source(src, n, seed=k))
        peaks.append(_convert(src, tmp_path / f"out{k}.safetensors"))
    # Packing 1M codes goes through uint64 (8 MB a copy, a few copies): bounded by the largest tensor.
    assert_flat("gguf", peaks, sizes, baseline, 12 * TENSOR)
