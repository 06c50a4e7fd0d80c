"""OCP Microscaling (MX) schemes: one E8M0 power-of-two scale per block along the last axis.

Per block (default 32 elements, the last one may be partial): shared exponent
e = floor(log2(amax)) - emax_elem, clamped to [-127, 127] (amax 0 gives -127), where emax_elem
is the exponent of the element format's largest binade (E2M1 2, E2M3 2, E3M2 4, E4M3 8, E5M2
15, INT8 0).  Elements are x / 2^e rounded to nearest even with saturation (clip to +-max
first, as the OCP spec's reference does).  MXINT8 elements are 8-bit two's complement with 6
fraction bits, clipped to [-127, 127] / 64.

The scale is a plain F8_E8M0 tensor (code e + 127, value 2^e), op multiply.  FP4 / FP6 codes
are packed 4 / 6 bits to the byte stream; 8-bit codes keep a natural dtype (float8 arrays, or
int8 for MXINT8) so plain safetensors readers see their values.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .. import tables
from ..qtensor import QTensor
from .registry import Planned, register
from ._common import (
    cast_codes, cells, check_int, codes_entry, emax, grid_array, grid_blocks, map_chunks, pack, packed_shape, resolve_sizes, uncells,
)
from . import _float_fast
from ._float_fast import float_codes, pack_stream, packs_flat, positive_zero, row_amax, whole_bytes

#: scheme id -> element format name ("int8" for MXINT8).
FORMATS = {
    "mxfp4": "e2m1fn", "mxfp6_e2m3": "e2m3fn", "mxfp6_e3m2": "e3m2fn",
    "mxfp8_e4m3": "e4m3fn", "mxfp8_e5m2": "e5m2", "mxint8": "int8",
}
_FP8_STORAGE = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
_INT8_FRAC = 6


def shared_exponent(amax: np.ndarray, fmt: str) -> np.ndarray:
    """The E8M0 exponent of each block (int64), OCP MX v1.0 section 6.3."""
    elem_emax = 0 if fmt == "int8" else emax(fmt)
    e = np.frexp(amax)[1].astype(np.int64) - 1 - elem_emax  # frexp: amax = m * 2^k, 0.5 <= m < 1
    return np.where(amax > 0, np.clip(e, -127, 127), -127)


def _blocks(scheme: str, xb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes [n, bs] uint8 / int8, shared exponents [n]) of blocks ``xb`` [n, bs].

    float32 inputs stay float32: x * 2^-e is exact there except below the binary32 normal
    range, where it rounds to a value far under half the element format's smallest step, so
    the code (a signed zero) is the same as from the exact float64 quotient.
    """
    fmt = FORMATS[scheme]
    if xb.dtype == np.float32:
        e = shared_exponent(row_amax(xb).astype(np.float64)[:, None], fmt)
        y = xb * np.ldexp(1.0, -e).astype(np.float32)  # 2^-e, e in [-127, 127]: exact in binary32
    else:
        e = shared_exponent(np.max(np.abs(xb), axis=1, keepdims=True, initial=0).astype(np.float64), fmt)
        y = np.ldexp(xb, -e)  # exact: a power-of-two scaling in float64
    if fmt == "int8":  # |y| < 2, so y * 64 is exact in binary32 too
        c = np.clip(np.rint(y * y.dtype.type(1 << _INT8_FRAC)), -127, 127).astype(np.int8)
    else:
        c = float_codes(y, fmt) if y.dtype == np.float32 else cast_codes(y, fmt)
        c = positive_zero(c, int(tables.float_formats()[fmt]["bits"]))  # -0 codes -> +0
    return c, e[:, 0]


