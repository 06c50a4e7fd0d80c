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
from qformat.errors import error, raise_first
from qformat.index import is_index
from qformat.remote_slicing import remote_region
from qformat.io import SafeOpen as CoreSafeOpen
from qformat.io import Slice as CoreSlice
from qformat.io import index_plan, parse_index
from qformat.regions import Region

from .dtypes import numpy_to_torch, torch_to_numpy
from .decode import decode
from .qtensor import TorchQTensor, as_qtensor
from .sources import ArrayTorchSource


class SafeOpen:
    """A lazily read qformat file whose tensors come back as torch tensors on ``device``.

    It composes the core's :class:`qformat.io.SafeOpen` (:attr:`core`), which parses and
    validates the file; this class only produces torch tensors from it.
    """

    def __init__(self, path: str | os.PathLike[str], device: Any = "cpu", verify: bool = False):
        from qformat.check import not_safetensors

        other = not_safetensors(os.fspath(path))  # a GGUF, text or ZIP file: what it is, as qformat.safe_open says
        if other is not None:
            raise other
        self.core = CoreSafeOpen(path, verify=verify)
        self.device = torch.device(device)
        self.path, self.header, self.model = self.core.path, self.core.header, self.core.model

    def __enter__(self) -> "SafeOpen":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Drop the references to the memory map (tensors already returned stay valid)."""
        self.core.close()

    def keys(self) -> list[str]:
        return self.core.keys()

    def metadata(self) -> dict[str, str] | None:
        return self.core.metadata()

    def is_quantized(self, name: str) -> bool:
        return self.core.is_quantized(name)

    def descriptor(self, name: str) -> dict[str, Any] | None:
        return self.core.descriptor(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.core.shape(name)

    def read(self, name: str, region: Region | None) -> torch.Tensor:
        """``region`` of a tensor (default: all of it) on the device, decoded to its logical
        dtype (plain tensors: copied as stored)."""
        if not self.core.is_quantized(name):
            return numpy_to_torch(self.core.plain_array(name, region), self.device, self.header.entries[name].dtype)
        desc = self.core.validated_descriptor(name)
        if region is not None and self.core.source.remote is not None:
            # an http(s) file: only the block-aligned box around the region is fetched
            sub, comps, inner = remote_region(self.core.source, desc, region, name)
            return decode(sub, ArrayTorchSource(comps, self.device), inner, tensor=name)
        src = ArrayTorchSource(self.core.source, self.device)
        return decode(desc, src, region, tensor=name)

    def get_tensor(self, name: str) -> torch.Tensor:
        """The tensor decoded to its logical dtype on the device (plain tensors: as stored)."""
        return self.read(name, None)

    def get_qtensor(self, name: str) -> TorchQTensor:
        """The packed tensor, its components copied to the device, not decoded."""
        desc = self.core.validated_descriptor(name)
        src = ArrayTorchSource(self.core.source, self.device)
        return TorchQTensor(desc.to_dict(), {c: src.read(c) for _, c in desc.references()}, _parsed=desc)

    def get_slice(self, name: str) -> "Slice":
        """An object whose ``[...]`` decodes only the rows or blocks asked for."""
        self.core.require(name)
        return Slice(self, name)

    def get_qtensor_slice(self, name: str, key: Any) -> TorchQTensor:
        """The block-aligned box ``key`` of a quantized tensor as a standalone packed tensor on the
        device: only the bytes the box needs are read (qformat.slicing.slice_qtensor)."""
        region, _ = parse_index(self.shape(name), key, name)
        return TorchQTensor.from_qtensor(self.core.qtensor_box(name, region), self.device)

    def get_shard(self, name: str, dim: int, rank: int, world: int, packed: bool = False) -> Any:
        """Tensor-parallel shard ``rank`` of ``world`` along ``dim``, bounds from
        :func:`qformat_torch.shard_bounds` (block-aligned where the descriptor allows).

        Decoded (only that part is read and decoded), or with ``packed=True`` a TorchQTensor of
        just the shard's packed bytes (SLICE_INVALID when the bounds cannot be block-aligned).
        """
        from .slicing import shard_bounds

        shape = self.shape(name)
        desc = self.core.validated_descriptor(name) if self.is_quantized(name) else None
        lo, hi = shard_bounds(shape, dim, rank, world, descriptor=desc)
        key = tuple(slice(lo, hi) if a == dim % len(shape) else slice(None) for a in range(len(shape)))
        if packed:
            return self.get_qtensor_slice(name, key)
        return self.get_slice(name)[key]


class Slice:
    """``get_slice(name)[...]``: decodes just the box the index spans, then indexes it (the
    core's index parsing, :func:`qformat.io.index_plan`): NumPy indexing of the decoded tensor."""

    def __init__(self, f: SafeOpen, name: str):
        self._f, self._name = f, name

    def get_shape(self) -> list[int]:
        return list(self._f.shape(self._name))

    def __getitem__(self, key: Any) -> torch.Tensor:
        if not self._f.is_quantized(self._name):  # NumPy indexing of the stored array, then one copy to torch
            e = self._f.header.entries[self._name]
            return numpy_to_torch(CoreSlice(self._f.core, self._name)[key], self._f.device, e.dtype)
        plan = index_plan(self._f.shape(self._name), key, self._name)
        return self._f.read(self._name, plan.region)[plan.post].reshape(plan.shape)

    def qtensor(self, key: Any) -> TorchQTensor:
        """The block-aligned box ``key`` as a standalone, still packed :class:`TorchQTensor`."""
        return self._f.get_qtensor_slice(self._name, key)


def safe_open(path: str | os.PathLike[str], framework: str = "pt", device: Any = "cpu", verify: bool = False) -> SafeOpen:
    """Open a qformat (or plain safetensors) file lazily; tensors come back as torch tensors.
    ``verify``: check a 1.2 file's digests (SPEC.md §3.8) of each tensor's stored bytes first
    (DIGEST_MISMATCH, DIGEST_UNSUPPORTED), as :func:`qformat.safe_open`."""
    if framework not in ("pt", "torch", "pytorch"):
        raise error("FRAMEWORK_UNKNOWN", f"the torch reader returns torch tensors (framework 'pt'), found {framework!r}")
    return SafeOpen(path, device, verify)


def load_file(path: str | os.PathLike[str], device: Any = "cpu", dtype: torch.dtype | None = None,
              verify: bool = False) -> dict[str, torch.Tensor]:
    """Every tensor of a file, or of a sharded checkpoint given its ``*.safetensors.index.json``,
    on ``device``; quantized ones decoded to their logical dtype.

    ``dtype`` (optional) converts every floating-point tensor afterwards with ``.to(dtype)``:
    quantized tensors are first decoded to their logical dtype exactly as the spec says, so the
    result is that value converted (exact when widening).  Integer tensors are left alone.
    ``verify``: check the digests a 1.2 file records (SPEC.md §3.8) before returning a tensor.
    """
    if is_index(path):
        out = load_checkpoint(path, device, verify)
    else:
        with safe_open(path, device=device, verify=verify) as f:
            for probs in f.model.tensor_problems.values():
                raise_first(probs)
            out = {name: f.get_tensor(name) for name in f.core.file_order()}
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


def load_checkpoint(path: str | os.PathLike[str], device: Any = "cpu", verify: bool = False) -> dict[str, torch.Tensor]:
    """Every tensor of a file, or of a sharded checkpoint given its ``*.safetensors.index.json``.

    The index is checked against each shard with the core's rules (INDEX_INVALID, INDEX_MISMATCH).
    """
    from qformat.checkpoint import load_checkpoint as load_shards

    return load_shards(path, lambda p: load_file(p, device, verify=verify))


def conformance_reader(path: str) -> dict[str, np.ndarray]:
    """The conformance runner's in-process protocol: decode with torch (on the CPU), return NumPy.

    Errors propagate as the core's QFormatError, whose ``code`` the runner compares.
    """
    return {name: torch_to_numpy(t) for name, t in load_checkpoint(path, "cpu").items()}
