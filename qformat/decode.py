"""The NumPy reference decoder (SPEC.md, "Decode arithmetic").

Decoding works on *regions*: a box of the logical tensor given as one ``(start, stop)`` pair
per axis.  Only the packed words, parameter cells and group indices that cover the region are
read, so ``safe_open(...).get_slice`` touches only its bytes, and a full decode runs region by
region along axis 0 with temporaries bounded by :data:`CHUNK_ELEMENTS`, whatever the tensor's
size.  Arithmetic is binary32, one rounding per step, in the order zero, scale, bias, then one
round-to-nearest-even cast to the logical dtype.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from . import dtypes as _dt
from .descriptor import Descriptor, Param, codes_shape
from .elements import lut as element_lut
from .errors import error
from .sources import Source

#: Elements decoded per chunk: keeps every temporary to a few tens of MB.
CHUNK_ELEMENTS = 1 << 20

Region = tuple[tuple[int, int], ...]


def full_region(shape: Sequence[int]) -> Region:
    return tuple((0, int(n)) for n in shape)


def _words(src: Source, desc: Descriptor) -> np.ndarray:
    arr = src.array(desc.codes.tensor)
    return arr.view(desc.codes.packing.word_dtype)


def read_codes(desc: Descriptor, src: Source, region: Region) -> np.ndarray:
    """Unpacked codes (uint8) of ``region``, in logical axis order."""
    p = desc.codes.packing
    bits = desc.codes.element.bits
    rank = len(desc.shape)
    order = p.order or tuple(range(rank))
    sreg = tuple(region[a] for a in order)
    sshape, length, wpr = codes_shape(desc)
    words = _words(src, desc)
    align = p.element_alignment(bits)
    if p.axis is None:
        inner = math.prod(sshape[1:]) if rank else 1
        r0, r1 = (sreg[0] if rank else (0, 1))
        e0, e1 = r0 * inner, r1 * inner
        e0a = e0 // align * align
        e1a = min(length, -(-e1 // align) * align)
        w0 = p.words_for(e0a, bits)
        flat = words.reshape(-1)[w0:]
        codes = _unpack(flat[None, :], bits, p, e1a - e0a)[0, e0 - e0a : e1 - e0a]
        if rank == 0:
            return codes.reshape(())
        box = codes.reshape((r1 - r0,) + tuple(sshape[1:]))
        box = box[(slice(None),) + tuple(slice(lo, hi) for lo, hi in sreg[1:])]
    else:
        ax = p.axis
        e0, e1 = sreg[ax]
        e0a = e0 // align * align
        e1a = min(length, -(-e1 // align) * align)
        w0 = p.words_for(e0a, bits)
        idx = tuple(slice(lo, hi) if a != ax else slice(w0, wpr) for a, (lo, hi) in enumerate(sreg))
        sub = np.moveaxis(words[idx], ax, -1)
        codes = _unpack(sub, bits, p, e1a - e0a)[..., e0 - e0a : e1 - e0a]
        box = np.moveaxis(codes, -1, ax)
    if p.order is not None:
        box = box.transpose(np.argsort(order))
    return box


def _unpack(words: np.ndarray, bits: int, p, length: int) -> np.ndarray:
    from .packing import unpack_rows

    if length <= 0:
        return np.zeros(words.shape[:-1] + (0,), np.uint8)
    return unpack_rows(words, bits, p, length)


def element_table(desc: Descriptor, src: Source) -> tuple[np.ndarray, int]:
    """(2**bits binary32 lookup table, number of valid codes) of the descriptor's element."""
    el = desc.codes.element
    table = None
    if el.type == "codebook" and el.table_tensor is not None:
        table = np.asarray(src.array(el.table_tensor)).astype(np.float32)
    return element_lut(el, table)


