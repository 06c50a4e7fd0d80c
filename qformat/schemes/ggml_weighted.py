"""ggml's importance-weighted block quantizers (``quantize_row_*_impl``) in binary32 NumPy.

``llama-quantize --imatrix FILE`` passes each tensor's importance vector (one weight per
column, :mod:`qformat.imatrix`) to ``quantize_<type>``, which then runs the ``_impl`` variant
of the type instead of ``quantize_row_<type>_ref``: every search is weighted by
``importance[j] * sqrt(sigma2 + x^2)`` (Q6_K: by the importance alone), Q4_1 / Q5_1 / the K
types with minimums search scale and minimum by ``make_qkx3_quants``, and the K-quants choose
their 6- or 4-bit sub-block scales by ``make_qp_quants`` (Q3_K: ``make_qx_quants``) weighted
by each sub-block's total weight; IQ4_NL / IQ4_XS weigh their scale search by
``importance[j] * sqrt(sigma2 + x^2)`` (``sigma2``: twice the mean square of the 32 or 256
elements).  Q8_0, TQ1_0 and TQ2_0 ignore the importance (their ``quantize_<type>`` do).

This module computes the same bytes as those functions (llama.cpp ``ggml/src/ggml-quants.c``;
the code is written here), under the rules :mod:`.ggml_blocks` states: one binary32 operation
at a time in C's order, sums element by element, ``nearest_int`` as round half to even, and
every ``uint8_t`` store of C (``make_qp_quants``' codes) wrapped to 8 bits as C wraps it.

The legacy types' ``sigma2`` is the mean square of the whole row (``quantize_row_q4_0_impl``
takes a row), the K types' that of each super-block; so :func:`quantize_rows_weighted` takes
rows, not blocks.
"""

from __future__ import annotations

import numpy as np

from .ggml_blocks import (F, QK_K, SIZES, _GROUP_MAX_EPS, _f16, _f32, _make_qkx2, _make_qx, _ni, _put16, _q8_0, _requant,
                          _seq_sum, _sub, _unsub, legacy_pack, q2_k_tail, q3_k_tail, q4_k_pack, q5_k_pack, q6_k_tail)
from .ggml_blocks import _QUANTIZERS, iq4_nl_pack, iq4_scales, iq4_xs_pack

#: make_qkx3_quants' search, the same for every type that uses it (rmin, rdelta, nstep).
_QKX3 = (-0.9, 0.05, 36)


def _make_qkx3(x: np.ndarray, w: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``make_qkx3_quants`` with weights and use_mad false: make_qkx2_quants' algorithm (its
    ``max <= min`` test is ``max == min`` once min is clamped to at most 0)."""
    return _make_qkx2(x, w, nmax, *_QKX3, False)


def _make_qp(x: np.ndarray, nmax: int, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``make_qp_quants``: (L uint8 [n, S] as C stores them, scale [S]) of non-negative codes
    for the columns of ``x`` [n, S] with weights ``w``; five passes move single codes while the
    weighted fit improves."""
    n = x.shape[0]
    mx = np.zeros(x.shape[1], F)
    for i in range(n):
        mx = np.where(mx > x[i], mx, x[i]).astype(F)  # MAX(max, x[i])
    zero = mx < _GROUP_MAX_EPS

    def err(scale: np.ndarray, lf: np.ndarray) -> np.ndarray:
        def term(i: int) -> np.ndarray:
            diff = x[i] - scale * lf[i]
            return (w[i] * diff) * diff
        return _seq_sum(term, n)

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = F(nmax) / mx
        L8 = (_ni(iscale * x) & 0xFF).astype(np.int32)  # uint8_t L[i] = nearest_int(...)
        best = err(F(1) / iscale, L8.astype(F))
        for step in range(-4, 5):
            if step == 0:
                continue
            iscale_is = (F(0.1) * F(step) + F(nmax)) / mx
            lf = np.minimum(_ni(iscale_is * x), nmax).astype(F)
            mse = err(F(1) / iscale_is, lf)
            win = mse < best
            best = np.where(win, mse, best).astype(F)
            iscale = np.where(win, iscale_is, iscale).astype(F)
        lint = np.minimum(_ni(iscale * x), nmax)
        L8 = lint & 0xFF
        lf = lint.astype(F)
        wx = w * x
        sumlx = _seq_sum(lambda i: wx[i] * lf[i], n)
        suml2 = _seq_sum(lambda i: (w[i] * lf[i]) * lf[i], n)
        for _ in range(5):
            changed = np.zeros(x.shape[1], bool)
            for i in range(n):
                li = L8[i].astype(F)
                slx = sumlx - wx[i] * li
                sl2 = suml2 - (w[i] * li) * li
                new_l = np.minimum(_ni((x[i] * sl2) / slx), nmax)
                nf = new_l.astype(F)
                slx2 = slx + wx[i] * nf
                sl22 = sl2 + (w[i] * nf) * nf
                take = (slx > 0) & (sl2 > 0) & (new_l != L8[i]) & ((slx2 * slx2) * suml2 > (sumlx * sumlx) * sl22) & ~zero
                L8[i] = np.where(take, new_l & 0xFF, L8[i])
                sumlx = np.where(take, slx2, sumlx).astype(F)
                suml2 = np.where(take, sl22, suml2).astype(F)
                changed |= take
            if not changed.any():  # a block without a change repeats the same pass: as if it had left
                break
        scale = np.where(suml2 > 0, sumlx / suml2, F(0)).astype(F)
    return np.where(zero, 0, L8).astype(np.uint8), np.where(zero, F(0), scale).astype(F)


