"""Peak memory of ``qformat quantize`` and ``qformat dequantize`` does not grow with the checkpoint.

As tests/convert/test_pipeline_memory.py does for convert: synthetic Llama-shaped fp16
checkpoints of two sizes (the second with twice the layers) are processed in a subprocess and
the child's peak resident set is compared with an interpreter that only imports what the
command imports (tests/peak_memory.py).  The writer holds one tensor (one encoded tensor's
components) at a time and drops the source's mapped pages after each, so the peak stays within
a few largest-tensor working sets of the baseline, far below the checkpoint, and doubling the
checkpoint moves it by at most a small margin.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from .peak_memory import MB, assert_flat, int4_g32, peak, write_sharded

H, I = 512, 2048  # hidden, intermediate: the largest tensor is [2048, 512] fp16 = 2 MB
RECIPE = """
[[rules]]
glob = "*.self_attn.*_proj.weight"
scheme = "mxfp4"
"""


def _llama(folder: Path, layers: int, shards: int = 2, seed: int = 0) -> int:
    """A sharded Llama-shaped fp16 checkpoint (random values); returns its tensor bytes."""
    rng = np.random.default_rng(seed)
    per = -(-layers // shards)

    def shard(s: int):
        arrays: dict[str, np.ndarray] = {}
        for i in range(s * per, min(layers, (s + 1) * per)):
            p = f"model.layers.{i}."
            for n in ("q", "k", "v", "o"):
                arrays[p + f"self_attn.{n}_proj.weight"] = (rng.standard_normal((H, H), np.float32) * 0.02).astype(np.float16)
            for n, shape in (("gate", (I, H)), ("up", (I, H)), ("down", (H, I))):
                arrays[p + f"mlp.{n}_proj.weight"] = rng.integers(0x2000, 0x2400, shape, dtype=np.uint16).view(np.float16)
            arrays[p + "input_layernorm.weight"] = np.ones(H, np.float16)
        return arrays, {}

    return write_sharded(folder, (shard(s) for s in range(shards)), {"model_type": "llama", "hidden_size": H}, {"format": "pt"})


def _quantized(folder: Path, layers: int, shards: int = 2, seed: int = 0) -> int:
    """A sharded qformat checkpoint (random int4 codes, fp16 scales per 32), without encoding."""
    rng = np.random.default_rng(seed)
    per = -(-layers // shards)

    def shard(s: int):
        arrays, descs = {}, {}
        for i in range(s * per, min(layers, (s + 1) * per)):
            for n, (rows, cols) in (("q", (H, H)), ("o", (H, H)), ("gate", (I, H)), ("up", (I, H)), ("down", (H, I))):
                a, d = int4_g32(f"model.layers.{i}.{n}.weight", rows, cols, rng, "float16")
                arrays.update(a)
                descs[f"model.layers.{i}.{n}.weight"] = d
            arrays[f"model.layers.{i}.norm.weight"] = np.ones(H, np.float16)
        return arrays, descs

    return write_sharded(folder, (shard(s) for s in range(shards)), {"model_type": "llama", "quantization_config": {"quant_method": "qformat"}},
                         {"format": "pt"})


@pytest.fixture(scope="module")
def baseline() -> int:
    return peak([])


def test_quantize_peak_memory_is_bounded(tmp_path, baseline):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE)
    peaks, sizes = [], []
    for k, layers in enumerate([12, 24]):
        src = tmp_path / f"src{k}"
        sizes.append(_llama(src, layers, seed=k))
        out = tmp_path / f"out{k}"
        peaks.append(peak(["quantize", "--quiet", "--recipe", str(recipe), str(src), str(out)]))
        assert (out / "model.safetensors.index.json").is_file()
        os.sync()
    # A few working sets of the largest tensor (2 MB fp16; the encoder works in float64 on
    # 0.5 MB-value tensors): a writer holding the checkpoint would need 100+ MB more.
    assert_flat("quantize", peaks, sizes, baseline, 48 * MB)


def test_dequantize_peak_memory_is_bounded(tmp_path, baseline):
    peaks, sizes = [], []
    for k, layers in enumerate([24, 48]):
        src = tmp_path / f"src{k}"
        sizes.append(_quantized(src, layers, seed=k))
        out = tmp_path / f"out{k}"
        peaks.append(peak(["dequantize", "--quiet", str(src), str(out)]))
        assert (out / "model.safetensors.index.json").is_file()
        assert "quantization_config" not in json.loads((out / "config.json").read_text())
        os.sync()
    # Output sizes: 4x the source (fp16 from 4-bit codes): 200+ MB for the larger one.
    assert_flat("dequantize", peaks, sizes, baseline, 48 * MB, scale=4)
