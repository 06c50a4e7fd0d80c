"""Block-aligned slicing: cut a quantized tensor into standalone quantized pieces.

A *region* is a box of the logical tensor, one ``(start, stop)`` pair per axis.  A region is
*block-aligned* for a descriptor when, on every axis, both bounds fall where every component
splits cleanly (SPEC.md §8.4):

* the codes: along the packed storage axis, at multiples of the packing's element alignment
  (``Packing.element_alignment``: slots per container, the planes span, or ``c / gcd(b, c)``
  for the stream arrangement), since such a position starts a whole container; every position
  of a non-packed axis (rows are independent).  With ``axis`` null the storage grid is one
  row: only the first storage axis of size > 1 may be cut, at positions whose flat offset is a
  multiple of the alignment, and the later storage axes are taken whole;
* each parameter: for grid blocks, at multiples of the block size (any position for ``null``
  sizes and for an indexed axis); for flat blocks, only along the first logical axis of size
  > 1, at positions whose flat offset is a multiple of the block size, later axes whole;
* an encoded parameter: the cells covering the region must themselves form a block-aligned
  region of the nested descriptor (recursively);
* a bound at 0 or at the axis length is always aligned.

Every such boundary set has the form "multiples of ``m``, plus the axis end" (``m`` may be
"none": only 0 and the end), so :func:`aligned_region` widens each bound independently to the
nearest boundary.  :func:`slice_qtensor` turns an aligned region into a standalone descriptor
of the region's shape plus the few sub-arrays it needs (the packed words of the region's rows,
the parameter cells that cover it, the group-index sub-range, nested parameters recursively,
codebook tables whole): decoding it gives the full decode restricted to the region, bit for
bit.  Sub-arrays are views of the source (memory-mapped for files): only their bytes are read,
and :class:`RecordingSource` logs exactly which byte ranges those are.

Framework readers (torch, JAX) build their sharded loading on these three functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .layouts import canonical_view
from .regions import Region
from .descriptor import Descriptor, Param, codes_shape
from .errors import error
from .packing import Packing
from .sources import Source, TensorInfo

__all__ = [
    "Read", "RecordingSource", "aligned_region", "axis_periods", "describe_alignment", "is_aligned",
    "normalize_region", "slice_qtensor",
]


def _lcm(a: int | None, b: int | None) -> int | None:
    if a is None or b is None:
        return None
    return a * b // math.gcd(a, b)


def _first_cut_axis(shape: Sequence[int]) -> int | None:
    """The first axis of size != 1 (the only one a flat layout can cut), or None."""
    for a, n in enumerate(shape):
        if n != 1:
            return a
    return None


def axis_periods(desc: Descriptor) -> tuple[int | None, ...]:
    """Per logical axis, the period ``m`` of its block-aligned bounds (None: only 0 and the end).

    A bound ``p`` of axis ``a`` is aligned when ``p`` is a multiple of ``m_a`` or equals the
    axis length.
    """
    shape = desc.shape
    rank = len(shape)
    per: list[int | None] = [1] * rank
    if rank == 0:
        return ()
    if desc.layout != "canonical":  # a device layout is cut only whole (SPEC.md §11.1)
        return (None,) * rank
    p = desc.codes.packing
    bits = desc.codes.element.bits
    align = p.element_alignment(bits)
    order = p.order or tuple(range(rank))
    if p.axis is not None:
        la = order[p.axis]
        per[la] = _lcm(per[la], align)
    else:
        sshape = tuple(shape[a] for a in order)
        j = _first_cut_axis(sshape)
        if j is not None:
            inner = math.prod(sshape[j + 1 :])
            if inner:  # an empty tensor cuts anywhere
                la = order[j]
                per[la] = _lcm(per[la], align // math.gcd(align, inner))
                for t in range(j + 1, rank):
                    per[order[t]] = None
    for prm in desc.params():
        nested = axis_periods(prm.encoded) if prm.encoded is not None else None
        b = prm.blocks
        if b.type == "flat":
            j = _first_cut_axis(shape)
            if j is None:
                continue
            inner = math.prod(shape[j + 1 :])
            if not inner:
                continue
            mn = 1 if nested is None else nested[0]
            if mn is None:
                per[j] = None
            else:
                unit = int(b.size) * mn  # type: ignore[arg-type]
                per[j] = _lcm(per[j], unit // math.gcd(unit, inner))
            for t in range(j + 1, rank):
                per[t] = None
            continue
        for a in range(rank):
            s = b.size[a]  # type: ignore[index]
            if (b.index is not None and a == b.index.axis) or s is None:
                continue  # one cell (or an index) across the axis: any cut, nested axis whole
            mn = 1 if nested is None else nested[a]
            per[a] = None if mn is None else _lcm(per[a], s * mn)
    return tuple(per)


def normalize_region(desc: Descriptor | Sequence[int], region: Any) -> Region:
    """``region`` as a tuple of ``(start, stop)`` int pairs, checked against the shape."""
    shape = desc.shape if isinstance(desc, Descriptor) else tuple(desc)
    reg = tuple((int(lo), int(hi)) for lo, hi in region)
    if len(reg) != len(shape):
        raise error("SLICE_INVALID", f"a region of a {len(shape)}-D tensor needs {len(shape)} (start, stop) pairs, found {len(reg)}")
    for a, ((lo, hi), n) in enumerate(zip(reg, shape)):
        if not 0 <= lo <= hi <= n:
            raise error("SLICE_INVALID", f"region ({lo}, {hi}) is not within axis {a} of size {n}")
    return reg


def aligned_region(desc: Descriptor, region: Any) -> Region:
    """The smallest block-aligned region that contains ``region``."""
    reg = normalize_region(desc, region)
    out = []
    for (lo, hi), n, m in zip(reg, desc.shape, axis_periods(desc)):
        if m is None:
            out.append((0 if lo < n else n, n if hi > 0 else 0))
        else:
            out.append((lo if lo == n else lo - lo % m, min(n, -(-hi // m) * m)))
    return tuple(out)


def _bound_ok(p: int, n: int, m: int | None) -> bool:
    return p == 0 or p == n or (m is not None and p % m == 0)


def is_aligned(desc: Descriptor, region: Any) -> bool:
    """True when every bound of ``region`` is block-aligned for ``desc``."""
    reg = normalize_region(desc, region)
    return all(_bound_ok(lo, n, m) and _bound_ok(hi, n, m) for (lo, hi), n, m in zip(reg, desc.shape, axis_periods(desc)))


def describe_alignment(desc: Descriptor, region: Any) -> str:
    """A message naming the misaligned bounds and the nearest aligned ones."""
    reg = normalize_region(desc, region)
    parts = []
    for a, ((lo, hi), n, m) in enumerate(zip(reg, desc.shape, axis_periods(desc))):
        bad = [p for p in (lo, hi) if not _bound_ok(p, n, m)]
        if not bad:
            continue
        rule = f"multiples of {m} or {n}" if m is not None else f"only 0 or {n}"
        near = []
        for p in bad:
            down = p - p % m if m is not None else 0
            up = min(n, down + m) if m is not None else n
            near.append(f"{p} (nearest aligned bounds {down} and {up})")
        parts.append(f"axis {a} allows cuts at {rule}: " + ", ".join(near))
    return "; ".join(parts)


# -- byte-range recording --------------------------------------------------------------------
@dataclass(frozen=True)
class Read:
    """One contiguous byte range read from a component: ``[offset, offset + length)``.

    ``offset`` is a file offset for a file source (header included), else an offset into the
    component's own bytes.
    """

    tensor: str
    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length


def _runs(base: np.ndarray, view: np.ndarray) -> list[tuple[int, int]]:
    """Contiguous (byte offset, length) runs of ``view`` inside the C-contiguous ``base``."""
    if view.size == 0:
        return []
    start = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    item = view.itemsize
    if view.ndim == 0:
        return [(start, item)]
    # Trailing axes that are contiguous merge into one run per leading index.
    k = view.ndim
    run = item
    while k > 0 and view.strides[k - 1] == run:
        run *= view.shape[k - 1]
        k -= 1
    lead_shape, lead_strides = view.shape[:k], view.strides[:k]
    offs = np.full((1,), start, np.int64)
    for n, s in zip(lead_shape, lead_strides):
        offs = (offs[:, None] + np.arange(n, dtype=np.int64)[None, :] * s).reshape(-1)
    offs = np.sort(offs)
    # merge touching runs
    breaks = np.flatnonzero(offs[1:] != offs[:-1] + run) + 1
    starts = offs[np.concatenate([[0], breaks])]
    ends = offs[np.concatenate([breaks - 1, [len(offs) - 1]])] + run
    return [(int(a), int(b - a)) for a, b in zip(starts, ends)]


class RecordingSource:
    """A :class:`~qformat.sources.Source` wrapper that logs the byte ranges slicing reads.

    :func:`slice_qtensor` takes every sub-array through :meth:`take`; this wrapper records, for
    each, the contiguous byte runs of the sub-array inside its component (one run per row of
    the sub-array at most; touching runs merged), as :class:`Read` entries in :attr:`reads`.
    For a file source the offsets are file offsets, so tests can check them against the
    header's tensor entries.
    """

    def __init__(self, inner: Source):
        self.inner = inner
        self.reads: list[Read] = []
        self._arrays: dict[str, np.ndarray] = {}

    def info(self, name: str) -> TensorInfo | None:
        return self.inner.info(name)

    def array(self, name: str) -> np.ndarray:
        """The inner source's array (C-contiguous, so byte offsets inside it are meaningful)."""
        a = self._arrays.get(name)
        if a is None:
            a = self._arrays[name] = np.ascontiguousarray(self.inner.array(name))
        return a

    def component_offset(self, name: str) -> int:
        """File offset of a component's first byte (0 for in-memory sources)."""
        header = getattr(self.inner, "header", None)
        if header is None:
            return 0
        return int(header.data_start + header.entries[name].begin)

    def take(self, name: str, base: np.ndarray, view: np.ndarray) -> None:
        off = self.component_offset(name)
        for start, length in _runs(base, view):
            self.reads.append(Read(name, off + start, length))

    def clear(self) -> list[Read]:
        out, self.reads = self.reads, []
        return out


