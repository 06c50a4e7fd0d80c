"""The NumPy reference decoder (SPEC.md, "Decode arithmetic").

Which bytes a region needs comes from :mod:`qformat.regions`; this module does the arithmetic.
Decoding works on *regions*: a box of the logical tensor given as one ``(start, stop)`` pair
per axis.  Only the packed words, parameter cells and group indices that cover the region are
read, so ``safe_open(...).get_slice`` touches only its bytes, and a full decode runs region by
region along axis 0 with temporaries bounded by :data:`CHUNK_ELEMENTS`, whatever the tensor's
size.  Arithmetic is binary32, one rounding per step, in the order zero, scale, bias, then one
round-to-nearest-even cast to the logical dtype.
"""

from __future__ import annotations

import math
import os

import numpy as np

from . import dtypes as _dt
from . import kernels as _kernels
from .descriptor import Descriptor, Param, codes_shape
from .errors import error
from .layouts import canonical_view
from .regions import (BYTE_ITEM, GridRead, Region, byte_lookup, byte_table, check_group_index, chunk_rows, code_range_error, element_table,
                      full_region, grid_array, iter_chunks, plan_grid, plan_param, read_codes, region_shape, source_index_reader)
from .sources import Source

#: Elements decoded per chunk: about 1 MB of binary32, so a chunk's lookup, parameter steps
#: and cast run in the core's cache and every temporary stays small, whatever the tensor's size.
CHUNK_ELEMENTS = 1 << 18

#: Elements per chunk on the native path (:mod:`qformat.kernels`): larger, because the kernel
#: keeps its temporaries in a 4 KB tile whatever the chunk's size, and each chunk's planning
#: (parameter cells, row offsets) is a fixed cost in Python.
NATIVE_CHUNK_ELEMENTS = 1 << 20

#: Elements per chunk on the native path where the kernel reads the packed bytes in place
#: (:func:`_native_in_place`): a chunk's only temporaries are then its parameters' cells and row
#: offsets (a few percent of its output for grouped parameters), so chunks are much larger, and
#: one kernel call splits each chunk's rows over native threads (:func:`qformat.kernels.fused`):
#: one plan per 64 MB of float32 output instead of 16, and no Python thread hand-offs.
VIEW_CHUNK_ELEMENTS = 1 << 24

#: Threads a full decode spreads its chunks over (None: one per CPU, at most 8).  Chunks
#: write disjoint rows of the output and NumPy releases the GIL in every step they run.
THREADS: int | None = None

#: True: decode as before issue 45 (two-level parameters decoded again for every chunk, 6-bit
#: codes unpacked by the reference unpacker), the same bits, slower: bench/kernels.py's
#: before/after rows flip it; nothing else does.
_BEFORE_ISSUE45 = False



def _words(src: Source, desc: Descriptor) -> np.ndarray:
    return src.array(desc.codes.tensor).view(desc.codes.packing.word_dtype)


def param_values(prm: Param, desc: Descriptor, src: Source, region: Region, depth: int = 0) -> np.ndarray:
    """Parameter values (binary32) broadcastable against the region's shape (expanded)."""
    step = plan_param(prm, desc, region, source_index_reader(src), allow_view=False)
    return _grid_values(step.grid, desc, src, depth)[step.index]


def _grid_values(g: GridRead, desc: Descriptor, src: Source, depth: int) -> np.ndarray:
    """Binary32 values of the parameter grid cells ``g.box``."""
    enc = g.param.encoded
    if enc is not None:
        # SPEC.md §10.6 (1.2.1): a nested descriptor is decoded, and so checked, whole, whatever
        # cells the region uses (parameter grids are small: one cell per group)
        whole = decode_region(enc, src, tuple((0, n) for n in enc.shape), depth + 1)
        box = whole[tuple(slice(lo, hi) for lo, hi in g.box)] if g.box else whole
        return round_to_logical(box, enc.dtype).astype(np.float32)
    return grid_array(g.param, desc, src, g.box).astype(np.float32)