def _encode(scheme: str, x: np.ndarray, dtype: str, block_size: Any) -> QTensor:
    bs = check_int("block_size", block_size, 1)
    fmt = FORMATS[scheme]
    bits = 8 if fmt == "int8" else int(tables.float_formats()[fmt]["bits"])
    rank = x.ndim
    sizes: list[int | None] = [1] * (rank - 1) + [bs] if rank else []
    # float16 / bfloat16 values are exact in binary32; float64 inputs keep float64.
    xw = np.ascontiguousarray(x, np.float64 if x.dtype == np.float64 else np.float32)
    xc = cells(xw, sizes) if rank else xw.reshape(1, 1)
    xb = xc.reshape(-1, xc.shape[-1])  # every cell axis but the last has extent 1
    n = xb.shape[0]
    # Without padding the codes of whole blocks, in order, are the packed stream (8-bit codes:
    # the codes array), so each chunk writes its part in place.
    streamed = rank > 0 and x.shape[-1] % bs == 0 and packs_flat(x.shape, bits) and whole_bytes(bs, bits)
    per = xb.shape[1] * bits // 8 if streamed else xb.shape[1]  # entries of ``out`` per block
    out = np.empty(n * per, np.int8 if fmt == "int8" else np.uint8)
    e = np.empty(n, np.int64)

    def part(lo: int, hi: int) -> None:
        c, e[lo:hi] = _blocks(scheme, xb[lo:hi])
        out[lo * per:hi * per] = pack_stream(c, bits) if streamed and bits < 8 else c.reshape(-1)

    map_chunks(part, n, xb.shape[1], _float_fast.CHUNK_ELEMENTS)
    e = e.reshape(xc.shape[:-1] + (1,)) if rank else e.reshape(())
    if streamed:
        codes = out.reshape(x.shape[:-1] + (x.shape[-1] * bits // 8,))
    else:
        y = uncells(out.reshape(xc.shape), x.shape) if rank else out.reshape(())
        codes = np.ascontiguousarray(y).reshape(x.shape) if bits == 8 else pack(y, bits)
    if fmt == "int8":
        element: dict[str, Any] = {"type": "int", "bits": 8, "signedness": "twos_complement", "frac_bits": _INT8_FRAC}
    else:
        element = {"type": "float", "format": fmt}
        if fmt in _FP8_STORAGE:
            codes = codes.view(_FP8_STORAGE[fmt])
    desc = {
        "shape": list(x.shape), "dtype": dtype,
        "codes": codes_entry("codes", element, rank),
        "scale": {"blocks": grid_blocks(sizes), "op": "multiply", "tensor": "scale"},
        "scheme": scheme,
    }
    scale = grid_array(e + 127).astype(np.uint8).view(ml_dtypes.float8_e8m0fnu)
    return QTensor(desc, {"codes": codes, "scale": scale})


def _plan(scheme: str, shape: tuple[int, ...], dtype: str, block_size: Any) -> Planned:
    bs = check_int("block_size", block_size, 1)
    fmt = FORMATS[scheme]
    rank = len(shape)
    sizes: list[int | None] = [1] * (rank - 1) + [bs] if rank else []
    if fmt == "int8":
        element: dict[str, Any] = {"type": "int", "bits": 8, "signedness": "twos_complement", "frac_bits": _INT8_FRAC}
        codes = ("I8", tuple(shape))
    else:
        element = {"type": "float", "format": fmt}
        if fmt in _FP8_STORAGE:
            codes = ({"e4m3fn": "F8_E4M3", "e5m2": "F8_E5M2"}[fmt], tuple(shape))
        else:
            codes = ("U8", packed_shape(shape, int(tables.float_formats()[fmt]["bits"])))
    desc = {
        "shape": list(shape), "dtype": dtype,
        "codes": codes_entry("codes", element, rank),
        "scale": {"blocks": grid_blocks(sizes), "op": "multiply", "tensor": "scale"},
        "scheme": scheme,
    }
    return desc, {"codes": codes, "scale": ("F8_E8M0", resolve_sizes(shape, sizes)[1])}


def _make(scheme: str) -> None:
    def encode(x: np.ndarray, *, dtype: str, block_size: Any = 32) -> QTensor:
        return _encode(scheme, x, dtype, block_size)

    def plan(shape: tuple[int, ...], dtype: str, block_size: Any = 32) -> Planned:
        return _plan(scheme, shape, dtype, block_size)

    encode.__name__ = f"encode_{scheme}"
    encode.__doc__ = f"OCP {scheme.upper()}: {FORMATS[scheme]} elements, an E8M0 scale per ``block_size`` along the last axis."
    register(scheme, plan)(encode)


for _scheme in FORMATS:
    _make(_scheme)
