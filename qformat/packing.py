"""Bit packing of codes into little-endian containers (SPEC.md section "Packing").

A *row* is the run of codes along the packed axis (or the whole flattened tensor when the
axis is null).  Each row is packed on its own into ``words_per_row`` containers of 8, 16 or
32 bits.  Two arrangements exist:

* **stream**: codes straddle container boundaries; code ``i`` occupies stream bits
  ``[i*b, (i+1)*b)``.  Used when ``straddle`` is true (the default) and ``b`` does not divide
  the container width.
* **slots**: each container holds ``n = container // b`` slots; slot ``s`` holds the element
  chosen by ``slot_order`` and ``planes``; spare bits are padding.  When ``b`` divides the
  container width the two arrangements give the same bytes, so slots are used.

Everything here works on unsigned integer arrays whose last axis is the row; callers move the
packed axis last.  ``unpack_rows`` and ``pack_rows`` are exact inverses for codes below
``2**b``, and pack(unpack(words)) == words holds exactly when every padding bit is zero, which
is how the checker detects stray padding.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

_UINT = {8: np.dtype("<u1"), 16: np.dtype("<u2"), 32: np.dtype("<u4")}


@dataclass(frozen=True)
class Packing:
    """A parsed ``packing`` object.  ``axis`` is a storage axis (after ``order``) or None."""

    container: int
    bit_order: str
    axis: int | None
    order: tuple[int, ...] | None = None
    straddle: bool = True
    slot_order: tuple[int, ...] | None = None
    planes_span: int | None = None
    row_alignment: int = 1

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Packing":
        order = d.get("order")
        slot_order = d.get("slot_order")
        planes = d.get("planes")
        return cls(
            container=int(d["container"]),
            bit_order=str(d["bit_order"]),
            axis=None if d["axis"] is None else int(d["axis"]),
            order=None if order is None else tuple(int(a) for a in order),
            straddle=bool(d.get("straddle", True)),
            slot_order=None if slot_order is None else tuple(int(a) for a in slot_order),
            planes_span=None if planes is None else int(planes["span"]),
            row_alignment=int(d.get("row_alignment", 1)),
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"container": self.container, "bit_order": self.bit_order, "axis": self.axis}
        if self.order is not None:
            d["order"] = list(self.order)
        if not self.straddle:
            d["straddle"] = False
        if self.slot_order is not None:
            d["slot_order"] = list(self.slot_order)
        if self.planes_span is not None:
            d["planes"] = {"span": self.planes_span}
        if self.row_alignment != 1:
            d["row_alignment"] = self.row_alignment
        return d

    # -- geometry -------------------------------------------------------------------------
    @property
    def word_dtype(self) -> np.dtype:
        return _UINT[self.container]

    def uses_slots(self, bits: int) -> bool:
        """True when codes sit in whole slots (no straddling)."""
        return self.container % bits == 0 or not self.straddle

    def slots_per_word(self, bits: int) -> int:
        return self.container // bits

    def problems(self, bits: int) -> list[str]:
        """Inconsistencies between this packing and a code width (empty when sound)."""
        out = []
        if bits > self.container:
            out.append(f"container of {self.container} bits is narrower than {bits}-bit codes")
            return out
        n = self.slots_per_word(bits)
        if not self.uses_slots(bits):
            if self.slot_order is not None:
                out.append(f"slot_order needs whole slots, but {bits}-bit codes straddle {self.container}-bit containers (set straddle false)")
            if self.planes_span is not None:
                out.append(f"planes need whole slots, but {bits}-bit codes straddle {self.container}-bit containers (set straddle false)")
        if self.slot_order is not None and sorted(self.slot_order) != list(range(n)):
            out.append(f"slot_order must be a permutation of 0..{n - 1}, found {list(self.slot_order)}")
        return out

    def words_per_row(self, length: int, bits: int) -> int:
        """Containers per row of ``length`` codes, including alignment padding."""
        if self.uses_slots(bits):
            n = self.slots_per_word(bits)
            if self.planes_span is None:
                w = -(-length // n)
            else:
                t = self.planes_span
                full, rest = divmod(length, t)
                w = full * -(-t // n) + (-(-rest // n) if rest else 0)
        else:
            w = -(-(length * bits) // self.container)
        a = self.row_alignment
        return -(-w // a) * a

    def element_alignment(self, bits: int) -> int:
        """Element count after which a row restarts on a container boundary.

        A sub-range of a row that starts at a multiple of this many elements unpacks as a
        shorter row starting at word ``start // alignment * words_per_alignment``.
        """
        if self.uses_slots(bits):
            n = self.slots_per_word(bits)
            return n if self.planes_span is None else self.planes_span
        return self.container // math.gcd(bits, self.container)

    def words_for(self, elements: int, bits: int) -> int:
        """Containers occupied by a whole number of alignment units of ``elements`` codes."""
        if self.uses_slots(bits):
            n = self.slots_per_word(bits)
            if self.planes_span is None:
                return elements // n
            return elements // self.planes_span * -(-self.planes_span // n)
        return elements * bits // self.container


def slot_shifts(p: Packing, bits: int) -> np.ndarray:
    """The right shift (uint32) that brings slot ``i`` of a container to bit 0, for each of the
    container's slots in slot order (SPEC.md §7.2): ``i * bits`` for ``lsb_first``,
    ``container - (i + 1) * bits`` for ``msb_first``.  Every reader unpacks with these."""
    n = p.slots_per_word(bits)
    s = np.arange(n, dtype=np.uint32)
    if p.bit_order == "lsb_first":
        return s * bits
    return (p.container - (s + 1) * bits).astype(np.uint32)


def inverse_permutation(perm: tuple[int, ...]) -> np.ndarray:
    """``inv`` with ``inv[perm[i]] == i`` (int64): gathers slots back into element order."""
    return np.argsort(np.asarray(perm, dtype=np.int64))


def unpack_rows(words: np.ndarray, bits: int, p: Packing, length: int) -> np.ndarray:
    """Unpack ``words[..., W]`` (unsigned, container width) into codes ``[..., length]`` (uint8).

    Only the first ``words_per_row(length)`` containers (before alignment padding) are read.
    A least-significant-bit-first stream (and the slot packings that are one: 8-bit containers
    filled exactly, in order) is unpacked by the native GGUF extension where it runs
    (``_ggml.unpack``, one pass instead of NumPy's 64-bit temporaries, a GGUF export's largest
    cost); :func:`unpack_rows_numpy` otherwise.  Both give the same codes (tests compare them).
    """
    lead = words.shape[:-1]
    if length == 0:
        return np.zeros(lead + (0,), np.uint8)
    native = _native_unpack(words, bits, p, length)
    if native is not None:
        return native
    return unpack_rows_numpy(words, bits, p, length)


def _native_unpack(words: np.ndarray, bits: int, p: Packing, length: int) -> np.ndarray | None:
    """:func:`unpack_rows` by ``_ggml.unpack`` when the packing is a little-endian bit stream
    it reads (None: not this packing, or no extension)."""
    stream = not p.uses_slots(bits) or (p.container == 8 and 8 % bits == 0 and p.slot_order is None and p.planes_span is None)
    if (not stream or p.bit_order != "lsb_first" or sys.byteorder != "little" or words.dtype.kind != "u" or words.dtype.byteorder == ">"
            or words.dtype.itemsize * 8 != p.container):
        return None
    from . import kernels

    unpack = getattr(kernels._ggml, "unpack", None) if kernels.ggml_available() else None
    lead = words.shape[:-1]
    rows = math.prod(lead)
    if unpack is None or rows == 0:
        return None
    w = -(-(length * bits) // p.container)  # the containers that hold the codes (a row's stream bytes, little-endian)
    raw = np.ascontiguousarray(words[..., :w]).view(np.uint8).reshape(rows, w * p.container // 8)
    out = np.empty(lead + (length,), np.uint8)
    unpack(raw, bits, rows, out)
    return out


def unpack_rows_numpy(words: np.ndarray, bits: int, p: Packing, length: int) -> np.ndarray:
    """:func:`unpack_rows` in NumPy (every packing)."""
    lead = words.shape[:-1]
    if length == 0:
        return np.zeros(lead + (0,), np.uint8)
    mask = (1 << bits) - 1
    if p.uses_slots(bits):
        n = p.slots_per_word(bits)
        shifts = slot_shifts(p, bits)
        if p.planes_span is None:
            w = -(-length // n)
            slots = (words[..., :w, None].astype(np.uint32) >> shifts) & mask  # [..., w, n]
            if p.slot_order is not None:
                slots = slots[..., inverse_permutation(p.slot_order)]
            return slots.reshape(lead + (w * n,))[..., :length].astype(np.uint8)
        t = p.planes_span
        m = -(-t // n)
        full, rest = divmod(length, t)
        inv = None if p.slot_order is None else inverse_permutation(p.slot_order)
        parts = []
        if full:
            seg = words[..., : full * m].reshape(lead + (full, m))
            slots = (seg[..., None].astype(np.uint32) >> shifts) & mask  # [..., full, m, n]
            if inv is not None:
                slots = slots[..., inv]
            el = np.swapaxes(slots, -1, -2).reshape(lead + (full, n * m))[..., :t]
            parts.append(el.reshape(lead + (full * t,)))
        if rest:
            mr = -(-rest // n)
            seg = words[..., full * m : full * m + mr]
            slots = (seg[..., None].astype(np.uint32) >> shifts) & mask  # [..., mr, n]
            if inv is not None:
                slots = slots[..., inv]
            parts.append(np.swapaxes(slots, -1, -2).reshape(lead + (n * mr,))[..., :rest])
        out = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-1)
        return out.astype(np.uint8)
    # stream: codes straddle containers.  A group of g = lcm(b, 8) bits holds k = g / b codes.
    group_bits = bits * 8 // math.gcd(bits, 8)
    k = group_bits // bits
    gb = group_bits // 8
    nbits = length * bits
    w = -(-nbits // p.container)
    raw = words[..., :w]
    if p.bit_order == "msb_first":
        raw = raw.astype(raw.dtype.newbyteorder(">"))  # big-endian bytes = MSB-first stream
    by = np.ascontiguousarray(raw).view(np.uint8).reshape(lead + (w * p.container // 8,))
    ngroups = -(-length // k)
    need = ngroups * gb
    if by.shape[-1] < need:
        by = np.concatenate([by, np.zeros(lead + (need - by.shape[-1],), np.uint8)], axis=-1)
    by = by[..., :need].reshape(lead + (ngroups, gb)).astype(np.uint64)
    if p.bit_order == "lsb_first":
        weights = np.left_shift(np.uint64(1), (8 * np.arange(gb, dtype=np.uint64)))
        shifts = np.arange(k, dtype=np.uint64) * np.uint64(bits)
    else:
        weights = np.left_shift(np.uint64(1), (8 * np.arange(gb - 1, -1, -1, dtype=np.uint64)))
        shifts = np.uint64(group_bits) - (np.arange(k, dtype=np.uint64) + np.uint64(1)) * np.uint64(bits)
    val = (by * weights).sum(axis=-1, dtype=np.uint64)  # [..., ngroups]
    codes = (val[..., None] >> shifts) & np.uint64(mask)
    return codes.reshape(lead + (ngroups * k,))[..., :length].astype(np.uint8)


def pack_rows(codes: np.ndarray, bits: int, p: Packing) -> np.ndarray:
    """Pack codes ``[..., L]`` (each below ``2**bits``) into ``[..., words_per_row(L)]``.

    Padding bits (spare slots, stream tail, alignment words) are zero.
    """
    codes = np.asarray(codes)
    lead = codes.shape[:-1]
    length = codes.shape[-1]
    wpr = p.words_per_row(length, bits)
    out = np.zeros(lead + (wpr,), np.uint32 if p.container == 32 else np.uint64)
    if length == 0:
        return out.astype(p.word_dtype)
    c = codes.astype(np.uint64)
    if p.uses_slots(bits):
        n = p.slots_per_word(bits)
        shifts = slot_shifts(p, bits).astype(np.uint64)
        if p.planes_span is None:
            w = -(-length // n)
            padded = np.zeros(lead + (w * n,), np.uint64)
            padded[..., :length] = c
            slots = padded.reshape(lead + (w, n))
            if p.slot_order is not None:
                slots = slots[..., list(p.slot_order)]
            out[..., :w] = (slots << shifts).sum(axis=-1, dtype=np.uint64)
        else:
            t = p.planes_span
            m = -(-t // n)
            full, rest = divmod(length, t)
            if full:
                padded = np.zeros(lead + (full, n * m), np.uint64)
                padded[..., :t] = c[..., : full * t].reshape(lead + (full, t))
                slots = np.swapaxes(padded.reshape(lead + (full, n, m)), -1, -2)  # [..., full, m, n]
                if p.slot_order is not None:
                    slots = slots[..., list(p.slot_order)]
                out[..., : full * m] = (slots << shifts).sum(axis=-1, dtype=np.uint64).reshape(lead + (full * m,))
            if rest:
                mr = -(-rest // n)
                padded = np.zeros(lead + (n * mr,), np.uint64)
                padded[..., :rest] = c[..., full * t :]
                slots = np.swapaxes(padded.reshape(lead + (n, mr)), -1, -2)
                if p.slot_order is not None:
                    slots = slots[..., list(p.slot_order)]
                out[..., full * m : full * m + mr] = (slots << shifts).sum(axis=-1, dtype=np.uint64)
        return out.astype(p.word_dtype)
    group_bits = bits * 8 // math.gcd(bits, 8)
    k = group_bits // bits
    gb = group_bits // 8
    ngroups = -(-length // k)
    padded = np.zeros(lead + (ngroups * k,), np.uint64)
    padded[..., :length] = c
    g = padded.reshape(lead + (ngroups, k))
    if p.bit_order == "lsb_first":
        shifts = np.arange(k, dtype=np.uint64) * np.uint64(bits)
        byte_shifts = 8 * np.arange(gb, dtype=np.uint64)
    else:
        shifts = np.uint64(group_bits) - (np.arange(k, dtype=np.uint64) + np.uint64(1)) * np.uint64(bits)
        byte_shifts = 8 * np.arange(gb - 1, -1, -1, dtype=np.uint64)
    val = (g << shifts).sum(axis=-1, dtype=np.uint64)
    by = ((val[..., None] >> byte_shifts) & np.uint64(0xFF)).astype(np.uint8).reshape(lead + (ngroups * gb,))
    nbytes = wpr * p.container // 8
    stream = np.zeros(lead + (nbytes,), np.uint8)
    take = min(nbytes, by.shape[-1])
    stream[..., :take] = by[..., :take]
    dt = p.word_dtype if p.bit_order == "lsb_first" else p.word_dtype.newbyteorder(">")
    return stream.view(dt).astype(p.word_dtype)
