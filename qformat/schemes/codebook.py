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
    bad_param, check_int, codes_entry, f32, fit_scale, flat_cells, map_chunks, pack, packed_shape, to_output, unflat,
)


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
    xb = flat_cells(x.astype(np.float64), bs or max(x.size, 1))
    desc: dict[str, Any] = {
        "shape": list(x.shape), "dtype": dtype,
        "codes": codes_entry("codes", {"type": "codebook", "bits": bits, "table_tensor": "table"}, x.ndim),
    }
    comps: dict[str, np.ndarray] = {"table": table}
    if bs is None:
        s = np.ones((xb.shape[0], 1))
    else:
        amax = np.max(np.abs(xb), axis=1, keepdims=True, initial=0.0)
        # 0 for an all-zero block (every code decodes to exactly 0); never 0 otherwise.
        s = np.where(amax > 0, fit_scale(amax, top), 0.0)
        comps["scale"] = s[:, 0].astype(np.float32)
        desc["scale"] = {"blocks": {"type": "flat", "size": bs}, "op": "multiply", "tensor": "scale"}
    # Each block on its own (a row of xb), so chunks of rows give the same codes.
    parts = map_chunks(lambda lo, hi: _nearest(xb[lo:hi], s[lo:hi], table, dtype), xb.shape[0], xb.shape[1])
    q = np.concatenate(parts) if len(parts) > 1 else parts[0]
    desc["scheme"] = "codebook"
    comps["codes"] = pack(unflat(q, x.shape), bits)
    return QTensor(desc, comps)
