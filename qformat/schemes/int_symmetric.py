"""The binary32 path of the symmetric "int" encoder: the same bytes as the reference, faster.

:func:`qformat.schemes.int_.symmetric_reference` states the rule (per group, the best of five
candidate scales by a binary32 estimate of the decoded squared error, then the codes nearest
to x for the chosen scale, ties as its float64 arithmetic resolves them).  This module
computes the same result with binary32 NumPy operations on groups laid out as columns
(``[group_size, groups]``), where every reduction runs along the long axis:

- Candidates come in sign pairs: for scales +a and -a the quotients differ only in sign, so one
  multiply and one ``rint`` serve both, and the decoded values are ``clip(R, lo, hi) * a`` and
  ``clip(R, -hi, -lo) * a``, the very binary32 values the reference forms.  The error sums use
  the same ``einsum`` over the same values, so every estimate, and so every choice, is equal
  bit for bit.
- Rounding to the logical dtype (float16 / bfloat16) is done on the binary32 bits (round half
  to even by integer addition), which equals NumPy's and ml_dtypes' conversion where the
  result is normal or zero; float16 columns whose values could be subnormal or overflow are
  left to the reference.
- The final codes come from a binary32 quotient ``x * (1/s)``, within ``(2^(b-1)+1) * 2^-22``
  of the exact one.  Elements whose quotient lies that close to a half integer, and elements
  whose two candidate codes decode at nearly equal distance from x, are recomputed by the
  reference's float64 rule; everything else provably agrees with it.

Columns the argument does not cover (float64 input, float32 scales, groups of extreme
magnitude, float16 outputs outside the normal range) go through the reference unchanged.
tests/test_schemes.py compares both paths on random, tie-laden and extreme inputs.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..dtypes import rounded_bits
from ._common import best_int_codes, np_dtype, pack

#: Relative margin of a candidate over the best so far (see int_._MARGIN; the same value).
MARGIN = 1e-4
_F16_NORMAL_MIN = 2.0**-14
_F16_MAX = 65504.0
_SHIFT = {"float16": 13, "bfloat16": 16}


def round_bits(v: np.ndarray, dtype: str, tmp: np.ndarray) -> None:
    """Round float32 ``v`` in place to ``dtype`` (half to even), kept as binary32 values.

    Integer arithmetic on the bits (:func:`qformat.dtypes.rounded_bits`, then the dropped bits
    cleared).  bfloat16 shares binary32's exponent, so this is exact for every finite value (Inf
    on overflow); for float16 it is exact for zeros and values of magnitude in [2^-14, 65504]
    (float16's normal range), which callers guarantee.  ``tmp``: a float32 scratch array of
    ``v``'s shape.
    """
    if dtype == "float32":
        return
    sh = _SHIFT[dtype]
    b = v.view(np.uint32)
    np.bitwise_and(rounded_bits(b, sh, tmp.view(np.uint32)), np.uint32((0xFFFFFFFF << sh) & 0xFFFFFFFF), out=b)


def covered(x_dtype: np.dtype, scale_dtype: str, dtype: str) -> bool:
    """Whether :func:`symmetric` applies at all (inputs exact in binary32, 16-bit scales)."""
    return x_dtype.name in ("float32", "float16", "bfloat16") and scale_dtype in ("float16", "bfloat16") \
        and (dtype == "float32" or x_dtype.itemsize == 2)


Reference = Callable[[np.ndarray, int, str, str], tuple[np.ndarray, np.ndarray, np.ndarray]]


def nibbles(q: np.ndarray) -> np.ndarray:
    """4-bit codes (int8 [n, g], g even) packed two to a byte along each row, low nibble first
    (the canonical packing of a row): uint8 [n, g / 2]."""
    return pack(q.view(np.uint8) & np.uint8(15), 4)


def symmetric(x: np.ndarray, bits: int, scale_dtype: str, dtype: str, reference: Reference,
              packed: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes int8 [n, g], scales float64 [n], ok [n]) of the groups (rows) of ``x``, equal to
    ``reference(x, bits, scale_dtype, dtype)``.  Requires :func:`covered`.  ``packed`` (4-bit
    codes, g even): the codes as :func:`nibbles` gives them, packed before the transpose back
    (half the bytes to move, on the worker thread)."""
    n, g = x.shape
    if n == 0 or g == 0:
        q, s, ok = reference(x, bits, scale_dtype, dtype)
        return (nibbles(q) if packed else q), s, ok
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    half = float(1 << (bits - 1))
    xt = np.ascontiguousarray(x.T, np.float32)  # exact: the input is binary32 or narrower
    mx, mn = np.max(xt, axis=0), np.min(xt, axis=0)
    amax = np.maximum(mx, -mn).astype(np.float64)
    # Q4_0's sign: its extreme value (the first of largest magnitude) lands on -2^(b-1).
    q40 = np.where(mx > -mn, -1.0, 1.0)
    tie = (mx == -mn) & (mx > 0)
    if tie.any():
        cols = np.flatnonzero(tie)
        sub = xt[:, cols]
        ext = sub[np.argmax(np.abs(sub), axis=0), np.arange(len(cols))]
        q40[cols] = np.where(ext > 0, -1.0, 1.0)
    sdt = np_dtype(scale_dtype)
    with np.errstate(over="ignore"):
        # Magnitudes of the candidate scales amax / m (rounding is symmetric in the sign).
        A = np.stack([(amax / m).astype(sdt).astype(np.float64) for m in (half, half + 0.5, half + 0.25)])
    fast = (amax > 2.0**-50) & (amax < 2.0**50) & np.isfinite(A).all(axis=0) & (A > 0).all(axis=0)
    if dtype == "float16":  # decoded values q * a must be normal float16 numbers or zero
        fast &= (A >= _F16_NORMAL_MIN).all(axis=0) & (half * A[0] <= _F16_MAX)
    if not fast.all():
        return _merge(x, fast, bits, scale_dtype, dtype, reference, packed)
    A32 = A.astype(np.float32)
    inv = np.float32(1) / A32
    y = np.empty_like(xt)
    d = np.empty_like(xt)
    tmp = np.empty_like(xt)

    def err(R: np.ndarray, lo_: int, hi_: int, a: np.ndarray) -> np.ndarray:
        np.clip(R, lo_, hi_, out=d)
        np.multiply(d, a, out=d)  # the decoded binary32 value (exact)
        round_bits(d, dtype, tmp)
        np.subtract(d, xt, out=d)
        return np.einsum("ij,ij->j", d, d)

    np.multiply(xt, inv[0], out=y)
    np.rint(y, out=y)
    ep, en = err(y, lo, hi, A32[0]), err(y, -hi, -lo, A32[0])  # scales +a, -a
    pos = q40 > 0
    E = [np.where(pos, ep, en), np.where(pos, en, ep)]  # Q4_0's sign first, then the other
    np.multiply(xt, inv[1], out=y)
    np.rint(y, out=y)
    E += [err(y, -hi, -lo, A32[1]), err(y, lo, hi, A32[1])]  # -(amax / (h + 1/2)), then +
    np.multiply(xt, inv[2], out=y)
    np.rint(y, out=y)
    E.append(err(y, -hi, -lo, A32[2]))  # -(amax / (h + 1/4))
    # Candidates in the reference's order; each replaces the best only when clearly better.
    # (No estimate is NaN here: every scale is finite and non-zero, every value bounded.)
    keep = np.float32(1 - MARGIN)
    best_e = E[0].copy()
    best = np.zeros(n, np.int8)
    for c in range(1, 5):
        better = E[c] < best_e * keep
        np.copyto(best_e, E[c], where=better)
        best[better] = c
    # The chosen scale: sign times magnitude, as the reference's candidate list holds them.
    S5 = np.stack([q40 * A[0], -q40 * A[0], -A[1], A[1], -A[2]])
    best_s = S5[best, np.arange(n)]
    q = _codes(xt, best_s, lo, hi, dtype, y, d, tmp).astype(np.int8).view(np.uint8)
    if packed:
        np.bitwise_and(q, np.uint8(15), out=q)
        q = q[0::2] | (q[1::2] << np.uint8(4))  # rows of the transposed layout: pairs along a group
        return np.ascontiguousarray(q.T), best_s, np.ones(n, bool)
    return np.ascontiguousarray(q.view(np.int8).T), best_s, np.ones(n, bool)


def _codes(xt: np.ndarray, s: np.ndarray, lo: int, hi: int, dtype: str, y: np.ndarray, q0: np.ndarray, tmp: np.ndarray) -> np.ndarray:
    """Codes ([g, n] float32) nearest to ``xt`` for the scales ``s`` (float64 [n]) by the
    reference's rule; ``y``, ``q0``, ``tmp``: scratch arrays of xt's shape (q0 is returned)."""
    s32 = s.astype(np.float32)  # exact: a float16 / bfloat16 value
    np.multiply(xt, np.float32(1) / s32, out=y)
    np.rint(y, out=q0)
    np.subtract(y, q0, out=y)
    np.abs(y, out=y)
    eps = np.float32((1 - lo) * 2.0**-21)  # > the binary32 quotient's error (|quotient| <= 2^(b-1) + 1)
    near_half = y > np.float32(0.5) - eps
    np.clip(q0, lo, hi, out=q0)
    fix = near_half
    if dtype != "float32":
        # The reference takes the nearer in decoded value of q0 and its neighbour towards the
        # quotient (below it when the quotient is q0 exactly); x - q0 * s is exact enough for its
        # sign (q0 * s is exact in binary32: a 16-bit scale times an integer below 2^8).
        q1 = np.empty_like(xt)
        np.multiply(q0, s32, out=y)
        np.subtract(xt, y, out=y)
        np.multiply(y, np.sign(s32), out=y)
        np.greater(y, 0, out=q1)  # 1.0 where the quotient is above q0, else 0.0
        np.multiply(q1, np.float32(2), out=q1)
        np.add(q1, q0, out=q1)
        np.subtract(q1, np.float32(1), out=q1)  # q0 + 1 or q0 - 1
        np.clip(q1, lo, hi, out=q1)
        np.multiply(q0, s32, out=y)
        round_bits(y, dtype, tmp)
        np.subtract(y, xt, out=y)
        np.abs(y, out=y)  # e0
        e1 = np.multiply(q1, s32)
        round_bits(e1, dtype, tmp)
        np.subtract(e1, xt, out=e1)
        np.abs(e1, out=e1)
        # Both distances are exact in binary32 wherever they can be close: x, s and the decoded
        # values have at most 11 significant bits (covered() admits float16 / bfloat16 input
        # only here), the decoded values lie within 2^(b-1) + 1 of |s|, so when |x| >= |s| / 32
        # the differences need at most 24 bits; smaller x has q0 = 0 (distance |x|, exact)
        # against a neighbour about |s| away.  So the comparison is the reference's, ties included.
        np.copyto(q0, q1, where=e1 < y)
    cols = np.flatnonzero(fix.any(axis=0))  # few: nonzero over the whole chunk costs more
    if len(cols):
        i, k = np.nonzero(fix[:, cols])
        j = cols[k]
        q0[i, j] = _reference_codes(xt[i, j].astype(np.float64), s[j], lo, hi, dtype)
    return q0


def _reference_codes(x: np.ndarray, s: np.ndarray, lo: int, hi: int, dtype: str) -> np.ndarray:
    """The reference's final codes for single elements (x, s float64 vectors)."""
    if dtype == "float32":  # the exact product: the rounded float64 quotient
        return np.clip(np.rint(x / s), lo, hi)
    return best_int_codes(x, s, 0.0, lo, hi, dtype, False)


def _merge(x: np.ndarray, fast: np.ndarray, bits: int, scale_dtype: str, dtype: str, reference: Reference,
           packed: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fast columns through :func:`symmetric`, the others through the reference."""
    def slow(v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        q, s, ok = reference(v, bits, scale_dtype, dtype)
        return (nibbles(q) if packed else q), s, ok

    q = np.empty((len(x), x.shape[1] // 2), np.uint8) if packed else np.empty(x.shape, np.int8)
    s = np.empty(len(x), np.float64)
    ok = np.empty(len(x), bool)
    for sel, fn in ((fast, lambda v: symmetric(v, bits, scale_dtype, dtype, reference, packed)), (~fast, slow)):
        if sel.any():
            q[sel], s[sel], ok[sel] = fn(x[sel])
    return q, s, ok
