"""Where component arrays come from: memory (QTensor) or a memory-mapped file (FileSource).

The decoder and validator only see this interface, so the same code checks a QTensor before
saving and a file after opening it.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
import math
import mmap
import threading
from typing import Iterator, Mapping, Protocol

import ml_dtypes
import numpy as np

from . import dtypes as _dt
from . import tables
from .container import Entry, Header
from .errors import error


#: Largest byte count (exclusive) of the box an empty array of some shape spans, counting only
#: its non-zero axes: NumPy refuses ``itemsize * prod(non-zero entries) >= 2^63`` ("array is too
#: big"), PyTorch's strides overflow past it (SPEC.md §2.2).
_ARRAY_LIMIT = 1 << 63


def empty_shape_problem(shape: tuple[int, ...], itemsize: int, what: str) -> str | None:
    """Why no array can hold the empty ``shape`` of ``itemsize``-byte elements, or None (SPEC.md
    §2.2: ``itemsize`` times the product of the non-zero entries must be below 2^63)."""
    if 0 not in shape:
        return None
    span = itemsize
    for s in shape:
        span *= s or 1
    if span < _ARRAY_LIMIT:
        return None
    return (f"{what} of shape {list(shape)} is empty but too large for an array: {itemsize}-byte elements times the "
            f"product of its non-zero entries is {span}, expected below 2^63")


@lru_cache(maxsize=None)  # a few dtypes, asked once per tensor read: a file of 10^5 tensors asks 4 * 10^5 times
def plain_reading(dtype: str) -> tuple[np.dtype, str]:
    """(NumPy dtype, how) of a plain tensor of storage ``dtype`` (SPEC.md §2.5, §2.6): ``view``
    (the bytes viewed in place), ``nibbles`` (F4: element 2k in the low nibble of byte k, 2k+1 in
    the high one, one ``float4_e2m1fn`` per element) or ``bytes`` (F6_*: the raw bytes, 1-D U8)."""
    entry = tables.dtypes()[dtype]
    plain = entry.get("plain", "view")
    if plain == "view":
        return _dt.storage_numpy(dtype), "view"  # type: ignore[return-value]
    return np.dtype(getattr(ml_dtypes, entry["plain_numpy"]) if entry["plain_numpy"] != "uint8" else np.uint8), plain


def plain_shape(dtype: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of a plain tensor's array: the stored shape, or ``(nbytes,)`` for raw bytes (F6_*)."""
    if plain_reading(dtype)[1] == "bytes":
        return (math.prod(shape) * _dt.storage_bits(dtype) // 8,)
    return shape


def plain_shape_problem(dtype: str, shape: tuple[int, ...]) -> str | None:
    """SHAPE_UNREPRESENTABLE's message for a plain tensor, or None."""
    dt, _ = plain_reading(dtype)
    return empty_shape_problem(plain_shape(dtype, shape), dt.itemsize, f"plain tensor of {dtype}")


@dataclass(frozen=True)
class TensorInfo:
    """A stored tensor's safetensors dtype name and shape."""

    dtype: str
    shape: tuple[int, ...]


class Source(Protocol):
    def info(self, name: str) -> TensorInfo | None: ...

    def array(self, name: str) -> np.ndarray:
        """The stored array, viewed in its storage dtype (lazily, where the source can)."""
        ...


class ArraySource:
    """Components held as NumPy arrays (a QTensor before it is saved)."""

    def __init__(self, arrays: Mapping[str, np.ndarray]):
        self._arrays = dict(arrays)

    def info(self, name: str) -> TensorInfo | None:
        a = self._arrays.get(name)
        if a is None:
            return None
        st = _dt.storage_name(a.dtype)
        if st is None:
            raise error("SAVE_INVALID", f"component array dtype {a.dtype} has no safetensors dtype", tensor=name)
        return TensorInfo(st, tuple(int(s) for s in a.shape))

    def array(self, name: str) -> np.ndarray:
        return self._arrays[name]


class FileSource:
    """Components read lazily from a memory map of a file with a validated header."""

    def __init__(self, path: str, header: Header):
        self.path = path
        self.header = header
        #: for an http(s):// URL, the :class:`~qformat.remote.RemoteFile` whose sparse mirror is
        #: mapped instead of the file: its bytes are fetched by range before they are viewed.
        self.remote = None
        # per thread (see :meth:`deferred`): views of a remote mirror returned unfetched
        self._local = threading.local()
        from .remote import is_url

        if is_url(path):
            from .remote import take_remote

            self.remote = take_remote(path, header)
            self._mm = self.remote.mm
            return
        try:
            with open(path, "rb") as f:
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if header.file_size else None
        except (OSError, ValueError) as e:
            raise error("FILE_UNREADABLE", f"cannot map {path!r}: {e}") from None

    @classmethod
    def from_bytes(cls, data: bytes, header: Header, path: str = "<bytes>") -> "FileSource":
        """The stored tensors of a whole file held in memory (``data``, whose header is
        ``header``): the same views as of a memory-mapped file, for fuzzers and tests
        (:func:`qformat.io.open_bytes`)."""
        src = cls.__new__(cls)
        src.path, src.header, src.remote, src._local = path, header, None, threading.local()
        src._mm = data
        return src

    def info(self, name: str) -> TensorInfo | None:
        e = self.header.entries.get(name)
        return None if e is None else TensorInfo(e.dtype, e.shape)

    def entry(self, name: str) -> Entry:
        return self.header.entries[name]

    @property
    def bytes_fetched(self) -> int:
        """Bytes read over the network for a remote file (0 for a local one)."""
        return 0 if self.remote is None else self.remote.bytes_fetched

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Within the block, on this thread only, a remote file's arrays are views of its mirror
        whether fetched or not (unfetched bytes read as zeros): for finding, by a dry run, which
        byte ranges an operation reads (:mod:`qformat.remote_slicing`), and for views of ranges
        fetched beforehand.  Other threads still fetch what they view."""
        self._local.defer = True
        try:
            yield
        finally:
            self._local.defer = False

    def _fetch(self, e: Entry) -> None:
        """A remote file: fetch tensor ``e``'s bytes (unless deferred); local files: nothing."""
        if self.remote is not None and e.nbytes and not getattr(self._local, "defer", False):
            self.remote.ensure([(self.header.data_start + e.begin, e.nbytes)])

    def array(self, name: str) -> np.ndarray:
        e = self.header.entries[name]
        self._fetch(e)
        dt = _dt.storage_numpy(e.dtype)
        if dt is None:
            raise error("PLAIN_DTYPE_UNSUPPORTED", f"dtype {e.dtype} has no plain NumPy view", tensor=name)
        count = e.nbytes // dt.itemsize
        if count == 0 or self._mm is None:
            msg = empty_shape_problem(e.shape, dt.itemsize, f"stored tensor of {e.dtype}")
            if msg is not None:  # SPEC.md §2.2, checked before NumPy sees the shape
                raise error("SHAPE_UNREPRESENTABLE", msg, tensor=name, field="shape")
            return np.zeros(e.shape, dt)
        a = np.frombuffer(self._mm, dtype=dt, count=count, offset=self.header.data_start + e.begin)
        return a.reshape(e.shape)

    def plain(self, name: str) -> np.ndarray:
        """A plain tensor's array as SPEC.md §2.6 reads it: a memory-mapped view of the stored
        bytes, the unpacked F4 values, or the raw bytes of an F6_* tensor.  Empty shapes no array
        can hold are SHAPE_UNREPRESENTABLE (checked before anything is allocated)."""
        e = self.header.entries[name]
        dt, how = plain_reading(e.dtype)
        shape = plain_shape(e.dtype, e.shape)
        msg = empty_shape_problem(shape, dt.itemsize, f"plain tensor of {e.dtype}")
        if msg is not None:
            raise error("SHAPE_UNREPRESENTABLE", msg, tensor=name, field="shape")
        if how == "view":
            return self.array(name)
        self._fetch(e)
        raw = (np.frombuffer(self._mm, dtype=np.uint8, count=e.nbytes, offset=self.header.data_start + e.begin)
               if e.nbytes and self._mm is not None else np.zeros(0, np.uint8))
        if how == "bytes":
            return raw
        out = np.empty(2 * e.nbytes, np.uint8)  # F4: nbits = 4 * numel is a whole number of bytes
        np.bitwise_and(raw, 0x0F, out=out[0::2])
        np.right_shift(raw, 4, out=out[1::2])
        return out.view(dt).reshape(shape)
