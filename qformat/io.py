"""Reading and writing qformat files: save_file, load_file, safe_open."""

from __future__ import annotations

import json
import mmap
import os
from typing import Any, Iterator, Mapping

import numpy as np

from . import dtypes as _dt
from .container import Entry, Header, read_header, write_file
from .decode import Region, decode
from .descriptor import Descriptor, parse_descriptor, validate_descriptor
from .errors import QFormatError, error
from .model import METADATA_KEY, FileModel, interpret, required_version
from .qtensor import QTensor
from .sources import ArraySource, TensorInfo

#: The specification version this implementation implements; files record
#: :func:`~qformat.model.required_version` of their descriptors instead (SPEC.md §17.1).
SPEC_VERSION = "1.1"


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


def _raise_first(probs: list[QFormatError]) -> None:
    if probs:
        raise probs[0]


class SafeOpen:
    """A lazily read qformat file (see :func:`safe_open`)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        self.header = read_header(self.path)
        self._src = FileSource(self.path, self.header)
        self.model: FileModel = interpret(self.header, self._src)
        _raise_first(self.model.file_problems)

    # context manager
    def __enter__(self) -> "SafeOpen":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Drop this object's references to the memory map (arrays already returned stay valid)."""
        self._src = None  # type: ignore[assignment]

    def keys(self) -> list[str]:
        """Logical tensor names and plain tensor names (components are not listed)."""
        return self.model.logical_names()

    def metadata(self) -> dict[str, str]:
        """The file's __metadata__ without the 'qformat' key."""
        return {k: v for k, v in (self.header.metadata or {}).items() if k != METADATA_KEY}

    def is_quantized(self, name: str) -> bool:
        self._known(name)
        return name in self.model.raw

    def _known(self, name: str) -> None:
        if name not in self.model.raw and name not in self.model.plain:
            raise error("TENSOR_NOT_FOUND", f"no tensor named {name!r}; the file has {len(self.keys())} tensors", tensor=name)

    def _descriptor(self, name: str) -> Descriptor:
        self._known(name)
        _raise_first(self.model.tensor_problems.get(name, []))
        return self.model.descriptors[name]

    def descriptor(self, name: str) -> dict[str, Any] | None:
        """The descriptor of a logical tensor as a dict, or None for a plain tensor."""
        self._known(name)
        if name not in self.model.raw:
            return None
        return json.loads(json.dumps(self.model.raw[name]))

    def get_qtensor(self, name: str) -> QTensor:
        """The packed tensor with its components (memory-mapped, not decoded)."""
        desc = self._descriptor(name)
        comps = {c: self._src.array(c) for _, c in desc.references()}
        return QTensor(desc.to_dict(), comps)

    def get_tensor(self, name: str) -> np.ndarray:
        """The tensor decoded to its logical dtype (plain tensors: as stored)."""
        return self._get(name, None)

    def _get(self, name: str, region: Region | None) -> np.ndarray:
        self._known(name)
        if name in self.model.plain:
            _raise_first(self.model.tensor_problems.get(name, []))
            a = self._src.array(name)
            if region is not None:
                a = a[tuple(slice(lo, hi) for lo, hi in region)]
            return np.array(a)
        desc = self._descriptor(name)
        return decode(desc, self._src, region, tensor=name)

    def shape(self, name: str) -> tuple[int, ...]:
        self._known(name)
        if name in self.model.plain:
            return self.header.entries[name].shape
        return self._descriptor(name).shape

    def get_slice(self, name: str) -> "Slice":
        """An object whose ``[...]`` decodes only the rows or blocks asked for."""
        self._known(name)
        return Slice(self, name)

    def get_qtensor_slice(self, name: str, key: Any) -> QTensor:
        """``get_slice(name).qtensor(key)``: a block-aligned box, still packed."""
        return self.get_slice(name).qtensor(key)


class Slice:
    """Indexing with integers and step-1 slices decodes just that box."""

    def __init__(self, f: SafeOpen, name: str):
        self._f, self._name = f, name

    def get_shape(self) -> list[int]:
        return list(self._f.shape(self._name))

    def _region(self, key: Any) -> tuple[tuple[tuple[int, int], ...], list[int]]:
        """(region, axes indexed by an integer) of an index expression."""
        shape = self._f.shape(self._name)
        if not isinstance(key, tuple):
            key = (key,)
        if len(key) > len(shape) or any(k is Ellipsis for k in key):
            if sum(k is Ellipsis for k in key) == 1 and len(key) - 1 <= len(shape):
                i = key.index(Ellipsis)
                key = key[:i] + (slice(None),) * (len(shape) - len(key) + 1) + key[i + 1 :]
            else:
                raise error("SLICE_INVALID", f"a {len(shape)}-D tensor takes at most {len(shape)} indices, found {len(key)}", tensor=self._name)
        region, squeeze = [], []
        for a, n in enumerate(shape):
            k = key[a] if a < len(key) else slice(None)
            if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
                i = int(k) + (n if k < 0 else 0)
                if not 0 <= i < n:
                    raise error("SLICE_INVALID", f"index {int(k)} is out of range for axis {a} of size {n}", tensor=self._name)
                region.append((i, i + 1))
                squeeze.append(a)
            elif isinstance(k, slice):
                lo, hi, step = k.indices(n)
                if step != 1:
                    raise error("SLICE_INVALID", f"only step-1 slices are supported, found step {step} on axis {a}", tensor=self._name)
                region.append((lo, max(lo, hi)))
            else:
                raise error("SLICE_INVALID", f"expected an integer or a slice on axis {a}, found {type(k).__name__}", tensor=self._name)
        return tuple(region), squeeze

    def __getitem__(self, key: Any) -> np.ndarray:
        region, squeeze = self._region(key)
        out = self._f._get(self._name, region)
        return out.reshape([hi - lo for a, (lo, hi) in enumerate(region) if a not in squeeze])

    def qtensor(self, key: Any) -> QTensor:
        """The block-aligned box ``key`` as a standalone, still packed :class:`QTensor`.

        Its components are views of only the bytes the box needs (qformat.slicing); an integer
        index keeps its axis with length 1.  A box that is not block-aligned is
        ``SLICE_INVALID``, naming the nearest aligned bounds (``qformat.slicing.aligned_region``
        gives the smallest aligned box around any box).
        """
        from .slicing import describe_alignment, is_aligned, slice_qtensor

        region, _ = self._region(key)
        if self._name not in self._f.model.raw:
            raise error("SLICE_INVALID", f"{self._name!r} is a plain tensor, not a quantized one", tensor=self._name)
        desc = self._f._descriptor(self._name)
        if not is_aligned(desc, region):
            raise error("SLICE_INVALID", "the box is not block-aligned: " + describe_alignment(desc, region), tensor=self._name)
        sub, comps = slice_qtensor(desc, self._f._src, region)
        return QTensor(sub, comps)


def safe_open(path: str | os.PathLike[str], framework: str = "numpy") -> SafeOpen:
    """Open a qformat (or plain safetensors) file lazily through a memory map."""
    if framework not in ("numpy", "np"):
        raise error("FRAMEWORK_UNKNOWN", f"the core reader returns NumPy arrays (framework 'numpy'), found {framework!r}; use the torch or JAX reader for those")
    return SafeOpen(path)


def load_file(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Every tensor of a file, quantized ones decoded to their logical dtype."""
    with safe_open(path) as f:
        for probs in f.model.tensor_problems.values():
            _raise_first(probs)
        return {name: f.get_tensor(name) for name in f.keys()}


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
            _raise_first(validate_descriptor(name, desc, ArraySource(qt.components)))
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
