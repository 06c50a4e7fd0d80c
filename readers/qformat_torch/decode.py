"""The torch decoder: qformat.decode's region logic, in torch ops on the target device.

Regions, the alignment of packed rows, parameter cells, group indices and nested (encoded)
parameters follow :mod:`qformat.decode` step for step; only the arithmetic moved to torch.
Every step of SPEC.md's "Decode arithmetic" is its own torch op on binary32 tensors (x - z,
x * s or x / s, x + b or x - b), each rounded once to nearest-even, never fused, then one
``.to(dtype)`` (round to nearest even, overflow to Inf) to the logical dtype.  On CPU the result
is bit-identical to the NumPy reference (tests/readers/test_torch_decode.py proves it with the
core's hypothesis strategy).

Element values come from the core's tables (:func:`qformat.elements.lut`), copied to the device
as a 2**bits lookup table; parameters stored as float8 widen through the same tables, so no
framework cast decides what a code means.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from functools import lru_cache
from typing import Iterator, Sequence

import numpy as np
import torch

from qformat.decode import block_view
from qformat.descriptor import Descriptor, Param, codes_shape
from qformat.elements import Element, float_lut
from qformat.elements import lut as element_lut
from qformat.errors import error
from qformat.packing import Packing

from ._convert import LOGICAL_TORCH, int_view_dtype
from .sources import TorchSource

#: Elements decoded per chunk of a full decode (temporaries of 16 MB).  Each chunk's ops are
#: intra-op parallel regions; fewer, larger chunks keep torch's thread barriers rare, which matters
#: when the cores are shared (smaller chunks measured 5x slower with 2 threads on a busy machine).
CHUNK_ELEMENTS = 1 << 22

Region = tuple[tuple[int, int], ...]

_F8_FORMATS = {"F8_E4M3": "e4m3fn", "F8_E5M2": "e5m2", "F8_E8M0": "e8m0fnu"}


def full_region(shape: Sequence[int]) -> Region:
    return tuple((0, int(n)) for n in shape)


# -- integers of any stored width, as non-negative int32/int64 ------------------------------------
def as_int(t: torch.Tensor, storage: str) -> torch.Tensor:
    """Integer values of a stored integer tensor (unsigned ones zero-extended) as int32 / int64."""
    if storage in ("U16",):
        return t.view(torch.int16).to(torch.int32) & 0xFFFF
    if storage in ("U32",):
        return t.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    if storage in ("U64",):
        return t.view(torch.int64)
    if storage in ("U8", "I8", "I16"):
        return t.to(torch.int32)
    return t.to(torch.int64)


def words_int(t: torch.Tensor, container: int) -> torch.Tensor:
    """Containers (any dtype of the container's width, bytes reinterpreted) as unsigned integers."""
    if container == 8:
        return t.view(torch.uint8)
    w = t.view(int_view_dtype(container // 8))
    if container == 32:
        return w.to(torch.int64) & 0xFFFFFFFF
    return w.to(torch.int32) & ((1 << container) - 1)


def widen(t: torch.Tensor, storage: str) -> torch.Tensor:
    """Parameter or table values widened exactly to binary32 (SPEC.md, "Parameters")."""
    if storage == "F32":
        return t
    if storage in ("F16", "BF16"):
        return t.to(torch.float32)
    if storage in _F8_FORMATS:
        table = _constant(("f8", _F8_FORMATS[storage]), t.device)
        return table[t.view(torch.uint8).to(torch.int64)]
    return as_int(t, storage).to(torch.float32)


# -- unpacking -----------------------------------------------------------------------------------
def raw_words(p: Packing, length: int, bits: int) -> int:
    """Containers holding ``length`` codes from an aligned start (no row-alignment padding)."""
    return dataclasses.replace(p, row_alignment=1).words_per_row(length, bits) if length > 0 else 0


@lru_cache(maxsize=256)
def _valid_codes(el: Element) -> int:
    return element_lut(el)[1]


@lru_cache(maxsize=256)
def _constant(key: tuple, device: torch.device) -> torch.Tensor:
    """Small constant tables (element LUTs, slot shifts, inverse slot orders) per device, built once."""
    kind, *rest = key
    if kind == "lut":
        return torch.from_numpy(np.array(element_lut(rest[0])[0], np.float32)).to(device)
    if kind == "f8":
        return torch.from_numpy(np.array(float_lut(rest[0]), np.float32)).to(device)
    if kind == "shifts":
        container, bits, bit_order, dtype = rest
        n = container // bits
        s = [i * bits if bit_order == "lsb_first" else container - (i + 1) * bits for i in range(n)]
        return torch.tensor(s, dtype=dtype, device=device)
    if kind == "inverse":
        return torch.from_numpy(np.argsort(np.asarray(rest[0], np.int64))).to(device)
    raise KeyError(kind)


def unpack_rows(words: torch.Tensor, bits: int, p: Packing, length: int) -> torch.Tensor:
    """Codes ``[..., length]`` (int64) of rows of unsigned containers ``words[..., W]``.

    The port of :func:`qformat.packing.unpack_rows`: only the first words of each row are read,
    and padding bits never reach a code.
    """
    lead = tuple(words.shape[:-1])
    dev = words.device
    if length <= 0:
        return torch.zeros(lead + (0,), dtype=torch.int64, device=dev)
    mask = (1 << bits) - 1
    if p.uses_slots(bits):
        n = p.slots_per_word(bits)
        if n == 1:  # one code per container (8-bit codes in bytes ...): no slot order, planes are moot
            shift = 0 if p.bit_order == "lsb_first" else p.container - bits
            w = words[..., :length]
            if shift:
                w = w >> shift
            return (w & mask if bits < p.container else w).to(torch.int64)
        shifts = _constant(("shifts", p.container, bits, p.bit_order, words.dtype), dev)
        inv = None if p.slot_order is None else _constant(("inverse", p.slot_order), dev)
        if p.planes_span is None:
            w = -(-length // n)
            slots = (words[..., :w, None] >> shifts) & mask  # [..., w, n]
            if inv is not None:
                slots = slots[..., inv]
            return slots.reshape(lead + (w * n,))[..., :length].to(torch.int64)
        t = p.planes_span
        m = -(-t // n)
        full, rest = divmod(length, t)
        parts = []
        if full:
            seg = words[..., : full * m].reshape(lead + (full, m))
            slots = (seg[..., None] >> shifts) & mask  # [..., full, m, n]
            if inv is not None:
                slots = slots[..., inv]
            el = slots.transpose(-1, -2).reshape(lead + (full, n * m))[..., :t]
            parts.append(el.reshape(lead + (full * t,)))
        if rest:
            mr = -(-rest // n)
            seg = words[..., full * m : full * m + mr]
            slots = (seg[..., None] >> shifts) & mask  # [..., mr, n]
            if inv is not None:
                slots = slots[..., inv]
            parts.append(slots.transpose(-1, -2).reshape(lead + (n * mr,))[..., :rest])
        out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
        return out.to(torch.int64)
    # stream: a group of lcm(b, 8) bits holds k whole codes; bytes in stream order.
    group_bits = bits * 8 // math.gcd(bits, 8)
    k = group_bits // bits
    gb = group_bits // 8
    nb = p.container // 8
    w = -(-(length * bits) // p.container)
    raw = words[..., :w]
    j = torch.arange(nb, device=dev, dtype=raw.dtype)
    byte_shift = 8 * j if p.bit_order == "lsb_first" else 8 * (nb - 1 - j)
    by = ((raw[..., None] >> byte_shift) & 0xFF).reshape(lead + (w * nb,)).to(torch.int64)
    ngroups = -(-length // k)
    need = ngroups * gb
    if by.shape[-1] < need:
        by = torch.cat([by, torch.zeros(lead + (need - by.shape[-1],), dtype=torch.int64, device=dev)], dim=-1)
    by = by[..., :need].reshape(lead + (ngroups, gb))
    g = torch.arange(gb, device=dev, dtype=torch.int64)
    i = torch.arange(k, device=dev, dtype=torch.int64)
    if p.bit_order == "lsb_first":
        weights, shifts = 8 * g, i * bits
    else:
        weights, shifts = 8 * (gb - 1 - g), group_bits - (i + 1) * bits
    val = (by << weights).sum(dim=-1)  # disjoint bit fields: the sum is an OR, exact in int64
    codes = (val[..., None] >> shifts) & mask
    return codes.reshape(lead + (ngroups * k,))[..., :length]


def read_codes(desc: Descriptor, src: TorchSource, region: Region) -> torch.Tensor:
    """Codes (int64) of ``region``, logical axis order, reading only the words that cover it."""
    p = desc.codes.packing
    bits = desc.codes.element.bits
    rank = len(desc.shape)
    order = p.order or tuple(range(rank))
    sreg = tuple(region[a] for a in order)
    sshape, length, wpr = codes_shape(desc)
    align = p.element_alignment(bits)
    name = desc.codes.tensor
    if p.axis is None:
        inner = math.prod(sshape[1:]) if rank else 1
        r0, r1 = sreg[0] if rank else (0, 1)
        e0, e1 = r0 * inner, r1 * inner
        e0a = e0 // align * align
        e1a = min(length, -(-e1 // align) * align)
        w0 = p.words_for(e0a, bits)
        nw = raw_words(p, e1a - e0a, bits)
        flat = src.read(name, shape=(wpr,), box=(slice(w0, w0 + nw),))
        codes = unpack_rows(words_int(flat, p.container)[None, :], bits, p, e1a - e0a)[0, e0 - e0a : e1 - e0a]
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
        nw = raw_words(p, e1a - e0a, bits)
        idx = tuple(slice(lo, hi) if a != ax else slice(w0, w0 + nw) for a, (lo, hi) in enumerate(sreg))
        sub = torch.movedim(words_int(src.read(name, box=idx), p.container), ax, -1)
        codes = unpack_rows(sub, bits, p, e1a - e0a)[..., e0 - e0a : e1 - e0a]
        box = torch.movedim(codes, -1, ax)
    if p.order is not None:
        box = box.permute(tuple(int(i) for i in np.argsort(order)))
    return box


def element_table(desc: Descriptor, src: TorchSource) -> tuple[torch.Tensor, int]:
    """(2**bits binary32 lookup table on the device, number of valid codes)."""
    el = desc.codes.element
    if el.type == "codebook" and el.table_tensor is not None:
        info = src.info(el.table_tensor)
        assert info is not None
        values = widen(src.read(el.table_tensor), info.dtype).reshape(-1)
        n = 1 << el.bits
        table = torch.full((n,), float("nan"), dtype=torch.float32, device=src.device)
        table[: values.numel()] = values
        return table, int(values.numel())
    return _constant(("lut", el), src.device), _valid_codes(el)


# -- parameters ------------------------------------------------------------------------------------
def _axis_cells(prm: Param, src: TorchSource, region: Region) -> tuple[list[torch.Tensor], list[tuple[int, int]]]:
    """Per logical axis: the parameter-grid coordinate of each region position, and their range."""
    b = prm.blocks
    dev = src.device
    cells, box = [], []
    for a, (lo, hi) in enumerate(region):
        if b.index is not None and a == b.index.axis:
            info = src.info(b.index.tensor)
            assert info is not None
            g = as_int(src.read(b.index.tensor, box=(slice(lo, hi),)), info.dtype).to(torch.int64)
            bad = (g < 0) | (g >= b.index.count)
            if bool(bad.any()):
                i = int(torch.nonzero(bad)[0, 0])
                raise error("GROUP_INDEX_RANGE", f"group index at position {lo + i} is {int(g[i])}, expected 0..{b.index.count - 1}",
                            field=f"{prm.role}.blocks.index.tensor")
            cells.append(g)
            box.append((int(g.min()), int(g.max()) + 1) if g.numel() else (0, 0))
        else:
            s = b.size[a]  # type: ignore[index]
            if hi <= lo:
                cells.append(torch.zeros(0, dtype=torch.int64, device=dev))
                box.append((0, 0))
            elif s is None:
                cells.append(torch.zeros(1, dtype=torch.int64, device=dev))
                box.append((0, 1))
            else:
                cells.append(torch.arange(lo, hi, device=dev, dtype=torch.int64) // s)
                box.append((lo // s, (hi - 1) // s + 1))
    return cells, box


def param_values(prm: Param, desc: Descriptor, src: TorchSource, region: Region, depth: int = 0) -> torch.Tensor:
    """Parameter values (binary32) broadcastable against the region's shape."""
    grid = prm.blocks.grid_shape(desc.shape)
    rank = len(desc.shape)
    dev = src.device
    if prm.blocks.type == "flat":
        shape = desc.shape
        strides = [math.prod(shape[a + 1 :]) for a in range(rank)]
        size = int(prm.blocks.size)  # type: ignore[arg-type]
        if any(hi <= lo for lo, hi in region):
            return torch.zeros(tuple(hi - lo for lo, hi in region), dtype=torch.float32, device=dev)
        flat = torch.zeros([1] * rank, dtype=torch.int64, device=dev)
        for a, (lo, hi) in enumerate(region):
            v = torch.arange(lo, hi, device=dev, dtype=torch.int64) * strides[a]
            flat = flat + v.reshape([-1 if i == a else 1 for i in range(rank)])
        c0 = sum(lo * st for (lo, _), st in zip(region, strides)) // size
        c1 = sum((hi - 1) * st for (_, hi), st in zip(region, strides)) // size + 1
        vals = _grid_box(prm, src, ((c0, c1),), grid, depth)
        return vals[flat // size - c0]
    cells, box = _axis_cells(prm, src, region)
    vals = _grid_box(prm, src, tuple(box), grid, depth)
    if not cells:
        return vals
    ix = tuple((c - lo).reshape([-1 if i == a else 1 for i in range(rank)]) for a, (c, (lo, _)) in enumerate(zip(cells, box)))
    return vals[ix]


def _grid_box(prm: Param, src: TorchSource, box: Region, grid: tuple[int, ...], depth: int) -> torch.Tensor:
    """Binary32 values of the parameter grid cells in ``box``."""
    if prm.encoded is not None:
        enc = prm.encoded
        return round_to(decode_region(enc, src, box, depth + 1), enc.dtype).to(torch.float32)
    name = prm.tensor or ""
    info = src.info(name)
    assert info is not None
    if prm.order:
        stored = tuple(grid[a] for a in prm.order)
        sbox = tuple(slice(*box[a]) for a in prm.order)
        t = src.read(name, shape=stored, box=sbox).permute(tuple(int(i) for i in np.argsort(prm.order)))
    else:
        t = src.read(name, shape=grid, box=tuple(slice(lo, hi) for lo, hi in box))
    return widen(t, info.dtype)


# -- fast paths: the same operations on the same binary32 values, in fewer passes -------------------
_BYTE_ITEM = {1: torch.float32, 2: torch.float64, 4: torch.complex128}


def _byte_table(table: bytes, bits: int, p: Packing, device: torch.device) -> torch.Tensor:
    """The core's per-byte table (the values of the codes in each of the 256 byte values, in
    element order, built with the reference unpacker) as one item per byte on the device."""
    from qformat.decode import _byte_table as core_byte_table

    return _to_device(core_byte_table(table, bits, p), p.slots_per_word(bits), device)


@lru_cache(maxsize=128)
def _to_device_cached(raw: bytes, n: int, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(raw, np.float32).copy()).view(_BYTE_ITEM[n]).to(device)


def _to_device(bt: np.ndarray, n: int, device: torch.device) -> torch.Tensor:
    """The table on the device, cached on its bytes (so it follows the core's table exactly)."""
    return _to_device_cached(bt.tobytes(), n, device)


def _fast_values(desc: Descriptor, src: TorchSource, region: Region, table: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """Element values of ``region`` by one lookup per packed byte (None: use the general path)."""
    words = _fast_words(desc, src, region, per_row=False)
    if words is None:
        return None
    p = desc.codes.packing
    bits = desc.codes.element.bits
    n = p.slots_per_word(bits)
    bt = _byte_table(table.cpu().numpy().tobytes(), bits, p, table.device)
    if out is not None and out.storage_offset() % n:  # cannot hold the table's n-value items
        out = None
    if out is None:
        out = torch.empty(tuple(hi - lo for lo, hi in region), dtype=torch.float32, device=table.device)
    torch.index_select(bt, 0, words.reshape(-1).to(torch.int32), out=out.reshape(-1).view(bt.dtype))
    return out


def _fast_param(prm: Param, desc: Descriptor, src: TorchSource, region: Region, depth: int) -> tuple[tuple[int, ...], torch.Tensor] | None:
    """(a shape to view the region's values in, the parameter's values in a shape broadcasting
    against it) without expanding the parameter, or None where blocks do not tile the region
    (the geometry is the core's :func:`qformat.decode.block_view`)."""
    view = block_view(prm, desc, region)
    if view is None:
        return None
    box, xshape, vshape = view
    vals = _grid_box(prm, src, box, prm.blocks.grid_shape(desc.shape), depth)
    return xshape, vals.reshape(vshape)


# -- decoding ----------------------------------------------------------------------------------------
def decode_region(desc: Descriptor, src: TorchSource, region: Region, depth: int = 0, tensor: str | None = None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode ``region`` to binary32 (before the cast to the logical dtype).

    ``out`` (contiguous binary32 of the region's shape) may receive the values (the result is
    returned either way; it is ``out`` on the fast path).
    """
    if desc.layout != "canonical":  # a device layout: unpack to canonical first (SPEC.md §11)
        from .layouts import canonical_view

        desc, src = canonical_view(desc, src)
    table, valid = element_table(desc, src)
    x = _fast_values(desc, src, region, table, out) if valid == table.numel() and region else None
    if x is None:
        codes = read_codes(desc, src, region)
        if valid < table.numel() and codes.numel() and int(codes.max()) >= valid:
            raise error("CODE_OUT_OF_RANGE", f"code {int(codes.max())} is past the end of a {valid}-entry codebook", tensor=tensor, field="codes.tensor")
        x = table[codes]
    # One op per step: torch's elementwise kernels never contract these into a fused multiply-add.
    for prm in desc.params():
        fast = _fast_param(prm, desc, src, region, depth) if region and x.is_contiguous() else None
        if fast is not None:
            xshape, v = fast
            xv = x.view(xshape)
            getattr(torch, prm.arith)(xv, v, out=xv)  # in place: x is this function's own tensor
            continue
        v = param_values(prm, desc, src, region, depth)
        x = getattr(torch, prm.arith)(x, v)  # torch.subtract / multiply / divide / add
    return x


def round_to(x: torch.Tensor, dtype: str) -> torch.Tensor:
    """Binary32 values to a logical dtype: round to nearest even, overflow to Inf."""
    return x if dtype == "float32" else x.to(LOGICAL_TORCH[dtype])


def decode(desc: Descriptor, src: TorchSource, region: Region | None = None, tensor: str | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode ``region`` (default: everything) to the logical dtype, chunk by chunk along axis 0.

    ``out``: a contiguous tensor of the region's shape and logical dtype on the source's device to
    decode into (returned); without it the output is allocated.
    """
    if region is None:
        region = full_region(desc.shape)
    if desc.layout != "canonical":  # once per call (SPEC.md §11)
        from .layouts import canonical_view

        desc, src = canonical_view(desc, src)
    out_shape = tuple(hi - lo for lo, hi in region)
    dt = LOGICAL_TORCH[desc.dtype]
    if any(n == 0 for n in out_shape):
        return torch.empty(out_shape, dtype=dt, device=src.device) if out is None else out
    if not region:
        r = round_to(decode_region(desc, src, region, tensor=tensor), desc.dtype).reshape(())
        return r if out is None else out.copy_(r)
    lo0, hi0 = region[0]
    row = max(1, math.prod(out_shape[1:]))
    step = max(1, CHUNK_ELEMENTS // row)
    # keep parameter blocks whole along axis 0 in each chunk, so the fast parameter path applies
    from qformat.decode import _row_multiple

    mult = _row_multiple(desc)
    step = max(mult, step // mult * mult)
    if out is None:
        out = _empty_out(out_shape, dt, src.device)
    elif tuple(out.shape) != out_shape or out.dtype != dt or not out.is_contiguous() or out.device != torch.device(src.device):
        raise ValueError(f"out must be a contiguous {dt} tensor of shape {out_shape} on {src.device}, found {out.dtype} {tuple(out.shape)} on {out.device}")
    if _fast_decode(desc, src, region, out):
        return out
    # binary32 values of a narrower logical dtype go through one reused chunk buffer
    scratch = None if dt == torch.float32 else torch.empty((min(step, hi0 - lo0),) + out_shape[1:], dtype=torch.float32, device=src.device)
    for start in range(lo0, hi0, step):
        stop = min(hi0, start + step)
        sub = ((start, stop),) + tuple(region[1:])
        dst = out[start - lo0 : stop - lo0]
        x = decode_region(desc, src, sub, tensor=tensor, out=dst if scratch is None else scratch[: stop - start])
        if x.data_ptr() != dst.data_ptr():
            dst.copy_(round_to(x, desc.dtype))  # the same round-to-nearest-even cast as .to()
    return out


# -- the whole-tensor fast path: byte lookup and per-block steps chunk by chunk, in cache -----------
#: Elements per chunk of the fast path: 1 MB of binary32 (with its int32 byte indices and the
#: cast's destination, about the 2 MB L2 of one core), so the lookup, every parameter step and
#: the cast of a chunk run in cache; smaller chunks measured slower (per-op dispatch costs ~10 us).
FAST_CHUNK_ELEMENTS = 1 << 18

_POOLS: dict[int, "ThreadPoolExecutor"] = {}
_THREAD_LOCAL_OK: bool | None = None  # torch.set_num_threads is per thread (OpenMP): checked once


def _worker_init() -> None:
    # Each worker runs its chunks' ops on its own thread: no intra-op parallel region, so no
    # barrier waits on a busy machine.  Under OpenMP this setting is per thread.
    torch.set_num_threads(1)


def _pool(n: int) -> "ThreadPoolExecutor | None":
    """``n`` worker threads whose torch ops run single-threaded, or None where
    ``torch.set_num_threads`` is not per-thread (then the caller's setting is left alone)."""
    global _THREAD_LOCAL_OK
    from concurrent.futures import ThreadPoolExecutor

    if _THREAD_LOCAL_OK is None:
        _THREAD_LOCAL_OK = "OpenMP" in torch.__config__.parallel_info()
    if not _THREAD_LOCAL_OK:
        return None
    pool = _POOLS.get(n)
    if pool is None:
        before = torch.get_num_threads()
        pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="qformat-torch-decode", initializer=_worker_init)
        list(pool.map(lambda _: None, range(n)))  # start the workers now, then check the caller kept its setting
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
            _THREAD_LOCAL_OK = False
            pool.shutdown()
            return None
        pool = _POOLS.setdefault(n, pool)
    return pool


def _fast_words(desc: Descriptor, src: TorchSource, region: Region, per_row: bool = True) -> torch.Tensor | None:
    """The packed bytes of ``region`` (uint8) where a per-byte lookup applies, else None.  With
    ``per_row`` they come as ``[rows, ...]`` with each row's bytes holding exactly that row's
    codes; otherwise a row of ``axis`` null only needs the region's first and last code on byte
    boundaries."""
    p = desc.codes.packing
    bits = desc.codes.element.bits
    rank = len(desc.shape)
    if rank == 0 or p.container != 8 or p.order is not None or p.planes_span is not None or not p.uses_slots(bits):
        return None
    n = p.slots_per_word(bits)
    if n not in _BYTE_ITEM:
        return None
    if p.axis is None:  # one row: whole logical rows are a contiguous run of bytes
        if any(region[a] != (0, desc.shape[a]) for a in range(1, rank)):
            return None
        inner = math.prod(desc.shape[1:])
        r0, r1 = region[0]
        e0, e1 = r0 * inner, r1 * inner
        if (inner % n) if per_row else (e0 % n or (e1 - e0) % n):
            return None
        _, _, wpr = codes_shape(desc)
        words = src.read(desc.codes.tensor, shape=(wpr,), box=(slice(e0 // n, e1 // n),)).view(torch.uint8)
        return words.reshape(r1 - r0, inner // n) if per_row else words
    if p.axis != rank - 1:
        return None
    c0, c1 = region[-1]
    if c0 % n or (c1 - c0) % n:
        return None
    idx = tuple(slice(lo, hi) for lo, hi in region[:-1]) + (slice(c0 // n, c1 // n),)
    return src.read(desc.codes.tensor, box=idx).view(torch.uint8)


def _fast_decode(desc: Descriptor, src: TorchSource, region: Region, out: torch.Tensor) -> bool:
    """Decode ``region`` into ``out`` (contiguous, logical dtype) by chunks of rows: per chunk one
    byte-to-int32 copy into a reused index buffer, one ``index_select`` from the 256-entry byte
    table, one in-place op per parameter with its per-block values broadcast (never expanded),
    and one round-to-nearest-even cast into ``out``.  The same binary32 ops, in the same order, on
    the same values as :func:`decode_region`: only the passes over memory change.  Returns False
    (nothing written) where the tensor needs the general path."""
    table, valid = element_table(desc, src)
    if valid != table.numel() or not region:
        return False
    words = _fast_words(desc, src, region)
    if words is None:
        return False
    n_per_byte = desc.codes.packing.slots_per_word(desc.codes.element.bits)
    if out.storage_offset() % n_per_byte:  # the byte table's items are viewed over ``out``
        return False
    rows = region[0][1] - region[0][0]
    if any(block_view(prm, desc, region) is None for prm in desc.params()):
        return False
    n = torch.get_num_threads() if out.device.type == "cpu" else 1
    pool = _pool(n) if n > 1 else None

    def prepare() -> list:
        steps = []
        for prm in desc.params():
            fast = _fast_param(prm, desc, src, region, 0)
            assert fast is not None
            steps.append((getattr(torch, prm.arith), fast[0], fast[1]))
        return steps

    # parameter values (nested encoded ones are decoded here) on a single-threaded worker too:
    # many small ops, each a parallel region with intra-op threads
    steps = prepare() if pool is None else pool.submit(prepare).result()
    from qformat.decode import _row_multiple

    row = max(1, math.prod(out.shape[1:]))
    mult = _row_multiple(desc)
    step = max(mult, FAST_CHUNK_ELEMENTS // row // mult * mult)
    # every step's leading dimension must split at chunk boundaries
    for _, xshape, _ in steps:
        if (step * xshape[0]) % rows:
            return False
    bits = desc.codes.element.bits
    p = desc.codes.packing
    bt = _byte_table(table.cpu().numpy().tobytes(), bits, p, table.device)
    direct = out.dtype == torch.float32
    bpr = max(1, words[0].numel()) if rows else 1
    starts = list(range(0, rows, step))

    def work(chunk_starts: Iterator[int]) -> None:
        idx = _buffer("idx", step * bpr, torch.int32, out.device)
        scratch = None if direct else _buffer("f32", step * row, torch.float32, out.device).view((step,) + tuple(out.shape[1:]))
        for a in chunk_starts:
            b = min(rows, a + step)
            w = words[a:b]
            ib = idx[: w.numel()]
            ib.view(w.shape).copy_(w)
            x = out[a:b] if direct else scratch[: b - a]  # type: ignore[index]
            torch.index_select(bt, 0, ib, out=x.reshape(-1).view(bt.dtype))
            for op, xshape, v in steps:
                k = (b - a) * xshape[0] // rows
                xv = x.view((k,) + tuple(xshape[1:]))
                if v.shape[0] == xshape[0] != 1:  # values per leading block: this chunk's
                    v = v[a * xshape[0] // rows : a * xshape[0] // rows + k]
                op(xv, v, out=xv)  # one binary32 op per step, in place: torch never fuses these
            if not direct:
                out[a:b].copy_(x)  # the same round-to-nearest-even cast as .to()

    if pool is None or len(starts) < 2 * n:
        work(iter(starts))
    else:
        # the workers take chunks from one shared iterator (next() holds the GIL): a worker
        # whose core is busy elsewhere simply takes fewer chunks; no barrier between chunks
        shared = iter(starts)
        for _ in pool.map(work, [shared] * n):
            pass
    return True


_BUFFERS = threading.local()


def _buffer(kind: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A per-thread scratch buffer of at least ``numel`` elements, kept between calls: fresh
    megabyte allocations are page-faulted in on every call otherwise."""
    if device.type != "cpu" or numel > 4 * FAST_CHUNK_ELEMENTS:  # a huge row: not kept
        return torch.empty(numel, dtype=dtype, device=device)
    cache = getattr(_BUFFERS, "d", None)
    if cache is None:
        cache = _BUFFERS.d = {}
    b = cache.get(kind)
    if b is None or b.numel() < numel or b.dtype != dtype:
        b = cache[kind] = torch.empty(numel, dtype=dtype)
    return b[:numel]


_MADVISE = None


def _empty_out(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.empty`` for the output, on CPU with a transparent-huge-page hint for large ones
    (``madvise(MADV_HUGEPAGE)``, as NumPy gives its own large arrays): first-touch page faults
    of 4 KB pages cost more than the decode itself (64 MB: ~30 ms of faults against ~4 ms with
    2 MB pages on this kind of machine).  The hint changes no value; it is skipped where the
    call is unavailable."""
    global _MADVISE
    t = torch.empty(shape, dtype=dtype, device=device)
    nbytes = t.numel() * t.element_size()
    if t.device.type != "cpu" or nbytes < (4 << 20):
        return t
    if _MADVISE is None:
        try:
            import ctypes
            import sys

            if not sys.platform.startswith("linux"):
                raise OSError
            libc = ctypes.CDLL(None, use_errno=True)
            fn = libc.madvise
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            fn.restype = ctypes.c_int
            _MADVISE = fn
        except (OSError, AttributeError):
            _MADVISE = False
    if _MADVISE:
        page = 4096
        a = -(-t.data_ptr() // page) * page
        e = (t.data_ptr() + nbytes) // page * page
        if e > a:
            _MADVISE(a, e - a, 14)  # MADV_HUGEPAGE; an error (no THP) leaves the hint unset
    return t
