"""Reading and writing qformat files: save_file, load_file, safe_open."""

from __future__ import annotations

import json
import os
from typing import Any, Iterator, Mapping

import numpy as np

from . import dtypes as _dt
from .checkpoint import Shard, iter_shards
from .checkpoint import load_checkpoint as _load_shards
from .container import read_header, write_file
from .decode import decode
from .descriptor import Descriptor, parse_descriptor
from .errors import error, raise_first
from .index import is_index
from .model import METADATA_KEY, FileModel, interpret, required_version
from .qtensor import QTensor
from .regions import Region
from .slicing import describe_alignment, is_aligned, slice_qtensor
from .sources import ArraySource, FileSource
from .validate import validate_descriptor

__all__ = ["CheckpointOpen", "FileSource", "SafeOpen", "Slice", "load_checkpoint", "load_file", "parse_index", "prepare",
           "safe_open", "save_file", "squeezed_shape"]

#: The specification version this implementation implements; files record
#: :func:`~qformat.model.required_version` of their descriptors instead (SPEC.md §17.1).
SPEC_VERSION = "1.1"


class _SliceMethods:
    """``get_slice`` and ``get_qtensor_slice`` over ``require``, ``shape``, ``read`` and
    ``qtensor_box`` (shared by a file and a sharded checkpoint)."""

    def require(self, name: str) -> None:
        raise NotImplementedError

    def get_slice(self, name: str) -> "Slice":
        """An object whose ``[...]`` decodes only the rows or blocks asked for."""
        self.require(name)
        return Slice(self, name)  # type: ignore[arg-type]

    def get_qtensor_slice(self, name: str, key: Any) -> QTensor:
        """``get_slice(name).qtensor(key)``: a block-aligned box, still packed."""
        return self.get_slice(name).qtensor(key)


class SafeOpen(_SliceMethods):
    """A lazily read qformat file (see :func:`safe_open`).

    Framework readers compose one of these (they do not subclass it): :meth:`require`,
    :meth:`validated_descriptor` and :attr:`source` give them the validated descriptor and the
    memory-mapped stored tensors, and :func:`parse_index` turns an index expression into a region.
    """

    def __init__(self, path: str | os.PathLike[str], shard: Shard | None = None):
        self.path = os.fspath(path)
        if shard is None:
            header = read_header(self.path)
            src = FileSource(self.path, header)
            shard = Shard(self.path, os.path.basename(self.path), header, interpret(header, src), src)
        self.header = shard.header
        self._src: FileSource | None = shard.source
        self.model: FileModel = shard.model
        raise_first(self.model.file_problems)

    # context manager
    def __enter__(self) -> "SafeOpen":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Drop this object's references to the memory map (arrays already returned stay valid)."""
        self._src = None

    @property
    def source(self) -> FileSource:
        """The stored tensors (components and plain tensors) by stored name, memory-mapped."""
        if self._src is None:
            raise error("FILE_UNREADABLE", f"{self.path!r} is closed")
        return self._src

    def keys(self) -> list[str]:
        """Logical tensor names and plain tensor names (components are not listed)."""
        return self.model.logical_names()

    def metadata(self) -> dict[str, str]:
        """The file's __metadata__ without the 'qformat' key."""
        return {k: v for k, v in (self.header.metadata or {}).items() if k != METADATA_KEY}

    def require(self, name: str) -> None:
        """TENSOR_NOT_FOUND unless ``name`` is a logical or plain tensor of the file."""
        if name not in self.model.raw and name not in self.model.plain:
            raise error("TENSOR_NOT_FOUND", f"no tensor named {name!r}; the file has {len(self.keys())} tensors", tensor=name)

    def is_quantized(self, name: str) -> bool:
        self.require(name)
        return name in self.model.raw

    def validated_descriptor(self, name: str) -> Descriptor:
        """The parsed descriptor of quantized tensor ``name``; raises the tensor's first problem."""
        self.require(name)
        raise_first(self.model.tensor_problems.get(name, []))
        return self.model.descriptors[name]

    def plain_array(self, name: str, region: Region | None = None) -> np.ndarray:
        """A plain tensor's stored array (a memory-mapped view; ``region`` cuts a box of it)."""
        self.require(name)
        raise_first(self.model.tensor_problems.get(name, []))
        a = self.source.array(name)
        return a if region is None else a[tuple(slice(lo, hi) for lo, hi in region)]

    def descriptor(self, name: str) -> dict[str, Any] | None:
        """The descriptor of a logical tensor as a dict, or None for a plain tensor."""
        self.require(name)
        if name not in self.model.raw:
            return None
        return json.loads(json.dumps(self.model.raw[name]))

    def get_qtensor(self, name: str) -> QTensor:
        """The packed tensor with its components (memory-mapped, not decoded)."""
        desc = self.validated_descriptor(name)
        comps = {c: self.source.array(c) for _, c in desc.references()}
        return QTensor(desc.to_dict(), comps)

    def get_tensor(self, name: str) -> np.ndarray:
        """The tensor decoded to its logical dtype (plain tensors: as stored)."""
        return self.read(name, None)

    def read(self, name: str, region: Region | None) -> np.ndarray:
        """``region`` of a tensor (default: all of it), decoded to its logical dtype (plain
        tensors: copied as stored)."""
        if not self.is_quantized(name):
            return np.array(self.plain_array(name, region))
        return decode(self.validated_descriptor(name), self.source, region, tensor=name)

    def shape(self, name: str) -> tuple[int, ...]:
        if not self.is_quantized(name):
            return self.header.entries[name].shape
        return self.validated_descriptor(name).shape

    def qtensor_box(self, name: str, region: Region) -> QTensor:
        """The block-aligned box ``region`` of a quantized tensor as a standalone, still packed
        :class:`QTensor` whose components are views of only the bytes the box needs
        (:mod:`qformat.slicing`).  SLICE_INVALID for a plain tensor or an unaligned box."""
        if not self.is_quantized(name):
            raise error("SLICE_INVALID", f"{name!r} is a plain tensor, not a quantized one", tensor=name)
        desc = self.validated_descriptor(name)
        if not is_aligned(desc, region):
            raise error("SLICE_INVALID", "the box is not block-aligned: " + describe_alignment(desc, region), tensor=name)
        sub, comps = slice_qtensor(desc, self.source, region)
        return QTensor(sub, comps)


