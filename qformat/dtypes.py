"""Storage dtypes (safetensors names) and logical dtypes, derived from tables/dtypes.json."""

from __future__ import annotations

from functools import lru_cache

import ml_dtypes
import numpy as np

from . import tables

#: The logical dtypes a descriptor may declare, in SPEC.md order.
LOGICAL_DTYPES = ("float32", "float16", "bfloat16")


def _np(name: str) -> np.dtype:
    if hasattr(np, name) and name not in ("bool",):
        return np.dtype(getattr(np, name))
    if name == "bool":
        return np.dtype(np.bool_)
    return np.dtype(getattr(ml_dtypes, name))


def logical_numpy(name: str) -> np.dtype:
    """NumPy dtype of a logical dtype name (bfloat16 through ml_dtypes)."""
    if name not in LOGICAL_DTYPES:
        raise KeyError(name)
    return _np(name)


@lru_cache(maxsize=None)
def storage_numpy(name: str) -> np.dtype | None:
    """NumPy dtype that views a safetensors dtype's bytes, or None (F4, F6_*)."""
    entry = tables.dtypes()[name]
    return None if entry["numpy"] is None else _np(entry["numpy"]).newbyteorder("<")


def storage_bits(name: str) -> int:
    return int(tables.dtypes()[name]["bits"])


@lru_cache(maxsize=None)
def _by_numpy() -> dict[np.dtype, str]:
    out = {}
    for name, entry in tables.dtypes().items():
        if entry["numpy"] is not None:
            out[_np(entry["numpy"])] = name
    return out


def storage_name(dtype: np.dtype) -> str | None:
    """safetensors dtype name of a NumPy dtype, or None when safetensors has none."""
    return _by_numpy().get(np.dtype(dtype).newbyteorder("="))


def rounded_bits(u: np.ndarray, shift: int, out: np.ndarray) -> np.ndarray:
    """Binary32 bit patterns ``u`` (uint32) plus the round-half-to-even increment for dropping
    their low ``shift`` bits, into ``out`` (uint32, u's shape): ``u + 2^(shift-1) - 1 + (bit
    `shift` of u)`` (SPEC.md §10.3's formula, no carry leaves 32 bits for non-NaN values).
    The kept bits of the result (``>> shift``, or with the low ones cleared) are the rounded
    value: bfloat16 with shift 16, float16-precision binary32 with shift 13 where the result
    is a normal float16 or zero."""
    np.right_shift(u, np.uint32(shift), out=out)
    np.bitwise_and(out, np.uint32(1), out=out)
    np.add(out, np.uint32((1 << (shift - 1)) - 1), out=out)
    np.add(out, u, out=out)
    return out
