"""Named device layouts (SPEC.md §11): validation, and exact conversion to and from canonical.

A device layout rearranges a descriptor's codes component (and, for ``marlin_dense``, its
scale component) into the order a kernel reads.  Every defined layout is a permutation of the
*canonical component*: the codes component that the same descriptor describes with layout
``canonical`` (a 32-bit ``lsb_first`` packing along ``K``).  So a reader unpacks the device
tensor to canonical words first and then decodes by SPEC.md §7-§10 unchanged
(:func:`canonical_view`); a writer packs the other way (:func:`to_layout`).

One module per layout: :mod:`.tinygemm` (``tinygemm_int4_cuda``), :mod:`.marlin`
(``marlin_dense``).  ``tinygemm_int4_cpu`` has no module on purpose: torch's CPU int4 packing
depends on the CPU's instruction set, so files never hold it (``LAYOUT_FORBIDDEN``); a runtime
produces it at load time from canonical codes with torch's own operator.

Only NumPy here: the core never depends on a framework's private packing functions.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from .. import tables
from ..errors import QFormatError, error
from ..packing import Packing, pack_rows, unpack_rows
from . import marlin, tinygemm

CANONICAL = "canonical"
#: The packing of the canonical component of every defined device layout (SPEC.md §11.2).
CANONICAL_PACKING = {"container": 32, "bit_order": "lsb_first", "axis": 1}


def _minor(version: str) -> int:
    return int(version.split(".")[1])


def known(name: str, minor: int) -> bool:
    """True when ``name`` is a layout of a file declaring version ``1.minor``."""
    info = tables.layouts().get(name)
    return info is not None and _minor(info["since"]) <= minor


def since(name: str) -> str:
    """The first specification version that defines layout ``name``."""
    return str(tables.layouts()[name]["since"])


# -- validation ----------------------------------------------------------------------------
def _is_int(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and float(v).is_integer()


def problems(desc: Any, minor: int, reader_minor: int, depth: int = 0, tensor: str | None = None) -> list[QFormatError]:
    """Layout problems of a schema-valid :class:`~qformat.descriptor.Descriptor` (SPEC.md §11).

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
    for p in sorted(set(params) - set(allowed)):
        add(bad_code, f"layout.parameters.{p}", f"layout {name!r} accepts parameters {sorted(allowed)}, found unknown {p!r}")
    for p, values in allowed.items():
        if p not in params:
            add("LAYOUT_INVALID", f"layout.parameters.{p}", f"layout {name!r} requires parameter {p!r}, one of {values}")
        elif not _is_int(params[p]) or int(params[p]) not in values:
            add(bad_code, f"layout.parameters.{p}", f"expected one of {values}, found {params[p]!r}")
    if out or name == CANONICAL:
        return out
    if depth > 0:
        add("LAYOUT_MISMATCH", "layout.name", f"device layout {name!r} is allowed only in a top-level descriptor, found one at depth {depth}")
        return out
    if len(desc.shape) != 2:
        add("LAYOUT_SHAPE", "shape", f"layout {name!r} needs a rank-2 logical weight [N, K], found shape {list(desc.shape)}")
        return out
    n, k = desc.shape
    el = desc.codes.element
    bits_ok = (4,) if name == tinygemm.NAME else marlin.BITS
    if el.type != "int" or el.bits not in bits_ok or el.signedness != "offset_binary" or el.code_offset or el.frac_bits:
        add("LAYOUT_MISMATCH", "codes.element", f"layout {name!r} needs an int element of {' or '.join(map(str, bits_ok))} bits, offset_binary, without code_offset or frac_bits, found {el.to_dict()}")
    p = desc.codes.packing
    if p.container != 32 or p.bit_order != "lsb_first" or p.axis != 1 or p.order not in (None, (0, 1)) or p.slot_order is not None or p.planes_span is not None or p.row_alignment != 1:
        add("LAYOUT_MISMATCH", "codes.packing", f"layout {name!r} needs the canonical packing {CANONICAL_PACKING} (no order, slot_order, planes or row_alignment), found {p.to_dict()}")
    if name == tinygemm.NAME:
        t = int(params["inner_k_tiles"])
        if n % tinygemm.N_TILE or k % (t * tinygemm.K_TILE):
            add("LAYOUT_SHAPE", "shape", f"layout {name!r} with inner_k_tiles {t} needs N a multiple of 8 and K a multiple of {t * 16}, found [N, K] = {[n, k]}")
        out.extend(_param_problems(desc, name, k, tinygemm.GROUP_SIZES, per_channel=False, bias=True, tensor=tensor))
    else:
        if k % marlin.K_MULTIPLE or n % marlin.N_MULTIPLE:
            add("LAYOUT_SHAPE", "shape", f"layout {name!r} needs K a multiple of {marlin.K_MULTIPLE} and N a multiple of {marlin.N_MULTIPLE}, found [N, K] = {[n, k]}")
        out.extend(_param_problems(desc, name, k, marlin.GROUP_SIZES, per_channel=True, bias=False, tensor=tensor))
    return out