def parse_index(shape: tuple[int, ...], key: Any, tensor: str | None = None) -> tuple[Region, list[int]]:
    """(region, axes indexed by an integer) of an index expression over a tensor of ``shape``:
    integers, step-1 slices and one Ellipsis; anything else is SLICE_INVALID."""
    if not isinstance(key, tuple):
        key = (key,)
    if len(key) > len(shape) or any(k is Ellipsis for k in key):
        if sum(k is Ellipsis for k in key) == 1 and len(key) - 1 <= len(shape):
            i = key.index(Ellipsis)
            key = key[:i] + (slice(None),) * (len(shape) - len(key) + 1) + key[i + 1 :]
        else:
            raise error("SLICE_INVALID", f"a {len(shape)}-D tensor takes at most {len(shape)} indices, found {len(key)}", tensor=tensor)
    region, squeeze = [], []
    for a, n in enumerate(shape):
        k = key[a] if a < len(key) else slice(None)
        if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
            i = int(k) + (n if k < 0 else 0)
            if not 0 <= i < n:
                raise error("SLICE_INVALID", f"index {int(k)} is out of range for axis {a} of size {n}", tensor=tensor)
            region.append((i, i + 1))
            squeeze.append(a)
        elif isinstance(k, slice):
            lo, hi, step = k.indices(n)
            if step != 1:
                raise error("SLICE_INVALID", f"only step-1 slices are supported, found step {step} on axis {a}", tensor=tensor)
            region.append((lo, max(lo, hi)))
        else:
            raise error("SLICE_INVALID", f"expected an integer or a slice on axis {a}, found {type(k).__name__}", tensor=tensor)
    return tuple(region), squeeze


def squeezed_shape(region: Region, squeeze: list[int]) -> list[int]:
    """The result shape of an index expression: the region's shape without integer-indexed axes."""
    return [hi - lo for a, (lo, hi) in enumerate(region) if a not in squeeze]


