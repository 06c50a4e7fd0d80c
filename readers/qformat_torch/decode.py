"""The torch decoder: the core's read plans (:mod:`qformat.regions`), applied with torch ops.

Which stored words, parameter cells and group indices a region needs, how the codes are cut
out of the words, how parameter cells map onto the region and how a large region is chunked
all come from the core, in plain integers and NumPy index arrays; this module only reads those
boxes through a :class:`~qformat_torch.sources.TorchSource` and does the arithmetic on the
target device.  Every step of SPEC.md's "Decode arithmetic" is its own torch op on binary32
tensors (x - z, x * s or x / s, x + b or x - b), each rounded once to nearest-even, never fused,
then one ``.to(dtype)`` (round to nearest even, overflow to Inf) to the logical dtype.  On CPU the
result is bit-identical to the NumPy reference (tests/readers/test_torch_decode.py proves it
with the core's hypothesis strategy).

Element values come from the core's tables (:func:`qformat.regions.element_table`), copied to the
device as a 2**bits lookup table; parameters stored as float8 widen through the same tables, so
no framework cast decides what a code means.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any, Callable, Iterator

import numpy as np
import torch

from qformat.decode import decode as np_decode
from qformat.decode import native_covers
from qformat.descriptor import Descriptor
from qformat.elements import float_lut
from qformat.packing import Packing, inverse_permutation, slot_shifts
from qformat.regions import (CodesRead, GridRead, Region, block_view, byte_lookup, byte_table, chunk_rows, code_range_error,
                             element_table, full_region, iter_chunks, plan_codes, plan_grid, plan_param, region_shape,
                             source_index_reader)

from .dtypes import LOGICAL_TORCH, TORCH_STORAGE, int_view_dtype
from .sources import TorchSource, canonical_source, numpy_view

__all__ = ["CHUNK_ELEMENTS", "FAST_CHUNK_ELEMENTS", "Region", "decode", "decode_region", "full_region", "round_to", "widen"]

#: Elements decoded per chunk of a general decode (temporaries of 16 MB).  Each chunk's ops are
#: intra-op parallel regions; fewer, larger chunks keep torch's thread barriers rare, which matters
#: when the cores are shared (smaller chunks measured 5x slower with 2 threads on a busy machine).
CHUNK_ELEMENTS = 1 << 22

_F8_FORMATS = {"F8_E4M3": "e4m3fn", "F8_E5M2": "e5m2", "F8_E8M0": "e8m0fnu"}

#: torch dtype whose one item holds the n binary32 values of one byte's n codes (as the core's BYTE_ITEM).
_BYTE_ITEM = {1: torch.float32, 2: torch.float64, 4: torch.complex128}


# -- constants on the device, built once from the core's NumPy tables --------------------------------
@lru_cache(maxsize=256)
def _device_copy(raw: bytes, item: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(raw, np.float32).copy()).view(item).to(device)


def on_device(values: np.ndarray, device: torch.device, item: torch.dtype = torch.float32) -> torch.Tensor:
    """A small binary32 table of the core (element table, byte table) on ``device``, viewed as
    ``item``; cached on its bytes, so it always follows the core's table exactly.  Read-only."""
    return _device_copy(np.ascontiguousarray(values, np.float32).tobytes(), item, device)


@lru_cache(maxsize=256)
def _slot_constants(p: Packing, bits: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the core's slot shifts in the words' dtype, the inverse slot order or None) on ``device``."""
    shifts = torch.from_numpy(slot_shifts(p, bits).astype(np.int64)).to(device=device, dtype=dtype)
    inv = None if p.slot_order is None else torch.from_numpy(inverse_permutation(p.slot_order)).to(device)
    return shifts, inv


# -- integers of any stored width, and exact widening to binary32 -------------------------------------
def as_int(t: torch.Tensor, storage: str) -> torch.Tensor:
    """Integer values of a stored integer tensor (unsigned ones zero-extended) as int32 / int64."""
    if storage == "U16":
        return t.view(torch.int16).to(torch.int32) & 0xFFFF
    if storage == "U32":
        return t.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    if storage == "U64":
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


def widen(t: torch.Tensor) -> torch.Tensor:
    """Stored parameter values (a tensor in its storage dtype) widened exactly to binary32
    (SPEC.md, "Parameters"); float8 through the core's tables."""
    storage = TORCH_STORAGE[t.dtype]
    if storage == "F32":
        return t
    if storage in ("F16", "BF16"):
        return t.to(torch.float32)
    if storage in _F8_FORMATS:
        table = on_device(float_lut(_F8_FORMATS[storage]), t.device)
        return table[t.view(torch.uint8).to(torch.int64)]
    return as_int(t, storage).to(torch.float32)