def _param_problems(desc: Any, name: str, k: int, sizes: tuple[int, ...], per_channel: bool, bias: bool,
                    tensor: str | None) -> list[QFormatError]:
    out: list[QFormatError] = []

    def add(code: str, field: str, msg: str) -> None:
        out.append(error(code, msg, tensor=tensor, field=field))

    if desc.zero is not None:
        add("LAYOUT_MISMATCH", "zero", f"layout {name!r} has no zero point (its codes are offset_binary); found a 'zero' parameter")
    if not bias and desc.bias is not None:
        add("LAYOUT_MISMATCH", "bias", f"layout {name!r} has no bias; found a 'bias' parameter")
    want_ops = (("scale", "multiply"),) + ((("bias", "add"),) if bias else ())
    s = desc.scale
    if s is None:
        add("LAYOUT_MISMATCH", "scale", f"layout {name!r} needs a 'scale' parameter")
        return out
    for role, op in want_ops:
        prm = getattr(desc, role)
        if prm is None:
            continue
        b = prm.blocks
        if prm.tensor is None or prm.op != op or b.type != "grid" or b.index is not None or len(b.size) != 2 or b.size[0] != 1:  # type: ignore[arg-type]
            add("LAYOUT_MISMATCH", role, f"layout {name!r} needs '{role}' as a plain tensor with op {op!r} and grid blocks [1, G] without a group index, found {prm.to_dict()}")
            continue
        if name == marlin.NAME and prm.order != (1, 0):
            add("LAYOUT_MISMATCH", f"{role}.order", f"layout {name!r} stores the scale as [K/G, N]: 'order' must be [1, 0], found {list(prm.order) if prm.order else None}")
        g = b.size[1]  # type: ignore[index]
        ok = (g is None or g >= k) if per_channel else False
        if not ok and not (g in sizes and k % g == 0):
            allowed = (["null"] if per_channel else []) + [str(x) for x in sizes]
            add("LAYOUT_GROUP_SIZE", f"{role}.blocks.size", f"layout {name!r} allows a group size along K of {', '.join(allowed)} (dividing K = {k}), found {g}")
    if bias and desc.bias is not None and desc.bias.blocks.to_dict() != s.blocks.to_dict():
        add("LAYOUT_MISMATCH", "bias.blocks", f"layout {name!r} stores scale and bias as pairs: their blocks must be equal, found {s.blocks.to_dict()} and {desc.bias.blocks.to_dict()}")
    return out


def codes_component_shape(desc: Any) -> tuple[int, ...]:
    """The exact shape of a device layout's codes component (replaces SPEC.md §7.4)."""
    n, k = desc.shape
    if desc.layout == tinygemm.NAME:
        return tinygemm.device_shape(n, k, int(desc.layout_parameters["inner_k_tiles"]))
    return marlin.device_shape(n, k, desc.codes.element.bits)


