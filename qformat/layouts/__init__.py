"""Named device layouts (SPEC.md §11): validation, and exact conversion to and from canonical.

A device layout rearranges a descriptor's codes component (and, for ``marlin_dense``, its
scale component) into the order a kernel reads.  Every defined layout is a permutation of the
*canonical component*: the codes component that the same descriptor describes with layout
``canonical`` (a 32-bit ``lsb_first`` packing along ``K``).  So a reader unpacks the device
tensor to canonical words first and then decodes by SPEC.md §7-§10 unchanged
(:func:`canonical_view`); a writer packs the other way (:func:`to_layout`).

One module per layout, each registering a :class:`~.base.DeviceLayout` under its stable name
(:mod:`.base`): :mod:`.tinygemm` (``tinygemm_int4_cuda``), :mod:`.marlin` (``marlin_dense``).
This package adds what is common to every layout: the name and parameter checks against
``tables/layouts.json``, and the conversions through the registered layout.  ``tinygemm_int4_cpu`` has no module on purpose: torch's CPU int4 packing
depends on the CPU's instruction set, so files never hold it (``LAYOUT_FORBIDDEN``); a runtime
produces it at load time from canonical codes with torch's own operator.

Only NumPy here: the core never depends on a framework's private packing functions.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from .. import tables
from ..descriptor import Descriptor, parse_descriptor
from ..errors import QFormatError, error, raise_first
from ..packing import Packing, pack_rows
from ..regions import full_region, grid_array, read_codes
from ..sources import ArraySource, Source, TensorInfo
from . import marlin, tinygemm
from .base import CANONICAL_PACKING, DeviceLayout, registered

CANONICAL = "canonical"

__all__ = ["CANONICAL", "CANONICAL_PACKING", "DeviceLayout", "canonical_arrays", "canonical_view", "code_positions",
           "codes_component_shape", "known", "layout_of", "marlin", "problems", "registered", "required_version",
           "scale_gather", "since", "tinygemm", "to_canonical", "to_layout"]


def _minor(version: str) -> int:
    return int(version.split(".")[1])


def known(name: str, minor: int) -> bool:
    """True when ``name`` is a layout of a file declaring version ``1.minor``."""
    info = tables.layouts().get(name)
    return info is not None and _minor(info["since"]) <= minor


def since(name: str) -> str:
    """The first specification version that defines layout ``name``."""
    return str(tables.layouts()[name]["since"])


def layout_of(desc: Descriptor) -> DeviceLayout:
    """The registered :class:`DeviceLayout` of a descriptor in a defined device layout."""
    lay = registered().get(desc.layout)
    if lay is None:
        raise error("LAYOUT_UNKNOWN", f"no conversion for layout {desc.layout!r}", field="layout.name")
    return lay


# -- validation ----------------------------------------------------------------------------
def _is_int(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and float(v).is_integer()


def problems(desc: Descriptor, minor: int, reader_minor: int, depth: int = 0, tensor: str | None = None) -> list[QFormatError]:
    """Layout problems of a schema-valid descriptor (SPEC.md §11).

    ``minor`` is the file's declared minor version, ``reader_minor`` this reader's.  Checks the
    name, the parameters, then (for a defined device layout) everything the layout requires of
    the descriptor except the component shapes, which :func:`codes_component_shape` gives.
    """
    out: list[QFormatError] = []

    def add(code: str, field: str, msg: str) -> None:
        out.append(error(code, msg, tensor=tensor, field=field))

    name, params = desc.layout, dict(desc.layout_parameters)
    info = tables.layouts().get(name)
    if info is None or _minor(info["since"]) > minor:
        extra = f" (it is defined from version {info['since']}; the file declares 1.{minor})" if info else ""
        add("LAYOUT_UNKNOWN", "layout.name", f"expected a layout of version 1.{minor} such as {sorted(n for n in tables.layouts() if known(n, minor))}, found {name!r}{extra}")
        return out
    if info["status"] == "forbidden":
        add("LAYOUT_FORBIDDEN", "layout.name", f"layout {name!r} is not portable (its bytes depend on the machine that wrote them); store the canonical codes instead")
        return out
    allowed: Mapping[str, list[Any]] = info["parameters"]
    bad_code = "FEATURE_UNSUPPORTED" if minor > reader_minor else "LAYOUT_INVALID"
    if not allowed and params:
        add(bad_code, "layout.parameters", f"layout {name!r} takes no parameters, found {sorted(params)}")
        return out
    # SPEC.md §11.1 (1.2.1): a missing required argument first (an error in every minor), then
    # unknown arguments and values outside the list (FEATURE_UNSUPPORTED in a newer minor)
    for p, values in allowed.items():
        if p not in params:
            add("LAYOUT_INVALID", f"layout.parameters.{p}", f"layout {name!r} requires parameter {p!r}, one of {values}")
    for p in sorted(set(params) - set(allowed)):
        add(bad_code, f"layout.parameters.{p}", f"layout {name!r} accepts parameters {sorted(allowed)}, found unknown {p!r}")
    for p, values in allowed.items():
        if p in params and (not _is_int(params[p]) or int(params[p]) not in values):
            add(bad_code, f"layout.parameters.{p}", f"expected one of {values}, found {params[p]!r}")
    if out or name == CANONICAL:
        return out
    if depth > 0:
        add("LAYOUT_MISMATCH", "layout.name", f"device layout {name!r} is allowed only in a top-level descriptor, found one at depth {depth}")
        return out
    if len(desc.shape) != 2:
        add("LAYOUT_SHAPE", "shape", f"layout {name!r} needs a rank-2 logical weight [N, K], found shape {list(desc.shape)}")
        return out
    layout_of(desc).problems(desc, add)
    return out


def codes_component_shape(desc: Descriptor) -> tuple[int, ...]:
    """The exact shape of a device layout's codes component (replaces SPEC.md §7.4)."""
    return layout_of(desc).device_shape(desc)


