"""Where the torch decoder gets component tensors: a memory-mapped file, or tensors in memory.

A source hands out *boxes* of a component: the stored tensor reshaped (its bytes in row-major
order) and cut by one slice per axis.  The file source slices the core's memory-mapped NumPy
view first and copies only those bytes into a torch tensor on the target device, so a region
decode reads just the packed words, parameter cells and group indices it needs.  The tensor
source (a QLinear's buffers, a TorchQTensor's components) slices tensors already on the device.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence

import torch

from qformat.sources import TensorInfo

from ._convert import STORAGE_TORCH, numpy_to_torch, storage_name

Box = Sequence[slice]


class TorchSource(Protocol):
    device: torch.device

    def info(self, name: str) -> TensorInfo | None: ...

    def read(self, name: str, shape: Sequence[int] | None = None, box: Box | None = None) -> torch.Tensor:
        """Component ``name`` (its storage dtype), reshaped to ``shape``, cut by ``box``, on the device."""
        ...


class FileTorchSource:
    """Boxes of components copied from the core's memory map (qformat.io.FileSource)."""

    def __init__(self, src: Any, device: Any):
        self._src = src
        self.device = torch.device(device)

    def info(self, name: str) -> TensorInfo | None:
        return self._src.info(name)

    def read(self, name: str, shape: Sequence[int] | None = None, box: Box | None = None) -> torch.Tensor:
        a = self._src.array(name)
        if shape is not None:
            a = a.reshape(tuple(shape))
        if box is not None:
            a = a[tuple(box)]
        return numpy_to_torch(a, self.device, self._src.info(name).dtype)


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


__all__ = ["FileTorchSource", "STORAGE_TORCH", "TensorSource", "TorchSource"]