class Slice:
    """Indexing with integers and step-1 slices decodes just that box."""

    def __init__(self, f: SafeOpen, name: str):
        self._f, self._name = f, name

    def get_shape(self) -> list[int]:
        return list(self._f.shape(self._name))

    def __getitem__(self, key: Any) -> np.ndarray:
        region, squeeze = parse_index(self._f.shape(self._name), key, self._name)
        return self._f.read(self._name, region).reshape(squeezed_shape(region, squeeze))

    def qtensor(self, key: Any) -> QTensor:
        """The block-aligned box ``key`` as a standalone, still packed :class:`QTensor`.

        Its components are views of only the bytes the box needs (qformat.slicing); an integer
        index keeps its axis with length 1.  A box that is not block-aligned is
        ``SLICE_INVALID``, naming the nearest aligned bounds (``qformat.slicing.aligned_region``
        gives the smallest aligned box around any box).
        """
        region, _ = parse_index(self._f.shape(self._name), key, self._name)
        return self._f.qtensor_box(self._name, region)


class CheckpointOpen(_SliceMethods):
    """A sharded checkpoint opened through its ``*.safetensors.index.json`` (see :func:`safe_open`):
    the same per-tensor API as :class:`SafeOpen`, each name answered by the shard holding it.
    The index is checked against every shard when opening (INDEX_INVALID, INDEX_MISMATCH)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        self.shards: dict[str, SafeOpen] = {}
        self._home: dict[str, SafeOpen] = {}
        for shard in iter_shards(self.path):
            f = self.shards[shard.name] = SafeOpen(shard.path, shard)
            for name in f.keys():
                if name in self._home:
                    raise error("INDEX_MISMATCH", f"tensor {name!r} appears in more than one shard", tensor=name, field="weight_map")
                self._home[name] = f

    def __enter__(self) -> "CheckpointOpen":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        for f in self.shards.values():
            f.close()

    def keys(self) -> list[str]:
        """Logical and plain tensor names of every shard, sorted."""
        return sorted(self._home)

    def metadata(self) -> dict[str, str]:
        """The shards' __metadata__ (without 'qformat'), merged in shard order."""
        out: dict[str, str] = {}
        for f in self.shards.values():
            out.update(f.metadata())
        return out

    def shard_of(self, name: str) -> SafeOpen:
        """The open shard holding tensor ``name`` (TENSOR_NOT_FOUND when none does)."""
        f = self._home.get(name)
        if f is None:
            raise error("TENSOR_NOT_FOUND", f"no tensor named {name!r}; the checkpoint has {len(self._home)} tensors", tensor=name)
        return f

    def require(self, name: str) -> None:
        self.shard_of(name)

    def is_quantized(self, name: str) -> bool:
        return self.shard_of(name).is_quantized(name)

    def validated_descriptor(self, name: str) -> Descriptor:
        return self.shard_of(name).validated_descriptor(name)

    def plain_array(self, name: str, region: Region | None = None) -> np.ndarray:
        return self.shard_of(name).plain_array(name, region)

    def descriptor(self, name: str) -> dict[str, Any] | None:
        return self.shard_of(name).descriptor(name)

    def get_qtensor(self, name: str) -> QTensor:
        return self.shard_of(name).get_qtensor(name)

    def get_tensor(self, name: str) -> np.ndarray:
        return self.shard_of(name).get_tensor(name)

    def read(self, name: str, region: Region | None) -> np.ndarray:
        return self.shard_of(name).read(name, region)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.shard_of(name).shape(name)

    def qtensor_box(self, name: str, region: Region) -> QTensor:
        return self.shard_of(name).qtensor_box(name, region)


def _readable(path: str) -> None:
    """FILE_UNREADABLE, saying what ``path`` is and what reads it, for a path that is neither
    a safetensors file nor an index: a folder, a GGUF file, a missing path."""
    if os.path.isdir(path):
        idx = [f for f in sorted(os.listdir(path)) if f.endswith(".safetensors.index.json")]
        hint = f"open its index {idx[0]!r}" if idx else "open one of its .safetensors files"
        raise error("FILE_UNREADABLE", f"{path!r} is a folder: {hint}, or use `qformat convert` for a checkpoint in another format")
    if not os.path.exists(path):
        raise error("FILE_UNREADABLE", f"{path!r} does not exist")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise error("FILE_UNREADABLE", f"cannot read {path!r}: {e.strerror or e}") from None
    if magic == b"GGUF":
        raise error("FILE_UNREADABLE", f"{path!r} is a GGUF file, not safetensors: `qformat convert` reads it (into a qformat file)")