def _weights(x: np.ndarray, qw: np.ndarray, sigma2: np.ndarray) -> np.ndarray:
    """``qw[j] * sqrtf(sigma2 + x[j]*x[j])`` for blocks ``x`` [nb, k] (``sigma2`` [nb])."""
    return qw * np.sqrt(sigma2[:, None] + x * x)


def _row_sigma2(rows: np.ndarray, factor: float) -> np.ndarray:
    """``factor * sum(x^2) / n`` of each row [r, n], the sum in C's order."""
    xt = np.ascontiguousarray(rows.T)
    s = _seq_sum(lambda j: xt[j] * xt[j], xt.shape[0])
    return (s if factor == 1 else F(factor) * s) / F(rows.shape[1])


# -- the types --------------------------------------------------------------------------------------
def _legacy_w(rows: np.ndarray, qw: np.ndarray, bits: int, with_min: bool) -> np.ndarray:
    r, n = rows.shape
    nb = n // 32
    xb = rows.reshape(r * nb, 32)
    sigma2 = np.repeat(_row_sigma2(rows, 1), nb)
    w = _weights(xb, np.tile(qw.reshape(nb, 32), (r, 1)), sigma2)
    x, wt = np.ascontiguousarray(xb.T), np.ascontiguousarray(w.T)
    if with_min:
        L, scale, the_min = _make_qkx3(x, wt, (1 << bits) - 1)
        return legacy_pack(np.ascontiguousarray(L.T).astype(np.int32), _f16(scale), _f16(-the_min), bits)
    L, scale = _make_qx(x, 1 << (bits - 1), wt)
    return legacy_pack(np.ascontiguousarray(L.T).astype(np.int32), _f16(scale), None, bits)


def _q2_k_w(xb: np.ndarray, qw: np.ndarray) -> np.ndarray:
    nb = xb.shape[0]
    sigma2 = _row_sigma2(xb, 1)
    x = _sub(xb, 16)
    w = _sub(_weights(xb, qw, sigma2), 16)
    sw = _seq_sum(lambda i: w[i], 16)
    L, scales, mins = _make_qkx3(x, w, 3)
    S = lambda a: np.ascontiguousarray(a.reshape(nb, 16).T)  # noqa: E731 - [16 sub-blocks, nb]
    ls, dm = _make_qp(S(scales), 15, S(sw))
    lm, mm = _make_qp(S(mins), 15, S(sw))
    return q2_k_tail(x, L, (ls.T | (lm.T << 4)).astype(np.uint8), _f16(dm), _f16(mm), nb)


def _q3_k_w(xb: np.ndarray, qw: np.ndarray) -> np.ndarray:
    nb = xb.shape[0]
    sigma2 = _row_sigma2(xb, 2)
    x = _sub(xb, 16)
    w = _sub(_weights(xb, qw, sigma2), 16)
    sw = _seq_sum(lambda i: w[i], 16)
    L, scales = _make_qx(x, 4, w)
    l6, d_block = _make_qx(np.ascontiguousarray(scales.reshape(nb, 16).T), 32, np.ascontiguousarray(sw.reshape(nb, 16).T))
    return q3_k_tail(x, L, l6.T, _f16(d_block), nb)


