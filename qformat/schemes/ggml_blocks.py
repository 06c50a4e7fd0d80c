"""ggml's reference block quantizers (``quantize_row_*_ref``) in binary32 NumPy, byte for byte.

llama.cpp makes a GGUF file's quantized blocks with ``quantize_row_<type>_ref`` whenever no
importance matrix is given (``quantize_q4_K`` and the others call it then; Q8_0 always does).
This module computes the same bytes for the same float32 rows, for Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0, the K-quants Q2_K, Q3_K, Q4_K, Q5_K and Q6_K, the non-linear IQ4_NL and IQ4_XS (what
``quantize_iq4_nl`` / ``quantize_iq4_xs`` write: a 4-bit ``kvalues_iq4nl`` codebook, the best of
16 scales per 32 by a weighted least-squares fit, ``best_index_int8``'s binary search kept step by
step) and the ternary TQ1_0 and TQ2_0 (``lroundf(x / amax)``; TQ1_0 packs five base-3 digits a
byte with ggml's ceiling division).  The algorithms are llama.cpp's
(``ggml/src/ggml-quants.c``); the code is written here, vectorised across blocks.

Bit exactness rests on three rules, each kept on purpose:

- every operation is one binary32 operation, in the C expression's order (``w*x*l`` is
  ``(w*x)*l``; an ``int`` operand is converted to float first) and without fused
  multiply-adds (ggml-base is built without FMA contraction on x86);
- every sum runs element by element in the C loop's order, as separate NumPy additions over
  rows laid out as ``[elements, blocks]`` (NumPy's own reductions sum pairwise);
- ``nearest_int`` (``x + 1.5 * 2^23``, whose bits then hold the integer) is computed the same
  way, bits included (round half to even below 2^22, ggml's bit pattern beyond); ``roundf``
  (Q8_0) rounds half away from zero, done in float64 where ``|x| + 0.5`` is exact.

Iterative searches whose state changes the next step (``make_qkx2_quants`` moves ``min`` when a
candidate wins; ``make_q3_quants`` updates its sums element by element) keep that state per
block, so each block follows exactly the path ggml's loop takes for it.

:func:`quantize_rows` is the entry point: float32 rows (the last axis a multiple of the block
size) to the ggml block bytes of ``type``, ``[rows, blocks_per_row * type_size]``.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

F = np.float32
_GROUP_MAX_EPS = F(1e-15)
QK_K = 256

#: type name -> (elements per block, bytes per block); ggml-common.h's block_* structs.
SIZES: dict[str, tuple[int, int]] = {
    "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
    "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
    "IQ4_NL": (32, 18), "IQ4_XS": (256, 136), "TQ1_0": (256, 54), "TQ2_0": (256, 66),
}


# -- helpers --------------------------------------------------------------------------------------
def _ni(v: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int`` as it computes it: ``v + 1.5 * 2^23`` in binary32, then the low 23
    bits of the sum, less 2^22 (int32).  That is round half to even for |v| < 2^22; beyond it
    (a scale search over a near-empty range, which importance weights of 0 can reach) the
    result is what the bits give, and so it is here, not ``rint``'s."""
    with np.errstate(invalid="ignore", over="ignore"):
        val = np.asarray(v, F) + F(12582912.0)
    return (val.view(np.int32) & 0x007FFFFF) - 0x00400000


def _clip(v: np.ndarray, lo: int, hi: int) -> np.ndarray:
    return np.minimum(np.maximum(v, lo), hi)


def _f16(v: np.ndarray) -> np.ndarray:
    """``GGML_FP32_TO_FP16`` (round to nearest even, overflow to Inf) as uint16 bits."""
    with np.errstate(over="ignore"):
        return np.asarray(v, F).astype(np.float16).view(np.uint16)


def _f32(bits: np.ndarray) -> np.ndarray:
    """``GGML_FP16_TO_FP32``: exact."""
    return bits.view(np.float16).astype(F)


def _put16(out: np.ndarray, off: int, bits: np.ndarray) -> None:
    out[:, off] = (bits & 0xFF).astype(np.uint8)
    out[:, off + 1] = (bits >> 8).astype(np.uint8)


def _seq_sum(terms: Callable[[int], np.ndarray], n: int, start: np.ndarray | None = None) -> np.ndarray:
    """``s = start (0); for i < n: s += terms(i)`` in binary32, in that order."""
    s = None if start is None else start.copy()
    for i in range(n):
        t = terms(i)
        s = (F(0) + t) if s is None else s + t  # 0.0f + t: a -0 term makes +0, as in C
    assert s is not None
    return s