def _take(src: Source, name: str, reshape: tuple[int, ...] | None, key: tuple[slice, ...] | None) -> np.ndarray:
    """``src.array(name)`` (optionally reshaped) indexed by ``key``: a view, logged if recording."""
    base = np.asarray(src.array(name))
    arr = base if reshape is None else base.reshape(reshape)
    view = arr if key is None else arr[key + (Ellipsis,)]  # Ellipsis: a view even at rank 0
    rec = getattr(src, "take", None)
    if rec is not None:
        rec(name, base, view)
    return view


# -- slicing -----------------------------------------------------------------------------------
@dataclass
class _Out:
    comps: dict[str, np.ndarray] = field(default_factory=dict)
    keys: dict[str, Any] = field(default_factory=dict)

    def put(self, name: str, key: Any, arr_fn) -> str:  # type: ignore[no-untyped-def]
        """Store a sub-array under ``name`` (``name@k`` if ``name`` holds a different cut)."""
        cand, k = name, 0
        while cand in self.keys and self.keys[cand] != key:
            k += 1
            cand = f"{name}@{k}"
        if cand not in self.keys:
            self.keys[cand] = key
            self.comps[cand] = arr_fn()
        return cand


def _cell_range(lo: int, hi: int, s: int | None, n_cells: int) -> tuple[int, int]:
    if s is None:
        return (0, n_cells)
    if hi == lo:
        return (0, 0)
    return (lo // s, -(-hi // s))


def slice_qtensor(desc: Descriptor, src: Source, region: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A standalone quantized tensor for the block-aligned ``region`` of ``desc``.

    Returns ``(descriptor dict, components)``: the descriptor has shape = the region's size and
    references only the returned components, which are views of the bytes the region needs
    (component names are the original ones).  Decoding it equals decoding ``desc`` over
    ``region``, bit for bit.  A region that is not block-aligned is ``SLICE_INVALID``.
    ``desc`` must be valid against ``src`` (as :class:`~qformat.io.SafeOpen` guarantees).
    """
    reg = normalize_region(desc, region)
    if not is_aligned(desc, reg):
        raise error("SLICE_INVALID", "region is not block-aligned: " + describe_alignment(desc, reg))
    desc, src = canonical_view(desc, src)  # a device layout is handed out in its canonical layout (§11.1)
    out = _Out()
    sub = _slice(desc, src, reg, out)
    return sub, out.comps


def _slice(desc: Descriptor, src: Source, reg: Region, out: _Out) -> dict[str, Any]:
    raw = desc.to_dict()
    raw["shape"] = [hi - lo for lo, hi in reg]
    raw["codes"] = _slice_codes(desc, src, reg, out)
    for prm in desc.params():
        raw[prm.role] = _slice_param(desc, prm, src, reg, out)
    return raw


def _slice_codes(desc: Descriptor, src: Source, reg: Region, out: _Out) -> dict[str, Any]:
    codes = desc.codes
    p = codes.packing
    bits = codes.element.bits
    rank = len(desc.shape)
    order = p.order or tuple(range(rank))
    sreg = tuple(reg[a] for a in order)
    sshape, _, _ = codes_shape(desc)
    sub_p = Packing(p.container, p.bit_order, p.axis, p.order, p.straddle, p.slot_order, p.planes_span, 1)
    el = codes.element.to_dict()
    if codes.element.table_tensor is not None:
        t = codes.element.table_tensor
        el["table_tensor"] = out.put(t, "whole", lambda: _take(src, t, None, None))
    name = codes.tensor
    if p.axis is None:
        if any(hi == lo for lo, hi in reg):
            w0 = w1 = 0
        else:
            j = _first_cut_axis(sshape)
            inner = math.prod(sshape[j + 1 :]) if j is not None else 1
            lo, hi = sreg[j] if j is not None else (0, 1)
            e0, e1 = lo * inner, hi * inner
            w0 = p.words_for(e0, bits)
            w1 = w0 + sub_p.words_per_row(e1 - e0, bits)
        key = ("flat", w0, w1)
        sub_name = out.put(name, key, lambda: _take(src, name, (-1,), (slice(w0, w1),)))
    else:
        ax = p.axis
        e0, e1 = sreg[ax]
        w0 = p.words_for(e0, bits)
        w1 = w0 + sub_p.words_per_row(e1 - e0, bits)
        idx = tuple(slice(lo, hi) if a != ax else slice(w0, w1) for a, (lo, hi) in enumerate(sreg))
        sub_name = out.put(name, ("grid", idx), lambda: _take(src, name, None, idx))
    return {"tensor": sub_name, "element": el, "packing": sub_p.to_dict()}


def _param_cells(desc: Descriptor, prm: Param, reg: Region) -> Region:
    """The box of parameter-grid cells that covers the (aligned) region."""
    b = prm.blocks
    grid = b.grid_shape(desc.shape)
    if b.type == "flat":
        shape = desc.shape
        if any(hi == lo for lo, hi in reg):
            return ((0, 0),)
        j = _first_cut_axis(shape)
        if j is None:
            return ((0, grid[0]),)
        inner = math.prod(shape[j + 1 :])
        lo, hi = reg[j]
        f0, f1 = lo * inner, hi * inner
        return (_cell_range(f0, f1, int(b.size), grid[0]),)  # type: ignore[arg-type]
    cells = []
    for a, (lo, hi) in enumerate(reg):
        if b.index is not None and a == b.index.axis:
            cells.append((0, grid[a]))
        else:
            cells.append(_cell_range(lo, hi, b.size[a], grid[a]))  # type: ignore[index]
    return tuple(cells)


def _slice_param(desc: Descriptor, prm: Param, src: Source, reg: Region, out: _Out) -> dict[str, Any]:
    d = prm.to_dict()
    b = prm.blocks
    if b.index is not None:
        gi = b.index
        lo, hi = reg[gi.axis]
        t = gi.tensor
        d["blocks"]["index"]["tensor"] = out.put(t, ("index", lo, hi), lambda: _take(src, t, None, (slice(lo, hi),)))
    cells = _param_cells(desc, prm, reg)
    if prm.encoded is not None:
        d["encoded"] = _slice(prm.encoded, src, cells, out)
        return d
    grid = b.grid_shape(desc.shape)
    order = prm.order or tuple(range(len(grid)))
    stored = tuple(grid[a] for a in order)
    key = tuple(slice(*cells[a]) for a in order)
    name = prm.tensor or ""
    d["tensor"] = out.put(name, ("param", key), lambda: _take(src, name, stored, key))
    return d



# -- moving whole rows -------------------------------------------------------------------------
def row_components(desc: Descriptor) -> dict[str, bool]:
    """Which components follow the rows of the logical tensor (axis 0), one to one.

    Returns, for every component ``desc`` references, True when the component's elements, in
    storage order, fall into one equal run per logical row, in row order (row ``i`` of the
    tensor is decoded from run ``i`` of the component and nothing else: axis 0 of codes and of
    per-row grid parameters, and the blocks of a flat parameter whose block size divides the
    row), False when the component does not depend on the row (a codebook table, a parameter
    constant along axis 0, a group index over another axis).  Reordering the rows of the
    logical tensor is then exactly reordering those runs (``a.reshape(rows, -1)[order]``):
    whole rows of packed codes and of parameters move, nothing is decoded or rounded
    (llama.cpp's rotary permutation of q/k rows and its inverse are such reorders).

    Raises ``SLICE_INVALID`` naming the reason where rows are not independent in storage: a
    device layout, rank below 2, codes packed along axis 0 or across rows (``axis`` null), a
    storage ``order``, flat blocks that straddle rows or are encoded, a parameter block taller
    than one row, a group index over axis 0.
    """
    out: dict[str, bool] = {}
    _row_components(desc, True, out)
    return out


def _row_components(desc: Descriptor, follows: bool, out: dict[str, bool]) -> None:
    def refuse(why: str) -> None:
        raise error("SLICE_INVALID", f"rows cannot be moved independently: {why}")

    if desc.layout != "canonical":
        refuse(f"device layout {desc.layout!r} (convert it to the canonical layout first)")
    if follows:
        if len(desc.shape) < 2:
            refuse(f"a {len(desc.shape)}-D tensor has no rows of its own")
        p = desc.codes.packing
        if p.axis is None or p.order is not None or (p.axis == 0):
            refuse("the codes are packed along axis 0 or across rows")
    out[desc.codes.tensor] = follows
    if desc.codes.element.table_tensor is not None:
        out[desc.codes.element.table_tensor] = False
    for prm in desc.params():
        b = prm.blocks
        if b.type == "flat":
            row = math.prod(desc.shape[1:])
            if follows and (prm.encoded is not None or row % int(b.size)):  # type: ignore[arg-type]
                refuse(f"the {prm.role}'s flat blocks of {b.size} do not split into rows of {row}"
                       + (" (or are encoded)" if prm.encoded is not None else ""))
            out[str(prm.tensor)] = follows
            continue
        if b.index is not None:
            if follows and b.index.axis == 0:
                refuse(f"the {prm.role} has a group index over axis 0")
            out[b.index.tensor] = False
        size = b.size[0]  # type: ignore[index]
        per_row = follows and size == 1
        if follows and not per_row and not (size is None or size >= desc.shape[0]):
            refuse(f"the {prm.role}'s blocks span {size} rows")
        if prm.tensor is not None:
            if per_row and prm.order is not None:
                refuse(f"the {prm.role} is stored in another axis order")
            out[prm.tensor] = per_row
        elif prm.encoded is not None:
            _row_components(prm.encoded, per_row, out)
