"""Byte-level fast paths of the converters, bit-identical to the generic NumPy reference.

The reference packer (:func:`qformat.schemes._common.pack`, through
:func:`qformat.packing.pack_rows`) and the GGUF bit maps (``gguf._Field.extract``) work on
``uint64`` copies of every code and per-element shift arrays: general, but 20 to 50 times
slower than the data movement itself.  Whole-checkpoint conversion only ever needs the
canonical packing (bytes, LSB first, rows along the last axis) and the fixed block layouts of
ggml, so this module does the same work on ``uint8`` / ``uint16`` slices with scalar shifts:

- :func:`pack_canonical`: codes ``[..., L]`` (each below ``2**bits``) into canonical bytes
  ``[..., ceil(L * bits / 8)]``, padding bits zero; exactly ``pack(codes, bits)``.
- :func:`segments` / :func:`extract`: a GGUF code field (per code: byte in block, right shift,
  width, left shift) compiled into runs of consecutive bytes with one shift, read as slices.
- :func:`canonical_copy`: already canonical packed codes re-emitted with their padding bits
  cleared, which is what unpacking then packing them again gives.

tests/convert/test_fastpack.py checks each against the reference on random data of every width
and odd row lengths.
"""

from __future__ import annotations

import math
import os
from typing import Any, Sequence

import numpy as np