def _axis_cells(prm: Param, desc: Descriptor, src: Source, region: Region) -> list[np.ndarray]:
    """Per logical axis, the parameter-grid coordinate of each position in the region."""
    b = prm.blocks
    out = []
    for a, (lo, hi) in enumerate(region):
        pos = np.arange(lo, hi, dtype=np.int64)
        if b.index is not None and a == b.index.axis:
            gidx = np.asarray(src.array(b.index.tensor)[lo:hi]).astype(np.int64)
            bad = (gidx < 0) | (gidx >= b.index.count)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise error("GROUP_INDEX_RANGE", f"group index at position {lo + i} is {int(gidx[i])}, expected 0..{b.index.count - 1}", field=f"{prm.role}.blocks.index.tensor")
            out.append(gidx)
        else:
            s = b.size[a]  # type: ignore[index]
            out.append(np.zeros(1 if hi > lo else 0, np.int64) if s is None else pos // s)
    return out


def param_values(prm: Param, desc: Descriptor, src: Source, region: Region, depth: int = 0) -> np.ndarray:
    """Parameter values (binary32) broadcastable against the region's shape."""
    grid = prm.blocks.grid_shape(desc.shape)
    if prm.blocks.type == "flat":
        shape = desc.shape
        strides = [math.prod(shape[a + 1 :]) for a in range(len(shape))]
        flat = np.zeros([1] * len(shape), np.int64)
        for a, (lo, hi) in enumerate(region):
            v = np.arange(lo, hi, dtype=np.int64) * strides[a]
            flat = flat + v.reshape([-1 if i == a else 1 for i in range(len(shape))])
        cells = flat // int(prm.blocks.size)  # type: ignore[arg-type]
        if cells.size == 0:
            return np.zeros(cells.shape, np.float32)
        c0, c1 = int(cells.min()), int(cells.max()) + 1
        vals = _grid_box(prm, desc, src, ((c0, c1),), grid, depth)
        return vals[cells - c0]
    cells = _axis_cells(prm, desc, src, region)
    box = tuple((int(c.min()), int(c.max()) + 1) if c.size else (0, 0) for c in cells)
    vals = _grid_box(prm, desc, src, box, grid, depth)
    ix = np.ix_(*[c - lo for c, (lo, _) in zip(cells, box)]) if cells else ()
    return vals[ix]


def _grid_box(prm: Param, desc: Descriptor, src: Source, box: Region, grid: tuple[int, ...], depth: int) -> np.ndarray:
    """Binary32 values of the parameter grid cells in ``box``."""
    if prm.encoded is not None:
        enc = prm.encoded
        x = decode_region(enc, src, box, depth + 1)
        return _round_to(x, enc.dtype).astype(np.float32)
    arr = src.array(prm.tensor or "")
    stored = tuple(grid[a] for a in prm.order) if prm.order else grid
    g = arr.reshape(stored)
    if prm.order:
        g = g.transpose(np.argsort(prm.order))
    return np.asarray(g[tuple(slice(lo, hi) for lo, hi in box)]).astype(np.float32)


def decode_region(desc: Descriptor, src: Source, region: Region, depth: int = 0, tensor: str | None = None) -> np.ndarray:
    """Decode ``region`` to binary32 (before the cast to the logical dtype)."""
    codes = read_codes(desc, src, region)
    table, valid = element_table(desc, src)
    if valid < len(table) and codes.size and int(codes.max()) >= valid:
        bad = int(codes.max())
        raise error("CODE_OUT_OF_RANGE", f"code {bad} is past the end of a {valid}-entry codebook", tensor=tensor, field="codes.tensor")
    x = table[codes]
    if not isinstance(x, np.ndarray):  # rank 0: indexing gave a scalar
        x = np.array(x, dtype=np.float32)
    with np.errstate(all="ignore"):
        for prm in desc.params():
            v = param_values(prm, desc, src, region, depth)
            getattr(np, prm.arith)(x, v, out=x)  # np.subtract / multiply / divide / add
    return x


def _round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float32":
        return x
    with np.errstate(over="ignore"):
        return x.astype(_dt.logical_numpy(dtype))


def decode(desc: Descriptor, src: Source, region: Region | None = None, tensor: str | None = None) -> np.ndarray:
    """Decode ``region`` (default: everything) to the logical dtype, chunk by chunk."""
    if region is None:
        region = full_region(desc.shape)
    out_shape = tuple(hi - lo for lo, hi in region)
    out = np.empty(out_shape, _dt.logical_numpy(desc.dtype))
    if out.size == 0:
        return out
    if not region:
        out[()] = _round_to(decode_region(desc, src, region, tensor=tensor), desc.dtype)
        return out
    lo0, hi0 = region[0]
    row = max(1, math.prod(out_shape[1:]))
    step = max(1, CHUNK_ELEMENTS // row)
    for start in range(lo0, hi0, step):
        stop = min(hi0, start + step)
        sub = ((start, stop),) + tuple(region[1:])
        out[start - lo0 : stop - lo0] = _round_to(decode_region(desc, src, sub, tensor=tensor), desc.dtype)
    return out


def decode_full(desc: Descriptor, src: Source, tensor: str | None = None) -> np.ndarray:
    """Decode the whole logical tensor."""
    return decode(desc, src, None, tensor=tensor)
