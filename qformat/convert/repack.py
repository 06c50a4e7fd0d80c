"""``--repack``: rewrite any valid descriptor into qformat's canonical layout, losslessly.

Canonical means what qformat's own encoders write (SPEC.md Appendix A): codes unpacked to
the logical code grid and packed again into bytes, LSB first, rows along the last logical
axis (no ``order``, ``slot_order``, ``planes``; a device layout is unpacked first); plain parameters stored in
the orientation of their grid (no ``order``); nested descriptors repacked the same way.
Elements, blocks, operations and parameter storage dtypes are kept, so every decoded value
is unchanged: only where the bits sit changes.  Component names become
``<logical>.codes``, ``<logical>.scale``, ``<logical>.scale.codes`` and so on.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..decode import full_region, read_codes
from ..descriptor import Descriptor, Param
from ..errors import error
from ..schemes._common import codes_entry, pack
from ..sources import Source


def repack(name: str, desc: Descriptor, src: Source) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(canonical descriptor JSON, its component arrays) for logical tensor ``name``."""
    arrays: dict[str, np.ndarray] = {}
    renamed: dict[str, str] = {}  # source name of a shared tensor (group index) -> new name
    out = _repack(name, desc, src, arrays, renamed)
    return out, arrays


def _repack(prefix: str, desc: Descriptor, src: Source, arrays: dict[str, np.ndarray], renamed: dict[str, str]) -> dict[str, Any]:
    if desc.layout != "canonical":
        # A device layout (SPEC.md §11) is a permutation of its canonical component: unpack it
        # exactly (NumPy reference, qformat.layouts) and repack the codes like any other.
        from ..layouts import canonical_view

        desc, src = canonical_view(desc, src)
    codes = read_codes(desc, src, full_region(desc.shape))
    el = desc.codes.element
    element = el.to_dict()
    if el.table_tensor is not None:
        element["table_tensor"] = _copy(src, el.table_tensor, f"{prefix}.table", arrays, renamed)
    codes_name = f"{prefix}.codes"
    arrays[codes_name] = pack(codes, el.bits)
    d: dict[str, Any] = {"shape": list(desc.shape), "dtype": desc.dtype, "codes": codes_entry(codes_name, element, len(desc.shape))}
    for p in desc.params():
        d[p.role] = _param(prefix, desc, p, src, arrays, renamed)
    if desc.allow_nonfinite_params:
        d["allow_nonfinite_params"] = True
    if desc.scheme is not None:
        d["scheme"] = desc.scheme
    if desc.extensions:
        d["extensions"] = [e.to_dict() for e in desc.extensions]
    return d


def _param(prefix: str, desc: Descriptor, p: Param, src: Source, arrays: dict[str, np.ndarray], renamed: dict[str, str]) -> dict[str, Any]:
    blocks = p.blocks.to_dict()
    if p.blocks.index is not None:
        blocks["index"]["tensor"] = _copy(src, p.blocks.index.tensor, f"{prefix}.group_index", arrays, renamed)
    out: dict[str, Any] = {"blocks": blocks}
    if p.op is not None:
        out["op"] = p.op
    pname = f"{prefix}.{p.role}"
    if p.encoded is not None:
        out["encoded"] = _repack(pname, p.encoded, src, arrays, renamed)
        return out
    assert p.tensor is not None
    grid = p.blocks.grid_shape(desc.shape)
    order = p.order or tuple(range(len(grid)))
    stored = np.asarray(src.array(p.tensor))
    permuted = tuple(grid[a] for a in order)
    values = stored.reshape(permuted).transpose(np.argsort(order)) if math.prod(grid) else np.zeros(grid, stored.dtype)
    arrays[pname] = np.ascontiguousarray(values)
    out["tensor"] = pname
    return out


def _copy(src: Source, name: str, new: str, arrays: dict[str, np.ndarray], renamed: dict[str, str]) -> str:
    if name in renamed:
        return renamed[name]
    arrays[new] = np.ascontiguousarray(src.array(name))
    renamed[name] = new
    return new