def packed_width(length: int, bits: int) -> int:
    """Bytes per row of the canonical packing of ``length`` codes of ``bits`` bits."""
    return -(-length * bits // 8)


def pack_canonical(codes: np.ndarray, bits: int) -> np.ndarray:
    """Canonical packing of ``codes`` (``[..., L]``, values below ``2**bits``), as ``uint8``."""
    c = np.asarray(codes)
    if c.dtype != np.uint8:
        c = c.astype(np.uint8)
    if c.ndim == 0:
        c = c.reshape(1)
    lead, length = c.shape[:-1], c.shape[-1]
    if bits == 8:
        return np.ascontiguousarray(c)
    width = packed_width(length, bits)
    if length == 0 or c.size == 0:
        return np.zeros(lead + (width,), np.uint8)
    k = 8 // math.gcd(bits, 8)  # codes per group
    gb = k * bits // 8  # bytes per group
    ngroups = -(-length // k)
    if ngroups * k != length or not c.flags.c_contiguous:
        padded = np.zeros(lead + (ngroups * k,), np.uint8)
        padded[..., :length] = c
        c = padded
    # One group of k codes (one byte each) read as one little-endian word: code j sits at bit
    # 8 j and moves down to bit j * bits; the packed group is the word's first gb bytes.
    word = _WORD[k]
    v = c.reshape(-1).view(word)
    acc = v.copy()
    if 8 % bits == 0:  # whole codes per byte: no code crosses a byte, the low byte is the group
        for j in range(1, k):
            acc |= v >> word.type(j * (8 - bits))
        out = acc.astype(np.uint8)
    else:
        acc &= word.type((1 << bits) - 1)
        tmp = np.empty_like(v)
        for j in range(1, k):
            np.right_shift(v, word.type(j * (8 - bits)), out=tmp)
            tmp &= word.type(((1 << bits) - 1) << (j * bits))
            acc |= tmp
        del tmp
        out = acc.view(np.uint8).reshape(-1, k)[:, :gb]
    flat = out.reshape(lead + (ngroups * gb,))
    return flat if ngroups * gb == width else np.ascontiguousarray(flat[..., :width])


_WORD = {1: np.dtype("<u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}


def canonical_copy(packed: np.ndarray, length: int, bits: int) -> np.ndarray:
    """Canonically packed codes ``[..., ceil(L * bits / 8)]`` with the padding bits of each
    row's last byte cleared (a copy): ``pack(unpack(packed), bits)`` without unpacking."""
    out = np.array(packed, np.uint8, copy=True, order="C")
    rem = (length * bits) % 8
    if rem and out.shape[-1]:
        out[..., -1] &= np.uint8((1 << rem) - 1)
    return out


def segments(byte: np.ndarray, shift: np.ndarray, width: np.ndarray, dest: int) -> list[tuple[int, int, int, int, int, int]]:
    """A code field part compiled into runs ``(first code, count, first byte, right shift,
    mask, left shift)``: consecutive codes that read consecutive bytes with the same shift and
    width.  Every part of ggml's block layouts falls into runs of 4 to 64 codes."""
    byte, shift, width = (np.broadcast_to(np.asarray(a, np.int64), np.shape(byte)) for a in (byte, shift, width))
    runs: list[tuple[int, int, int, int, int, int]] = []
    n = int(byte.size)
    i = 0
    while i < n:
        j = i + 1
        while j < n and byte[j] == byte[j - 1] + 1 and shift[j] == shift[i] and width[j] == width[i]:
            j += 1
        runs.append((i, j - i, int(byte[i]), int(shift[i]), (1 << int(width[i])) - 1, int(dest)))
        i = j
    return runs


def extract(blocks: np.ndarray, count: int, parts: Sequence[list[tuple[int, int, int, int, int, int]]]) -> np.ndarray:
    """The codes ``[nblocks, count]`` (uint8) of a field given as compiled parts (:func:`segments`)."""
    out = np.empty((blocks.shape[0], count), np.uint8)
    tmp = None
    for i, runs in enumerate(parts):
        for c0, n, b0, rs, mask, ls in runs:
            src = blocks[:, b0 : b0 + n]
            dst = out[:, c0 : c0 + n]
            if i:  # later parts OR into what the first wrote
                if tmp is None or tmp.shape[1] < n:
                    tmp = np.empty((blocks.shape[0], max(n, 64)), np.uint8)
                t = tmp[:, :n]
            else:
                t = dst
            if rs:
                np.right_shift(src, np.uint8(rs), out=t)
            else:
                np.copyto(t, src)
            if mask != 0xFF:
                np.bitwise_and(t, np.uint8(mask), out=t)
            if ls:
                np.left_shift(t, np.uint8(ls), out=t)
            if i:
                dst |= t
    return out


def describe_parts(parts: Any) -> list[list[tuple[int, int, int, int, int, int]]]:
    """Compile every part of a field (``(byte, shift, width, dest)`` arrays) into runs."""
    return [segments(b, s, w, d) for b, s, w, d in parts]


#: Codes per chunk of :func:`extract_packed` (cache-sized pieces, split over worker threads).
CHUNK_CODES = 1 << 20


def extract_packed(blocks: np.ndarray, count: int, parts: Sequence[list[tuple[int, int, int, int, int, int]]],
                   shape: tuple[int, ...], bits: int, threads: int | None = None) -> np.ndarray:
    """``pack_canonical(extract(blocks, count, parts).reshape(shape), bits)``, made in chunks of
    whole rows (about :data:`CHUNK_CODES` codes each, so the unpacked codes stay in cache and
    never exist whole) on up to ``threads`` threads (default: the CPUs, at most 2).  Each chunk
    writes its own rows of the output: the bytes do not depend on the chunking or threads."""
    length = shape[-1] if shape else 1
    rows = blocks.shape[0] * count // max(1, length)
    if len(shape) < 1 or length == 0 or rows == 0 or length % count and count % length:
        return pack_canonical(extract(blocks, count, parts).reshape(shape), bits)
    width = packed_width(length, bits)
    out = np.empty((rows, width), np.uint8)
    # rows per chunk: whole blocks and whole rows
    step = max(1, CHUNK_CODES // length)
    if length < count:  # several rows per block
        per = count // length
        step = max(per, step // per * per)
    bpr = length / count  # blocks per row
    planes = nibble_planes(parts, count, blocks.shape[1]) if bits == 4 and length % count == 0 else None

    def work(r0: int) -> None:
        r1 = min(rows, r0 + step)
        b0, b1 = int(r0 * bpr), int(r1 * bpr)
        if planes is not None:
            out[r0:r1] = pack_planes(blocks[b0:b1], *planes).reshape(r1 - r0, width)
            return
        codes = extract(blocks[b0:b1], count, parts).reshape(r1 - r0, length)
        out[r0:r1] = pack_canonical(codes, bits)

    starts = range(0, rows, step)
    n = threads if threads is not None else min(2, os.cpu_count() or 1)
    if n <= 1 or len(starts) < 2:
        for r0 in starts:
            work(r0)
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(n) as ex:
            list(ex.map(work, starts))
    return out.reshape(tuple(shape[:-1]) + (width,))


def nibble_planes(parts: Sequence[list[tuple[int, int, int, int, int, int]]], count: int, block_bytes: int) -> tuple[int, int, int] | None:
    """``(offset, run, repeats)`` when a 4-bit field is ggml's nibble-plane layout (Q4_0, Q4_1,
    Q4_K): ``repeats`` runs of ``run`` bytes from byte ``offset`` on, each giving ``run`` codes
    from its low nibbles, then ``run`` from its high nibbles; None for any other layout or where
    the 16-bit reads of :func:`pack_planes` would not line up (odd offset or run)."""
    if len(parts) != 1 or block_bytes % 2:
        return None
    runs = parts[0]
    if not runs or len(runs) % 2:
        return None
    n, offset = runs[0][1], runs[0][2]
    if n % 2 or offset % 2 or 2 * n * (len(runs) // 2) != count:
        return None
    for r in range(len(runs) // 2):
        lo, hi = runs[2 * r], runs[2 * r + 1]
        if lo != (2 * r * n, n, offset + r * n, 0, 15, 0) or hi != (2 * r * n + n, n, offset + r * n, 4, 15, 0):
            return None
    return offset, n, len(runs) // 2


def pack_planes(blocks: np.ndarray, offset: int, run: int, repeats: int) -> np.ndarray:
    """The canonical packing of a nibble-plane field's codes (see :func:`nibble_planes`), per
    block ``[nblocks, repeats * run]``: equal to ``pack_canonical(extract(...), 4)``.

    Canonical byte k of a run is codes 2k and 2k + 1: for k < run / 2 the low nibbles of source
    bytes 2k and 2k + 1, after that the high nibbles of bytes 2j and 2j + 1 (j = k - run / 2).
    Read as a little-endian 16-bit word w of those two bytes, that is ``(w & 0x0F) | (w >> 4 &
    0xF0)`` and ``(w >> 4 & 0x0F) | (w >> 8 & 0xF0)``: whole-array operations on every word of
    the blocks (the few words that are not codes are computed and dropped), then one copy per
    half run.
    """
    b = np.ascontiguousarray(blocks)
    w = b.reshape(-1).view("<u2")
    t = np.empty_like(w)
    lo = np.bitwise_and(w, np.uint16(0x0F))
    np.right_shift(w, np.uint16(4), out=t)
    np.bitwise_and(t, np.uint16(0xF0), out=t)
    lo |= t
    hi = np.right_shift(w, np.uint16(8))
    hi &= np.uint16(0xF0)
    np.right_shift(w, np.uint16(4), out=t)
    t &= np.uint16(0x0F)
    hi |= t
    nb, half = b.shape[0], run // 2
    lo8 = lo.astype(np.uint8).reshape(nb, -1)
    hi8 = hi.astype(np.uint8).reshape(nb, -1)
    out = np.empty((nb, repeats, 2, half), np.uint8)
    # 8-byte words where the halves allow: a row loop over 8 single bytes costs more than the rest
    wide = "<u8" if half % 8 == 0 else "u1"
    ov = out.view(wide)
    for r in range(repeats):
        a = offset // 2 + r * half
        ov[:, r, 0] = lo8[:, a:a + half].view(wide)
        ov[:, r, 1] = hi8[:, a:a + half].view(wide)
    return out.reshape(nb, repeats * run)