# -- conversion ----------------------------------------------------------------------------
def canonical_arrays(desc: Descriptor, get: Callable[[str], np.ndarray]) -> dict[str, np.ndarray]:
    """Canonical versions of the components a device layout rearranges: name -> array, with the
    stored dtype kept (the codes as canonical 32-bit words ``[N, K*b/32]``, a permuted scale in
    natural order).  ``get(name)`` returns a stored component."""
    lay = layout_of(desc)
    raw = np.asarray(get(desc.codes.tensor))
    codes = lay.unpack(desc, raw)
    out = {desc.codes.tensor: pack_rows(codes, desc.codes.element.bits, Packing.from_dict(CANONICAL_PACKING)).view(raw.dtype)}
    if desc.scale is not None and desc.scale.tensor is not None:
        natural = lay.scale_to_canonical(desc, np.asarray(get(desc.scale.tensor)))
        if natural is not None:
            out[desc.scale.tensor] = natural
    return out


class CanonicalSource:
    """A source whose device-layout components are replaced by their canonical arrays."""

    def __init__(self, src: Source, arrays: Mapping[str, np.ndarray]):
        self.inner, self.arrays = src, dict(arrays)

    def info(self, name: str) -> TensorInfo | None:
        return self.inner.info(name)  # same dtype; a codes component's shape is never asked again

    def array(self, name: str) -> np.ndarray:
        a = self.arrays.get(name)
        return a if a is not None else self.inner.array(name)

    def __getattr__(self, attr: str) -> Any:  # the inner source's extras (path, release hooks)
        return getattr(self.inner, attr)


def canonical_view(desc: Descriptor, src: Source) -> tuple[Descriptor, Source]:
    """(the descriptor with layout ``canonical``, a source holding canonical components) for a
    validated descriptor in a device layout; both unchanged for ``canonical``.  Every reader
    calls this once per tensor, before planning any read (SPEC.md §11.1)."""
    if desc.layout == CANONICAL:
        return desc, src
    arrays = canonical_arrays(desc, src.array)
    return dataclasses.replace(desc, layout=CANONICAL, layout_parameters={}), CanonicalSource(src, arrays)


