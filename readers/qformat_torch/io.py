"""load_file, save_file and safe_open for torch, over the core's strict container and file model.

The core parses and validates everything (header, qformat object, descriptors, component
claims); this module only swaps NumPy for torch where values are produced: quantized tensors
are decoded by :mod:`qformat_torch.decode` on the requested device, plain tensors are copied
from the memory map into torch tensors.  ``get_slice`` reuses the core's index parsing and
decodes just the box asked for.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np
import torch

import qformat
from qformat import io as _core_io
from qformat.decode import Region
from qformat.errors import QFormatError, error

from ._convert import numpy_to_torch, torch_to_numpy
from .decode import decode
from .qtensor import TorchQTensor, as_qtensor
from .sources import FileTorchSource


def _raise_first(probs: list[QFormatError]) -> None:
    if probs:
        raise probs[0]


class SafeOpen(_core_io.SafeOpen):
    """A lazily read qformat file whose tensors come back as torch tensors on ``device``."""

    def __init__(self, path: str | os.PathLike[str], device: Any = "cpu"):
        super().__init__(path)
        self.device = torch.device(device)
        self._tsrc = FileTorchSource(self._src, self.device)

    def close(self) -> None:
        super().close()
        self._tsrc = None  # type: ignore[assignment]

    def __enter__(self) -> "SafeOpen":
        return self

    def _get(self, name: str, region: Region | None) -> torch.Tensor:  # type: ignore[override]
        self._known(name)
        if name in self.model.plain:
            _raise_first(self.model.tensor_problems.get(name, []))
            a = self._src.array(name)
            if region is not None:
                a = a[tuple(slice(lo, hi) for lo, hi in region)]
            return numpy_to_torch(a, self.device, self.header.entries[name].dtype)
        desc = self._descriptor(name)
        return decode(desc, self._tsrc, region, tensor=name)

    def get_tensor(self, name: str) -> torch.Tensor:  # type: ignore[override]
        """The tensor decoded to its logical dtype on the device (plain tensors: as stored)."""
        return self._get(name, None)

    def get_qtensor(self, name: str) -> TorchQTensor:  # type: ignore[override]
        """The packed tensor, its components copied to the device, not decoded."""
        desc = self._descriptor(name)
        comps = {c: self._tsrc.read(c) for _, c in desc.references()}
        return TorchQTensor(desc.to_dict(), comps, _parsed=desc)

    def get_qtensor_slice(self, name: str, key: Any) -> TorchQTensor:  # type: ignore[override]
        """The block-aligned box ``key`` of a quantized tensor as a standalone packed tensor on the
        device: only the bytes the box needs are read (qformat.slicing.slice_qtensor)."""
        return TorchQTensor.from_qtensor(super().get_qtensor_slice(name, key), self.device)

    def get_shard(self, name: str, dim: int, rank: int, world: int, packed: bool = False) -> Any:
        """Tensor-parallel shard ``rank`` of ``world`` along ``dim``, bounds from
        :func:`qformat_torch.shard_bounds` (block-aligned where the descriptor allows).

        Decoded (only that part is read and decoded), or with ``packed=True`` a TorchQTensor of
        just the shard's packed bytes (SLICE_INVALID when the bounds cannot be block-aligned).
        """
        from .slicing import shard_bounds

        shape = self.shape(name)
        desc = self._descriptor(name) if self.is_quantized(name) else None
        lo, hi = shard_bounds(shape, dim, rank, world, descriptor=desc)
        key = tuple(slice(lo, hi) if a == dim % len(shape) else slice(None) for a in range(len(shape)))
        if packed:
            return self.get_qtensor_slice(name, key)
        return self.get_slice(name)[key]


def safe_open(path: str | os.PathLike[str], framework: str = "pt", device: Any = "cpu") -> SafeOpen:
    """Open a qformat (or plain safetensors) file lazily; tensors come back as torch tensors."""
    if framework not in ("pt", "torch", "pytorch"):
        raise error("FRAMEWORK_UNKNOWN", f"the torch reader returns torch tensors (framework 'pt'), found {framework!r}")
    return SafeOpen(path, device)


def load_file(path: str | os.PathLike[str], device: Any = "cpu", dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of a file on ``device``; quantized ones decoded to their logical dtype.

    ``dtype`` (optional) converts every floating-point tensor afterwards with ``.to(dtype)``:
    quantized tensors are first decoded to their logical dtype exactly as the spec says, so the
    result is that value converted (exact when widening).  Integer tensors are left alone.
    """
    with safe_open(path, device=device) as f:
        for probs in f.model.tensor_problems.values():
            _raise_first(probs)
        out = {name: f.get_tensor(name) for name in f.keys()}
    if dtype is not None:
        out = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in out.items()}
    return out


def to_core(value: Any) -> Any:
    """A value save_file's core accepts: NumPy arrays and QTensors (torch ones converted)."""
    q = as_qtensor(value)
    if q is not None:
        return q
    if isinstance(value, torch.Tensor):
        return torch_to_numpy(value)
    return value


def save_file(tensors: Mapping[str, Any], path: str | os.PathLike[str], metadata: Mapping[str, str] | None = None,
              canonical: bool = False) -> None:
    """Write torch tensors, :class:`TorchQTensor`, :class:`qformat.QTensor` (and NumPy arrays)
    to ``path`` atomically.  Components of a packed tensor are saved byte for byte, or, with
    ``canonical``, a tensor in a device layout (SPEC.md §11) is unpacked to layout
    ``canonical`` first (lossless; the file is then readable by 1.0 readers)."""
    core = {k: to_core(v) for k, v in tensors.items()}
    if canonical:
        from .layouts import to_canonical

        core = {k: (to_canonical(v) if isinstance(v, qformat.QTensor) else v) for k, v in core.items()}
    qformat.save_file(core, path, metadata)


def load_checkpoint(path: str | os.PathLike[str], device: Any = "cpu") -> dict[str, torch.Tensor]:
    """Every tensor of a file, or of a sharded checkpoint given its ``*.safetensors.index.json``.

    The index is checked against each shard with the core's rules (INDEX_INVALID, INDEX_MISMATCH).
    """
    from qformat.container import read_header
    from qformat.index import mismatches, read_index
    from qformat.model import interpret

    path = os.fspath(path)
    if not path.endswith(".json"):
        return load_file(path, device)
    index = read_index(path)
    out: dict[str, torch.Tensor] = {}
    for shard in index.shards:
        sp = os.path.join(index.folder, shard)
        header = read_header(sp)
        model = interpret(header, _core_io.FileSource(sp, header))
        _raise_first(mismatches(index, shard, header, model))
        for name, t in load_file(sp, device).items():
            if name in out:
                raise error("INDEX_MISMATCH", f"tensor {name!r} appears in more than one shard", tensor=name, field="weight_map")
            out[name] = t
    return out


def conformance_reader(path: str) -> dict[str, np.ndarray]:
    """The conformance runner's in-process protocol: decode with torch (on the CPU), return NumPy.

    Errors propagate as the core's QFormatError, whose ``code`` the runner compares.
    """
    return {name: torch_to_numpy(t) for name, t in load_checkpoint(path, "cpu").items()}
