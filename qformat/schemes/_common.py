"""Helpers shared by the encoders: parameter checks, block geometry, exact rounding, packing.

Every encoder works in float64 on the input values and reproduces the decoder's binary32
arithmetic exactly (one rounding per step) wherever it compares candidates, so the codes it
picks are the best ones *for the values a reader will actually decode*.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, Sequence, overload

import ml_dtypes
import numpy as np

from .. import dtypes as _dt
from .. import tables
from ..errors import error
from ..packing import Packing, pack_rows

#: Worker threads of :func:`map_chunks` (NumPy releases the GIL in large operations).  The
#: result never depends on it: every encoder works on independent rows (groups / blocks).
THREADS = max(1, min(os.cpu_count() or 1, 8))
#: Elements per chunk of :func:`map_chunks` (a few float32 / float64 temporaries stay in cache).
CHUNK_ELEMENTS = 1 << 16

#: Smallest positive binary32 (a subnormal); the floor of every scale that must not be zero.
F32_TINY = float(np.float32(2.0**-149))


# -- parameter checks (ENCODE_PARAM_INVALID names the parameter, what was expected, what was found)
def bad_param(name: str, expected: str, found: Any) -> Exception:
    """The ENCODE_PARAM_INVALID error for parameter ``name``."""
    text = repr(found)
    if len(text) > 80:  # long tables: enough to recognise them
        text = text[:60] + f"... ({type(found).__name__} of length {len(found) if hasattr(found, '__len__') else '?'})"
    return error("ENCODE_PARAM_INVALID", f"parameter {name!r}: expected {expected}, found {text}", field=name)


@overload
def check_int(name: str, value: Any, lo: int, hi: int | None = None, allow_none: Literal[False] = False) -> int: ...
@overload
def check_int(name: str, value: Any, lo: int, hi: int | None = None, allow_none: bool = ...) -> int | None: ...


def check_int(name: str, value: Any, lo: int, hi: int | None = None, allow_none: bool = False) -> int | None:
    """An integer in [lo, hi] (bool is not an integer here), or None when allowed."""
    if value is None and allow_none:
        return None
    rng = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
    if allow_none:
        rng += " or None"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise bad_param(name, rng, value)
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        raise bad_param(name, rng, value)
    return v


def check_bool(name: str, value: Any) -> bool:
    """A real bool (1 and "yes" are refused: a typo should not pass silently)."""
    if not isinstance(value, (bool, np.bool_)):
        raise bad_param(name, "True or False", value)
    return bool(value)


def check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    """One of ``choices``; a NumPy dtype whose name is a choice is accepted too."""
    v = value
    if not isinstance(v, str):
        try:
            v = np.dtype(v).name
        except (TypeError, ValueError):
            raise bad_param(name, "one of " + ", ".join(map(repr, choices)), value) from None
    if v not in choices:
        raise bad_param(name, "one of " + ", ".join(map(repr, choices)), value)
    return v


def check_axis(name: str, value: Any, rank: int) -> int | None:
    """A valid axis of a rank-``rank`` array, normalised; None for rank 0 (which has no axis)."""
    if rank == 0:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value not in (-1, 0):
            raise bad_param(name, "-1 or 0 for a rank-0 array", value)
        return None
    return check_int(name, value, -rank, rank - 1) % rank


# -- chunks ---------------------------------------------------------------------------------------
def map_chunks(fn, n: int, row_elements: int, chunk: int | None = None) -> list[Any]:  # type: ignore[no-untyped-def]
    """``[fn(lo, hi) for each row range]`` over ``n`` independent rows of ``row_elements``
    elements, about ``chunk`` (default :data:`CHUNK_ELEMENTS`) elements per call, in order,
    on up to :data:`THREADS` threads.  ``fn`` must treat each row on its own (no reduction
    across rows), so the concatenated result is the same for every chunk size and thread
    count.  n == 0 still calls ``fn(0, 0)`` once (empty results keep their shapes)."""
    step = max(1, (chunk or CHUNK_ELEMENTS) // max(1, row_elements))
    bounds = [(i, min(i + step, n)) for i in range(0, n, step)] or [(0, 0)]
    if THREADS <= 1 or len(bounds) == 1:
        return [fn(a, b) for a, b in bounds]
    with ThreadPoolExecutor(min(THREADS, len(bounds))) as ex:
        return list(ex.map(lambda ab: fn(*ab), bounds))


# -- dtypes -----------------------------------------------------------------------------------
def np_dtype(name: str) -> np.dtype:
    """NumPy dtype of a logical / scale dtype name (bfloat16 through ml_dtypes)."""
    return _dt.logical_numpy(name)


def to_output(v32: np.ndarray, dtype: str) -> np.ndarray:
    """Binary32 values cast to the logical dtype as the decoder does, back as float64."""
    with np.errstate(over="ignore"):
        return np.asarray(v32, np.float32).astype(np_dtype(dtype)).astype(np.float64)


def f32(v: Any) -> np.ndarray:
    """Round to binary32 (RNE), as float64 values (float64 keeps later products exact)."""
    with np.errstate(over="ignore"):
        return np.asarray(v, np.float64).astype(np.float32).astype(np.float64)


def fit_scale(amax: np.ndarray, top: float) -> np.ndarray:
    """Binary32 scales s = fp32(amax / top), never 0 for amax > 0, with top * s finite.

    amax 0 gives 1 (any scale decodes zeros exactly).  Where the quotient is subnormal and
    rounding went down, s goes one ulp up: a subnormal's relative rounding error is large, and
    amax / s would clip far past ``top``.  Normal scales stay the plain quotient (they clip by
    at most one part in 2^24), so they agree bit for bit with the usual amax / max recipe.
    """
    amax = np.asarray(amax, np.float64)
    with np.errstate(over="ignore"):
        s = np.asarray(amax / top, np.float64).astype(np.float32)
        up = np.nextafter(s, np.float32(np.inf))
        low = (s < np.float32(2.0**-126)) & (s.astype(np.float64) * top < amax)
        s = np.where(low, up, s)
        s = np.where(np.isfinite(s * np.float32(top)), s, np.nextafter(s, np.float32(0)))
    return np.where(amax > 0, s, np.float32(1)).astype(np.float64)


# -- blocks -----------------------------------------------------------------------------------
def resolve_sizes(shape: Sequence[int], sizes: Sequence[int | None]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(cell extent per axis, grid shape) of a grid with ``sizes`` (None = whole axis)."""
    ext, grid = [], []
    for n, s in zip(shape, sizes):
        if s is None:
            ext.append(max(int(n), 1))
            grid.append(1)
        else:
            ext.append(int(s))
            grid.append(-(-int(n) // int(s)))
    return tuple(ext), tuple(grid)


def cells(x: np.ndarray, sizes: Sequence[int | None]) -> np.ndarray:
    """``x`` zero-padded to whole cells and viewed as [G0, s0, G1, s1, ...].

    Zero padding is neutral for every statistic the encoders take (max |x|, sums of squared
    error, since zero is exactly representable by every scheme here).
    """
    ext, grid = resolve_sizes(x.shape, sizes)
    pad = [(0, g * e - n) for n, e, g in zip(x.shape, ext, grid)]
    xp = np.pad(x, pad) if any(p[1] for p in pad) else x
    inter = [d for g, e in zip(grid, ext) for d in (g, e)]
    return xp.reshape(inter)


def uncells(v: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Inverse of :func:`cells` (drops the padding)."""
    r = len(shape)
    full = tuple(v.shape[2 * a] * v.shape[2 * a + 1] for a in range(r))
    return v.reshape(full)[tuple(slice(0, int(n)) for n in shape)]


def cell_axes(rank: int) -> tuple[int, ...]:
    """The within-cell axes of a :func:`cells` view."""
    return tuple(range(1, 2 * rank, 2))


def cell_amax(xc: np.ndarray) -> np.ndarray:
    """max |x| per cell, keepdims (shape [G0, 1, G1, 1, ...])."""
    r = xc.ndim // 2
    return np.max(np.abs(xc), axis=cell_axes(r), keepdims=True, initial=0.0)


def grid_array(v: np.ndarray) -> np.ndarray:
    """A keepdims per-cell array [G0, 1, G1, 1, ...] as the grid-shaped array [G0, G1, ...]."""
    return v.reshape(v.shape[0::2])


def grid_blocks(sizes: Sequence[int | None]) -> dict[str, Any]:
    """The descriptor's ``blocks`` object of a grid."""
    return {"type": "grid", "size": [None if s is None else int(s) for s in sizes]}


def flat_cells(x: np.ndarray, block: int) -> np.ndarray:
    """The row-major flattened ``x``, zero-padded, as [nblocks, block]."""
    flat = x.reshape(-1)
    nb = -(-flat.size // block)
    if nb * block != flat.size:
        flat = np.concatenate([flat, np.zeros(nb * block - flat.size, flat.dtype)])
    return flat.reshape(nb, block)


def unflat(v: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Inverse of :func:`flat_cells` (drops the padding)."""
    n = math.prod(shape)
    return v.reshape(-1)[:n].reshape(tuple(shape))


# -- float mini-formats (table driven; exact in float64) --------------------------------------
def float_spec(fmt: str) -> tuple[int, int, int, float]:
    """(exponent bits, mantissa bits, bias, max finite) of a float element format."""
    e = tables.float_formats()[fmt]
    return int(e["exponent_bits"]), int(e["mantissa_bits"]), int(e["bias"]), float(e["max"])


def emax(fmt: str) -> int:
    """Exponent of the largest binade of a float format: floor(log2(max))."""
    return int(np.frexp(float_spec(fmt)[3])[1]) - 1


def round_float(y: np.ndarray, fmt: str) -> np.ndarray:
    """Values of ``y`` rounded to ``fmt`` with saturation: clip to +-max, then round half to even.

    Done by hand in float64 (every step exact) rather than through a framework cast, so the
    result does not depend on how ml_dtypes converts float64 (tests compare the two).
    """
    _, m, bias, fmax = float_spec(fmt)
    y = np.clip(np.asarray(y, np.float64), -fmax, fmax)
    e = np.maximum(np.frexp(y)[1] - 1, 1 - bias)  # binade of y, subnormals share the lowest
    return np.ldexp(np.rint(np.ldexp(y, m - e)), e - m)


#: ml_dtypes type of each float element format (codes are their bit patterns).
ML_TYPES = {
    "e2m1fn": ml_dtypes.float4_e2m1fn, "e2m3fn": ml_dtypes.float6_e2m3fn, "e3m2fn": ml_dtypes.float6_e3m2fn,
    "e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
}


def cast_codes(y: np.ndarray, fmt: str) -> np.ndarray:
    """Codes (uint8 bit patterns) of ``y`` rounded to ``fmt`` with saturation: clip to +-max,
    then ml_dtypes' round-half-even conversion, which rounds float32 and float64 inputs directly
    (no double rounding) and keeps the sign of zeros.  tests/test_schemes.py checks it against a
    by-hand transcription (:func:`round_float`, then the bit fields) on every float32
    exponent/high-mantissa pattern and on float64 ties, so an ml_dtypes change cannot go unseen.
    """
    fmax = float_spec(fmt)[3]
    y = np.asarray(y)
    if y.dtype not in (np.float32, np.float64):
        y = y.astype(np.float64)
    top = y.dtype.type(fmax)
    return np.clip(y, -top, top).astype(ML_TYPES[fmt]).view(np.uint8)


# -- codes ------------------------------------------------------------------------------------
def packing(rank: int) -> dict[str, Any]:
    """The canonical packing every encoder writes: bytes, LSB first, rows along the last axis."""
    return {"container": 8, "bit_order": "lsb_first", "axis": rank - 1 if rank else None}


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned codes of the logical shape packed per :func:`packing` (a U8 array)."""
    c = np.asarray(codes, np.uint8)
    if c.ndim == 0:
        c = c.reshape(1)
    if bits == 8:
        return np.ascontiguousarray(c)
    if bits == 4:  # the common case, directly: element 2k in the low nibble of byte k
        if c.shape[-1] % 2:
            c = np.concatenate([c, np.zeros(c.shape[:-1] + (1,), np.uint8)], axis=-1)
        # Each pair read as one little-endian uint16 (c[2k] + 256 c[2k+1]): two contiguous
        # operations instead of strided ones (codes below 16, as this function requires).
        v = np.ascontiguousarray(c).view("<u2")
        return (v | (v >> np.uint16(4))).astype(np.uint8)
    return pack_rows(c, bits, Packing.from_dict(packing(c.ndim)))


def codes_entry(tensor: str, element: dict[str, Any], rank: int) -> dict[str, Any]:
    """The descriptor's ``codes`` object, with the canonical packing."""
    return {"tensor": tensor, "element": element, "packing": packing(rank)}


def nearest_of_two(x: np.ndarray, q0: np.ndarray, q1: np.ndarray, decode) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Per element, whichever of codes q0 / q1 decodes closer to x (q0 on ties, never to Inf)."""
    with np.errstate(invalid="ignore", over="ignore"):
        e0 = np.abs(decode(q0) - x)
        e1 = np.abs(decode(q1) - x)
    e0 = np.where(np.isnan(e0), np.inf, e0)
    e1 = np.where(np.isnan(e1), np.inf, e1)
    return np.where(e1 < e0, q1, q0)


def best_int_codes(x: np.ndarray, s: np.ndarray, z: np.ndarray | float, lo: int, hi: int, dtype: str, exact_product: bool) -> np.ndarray:
    """Codes in [lo, hi] decoding closest to x (float64 [n, g]) for scale s and zero point z.

    ``exact_product``: the decoded value is exactly (q - z) * s (a float16 / bfloat16 scale
    times a code is exact in binary32, and float32 output keeps it), so the nearest code is
    the rounded quotient (float64 division is exact enough: a quotient is never within its
    rounding error of a half integer unless it is one).  Otherwise the decoder's roundings
    (binary32 product, cast to the logical dtype) are reproduced and the nearer of the two
    codes around the quotient is taken.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(s != 0, x / np.where(s != 0, s, 1.0), 0.0)
    if not isinstance(z, float) or z:
        y += z
    q0 = np.clip(np.rint(y), lo, hi)
    if exact_product:
        return q0
    q1 = np.clip(q0 + np.where(y > q0, 1.0, -1.0), lo, hi)  # the runner-up code on the other side

    def decode(q: np.ndarray) -> np.ndarray:
        return to_output(f32((q - z) * s), dtype)  # (q - z) is exact; product rounded once

    return nearest_of_two(x, q0, q1, decode)


#: safetensors dtype of a scale stored in each logical float dtype.
SCALE_STORAGE = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def packed_shape(shape: Sequence[int], bits: int) -> tuple[int, ...]:
    """The shape of :func:`pack`'s output (U8) for codes of ``shape`` (rank 0 packs as [1])."""
    s = tuple(int(n) for n in shape) or (1,)
    return s[:-1] + (Packing.from_dict(packing(len(s))).words_per_row(s[-1], bits),)
