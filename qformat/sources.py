"""Where component arrays come from: memory (QTensor) or a memory-mapped file.

The decoder and validator only see this interface, so the same code checks a QTensor before
saving and a file after opening it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol

import numpy as np

from . import dtypes as _dt
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
