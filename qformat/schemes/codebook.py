"""Scheme "codebook": a user table of up to 256 values stored in the file, nearest-value codes.

The table is the F32 component "table"; codes have ceil(log2(len)) bits (at least 1).  With
``block_size`` (default 64) each block of the flattened tensor gets a binary32 absmax scale
block_amax / max|values|; ``block_size=None`` stores no scale.  Each code is the table entry
whose *decoded* value (binary32 product, cast to the logical dtype) is nearest to x.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..qtensor import QTensor
from .registry import Planned, register
from ._common import (
    bad_param, check_int, codes_entry, f32, fit_scale, flat_cells, map_chunks, np_dtype, pack, packed_shape, to_output,
)
from . import _float_fast
from ._float_fast import count_above, pack_codes, packs_flat, row_amax


def _table(values: Any) -> np.ndarray:
    expected = "a 1-D sequence of 1 to 256 finite numbers (stored as float32)"
    try:
        t = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise bad_param("values", expected, values) from None
    if t.ndim != 1 or not 1 <= t.size <= 256:
        raise bad_param("values", expected, values)
    with np.errstate(over="ignore"):
        t32 = t.astype(np.float32)
    if not np.isfinite(t32).all():
        raise bad_param("values", expected, values)
    return t32


def _nearest(x: np.ndarray, s: np.ndarray, table: np.ndarray, dtype: str) -> np.ndarray:
    """Index of the table entry decoding nearest to x (x: [nb, B], s: [nb, 1] >= 0)."""
    order = np.argsort(table, kind="stable")
    srt = table[order].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(s > 0, x / np.where(s > 0, s, 1.0), 0.0)
    j = np.searchsorted(srt, y)
    best = np.clip(j, 0, len(srt) - 1)
    best_err = np.full(x.shape, np.inf)
    # Decoded values are monotone in the table value, so the nearest is among the entries
    # around y; two on each side absorb the binary32 and logical-dtype roundings.
    for k in (j - 2, j - 1, j, j + 1):
        k = np.clip(k, 0, len(srt) - 1)
        with np.errstate(over="ignore", invalid="ignore"):
            err = np.abs(to_output(f32(srt[k] * s), dtype) - x)
        err = np.where(np.isnan(err), np.inf, err)
        better = err < best_err
        best = np.where(better, k, best)
        best_err = np.where(better, err, best_err)
    return order[best]


#: Largest table the fast path counts midpoints for: one compare per entry and element, which
#: beyond 128 entries is slower than _nearest's search.
_FAST_ENTRIES = 128
#: Per logical dtype: a bound on the relative error of a decoded value (t * s rounded to
#: binary32, then to the dtype) where that is normal, and the dtype's smallest normal.
_DECODE = {"float32": (2.0**-23, 2.0**-126), "float16": (2.0**-10, 2.0**-14), "bfloat16": (2.0**-7, 2.0**-126)}


def _round_down32(v: np.ndarray) -> np.ndarray:
    """The largest binary32 value <= v (float64): for binary32 x, x > v <=> x > it.

    Rounded to nearest first; where that went up, one step down on the bit pattern read as
    int32: a positive value's pattern less one, a negative one's (sign bit set) plus one,
    which also takes -0 (only a negative v rounds up to a zero) to -2^-149."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = v.astype(np.float32)
        up = f.astype(np.float64) > v
    b = f.view(np.int32)
    b -= up * ((b >> 31) | 1)  # (b >> 31) | 1: +1 for a positive pattern, -1 for a negative one
    return f


