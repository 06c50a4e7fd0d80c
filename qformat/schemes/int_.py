"""Scheme "int": b-bit integer codes (2 <= b <= 8) with a scale per group along one axis.

Symmetric (default): two's complement codes q in [-2^(b-1), 2^(b-1)-1], x ~ q * s.  Per group
the scale is the best of a small candidate set, judged by the squared error of the values a
reader decodes (scale rounded to ``scale_dtype``, binary32 product, cast to the logical
dtype).  The set holds +-amax / m for m around 2^(b-1), so it contains both GGUF Q4_0's
choice (the value of largest magnitude divided by -2^(b-1)) and amax / (2^(b-1) - 1): the
result is never worse than Q4_0 on the same group.

Asymmetric: unsigned codes q in [0, 2^b - 1] with an integer zero point z per group (a plain
U8 tensor), x ~ (q - z) * s, s = (max - min) / (2^b - 1) over the group's range widened to
include 0 (so that 0 is exact and z is in range).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..qtensor import QTensor
from .registry import Planned, register
from ._common import (
    SCALE_STORAGE, bad_param, cell_amax, cell_axes, cells, check_axis, check_bool, check_choice, check_int, codes_entry, f32, grid_array, grid_blocks, nearest_of_two, np_dtype, pack, packed_shape, resolve_sizes, to_output, uncells,
)

_SCALE_DTYPES = ("float32", "float16", "bfloat16")
#: Elements encoded per chunk: the candidate search keeps a dozen float64 temporaries alive.
CHUNK_ELEMENTS = 1 << 20


def _multipliers(bits: int) -> list[tuple[float, float]]:
    """(sign, m) pairs: candidate scales are sign * amax / m.

    m = 2^(b-1) with both signs covers Q4_0 (the extreme value lands on code -2^(b-1)
    whatever its sign); m = 2^(b-1) - 1 is the plain amax / qmax scale (one sign suffices, the
    code range is symmetric there); the others trade a little clipping for resolution.
    """
    half = float(1 << (bits - 1))
    out: list[tuple[float, float]] = [(-1.0, half), (1.0, half), (1.0, half - 1.0)]
    for m in (half + 0.5, half + 0.25, half - 0.25, half - 0.5, half - 0.75):
        out += [(-1.0, m), (1.0, m)]
    return out


def _best_codes(x: np.ndarray, s: np.ndarray, z: np.ndarray | float, lo: int, hi: int, dtype: str) -> np.ndarray:
    """Codes in [lo, hi] decoding closest to x for scale s and zero point z (exact decode)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(s != 0, x / np.where(s != 0, s, 1.0), 0.0) + z
    q0 = np.clip(np.rint(y), lo, hi)
    q1 = np.clip(q0 + np.where(y > q0, 1.0, -1.0), lo, hi)  # the runner-up code on the other side

    def decode(q: np.ndarray) -> np.ndarray:
        return to_output(f32((q - z) * s), dtype)  # (q - z) is exact; product rounded once

    return nearest_of_two(x, q0, q1, decode)


