"""Scheme "nf4": the NF4 codebook with an absmax scale per block of the flattened tensor.

Codes are chosen exactly as bitsandbytes' ``quantize_4bit`` does (binary32 ``x * (1/absmax)``,
clamped to [-1, 1], then compared with the binary32 midpoints of the sorted table, a value on
a midpoint taking the lower code), so without double quantization the codes and absmax are
bit-identical to bitsandbytes' (only the nibble order of the packing differs).

``double_quant`` stores the absmax values themselves encoded: c = absmax - mean (binary32),
8-bit two's complement codes with a binary32 scale max|c| / 127 per 256 values, and the mean
as a per-tensor bias.  The NF4 codes are then chosen against the absmax a reader decodes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import tables
from ..qtensor import QTensor
from .registry import Planned, register
from ._common import (
    check_bool, check_int, codes_entry, f32, fit_scale, flat_cells, map_chunks, nearest_of_two, pack, packed_shape, to_output,
)
from . import _float_fast
from ._float_fast import count_above, pack_codes, packs_flat, row_amax

_NESTED_BLOCK = 256


def _double_quant(absmax: np.ndarray, dtype: str) -> tuple[np.ndarray, dict[str, Any], dict[str, np.ndarray]]:
    """Encode binary32 absmax values; returns (decoded absmax, nested descriptor, components)."""
    n = absmax.size
    mean = float(f32(absmax.mean())) if n else 0.0
    c = f32(absmax - mean)
    cc = flat_cells(c, _NESTED_BLOCK)
    s = fit_scale(np.max(np.abs(cc), axis=1, initial=0.0), 127.0)[:, None]  # |c| / s <= 127
    y = cc / s
    q0 = np.clip(np.rint(y), -127, 127)
    q1 = np.clip(q0 + np.where(y > q0, 1.0, -1.0), -127, 127)
    target = flat_cells(absmax, _NESTED_BLOCK)

    def decode(q: np.ndarray) -> np.ndarray:
        a = f32(f32(q * s) + mean)  # the decoder's two binary32 steps
        # An absmax past the logical dtype's range would decode code +-1 to Inf: rule it out.
        return np.where(np.isfinite(to_output(a, dtype)), a, np.inf)

    q = nearest_of_two(target, q0, q1, decode)
    q = q.reshape(-1)[:n]
    decoded = f32(f32(q * np.repeat(s[:, 0], _NESTED_BLOCK)[:n]) + mean)
    nested = {
        "shape": [n],
        "dtype": "float32",
        "codes": codes_entry("scale.codes", {"type": "int", "bits": 8, "signedness": "twos_complement"}, 1),
        "scale": {"blocks": {"type": "grid", "size": [_NESTED_BLOCK]}, "op": "multiply", "tensor": "scale.scale"},
        "bias": {"blocks": {"type": "grid", "size": [None]}, "op": "add", "tensor": "scale.bias"},
    }
    comps = {
        "scale.codes": q.astype(np.int8),
        "scale.scale": s[:, 0].astype(np.float32),
        "scale.bias": np.array(mean, np.float32),
    }
    return decoded, nested, comps


def _divisor(a32: np.ndarray) -> np.ndarray:
    """bitsandbytes' divisor max(absmax, 1e-38) (binary32).  A decoded absmax <= 0 (double
    quant of an all-zero block) keeps its sign, so the codes still decode closest to x."""
    return np.where(a32 >= 0, np.maximum(a32, np.float32(1e-38)), np.minimum(a32, np.float32(-1e-38)))


def plan(shape: tuple[int, ...], dtype: str, block_size: Any = 64, double_quant: Any = False) -> Planned:
    """What :func:`encode` writes for an array of ``shape`` (see :data:`~qformat.schemes.registry.Planned`)."""
    bs = check_int("block_size", block_size, 1)
    dq = check_bool("double_quant", double_quant)
    rank = len(shape)
    nb = -(-math.prod(shape) // bs)
    desc: dict[str, Any] = {"shape": list(shape), "dtype": dtype,
                            "codes": codes_entry("codes", {"type": "codebook", "bits": 4, "table": "nf4"}, rank)}
    comps: dict[str, tuple[str, tuple[int, ...]]] = {}
    if dq:
        nested = {
            "shape": [nb], "dtype": "float32",
            "codes": codes_entry("scale.codes", {"type": "int", "bits": 8, "signedness": "twos_complement"}, 1),
            "scale": {"blocks": {"type": "grid", "size": [_NESTED_BLOCK]}, "op": "multiply", "tensor": "scale.scale"},
            "bias": {"blocks": {"type": "grid", "size": [None]}, "op": "add", "tensor": "scale.bias"},
        }
        desc["scale"] = {"blocks": {"type": "flat", "size": bs}, "op": "multiply", "encoded": nested}
        comps["scale.codes"] = ("I8", (nb,))
        comps["scale.scale"] = ("F32", (-(-nb // _NESTED_BLOCK),))
        comps["scale.bias"] = ("F32", ())
    else:
        desc["scale"] = {"blocks": {"type": "flat", "size": bs}, "op": "multiply", "tensor": "scale"}
        comps["scale"] = ("F32", (nb,))
    desc["scheme"] = "nf4"
    comps["codes"] = ("U8", packed_shape(shape, 4))
    return desc, comps


@register("nf4", plan)
def encode(x: np.ndarray, *, dtype: str, block_size: Any = 64, double_quant: Any = False) -> QTensor:
    """NF4 codes, absmax (binary32) per ``block_size`` elements of the flattened tensor."""
    bs = check_int("block_size", block_size, 1)
    dq = check_bool("double_quant", double_quant)
    table = tables.codebook_values("nf4")  # sorted ascending, code = index
    bounds = tuple((table[:-1] + table[1:]) / np.float32(2))  # binary32 midpoints
    flat = np.ascontiguousarray(x, np.float32).reshape(-1)  # bitsandbytes quantizes the binary32 values
    full, tail = divmod(flat.size, bs)
    xb = flat[: full * bs].reshape(full, bs)  # the whole blocks (a view); the partial one apart
    xt = flat[full * bs:]
    chunk = _float_fast.CHUNK_ELEMENTS
    amax32 = np.empty(full + (tail > 0), np.float32)

    def block_max(lo: int, hi: int) -> None:
        amax32[lo:hi] = row_amax(xb[lo:hi])

    map_chunks(block_max, full, bs, chunk)
    if tail:
        amax32[-1] = np.max(np.abs(xt))
    absmax = amax32.astype(np.float64)
    desc: dict[str, Any] = {"shape": list(x.shape), "dtype": dtype,
                            "codes": codes_entry("codes", {"type": "codebook", "bits": 4, "table": "nf4"}, x.ndim)}
    if dq:
        a, nested, comps = _double_quant(absmax, dtype)
        desc["scale"] = {"blocks": {"type": "flat", "size": bs}, "op": "multiply", "encoded": nested}
    else:
        a, comps = absmax, {"scale": amax32}
        desc["scale"] = {"blocks": {"type": "flat", "size": bs}, "op": "multiply", "tensor": "scale"}
    g = _divisor(a.astype(np.float32))
    recip = np.float32(1) / g  # whole blocks multiply by it, as bitsandbytes does
    # |table| <= 1, so a block whose |absmax| stays finite in the logical dtype never decodes
    # to Inf (rounding is monotone): only the others need the check in emit.
    risky = ~np.isfinite(to_output(np.abs(a), dtype))
    # Byte pairs never straddle a block or a row when both are even: pack chunk by chunk.
    paired = bs % 2 == 0 and packs_flat(x.shape, 4)
    per = bs // 2 if paired else bs  # bytes out per whole block
    out = np.empty(full * per + (tail // 2 if paired else tail), np.uint8)

    def emit(y: np.ndarray, lo: int, hi: int) -> None:
        """Codes of blocks lo:hi from y = x / absmax into ``out``.

        Counting the binary32 midpoints below y is bitsandbytes' comparison with them (a value
        on one takes the lower code); its clamp of y to [-1, 1] changes no count.  A code that
        would decode to Inf in the logical dtype steps one towards zero (code 7)."""
        q = count_above(y, bounds)
        r = risky[lo:hi]
        if r.any():
            bad = ~np.isfinite(to_output(f32(table[q[r]] * a[lo:hi][r][:, None]), dtype))
            qr = q[r].astype(np.int64)
            q[r] = np.where(bad, qr + np.sign(7 - qr), qr)
        packed = pack(q.reshape(-1), 4) if paired else q.reshape(-1)
        out[lo * per:lo * per + packed.size] = packed

    def part(lo: int, hi: int) -> None:
        with np.errstate(over="ignore"):
            emit(xb[lo:hi] * recip[lo:hi, None], lo, hi)

    map_chunks(part, full, bs, chunk)
    if tail:  # the partial last block divides (bitsandbytes' kernel does)
        with np.errstate(over="ignore"):
            emit(xt[None, :] / g[-1], full, full + 1)
    desc["scheme"] = "nf4"
    comps["codes"] = out.reshape(x.shape[:-1] + (x.shape[-1] // 2,)) if paired else pack_codes(out, 4, x.shape)
    return QTensor(desc, comps)