def _k4_decode(head: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's ``get_scale_min_k4`` of the 12 scale bytes (``head[:, 4:16]``): (sc, m) [nb, 8]."""
    q = head[:, 4:16].astype(np.int32)
    sc = np.concatenate([q[:, 0:4] & 63, (q[:, 8:12] & 0xF) | ((q[:, 0:4] >> 6) << 4)], axis=1)
    m = np.concatenate([q[:, 4:8] & 63, (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)], axis=1)
    return sc, m


def _q45_k_w(xb: np.ndarray, qw: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    nb = xb.shape[0]
    sigma2 = _row_sigma2(xb, 2)
    x = _sub(xb, 32)
    w = _sub(_weights(xb, qw, sigma2), 32)
    sw = _seq_sum(lambda i: w[i], 32)
    L, scales, mins = _make_qkx3(x, w, nmax)
    S = lambda a: np.ascontiguousarray(a.reshape(nb, 8).T)  # noqa: E731 - [8 sub-blocks, nb]
    ls, d_block = _make_qp(S(scales), 63, S(sw))
    lm, m_block = _make_qp(S(mins), 63, S(sw))
    ls, lm = ls.T, lm.T
    if nmax == 31:  # Q5_K clamps the (uint8) codes; Q4_K stores them as they are
        ls, lm = np.minimum(ls, 63), np.minimum(lm, 63)
    head = np.empty((nb, 16), np.uint8)
    d, dmin = _f16(d_block), _f16(m_block)
    _put16(head, 0, d)
    _put16(head, 2, dmin)
    head[:, 4:8] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)  # uint8 arithmetic: C's stores into uint8_t
    head[:, 8:12] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    head[:, 12:16] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    sc, m = _k4_decode(head)
    dd = (_f32(d)[:, None] * sc.astype(F)).reshape(-1)
    dm = (_f32(dmin)[:, None] * m.astype(F)).reshape(-1)
    return _unsub(_requant(x, dd, dm, 0, nmax, L.astype(np.int32)), nb), head


def _q4_k_w(xb: np.ndarray, qw: np.ndarray) -> np.ndarray:
    return q4_k_pack(*_q45_k_w(xb, qw, 15))


def _q5_k_w(xb: np.ndarray, qw: np.ndarray) -> np.ndarray:
    return q5_k_pack(*_q45_k_w(xb, qw, 31))


def _q6_k_w(xb: np.ndarray, qw: np.ndarray) -> np.ndarray:
    nb = xb.shape[0]
    x = _sub(xb, 16)
    L, scales = _make_qx(x, 32, _sub(np.broadcast_to(qw, xb.shape), 16))
    return q6_k_tail(x, L, scales, nb)


def _iq4_w(xb: np.ndarray, qw: np.ndarray, xs: bool) -> np.ndarray:
    """``quantize_iq4_nl`` / ``quantize_iq4_xs`` with weights: ``sigma2`` is ``sum(x^2) * (2 /
    super-block)`` (C's order: the sum, then one product), over each block (IQ4_NL: 32; IQ4_XS: 256)."""
    xt = np.ascontiguousarray(xb.T)
    sigma2 = _seq_sum(lambda j: xt[j] * xt[j], xt.shape[0]) * F(2.0 / xb.shape[1])
    x = _sub(xb, 32)
    w = _sub(_weights(xb, qw, sigma2), 32)
    L, scales, _ = iq4_scales(x, w, 7)
    return iq4_xs_pack(x, scales, xb.shape[0]) if xs else iq4_nl_pack(x, L, scales, True)


def quantize_rows_weighted(rows: np.ndarray, type_name: str, importance: np.ndarray) -> np.ndarray:
    """``quantize_<type>`` of float32 ``rows`` [r, n] with the importance vector ``importance``
    [n] (llama-quantize's per-column imatrix values): uint8 [r, n / block * size], the bytes
    ggml's ``quantize_row_<type>_impl`` writes (Q8_0: its reference quantizer, which ignores
    the importance; so do TQ1_0 and TQ2_0, whose ``quantize_tq*`` ignore it)."""
    block, size = SIZES[type_name]
    rows = np.ascontiguousarray(rows, F)
    r, n = rows.shape
    qw = np.ascontiguousarray(importance, F).reshape(n)
    with np.errstate(all="ignore"):
        if type_name == "Q8_0":
            out = _q8_0(rows.reshape(-1, 32))
        elif type_name in ("TQ1_0", "TQ2_0"):
            out = _QUANTIZERS[type_name](rows.reshape(-1, QK_K))
        elif type_name in ("IQ4_NL", "IQ4_XS"):
            out = _iq4_w(rows.reshape(-1, block), np.ascontiguousarray(np.tile(qw.reshape(-1, block), (r, 1))), type_name == "IQ4_XS")
        elif block == 32:
            out = _legacy_w(rows, qw, 5 if type_name.startswith("Q5") else 4, type_name.endswith("_1"))
        else:
            xb = rows.reshape(-1, QK_K)
            qwb = np.ascontiguousarray(np.tile(qw.reshape(-1, QK_K), (r, 1)))
            out = {"Q2_K": _q2_k_w, "Q3_K": _q3_k_w, "Q4_K": _q4_k_w, "Q5_K": _q5_k_w, "Q6_K": _q6_k_w}[type_name](xb, qwb)
    return out.reshape(r, n // block * size)
