"""Where component arrays come from: memory (QTensor) or a memory-mapped file (FileSource).

The decoder and validator only see this interface, so the same code checks a QTensor before
saving and a file after opening it.
"""

from __future__ import annotations

from dataclasses import dataclass
import mmap
from typing import Mapping, Protocol

import numpy as np

from . import dtypes as _dt
from .container import Entry, Header
from .errors import error


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
        try:
            with open(path, "rb") as f:
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if header.file_size else None
        except (OSError, ValueError) as e:
            raise error("FILE_UNREADABLE", f"cannot map {path!r}: {e}") from None

    def info(self, name: str) -> TensorInfo | None:
        e = self.header.entries.get(name)
        return None if e is None else TensorInfo(e.dtype, e.shape)

    def entry(self, name: str) -> Entry:
        return self.header.entries[name]

    def array(self, name: str) -> np.ndarray:
        e = self.header.entries[name]
        dt = _dt.storage_numpy(e.dtype)
        if dt is None:
            raise error("PLAIN_DTYPE_UNSUPPORTED", f"dtype {e.dtype} has no plain NumPy view", tensor=name)
        count = e.nbytes // dt.itemsize
        if count == 0 or self._mm is None:
            return np.zeros(e.shape, dt)
        a = np.frombuffer(self._mm, dtype=dt, count=count, offset=self.header.data_start + e.begin)
        return a.reshape(e.shape)
