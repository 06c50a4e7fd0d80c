"""Semantic validation of a schema-valid descriptor against its components (SPEC.md, "Validation").

The JSON Schema (:func:`qformat.descriptor.parse_descriptor`) has already checked structure;
this module checks everything that depends on the logical shape and on the stored component
tensors: element and packing parameters, device layouts, component dtypes and shapes, block
geometry and nested parameters.  It reads tensor *headers* only (dtype and shape through
:class:`~qformat.sources.Source.info`); payload checks (padding bits, group-index values, finite
scales) are :mod:`qformat.check`'s.
"""

from __future__ import annotations

import math
from typing import Callable

from . import layouts, tables
from .descriptor import LOGICAL_DTYPES, READER_VERSION, Descriptor, Param, codes_shape, extension_problems
from .errors import QFormatError, error
from .sources import Source

# Which storage dtypes may carry which role.
CONTAINER_DTYPES = {
    8: {"U8", "I8", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"},
    16: {"U16", "I16", "F16", "BF16"},
    32: {"U32", "I32", "F32"},
}
PARAM_DTYPES = {"F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "I8", "U8", "I16", "U16", "I32", "U32"}
INT_PARAM_DTYPES = {"I8", "U8", "I16", "U16", "I32", "U32"}
INDEX_DTYPES = {"I8", "U8", "I16", "U16", "I32", "U32", "I64"}
TABLE_DTYPES = {"F32", "F16", "BF16"}

Add = Callable[[str, str, str], None]


def validate_descriptor(name: str, desc: Descriptor, src: Source, depth: int = 0, newer: bool = False,
                        minor: int | None = None) -> list[QFormatError]:
    """Every semantic problem of ``desc`` against the components in ``src``, in check order.

    ``minor`` is the minor version the file declares (default: this reader's, or one above it
    when ``newer``): a device layout is known only in files of the version that defines it or
    later (SPEC.md §11).  Only component headers are read, never payload bytes.
    """
    if minor is None:
        minor = READER_VERSION[1] + (1 if newer else 0)
    probs: list[QFormatError] = []

    def add(code: str, field: str, msg: str) -> None:
        probs.append(error(code, msg, tensor=name, field=field))

    if not _shape_ok(desc, add):
        return probs
    if desc.dtype not in LOGICAL_DTYPES:
        add("DTYPE_INVALID", "dtype", f"expected one of {', '.join(LOGICAL_DTYPES)}, found {desc.dtype!r}")
    probs.extend(extension_problems(desc.extensions, newer, "tensor", tensor=name))
    probs.extend(layouts.problems(desc, minor, READER_VERSION[1], depth, tensor=name))  # SPEC.md §11
    if probs:
        return probs
    _element_problems(desc, src, add)
    _packing_problems(desc, add)
    if not probs:
        _codes_component_problems(desc, src, add)
    for prm in desc.params():
        probs.extend(_param_problems(name, desc, prm, src, depth, newer, minor))
    return probs


def _shape_ok(desc: Descriptor, add: Add) -> bool:
    lim = tables.limits()
    rank = len(desc.shape)
    if rank > lim["max_rank"]:
        add("SHAPE_INVALID", "shape", f"rank must be at most {lim['max_rank']}, found {rank}")
        return False
    if desc.numel >= 1 << 64:
        add("SHAPE_INVALID", "shape", f"the element count of shape {list(desc.shape)} reaches 2^64")
        return False
    from .sources import empty_shape_problem  # SPEC.md §2.2: an empty logical tensor must fit an array too

    msg = empty_shape_problem(tuple(desc.shape), 2 if desc.dtype in ("float16", "bfloat16") else 4, f"a logical {desc.dtype} tensor")
    if msg is not None:
        add("SHAPE_UNREPRESENTABLE", "shape", msg)
        return False
    return True


def _element_problems(desc: Descriptor, src: Source, add: Add) -> None:
    el = desc.codes.element
    for m in el.problems():
        add("ELEMENT_INVALID", "codes.element", m)
    if el.type != "codebook":
        return
    if el.table is not None:
        n = len(tables.codebooks()[el.table]["values_f32"])
        if n > (1 << el.bits):
            add("CODEBOOK_INVALID", "codes.element.table", f"table {el.table!r} has {n} entries, more than 2^{el.bits}")
        return
    info = src.info(el.table_tensor or "")
    if info is None:
        add("COMPONENT_MISSING", "codes.element.table_tensor", f"no tensor named {el.table_tensor!r} in the file")
    elif info.dtype not in TABLE_DTYPES:
        add("CODEBOOK_INVALID", "codes.element.table_tensor", f"table dtype must be one of {sorted(TABLE_DTYPES)}, found {info.dtype}")
    elif len(info.shape) != 1 or not 1 <= info.shape[0] <= (1 << el.bits):
        add("CODEBOOK_INVALID", "codes.element.table_tensor", f"table must be 1-D with 1..{1 << el.bits} entries, found shape {list(info.shape)}")


def _packing_problems(desc: Descriptor, add: Add) -> None:
    p, rank = desc.codes.packing, len(desc.shape)
    for m in p.problems(desc.codes.element.bits):
        add("PACKING_INVALID", "codes.packing", m)
    if not is_permutation(p.order, rank):
        add("PACKING_INVALID", "codes.packing.order", f"expected a permutation of 0..{rank - 1}, found {list(p.order or ())}")
    if p.axis is None:
        return
    if rank == 0:
        add("PACKING_INVALID", "codes.packing.axis", "a rank-0 tensor must be packed with axis null")
    elif p.axis >= rank:
        add("PACKING_INVALID", "codes.packing.axis", f"expected a storage axis below {rank}, found {p.axis}")


def _codes_component_problems(desc: Descriptor, src: Source, add: Add) -> None:
    """The codes component's dtype and shape (SPEC.md §7.4; a device layout's own shape, §11)."""
    codes, el, p = desc.codes, desc.codes.element, desc.codes.packing
    info = src.info(codes.tensor)
    if info is None:
        add("COMPONENT_MISSING", "codes.tensor", f"no tensor named {codes.tensor!r} in the file")
        return
    if info.dtype not in CONTAINER_DTYPES[p.container]:
        add("COMPONENT_DTYPE", "codes.tensor", f"a {p.container}-bit container needs one of {sorted(CONTAINER_DTYPES[p.container])}, found {info.dtype}")
    geo = codes_shape(desc)
    if desc.layout != layouts.CANONICAL:
        want_dev = layouts.codes_component_shape(desc)
        if info.shape != want_dev:
            add("COMPONENT_SHAPE", "codes.tensor", f"layout {desc.layout!r} stores the codes as {list(want_dev)}, found {list(info.shape)}")
    elif p.axis is None:
        if math.prod(info.shape) != geo.words_per_row:
            add("COMPONENT_SHAPE", "codes.tensor", f"expected {geo.words_per_row} containers in all for {desc.numel} codes of {el.bits} bits, found shape {list(info.shape)} ({math.prod(info.shape)})")
    else:
        want = geo.stored_shape[: p.axis] + (geo.words_per_row,) + geo.stored_shape[p.axis + 1 :]
        if info.shape != want:
            add("COMPONENT_SHAPE", "codes.tensor", f"expected shape {list(want)} ({geo.words_per_row} containers per row of {geo.row_length} {el.bits}-bit codes), found {list(info.shape)}")


def is_permutation(order: tuple[int, ...] | None, rank: int) -> bool:
    """True for ``None`` (natural order) or a permutation of ``0..rank-1``."""
    return order is None or sorted(order) == list(range(rank))


def _squeeze(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(s for s in shape if s != 1)


def _param_problems(name: str, desc: Descriptor, prm: Param, src: Source, depth: int, newer: bool,
                    minor: int | None) -> list[QFormatError]:
    """Problems of one parameter: its blocks, then its tensor or its nested descriptor."""
    probs: list[QFormatError] = []

    def add(code: str, field: str, msg: str) -> None:
        probs.append(error(code, msg, tensor=name, field=field))

    _blocks_problems(desc, prm, src, add)
    if probs:
        return probs
    if prm.tensor is not None:
        _param_tensor_problems(desc, prm, src, add)
        return probs
    return _encoded_problems(name, desc, prm, src, depth, newer, minor)


def _blocks_problems(desc: Descriptor, prm: Param, src: Source, add: Add) -> None:
    b, role, rank = prm.blocks, prm.role, len(desc.shape)
    if b.type != "grid":
        return
    if len(b.size) != rank:  # type: ignore[arg-type]
        add("BLOCKS_INVALID", f"{role}.blocks.size", f"expected {rank} entries (one per logical axis), found {len(b.size)}")  # type: ignore[arg-type]
        return
    gi = b.index
    if gi is None:
        return
    if gi.axis >= rank:
        add("BLOCKS_INVALID", f"{role}.blocks.index.axis", f"expected an axis below {rank}, found {gi.axis}")
        return
    if b.size[gi.axis] is not None:  # type: ignore[index]
        add("BLOCKS_INVALID", f"{role}.blocks.size", f"the indexed axis {gi.axis} must have size null, found {b.size[gi.axis]}")  # type: ignore[index]
    info = src.info(gi.tensor)
    if info is None:
        add("COMPONENT_MISSING", f"{role}.blocks.index.tensor", f"no tensor named {gi.tensor!r} in the file")
    elif info.dtype not in INDEX_DTYPES:
        add("COMPONENT_DTYPE", f"{role}.blocks.index.tensor", f"a group index needs an integer dtype, found {info.dtype}")
    elif info.shape != (desc.shape[gi.axis],):
        add("COMPONENT_SHAPE", f"{role}.blocks.index.tensor", f"expected shape [{desc.shape[gi.axis]}], found {list(info.shape)}")


def _param_tensor_problems(desc: Descriptor, prm: Param, src: Source, add: Add) -> None:
    role = prm.role
    grid = prm.blocks.grid_shape(desc.shape)
    if not is_permutation(prm.order, len(grid)):
        add("BLOCKS_INVALID", f"{role}.order", f"expected a permutation of 0..{len(grid) - 1}, found {list(prm.order or ())}")
        return
    info = src.info(prm.tensor or "")
    if info is None:
        add("COMPONENT_MISSING", f"{role}.tensor", f"no tensor named {prm.tensor!r} in the file")
        return
    if info.dtype not in PARAM_DTYPES:
        add("COMPONENT_DTYPE", f"{role}.tensor", f"a parameter needs one of {sorted(PARAM_DTYPES)}, found {info.dtype}")
    stored = prm.stored_grid_shape(desc.shape)
    if _squeeze(info.shape) != _squeeze(stored) or math.prod(info.shape) != math.prod(stored):
        add("COMPONENT_SHAPE", f"{role}.tensor", f"expected the parameter grid {list(stored)} (size-1 axes may be dropped or added), found {list(info.shape)}")


def _encoded_problems(name: str, desc: Descriptor, prm: Param, src: Source, depth: int, newer: bool,
                      minor: int | None) -> list[QFormatError]:
    role, enc = prm.role, prm.encoded
    if enc is None:  # the schema requires exactly one of tensor / encoded
        raise error("SCHEMA_VIOLATION", f"parameter {role!r} has neither 'tensor' nor 'encoded'", tensor=name, field=role)
    limit = tables.limits()["max_nesting_depth"]
    if depth + 1 > limit:
        return [error("DEPTH_EXCEEDED", f"nesting depth {depth + 1} exceeds the limit {limit}", tensor=name, field=f"{role}.encoded")]
    grid = prm.blocks.grid_shape(desc.shape)
    if enc.shape != grid:
        return [error("SHAPE_INVALID", f"an encoded parameter's shape must equal its grid {list(grid)}, found {list(enc.shape)}", tensor=name, field=f"{role}.encoded.shape")]
    out = []
    for p in validate_descriptor(name, enc, src, depth + 1, newer, minor):
        field = f"{role}.encoded.{p.field}" if p.field else f"{role}.encoded"
        out.append(error(p.code, p.message, tensor=name, field=field))
    return out