def safe_open(path: str | os.PathLike[str], framework: str = "numpy") -> SafeOpen | CheckpointOpen:
    """Open a qformat (or plain safetensors) file lazily through a memory map, or a sharded
    checkpoint through its ``*.safetensors.index.json`` (a :class:`CheckpointOpen`)."""
    if framework not in ("numpy", "np"):
        raise error("FRAMEWORK_UNKNOWN", f"the core reader returns NumPy arrays (framework 'numpy'), found {framework!r}; use the torch or JAX reader for those")
    path = os.fspath(path)
    _readable(path)
    return CheckpointOpen(path) if is_index(path) else SafeOpen(path)


def _load_one(path: str) -> dict[str, np.ndarray]:
    with SafeOpen(path) as f:
        raise_first(f.model.problems())
        return {name: f.get_tensor(name) for name in f.keys()}


def load_file(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Every tensor of a file, or of a sharded checkpoint given its index, quantized ones
    decoded to their logical dtype."""
    path = os.fspath(path)
    _readable(path)
    return _load_shards(path, _load_one)


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """:func:`load_file` under the name the readers use for sharded checkpoints."""
    return load_file(path)


def prepare(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Component arrays and __metadata__ for saving ``tensors`` (validated)."""
    meta = dict(metadata or {})
    if METADATA_KEY in meta:
        raise error("SAVE_INVALID", f"metadata key {METADATA_KEY!r} is reserved for qformat descriptors")
    for k, v in meta.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise error("SAVE_INVALID", f"metadata keys and values must be strings, found {k!r}: {type(v).__name__}")
    arrays: dict[str, np.ndarray] = {}
    descs: dict[str, Any] = {}
    owner: dict[str, str] = {}
    for name, value in tensors.items():
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise error("SAVE_INVALID", f"invalid tensor name {name!r}")
        if isinstance(value, QTensor):
            parse_descriptor(name, value.descriptor)  # schema first: renaming walks the structure
            prefix = name + "."
            qt = value.renamed(lambda c, p=prefix, n=name: c if (c == n or c.startswith(p)) else p + c)
            desc = parse_descriptor(name, qt.descriptor)
            raise_first(validate_descriptor(name, desc, ArraySource(qt.components)))
            for comp, arr in qt.components.items():
                if comp in owner or (comp in tensors and comp != name):
                    raise error("SAVE_INVALID", f"component name {comp!r} of {name!r} collides with another tensor", tensor=name)
                owner[comp] = name
                arrays[comp] = arr
            descs[name] = qt.descriptor
        else:
            a = np.asarray(value)
            if _dt.storage_name(a.dtype) is None:
                raise error("SAVE_INVALID", f"array dtype {a.dtype} has no safetensors dtype", tensor=name)
            if name in owner:
                raise error("SAVE_INVALID", f"tensor name {name!r} collides with a component of {owner[name]!r}", tensor=name)
            arrays[name] = a
    for name in descs:
        if name in arrays and owner.get(name) != name:
            raise error("SAVE_INVALID", f"logical name {name!r} collides with a stored tensor", tensor=name)
    if descs:
        meta[METADATA_KEY] = json.dumps({"version": required_version(descs), "tensors": descs}, separators=(",", ":"), sort_keys=True)
    return arrays, meta


def save_file(tensors: Mapping[str, Any], path: str | os.PathLike[str], metadata: Mapping[str, str] | None = None) -> None:
    """Write NumPy arrays and QTensors to ``path`` atomically (temporary file, then rename)."""
    arrays, meta = prepare(tensors, metadata)
    write_file(path, arrays, meta or None)


def iter_tensors(path: str | os.PathLike[str]) -> Iterator[tuple[str, np.ndarray]]:
    """Decode tensors one at a time (bounded memory for large files)."""
    with safe_open(path) as f:
        for name in f.keys():
            yield name, f.get_tensor(name)
