"""The registry of encoders by scheme id (the ids come from ``tables/schemes.json``).

The family modules register their encoders here on import; :mod:`qformat.schemes` imports them
all, so the registry is complete whenever the package is imported."""

from __future__ import annotations

from typing import Any, Callable

from .. import tables
from ..errors import error
from ..qtensor import QTensor

Encoder = Callable[..., QTensor]
#: (descriptor JSON, {local component name: (safetensors dtype, shape)}): what an encoder writes.
Planned = tuple[dict[str, Any], dict[str, tuple[str, tuple[int, ...]]]]
#: ``plan(shape, dtype, **params) -> Planned``: an encoder's output for a shape, without encoding.
Planner = Callable[..., Planned]

_REGISTRY: dict[str, Encoder] = {}
_PLANS: dict[str, Planner] = {}
_PROXY_ROWS: dict[str, int] = {}


def register(scheme_id: str, plan: Planner, proxy_row: int | None = None) -> Callable[[Encoder], Encoder]:
    """Decorator registering an encoder under ``scheme_id`` (which tables/schemes.json must
    list), with ``plan``: the same scheme's descriptor and component specs from a shape alone
    (``qformat quantize`` plans every file header before it encodes anything).  ``proxy_row``:
    the row length of the small array :func:`qformat.schemes.verify_plan` encodes, for a
    scheme that takes only rows of whole blocks (default 37, which leaves partial groups)."""

    def deco(fn: Encoder) -> Encoder:
        if scheme_id not in tables.schemes():
            raise KeyError(f"scheme id {scheme_id!r} is not listed in tables/schemes.json")
        if scheme_id in _REGISTRY:
            raise KeyError(f"scheme id {scheme_id!r} is registered twice")
        _REGISTRY[scheme_id] = fn
        _PLANS[scheme_id] = plan
        if proxy_row is not None:
            _PROXY_ROWS[scheme_id] = proxy_row
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


def get_plan(scheme_id: str) -> Planner:
    """The planner of ``scheme_id``; SCHEME_UNKNOWN when none is registered."""
    get(scheme_id)
    return _PLANS[scheme_id]


def proxy_row(scheme_id: str) -> int:
    """The row length :func:`qformat.schemes.verify_plan` gives ``scheme_id``'s proxy array."""
    return _PROXY_ROWS.get(scheme_id, 37)
