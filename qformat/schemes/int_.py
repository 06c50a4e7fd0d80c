"""Scheme "int": b-bit integer codes (2 <= b <= 8) with a scale per group along one axis.

Symmetric (default): two's complement codes q in [-2^(b-1), 2^(b-1)-1], x ~ q * s.  Per group
the scale is the best of a small candidate set, judged by the squared error of the values a
reader decodes (scale rounded to ``scale_dtype``, binary32 product, cast to the logical
dtype).  The set holds +-amax / m for m around 2^(b-1), including GGUF Q4_0's choice (the
value of largest magnitude divided by -2^(b-1)); the search runs in binary32 and a candidate
replaces Q4_0's only when clearly better, so the result is never worse than Q4_0 on the same
group.  Groups are encoded in chunks on a few threads; the bytes never depend on either.

Where the native extension is built (``qformat.kernels._encode``, ``_encode.c``) the groups it
covers (16-bit scales; binary32-exact input; symmetric: :func:`int_symmetric.covered`;
asymmetric: float32 output) are encoded in C, ranges of rows on ``qformat.kernels.pool``, with
the same bytes as the NumPy path (tests/test_native_encode.py compares them bit for bit); the
groups it leaves (non-finite or extreme values) and every other case take the NumPy path, which
``QFORMAT_KERNELS=numpy`` (or ``kernels.use("numpy")``) selects throughout.

Asymmetric: unsigned codes q in [0, 2^b - 1] with an integer zero point z per group (a plain
U8 tensor), x ~ (q - z) * s, s = (max - min) / (2^b - 1) over the group's range widened to
include 0 (so that 0 is exact and z is in range).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .. import kernels
from ..qtensor import QTensor
from . import _common, int_symmetric
from .registry import Planned, register
from ._common import (
    SCALE_STORAGE, bad_param, best_int_codes, check_axis, check_bool, check_choice, check_int, codes_entry, grid_blocks, map_chunks, np_dtype, pack, packed_shape, resolve_sizes,
)

_SCALE_DTYPES = ("float32", "float16", "bfloat16")
#: Elements encoded per chunk (None: :data:`~qformat.schemes._common.CHUNK_ELEMENTS`).
CHUNK_ELEMENTS: int | None = 1 << 19
#: Relative margin by which a candidate's binary32 squared-error estimate must beat the current
#: best (starting from Q4_0's choice) to replace it.  The estimate is within about 1e-5 of
#: the exact squared error, so a replacement is always a real improvement: the chosen scale is
#: never worse than Q4_0's (tests/test_schemes.py checks it per group, exactly).
_MARGIN = int_symmetric.MARGIN


def _multipliers(bits: int) -> list[tuple[float, float]]:
    """(sign, m) pairs: candidate scales are sign * amax / m.

    m = 2^(b-1) with both signs covers Q4_0 (the extreme value lands on code -2^(b-1)
    whatever its sign); m = 2^(b-1) + 1/2 and + 1/4 trade a little clipping of the extreme
    value for resolution.  Five candidates: the set that kept most of a 13-candidate search's
    gain (0.2-0.35 dB over Q4_0 on normal and heavy-tailed weights, versus 0.25-0.45) at the
    speed of Q4_0's own quantizer.
    """
    half = float(1 << (bits - 1))
    return [(-1.0, half), (1.0, half), (-1.0, half + 0.5), (1.0, half + 0.5), (-1.0, half + 0.25)]


def _to_scale(v: np.ndarray, scale_dtype: str) -> np.ndarray:
    """Round candidate scales to the stored dtype; back as float64 (exact)."""
    with np.errstate(over="ignore"):
        return np.asarray(v, np.float64).astype(np_dtype(scale_dtype)).astype(np.float64)


def _symmetric(x: np.ndarray, bits: int, scale_dtype: str, dtype: str, packed: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`symmetric_reference`'s result, through the binary32 path where it applies;
    ``packed``: 4-bit codes packed along each row (see :func:`int_symmetric.nibbles`)."""
    if int_symmetric.covered(x.dtype, scale_dtype, dtype):
        return int_symmetric.symmetric(x, bits, scale_dtype, dtype, symmetric_reference, packed)
    q, s, ok = symmetric_reference(x, bits, scale_dtype, dtype)
    return (int_symmetric.nibbles(q) if packed else q), s, ok