# -- codes ---------------------------------------------------------------------------------------------
def unpack_rows(words: torch.Tensor, bits: int, p: Packing, length: int) -> torch.Tensor:
    """Codes ``[..., length]`` (int64) of rows of unsigned containers ``words[..., W]``.

    The torch port of :func:`qformat.packing.unpack_rows` (slot shifts and slot order are the
    core's): only the first words of each row are read, and padding bits never reach a code.
    """
    lead = tuple(words.shape[:-1])
    dev = words.device
    if length <= 0:
        return torch.zeros(lead + (0,), dtype=torch.int64, device=dev)
    mask = (1 << bits) - 1
    if p.uses_slots(bits):
        n = p.slots_per_word(bits)
        if n == 1:  # one code per container (8-bit codes in bytes ...): no slot order, planes are moot
            shift = int(slot_shifts(p, bits)[0])
            w = words[..., :length]
            if shift:
                w = w >> shift
            return (w & mask if bits < p.container else w).to(torch.int64)
        shifts, inv = _slot_constants(p, bits, words.dtype, dev)
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


def apply_codes(plan: CodesRead, src: TorchSource) -> torch.Tensor:
    """Codes (int64) of a region in logical axis order: the core's :class:`~qformat.regions.CodesRead`
    applied with torch ops (only the words it names are read)."""
    words = words_int(src.read(plan.tensor, shape=plan.words_shape, box=plan.box), plan.packing.container)
    if plan.axis is None:  # one flat row of codes, reshaped to the stored rows and cut
        codes = unpack_rows(words[None, :], plan.bits, plan.packing, plan.length)[0, plan.cut[0] : plan.cut[1]]
        box = codes.reshape(plan.rows_shape)[plan.rows_box]  # type: ignore[arg-type, index]
    else:
        codes = unpack_rows(torch.movedim(words, plan.axis, -1), plan.bits, plan.packing, plan.length)
        box = torch.movedim(codes[..., plan.cut[0] : plan.cut[1]], -1, plan.axis)
    return box if plan.to_logical is None else box.permute(plan.to_logical)


# -- parameters ----------------------------------------------------------------------------------------
def grid_values(g: GridRead, src: TorchSource, depth: int) -> torch.Tensor:
    """Binary32 values of the parameter-grid cells a :class:`~qformat.regions.GridRead` names
    (grid axis order); a nested (encoded) parameter is decoded over those cells."""
    enc = g.param.encoded
    if enc is not None:
        return round_to(decode_region(enc, src, g.box, depth + 1), enc.dtype).to(torch.float32)
    t = src.read(g.param.tensor or "", shape=g.stored_shape, box=g.stored_box)
    return widen(t if g.to_grid is None else t.permute(g.to_grid))


