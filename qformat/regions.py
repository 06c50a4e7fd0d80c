"""Read plans: which stored bytes and parameter cells a region of a logical tensor needs.

A *region* is a box of the logical tensor, one ``(start, stop)`` pair per axis.  Decoding a
region takes three kinds of stored data: the packed words holding its codes, the element's
lookup table, and for each parameter (zero point, scale, bias) the cells of its grid that cover
the region.  This module answers "which, and how to cut them out" once, in plain integers and
NumPy index arrays, so that every decoder (the NumPy reference in :mod:`qformat.decode`, the
torch and JAX readers) only applies the plan with its own framework's operations:

* :func:`plan_codes` -> :class:`CodesRead`: the box of packed words and how to unpack and cut
  the codes out of it (SPEC.md §7);
* :func:`plan_param` -> :class:`ParamStep`: the box of grid cells (:class:`GridRead`, in stored
  axis order, or a nested descriptor's region) and either a block view that broadcasts the
  cells against the region without expanding them, or the gather index that expands them
  (SPEC.md §9; group indices are range-checked here, GROUP_INDEX_RANGE);
* :func:`chunk_rows` and :func:`iter_chunks`: how a large region is cut into chunks along axis 0
  that keep parameter blocks whole;
* :func:`byte_lookup` and :func:`byte_table`: where one table lookup per packed byte gives the
  values of all the codes in it (the fast path every decoder takes when it applies).

Framework-neutral: NumPy only.  :func:`read_codes` and :func:`grid_array` apply the plans with
NumPy for the core's own users (decode, check, layouts, converters).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterator, Sequence

import numpy as np

from .descriptor import Descriptor, Param, codes_shape
from .elements import lut as element_lut
from .errors import error
from .packing import Packing, unpack_rows
from .sources import Source

Region = tuple[tuple[int, int], ...]


def full_region(shape: Sequence[int]) -> Region:
    """The region covering a whole tensor of ``shape``."""
    return tuple((0, int(n)) for n in shape)


def region_shape(region: Region) -> tuple[int, ...]:
    return tuple(hi - lo for lo, hi in region)


# -- codes ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CodesRead:
    """How to get a region's codes out of the codes component.

    Apply it as: view the stored containers (as unsigned integers of the container width) in
    ``words_shape``; cut ``box``; move storage axis ``axis`` last (``axis`` None: the words are
    one flat row); unpack ``length`` codes per row from the first container of the box; keep
    codes ``cut[0]:cut[1]`` of each row; for a flat row, reshape to ``rows_shape`` and cut
    ``rows_box``; else move the last axis back to ``axis``; finally transpose by
    ``to_logical`` when it is not None.  The result has the region's shape in logical order.
    """

    tensor: str
    packing: Packing
    bits: int
    words_shape: tuple[int, ...]
    box: tuple[slice, ...]
    axis: int | None
    length: int
    cut: tuple[int, int]
    rows_shape: tuple[int, ...] | None
    rows_box: tuple[slice, ...] | None
    to_logical: tuple[int, ...] | None


def unpacked_words(p: Packing, length: int, bits: int) -> int:
    """Containers holding ``length`` codes from an aligned start (no row-alignment padding)."""
    if length <= 0:
        return 0
    if p.row_alignment == 1:
        return p.words_per_row(length, bits)
    from dataclasses import replace

    return replace(p, row_alignment=1).words_per_row(length, bits)


def plan_codes(desc: Descriptor, region: Region) -> CodesRead:
    """The :class:`CodesRead` for ``region`` of a canonical-layout descriptor: only the
    containers that cover the region, from an element-aligned start (SPEC.md §7.6)."""
    p = desc.codes.packing
    bits = desc.codes.element.bits
    rank = len(desc.shape)
    order = p.order or tuple(range(rank))
    sreg = tuple(region[a] for a in order)
    geo = codes_shape(desc)
    align = p.element_alignment(bits)
    to_logical = None if p.order is None else tuple(int(i) for i in np.argsort(order))
    if p.axis is None:
        inner = math.prod(geo.stored_shape[1:]) if rank else 1
        r0, r1 = sreg[0] if rank else (0, 1)
        e0, e1 = r0 * inner, r1 * inner
        e0a = e0 // align * align
        e1a = min(geo.row_length, -(-e1 // align) * align)
        w0 = p.words_for(e0a, bits)
        nw = unpacked_words(p, e1a - e0a, bits)
        rows_shape = ((r1 - r0,) + tuple(geo.stored_shape[1:])) if rank else ()
        rows_box = (slice(None),) + tuple(slice(lo, hi) for lo, hi in sreg[1:]) if rank else ()
        return CodesRead(desc.codes.tensor, p, bits, (geo.words_per_row,), (slice(w0, w0 + nw),), None,
                         e1a - e0a, (e0 - e0a, e1 - e0a), rows_shape, rows_box, to_logical)
    ax = p.axis
    e0, e1 = sreg[ax]
    e0a = e0 // align * align
    e1a = min(geo.row_length, -(-e1 // align) * align)
    w0 = p.words_for(e0a, bits)
    nw = unpacked_words(p, e1a - e0a, bits)
    words_shape = geo.stored_shape[:ax] + (geo.words_per_row,) + geo.stored_shape[ax + 1 :]
    box = tuple(slice(lo, hi) if a != ax else slice(w0, w0 + nw) for a, (lo, hi) in enumerate(sreg))
    return CodesRead(desc.codes.tensor, p, bits, words_shape, box, ax, e1a - e0a, (e0 - e0a, e1 - e0a),
                     None, None, to_logical)


def read_codes(desc: Descriptor, src: Source, region: Region) -> np.ndarray:
    """Unpacked codes (uint8) of ``region``, in logical axis order (NumPy)."""
    plan = plan_codes(desc, region)
    words = src.array(plan.tensor).view(plan.packing.word_dtype).reshape(plan.words_shape)[plan.box]
    if plan.axis is None:
        codes = unpack_rows(words[None, :], plan.bits, plan.packing, plan.length)[0, plan.cut[0] : plan.cut[1]]
        box = codes.reshape(plan.rows_shape)[plan.rows_box]  # type: ignore[index]
    else:
        moved = np.moveaxis(words, plan.axis, -1)
        codes = unpack_rows(moved, plan.bits, plan.packing, plan.length)[..., plan.cut[0] : plan.cut[1]]
        box = np.moveaxis(codes, -1, plan.axis)
    return box if plan.to_logical is None else box.transpose(plan.to_logical)


def element_table(desc: Descriptor, src: Source) -> tuple[np.ndarray, int]:
    """(2**bits binary32 lookup table, number of valid codes) of the descriptor's element; a
    stored codebook table is read from ``src``."""
    el = desc.codes.element
    table = None
    if el.type == "codebook" and el.table_tensor is not None:
        table = np.asarray(src.array(el.table_tensor)).astype(np.float32)
    return element_lut(el, table)


def code_range_error(code: int, valid: int, tensor: str | None):  # type: ignore[no-untyped-def]
    """CODE_OUT_OF_RANGE for a code at or past the end of a ``valid``-entry codebook."""
    return error("CODE_OUT_OF_RANGE", f"code {code} is past the end of a {valid}-entry codebook", tensor=tensor, field="codes.tensor")


# -- parameters -----------------------------------------------------------------------------
@dataclass(frozen=True)
class GridRead:
    """A box of a parameter's grid: its cells ``box`` (grid axis order).  For a stored
    parameter, view ``param.tensor`` in ``stored_shape``, cut ``stored_box`` and transpose by
    ``to_grid`` (when not None); for an encoded one, decode ``param.encoded`` over ``box``."""

    param: Param
    box: Region
    stored_shape: tuple[int, ...]
    stored_box: tuple[slice, ...]
    to_grid: tuple[int, ...] | None


def plan_grid(prm: Param, desc: Descriptor, box: Region) -> GridRead:
    """The :class:`GridRead` of cells ``box`` of ``prm``'s grid."""
    stored = prm.stored_grid_shape(desc.shape)
    order = prm.order or tuple(range(len(box)))
    return GridRead(prm, tuple(box), stored, tuple(slice(*box[a]) for a in order), prm.grid_axes)