def symmetric_reference(x: np.ndarray, bits: int, scale_dtype: str, dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes int8 [n, g], scales float64 [n], ok [n]) of the groups (rows) of x: the rule.

    The scale search runs in binary32: per candidate, codes rint(x / s) and the squared error
    of the values a reader decodes, summed per group.  Candidates are tried from Q4_0's
    choice on, each replacing the best only when clearly better (:data:`_MARGIN`).  The
    codes of the chosen scale are then computed exactly (float64).
    """
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    n = len(x)
    # Transposed ([g, n]): per-group scales broadcast along long rows, sums add whole rows.
    xt = np.ascontiguousarray(x.T, np.float32)
    amax = np.max(np.abs(xt), axis=0, initial=np.float32(0)).astype(np.float64)
    # Q4_0's sign per group: its extreme value (the first of largest magnitude) lands on -2^(b-1).
    ext = xt[np.argmax(np.abs(xt), axis=0), np.arange(n)] if len(xt) else np.zeros(n, np.float32)
    q4_0 = np.where(ext > 0, -1.0, 1.0)
    cands = _multipliers(bits)
    # Every candidate scale at once ([C, n]), Q4_0's first, then the other sign of the same
    # magnitude, then the rest.
    sg = np.array([q4_0, -q4_0] + [np.full(n, c[0]) for c in cands[2:]])
    mm = np.array([cands[0][1]] * 2 + [c[1] for c in cands[2:]])[:, None]
    S = _to_scale(sg * amax / mm, scale_dtype)
    OK = np.isfinite(S)
    S = np.where(OK, S, 0.0)
    S32 = S.astype(np.float32)
    with np.errstate(divide="ignore", over="ignore"):  # an infinite reciprocal only clips codes
        INV = np.where(S32 != 0, np.float32(1) / np.where(S32 != 0, S32, np.float32(1)), np.float32(0))
    # Estimates of groups at the edges of binary32's range are unreliable (underflow): Q4_0's.
    searchable = (amax > 2.0**-50) & (amax < 2.0**50)
    best_e = np.full(n, np.inf, np.float32)
    best = np.zeros(n, np.intp)
    chosen = np.zeros(n, bool)
    odt = None if dtype == "float32" else np_dtype(dtype)
    y = np.empty_like(xt)
    keep = np.float32(1 - _MARGIN)
    for c in range(len(S)):
        with np.errstate(invalid="ignore", over="ignore"):
            np.multiply(xt, INV[c], out=y)
            np.rint(y, out=y)
            np.clip(y, lo, hi, out=y)
            np.multiply(y, S32[c], out=y)  # the decoded binary32 value (exact)
            if odt is not None:
                y[...] = y.astype(odt)
            np.subtract(y, xt, out=y)
            e = np.einsum("ij,ij->j", y, y)
        ok = OK[c]
        e[~ok | np.isnan(e)] = np.inf
        # Q4_0's choice is taken whenever its scale is finite (even if its estimate overflowed).
        better = ok & (~chosen | (searchable & (e < best_e * keep)))
        chosen |= ok
        best_e[better] = e[better]
        best[better] = c
    best_s = S[best, np.arange(n)]
    exact = dtype == "float32" and scale_dtype != "float32"
    if exact:  # the nearest code is the rounded exact quotient (see best_int_codes), in place
        q = xt.astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            np.divide(q, np.where(best_s != 0, best_s, 1.0), out=q)
        np.rint(q, out=q)
        np.clip(q, lo, hi, out=q)
    else:
        q = best_int_codes(np.ascontiguousarray(x.T, np.float64), best_s, 0.0, lo, hi, dtype, False)
    return np.ascontiguousarray(q.astype(np.int8).T), best_s, chosen


def _asymmetric(x: np.ndarray, bits: int, scale_dtype: str, dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    qmax = (1 << bits) - 1
    x = x.astype(np.float64)
    mn = np.minimum(np.min(x, axis=1, initial=0.0), 0.0)
    mx = np.maximum(np.max(x, axis=1, initial=0.0), 0.0)
    s = _to_scale((mx - mn) / qmax, scale_dtype)
    ok = np.isfinite(s)
    s = np.where(ok, s, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(s > 0, np.clip(np.rint(-mn / np.where(s > 0, s, 1.0)), 0, qmax), 0.0)
    exact = dtype == "float32" and scale_dtype != "float32"
    q = best_int_codes(x, s[:, None], z[:, None], 0, qmax, dtype, exact)
    return q.astype(np.uint8), s, z, ok


#: The native encoders' kinds (``_encode.c``): input element, scale and logical dtype.
_SRC = {"float32": 0, "float16": 1, "bfloat16": 2}
_SCALE_KIND = {"float16": 1, "bfloat16": 2}
_OUT_KIND = {"float32": 0, "float16": 1, "bfloat16": 2}
#: Rows per native call are at least this many elements (a call and a pool task cost a few us).
_NATIVE_MIN_ELEMENTS = 1 << 16


def _native_covers(x_dtype: np.dtype, sym: bool, scale_dtype: str, dtype: str) -> bool:
    """Whether the native encoder (``qformat.kernels._encode``) takes these groups: 16-bit
    scales, binary32-exact input, and the NumPy path's binary32 rule (symmetric) or an exact
    product (asymmetric, float32 output).  Everything else stays on the NumPy path."""
    if not kernels.encode_available() or x_dtype.name not in _SRC or scale_dtype not in _SCALE_KIND:
        return False
    return int_symmetric.covered(x_dtype, scale_dtype, dtype) if sym else dtype == "float32"


@functools.lru_cache(maxsize=None)
def _writes_scale_bits(enc: Any) -> bool:
    """Whether the extension module ``enc``'s int_sym writes the scales' 16-bit pattern too (one
    built before issue 45 item 5 refuses the argument; the float64 scales are converted then)."""
    try:
        enc.int_sym(np.ones((1, 2), np.float32), 0, 1, 2, 4, 1, 0, False, np.empty((1, 2), np.int8), np.empty(1), np.empty(1, np.uint8), 0,
                    np.empty(1, np.uint16))
    except (TypeError, ValueError):
        return False
    return True


def _native(rows: np.ndarray, bits: int, sym: bool, scale_dtype: str, dtype: str, packed: bool,
            scale_bits: bool = False) -> tuple[np.ndarray, ...]:
    """:func:`_symmetric` / :func:`_asymmetric` of all ``rows`` (groups), the same bytes, in C:
    ranges of rows on ``kernels.pool`` (GIL released).  Groups the C path leaves (status 0:
    NaN, Inf, zero or extreme ranges, ...) are encoded by the NumPy path, row by row
    independent, so the result never depends on the split.  ``scale_bits`` (symmetric): the
    scales returned in ``scale_dtype`` (the same values), written by the kernel as such."""
    x = np.ascontiguousarray(rows)
    n, g = x.shape
    codes = np.empty((n, g // 2) if packed else (n, g), np.uint8 if (packed or not sym) else np.int8)
    s = np.empty(n, np.float64)
    z = None if sym else np.empty(n, np.float64)
    st = np.empty(n, np.uint8)
    src, sk, level = _SRC[x.dtype.name], _SCALE_KIND[scale_dtype], kernels.encode_level()
    enc = kernels._encode
    # symmetric: the scales' float16 / bfloat16 bits written by the kernel too (converting the
    # float64 scales took a tenth of the encoder's time)
    s16 = np.empty(n, np.uint16) if sym and scale_bits and _writes_scale_bits(enc) else None

    def run(a: int, b: int) -> None:
        if sym:
            enc.int_sym(x[a:b], src, b - a, g, bits, sk, _OUT_KIND[dtype], packed, codes[a:b], s[a:b], st[a:b], level,
                        None if s16 is None else s16[a:b])
        else:
            enc.int_asym(x[a:b], src, b - a, g, bits, sk, packed, codes[a:b], s[a:b], z[a:b], st[a:b], level)  # type: ignore[index]

    threads = _common.THREADS
    step = max(16, -(-n // (threads * 4)), _NATIVE_MIN_ELEMENTS // max(g, 1))
    bounds = [(a, min(a + step, n)) for a in range(0, n, step)] or [(0, 0)]
    if threads <= 1 or len(bounds) == 1:
        for a, b in bounds:
            run(a, b)
    else:
        list(kernels.pool(threads).map(lambda ab: run(*ab), bounds))
    ok = np.ones(n, bool)
    left = np.flatnonzero(st == 0)
    if len(left):
        sub = x[left]
        if sym:
            codes[left], s[left], ok[left] = _symmetric(sub, bits, scale_dtype, dtype, packed)
            if s16 is not None:
                s16[left] = s[left].astype(np_dtype(scale_dtype)).view(np.uint16)
        else:
            q, s[left], z[left], ok[left] = _asymmetric(sub, bits, scale_dtype, dtype)  # type: ignore[index]
            codes[left] = int_symmetric.nibbles(q) if packed else q
    if s16 is not None:  # the scales in their dtype (encode's astype then copies nothing)
        return codes, s16.view(np_dtype(scale_dtype)), ok
    if sym and scale_bits:
        return codes, s.astype(np_dtype(scale_dtype)), ok
    return (codes, s, ok) if sym else (codes, s, z, ok)


def _grouped(x: np.ndarray, ax: int | None, g: int | None) -> tuple[np.ndarray, tuple[int, ...], int, int]:
    """x with the grouped axis last, as rows of one group each: ([R * ng, gs], lead, ng, gs)."""
    xm = x.reshape(1, 1) if ax is None else np.moveaxis(x, ax, -1)
    length = xm.shape[-1]
    gs = g if g is not None else max(length, 1)
    ng = -(-length // gs) if g is not None else 1
    lead = xm.shape[:-1]
    nlead = int(np.prod(lead, dtype=np.int64))
    rows = xm.reshape(nlead, length)
    if ng * gs != length:
        rows = np.pad(rows, ((0, 0), (0, ng * gs - length)))  # zeros: neutral for every statistic
    return rows.reshape(nlead * ng, gs), lead, ng, gs


def _ungrouped(v: np.ndarray, lead: tuple[int, ...], length: int, ax: int | None, shape: tuple[int, ...]) -> np.ndarray:
    """Inverse of :func:`_grouped` for per-element arrays ([R * ng, gs] -> ``shape``)."""
    nlead = int(np.prod(lead, dtype=np.int64))
    r = v.reshape(nlead, v.size // max(nlead, 1))[:, :length].reshape(lead + (length,))
    return r.reshape(shape) if ax is None else np.moveaxis(r, -1, ax)


def _per_group(v: np.ndarray, lead: tuple[int, ...], ng: int, ax: int | None) -> np.ndarray:
    """Per-group values ([R * ng]) as the scale grid (the grouped axis back in place)."""
    r = v.reshape(lead + (ng,))
    return r.reshape(()) if ax is None else np.moveaxis(r, -1, ax)


def default_scale_dtype(dtype: str) -> str:
    """The scale dtype when none is given: bfloat16 for a bfloat16 logical dtype, else float16.

    Why: a bfloat16 model runs with bfloat16 activations, and the native CPU kernels
    (qformat_torch.kernels) take their scales in the activations' dtype; bfloat16 scales reach
    them as stored, with no rounding.  Their cost is nil where it matters: on bfloat16 weights
    int4 g32 / g128 and int8 per channel measured the same SQNR with either scale dtype (to
    0.02 dB), int8 g32 0.1 dB lower.  float16 stays the default elsewhere (three more bits of
    scale, and GGUF's Q4_0 / Q8_0 take float16 scales as they are)."""
    return "bfloat16" if dtype == "bfloat16" else "float16"


def plan(shape: tuple[int, ...], dtype: str, bits: Any = 4, group_size: Any = 32, axis: Any = -1, symmetric: Any = True,
         scale_dtype: Any = None) -> Planned:
    """What :func:`encode` writes for an array of ``shape`` (see :data:`~qformat.schemes.registry.Planned`)."""
    b = check_int("bits", bits, 2, 8)
    g = check_int("group_size", group_size, 1, allow_none=True)
    sym = check_bool("symmetric", symmetric)
    sdt = check_choice("scale_dtype", default_scale_dtype(dtype) if scale_dtype is None else scale_dtype, _SCALE_DTYPES)
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
           symmetric: Any = True, scale_dtype: Any = None) -> QTensor:
    """Integer codes with a scale per ``group_size`` elements along ``axis`` (None: whole axis).
    ``scale_dtype``: float16, bfloat16 or float32; None: :func:`default_scale_dtype` of ``dtype``."""
    b = check_int("bits", bits, 2, 8)
    g = check_int("group_size", group_size, 1, allow_none=True)
    sym = check_bool("symmetric", symmetric)
    sdt = check_choice("scale_dtype", default_scale_dtype(dtype) if scale_dtype is None else scale_dtype, _SCALE_DTYPES)
    rank = x.ndim
    ax = check_axis("axis", axis, rank)
    sizes: list[int | None] = [1] * rank
    if ax is not None:
        sizes[ax] = g
    rows, lead, ng, gs = _grouped(x, ax, g)
    length = 1 if ax is None else x.shape[ax]
    blocks = grid_blocks(sizes)
    desc: dict[str, Any] = {"shape": list(x.shape), "dtype": dtype}
    # 4-bit symmetric codes along the last axis in whole even groups (the usual case) are packed
    # by the workers: each group is a whole number of bytes of the canonical packing.
    packed = sym and b == 4 and ax == rank - 1 and ng * gs == length and gs % 2 == 0
    native = _native_covers(rows.dtype, sym, sdt, dtype)
    # the native asymmetric encoder packs 4-bit codes too (the same canonical packing)
    packed_asym = native and not sym and b == 4 and ax == rank - 1 and ng * gs == length and gs % 2 == 0
    if native:
        q, s, *rest = _native(rows, b, sym, sdt, dtype, packed or packed_asym, scale_bits=True)
    else:
        if sym:
            parts = map_chunks(lambda a, c: _symmetric(rows[a:c], b, sdt, dtype, packed), len(rows), gs, CHUNK_ELEMENTS)
        else:
            parts = map_chunks(lambda a, c: _asymmetric(rows[a:c], b, sdt, dtype), len(rows), gs, CHUNK_ELEMENTS)
        q, s, *rest = (np.concatenate(p) for p in zip(*parts))
    if not rest[-1].all():
        i = int(np.argmin(rest[-1]))
        raise bad_param("scale_dtype", f"a dtype that holds every group's scale (max |x| = {float(np.max(np.abs(rows[i]))):g})", sdt)
    if packed:
        desc["codes"] = codes_entry("codes", {"type": "int", "bits": b, "signedness": "twos_complement"}, rank)
        comps = {"codes": q.reshape(lead + (length // 2,))}
    elif sym:
        codes = _ungrouped(q, lead, length, ax, x.shape)
        desc["codes"] = codes_entry("codes", {"type": "int", "bits": b, "signedness": "twos_complement"}, rank)
        # 8-bit codes keep their natural dtype so plain safetensors readers see the integers.
        comps = {"codes": codes if b == 8 else pack(codes.view(np.uint8) & np.uint8((1 << b) - 1), b)}
    else:
        z = rest[0]
        desc["codes"] = codes_entry("codes", {"type": "int", "bits": b, "signedness": "unsigned"}, rank)
        desc["zero"] = {"blocks": blocks, "tensor": "zero"}
        if packed_asym:
            cq = q.reshape(lead + (length // 2,))
        else:
            codes = _ungrouped(q, lead, length, ax, x.shape)
            cq = codes if b == 8 else pack(codes, b)
        comps = {"codes": cq, "zero": _per_group(z, lead, ng, ax).astype(np.uint8)}
    desc["scale"] = {"blocks": blocks, "op": "multiply", "tensor": "scale"}
    desc["scheme"] = "int"
    comps["scale"] = _per_group(s, lead, ng, ax).astype(np_dtype(sdt), copy=False)
    return QTensor(desc, comps)
