"""Fast NumPy kernels of the float-family encoders (nf4, fp8, mx, nvfp4, codebook).

Each one gives exactly the result of a slower step (a block's max |x|, ``np.searchsorted``,
ml_dtypes' rounding to E2M1, :func:`~._common.pack`); they exist because those steps
dominated the encoders' time.  They work on binary32 data, one chunk of about half a million
elements at a time per thread.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from ._common import ML_TYPES, cast_codes, float_spec, pack

#: Elements per chunk of the float encoders' :func:`~._common.map_chunks` calls (None: the
#: default of ``_common``).  Each NumPy call has a fixed cost of a few microseconds, spent
#: holding the GIL: with 64K-element chunks these encoders ran at about half the speed they
#: reach with 512K on 2 threads.
CHUNK_ELEMENTS: int | None = 1 << 19

_U32 = np.uint32
_LE16, _LE64 = np.dtype("<u2"), np.dtype("<u8")  # explicit byte order: the views below pick bytes


# -- block maxima -----------------------------------------------------------------------------
def row_amax(xb: np.ndarray) -> np.ndarray:
    """max |x| per row of a C-contiguous binary32 array [n, B] (binary32 [n]).

    NumPy's reduction along a short last axis costs several ns per element; halving the rows
    pairwise (even and odd elements of the flat array) runs at memory speed.  An odd factor of
    B left over is reduced on the bit patterns, which order as the values do for |x| and reduce
    faster than floats.
    """
    n, b = xb.shape
    a = np.abs(xb).reshape(-1)
    while b % 2 == 0 and b > 1:
        a = np.maximum(a[0::2], a[1::2])
        b //= 2
    if b > 1:
        a = a.reshape(n, b).view(_U32).max(axis=1).view(np.float32)
    return a.reshape(n)


# -- counting thresholds ----------------------------------------------------------------------
def count_above(y: np.ndarray, thresholds: Sequence[Any]) -> np.ndarray:
    """Per element of ``y``, how many of ``thresholds`` it exceeds (uint8, same shape; at most
    255 thresholds, each a scalar or an array broadcasting against ``y``).

    For sorted scalars this is ``np.searchsorted(thresholds, y, side="left")``, ten times
    faster for a dozen thresholds (one vector compare and add each, no branches).
    """
    acc = np.zeros(y.shape, np.uint8)
    m = np.empty(y.shape, np.bool_)
    for t in thresholds:
        np.greater(y, t, out=m)
        acc += m.view(np.uint8)
    return acc


@lru_cache(maxsize=None)
def _grid(fmt: str) -> np.ndarray:
    """The non-negative finite values of a float element format, by code."""
    bits = {"e2m1fn": 4, "e2m3fn": 6, "e3m2fn": 6}.get(fmt, 8)
    v = np.arange(1 << (bits - 1), dtype=np.uint8).view(ML_TYPES[fmt]).astype(np.float64)
    return v[np.isfinite(v) & (v <= float_spec(fmt)[3])]


@lru_cache(maxsize=None)
def _round_thresholds(fmt: str) -> tuple[np.float32, ...]:
    """Binary32 t_k such that |y| > t_k <=> |y| rounds (to nearest even) to code k + 1 or above.

    A midpoint goes to the even code, so where code k + 1 is even ">= midpoint" becomes
    "> the binary32 value just below it"."""
    v = _grid(fmt)
    out = []
    for k in range(len(v) - 1):
        mid = np.float32((v[k] + v[k + 1]) / 2)  # exact: a few significant bits
        out.append(np.nextafter(mid, np.float32(0)) if (k + 1) % 2 == 0 else mid)
    return tuple(out)


# -- rounding to float element formats --------------------------------------------------------
def float_codes(y: np.ndarray, fmt: str) -> np.ndarray:
    """``cast_codes(y, fmt)`` for binary32 ``y``: codes of y rounded to nearest even, saturated.

    ml_dtypes' conversion to E2M1 costs about 5 ns per element, so E2M1's 7 magnitudes are
    counted instead (|y| against the rounding thresholds, then the sign bit), at about 2.
    The other formats keep ml_dtypes' conversion (3-5 ns): rounding on the bit patterns in
    NumPy gained at most 15% over a whole encoder (E2M3) and lost on the 8-bit formats.
    """
    if fmt != "e2m1fn":
        return cast_codes(y, fmt)
    y = np.ascontiguousarray(y, np.float32)
    c = count_above(np.abs(y), _round_thresholds(fmt))
    c |= (y.view(_U32) >> _U32(28)).astype(np.uint8) & np.uint8(8)
    return c


def positive_zero(c: np.ndarray, bits: int) -> np.ndarray:
    """Float element codes with every negative zero (sign bit alone, code ``1 << (bits - 1)``)
    replaced by +0, in place (uint8 codes): a value that rounds to zero is written +0, the
    only zero ggml's MXFP4/NVFP4 tables and MLX's formats give back (issue 24), so the
    encoders' output exports exactly.  Returns ``c``."""
    c[c == np.uint8(1 << (bits - 1))] = 0
    return c