def grid_array(prm: Param, desc: Descriptor, src: Source, box: Region | None = None) -> np.ndarray:
    """The stored values of a (stored, not encoded) parameter's grid cells ``box`` (default:
    the whole grid), in grid axis order and in the stored dtype (NumPy)."""
    if box is None:
        box = full_region(prm.blocks.grid_shape(desc.shape))
    g = plan_grid(prm, desc, box)
    a = np.asarray(src.array(prm.tensor or "")).reshape(g.stored_shape)[g.stored_box]
    return a if g.to_grid is None else a.transpose(g.to_grid)


@dataclass(frozen=True)
class ParamStep:
    """How one parameter applies to a region's binary32 values ``x``: read ``grid``'s values
    ``v`` (widened exactly to binary32), then either, with ``view``, ``x.reshape(view[0]) OP
    v.reshape(view[1])`` (the cells tile the region: broadcast, never expanded), or
    ``x OP v[index]`` (``index``: NumPy int64 arrays relative to ``grid.box`` that broadcast to
    the region's shape).  ``OP`` is ``param.arith``."""

    param: Param
    grid: GridRead
    view: tuple[tuple[int, ...], tuple[int, ...]] | None
    index: tuple[np.ndarray, ...] | None


def block_view(prm: Param, desc: Descriptor, region: Region) -> tuple[Region, tuple[int, ...], tuple[int, ...]] | None:
    """How a parameter's cells tile ``region`` without expanding the parameter: (the box of
    parameter-grid cells covering the region, a shape to view the region's values in, the shape
    of the box's values that broadcasts against that view), or None where blocks do not tile the
    region evenly (a partial block, a group index, flat blocks over part of a row)."""
    b = prm.blocks
    if b.type == "flat":
        size = int(b.size)  # type: ignore[arg-type]
        if any(region[a] != (0, desc.shape[a]) for a in range(1, len(region))):
            return None
        inner = math.prod(desc.shape[1:])
        f0, f1 = region[0][0] * inner, region[0][1] * inner
        if f0 % size or (f1 - f0) % size:
            return None
        cells = (f1 - f0) // size
        return ((f0 // size, f1 // size),), (cells, size), (cells, 1)
    if b.index is not None:
        return None
    xshape: list[int] = []
    vshape: list[int] = []
    box = []
    for (lo, hi), s in zip(region, b.size):  # type: ignore[arg-type]
        n = hi - lo
        if s is None:
            box.append((0, 1))
            xshape.append(n)
            vshape.append(1)
        elif s == 1:
            box.append((lo, hi))
            xshape.append(n)
            vshape.append(n)
        elif lo % s == 0 and n % s == 0:
            box.append((lo // s, hi // s))
            xshape += [n // s, s]
            vshape += [n // s, 1]
        else:
            return None
    return tuple(box), tuple(xshape), tuple(vshape)


#: Reads values ``lo:hi`` of a group-index tensor as a NumPy integer array.
IndexReader = Callable[[str, int, int], np.ndarray]


def check_group_index(prm: Param, values: np.ndarray, start: int) -> np.ndarray:
    """The group index ``values`` (positions ``start..``) as int64, or GROUP_INDEX_RANGE for
    the first value outside ``0..count-1`` (SPEC.md §9.3: never used out of range)."""
    gi = prm.blocks.index
    if gi is None:
        raise ValueError(f"parameter {prm.role!r} has no group index")
    g = np.asarray(values).astype(np.int64)
    bad = (g < 0) | (g >= gi.count)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise error("GROUP_INDEX_RANGE", f"group index at position {start + i} is {int(g[i])}, expected 0..{gi.count - 1}",
                    field=f"{prm.role}.blocks.index.tensor")
    return g


def plan_param(prm: Param, desc: Descriptor, region: Region, read_index: IndexReader | None = None,
               allow_view: bool = True) -> ParamStep:
    """The :class:`ParamStep` of ``prm`` over ``region``.  ``read_index`` reads a group index
    (needed only for a parameter with one); ``allow_view`` False forces the gather form (for
    values that cannot be reshaped in place)."""
    if allow_view and region:
        view = block_view(prm, desc, region)
        if view is not None:
            box, xshape, vshape = view
            return ParamStep(prm, plan_grid(prm, desc, box), (xshape, vshape), None)
    b = prm.blocks
    if b.type == "flat":
        shape = desc.shape
        rank = len(shape)
        strides = [math.prod(shape[a + 1 :]) for a in range(rank)]
        flat = np.zeros([1] * rank, np.int64)
        for a, (lo, hi) in enumerate(region):
            v = np.arange(lo, hi, dtype=np.int64) * strides[a]
            flat = flat + v.reshape([-1 if i == a else 1 for i in range(rank)])
        cells = flat // int(b.size)  # type: ignore[arg-type]
        c0, c1 = (int(cells.min()), int(cells.max()) + 1) if cells.size else (0, 0)
        return ParamStep(prm, plan_grid(prm, desc, ((c0, c1),)), None, (cells - c0,))
    per_axis = []
    for a, (lo, hi) in enumerate(region):
        if b.index is not None and a == b.index.axis:
            if read_index is None:
                raise ValueError("a group-indexed parameter needs read_index")
            per_axis.append(check_group_index(prm, read_index(b.index.tensor, lo, hi), lo))
        else:
            s = b.size[a]  # type: ignore[index]
            pos = np.arange(lo, hi, dtype=np.int64)
            per_axis.append(np.zeros(1 if hi > lo else 0, np.int64) if s is None else pos // s)
    box = tuple((int(c.min()), int(c.max()) + 1) if c.size else (0, 0) for c in per_axis)
    index = np.ix_(*[c - lo for c, (lo, _) in zip(per_axis, box)]) if per_axis else ()
    return ParamStep(prm, plan_grid(prm, desc, box), None, tuple(index))


def source_index_reader(src: Source) -> IndexReader:
    """An :data:`IndexReader` over a NumPy :class:`~qformat.sources.Source`."""
    return lambda name, lo, hi: np.asarray(src.array(name)[lo:hi])


# -- chunks ---------------------------------------------------------------------------------
def row_multiple(desc: Descriptor) -> int:
    """Rows per chunk that keep every parameter's blocks whole along axis 0 (so the block view
    applies to every chunk), where that is a small number (else 1)."""
    m = 1
    inner = math.prod(desc.shape[1:])
    for prm in desc.params():
        b = prm.blocks
        if b.type == "flat":
            s = int(b.size)  # type: ignore[arg-type]
            k = s // math.gcd(s, max(1, inner))
        elif b.index is not None and b.index.axis == 0:
            k = 1
        else:
            k = b.size[0] or 1  # type: ignore[index]
        m = m * k // math.gcd(m, k)
    return m if m <= 4096 else 1


def chunk_rows(desc: Descriptor, region: Region, chunk_elements: int) -> int:
    """Rows of axis 0 per chunk: about ``chunk_elements`` values, a multiple of
    :func:`row_multiple` (at least one multiple)."""
    row = max(1, math.prod(region_shape(region)[1:]))
    mult = row_multiple(desc)
    step = max(1, chunk_elements // row)
    return max(mult, step // mult * mult)


def iter_chunks(region: Region, step: int) -> Iterator[Region]:
    """The sub-regions of ``step`` rows (the last one shorter) that tile ``region`` along axis 0."""
    lo0, hi0 = region[0]
    for start in range(lo0, hi0, step):
        yield ((start, min(hi0, start + step)),) + tuple(region[1:])


# -- one lookup per packed byte -------------------------------------------------------------
#: A NumPy dtype whose one item holds the n binary32 values of the n codes in one byte
#: (n = 1, 2, 4): a lookup of one item per byte writes n values at once.
BYTE_ITEM = {1: np.dtype(np.float32), 2: np.dtype(np.float64), 4: np.dtype(np.complex128)}


@dataclass(frozen=True)
class ByteLookup:
    """The packed bytes that hold exactly a region's codes, ``n`` per byte in element order:
    view the codes component as bytes in ``words_shape``, cut ``box``; the bytes then come in
    the region's row-major order.  ``planes`` (SPEC.md §7.12): segments of ``span`` elements
    whose byte ``j`` holds elements ``j, m + j, ...`` (``m = span / n``); the values of a
    segment's bytes are then transposed from ``[m, n]`` to ``[n, m]``."""

    n: int
    words_shape: tuple[int, ...]
    box: tuple[slice, ...]
    planes_span: int | None


def byte_lookup(desc: Descriptor, region: Region, per_row: bool = False) -> ByteLookup | None:
    """Where decoding ``region`` can look up one table item per packed byte (byte containers,
    1, 2 or 4 codes per byte, no storage order, the region's codes starting and ending on byte
    boundaries), the bytes to read; None where the general path is needed.  With ``per_row``,
    the bytes of each row along axis 0 also hold exactly that row's codes (a flat packing's
    rows then start on byte boundaries too)."""
    p = desc.codes.packing
    bits = desc.codes.element.bits
    rank = len(desc.shape)
    if rank == 0 or not region or p.container != 8 or p.order is not None or not p.uses_slots(bits):
        return None
    n = p.slots_per_word(bits)
    if n not in BYTE_ITEM:
        return None
    geo = codes_shape(desc)
    if p.planes_span is not None:
        t = int(p.planes_span)
        c0, c1 = region[-1]
        if p.axis != rank - 1 or t % n or c0 % t or (c1 - c0) % t:
            return None
    elif p.axis is None:  # one row: whole logical rows are a contiguous run of bytes
        if any(region[a] != (0, desc.shape[a]) for a in range(1, rank)):
            return None
        inner = math.prod(desc.shape[1:])
        e0, e1 = region[0][0] * inner, region[0][1] * inner
        if (inner % n) if per_row else (e0 % n or (e1 - e0) % n):
            return None
        return ByteLookup(n, (geo.words_per_row,), (slice(e0 // n, e1 // n),), None)
    elif p.axis == rank - 1:
        c0, c1 = region[-1]
        if c0 % n or (c1 - c0) % n:
            return None
    else:
        return None
    words_shape = geo.stored_shape[:-1] + (geo.words_per_row,)
    box = tuple(slice(lo, hi) for lo, hi in region[:-1]) + (slice(region[-1][0] // n, region[-1][1] // n),)
    return ByteLookup(n, words_shape, box, p.planes_span)


def byte_table(table: np.ndarray, bits: int, p: Packing) -> np.ndarray:
    """For each of the 256 byte values, the binary32 values (``table`` looked up) of the codes it
    holds, in element order (slot order and bit order applied): float32 ``[256, n]``, read-only.

    Built with the reference :func:`qformat.packing.unpack_rows` on every byte, so a lookup in
    this table gives exactly what unpacking and then looking up each code gives.
    """
    return _byte_table(np.asarray(table, np.float32).tobytes(), bits, p)


@lru_cache(maxsize=128)
def _byte_table(table: bytes, bits: int, p: Packing) -> np.ndarray:
    n = p.slots_per_word(bits)
    codes = unpack_rows(np.arange(256, dtype=np.uint8)[:, None], bits, p, n)  # [256, n]
    vals = np.ascontiguousarray(np.frombuffer(table, np.float32)[codes])
    vals.setflags(write=False)
    return vals


def clear_caches() -> None:
    """Forget cached byte tables (after changing how codes unpack, as a test that builds a
    deliberately broken reader does)."""
    _byte_table.cache_clear()