# -- conversion ----------------------------------------------------------------------------
def _packing(desc: Any) -> Packing:
    return Packing.from_dict(CANONICAL_PACKING)


def _marlin_group(desc: Any) -> int | None:
    return desc.scale.blocks.size[1]


def canonical_arrays(desc: Any, get: Callable[[str], np.ndarray]) -> dict[str, np.ndarray]:
    """Canonical versions of the components a device layout rearranges: name -> array, with the
    stored dtype kept (the codes as canonical 32-bit words ``[N, K*b/32]``, Marlin's scale in
    natural order).  ``get(name)`` returns a stored component."""
    n, k = desc.shape
    bits = desc.codes.element.bits
    raw = np.asarray(get(desc.codes.tensor))
    if desc.layout == tinygemm.NAME:
        codes = tinygemm.unpack(raw, n, k, int(desc.layout_parameters["inner_k_tiles"]))
    elif desc.layout == marlin.NAME:
        codes = marlin.unpack(raw, n, k, bits)
    else:
        raise error("LAYOUT_UNKNOWN", f"no conversion for layout {desc.layout!r}", field="layout.name")
    out = {desc.codes.tensor: pack_rows(codes, bits, _packing(desc)).view(raw.dtype)}
    if desc.layout == marlin.NAME:
        s = np.asarray(get(desc.scale.tensor))
        out[desc.scale.tensor] = marlin.unpermute_scales(s, _marlin_group(desc), k)
    return out


class _Overlay:
    """A source whose listed components are replaced by canonical arrays."""

    def __init__(self, src: Any, arrays: Mapping[str, np.ndarray]):
        self._src, self._arrays = src, dict(arrays)

    def info(self, name: str) -> Any:
        return self._src.info(name)  # same dtype; a codes component's shape is never asked again

    def array(self, name: str) -> np.ndarray:
        a = self._arrays.get(name)
        return a if a is not None else self._src.array(name)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._src, attr)


def canonical_view(desc: Any, src: Any) -> tuple[Any, Any]:
    """(the descriptor with layout ``canonical``, a source holding canonical components) for a
    validated descriptor in a device layout; unchanged for ``canonical``."""
    if desc.layout == CANONICAL:
        return desc, src
    arrays = canonical_arrays(desc, src.array)
    return dataclasses.replace(desc, layout=CANONICAL, layout_parameters={}), _Overlay(src, arrays)