def tie_suspects(q: np.ndarray, m: int) -> np.ndarray:
    """Flat indices of the nonzero binary32 values in ``q`` with at most m + 2 significant bits.

    ``q`` holds binary32 quotients x / s that a reference computes in binary64; rounding q
    to an element format with m mantissa bits gives the same code as rounding the exact
    quotient unless q landed on a tie of that format (a value with at most m + 2 significant
    bits), so only these need the reference's arithmetic.  Few values qualify in real data.
    """
    b = q.reshape(-1).view(_U32)
    idx = np.flatnonzero((b & _U32((1 << (22 - m)) - 1)) == 0)
    return idx[(b[idx] & _U32(0x7FFFFFFF)) != 0]


# -- packing ----------------------------------------------------------------------------------
def pack_stream(q: np.ndarray, bits: int) -> np.ndarray:
    """Codes (uint8, flat) as one LSB-first bit stream of ``bits``-bit fields (uint8 bytes,
    ``len(q) * bits`` a multiple of 8): eight codes per little-endian uint64 word."""
    q = np.ascontiguousarray(q, np.uint8).reshape(-1)
    if bits == 8:
        return q
    if bits == 4:
        return pack(q, 4)
    n = q.size
    if n % 8:
        q = np.concatenate([q, np.zeros(8 - n % 8, np.uint8)])
    v = q.view(_LE64)
    w = v & np.uint64(0xFF)
    for i in range(1, 8):
        w |= ((v >> np.uint64(8 * i)) & np.uint64(0xFF)) << np.uint64(bits * i)
    return w.view(np.uint8).reshape(-1, 8)[:, :bits].reshape(-1)[: n * bits // 8]


def packs_flat(shape: Sequence[int], bits: int) -> bool:
    """True when :func:`~._common.pack` of codes of ``shape`` is their flat bit stream
    (rows a whole number of bytes long, nothing to pad)."""
    return len(shape) > 0 and (int(shape[-1]) * bits) % 8 == 0


def pack_codes(q: np.ndarray, bits: int, shape: Sequence[int]) -> np.ndarray:
    """``pack(q.reshape(shape), bits)`` for flat uint8 codes ``q`` in row-major order."""
    shape = tuple(int(s) for s in shape)
    if not packs_flat(shape, bits):
        return pack(np.asarray(q, np.uint8).reshape(shape), bits)
    return pack_stream(q, bits).reshape(shape[:-1] + (shape[-1] * bits // 8,))


def whole_bytes(n: int, bits: int) -> bool:
    """True when ``n`` codes of ``bits`` bits fill whole bytes (a chunk's stream ends on one)."""
    return (n * bits) % 8 == 0


__all__ = ["CHUNK_ELEMENTS", "count_above", "float_codes", "pack_codes", "pack_stream", "packs_flat",
           "row_amax", "tie_suspects", "whole_bytes"]
