"""Schemes "fp8_e4m3" and "fp8_e5m2": FP8 codes with a binary32 scale amax / max.

Granularity: "tensor" (one scale), "channel" (one scale per index of every axis but ``axis``,
i.e. per output channel of an [N, K] weight with the default axis -1) or "block" (blocks of
``block_size`` over the trailing axes, e.g. [128, 128]; leading axes get one block per index,
partial edge blocks allowed).  Codes are x / s rounded to nearest even with saturation, stored
as float8 arrays so plain safetensors readers see F8_E4M3 / F8_E5M2 values.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from ..qtensor import QTensor
from .registry import Planned, register
from ._common import (
    bad_param, cast_codes, cell_axes, cells, check_axis, check_choice, check_int, codes_entry, fit_scale, float_spec, grid_array, grid_blocks, map_chunks, resolve_sizes, uncells,
)
from . import _float_fast
from ._float_fast import tie_suspects

_GRANULARITY = ("tensor", "channel", "block")
_STORAGE = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
_STORAGE_NAME = {"e4m3fn": "F8_E4M3", "e5m2": "F8_E5M2"}


def _block_sizes(block_size: Any, rank: int) -> list[int | None]:
    if isinstance(block_size, (int, np.integer)) and not isinstance(block_size, bool):
        block_size = [block_size]
    if not isinstance(block_size, (list, tuple)) or not block_size:
        raise bad_param("block_size", "a non-empty list of positive integers, e.g. [128, 128]", block_size)
    bs = [check_int("block_size", b, 1) for b in block_size]
    # Blocks cover the trailing axes; a tensor with fewer axes uses the trailing sizes.
    return [1] * max(rank - len(bs), 0) + bs[max(len(bs) - rank, 0):]


def _sizes(rank: int, granularity: Any, axis: Any, block_size: Any) -> list[int | None]:
    """The scale's block sizes per axis for a granularity (validated as the encoder does)."""
    gran = check_choice("granularity", granularity, _GRANULARITY)
    ax = check_axis("axis", axis, rank)
    blocks = _block_sizes(block_size, rank)
    if gran == "tensor":
        return [None] * rank
    if gran == "channel":
        return [None if a == ax else 1 for a in range(rank)]
    return list(blocks)


def _plan(fmt: str, shape: tuple[int, ...], dtype: str, granularity: Any, axis: Any, block_size: Any) -> Planned:
    sizes = _sizes(len(shape), granularity, axis, block_size)
    desc = {
        "shape": list(shape), "dtype": dtype,
        "codes": codes_entry("codes", {"type": "float", "format": fmt}, len(shape)),
        "scale": {"blocks": grid_blocks(sizes), "op": "multiply", "tensor": "scale"},
        "scheme": "fp8_e4m3" if fmt == "e4m3fn" else "fp8_e5m2",
    }
    return desc, {"codes": (_STORAGE_NAME[fmt], tuple(shape)), "scale": ("F32", resolve_sizes(shape, sizes)[1])}


def _amax(xc: np.ndarray) -> np.ndarray:
    """max |x| per cell (keepdims) as :func:`~._common.cell_amax`, from max and min (no |x| temporary)."""
    axes = cell_axes(xc.ndim // 2)
    hi = np.max(xc, axis=axes, keepdims=True, initial=-np.inf)
    lo = np.min(xc, axis=axes, keepdims=True, initial=np.inf)
    return np.maximum(hi, -lo)


def _codes(fmt: str, xs: np.ndarray, ss: np.ndarray) -> np.ndarray:
    """Codes of x / s for cells ``xs`` with scales ``ss`` (float64, broadcast), as the binary64
    quotient rounds.  For binary32 x that is also how the exact quotient rounds (a quotient of
    two 24-bit values is never within 2^-29 of a tie of the format without being on it), and
    so does the binary32 quotient, at a third of the cost, unless it landed on a tie (see
    tie_suspects)."""
    if xs.dtype != np.float32:
        return cast_codes(xs / ss, fmt)
    q = xs / ss.astype(np.float32)
    c = cast_codes(q, fmt).reshape(-1)
    idx = tie_suspects(q, float_spec(fmt)[1])
    if idx.size:
        at = np.unravel_index(idx, q.shape)
        s_at = ss[tuple(i if n > 1 else 0 for i, n in zip(at, ss.shape))]
        c[idx] = cast_codes(xs[at].astype(np.float64) / s_at, fmt)
    return c.reshape(q.shape)


def _encode(fmt: str, x: np.ndarray, dtype: str, granularity: Any, axis: Any, block_size: Any) -> QTensor:
    rank = x.ndim
    sizes = _sizes(rank, granularity, axis, block_size)
    fmax = float_spec(fmt)[3]
    # float16 / bfloat16 values are exact in binary32 (and their quotients round as the exact
    # binary64 ones do, see _codes).
    xc = cells(np.ascontiguousarray(x, np.float64 if x.dtype == np.float64 else np.float32), sizes)
    s = fit_scale(_amax(xc).astype(np.float64), fmax)
    if rank:  # elementwise from here: chunks along the first axis of the cell view longer than 1
        ax = next((a for a, n in enumerate(xc.shape) if n > 1), 0)
        n = xc.shape[ax]
        out = np.empty(xc.shape, np.uint8)

        def part(lo: int, hi: int) -> None:
            sl = (slice(None),) * ax + (slice(lo, hi),)
            out[sl] = _codes(fmt, xc[sl], s[sl] if s.shape[ax] > 1 else s)

        map_chunks(part, n, xc.size // max(n, 1), _float_fast.CHUNK_ELEMENTS)
        codes = np.ascontiguousarray(uncells(out, x.shape))
    else:
        codes = cast_codes(xc.astype(np.float64) / s, fmt)
    desc = {
        "shape": list(x.shape), "dtype": dtype,
        "codes": codes_entry("codes", {"type": "float", "format": fmt}, rank),
        "scale": {"blocks": grid_blocks(sizes), "op": "multiply", "tensor": "scale"},
        "scheme": "fp8_e4m3" if fmt == "e4m3fn" else "fp8_e5m2",
    }
    return QTensor(desc, {"codes": codes.view(_STORAGE[fmt]), "scale": grid_array(s).astype(np.float32)})


def plan_e4m3(shape: tuple[int, ...], dtype: str, granularity: Any = "channel", axis: Any = -1,
              block_size: Any = (128, 128)) -> Planned:
    return _plan("e4m3fn", shape, dtype, granularity, axis, block_size)


def plan_e5m2(shape: tuple[int, ...], dtype: str, granularity: Any = "channel", axis: Any = -1,
              block_size: Any = (128, 128)) -> Planned:
    return _plan("e5m2", shape, dtype, granularity, axis, block_size)


@register("fp8_e4m3", plan_e4m3)
def encode_e4m3(x: np.ndarray, *, dtype: str, granularity: Any = "channel", axis: Any = -1,
                block_size: Any = (128, 128)) -> QTensor:
    """FP8 E4M3 codes, scale amax / 448 per tensor, channel or block."""
    return _encode("e4m3fn", x, dtype, granularity, axis, block_size)


@register("fp8_e5m2", plan_e5m2)
def encode_e5m2(x: np.ndarray, *, dtype: str, granularity: Any = "channel", axis: Any = -1,
                block_size: Any = (128, 128)) -> QTensor:
    """FP8 E5M2 codes, scale amax / 57344 per tensor, channel or block."""
    return _encode("e5m2", x, dtype, granularity, axis, block_size)