def _index_on(index: tuple[np.ndarray, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(np.ascontiguousarray(i)).to(device) for i in index)


# -- decoding --------------------------------------------------------------------------------------------
def _byte_values(desc: Descriptor, src: TorchSource, region: Region, table: np.ndarray,
                 out: torch.Tensor | None) -> torch.Tensor | None:
    """Element values of ``region`` by one lookup per packed byte (the core's
    :func:`~qformat.regions.byte_lookup`), or None where the general path is needed."""
    look = byte_lookup(desc, region)
    if look is None or look.planes_span is not None:  # planes (§7.12): the general unpacker transposes them
        return None
    words = src.read(desc.codes.tensor, shape=look.words_shape, box=look.box).view(torch.uint8)
    bt = on_device(byte_table(table, desc.codes.element.bits, desc.codes.packing), src.device, _BYTE_ITEM[look.n])
    if out is not None and out.storage_offset() % look.n:  # cannot hold the table's n-value items
        out = None
    if out is None:
        out = torch.empty(region_shape(region), dtype=torch.float32, device=src.device)
    torch.index_select(bt, 0, words.reshape(-1).to(torch.int32), out=out.reshape(-1).view(bt.dtype))
    return out


def decode_region(desc: Descriptor, src: TorchSource, region: Region, depth: int = 0, tensor: str | None = None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode ``region`` of a canonical-layout descriptor to binary32 (before the cast to the
    logical dtype).  ``out`` (contiguous binary32 of the region's shape) may receive the values
    (the result is returned either way; it is ``out`` on the byte-lookup path)."""
    table, valid = element_table(desc, numpy_view(src))
    x = _byte_values(desc, src, region, table, out) if valid == len(table) else None
    if x is None:
        codes = apply_codes(plan_codes(desc, region), src)
        if valid < len(table) and codes.numel() and int(codes.max()) >= valid:
            raise code_range_error(int(codes.max()), valid, tensor)
        x = on_device(table, src.device)[codes]
    read_index = source_index_reader(numpy_view(src))  # group indices are range-checked by the core
    # One op per step: torch's elementwise kernels never contract these into a fused multiply-add.
    for prm in desc.params():
        step = plan_param(prm, desc, region, read_index, allow_view=x.is_contiguous())
        v = grid_values(step.grid, src, depth)
        op = getattr(torch, prm.arith)  # torch.subtract / multiply / divide / add
        if step.view is not None:  # cells tile the region: broadcast per block, in place in x (our own tensor)
            xv = x.view(step.view[0])
            op(xv, v.reshape(step.view[1]), out=xv)
        else:
            x = op(x, v[_index_on(step.index or (), src.device)])
    return x


def round_to(x: torch.Tensor, dtype: str) -> torch.Tensor:
    """Binary32 values to a logical dtype: round to nearest even, overflow to Inf."""
    return x if dtype == "float32" else x.to(LOGICAL_TORCH[dtype])


def _numpy_of(out: torch.Tensor) -> np.ndarray:
    """A NumPy view of a contiguous CPU tensor in the core's logical dtype (bfloat16 as
    ml_dtypes' bfloat16, which torch's ``.numpy()`` does not export)."""
    t = out.detach()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _check_out(out: torch.Tensor, shape: tuple[int, ...], dt: torch.dtype, device: torch.device) -> None:
    if tuple(out.shape) != shape or out.dtype != dt or not out.is_contiguous() or out.device != torch.device(device):
        raise ValueError(f"out must be a contiguous {dt} tensor of shape {shape} on {device}, found {out.dtype} {tuple(out.shape)} on {out.device}")


def decode(desc: Descriptor, src: TorchSource, region: Region | None = None, tensor: str | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode ``region`` (default: everything) to the logical dtype, chunk by chunk along axis 0.

    ``out``: a contiguous tensor of the region's shape and logical dtype on the source's device to
    decode into (returned); without it the output is allocated.  A descriptor in a device layout
    is read through its canonical view, once per call (SPEC.md §11).
    """
    if region is None:
        region = full_region(desc.shape)
    desc, src = canonical_source(desc, src)
    out_shape = region_shape(region)
    dt = LOGICAL_TORCH[desc.dtype]
    if any(n == 0 for n in out_shape):
        return torch.empty(out_shape, dtype=dt, device=src.device) if out is None else out
    if not region:  # rank 0: one value, no chunks
        r = round_to(decode_region(desc, src, region, tensor=tensor), desc.dtype).reshape(())
        return r if out is None else out.copy_(r)
    if out is None:
        out = _empty_out(out_shape, dt, src.device)
    else:
        _check_out(out, out_shape, dt, src.device)
    if src.device.type == "cpu" and native_covers(desc):
        # the core's native fused kernel (qformat.kernels) writes straight into ``out``'s memory:
        # the same bits as the torch steps below, in one pass; torch's thread setting is its
        # thread count
        np_decode(desc, numpy_view(src), region, tensor=tensor, out=_numpy_of(out), threads=torch.get_num_threads())
        return out
    if _fast_decode(desc, src, region, out):
        return out
    lo0 = region[0][0]
    step = chunk_rows(desc, region, CHUNK_ELEMENTS)  # keeps parameter blocks whole: the block view applies
    # binary32 values of a narrower logical dtype go through one reused chunk buffer
    scratch = None if dt == torch.float32 else torch.empty((min(step, out_shape[0]),) + out_shape[1:], dtype=torch.float32, device=src.device)
    for sub in iter_chunks(region, step):
        start, stop = sub[0]
        dst = out[start - lo0 : stop - lo0]
        x = decode_region(desc, src, sub, tensor=tensor, out=dst if scratch is None else scratch[: stop - start])
        if x.data_ptr() != dst.data_ptr():
            dst.copy_(round_to(x, desc.dtype))  # the same round-to-nearest-even cast as .to()
    return out


# -- the whole-tensor fast path: byte lookup and per-block steps chunk by chunk, in cache ----------------
#: Elements per chunk of the fast path: 1 MB of binary32 (with its int32 byte indices and the
#: cast's destination, about the 2 MB L2 of one core), so the lookup, every parameter step and
#: the cast of a chunk run in cache; smaller chunks measured slower (per-op dispatch costs ~10 us).
FAST_CHUNK_ELEMENTS = 1 << 18

#: One parameter step of the fast path: (torch op, the shape to view a chunk's values in with
#: its leading dimension for the whole region, the parameter's values broadcasting against it).
_Step = tuple[Callable[..., torch.Tensor], tuple[int, ...], torch.Tensor]


def _fast_decode(desc: Descriptor, src: TorchSource, region: Region, out: torch.Tensor) -> bool:
    """Decode ``region`` into ``out`` (contiguous, logical dtype) by chunks of rows: per chunk one
    byte-to-int32 copy into a reused index buffer, one ``index_select`` from the 256-entry byte
    table, one in-place op per parameter with its per-block values broadcast (never expanded),
    and one round-to-nearest-even cast into ``out``.  The same binary32 ops, in the same order, on
    the same values as :func:`decode_region`: only the passes over memory change.  Returns False
    (nothing written) where the tensor needs the general path."""
    table, valid = element_table(desc, numpy_view(src))
    look = _fast_lookup(desc, region, out) if valid == len(table) else None  # short codebooks need a range check
    if look is None:
        return False
    rows = region[0][1] - region[0][0]
    step = chunk_rows(desc, region, FAST_CHUNK_ELEMENTS)
    n = torch.get_num_threads() if out.device.type == "cpu" else 1
    pool = _pool(n) if n > 1 else None
    # parameter values (nested encoded ones are decoded here) on a single-threaded worker too:
    # many small ops, each a parallel region with intra-op threads
    # Worker threads do not inherit the caller's inference mode (thread-local in torch): each
    # task enters the caller's mode, so tensors made under torch.inference_mode() can be written.
    mode = torch.is_inference_mode_enabled()
    steps = _fast_steps(desc, src, region) if pool is None else pool.submit(_in_mode, mode, _fast_steps, desc, src, region).result()
    if steps is None:
        return False
    if any((step * xshape[0]) % rows for _, xshape, _ in steps):  # a step's leading blocks must split at chunk boundaries
        return False
    words = src.read(desc.codes.tensor, shape=look.words_shape, box=look.box).view(torch.uint8)
    if desc.codes.packing.axis is None:  # one flat run of bytes: per_row made each row whole bytes
        words = words.reshape(rows, -1)
    bt = on_device(byte_table(table, desc.codes.element.bits, desc.codes.packing), out.device, _BYTE_ITEM[look.n])
    starts = list(range(0, rows, step))
    job = _Chunks(words, bt, steps, out, step, rows)
    if pool is None or len(starts) < 2 * n:
        job.run(iter(starts))
    else:
        # the workers take chunks from one shared iterator (next() holds the GIL): a worker
        # whose core is busy elsewhere simply takes fewer chunks; no barrier between chunks
        shared = iter(starts)
        for _ in pool.map(lambda it: _in_mode(mode, job.run, it), [shared] * n):
            pass
    return True


def _in_mode(inference: bool, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` under the given inference mode (for a worker thread)."""
    with torch.inference_mode(inference):
        return fn(*args)


def _fast_lookup(desc: Descriptor, region: Region, out: torch.Tensor):  # type: ignore[no-untyped-def]
    """The core's :class:`~qformat.regions.ByteLookup` of ``region`` where the fast path applies, else None."""
    if not region:  # rank 0: nothing to chunk
        return None
    # per_row: chunks are cut between rows of axis 0, so each row's codes must be whole bytes
    look = byte_lookup(desc, region, per_row=True)
    if look is None or look.planes_span is not None:  # planes (§7.12) need a transposition: general path
        return None
    if out.dtype == torch.float32 and out.storage_offset() % look.n:  # n-value table items are written over out
        return None
    return look


def _fast_steps(desc: Descriptor, src: TorchSource, region: Region) -> list[_Step] | None:
    """Each parameter's op, block view of the region and per-block values (never expanded), or
    None where a parameter must be gathered (a group index, blocks that do not tile the region)."""
    views = [(prm, block_view(prm, desc, region)) for prm in desc.params()]
    if any(view is None for _, view in views):  # checked before any value is read
        return None
    steps: list[_Step] = []
    for prm, view in views:
        box, xshape, vshape = view  # type: ignore[misc]
        steps.append((getattr(torch, prm.arith), xshape, grid_values(plan_grid(prm, desc, box), src, 0).reshape(vshape)))
    return steps


class _Chunks:
    """One fast-path decode, run over chunks of ``step`` rows by one or more threads."""

    def __init__(self, words: torch.Tensor, table: torch.Tensor, steps: list[_Step], out: torch.Tensor, step: int, rows: int):
        self.words, self.table, self.steps, self.out, self.step, self.rows = words, table, steps, out, step, rows
        self.direct = out.dtype == torch.float32  # binary32 output: decode straight into it
        self.row = max(1, math.prod(out.shape[1:]))  # values per row
        self.row_bytes = max(1, words[0].numel())

    def run(self, starts: Iterator[int]) -> None:
        """Decode the chunks starting at the rows ``starts`` yields, with this thread's buffers."""
        out, step = self.out, self.step
        idx = _buffer("idx", step * self.row_bytes, torch.int32, out.device)
        scratch = None if self.direct else _buffer("f32", step * self.row, torch.float32, out.device).view((step,) + tuple(out.shape[1:]))
        for a in starts:
            b = min(self.rows, a + step)
            x = out[a:b] if scratch is None else scratch[: b - a]
            self._lookup(a, b, idx, x)
            self._params(a, b, x)
            if scratch is not None:
                out[a:b].copy_(x)  # the same round-to-nearest-even cast as .to()

    def _lookup(self, a: int, b: int, idx: torch.Tensor, x: torch.Tensor) -> None:
        """Rows a:b's element values: bytes widened to int32 indices, one table item per byte."""
        w = self.words[a:b]
        ib = idx[: w.numel()]
        ib.view(w.shape).copy_(w)
        torch.index_select(self.table, 0, ib, out=x.reshape(-1).view(self.table.dtype))

    def _params(self, a: int, b: int, x: torch.Tensor) -> None:
        """Rows a:b's parameter steps, in order, each one binary32 op in place (torch never fuses these)."""
        for op, xshape, v in self.steps:
            k = (b - a) * xshape[0] // self.rows  # this chunk's leading blocks
            xv = x.view((k,) + tuple(xshape[1:]))
            if v.shape[0] == xshape[0] != 1:  # values per leading block: this chunk's
                first = a * xshape[0] // self.rows
                v = v[first : first + k]
            op(xv, v, out=xv)


# -- threads and buffers of the fast path ----------------------------------------------------------------
_POOLS: dict[int, ThreadPoolExecutor] = {}
_THREAD_LOCAL_OK: bool | None = None  # torch.set_num_threads is per thread (OpenMP): checked once


def _worker_init() -> None:
    # Each worker runs its chunks' ops on its own thread: no intra-op parallel region, so no
    # barrier waits on a busy machine.  Under OpenMP this setting is per thread.
    torch.set_num_threads(1)


def _pool(n: int) -> ThreadPoolExecutor | None:
    """``n`` worker threads whose torch ops run single-threaded, or None where
    ``torch.set_num_threads`` is not per-thread (then the caller's setting is left alone)."""
    global _THREAD_LOCAL_OK
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


_BUFFERS = threading.local()


def _buffer(kind: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A per-thread scratch buffer of at least ``numel`` elements, kept between calls: fresh
    megabyte allocations are page-faulted in on every call otherwise."""
    if device.type != "cpu" or numel > 4 * FAST_CHUNK_ELEMENTS:  # a huge row: not kept
        return torch.empty(numel, dtype=dtype, device=device)
    cache = getattr(_BUFFERS, "d", None)
    if cache is None:
        cache = _BUFFERS.d = {}
    # A buffer made under inference mode cannot be written outside it (and the reverse is
    # refused as a view): one buffer per kind and mode.
    key = (kind, torch.is_inference_mode_enabled())
    b = cache.get(key)
    if b is None or b.numel() < numel or b.dtype != dtype:
        b = cache[key] = torch.empty(numel, dtype=dtype)
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
