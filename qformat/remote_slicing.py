"""Fetching only what a slice of a remote tensor needs, then slicing as for a local file.

Which bytes a block-aligned box needs is decided by :func:`qformat.slicing.slice_qtensor`
itself: it is run once on the unfetched mirror with a :class:`~qformat.slicing.RecordingSource`
(views of not-yet-fetched bytes read as zeros), the byte runs it recorded are fetched, and it is
run again on the fetched bytes.  Where the bytes read depend on values (a group index, a nested
descriptor), the second run records the ranges the real values need; runs repeat until every
recorded range is fetched, so the result is always computed from fetched bytes only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .descriptor import Descriptor, parse_descriptor
from .errors import QFormatError
from .regions import Region
from .slicing import RecordingSource, aligned_region, slice_qtensor
from .sources import ArraySource, FileSource, plain_reading

_ROUNDS = 4


def remote_slice(src: FileSource, desc: Descriptor, box: Region) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``slice_qtensor(desc, src, box)`` for a remote ``src``, fetching only the box's bytes."""
    assert src.remote is not None
    for _ in range(_ROUNDS):
        rec = RecordingSource(src)
        try:
            with src.deferred():
                sub, comps = slice_qtensor(desc, rec, box)
        except QFormatError:
            break  # decided on bytes not fetched yet: fall back to whole components below
        todo = src.remote.missing((r.offset, r.length) for r in rec.reads)
        if not todo:
            return sub, comps
        src.remote.ensure([(a, b - a) for a, b in todo])
    return slice_qtensor(desc, src, box)  # every component fetched whole; real errors raised


def remote_region(src: FileSource, desc: Descriptor, region: Region, tensor: str) -> tuple[Descriptor, ArraySource, Region]:
    """What decoding ``region`` of a remote tensor takes: (the descriptor of the block-aligned
    box around it, that box's components, fetched, and ``region`` relative to the box).  Any
    decoder (NumPy, torch, JAX) decodes the result as it decodes a local file's region."""
    box = aligned_region(desc, region)
    sub, comps = remote_slice(src, desc, box)
    inner = tuple((lo - blo, hi - blo) for (lo, hi), (blo, _) in zip(region, box))
    return parse_descriptor(tensor, sub), ArraySource(comps), inner


def remote_plain(src: FileSource, name: str, region: Region) -> np.ndarray:
    """``region`` of a plain tensor of a remote file, fetching only the rows it spans."""
    assert src.remote is not None
    e = src.header.entries[name]
    dt, how = plain_reading(e.dtype)
    if how != "view" or not e.shape:
        a = src.plain(name)  # packed (F4, F6_*) or a scalar: the whole tensor, which is small or rare
        return a[tuple(slice(lo, hi) for lo, hi in region)]
    row = dt.itemsize
    for n in e.shape[1:]:
        row *= n
    lo, hi = region[0]
    if hi > lo and row:
        src.remote.ensure([(src.header.data_start + e.begin + lo * row, (hi - lo) * row)])
    with src.deferred():  # rows lo..hi are fetched: view them without fetching the rest
        a = src.plain(name)
    return a[tuple(slice(lo, hi) for lo, hi in region)]
