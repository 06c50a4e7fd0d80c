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

from typing import Any, Callable

import numpy as np

from .. import tables
from ..errors import error
from ..qtensor import QTensor
from ._common import check_choice, np_dtype

Encoder = Callable[..., QTensor]

_REGISTRY: dict[str, Encoder] = {}
_INPUT_DTYPES = ("float16", "float32", "float64", "bfloat16")
_LOGICAL = ("float32", "float16", "bfloat16")


def register(scheme_id: str) -> Callable[[Encoder], Encoder]:
    """Decorator registering an encoder under ``scheme_id`` (which tables/schemes.json must list)."""

    def deco(fn: Encoder) -> Encoder:
        if scheme_id not in tables.schemes():
            raise KeyError(f"scheme id {scheme_id!r} is not listed in tables/schemes.json")
        if scheme_id in _REGISTRY:
            raise KeyError(f"scheme id {scheme_id!r} is registered twice")
        _REGISTRY[scheme_id] = fn
        return fn

    return deco


def ids() -> list[str]:
    """Registered scheme ids, sorted."""
    return sorted(_REGISTRY)


def get(scheme_id: str) -> Encoder:
    """The encoder of ``scheme_id``; SCHEME_UNKNOWN when none is registered."""
    fn = _REGISTRY.get(scheme_id) if isinstance(scheme_id, str) else None
    if fn is None:
        raise error("SCHEME_UNKNOWN", f"no encoder scheme {scheme_id!r}; registered schemes: {', '.join(ids())}", field="scheme")
    return fn


def quantize(array: Any, scheme: str, **params: Any) -> QTensor:
    """Encode ``array`` with ``scheme``; parameters as listed in tables/schemes.json.

    ``dtype`` (every scheme) is the logical dtype a reader decodes to: float32, float16 or
    bfloat16; default the input's dtype, float32 for float64 input.
    Raises SCHEME_UNKNOWN, ENCODE_PARAM_INVALID (unknown parameter or bad value) or
    ENCODE_INPUT_INVALID (not a real float array, NaN or Inf, or a value the logical dtype
    cannot hold).
    """
    fn = get(scheme)
    allowed = tables.schemes()[scheme]["parameters"]
    for name in params:
        if name not in allowed:
            raise error("ENCODE_PARAM_INVALID", f"scheme {scheme!r} has no parameter {name!r}; expected one of {', '.join(allowed)}", field=name)
    x = _check_input(array)
    dt = params.pop("dtype", None)
    if dt is None:
        dt = "float32" if x.dtype == np.float64 else x.dtype.name
    dt = check_choice("dtype", dt, _LOGICAL)
    _check_range(x, dt)
    return fn(x, dtype=dt, **params)


def _check_input(array: Any) -> np.ndarray:
    x = np.asarray(array)
    if x.dtype.name not in _INPUT_DTYPES:
        raise error("ENCODE_INPUT_INVALID", f"expected a real float array ({', '.join(_INPUT_DTYPES)}), found dtype {x.dtype}")
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(x.astype(np.float64))
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise error("ENCODE_INPUT_INVALID", f"expected finite values, found {int(bad.sum())} NaN or Inf, the first at index {first}")
    return x


def _check_range(x: np.ndarray, dtype: str) -> None:
    # A value that rounds to Inf in the logical dtype can never be decoded back finitely.
    with np.errstate(over="ignore"):
        bad = ~np.isfinite(x.astype(np.float64).astype(np_dtype(dtype)))
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise error("ENCODE_INPUT_INVALID", f"expected values within the range of dtype {dtype}, found {int(bad.sum())} that overflow it, the first at index {first}")


# The family modules register their ids on import (after register() exists).  A test checks
# that the registered ids are exactly the keys of tables/schemes.json.
from . import codebook, fp8, int_, mx, nf4, nvfp4  # noqa: E402,F401
