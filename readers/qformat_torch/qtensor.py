"""TorchQTensor: a quantized tensor kept packed in torch memory (any device), decoded on use."""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping

import torch

import qformat
from qformat.descriptor import Descriptor, parse_descriptor
from qformat.validate import validate_descriptor
from qformat.qtensor import rename_references

from .dtypes import LOGICAL_TORCH, numpy_to_torch, torch_to_numpy
from .decode import Region, decode
from .sources import TensorSource


class TorchQTensor:
    """A logical tensor held as its descriptor plus packed component tensors.

    The torch counterpart of :class:`qformat.QTensor`: ``components`` are torch tensors in their
    storage dtypes, all on one device; :meth:`dequantize` decodes there with torch ops.  The
    descriptor is validated against the components on construction (the core's checks).
    """

    __slots__ = ("_descriptor", "_desc", "_components")

    def __init__(self, descriptor: Mapping[str, Any], components: Mapping[str, torch.Tensor], *, _parsed: Descriptor | None = None):
        self._descriptor = json.loads(json.dumps(descriptor))
        self._components = {str(k): v for k, v in components.items()}
        devices = {t.device for t in self._components.values()}
        if len(devices) > 1:
            raise ValueError(f"all components must be on one device, found {sorted(map(str, devices))}")
        if _parsed is None:
            _parsed = parse_descriptor("<qtensor>", self._descriptor)
            probs = validate_descriptor("<qtensor>", _parsed, TensorSource(self._components))
            if probs:
                raise probs[0]
        self._desc = _parsed

    # -- conversion ----------------------------------------------------------------------------
    @classmethod
    def from_qtensor(cls, qt: qformat.QTensor, device: Any = "cpu") -> "TorchQTensor":
        """Move a NumPy QTensor's components into torch tensors on ``device`` (bytes unchanged)."""
        return cls(qt.descriptor, {k: numpy_to_torch(v, device) for k, v in qt.components.items()})

    def to_qtensor(self) -> qformat.QTensor:
        """The NumPy :class:`qformat.QTensor` with the same descriptor and component bytes."""
        return qformat.QTensor(self._descriptor, {k: torch_to_numpy(v) for k, v in self._components.items()})

    def to(self, device: Any) -> "TorchQTensor":
        """The same packed tensor with its components on ``device``."""
        return TorchQTensor(self._descriptor, {k: v.to(device) for k, v in self._components.items()}, _parsed=self._desc)

    def renamed(self, fn: Callable[[str], str]) -> "TorchQTensor":
        """A copy whose component names are mapped through ``fn`` (descriptor updated too)."""
        return TorchQTensor(rename_references(self._descriptor, fn), {fn(k): v for k, v in self._components.items()})

    # -- properties ----------------------------------------------------------------------------
    @property
    def descriptor(self) -> dict[str, Any]:
        return json.loads(json.dumps(self._descriptor))

    @property
    def parsed(self) -> Descriptor:
        """The core's parsed descriptor."""
        return self._desc

    @property
    def components(self) -> dict[str, torch.Tensor]:
        return dict(self._components)

    @property
    def shape(self) -> torch.Size:
        return torch.Size(self._desc.shape)

    @property
    def dtype(self) -> torch.dtype:
        """The logical dtype (what :meth:`dequantize` returns)."""
        return LOGICAL_TORCH[self._desc.dtype]

    @property
    def device(self) -> torch.device:
        for t in self._components.values():
            return t.device
        return torch.device("cpu")

    @property
    def nbytes(self) -> int:
        """Bytes of all components together (the packed size)."""
        return int(sum(t.numel() * t.element_size() for t in self._components.values()))

    # -- decoding ------------------------------------------------------------------------------
    def dequantize(self, region: Region | None = None) -> torch.Tensor:
        """Decode (the whole tensor, or a box given as one ``(start, stop)`` per axis) on its device."""
        return decode(self._desc, TensorSource(self._components, self.device), region, tensor="<qtensor>")

    def __repr__(self) -> str:
        scheme = self._descriptor.get("scheme", "?")
        return f"TorchQTensor(shape={tuple(self.shape)}, dtype={self.dtype}, scheme={scheme}, device={self.device}, nbytes={self.nbytes})"


def as_qtensor(value: Any) -> qformat.QTensor | None:
    """A NumPy QTensor for a TorchQTensor or QTensor value, None for anything else."""
    if isinstance(value, TorchQTensor):
        return value.to_qtensor()
    if isinstance(value, qformat.QTensor):
        return value
    return None