def _sse(x: np.ndarray, q: np.ndarray, s: np.ndarray, z: np.ndarray | float, dtype: str) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        d = to_output(f32((q - z) * s), dtype) - x
        e = np.sum(d * d, axis=cell_axes(x.ndim // 2), keepdims=True)
    return np.where(np.isnan(e), np.inf, e)


def _to_scale(v: np.ndarray, scale_dtype: str) -> np.ndarray:
    """Round candidate scales to the stored dtype; back as float64 (exact)."""
    with np.errstate(over="ignore"):
        return np.asarray(v, np.float64).astype(np_dtype(scale_dtype)).astype(np.float64)


def _symmetric(xc: np.ndarray, bits: int, scale_dtype: str, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    amax = cell_amax(xc)
    best_e = np.full(amax.shape, np.inf)
    best_s = np.zeros(amax.shape)
    best_q = np.zeros(xc.shape)
    for sign, m in _multipliers(bits):
        s = _to_scale(sign * amax / m, scale_dtype)
        ok = np.isfinite(s)
        s = np.where(ok, s, 0.0)
        q = _best_codes(xc, s, 0.0, lo, hi, dtype)
        e = np.where(ok, _sse(xc, q, s, 0.0, dtype), np.inf)
        better = e < best_e
        best_e = np.where(better, e, best_e)
        best_s = np.where(better, s, best_s)
        best_q = np.where(better, q, best_q)
    if not np.isfinite(best_e).all():
        raise bad_param("scale_dtype", f"a dtype that holds every group's scale (max |x| = {float(amax.max()):g})", scale_dtype)
    return best_q, best_s


def _asymmetric(xc: np.ndarray, bits: int, scale_dtype: str, dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    qmax = (1 << bits) - 1
    ax = cell_axes(xc.ndim // 2)
    mn = np.minimum(np.min(xc, axis=ax, keepdims=True, initial=0.0), 0.0)
    mx = np.maximum(np.max(xc, axis=ax, keepdims=True, initial=0.0), 0.0)
    s = _to_scale((mx - mn) / qmax, scale_dtype)
    if not np.isfinite(s).all():
        raise bad_param("scale_dtype", f"a dtype that holds every group's scale (max range {float((mx - mn).max()):g})", scale_dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(s > 0, np.clip(np.rint(-mn / np.where(s > 0, s, 1.0)), 0, qmax), 0.0)
    q = _best_codes(xc, s, z, 0, qmax, dtype)
    return q, s, z


def _chunked(fn, xc: np.ndarray, *args: Any) -> tuple[np.ndarray, ...]:  # type: ignore[no-untyped-def]
    """Run ``fn`` over slices of the first grid axis (groups are independent) and concatenate."""
    if xc.ndim == 0 or xc.shape[0] <= 1:
        return fn(xc, *args)
    step = max(1, CHUNK_ELEMENTS // max(1, xc[:1].size))
    parts = [fn(xc[i : i + step], *args) for i in range(0, xc.shape[0], step)]
    return tuple(np.concatenate(p, axis=0) for p in zip(*parts))


def plan(shape: tuple[int, ...], dtype: str, bits: Any = 4, group_size: Any = 32, axis: Any = -1, symmetric: Any = True,
         scale_dtype: Any = "float16") -> Planned:
    """What :func:`encode` writes for an array of ``shape`` (see :data:`~qformat.schemes.registry.Planned`)."""
    b = check_int("bits", bits, 2, 8)
    g = check_int("group_size", group_size, 1, allow_none=True)
    sym = check_bool("symmetric", symmetric)
    sdt = check_choice("scale_dtype", scale_dtype, _SCALE_DTYPES)
    rank = len(shape)
    ax = check_axis("axis", axis, rank)
    sizes: list[int | None] = [1] * rank
    if ax is not None:
        sizes[ax] = g
    grid = resolve_sizes(shape, sizes)[1]
    desc: dict[str, Any] = {"shape": list(shape), "dtype": dtype}
    comps: dict[str, tuple[str, tuple[int, ...]]] = {}
    codes_spec = ("I8" if sym else "U8", tuple(shape)) if b == 8 else ("U8", packed_shape(shape, b))
    if sym:
        desc["codes"] = codes_entry("codes", {"type": "int", "bits": b, "signedness": "twos_complement"}, rank)
    else:
        desc["codes"] = codes_entry("codes", {"type": "int", "bits": b, "signedness": "unsigned"}, rank)
        desc["zero"] = {"blocks": grid_blocks(sizes), "tensor": "zero"}
        comps["zero"] = ("U8", grid)
    comps["codes"] = codes_spec
    desc["scale"] = {"blocks": grid_blocks(sizes), "op": "multiply", "tensor": "scale"}
    desc["scheme"] = "int"
    comps["scale"] = (SCALE_STORAGE[sdt], grid)
    return desc, comps


@register("int", plan)
def encode(x: np.ndarray, *, dtype: str, bits: Any = 4, group_size: Any = 32, axis: Any = -1,
           symmetric: Any = True, scale_dtype: Any = "float16") -> QTensor:
    """Integer codes with a scale per ``group_size`` elements along ``axis`` (None: whole axis)."""
    b = check_int("bits", bits, 2, 8)
    g = check_int("group_size", group_size, 1, allow_none=True)
    sym = check_bool("symmetric", symmetric)
    sdt = check_choice("scale_dtype", scale_dtype, _SCALE_DTYPES)
    rank = x.ndim
    ax = check_axis("axis", axis, rank)
    sizes: list[int | None] = [1] * rank
    if ax is not None:
        sizes[ax] = g
    xc = cells(x.astype(np.float64), sizes)
    blocks = grid_blocks(sizes)
    desc: dict[str, Any] = {"shape": list(x.shape), "dtype": dtype}
    if sym:
        q, s = _chunked(_symmetric, xc, b, sdt, dtype)
        codes = uncells(q, x.shape).astype(np.int64)
        desc["codes"] = codes_entry("codes", {"type": "int", "bits": b, "signedness": "twos_complement"}, rank)
        # 8-bit codes keep their natural dtype so plain safetensors readers see the integers.
        comps = {"codes": codes.astype(np.int8) if b == 8 else pack(codes & ((1 << b) - 1), b)}
    else:
        q, s, z = _chunked(_asymmetric, xc, b, sdt, dtype)
        codes = uncells(q, x.shape).astype(np.int64)
        desc["codes"] = codes_entry("codes", {"type": "int", "bits": b, "signedness": "unsigned"}, rank)
        desc["zero"] = {"blocks": blocks, "tensor": "zero"}
        comps = {"codes": codes.astype(np.uint8) if b == 8 else pack(codes, b), "zero": grid_array(z).astype(np.uint8)}
    desc["scale"] = {"blocks": blocks, "op": "multiply", "tensor": "scale"}
    desc["scheme"] = "int"
    comps["scale"] = grid_array(s).astype(np_dtype(sdt))
    return QTensor(desc, comps)
