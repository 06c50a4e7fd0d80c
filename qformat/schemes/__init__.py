"""The reference encoders (quantizers), one module per scheme family, behind a registry.

Scheme ids and their parameter names come from ``tables/schemes.json`` (the single source of
truth): a module may register only ids listed there, every listed id is registered, and
:func:`quantize` refuses any parameter name the table does not list for the scheme.

An encoder is a function ``encode(x, *, dtype, **params) -> QTensor`` where ``x`` is the
validated input array (finite, real float) and ``dtype`` the logical dtype name.  It returns
component arrays under short local names (``"codes"``, ``"scale"``, ``"scale.codes"``, ...);
callers rename them (:meth:`QTensor.renamed`) when several tensors share a file.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dtypes as _dt
from .. import tables
from ..errors import error
from ..qtensor import QTensor
from ._common import check_choice, np_dtype
# The family modules register their ids on import; a test checks that the registered ids are
# exactly the keys of tables/schemes.json.
from . import codebook, fp8, gguf, int_, mx, nf4, nvfp4  # noqa: F401
from .registry import Encoder, Planned, Planner, get, get_plan, ids, proxy_row, register

__all__ = ["Encoder", "Planned", "Planner", "get", "get_plan", "ids", "plan", "quantize", "register", "verify_plan"]

_INPUT_DTYPES = ("float16", "float32", "float64", "bfloat16")
_LOGICAL = ("float32", "float16", "bfloat16")


def quantize(array: Any, scheme: str, **params: Any) -> QTensor:
    """Encode ``array`` with ``scheme``; parameters as listed in tables/schemes.json.

    ``dtype`` (every scheme) is the logical dtype a reader decodes to: float32, float16 or
    bfloat16; default the input's dtype, float32 for float64 input.
    Raises SCHEME_UNKNOWN, ENCODE_PARAM_INVALID (unknown parameter or bad value) or
    ENCODE_INPUT_INVALID (not a real float array, NaN or Inf, or a value the logical dtype
    cannot hold).
    """
    fn = get(scheme)
    _check_names(scheme, params)
    x, ends = _check_input(array)
    dt = params.pop("dtype", None)
    if dt is None:
        dt = "float32" if x.dtype == np.float64 else x.dtype.name
    dt = check_choice("dtype", dt, _LOGICAL)
    _check_range(x, dt, ends)
    return fn(x, dtype=dt, **params)


def plan(shape: Any, scheme: str, dtype: str, **params: Any) -> Planned:
    """What ``quantize(x, scheme, dtype=dtype, **params)`` writes for an array ``x`` of
    ``shape``, without encoding: the descriptor and each component's safetensors dtype and
    shape (each scheme's own planner, registered with its encoder).  Raises SCHEME_UNKNOWN or
    ENCODE_PARAM_INVALID as :func:`quantize` would."""
    planner = get_plan(scheme)
    _check_names(scheme, params)
    return planner(tuple(int(s) for s in shape), check_choice("dtype", dtype, _LOGICAL), **params)


def verify_plan(scheme: str, rank: int, dtype: str, **params: Any) -> None:
    """Encode a small array of ``rank`` (partial blocks on every axis) and check that
    :func:`plan` predicts exactly what the encoder writes; this also checks every parameter
    value the way the encoder does.  A mismatch is an internal error (SAVE_INVALID)."""
    shape = tuple([3] * (rank - 1) + [proxy_row(scheme)]) if rank else ()
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    q = quantize(x, scheme, dtype=dtype, **params)
    desc, comps = plan(shape, scheme, dtype, **params)
    got = {k: (_dt.storage_name(a.dtype), tuple(a.shape)) for k, a in q.components.items()}
    if q.descriptor != desc or got != comps:
        raise error("SAVE_INVALID", f"internal: the planned layout of scheme {scheme!r} {params} differs from the encoder's ({comps} vs {got})")


def _check_names(scheme: str, params: dict[str, Any]) -> None:
    allowed = tables.schemes()[scheme]["parameters"]
    for name in params:
        if name not in allowed:
            raise error("ENCODE_PARAM_INVALID", f"scheme {scheme!r} has no parameter {name!r}; expected one of {', '.join(allowed)}", field=name)


#: Bit pattern of +Inf of the 16-bit input dtypes (every larger magnitude pattern is NaN).
_INF16 = {"float16": 0x7C00, "bfloat16": 0x7F80}


def _extremes(x: np.ndarray) -> tuple[float, float]:
    """(max, min) of ``x`` as floats, NaN if any element is NaN, in chunks (no full-size
    temporaries: a checkpoint tensor can be gigabytes).  For the 16-bit dtypes, (M, -M) with
    M the largest magnitude, found on the bits: without the sign bit, magnitudes order as
    unsigned integers and NaN patterns lie above Inf's (a range check needs only M)."""
    flat = x.reshape(-1)
    if flat.size == 0:
        return 0.0, 0.0
    step = 1 << 20
    if x.dtype.itemsize == 2:
        bits = flat.view(np.uint16)
        buf = np.empty(min(step, flat.size), np.uint16)
        top = 0
        for a in range(0, flat.size, step):
            c = bits[a:a + step]
            t = buf[:c.size]
            np.bitwise_and(c, np.uint16(0x7FFF), out=t)
            top = max(top, int(t.max()))
        if top > _INF16[x.dtype.name]:
            return float("nan"), float("nan")
        m = float(np.array([top], np.uint16).view(x.dtype)[0])
        return m, -m
    hi, lo = -np.inf, np.inf
    for a in range(0, flat.size, step):
        c = flat[a:a + step]
        cmax, cmin = float(c.max()), float(c.min())
        if cmax != cmax or cmin != cmin:
            return float("nan"), float("nan")
        hi, lo = max(hi, cmax), min(lo, cmin)
    return hi, lo


def _check_input(array: Any) -> tuple[np.ndarray, tuple[float, float]]:
    """The input as an array and its (max, min); ENCODE_INPUT_INVALID unless real and finite."""
    x = np.asarray(array)
    if x.dtype.name not in _INPUT_DTYPES:
        raise error("ENCODE_INPUT_INVALID", f"expected a real float array ({', '.join(_INPUT_DTYPES)}), found dtype {x.dtype}")
    hi, lo = _extremes(x)
    if np.isfinite(hi) and np.isfinite(lo):  # NaN propagates through max, Inf is an extreme
        return x, (hi, lo)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(x.astype(np.float64))
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    raise error("ENCODE_INPUT_INVALID", f"expected finite values, found {int(bad.sum())} NaN or Inf, the first at index {first}")


def _check_range(x: np.ndarray, dtype: str, ends: tuple[float, float]) -> None:
    # A value that rounds to Inf in the logical dtype can never be decoded back finitely.
    # Rounding is monotonic, so it is enough that the two extremes (``ends``) round finitely.
    with np.errstate(over="ignore"):
        rounded = np.array(ends, np.float64).astype(np_dtype(dtype))
    if np.isfinite(rounded).all():
        return
    with np.errstate(over="ignore"):
        bad = ~np.isfinite(x.astype(np.float64).astype(np_dtype(dtype)))
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    raise error("ENCODE_INPUT_INVALID", f"expected values within the range of dtype {dtype}, found {int(bad.sum())} that overflow it, the first at index {first}")