# -- fast paths: the same operations on the same binary32 values, in fewer passes -----------
def _fast_values(desc: Descriptor, src: Source, region: Region, table: np.ndarray, out: np.ndarray | None) -> np.ndarray | None:
    """Element values of ``region`` by one lookup per packed byte (:func:`qformat.regions.byte_lookup`),
    or None where the packing needs the general path."""
    if desc.codes.packing.planes_span is not None:
        return _fast_planes(desc, src, region, table, out)
    look = byte_lookup(desc, region)
    if look is None:
        return None
    sub = _words(src, desc).reshape(look.words_shape)[look.box]
    bt = byte_table(table, desc.codes.element.bits, desc.codes.packing).view(BYTE_ITEM[look.n]).reshape(256)
    if out is None:
        out = np.empty(region_shape(region), np.float32)
    # mode="clip": a byte always indexes the 256-entry table, and "raise" would buffer ``out``
    np.take(bt, sub, out=out.reshape(-1).view(bt.dtype).reshape(sub.shape), mode="clip")
    return out


def _fast_planes(desc: Descriptor, src: Source, region: Region, table: np.ndarray, out: np.ndarray | None) -> np.ndarray | None:
    """Element values of ``region`` for a ``planes`` packing (SPEC.md §7.12; GGUF's split halves
    are span 32), by one lookup per packed byte and one transposing copy.

    In a whole segment of ``t = n * m`` elements stored in ``m`` bytes, byte ``j`` holds the
    elements at ``j, m + j, ..., (n - 1) * m + j``; the byte table (built with the reference
    unpacker on each single byte, so it already applies bit order and slot order) gives those
    ``n`` values in plane order.  Only whole segments along the last axis, with no padding slots
    (``t`` a multiple of ``n``), take this path.
    """
    look = byte_lookup(desc, region)
    if look is None or look.planes_span is None:
        return None
    n, t = look.n, look.planes_span
    m = t // n
    sub = _words(src, desc).reshape(look.words_shape)[look.box]
    bt = byte_table(table, desc.codes.element.bits, desc.codes.packing).view(BYTE_ITEM[n]).reshape(256)
    shape = region_shape(region)
    if out is None:
        out = np.empty(shape, np.float32)
    lead = shape[:-1]
    segs = shape[-1] // t
    items = np.empty(sub.shape, bt.dtype)  # n values per byte, in plane order
    np.take(bt, sub, out=items, mode="clip")
    out.reshape(lead + (segs, n, m))[...] = np.swapaxes(items.view(np.float32).reshape(lead + (segs, m, n)), -1, -2)
    return out


def decode_region(desc: Descriptor, src: Source, region: Region, depth: int = 0, tensor: str | None = None,
                  out: np.ndarray | None = None) -> np.ndarray:
    """Decode ``region`` of a canonical-layout descriptor to binary32 (before the cast to the
    logical dtype).  ``out`` (C-contiguous binary32 of the region's shape) receives the values
    when given."""
    table, valid = element_table(desc, src)
    x = _fast_values(desc, src, region, table, out) if valid == len(table) else None
    if x is None:
        codes = read_codes(desc, src, region)
        if valid < len(table) and codes.size and int(codes.max()) >= valid:
            raise code_range_error(int(codes.max()), valid, tensor)
        if out is not None and region:
            np.take(table, codes, out=out, mode="clip")  # codes < len(table): checked or by width
            x = out
        else:
            x = table[codes]
            if not isinstance(x, np.ndarray):  # rank 0: indexing gave a scalar
                x = np.array(x, dtype=np.float32)
    read_index = source_index_reader(src)
    with np.errstate(all="ignore"):
        for prm in desc.params():
            step = plan_param(prm, desc, region, read_index, allow_view=x.flags.c_contiguous)
            v = _grid_values(step.grid, desc, src, depth)
            op = getattr(np, prm.arith)  # np.subtract / multiply / divide / add
            if step.view is not None:
                xv = x.reshape(step.view[0])
                op(xv, v.reshape(step.view[1]), out=xv)
            else:
                op(x, v[step.index], out=x)
    return x


