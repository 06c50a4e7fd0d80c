"""Encoder quality against the libraries qformat replaces (skipped when they are not installed).

SQNR = 10 log10(sum x^2 / sum (x - y)^2), in float64, on the same seeded data for both sides.
* nf4 (block 64, no double quant) must be within 0.1 dB of bitsandbytes' quantize_4bit /
  dequantize_4bit (in fact its codes and absmax are bit-identical, checked too).
* int (4 bits, symmetric, group 32, float16 scales) must be at least as good as GGUF Q4_0.
"""

from __future__ import annotations

import numpy as np
import pytest

from qformat.packing import Packing, unpack_rows
from qformat.schemes import quantize

SHAPE = (256, 1024)
DATA = [(kind, seed) for kind in ("normal", "student_t3", "outliers") for seed in (0, 1)]


def _data(kind: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "normal":
        x = rng.standard_normal(SHAPE)
    elif kind == "student_t3":  # heavy tails
        x = rng.standard_t(3, SHAPE)
    else:  # normal rows of different scales, with a few large outliers
        x = rng.standard_normal(SHAPE) * np.exp(rng.uniform(-2, 2, (SHAPE[0], 1)))
        idx = rng.integers(0, x.size, x.size // 500)
        x.reshape(-1)[idx] *= 20
    return (x * 0.02).astype(np.float32)


def sqnr(x: np.ndarray, y: np.ndarray) -> float:
    x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
    return float(10 * np.log10(np.sum(x64 * x64) / np.sum((x64 - y64) ** 2)))


@pytest.mark.parametrize(("kind", "seed"), DATA)
def test_nf4_matches_bitsandbytes(kind: str, seed: int) -> None:
    pytest.importorskip("bitsandbytes")
    import torch
    from bitsandbytes import functional as bnbf

    x = _data(kind, seed)
    qt = quantize(x, "nf4", block_size=64)
    ours = sqnr(x, qt.dequantize())
    packed, state = bnbf.quantize_4bit(torch.from_numpy(x), blocksize=64, quant_type="nf4")
    theirs = sqnr(x, bnbf.dequantize_4bit(packed, state).numpy())
    assert abs(ours - theirs) <= 0.1, f"{kind}/{seed}: qformat nf4 {ours:.4f} dB, bitsandbytes {theirs:.4f} dB"
    # Stronger: the same absmax and codes (bitsandbytes puts element 2k in the high nibble).
    b = packed.numpy().reshape(-1)
    bnb_codes = np.stack([b >> 4, b & 0xF], axis=-1).reshape(-1)[: x.size]
    p = Packing.from_dict(qt.descriptor["codes"]["packing"])
    our_codes = unpack_rows(qt.components["codes"], 4, p, SHAPE[1]).reshape(-1)
    assert np.array_equal(our_codes, bnb_codes), f"{int((our_codes != bnb_codes).sum())} codes differ"
    assert np.array_equal(qt.components["scale"], state.absmax.numpy())


@pytest.mark.parametrize(("kind", "seed"), DATA)
def test_int4_at_least_gguf_q4_0(kind: str, seed: int) -> None:
    gguf = pytest.importorskip("gguf")
    x = _data(kind, seed)
    ours = sqnr(x, quantize(x, "int", bits=4, symmetric=True, group_size=32, scale_dtype="float16").dequantize())
    q = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q4_0)
    theirs = sqnr(x, gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q4_0))
    assert ours >= theirs, f"{kind}/{seed}: qformat int4 {ours:.4f} dB < GGUF Q4_0 {theirs:.4f} dB"
