"""Scheme "nvfp4": E2M1 codes, an E4M3 scale per 16 along the last axis, an fp32 tensor scale.

As NVIDIA ModelOpt: g = amax / (6 * 448) (binary32; amax 0 gives 1); block scale =
block_amax / (6 * g) cast to E4M3 (clipped to [2^-9, 448] when block_amax > 0, else 0).  The
block scale is an *encoded* parameter (E4M3 codes times g), so a reader decodes
s = fp32(e4m3 * g); elements are E2M1(x / s) with that exact s, rounded to nearest even with
saturation at +-6.
"""

from __future__ import annotations


import ml_dtypes
import numpy as np

from ..qtensor import QTensor
from .registry import Planned, register
from ._common import (
    F32_TINY, cast_codes, cells, codes_entry, f32, grid_array, grid_blocks, map_chunks, pack, packed_shape, resolve_sizes, round_float, uncells,
)
from . import _float_fast
from ._float_fast import float_codes, positive_zero, row_amax, tie_suspects

BLOCK = 16
_E4M3_MIN = 2.0**-9  # smallest positive E4M3 (a subnormal)


def global_scale(amax: float) -> float:
    """g = fp32(amax / 2688), never 0 for amax > 0, with 6 * fp32(448 * g) finite."""
    if amax == 0:
        return 1.0
    g = np.float32(max(float(f32(amax / 2688.0)), F32_TINY))
    with np.errstate(over="ignore"):
        while not np.isfinite(np.float32(6) * (np.float32(448) * g)):
            g = np.nextafter(g, np.float32(0))
    return float(g)


def plan(shape: tuple[int, ...], dtype: str) -> Planned:
    """What :func:`encode` writes for an array of ``shape`` (see :data:`~qformat.schemes.registry.Planned`)."""
    rank = len(shape)
    sizes: list[int | None] = [1] * (rank - 1) + [BLOCK] if rank else []
    grid = resolve_sizes(shape, sizes)[1]
    nested = {
        "shape": list(grid), "dtype": "float32",
        "codes": codes_entry("scale.codes", {"type": "float", "format": "e4m3fn"}, rank),
        "scale": {"blocks": grid_blocks([None] * rank), "op": "multiply", "tensor": "scale.scale"},
    }
    desc = {
        "shape": list(shape), "dtype": dtype,
        "codes": codes_entry("codes", {"type": "float", "format": "e2m1fn"}, rank),
        "scale": {"blocks": grid_blocks(sizes), "op": "multiply", "encoded": nested},
        "scheme": "nvfp4",
    }
    return desc, {"codes": ("U8", packed_shape(shape, 4)), "scale.codes": ("F8_E4M3", grid), "scale.scale": ("F32", ())}


def _scales(bamax: np.ndarray, g: float) -> tuple[np.ndarray, np.ndarray]:
    """(E4M3 block scales, decoded scales s = fp32(e4m3 * g)) of block maxima (float64 [n])."""
    v = np.where(bamax > 0, np.clip(bamax / (6.0 * g), _E4M3_MIN, 448.0), 0.0)
    e4 = round_float(v, "e4m3fn")
    return e4, f32(e4 * g)  # the decoder's binary32 product (exact in float64, then one rounding)


def _codes32(b: np.ndarray, s: np.ndarray) -> np.ndarray:
    """E2M1 codes [n, 16] of binary32 blocks ``b`` / s (s [n]) as the exact quotient rounds:
    the binary32 quotient rounds the same but on an E2M1 tie (see tie_suspects).  A block
    whose decoded scale is 0 gets +0 codes."""
    ok = s > 0
    q = b / np.where(ok, s, 1.0).astype(np.float32)[:, None]
    c = float_codes(q, "e2m1fn").reshape(-1)
    idx = tie_suspects(q, 1)
    if idx.size:
        row, col = np.divmod(idx, b.shape[1])
        with np.errstate(divide="ignore", invalid="ignore"):  # rows with s = 0 are set below
            c[idx] = cast_codes(b[row, col].astype(np.float64) / s[row], "e2m1fn")
    c = c.reshape(b.shape)
    if not ok.all():
        c[~ok] = 0
    return c


@register("nvfp4", plan)
def encode(x: np.ndarray, *, dtype: str) -> QTensor:
    """NVFP4 (ModelOpt convention: the tensor scale multiplies)."""
    rank = x.ndim
    # float16 / bfloat16 values are exact in binary32 (the arithmetic below is float64).
    xw = np.ascontiguousarray(x, np.float64 if x.dtype == np.float64 else np.float32)
    g = global_scale(float(max(np.max(xw, initial=0), -np.min(xw, initial=0))))  # max |x|, no |x| array
    sizes: list[int | None] = [1] * (rank - 1) + [BLOCK] if rank else []
    xc = cells(xw, sizes) if rank else xw.reshape(1, 1)
    xb = xc.reshape(-1, xc.shape[-1])  # every cell axis but the last has extent 1
    n = xb.shape[0]
    # Without padding the codes of whole blocks are the packed stream's own order, so each
    # chunk writes its bytes in place.
    paired = rank > 0 and x.shape[-1] % BLOCK == 0
    per = BLOCK // 2 if paired else xb.shape[1]  # bytes out per block
    out = np.empty(n * per, np.uint8)
    e4 = np.empty(n)

    def blocks(lo: int, hi: int) -> None:
        b = xb[lo:hi]
        if b.dtype == np.float32:
            e4[lo:hi], s = _scales(row_amax(b).astype(np.float64), g)
            c = _codes32(b, s)
        else:
            e4[lo:hi], s = _scales(np.max(np.abs(b), axis=1, initial=0.0), g)
            with np.errstate(divide="ignore", invalid="ignore"):
                y = np.where(s[:, None] > 0, b / np.where(s > 0, s, 1.0)[:, None], 0.0)
            c = cast_codes(y, "e2m1fn")
        c = positive_zero(c, 4)  # a value that rounds to zero is +0 (issue 24)
        out[lo * per:hi * per] = pack(c.reshape(-1), 4) if paired else c.reshape(-1)

    map_chunks(blocks, n, xb.shape[1], _float_fast.CHUNK_ELEMENTS)
    if paired:
        codes = out.reshape(x.shape[:-1] + (x.shape[-1] // 2,))
    else:
        codes = pack(uncells(out.reshape(xc.shape), x.shape) if rank else out.reshape(()), 4)
    e4 = grid_array(e4.reshape(xc.shape[:-1] + (1,))) if rank else e4.reshape(())
    grid = e4.shape
    nested = {
        "shape": list(grid), "dtype": "float32",
        "codes": codes_entry("scale.codes", {"type": "float", "format": "e4m3fn"}, rank),
        "scale": {"blocks": grid_blocks([None] * rank), "op": "multiply", "tensor": "scale.scale"},
    }
    desc = {
        "shape": list(x.shape), "dtype": dtype,
        "codes": codes_entry("codes", {"type": "float", "format": "e2m1fn"}, rank),
        "scale": {"blocks": grid_blocks(sizes), "op": "multiply", "encoded": nested},
        "scheme": "nvfp4",
    }
    comps = {
        "codes": codes,
        "scale.codes": cast_codes(e4, "e4m3fn").view(ml_dtypes.float8_e4m3fn),
        "scale.scale": np.array(g, np.float32),
    }
    return QTensor(desc, comps)