def _certified(s: np.ndarray, amax: np.ndarray, srt: np.ndarray, p: np.ndarray, d: np.ndarray, mid: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Blocks where :func:`_nearest` provably picks the nearest decoded value (the lower on a
    tie), and per block the magnitude below which a nonzero x is left to _nearest anyway.

    ``p`` [L, n] are the exact products t * s of the sorted table ``srt`` and the scales,
    ``d`` their decoded values (binary32, then the logical dtype), ``mid`` the midpoints of
    consecutive ``d``.  A block qualifies when its decoded values are finite and strictly
    increasing, when x <= mid_k implies x / s <= t_k+1 and x > mid_k implies x / s > t_k (so
    _nearest's window of four entries around its search position holds the nearest one), and
    when every nonzero decoded value lies within 2^28 of the block's largest magnitude, as
    must x (below ``thr``, x goes to _nearest): then |d - x| and the midpoints are exact in
    float64 and _nearest's comparisons of errors are exact.

    When the table's relative gaps exceed 8 times the dtype's decoding error (``_DECODE``),
    three tests per block settle it: the smallest nonzero |t| * s is normal in the dtype
    (so every decoded value is within that error of t * s, which gives the first two), the
    largest |d| is finite, and that smallest one stays above ``thr``.  Other blocks check
    every entry.
    """
    rho, low = _DECODE[dtype]
    big = np.maximum(amax, np.maximum(np.abs(d[0]), np.abs(d[-1])))  # d is monotone in t
    e = np.frexp(big)[1] - 1  # floor(log2(big))
    thr = np.where(e > -98, np.ldexp(1.0, e - 28), 0.0)  # from -98 down every difference is exact
    ok = (s > 0) & np.isfinite(big)
    nz = np.abs(srt[srt != 0])
    gap = np.diff(srt)
    if nz.size and np.all((gap > 0) & (gap >= 8 * rho * np.maximum(np.abs(srt[:-1]), np.abs(srt[1:])))):
        lo = s * nz.min()
        quick = ok & (lo >= low) & (lo * (1 - rho) >= thr)
    else:
        quick = np.zeros_like(ok)
    rest = np.flatnonzero(ok & ~quick)
    if rest.size:
        pr, dr, mr, tr = p[:, rest], d[:, rest], mid[:, rest], thr[rest]
        with np.errstate(invalid="ignore"):
            good = np.all(dr[1:] > dr[:-1], axis=0) & np.all((dr == 0) | (np.abs(dr) >= tr), axis=0)
            good &= np.all(mr > pr[:-1] + np.abs(pr[:-1]) * 2.0**-50, axis=0) & np.all(mr <= pr[1:], axis=0)
        quick[rest] = good
    return quick, thr


def _codes(x: np.ndarray, s: np.ndarray, amax: np.ndarray, table: np.ndarray, dtype: str) -> np.ndarray:
    """Codes (uint8 indices into ``table``) of blocks ``x`` [n, B] with scales ``s`` [n] and
    block maxima ``amax`` [n], as :func:`_nearest` chooses them.

    For binary32 x and tables of up to ``_FAST_ENTRIES``: in the blocks :func:`_certified`
    accepts, the code is the number of decoded midpoints below x (for binary32 x, x > m <=>
    x > m rounded down to binary32); the rest goes to _nearest.  Per-block quantities are
    laid out [entry, block], so their reductions run along blocks."""
    order = np.argsort(table, kind="stable")
    if x.dtype != np.float32 or len(table) > _FAST_ENTRIES:
        return _nearest(x.astype(np.float64), s[:, None], table, dtype).astype(np.uint8)
    srt = table[order].astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        p = srt[:, None] * s[None, :]  # exact: 24 x 24 bits
        d = p.astype(np.float32)  # the decoder's values, as to_output(f32(p), dtype)
        if dtype != "float32":
            d = d.astype(np_dtype(dtype)).astype(np.float32)
        d = d.astype(np.float64)
        mid = d[:-1] + d[1:]
        mid *= 0.5
    ok, thr = _certified(s, amax, srt, p, d, mid, dtype)
    q = count_above(x, [c[:, None] for c in _round_down32(mid)])
    if np.any(order != np.arange(len(order))):
        q = order.astype(np.uint8)[q]
    zero = s == 0  # all-zero blocks: _nearest keeps the first entry of its window around y = 0
    if zero.any():
        j = int(np.searchsorted(srt, 0.0))
        q[zero] = order[min(max(j - 2, 0), len(srt) - 1)]
    rest = ~ok & ~zero
    if rest.any():
        q[rest] = _nearest(x[rest].astype(np.float64), s[rest, None], table, dtype)
    # 0 < |x| < thr in accepted blocks, as one unsigned compare of the bit patterns less one.
    lim = np.where(ok, thr, 0.0).astype(np.float32).view(np.uint32) - np.uint32(1)
    lim[lim == np.uint32(0xFFFFFFFF)] = 0
    a = x.view(np.uint32) & np.uint32(0x7FFFFFFF)
    a -= np.uint32(1)
    small = np.flatnonzero(a < lim[:, None])
    if small.size:
        r, col = np.divmod(small, x.shape[1])
        q.reshape(-1)[small] = _nearest(x[r, col].astype(np.float64)[:, None], s[r, None], table, dtype)[:, 0]
    return q


def plan(shape: tuple[int, ...], dtype: str, values: Any = None, block_size: Any = 64) -> Planned:
    """What :func:`encode` writes for an array of ``shape`` (see :data:`~qformat.schemes.registry.Planned`)."""
    if values is None:
        raise bad_param("values", "a 1-D sequence of 1 to 256 finite numbers", values)
    table = _table(values)
    bs = check_int("block_size", block_size, 1, allow_none=True)
    bits = max(1, math.ceil(math.log2(len(table))))
    if bs is not None and float(np.max(np.abs(table))) == 0:
        raise bad_param("values", "a table with a nonzero entry when block_size scales blocks by absmax", values)
    rank = len(shape)
    desc: dict[str, Any] = {"shape": list(shape), "dtype": dtype,
                            "codes": codes_entry("codes", {"type": "codebook", "bits": bits, "table_tensor": "table"}, rank)}
    comps: dict[str, tuple[str, tuple[int, ...]]] = {"table": ("F32", (len(table),))}
    if bs is not None:
        comps["scale"] = ("F32", (-(-math.prod(shape) // bs),))
        desc["scale"] = {"blocks": {"type": "flat", "size": bs}, "op": "multiply", "tensor": "scale"}
    desc["scheme"] = "codebook"
    comps["codes"] = ("U8", packed_shape(shape, bits))
    return desc, comps


@register("codebook", plan)
def encode(x: np.ndarray, *, dtype: str, values: Any = None, block_size: Any = 64) -> QTensor:
    """Codes into the table ``values``; absmax scale per ``block_size`` (None: no scale)."""
    if values is None:
        raise bad_param("values", "a 1-D sequence of 1 to 256 finite numbers", values)
    table = _table(values)
    bs = check_int("block_size", block_size, 1, allow_none=True)
    bits = max(1, math.ceil(math.log2(len(table))))
    top = float(np.max(np.abs(table)))
    if bs is not None and top == 0:
        raise bad_param("values", "a table with a nonzero entry when block_size scales blocks by absmax", values)
    # float16 / bfloat16 values are exact in binary32; float64 inputs keep float64.
    xw = np.ascontiguousarray(x, np.float64 if x.dtype == np.float64 else np.float32)
    # Without a scale every element is on its own: rows of 64 (not one row) let it be chunked.
    xb = flat_cells(xw, bs or 64)
    desc: dict[str, Any] = {
        "shape": list(x.shape), "dtype": dtype,
        "codes": codes_entry("codes", {"type": "codebook", "bits": bits, "table_tensor": "table"}, x.ndim),
    }
    comps: dict[str, np.ndarray] = {"table": table}
    # _nearest's float64 temporaries want the default's smaller chunks.
    chunk = _float_fast.CHUNK_ELEMENTS if xw.dtype == np.float32 and len(table) <= _FAST_ENTRIES else None
    n, width = xb.shape
    if xw.dtype == np.float32:
        amax = np.empty(n)

        def block_max(lo: int, hi: int) -> None:
            amax[lo:hi] = row_amax(xb[lo:hi])

        map_chunks(block_max, n, width, chunk)
    else:
        amax = np.max(np.abs(xb), axis=1, initial=0.0)
    if bs is None:
        s = np.ones(xb.shape[0])
    else:
        # 0 for an all-zero block (every code decodes to exactly 0); never 0 otherwise.
        s = np.where(amax > 0, fit_scale(amax, top), 0.0)
        comps["scale"] = s.astype(np.float32)
        desc["scale"] = {"blocks": {"type": "flat", "size": bs}, "op": "multiply", "tensor": "scale"}
    # Each block on its own (a row of xb), so chunks of rows give the same codes; with 4-bit
    # codes, even rows and no padding along rows, each chunk writes its bytes in place.
    paired = bits == 4 and width % 2 == 0 and packs_flat(x.shape, 4)
    per = width // 2 if paired else width
    out = np.empty(n * per, np.uint8)

    def part(lo: int, hi: int) -> None:
        q = _codes(xb[lo:hi], s[lo:hi], amax[lo:hi], table, dtype)
        out[lo * per:hi * per] = pack(q.reshape(-1), 4) if paired else q.reshape(-1)

    map_chunks(part, n, width, chunk)
    desc["scheme"] = "codebook"
    if paired:
        comps["codes"] = out[: x.size // 2].reshape(x.shape[:-1] + (x.shape[-1] // 2,))
    else:
        comps["codes"] = pack_codes(out[: x.size], bits, x.shape)
    return QTensor(desc, comps)