def _first_absmax(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(amax, max) of columns of ``x`` [n, blocks] as ggml's loop finds them: the first element
    of largest magnitude (``if (amax < fabsf(v))``), ``max`` +0 when every element is zero."""
    a = np.abs(x)
    a = np.where(a > 0, a, F(0))  # NaN (a scale from overflowed sums) never wins, as in C
    idx = np.argmax(a, axis=0)
    cols = np.arange(x.shape[1])
    amax = a[idx, cols]
    mx = np.where(amax > 0, x[idx, cols], F(0)).astype(F)
    return amax, mx


def _first_extreme(xb: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The row extreme ``m`` as ggml's ``if (v < min)`` loop keeps it: the first element equal to
    it, which matters only for the sign of a zero extreme (+0 and -0 compare equal)."""
    idx = np.argmax(xb == m[:, None], axis=1)
    return xb[np.arange(xb.shape[0]), idx]


# -- legacy 32-element types ----------------------------------------------------------------------
def _q4_0_like(xb: np.ndarray, nmax: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(codes uint8 [nb, 32], d bits) of Q4_0 (nmax 8) / Q5_0 (nmax 16)."""
    _, mx = _first_absmax(xb.T)
    d = mx / F(-nmax)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, F(1) / d, F(0)).astype(F)
    v = xb * inv[:, None] + F(nmax + 0.5)
    q = np.minimum(v.astype(np.int32).astype(np.int8).astype(np.int32), (1 << bits) - 1)  # (int8_t) truncates
    return q.astype(np.uint8), _f16(d)


def _q4_1_like(xb: np.ndarray, bits: int, clamp: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes, d bits, m bits) of Q4_1 (clamped to 15 after an int8 cast) / Q5_1 (uint8 cast)."""
    mn = _first_extreme(xb, xb.min(axis=1))
    mx = _first_extreme(xb, xb.max(axis=1))
    d = (mx - mn) / F((1 << bits) - 1)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, F(1) / d, F(0)).astype(F)
    v = (xb - mn[:, None]) * inv[:, None] + F(0.5)
    q = v.astype(np.int32)
    if clamp:
        q = np.minimum(q.astype(np.int8).astype(np.int32), 15)
    return (q & 0xFF).astype(np.uint8), _f16(d), _f16(mn)


def _nibbles(out: np.ndarray, off: int, q: np.ndarray) -> None:
    """Byte j holds element j (low nibble) and j + 16 (high) of a 32-element block."""
    out[:, off:off + 16] = (q[:, :16] & 15) | ((q[:, 16:] & 15) << 4)


def _high_bits(out: np.ndarray, off: int, q: np.ndarray) -> None:
    """Bit 4 of element j as bit j of a little-endian uint32 (Q5_0 / Q5_1 ``qh``)."""
    h = ((q >> 4) & 1).astype(np.uint32) << np.arange(32, dtype=np.uint32)
    word = np.bitwise_or.reduce(h, axis=1).astype("<u4")
    out[:, off:off + 4] = word.view(np.uint8).reshape(-1, 4)


def _legacy(xb: np.ndarray, bits: int, with_min: bool) -> np.ndarray:
    """Q4_0 / Q5_0 (``d``, scale only) and Q4_1 / Q5_1 (``d``, ``m``): F16 ``d`` [and ``m``],
    for 5 bits the high bits as one little-endian uint32, then the low nibbles."""
    if with_min:
        q, d, m = _q4_1_like(xb, bits, clamp=bits == 4)
        return legacy_pack(q, d, m, bits)
    q, d = _q4_0_like(xb, 1 << (bits - 1), bits)
    return legacy_pack(q, d, None, bits)


def legacy_pack(q: np.ndarray, d: np.ndarray, m: np.ndarray | None, bits: int) -> np.ndarray:
    """The blocks of a 32-element type from its codes ``q`` [nb, 32] and F16 bits ``d`` (and
    ``m``): d [, m], for 5 bits the fifth bits, then the low nibbles (shared by the reference and
    the importance-weighted quantizer)."""
    off = 2 if m is None else 4
    out = np.zeros((q.shape[0], off + (4 if bits == 5 else 0) + 16), np.uint8)
    _put16(out, 0, d)
    if m is not None:
        _put16(out, 2, m)
    if bits == 5:
        _high_bits(out, off, q)
        off += 4
    _nibbles(out, off, q)
    return out


def _q8_0(xb: np.ndarray) -> np.ndarray:
    amax = np.abs(xb).max(axis=1)
    d = amax / F(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, F(1) / d, F(0)).astype(F)
    v = (xb * inv[:, None]).astype(np.float64)  # roundf: half away from zero, exact in float64
    q = (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int32)
    out = np.empty((xb.shape[0], 34), np.uint8)
    _put16(out, 0, _f16(d))
    out[:, 2:] = q.astype(np.int8).view(np.uint8)
    return out


# -- K-quant helpers (columns are sub-blocks: x is [n, sub-blocks]) -------------------------------
def _make_qkx2(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int,
               use_mad: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``make_qkx2_quants``: (L uint8 [n, S], scale [S], the_min [S]) of unsigned codes with a
    scale and a subtracted minimum, searching ``nstep + 1`` scales around ``nmax / (max - min)``."""
    n = x.shape[0]
    # the first minimum, as ggml's ``if (x[i] < min)`` keeps it: the sign of a zero minimum
    # reaches Q4_1 / Q5_1's F16 ``m`` through make_qkx3_quants
    mn = _first_extreme(x.T, x.min(axis=0))
    mx = x.max(axis=0)
    sum_w = _seq_sum(lambda i: w[i + 1], n - 1, w[0])
    sum_x = _seq_sum(lambda i: w[i + 1] * x[i + 1], n - 1, w[0] * x[0])
    mn = np.where(mn > 0, F(0), mn).astype(F)
    flat = mx == mn

    def err(scale: np.ndarray, lf: np.ndarray, mn_: np.ndarray) -> np.ndarray:
        def term(i: int) -> np.ndarray:
            diff = scale * lf[i] + mn_ - x[i]
            return w[i] * (np.abs(diff) if use_mad else diff * diff)
        return _seq_sum(term, n)

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = F(nmax) / (mx - mn)
        scale = F(1) / iscale
        L = _clip(_ni(iscale * (x - mn)), 0, nmax)
        best = err(scale, L.astype(F), mn)
        for step in range(nstep + 1):
            iscale = (F(rmin) + F(rdelta) * F(step) + F(nmax)) / (mx - mn)
            la = _clip(_ni(iscale * (x - mn)), 0, nmax)
            lf = la.astype(F)
            wl = w * lf
            sum_l = _seq_sum(lambda i: wl[i], n)
            sum_l2 = _seq_sum(lambda i: wl[i] * lf[i], n)
            sum_xl = _seq_sum(lambda i: wl[i] * x[i], n)
            D = sum_w * sum_l2 - sum_l * sum_l
            ok = D > 0
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            pos = this_min > 0
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale).astype(F)
            this_min = np.where(pos, F(0), this_min).astype(F)
            cur = err(this_scale, lf, this_min)
            win = ok & (cur < best) & ~flat
            L = np.where(win, la, L)
            best = np.where(win, cur, best).astype(F)
            scale = np.where(win, this_scale, scale).astype(F)
            mn = np.where(win, this_min, mn).astype(F)
    L = np.where(flat, 0, L)
    scale = np.where(flat, F(0), scale).astype(F)
    return L.astype(np.uint8), scale, (-mn).astype(F)


def _make_qx(x: np.ndarray, nmax: int, w: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``make_qx_quants`` with rmse_type 1: (L int32 [n, S] in 0..2 nmax - 1, scale [S]); the
    best of 19 scales by the weighted least-squares fit (weights ``w`` [n, S], or x^2)."""
    n = x.shape[0]
    amax, mx = _first_absmax(x)
    zero = amax < _GROUP_MAX_EPS
    w = x * x if w is None else w
    wx = w * x

    def fit(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lq = _clip(_ni(iscale * x), -nmax, nmax - 1)
        lf = lq.astype(F)
        sumlx = _seq_sum(lambda i: wx[i] * lf[i], n)
        suml2 = _seq_sum(lambda i: (w[i] * lf[i]) * lf[i], n)
        return lq, sumlx, suml2

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        lq, sumlx, suml2 = fit(F(-nmax) / mx)
        L = lq + nmax
        scale = np.where(suml2 != 0, sumlx / suml2, F(0)).astype(F)
        best = scale * sumlx
        for step in range(-9, 10):
            if step == 0:
                continue
            lq, sumlx, suml2 = fit(-(F(nmax) + F(0.1) * F(step)) / mx)
            win = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            L = np.where(win, lq + nmax, L)
            scale = np.where(win, sumlx / suml2, scale).astype(F)
            best = np.where(win, scale * sumlx, best).astype(F)
    return np.where(zero, 0, L), np.where(zero, F(0), scale).astype(F)


def _make_q3(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """``make_q3_quants`` with do_rmse: (L int32 [n, S] in 0..2 nmax - 1, or 0 for an all-zero
    sub-block; scale [S]); codes moved one at a time while the x^2-weighted fit improves."""
    n = x.shape[0]
    amax, mx = _first_absmax(x)
    zero = amax < _GROUP_MAX_EPS
    w = x * x
    wx = w * x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        L = _clip(_ni((F(-nmax) / mx) * x), -nmax, nmax - 1)
        lf = L.astype(F)
        sumlx = _seq_sum(lambda i: wx[i] * lf[i], n)
        suml2 = _seq_sum(lambda i: (w[i] * lf[i]) * lf[i], n)
        for _ in range(5):
            changed = np.zeros(x.shape[1], bool)
            for i in range(n):
                li = L[i].astype(F)
                slx = sumlx - wx[i] * li
                sl2 = suml2 - (w[i] * li) * li
                new_l = _clip(_ni((x[i] * sl2) / slx), -nmax, nmax - 1)
                nf = new_l.astype(F)
                slx2 = slx + wx[i] * nf
                sl22 = sl2 + (w[i] * nf) * nf
                take = (slx > 0) & (new_l != L[i]) & (sl22 > 0) & ((slx2 * slx2) * suml2 > (sumlx * sumlx) * sl22) & ~zero
                L[i] = np.where(take, new_l, L[i])
                sumlx = np.where(take, slx2, sumlx).astype(F)
                suml2 = np.where(take, sl22, suml2).astype(F)
                changed |= take
            # a block with no change stays unchanged in every later pass, as if it had left the loop
            if not changed.any():
                break
        scale = np.where(suml2 > 0, sumlx / suml2, F(0)).astype(F)
    return np.where(zero, 0, L + nmax), np.where(zero, F(0), scale).astype(F)


def _sub(xb: np.ndarray, size: int) -> np.ndarray:
    """Super-blocks [nb, 256] as sub-block columns [size, nb * 256 / size] (block-major)."""
    return np.ascontiguousarray(xb.reshape(-1, size).T)


def _requant(x: np.ndarray, d: np.ndarray, dm: np.ndarray | None, lo: int, hi: int, L: np.ndarray) -> np.ndarray:
    """The final codes: ``nearest_int((x + dm) / d)`` clamped, where ``d`` (per column) is
    nonzero; columns with ``d == 0`` keep ``L`` (ggml's ``if (!d) continue``)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        v = (x + dm) / d if dm is not None else x / d
        q = _clip(_ni(v), lo, hi)
    return np.where(d != 0, q, L)


def _unsub(L: np.ndarray, nb: int) -> np.ndarray:
    """Sub-block columns back to super-block rows [nb, 256]."""
    return np.ascontiguousarray(L.T).reshape(nb, QK_K)


def _two_bit_planes(L: np.ndarray) -> np.ndarray:
    """[nb, 256] codes (0..3) as ggml's ``qs``: per 128, byte l holds l, l+32, l+64, l+96."""
    q = L.reshape(-1, 2, 4, 32).astype(np.uint8)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(-1, 64)


def _q2_k(xb: np.ndarray) -> np.ndarray:
    nb = xb.shape[0]
    x = _sub(xb, 16)
    L, scales, mins = _make_qkx2(x, np.abs(x), 3, -0.5, 0.1, 15, True)
    scales, mins = scales.reshape(nb, 16), mins.reshape(nb, 16)
    max_scale = np.where(scales > 0, scales, F(0)).max(axis=1)
    max_min = np.where(mins > 0, mins, F(0)).max(axis=1)
    q4 = F(15)
    with np.errstate(divide="ignore", invalid="ignore"):
        ls = np.where((max_scale > 0)[:, None], _ni((q4 / max_scale)[:, None] * scales), 0)
        lm = np.where((max_min > 0)[:, None], _ni((q4 / max_min)[:, None] * mins), 0)
    sc = ((ls & 0xFF) | ((lm << 4) & 0xFF)).astype(np.uint8)  # uint8 stores, as C's
    d = _f16(np.where(max_scale > 0, max_scale / q4, F(0)))
    dmin = _f16(np.where(max_min > 0, max_min / q4, F(0)))
    return q2_k_tail(x, L, sc, d, dmin, nb)


def q2_k_tail(x: np.ndarray, L: np.ndarray, sc: np.ndarray, d: np.ndarray, dmin: np.ndarray, nb: int) -> np.ndarray:
    """Q2_K's blocks from the sub-block codes ``L`` ([16, S]), the scale bytes ``sc`` [nb, 16]
    (4-bit scale, 4-bit minimum) and ``d`` / ``dmin`` (F16 bits): codes re-fitted to the stored
    scales, then packed (shared by the reference and the importance-weighted quantizer)."""
    dd = (_f32(d)[:, None] * (sc & 0xF).astype(F)).reshape(-1)
    dm = (_f32(dmin)[:, None] * (sc >> 4).astype(F)).reshape(-1)
    L = _requant(x, dd, dm, 0, 3, L.astype(np.int32))
    out = np.empty((nb, 84), np.uint8)
    out[:, :16] = sc
    out[:, 16:80] = _two_bit_planes(_unsub(L, nb))
    _put16(out, 80, d)
    _put16(out, 82, dmin)
    return out


def _q3_k(xb: np.ndarray) -> np.ndarray:
    nb = xb.shape[0]
    x = _sub(xb, 16)
    L, scales = _make_q3(x, 4)
    scales = scales.reshape(nb, 16)
    amax, max_scale = _first_absmax(scales.T)
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = F(-32) / max_scale
        l6 = _clip(_ni(iscale[:, None] * scales).astype(np.int8).astype(np.int32), -32, 31) + 32
    nz = max_scale != 0
    l6 = np.where(nz[:, None], l6, 0)
    with np.errstate(divide="ignore"):
        d = _f16(np.where(nz, F(1) / iscale, F(0)))
    return q3_k_tail(x, L, l6, d, nb)


def q3_k_tail(x: np.ndarray, L: np.ndarray, l6: np.ndarray, d: np.ndarray, nb: int) -> np.ndarray:
    """Q3_K's blocks from the sub-block codes ``L`` (0..7, [16, S]), the 6-bit scales ``l6``
    [nb, 16] (stored value, 0..63) and ``d`` (F16 bits): codes re-fitted to the stored scales,
    then packed (shared by the reference and the importance-weighted quantizer)."""
    sc = l6 - 32  # the stored 6-bit scale, decoded (all-zero bytes: -32)
    dd = (_f32(d)[:, None] * sc.astype(F)).reshape(-1)
    L = _unsub(_requant(x, dd, None, -4, 3, L - 4) + 4, nb)
    out = np.zeros((nb, 110), np.uint8)
    hi = (L > 3).reshape(nb, 8, 32)  # bit m of hmask[j] = high bit of element 32 m + j
    out[:, :32] = np.bitwise_or.reduce(hi.astype(np.uint8) << np.arange(8, dtype=np.uint8)[None, :, None], axis=1)
    out[:, 32:96] = _two_bit_planes(L & 3)
    b = l6.astype(np.uint8)
    out[:, 96:104] = (b[:, :8] & 0xF) | ((b[:, 8:] & 0xF) << 4)
    top = (b >> 4).reshape(nb, 4, 4)  # j = 4 k + r: bits 2k of byte 104 + r
    out[:, 104:108] = top[:, 0] | (top[:, 1] << 2) | (top[:, 2] << 4) | (top[:, 3] << 6)
    _put16(out, 108, d)
    return out


def _q45_k(xb: np.ndarray, nmax: int, rmin: float, nstep: int) -> tuple[np.ndarray, np.ndarray]:
    """The shared part of Q4_K (nmax 15) and Q5_K (nmax 31): (codes [nb, 256], header bytes
    [nb, 16]: d, dmin, the 12 bytes of 6-bit scales and minimums)."""
    nb = xb.shape[0]
    x = _sub(xb, 32)
    sum_x2 = _seq_sum(lambda i: x[i] * x[i], 32)
    av_x = np.sqrt(sum_x2 / F(32))
    L, scales, mins = _make_qkx2(x, av_x + np.abs(x), nmax, rmin, 0.1, nstep, False)
    scales, mins = scales.reshape(nb, 8), mins.reshape(nb, 8)
    max_scale = np.where(scales > 0, scales, F(0)).max(axis=1)
    max_min = np.where(mins > 0, mins, F(0)).max(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv_scale = np.where(max_scale > 0, F(63) / max_scale, F(0)).astype(F)
        inv_min = np.where(max_min > 0, F(63) / max_min, F(0)).astype(F)
    ls = np.minimum(_ni(inv_scale[:, None] * scales) & 0xFF, 63).astype(np.uint8)
    lm = np.minimum(_ni(inv_min[:, None] * mins) & 0xFF, 63).astype(np.uint8)
    head = np.empty((nb, 16), np.uint8)
    d, dmin = _f16(max_scale / F(63)), _f16(max_min / F(63))
    _put16(head, 0, d)
    _put16(head, 2, dmin)
    head[:, 4:8] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    head[:, 8:12] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    head[:, 12:16] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    dd = (_f32(d)[:, None] * ls.astype(F)).reshape(-1)
    dm = (_f32(dmin)[:, None] * lm.astype(F)).reshape(-1)
    return _unsub(_requant(x, dd, dm, 0, nmax, L.astype(np.int32)), nb), head


def _q4_k(xb: np.ndarray) -> np.ndarray:
    return q4_k_pack(*_q45_k(xb, 15, -1.0, 20))


def q4_k_pack(L: np.ndarray, head: np.ndarray) -> np.ndarray:
    """Q4_K's blocks: the 16 header bytes, then per 64 elements bytes of element j (low
    nibble) and j + 32 (high)."""
    out = np.empty((L.shape[0], 144), np.uint8)
    out[:, :16] = head
    q = L.reshape(-1, 4, 2, 32).astype(np.uint8)
    out[:, 16:] = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)
    return out


def _q5_k(xb: np.ndarray) -> np.ndarray:
    return q5_k_pack(*_q45_k(xb, 31, -0.5, 15))


def q5_k_pack(L: np.ndarray, head: np.ndarray) -> np.ndarray:
    """Q5_K's blocks: the header, the fifth bits (``qh``), then the low nibbles as Q4_K's."""
    nb = L.shape[0]
    out = np.empty((nb, 176), np.uint8)
    out[:, :16] = head
    q = L.reshape(nb, 4, 2, 32).astype(np.uint8)  # per 64: elements j and j + 32
    hb = (q >> 4) & 1  # qh[j] bit 2 n + h: the fifth bit of element 64 n + 32 h + j
    out[:, 16:48] = np.bitwise_or.reduce(hb.reshape(nb, 8, 32) << np.arange(8, dtype=np.uint8)[None, :, None], axis=1)
    out[:, 48:] = ((q[:, :, 0] & 15) | ((q[:, :, 1] & 15) << 4)).reshape(nb, 128)
    return out


def _q6_k(xb: np.ndarray) -> np.ndarray:
    nb = xb.shape[0]
    x = _sub(xb, 16)
    L, scales = _make_qx(x, 32)
    return q6_k_tail(x, L, scales, nb)


def q6_k_tail(x: np.ndarray, L: np.ndarray, scales: np.ndarray, nb: int) -> np.ndarray:
    """Q6_K's blocks from the sub-block codes ``L`` (0..63, [16, S]) and scales [S]: the 8-bit
    scales of the largest-magnitude one, codes re-fitted to them, packed (shared by the
    reference and the importance-weighted quantizer, whose only difference is the weights)."""
    scales = scales.reshape(nb, 16)
    amax, max_scale = _first_absmax(scales.T)
    empty = amax < _GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = F(-128) / max_scale
        d = _f16(np.where(empty, F(0), F(1) / iscale))
        s8 = np.where(empty[:, None], 0, np.minimum(_ni(iscale[:, None] * scales), 127)).astype(np.int8)
    dd = (_f32(d)[:, None] * s8.astype(F)).reshape(-1)
    L = _unsub(_requant(x, dd, None, -32, 31, L - 32) + 32, nb)
    L = np.where(empty[:, None], 0, L).astype(np.uint8)  # ggml zeroes the whole block
    out = np.empty((nb, 210), np.uint8)
    q = L.reshape(nb, 2, 4, 32)
    lo, hi = q & 0xF, q >> 4
    out[:, :128] = np.concatenate([lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)], axis=2).reshape(nb, 128)
    out[:, 128:192] = (hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)).reshape(nb, 64)
    out[:, 192:208] = s8.view(np.uint8)
    _put16(out, 208, d)
    return out


# -- non-linear and ternary types: IQ4_NL, IQ4_XS, TQ1_0, TQ2_0 ----------------------------------
#: ggml's kvalues_iq4nl (ggml-common.h), the IQ4 codebook.
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], F)