def to_canonical(descriptor: Mapping[str, Any], components: Mapping[str, np.ndarray]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A descriptor dict in a device layout and its components -> the same tensor in layout
    ``canonical`` (component names and dtypes kept, bit-exact: the decoded values are equal)."""
    from ..descriptor import Descriptor

    d = dict(descriptor)
    desc = Descriptor.from_dict(d)
    if desc.layout == CANONICAL:
        return d, dict(components)
    comps = dict(components)
    comps.update(canonical_arrays(desc, lambda nm: comps[nm]))
    d.pop("layout", None)
    return d, comps


def to_layout(descriptor: Mapping[str, Any], components: Mapping[str, np.ndarray], name: str,
              parameters: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A valid descriptor dict in layout ``canonical`` (any packing) -> the same tensor in device
    layout ``name``: the codes repacked into the device tensor (``U32`` words keep a 32-bit
    storage dtype of the source; otherwise ``I32``), the scale (and bias) stored ``[K/G, N]``
    with ``order`` ``[1, 0]`` (Marlin: permuted).  Raises the layout's error code when the
    descriptor does not meet the layout's constraints."""
    from ..decode import full_region, read_codes
    from ..descriptor import Descriptor, parse_descriptor
    from ..sources import ArraySource

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
        if role in new and "tensor" in new[role]:
            prm = getattr(desc, role)
            grid = prm.blocks.grid_shape(desc.shape)
            stored = tuple(grid[a] for a in prm.order) if prm.order else grid
            v = np.asarray(comps[prm.tensor]).reshape(stored)
            if prm.order:
                v = v.transpose(np.argsort(prm.order))
            comps[prm.tensor] = np.ascontiguousarray(v.T) if v.ndim == 2 else v
            new[role] = dict(new[role], order=[1, 0])
    target = Descriptor.from_dict(new)
    probs = problems(target, minor=_minor(since(name)), reader_minor=_minor(since(name)), tensor=None)
    if probs:
        raise probs[0]
    codes = read_codes(desc, src, full_region(desc.shape))
    if flip:
        codes = codes ^ np.uint8(1 << (el.bits - 1))
    n, k = desc.shape
    bits = desc.codes.element.bits
    old = np.asarray(components[desc.codes.tensor])
    wdt = old.dtype if old.dtype.itemsize == 4 else np.dtype("<i4")
    if name == tinygemm.NAME:
        dev = tinygemm.pack(codes, int(params["inner_k_tiles"]))
    else:
        dev = marlin.pack(codes, bits)
        s = comps[target.scale.tensor]  # type: ignore[union-attr]
        comps[target.scale.tensor] = marlin.permute_scales(s, target.scale.blocks.size[1], k)  # type: ignore[union-attr,index]
    comps[desc.codes.tensor] = dev.view(wdt)
    return new, comps


def required_version(descriptors: Iterable[Any]) -> str:
    """The lowest specification version whose features these descriptors use (SPEC.md §17.1):
    ``"1.1"`` when any of them (nested ones included) names a layout of 1.1, else ``"1.0"``."""
    best = 0
    stack = list(descriptors)
    while stack:
        d = stack.pop()
        if hasattr(d, "to_dict"):
            d = d.to_dict()
        if not isinstance(d, Mapping):
            continue
        lay = d.get("layout")
        if isinstance(lay, Mapping) and lay.get("name") in tables.layouts():
            best = max(best, _minor(since(str(lay["name"]))))
        for role in ("zero", "scale", "bias"):
            p = d.get(role)
            if isinstance(p, Mapping) and isinstance(p.get("encoded"), Mapping):
                stack.append(p["encoded"])
    return f"1.{best}"


# -- index maps (for readers that gather, e.g. the JAX reader) -----------------------------
def code_positions(desc: Any) -> np.ndarray:
    """For a validated device-layout descriptor: ``pos[n, k]``, the position of code
    ``q[n, k]`` in the device tensor, counted in fields: word ``pos // P`` (row-major flat
    index of the codes component), field ``pos % P`` (bits ``b*field ..``), ``P = 32 / b``."""
    n, k = desc.shape
    pos = np.empty(n * k, np.int64)
    if desc.layout == tinygemm.NAME:
        nn, kk = tinygemm._index(n, k, int(desc.layout_parameters["inner_k_tiles"]))
        pos[nn * k + kk] = np.arange(nn.size)
    else:
        a = np.arange(n * k, dtype=np.int64).reshape(n, k)
        t = a.T.reshape(k // marlin.TILE, marlin.TILE, n // marlin.TILE, marlin.TILE).transpose(0, 2, 1, 3).reshape(k // marlin.TILE, n * marlin.TILE)
        perm = marlin.weight_perm(desc.codes.element.bits)
        r = t.reshape(-1, perm.size)[:, perm].reshape(-1)
        pos[r] = np.arange(r.size)
    return pos.reshape(n, k)


def scale_gather(desc: Any) -> np.ndarray | None:
    """For ``marlin_dense``: ``g`` with ``canonical_flat = stored_flat[g]`` for the scale
    component (row-major flat order); ``None`` for layouts that store parameters canonically."""
    if desc.layout != marlin.NAME:
        return None
    n, k = desc.shape
    count = int(np.prod(desc.scale.blocks.grid_shape(desc.shape)))
    return marlin.permute_scales(np.arange(count, dtype=np.int64), _marlin_group(desc), k).argsort()