# -- the native kernel (qformat.kernels): the same steps, fused in C -----------------------------
def native_covers(desc: Descriptor) -> bool:
    """Whether decoding ``desc`` (canonical layout) runs the native kernel: the extension is
    built and enabled (:func:`qformat.kernels.info`), the tensor has rank 1 or more and its
    element is at most 8 bits wide (a 256-entry table).  Everything else takes the NumPy path."""
    return _kernels.enabled() and len(desc.shape) >= 1 and desc.codes.element.bits <= 8


def _six_bytes(desc: Descriptor, src: Source, region: Region, table: np.ndarray, valid: int) -> np.ndarray | None:
    """The packed bytes of ``region`` as rows, where its codes are 6-bit, four in three bytes,
    least significant bits first, rows along the last axis, and the region's columns whole groups
    of four (the kernel's ``six`` mode: GGUF K-quants' sub-block scales, Q6_K's codes); else None."""
    p = desc.codes.packing
    rank = len(desc.shape)
    if (desc.codes.element.bits != 6 or valid != len(table) or p.container != 8 or p.bit_order != "lsb_first"
            or p.uses_slots(6) or p.order is not None or p.axis is None or p.axis != rank - 1 or not region):
        return None
    c0, c1 = region[-1]
    if c0 % 4 or (c1 - c0) % 4:
        return None
    geo = codes_shape(desc)
    words = _words(src, desc).reshape(geo.stored_shape[:-1] + (geo.words_per_row,))
    box = tuple(slice(lo, hi) for lo, hi in region[:-1]) + (slice(c0 // 4 * 3, c1 // 4 * 3),)
    return words[box].reshape(-1, (c1 - c0) // 4 * 3)


def _native_in_place(desc: Descriptor, src: Source, region: Region, table: np.ndarray, valid: int) -> bool:
    """Whether :func:`_native_codes` hands the kernel the packed bytes themselves for ``region``
    (whole codes per byte, or the 6-bit mode), not codes unpacked one per byte."""
    look = byte_lookup(desc, region) if valid == len(table) else None
    if look is not None:
        span = 0 if look.planes_span is None else int(look.planes_span)
        if region_shape(region)[-1] % look.n == 0 and _kernels.TILE % max(span, 1) == 0:
            return True
    return not _BEFORE_ISSUE45 and _six_bytes(desc, src, region, table, valid) is not None


def _native_codes(desc: Descriptor, src: Source, region: Region, table: np.ndarray, valid: int,
                  tensor: str | None) -> tuple[np.ndarray, int, int, np.ndarray, int, bool]:
    """(codes as rows of bytes, row stride, codes per byte, byte table, planes span or 0) of
    ``region`` for the kernel: the packed bytes themselves where one byte holds whole codes of
    one row (:func:`qformat.regions.byte_lookup`; planes whose span divides the kernel's tile
    included), else codes unpacked by the reference unpacker (one per byte, range-checked
    against a codebook's length here, as the NumPy path does).  The last item says the codes are
    6-bit, four in three bytes (:func:`_six_bytes`)."""
    shape = region_shape(region)
    cols = shape[-1]
    rows = math.prod(shape[:-1])
    p = desc.codes.packing

    def strided(sub: np.ndarray, n: int, bt: np.ndarray, span: int, six: bool) -> tuple[np.ndarray, int, int, np.ndarray, int, bool]:
        if not (sub.flags.c_contiguous or (sub.strides[1] == 1 and sub.strides[0] >= 0 and rows > 0)):
            sub = np.ascontiguousarray(sub)
        if not sub.flags.c_contiguous:  # a column box of a row-major array: rows stride apart
            base = np.lib.stride_tricks.as_strided(sub, ((rows - 1) * sub.strides[0] + sub.shape[1],), (1,))
            return base, sub.strides[0], n, bt, span, six
        return sub, sub.shape[1], n, bt, span, six

    look = byte_lookup(desc, region) if valid == len(table) else None
    span = 0 if look is None or look.planes_span is None else int(look.planes_span)
    if look is not None and cols % look.n == 0 and _kernels.TILE % max(span, 1) == 0:
        sub = _words(src, desc).reshape(look.words_shape)[look.box].reshape(rows, cols // look.n)
        return strided(sub, look.n, byte_table(table, desc.codes.element.bits, p), span, False)
    bt = np.zeros(256, np.float32)
    bt[: len(table)] = table
    six = None if _BEFORE_ISSUE45 else _six_bytes(desc, src, region, table, valid)
    if six is not None:
        return strided(six, 1, bt, 0, True)
    codes = read_codes(desc, src, region)
    if valid < len(table) and codes.size and int(codes.max()) >= valid:
        raise code_range_error(int(codes.max()), valid, tensor)
    return np.ascontiguousarray(codes, np.uint8).reshape(rows, cols), cols, 1, bt, 0, False


def _nested_whole(enc: Descriptor, src: Source) -> np.ndarray:
    """A two-level parameter's whole grid, decoded (and so checked) whole as SPEC.md §10.6 says,
    rounded to its logical dtype and widened to binary32: :func:`_grid_values`' values before its
    box is cut, by the native kernel where it covers the nested descriptor (the same bits)."""
    return decode(enc, src, threads=1).astype(np.float32, copy=False)  # a float32 grid as decoded, not copied


def _nested_in_order(desc: Descriptor, src: Source, region: Region, tensor: str | None,
                     element: tuple[np.ndarray, int] | None) -> dict[int, np.ndarray] | None:
    """Every two-level parameter's whole grid (:func:`_nested_whole`), decoded before the chunks,
    with the decode-time checks kept in SPEC.md §1.4's order (1.2.1): the region's codes
    (CODE_OUT_OF_RANGE), then per parameter, ``zero``, ``scale``, ``bias``, its group index
    over the region (GROUP_INDEX_RANGE) and then its nested descriptor.  None when there is no
    two-level parameter (nothing is checked early then: the chunks check in order)."""
    params = list(desc.params())
    if not any(p.encoded is not None for p in params):
        return None
    table, valid = element if element is not None else element_table(desc, src)
    if valid < len(table):  # a code can be past the table: check the region's codes first
        codes = read_codes(desc, src, region)
        if codes.size and int(codes.max()) >= valid:
            raise code_range_error(int(codes.max()), valid, tensor)
    read_index = source_index_reader(src)
    nested: dict[int, np.ndarray] = {}
    for p in params:
        gi = p.blocks.index
        if gi is not None:
            lo, hi = region[gi.axis]
            check_group_index(p, read_index(gi.tensor, lo, hi), lo)
        if p.encoded is not None:
            nested[id(p)] = _nested_whole(p.encoded, src)
    return nested


def _native_values(g: GridRead, desc: Descriptor, src: Source, nested: dict[int, np.ndarray] | None = None) -> tuple[np.ndarray, int]:
    """(cell values, their format for the kernel: 0 binary32, 1 binary16, 2 bfloat16) of a grid
    box: stored float16 / bfloat16 cells as stored (the kernel widens each cell it uses,
    exactly), everything else (integers, fp8, two-level parameters) widened here to binary32.
    ``nested``: two-level parameters' whole grids (:func:`_nested_whole`) by ``id`` of the
    parameter, decoded once per decode instead of once per chunk."""
    if g.param.encoded is not None and nested is not None and id(g.param) in nested:
        whole = nested[id(g.param)]
        box = whole[tuple(slice(lo, hi) for lo, hi in g.box)] if g.box else whole
        return np.ascontiguousarray(box, np.float32).reshape(-1), 0
    if g.param.encoded is None:
        a = grid_array(g.param, desc, src, g.box)
        if a.dtype == np.float16 or a.dtype == _dt.logical_numpy("bfloat16"):
            return np.ascontiguousarray(a).reshape(-1).view(np.uint16), 1 if a.dtype == np.float16 else 2
    return np.ascontiguousarray(_grid_values(g, desc, src, 0), np.float32).reshape(-1), 0


def _native_param(prm: Param, desc: Descriptor, src: Source, region: Region, read_index,  # type: ignore[no-untyped-def]
                  nested: dict[int, np.ndarray] | None = None) -> tuple:  # type: ignore[type-arg]
    """One parameter for the kernel: (op, column mode, cell values, per-row cell offset,
    per-column cell index or None, a, b, value format); see ``qformat/kernels/_native.c``."""
    op = _kernels.OPS[prm.arith]
    shape = region_shape(region)
    rank = len(shape)
    lead = shape[:-1]
    if prm.blocks.type == "flat":  # cell = flat position // size - first cell of the box
        size = int(prm.blocks.size)  # type: ignore[arg-type]
        strides = [math.prod(desc.shape[a + 1 :]) for a in range(rank)]
        pos = np.full([1] * (rank - 1), region[-1][0], np.int64)
        for a in range(rank - 1):
            lo, hi = region[a]
            pos = pos + (np.arange(lo, hi, dtype=np.int64) * strides[a]).reshape([-1 if i == a else 1 for i in range(rank - 1)])
        rowoff = np.ascontiguousarray(np.broadcast_to(pos, lead), np.int64).reshape(-1)
        # the cells between the region's first and last element (plan_param's gather index
        # would be one int64 per element)
        c0, c1 = int(rowoff.min()) // size, (int(rowoff.max()) + shape[-1] - 1) // size + 1
        v, vk = _native_values(plan_grid(prm, desc, ((c0, c1),)), desc, src, nested)
        return (op, _kernels.MODE_FLAT, v, rowoff, None, c0, size, vk)
    sizes = prm.blocks.size
    cols = shape[-1]
    if prm.blocks.index is None:
        # grid blocks: the cells and per-axis cell indices straight from the block sizes
        # (what plan_param computes, without its gather index)
        box = tuple((0, 1) if s is None else (lo // s, (hi - 1) // s + 1) for (lo, hi), s in zip(region, sizes))  # type: ignore[arg-type]
        per_axis = [np.zeros(1, np.int64) if s is None else np.arange(lo, hi, dtype=np.int64) // s - b0
                    for (lo, hi), s, (b0, _) in zip(region, sizes, box)]  # type: ignore[arg-type]
        grid = plan_grid(prm, desc, box)
    else:
        step = plan_param(prm, desc, region, read_index, allow_view=False)
        grid = step.grid
        per_axis = [np.asarray(i, np.int64).reshape(-1) for i in step.index]  # type: ignore[union-attr]
    v, vk = _native_values(grid, desc, src, nested)
    vshape = region_shape(grid.box)
    off = np.zeros([1] * (rank - 1), np.int64)
    for a in range(rank - 1):
        off = off + per_axis[a].reshape([-1 if i == a else 1 for i in range(rank - 1)]) * math.prod(vshape[a + 1 :])
    rowoff = np.ascontiguousarray(np.broadcast_to(off, lead), np.int64).reshape(-1)
    last = per_axis[-1]
    lo, hi = region[-1]
    gi = prm.blocks.index
    s = 0 if gi is not None and gi.axis == rank - 1 else sizes[-1]  # type: ignore[index]
    if s is None or (s and lo // s == (hi - 1) // s):  # one cell along the whole row
        return (op, _kernels.MODE_CONST, v, rowoff + int(last[0]), None, 0, 1, vk)
    if s and s > 1:  # blocks of s along the last axis: cell (c + lo % s) // s
        return (op, _kernels.MODE_BLOCK, v, rowoff, None, lo % s, int(s), vk)
    return (op, _kernels.MODE_COLS, v, rowoff, np.ascontiguousarray(last, np.int64), 0, 1, vk)


def _native_region(desc: Descriptor, src: Source, region: Region, out: np.ndarray, tensor: str | None,
                   element: tuple[np.ndarray, int] | None = None, stream: bool = False,
                   nested: dict[int, np.ndarray] | None = None, threads: int = 1) -> None:
    """Decode ``region`` (rank >= 1) straight into ``out`` (C-contiguous, the logical dtype)
    with one call of the native kernel: the same binary32 steps as :func:`decode_region` and
    :func:`round_to_logical`, fused.  ``element``: :func:`qformat.regions.element_table`'s
    result when the caller has it (one per decode, not one per chunk).  ``stream``: write a
    float32 output with non-temporal stores where the kernel can (:data:`qformat.kernels.STREAM_FROM_BYTES`).
    ``nested``: the decode's two-level parameter grids, decoded once (:func:`_nested_whole`).
    ``threads``: native threads sharing the region's rows in the kernel call."""
    table, valid = element_table(desc, src) if element is None else element
    codes, stride, n, bt, span, six = _native_codes(desc, src, region, table, valid, tensor)
    read_index = source_index_reader(src)
    params = [_native_param(prm, desc, src, region, read_index, nested) for prm in desc.params()]
    shape = region_shape(region)
    kind = _kernels.OUT_KINDS[desc.dtype]
    flat = out.reshape(-1).view(np.float32 if kind == 0 else np.uint16)
    _kernels.fused(codes, stride, math.prod(shape[:-1]), shape[-1], n, bt, params, flat, kind, span, stream, six, threads)


def _to_bfloat16_bits(x: np.ndarray, dst: np.ndarray) -> None:
    """Round binary32 ``x`` to bfloat16 into ``dst`` (uint16 of the same shape), with integer
    ops on the binary32 bits: SPEC.md §10.3's ``floor((w + 0x7FFF + (floor(w / 2^16) mod 2)) /
    2^16)`` for every non-NaN ``w`` (finite values and infinities; no carry leaves 32 bits),
    and NaN kept NaN with its sign and payload's top bits, quieted.  The same bits as
    ml_dtypes' RNE cast (tests/test_bench_smoke.py checks both on every class of value), about 2x
    faster here because it needs no float conversion loop."""
    x, dst = x.reshape(-1), dst.reshape(-1)  # views (both C-contiguous); rank 0 included
    u = x.view(np.uint32)
    t = _dt.rounded_bits(u, 16, np.empty_like(u))
    np.right_shift(t, np.uint32(16), out=t)
    np.copyto(dst, t, casting="unsafe")
    nan = np.isnan(x)
    if nan.any():
        dst[nan] = (u[nan] >> 16) | 0x40


def round_to_logical(x: np.ndarray, dtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """Binary32 ``x`` rounded to the logical ``dtype`` (round to nearest even, overflow to Inf;
    SPEC.md §10.3), into ``out`` (C-contiguous, of ``x``'s shape and the logical dtype) when
    given.  The one place every decoded value goes through on its way to the logical dtype."""
    dt = _dt.logical_numpy(dtype)
    if out is None:
        if dtype == "float32":
            return x
        out = np.empty(np.shape(x), dt)
    if dtype == "bfloat16":
        _to_bfloat16_bits(np.ascontiguousarray(x, np.float32), out.view(np.uint16))
    else:
        with np.errstate(over="ignore"):
            np.copyto(out, x, casting="unsafe")
    return out


def check_out(out: object, shape: tuple[int, ...], dtype: np.dtype, tensor: str | None = None) -> None:
    """Refuse a caller's output buffer that :func:`decode` cannot write in place (``OUT_INVALID``,
    a usage code): not a NumPy array, or not exactly ``dtype`` and ``shape``, not C-contiguous,
    or read-only; the message names the tensor and what was expected and found."""
    if not isinstance(out, np.ndarray):
        raise error("OUT_INVALID", f"out must be a NumPy array (C-contiguous {np.dtype(dtype)}, shape {tuple(shape)}), found {type(out).__name__}",
                    tensor=tensor, field="out")
    problems = []
    if out.dtype != dtype:
        problems.append(f"dtype {out.dtype} (expected {np.dtype(dtype)})")
    if tuple(out.shape) != tuple(shape):
        problems.append(f"shape {tuple(out.shape)} (expected {tuple(shape)})")
    if not out.flags.c_contiguous:
        problems.append("not C-contiguous")
    if not out.flags.writeable:
        problems.append("read-only")
    if problems:
        raise error("OUT_INVALID", f"out must be a writable C-contiguous {np.dtype(dtype)} array of shape {tuple(shape)}; found "
                    + ", ".join(problems), tensor=tensor, field="out")


def decode(desc: Descriptor, src: Source, region: Region | None = None, tensor: str | None = None,
           out: np.ndarray | None = None, threads: int | None = None) -> np.ndarray:
    """Decode ``region`` (default: everything) to the logical dtype, chunk by chunk.

    ``out``: a C-contiguous, writable array of the region's shape and logical dtype to decode
    into (returned; :func:`check_out` refuses any other).  ``threads``: how many threads decode
    at once (default :data:`THREADS`): where the native kernel reads the packed bytes in place,
    native threads share each chunk's rows (so a fresh output's first-touch page faults are
    taken by all of them); else chunks go to a pool of that many threads.  The bits never depend
    on it.  Memory beyond the output is a few chunks' temporaries.  A large float32 ``out`` is
    written with non-temporal stores; the output this function allocates is not (its pages
    are cleared by the first touch just before the kernel writes them, still in cache).
    A descriptor in a device layout is read through its canonical view (SPEC.md §11).
    """
    if region is None:
        region = full_region(desc.shape)
    desc, src = canonical_view(desc, src)
    out_shape = region_shape(region)
    dt = _dt.logical_numpy(desc.dtype)
    fresh = out is None
    if fresh:
        out = _kernels.aligned_empty(out_shape, dt)
    else:
        check_out(out, out_shape, dt, tensor)
    if out.size == 0:
        return out
    if not region:
        round_to_logical(decode_region(desc, src, region, tensor=tensor), desc.dtype, out)
        return out
    lo0 = region[0][0]
    native = native_covers(desc)
    element = element_table(desc, src) if native else None
    # two-level parameters: each whole nested grid decoded once here, not once per chunk
    nested = _nested_in_order(desc, src, region, tensor, element) if native and not _BEFORE_ISSUE45 else None
    n = THREADS if threads is None else threads
    n = min(8, os.cpu_count() or 1) if n is None else max(1, int(n))
    # the kernel reads the packed bytes in place: large chunks, each one kernel call whose rows
    # the native threads share (no Python pool); else chunks of NATIVE_CHUNK_ELEMENTS on the pool
    in_place = (native and not _BEFORE_ISSUE45 and _kernels.native_threads()
                and _native_in_place(desc, src, region, element[0], element[1]))  # type: ignore[index]
    step = chunk_rows(desc, region, VIEW_CHUNK_ELEMENTS if in_place else NATIVE_CHUNK_ELEMENTS if native else CHUNK_ELEMENTS)
    direct = desc.dtype == "float32"
    # a caller's large float32 buffer is written with non-temporal stores (too large to stay in
    # cache for its reader); a fresh one is not: each huge page the first touch clears is in
    # cache when the kernel writes it, and streaming past it writes the page to memory twice
    stream = direct and not fresh and out.nbytes >= _kernels.STREAM_FROM_BYTES

    def run(sub: Region) -> None:
        dst = out[sub[0][0] - lo0 : sub[0][1] - lo0]
        if native:
            _native_region(desc, src, sub, dst, tensor, element, stream, nested, n if in_place else 1)
        elif direct:  # binary32 values are the logical values: decode straight into ``out``
            decode_region(desc, src, sub, tensor=tensor, out=dst)
        else:
            x = decode_region(desc, src, sub, tensor=tensor, out=np.empty(dst.shape, np.float32))
            round_to_logical(x, desc.dtype, dst)

    chunks = list(iter_chunks(region, step))
    if n > 1 and len(chunks) >= 2 * n and not in_place:
        # map() yields in chunk order, so the first failing chunk's error is the one raised
        for _ in _kernels.pool(n).map(run, chunks):
            pass
    else:
        for sub in chunks:
            run(sub)
    return out


def decode_full(desc: Descriptor, src: Source, tensor: str | None = None) -> np.ndarray:
    """Decode the whole logical tensor."""
    return decode(desc, src, None, tensor=tensor)