def _best_index_iq4(v: np.ndarray) -> np.ndarray:
    """ggml's ``best_index_int8(16, kvalues_iq4nl, v)`` element-wise, its binary search step by
    step (so NaN ends at 15 and ties go up, as there): the index of the nearest value."""
    ml = np.zeros(v.shape, np.int32)
    mu = np.full(v.shape, 15, np.int32)
    for _ in range(4):  # the search halves 0..15 in at most four steps
        live = mu - ml > 1
        mav = (ml + mu) // 2
        lt = v < KVALUES_IQ4NL[mav]
        mu = np.where(live & lt, mav, mu)
        ml = np.where(live & ~lt, mav, ml)
    out = np.where(v - KVALUES_IQ4NL[mu - 1] < KVALUES_IQ4NL[mu] - v, mu - 1, mu)
    out = np.where(v >= KVALUES_IQ4NL[15], 15, out)
    return np.where(v <= KVALUES_IQ4NL[0], 0, out)


def iq4_scales(x: np.ndarray, w: np.ndarray, ntry: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The per-32 part of ``quantize_row_iq4_nl_impl`` for sub-block columns ``x`` [32, S] with
    weights ``w`` [32, S]: (the first pass's codes [32, S], scale [S], empty [S]); ``ntry`` > 0
    searches ``2 ntry + 1`` further scales (``quantize_iq4_nl`` / ``_xs``: 7), -1 none (the
    reference ``quantize_row_iq4_nl_ref``, whose first scale also has the other sign)."""
    n = x.shape[0]
    amax, mx = _first_absmax(x)
    empty = amax < _GROUP_MAX_EPS

    def fit(inv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        L = _best_index_iq4(inv * x)
        q = KVALUES_IQ4NL[L]
        wq = w * q
        return L, _seq_sum(lambda i: wq[i] * x[i], n), _seq_sum(lambda i: wq[i] * q[i], n)

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = (-mx) / F(-127) if ntry > 0 else mx / F(-127)
        L, sumqx, sumq2 = fit(F(1) / d)
        d = np.where(sumq2 > 0, sumqx / sumq2, F(0)).astype(F)
        best = d * sumqx
        for itry in range(-ntry, ntry + 1):
            _, sumqx, sumq2 = fit(F(itry - 127) / mx)
            win = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
            d = np.where(win, sumqx / sumq2, d).astype(F)
            best = np.where(win, d * sumqx, best).astype(F)
    return L, np.where(empty, F(0), d).astype(F), empty


def iq4_codes_bytes(L: np.ndarray) -> np.ndarray:
    """Codes [nb, k] as ggml's IQ4 ``qs``: per 32, byte j holds element j (low nibble) and j + 16
    (shared by the quantizers and the GGUF export)."""
    q = L.reshape(L.shape[0], -1, 2, 16).astype(np.uint8)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(L.shape[0], -1)


def iq4_nl_pack(x: np.ndarray, L: np.ndarray, scale: np.ndarray, recompute: bool) -> np.ndarray:
    """IQ4_NL blocks [nb, 18] from sub-block columns ``x`` [32, nb], the first pass's codes and
    the scales: ``d`` F16, and (``recompute``: ntry > 0) the codes again at ``1 / scale``."""
    if recompute:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            inv = np.where(scale != 0, F(1) / scale, F(0)).astype(F)
            L = _best_index_iq4(inv * x)
    out = np.empty((x.shape[1], 18), np.uint8)
    _put16(out, 0, _f16(scale))
    out[:, 2:] = iq4_codes_bytes(np.ascontiguousarray(L.T))
    return out


def iq4_xs_pack(x: np.ndarray, scales: np.ndarray, nb: int) -> np.ndarray:
    """IQ4_XS blocks [nb, 136] from sub-block columns ``x`` [32, 8 nb] and their scales: the
    6-bit sub-block scales of ``d = -max_scale / 32`` and the codes at each stored scale."""
    sc = scales.reshape(nb, 8)
    _, max_scale = _first_absmax(sc.T)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = (-max_scale) / F(32)
        inv = np.where(d != 0, F(1) / d, F(0)).astype(F)
        ls = _clip(_ni(inv[:, None] * sc), -32, 31)
        dl = (d[:, None] * ls.astype(F)).reshape(-1)
        idl = np.where(dl != 0, F(1) / dl, F(0)).astype(F)
        L = _best_index_iq4(idl * x)
    ls = (ls + 32).astype(np.uint16)
    out = np.empty((nb, 136), np.uint8)
    _put16(out, 0, _f16(d))
    _put16(out, 2, np.bitwise_or.reduce((ls >> 4) << (2 * np.arange(8, dtype=np.uint16)), axis=1).astype(np.uint16))
    out[:, 4:8] = ((ls[:, 0::2] & 0xF) | ((ls[:, 1::2] & 0xF) << 4)).astype(np.uint8)
    out[:, 8:] = iq4_codes_bytes(_unsub(L, nb))
    return out


def _iq4_nl(xb: np.ndarray, ntry: int = 7) -> np.ndarray:
    x = _sub(xb, 32)
    L, scale, empty = iq4_scales(x, x * x, ntry)
    if ntry <= 0 and empty.any():
        # ggml leaves an empty block's codes as they were (uninitialised stack memory; within
        # one call, the previous block's): the previous non-empty block's codes, 0 before any
        idx = np.maximum.accumulate(np.where(empty, -1, np.arange(empty.size)))
        L = np.where(idx >= 0, L[:, np.maximum(idx, 0)], 0)
    return iq4_nl_pack(x, L, scale, ntry > 0)


def _iq4_xs(xb: np.ndarray) -> np.ndarray:
    x = _sub(xb, 32)
    _, scales, _ = iq4_scales(x, x * x, 7)
    return iq4_xs_pack(x, scales, xb.shape[0])


def _lroundf(v: np.ndarray) -> np.ndarray:
    """C's ``(int) lroundf(v)`` on x86-64: half away from zero (exact in float64); Inf and NaN
    convert to LONG_MIN, whose low 32 bits are 0 (a block of magnitude below ~3e-39, where
    ``1/d`` overflows; every value there decodes to 0)."""
    v64 = v.astype(np.float64)
    r = np.sign(v64) * np.floor(np.abs(v64) + 0.5)
    return np.where(np.isfinite(r), r, 0).astype(np.int64).astype(np.int32)


def _ternary_digits(xb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(``lroundf(x / amax) + 1`` int32 [nb, 256], ``d`` F16 bits) of TQ1_0 / TQ2_0."""
    amax = np.abs(xb).max(axis=1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = np.where(amax != 0, F(1) / amax, F(0)).astype(F)
        xi = _lroundf(xb * inv[:, None]) + 1
    return xi, _f16(amax)


def _base3(xi: np.ndarray, scale_first: bool = False) -> np.ndarray:
    """Digits [..., k] (most significant first) as a uint8 ``q = q * 3 + xi`` (C's wrapping
    store), then ggml's ceiling division ``(q * 256 + 242) / 243`` (``scale_first``: one more
    ``q *= 3`` before it, TQ1_0's ``qh``)."""
    q = np.zeros(xi.shape[:-1], np.int32)
    for n in range(xi.shape[-1]):
        q = (q * 3 + xi[..., n]) & 0xFF
    if scale_first:
        q = (q * 3) & 0xFF
    return ((q * 256 + 242) // 243 & 0xFF).astype(np.uint8)


def tq1_0_pack(xi: np.ndarray, d: np.ndarray) -> np.ndarray:
    """TQ1_0 blocks [nb, 54] from the digits ``xi`` (0, 1, 2 for -1, 0, +1; [nb, 256]) and ``d``
    (F16 bits): five digits a byte in base 3 (``qs``), four in ``qh``, each byte ggml's ceiling
    of ``q * 256 / 243`` (shared by the quantizer and the GGUF export)."""
    nb = xi.shape[0]
    out = np.empty((nb, 54), np.uint8)
    out[:, :32] = _base3(xi[:, :160].reshape(nb, 5, 32).transpose(0, 2, 1))  # byte m: x[m + 32 n]
    out[:, 32:48] = _base3(xi[:, 160:240].reshape(nb, 5, 16).transpose(0, 2, 1))  # byte m: x[160 + m + 16 n]
    out[:, 48:52] = _base3(xi[:, 240:].reshape(nb, 4, 4).transpose(0, 2, 1), scale_first=True)  # byte j: x[240 + j + 4 m]
    _put16(out, 52, d)
    return out


def tq2_0_pack(xi: np.ndarray, d: np.ndarray) -> np.ndarray:
    """TQ2_0 blocks [nb, 66] from 2-bit digits ``xi`` [nb, 256] (value + 1) and ``d`` (F16 bits)."""
    out = np.empty((xi.shape[0], 66), np.uint8)
    out[:, :64] = _two_bit_planes(xi & 3)
    _put16(out, 64, d)
    return out


def _tq1_0(xb: np.ndarray) -> np.ndarray:
    return tq1_0_pack(*_ternary_digits(xb))


def _tq2_0(xb: np.ndarray) -> np.ndarray:
    return tq2_0_pack(*_ternary_digits(xb))


def quantize_iq4_nl_ref(x: np.ndarray) -> np.ndarray:
    """ggml's ``quantize_row_iq4_nl_ref`` of one call over ``x`` (float32, a multiple of 32
    elements): uint8 [blocks, 18].  llama-quantize does not use it (it calls ``quantize_iq4_nl``,
    which searches 15 more scales: ``quantize_blocks(..., "IQ4_NL")``).  An all-zero block's codes
    are C's uninitialised memory there; here they are the previous block's (what one call leaves
    in its stack array), 0 for a leading one."""
    xb = np.ascontiguousarray(x, F).reshape(-1, 32)
    with np.errstate(all="ignore"):
        return _iq4_nl(xb, -1)


_QUANTIZERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Q4_0": lambda xb: _legacy(xb, 4, False), "Q4_1": lambda xb: _legacy(xb, 4, True),
    "Q5_0": lambda xb: _legacy(xb, 5, False), "Q5_1": lambda xb: _legacy(xb, 5, True), "Q8_0": _q8_0,
    "Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k,
    "IQ4_NL": _iq4_nl, "IQ4_XS": _iq4_xs, "TQ1_0": _tq1_0, "TQ2_0": _tq2_0,
}
#: The legacy and K types (those of the frozen llama-quantize fixture).
TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
#: The non-linear and ternary types (in _ggml.c too, in its own section).
NONLINEAR_TYPES = ("IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0")
#: Every type :func:`quantize_blocks` writes.
ALL_TYPES = TYPES + NONLINEAR_TYPES


def quantize_blocks(xb: np.ndarray, type_name: str) -> np.ndarray:
    """ggml's ``quantize_row_<type>_ref`` of float32 blocks ``xb`` [nb, block]: uint8 [nb, size]
    (IQ4_NL: ``quantize_iq4_nl`` without importance, what llama-quantize writes; its
    ``_ref`` is :func:`quantize_iq4_nl_ref`).

    Blocks whose largest magnitude is below about 1e-38 (every value decodes to 0 there) take
    their code bytes from C's conversion of Inf or NaN to an integer, which C leaves undefined;
    they equal what x86 gives (the machines the tests compare on)."""
    block, size = SIZES[type_name]
    xb = np.ascontiguousarray(xb, F).reshape(-1, block)
    # IEEE results as C's: 1/d of a tiny d overflows to Inf, codes of such blocks come from
    # Inf/NaN converted to integers as x86 does (INT_MIN, low byte 0), and F16 holds d as 0.
    with np.errstate(all="ignore"):
        out = _QUANTIZERS[type_name](xb)
    assert out.shape == (xb.shape[0], size)
    return out