def to_canonical(descriptor: Mapping[str, Any], components: Mapping[str, np.ndarray]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A descriptor dict in a device layout and its components -> the same tensor in layout
    ``canonical`` (component names and dtypes kept, bit-exact: the decoded values are equal)."""
    raw = dict(descriptor)
    desc = Descriptor.from_dict(raw)
    if desc.layout == CANONICAL:
        return raw, dict(components)
    comps = dict(components)
    comps.update(canonical_arrays(desc, lambda nm: comps[nm]))
    raw.pop("layout", None)
    return raw, comps


def to_layout(descriptor: Mapping[str, Any], components: Mapping[str, np.ndarray], name: str,
              parameters: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A valid descriptor dict in layout ``canonical`` (any packing) -> the same tensor in device
    layout ``name``: the codes repacked into the device tensor (``U32`` words keep a 32-bit
    storage dtype of the source; otherwise ``I32``), the scale (and bias) stored ``[K/G, N]``
    with ``order`` ``[1, 0]`` (permuted where the layout permutes it).  Raises the layout's error
    code when the descriptor does not meet the layout's constraints."""
    src = ArraySource(components)
    desc = parse_descriptor("", dict(descriptor))
    if desc.layout != CANONICAL:
        raise error("LAYOUT_MISMATCH", f"to_layout expects a canonical descriptor, found layout {desc.layout!r}", field="layout.name")
    params = dict(parameters or {})
    new = dict(descriptor)
    new["codes"] = dict(new["codes"], packing=dict(CANONICAL_PACKING))
    el = desc.codes.element
    # two's complement and offset-binary codes of the same width hold the same values with the
    # top bit flipped (SPEC.md §6.2), so symmetric encoders' codes convert exactly.
    flip = el.type == "int" and el.signedness == "twos_complement" and not el.code_offset and not el.frac_bits
    if flip:
        new["codes"]["element"] = dict(new["codes"]["element"], signedness="offset_binary")
    new["layout"] = {"name": name, "parameters": params}
    comps = dict(components)
    for role in ("scale", "bias"):
        prm = getattr(desc, role)
        if prm is not None and prm.tensor is not None:
            v = grid_array(prm, desc, src)
            comps[prm.tensor] = np.ascontiguousarray(v.T) if v.ndim == 2 else v
            new[role] = dict(new[role], order=[1, 0])
    target = Descriptor.from_dict(new)
    raise_first(problems(target, minor=_minor(since(name)), reader_minor=_minor(since(name)), tensor=None))
    lay = layout_of(target)
    codes = read_codes(desc, src, full_region(desc.shape))
    if flip:
        codes = codes ^ np.uint8(1 << (el.bits - 1))
    old = np.asarray(components[desc.codes.tensor])
    wdt = old.dtype if old.dtype.itemsize == 4 else np.dtype("<i4")
    scale = target.scale
    if scale is not None and scale.tensor is not None:
        permuted = lay.scale_from_canonical(target, comps[scale.tensor])
        if permuted is not None:
            comps[scale.tensor] = permuted
    comps[desc.codes.tensor] = lay.pack(target, codes).view(wdt)
    return new, comps


def required_version(descriptors: Iterable[Any]) -> str:
    """The lowest specification version whose features these descriptors use (SPEC.md §17.1):
    ``"1.1"`` when any of them (nested ones included) names a layout of 1.1, else ``"1.0"``."""
    best = 0
    stack = list(descriptors)
    while stack:
        raw = stack.pop()
        if hasattr(raw, "to_dict"):
            raw = raw.to_dict()
        if not isinstance(raw, Mapping):
            continue
        lay = raw.get("layout")
        if isinstance(lay, Mapping) and lay.get("name") in tables.layouts():
            best = max(best, _minor(since(str(lay["name"]))))
        for role in ("zero", "scale", "bias"):
            p = raw.get(role)
            if isinstance(p, Mapping) and isinstance(p.get("encoded"), Mapping):
                stack.append(p["encoded"])
    return f"1.{best}"


# -- index maps (for readers that gather, e.g. the JAX reader) -----------------------------
def code_positions(desc: Descriptor) -> np.ndarray:
    """For a validated device-layout descriptor: ``pos[n, k]``, the position of code
    ``q[n, k]`` in the device tensor, counted in fields: word ``pos // P`` (row-major flat
    index of the codes component), field ``pos % P`` (bits ``b*field ..``), ``P = 32 / b``."""
    return layout_of(desc).code_positions(desc)


def scale_gather(desc: Descriptor) -> np.ndarray | None:
    """``g`` with ``canonical_flat = stored_flat[g]`` for the scale component (row-major flat
    order); ``None`` for layouts that store parameters canonically."""
    return layout_of(desc).scale_gather(desc)
