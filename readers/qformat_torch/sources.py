"""Where the torch decoder gets component tensors: a memory-mapped file, or tensors in memory.

A source hands out *boxes* of a component: the stored tensor reshaped (its bytes in row-major
order) and cut by one slice per axis.  The file source slices the core's memory-mapped NumPy
view first and copies only those bytes into a torch tensor on the target device, so a region
decode reads just the packed words, parameter cells and group indices it needs.  The tensor
source (a QLinear's buffers, a TorchQTensor's components) slices tensors already on the device.

Where the core reads stored arrays itself (a device layout's conversion to canonical, a stored
codebook table, a group index), it gets the NumPy view of a source (:func:`numpy_view`).
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence

import numpy as np
import torch

from qformat.descriptor import Descriptor
from qformat.layouts import canonical_view
from qformat.sources import Source, TensorInfo

from .dtypes import STORAGE_TORCH, numpy_to_torch, storage_name, torch_to_numpy

Box = Sequence[slice]


class TorchSource(Protocol):
    device: torch.device

    def info(self, name: str) -> TensorInfo | None: ...

    def read(self, name: str, shape: Sequence[int] | None = None, box: Box | None = None) -> torch.Tensor:
        """Component ``name`` (its storage dtype), reshaped to ``shape``, cut by ``box``, on the device."""
        ...


class ArrayTorchSource:
    """Boxes of a NumPy source's arrays (the core's memory map, qformat.io.FileSource, or its
    canonical view of a device layout), only the box's bytes copied into torch on the device."""

    def __init__(self, src: Source, device: Any):
        self.arrays = src
        self.device = torch.device(device)

    def info(self, name: str) -> TensorInfo | None:
        return self.arrays.info(name)

    def read(self, name: str, shape: Sequence[int] | None = None, box: Box | None = None) -> torch.Tensor:
        a = self.arrays.array(name)
        if shape is not None:
            a = a.reshape(tuple(shape))
        if box is not None:
            a = a[tuple(box)]
        info = self.arrays.info(name)
        return numpy_to_torch(a, self.device, None if info is None else info.dtype)


#: The file source is the array source over the core's memory map.
FileTorchSource = ArrayTorchSource


class TensorSource:
    """Components held as torch tensors (in their storage dtypes)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], device: Any = None):
        self._t = dict(tensors)
        if device is None:
            devs = {t.device for t in self._t.values()}
            device = devs.pop() if len(devs) == 1 else "cpu"
        self.device = torch.device(device)

    def info(self, name: str) -> TensorInfo | None:
        t = self._t.get(name)
        if t is None:
            return None
        return TensorInfo(storage_name(t.dtype), tuple(int(s) for s in t.shape))

    def read(self, name: str, shape: Sequence[int] | None = None, box: Box | None = None) -> torch.Tensor:
        t = self._t[name]
        if shape is not None:
            t = t.reshape(tuple(shape))
        if box is not None:
            t = t[tuple(box)]
        return t.to(self.device)


class NumpyView:
    """The core's NumPy :class:`~qformat.sources.Source` interface over a torch source (each
    array copied to the CPU when asked for)."""

    def __init__(self, src: TorchSource):
        self.src = src

    def info(self, name: str) -> TensorInfo | None:
        return self.src.info(name)

    def array(self, name: str) -> np.ndarray:
        return torch_to_numpy(self.src.read(name))


def numpy_view(src: TorchSource) -> Source:
    """``src`` as a NumPy source for the core: an array source's own arrays (no copy), else a
    :class:`NumpyView`."""
    return src.arrays if isinstance(src, ArrayTorchSource) else NumpyView(src)


def canonical_source(desc: Descriptor, src: TorchSource) -> tuple[Descriptor, TorchSource]:
    """(the canonical descriptor, a torch source of its components) for a tensor read: a device
    layout (SPEC.md §11) is unpacked by the core's :func:`qformat.layouts.canonical_view` over the
    NumPy view of ``src``, whose canonical arrays are then read like any others; a canonical
    descriptor comes back with ``src`` unchanged.  Readers call this once per tensor read."""
    cdesc, csrc = canonical_view(desc, numpy_view(src))
    return (desc, src) if cdesc is desc else (cdesc, ArrayTorchSource(csrc, src.device))


__all__ = ["ArrayTorchSource", "FileTorchSource", "NumpyView", "STORAGE_TORCH", "TensorSource", "TorchSource",
           "canonical_source", "numpy_view"]
