"""Reading and writing qformat files: save_file, load_file, safe_open."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import numpy as np

from . import dtypes as _dt
from .checkpoint import Shard, iter_shards
from .checkpoint import load_checkpoint as _load_shards
from .container import parse_header, write_file
from .remote import is_url, read_header
from .decode import decode
from .descriptor import Descriptor, parse_descriptor
from .errors import error, raise_first
from .index import is_index
from .model import METADATA_KEY, FileModel, interpret, qformat_json
from .qtensor import QTensor
from .regions import Region
from .remote_slicing import remote_plain, remote_region, remote_slice
from .slicing import describe_alignment, is_aligned, slice_qtensor
from .sources import ArraySource, FileSource, plain_shape
from .validate import validate_descriptor

__all__ = ["CheckpointOpen", "FileSource", "IndexPlan", "SafeOpen", "Slice", "index_plan", "load_checkpoint", "load_file", "open_admitted",
           "parse_index", "prepare",
           "safe_open", "save_file", "squeezed_shape"]

#: The specification version this implementation implements; files record
#: :func:`~qformat.model.required_version` of their descriptors instead (SPEC.md §17.1).
SPEC_VERSION = "1.2"


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


def open_admitted(admission: Any, path: str) -> "SafeOpen":
    """A :class:`SafeOpen` of ``path`` over what ``admission`` (:class:`qformat.check.Admission`)
    read and checked when it admitted the file; opened anew where it did not admit ``path``."""
    return SafeOpen(path, admission.shard(path))


class SafeOpen(_SliceMethods):
    """A lazily read qformat file (see :func:`safe_open`).

    Framework readers compose one of these (they do not subclass it): :meth:`require`,
    :meth:`validated_descriptor` and :attr:`source` give them the validated descriptor and the
    memory-mapped stored tensors, and :func:`parse_index` turns an index expression into a region.
    """

    def __init__(self, path: str | os.PathLike[str], shard: Shard | None = None, verify: bool = False):
        self.path = os.fspath(path)
        if shard is None:
            from .check import open_source

            header, src = open_source(self.path)  # one open file: the header read is the file mapped
            shard = Shard(self.path, self.path.rsplit("/", 1)[-1] if is_url(self.path) else os.path.basename(self.path),
                          header, interpret(header, src), src)
        self.header = shard.header
        self._src: FileSource | None = shard.source
        self.model: FileModel = shard.model
        raise_first(self.model.file_problems)
        # the names a reader returns, as a set: :meth:`require` runs on every read, and
        # ``model.plain`` is a list (a membership test there made load_file quadratic, issue 40)
        self._names = frozenset(self.model.plain).union(self.model.raw)
        #: verify the file's digests (SPEC.md §3.8) of each tensor's stored bytes before returning them
        self.verify = verify
        self._verified: set[str] = set()
        if verify and self.model.digests is not None:
            from .digests import ALGORITHMS

            if self.model.digests["algorithm"] not in ALGORITHMS:  # nothing can be verified: the whole file
                raise_first(self._digest_problems([]))

    def _digest_problems(self, stored: list[str]) -> list[Any]:
        from .check import digest_problems

        return digest_problems(self.path, self.header, self.model, stored)

    def _check_digests(self, name: str) -> None:
        """With ``verify``: DIGEST_MISMATCH unless every stored tensor ``name`` reads has the
        digest the file records, and the file lists no digest under the logical name ``name``
        itself (SPEC.md §3.8, checked once per tensor)."""
        if not self.verify or self.model.digests is None or name in self._verified:
            return
        from .check import tensor_digest_problems

        raise_first(tensor_digest_problems(self.path, self.header, self.model, name))
        self._verified.add(name)

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

    def metadata(self) -> dict[str, str] | None:
        """The file's __metadata__ without the 'qformat' key; None when the file has no
        __metadata__ (as safetensors' ``metadata()``)."""
        if self.header.metadata is None:
            return None
        return {k: v for k, v in self.header.metadata.items() if k != METADATA_KEY}

    def file_order(self) -> list[str]:
        """:meth:`keys` in the order of their data in the file, as safetensors' ``load_file``
        returns them: by the ``(BEGIN, END)`` of a plain tensor, or the smallest of a logical
        tensor's components, then by name."""
        ents = self.header.entries
        first: dict[str, tuple[int, int]] = {}
        for comp, owner in self.model.components.items():
            at = (ents[comp].begin, ents[comp].end)
            first[owner] = min(first.get(owner, at), at)
        def key(n: str) -> tuple[int, int, str]:
            at = first.get(n) or ((ents[n].begin, ents[n].end) if n in ents else (-1, -1))
            return (*at, n)
        return sorted(self.keys(), key=key)

    def require(self, name: str) -> None:
        """TENSOR_NOT_FOUND unless ``name`` is a logical or plain tensor of the file."""
        if name not in self._names:
            raise error("TENSOR_NOT_FOUND", f"no tensor named {name!r}; the file has {len(self._names)} tensors", tensor=name)

    def is_quantized(self, name: str) -> bool:
        self.require(name)
        return name in self.model.raw

    def validated_descriptor(self, name: str) -> Descriptor:
        """The parsed descriptor of quantized tensor ``name``; raises the tensor's first problem."""
        self.require(name)
        raise_first(self.model.tensor_problems.get(name, []))
        self._check_digests(name)
        return self.model.descriptors[name]

    def plain_array(self, name: str, region: Region | None = None) -> np.ndarray:
        """A plain tensor's stored array (a memory-mapped view; ``region`` cuts a box of it)."""
        self.require(name)
        raise_first(self.model.tensor_problems.get(name, []))
        self._check_digests(name)
        if region is not None and self.source.remote is not None:
            return remote_plain(self.source, name, region)
        a = self.source.plain(name)
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
        desc = self.validated_descriptor(name)
        if region is not None and self.source.remote is not None:
            # A remote file: fetch only the block-aligned box around the region, then decode
            # the region out of that box (the same values: SPEC.md §8.4).
            return decode(*remote_region(self.source, desc, region, name), tensor=name)
        return decode(desc, self.source, region, tensor=name)

    def shape(self, name: str) -> tuple[int, ...]:
        if not self.is_quantized(name):
            e = self.header.entries[name]
            return plain_shape(e.dtype, e.shape)
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
        if self.source.remote is not None:
            sub, comps = remote_slice(self.source, desc, region)
        else:
            sub, comps = slice_qtensor(desc, self.source, region)
        return QTensor(sub, comps)


@dataclass(frozen=True)
class IndexPlan:
    """How an index expression reads a tensor: decode the (block-aligned or not) box
    ``region``, then index that box with ``post`` (positive steps, integer axes dropped) and
    reshape to ``shape``: the result equals NumPy indexing of the whole decoded tensor."""

    region: Region
    squeeze: list[int]
    post: tuple[Any, ...]
    shape: tuple[int, ...]

    @property
    def stepped(self) -> bool:
        return any(isinstance(p, slice) and p.step not in (None, 1) for p in self.post)


def index_plan(shape: tuple[int, ...], key: Any, tensor: str | None = None) -> IndexPlan:
    """The :class:`IndexPlan` of an index expression over a tensor of ``shape``: integers,
    slices with a positive step, empty lists and at most one Ellipsis, as safetensors'
    ``get_slice`` accepts them (negative steps, non-empty lists, ``None`` and booleans are
    SLICE_INVALID); out-of-range slice bounds are clipped as NumPy clips them."""
    if not isinstance(key, tuple):
        key = (key,)
    n_ell = sum(k is Ellipsis for k in key)
    if n_ell > 1:
        raise error("SLICE_INVALID", f"an index takes at most one Ellipsis (...), found {n_ell}", tensor=tensor)
    if len(key) - n_ell > len(shape):
        raise error("SLICE_INVALID", f"a {len(shape)}-D tensor takes at most {len(shape)} indices, found {len(key) - n_ell}", tensor=tensor)
    if n_ell:
        i = key.index(Ellipsis)
        key = key[:i] + (slice(None),) * (len(shape) - len(key) + 1) + key[i + 1 :]
    region, squeeze, post, dims, adv = [], [], [], [], []
    for a, n in enumerate(shape):
        k = key[a] if a < len(key) else slice(None)
        if isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)):
            i = int(k) + (n if k < 0 else 0)
            if not 0 <= i < n:
                raise error("SLICE_INVALID", f"index {int(k)} is out of range for axis {a} of size {n}", tensor=tensor)
            region.append((i, i + 1))
            squeeze.append(a)
            post.append(0)
            adv.append(a)
        elif isinstance(k, slice):
            if k.step is not None and not isinstance(k.step, (int, np.integer)) or isinstance(k.step, (bool, np.bool_)):
                raise error("SLICE_INVALID", f"a slice step must be an integer, found {type(k.step).__name__} on axis {a}", tensor=tensor)
            step = 1 if k.step is None else int(k.step)
            if step <= 0:
                raise error("SLICE_INVALID", f"slice steps must be positive (as in safetensors), found step {step} on axis {a}", tensor=tensor)
            try:
                lo, hi, _ = k.indices(n)
            except TypeError:
                raise error("SLICE_INVALID", f"slice bounds must be integers, found {k!r} on axis {a}", tensor=tensor) from None
            count = max(0, -(-(hi - lo) // step))
            region.append((lo, lo + (count - 1) * step + 1) if count else (lo, lo))
            post.append(slice(None, None, step))
            dims.append((a, count))
        elif isinstance(k, list) and not k:
            region.append((0, 0))  # an empty list selects nothing on its axis (NumPy: an empty index array)
            post.append(slice(None))
            adv.append(a)
        elif isinstance(k, list):
            raise error("SLICE_INVALID", f"a list index must be empty (as in safetensors), found a list of {len(k)} on axis {a}", tensor=tensor)
        else:
            raise error("SLICE_INVALID", f"expected an integer, a slice, an empty list or Ellipsis on axis {a}, found {type(k).__name__}",
                        tensor=tensor)
    out = [c for _, c in dims]
    if len(adv) > len(squeeze):  # an empty list: NumPy's advanced indexing puts one empty axis where the indexed axes were
        at = sum(1 for a, _ in dims if a < adv[0]) if adv == list(range(adv[0], adv[0] + len(adv))) else 0
        out.insert(at, 0)
    return IndexPlan(tuple(region), squeeze, tuple(post), tuple(out))


def parse_index(shape: tuple[int, ...], key: Any, tensor: str | None = None) -> tuple[Region, list[int]]:
    """(region, axes indexed by an integer) of an index expression over a tensor of ``shape``
    that names a box: integers, step-1 slices, empty lists and one Ellipsis (a packed box has no
    steps: SLICE_INVALID)."""
    plan = index_plan(shape, key, tensor)
    if plan.stepped:
        a, st = next((a, p.step) for a, p in enumerate(plan.post) if isinstance(p, slice) and p.step not in (None, 1))
        raise error("SLICE_INVALID", f"a box takes only step-1 slices, found step {st} on axis {a}", tensor=tensor)
    return plan.region, plan.squeeze


def squeezed_shape(region: Region, squeeze: list[int]) -> list[int]:
    """The result shape of an index expression: the region's shape without integer-indexed axes."""
    return [hi - lo for a, (lo, hi) in enumerate(region) if a not in squeeze]


class Slice:
    """Indexing (integers, positive-step slices, empty lists, one Ellipsis) decodes just the
    box the index spans, then indexes it: the result is NumPy indexing of the decoded tensor."""

    def __init__(self, f: SafeOpen, name: str):
        self._f, self._name = f, name

    def get_shape(self) -> list[int]:
        return list(self._f.shape(self._name))

    def __getitem__(self, key: Any) -> np.ndarray:
        plan = index_plan(self._f.shape(self._name), key, self._name)
        return np.ascontiguousarray(self._f.read(self._name, plan.region)[plan.post]).reshape(plan.shape)

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

    def __init__(self, path: str | os.PathLike[str], verify: bool = False):
        self.path = os.fspath(path)
        self.shards: dict[str, SafeOpen] = {}
        self._home: dict[str, SafeOpen] = {}
        for shard in iter_shards(self.path):
            f = self.shards[shard.name] = SafeOpen(shard.path, shard, verify)
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

    def metadata(self) -> dict[str, str] | None:
        """The shards' __metadata__ (without 'qformat'), merged in shard order; None when no
        shard has __metadata__."""
        out: dict[str, str] = {}
        found = False
        for f in self.shards.values():
            m = f.metadata()
            found = found or m is not None
            out.update(m or {})
        return out if found else None

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
    a safetensors file nor an index: a folder, a GGUF file, a missing path (an http(s) URL is
    checked when it is opened, by range requests)."""
    if is_url(path):
        return
    if os.path.isdir(path):
        idx = [f for f in sorted(os.listdir(path)) if f.endswith(".safetensors.index.json")]
        hint = f"open its index {idx[0]!r}" if idx else "open one of its .safetensors files"
        raise error("FILE_UNREADABLE", f"{path!r} is a folder: {hint}, or use `qformat convert` for a checkpoint in another format")
    if not os.path.exists(path):
        raise error("FILE_UNREADABLE", f"{path!r} does not exist")
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise error("FILE_UNREADABLE", f"cannot read {path!r}: {e.strerror or e}") from None
    from .check import not_safetensors

    other = None if is_index(path) else not_safetensors(path)  # text, a ZIP: NOT_SAFETENSORS, as `qformat check` says
    if other is not None:
        raise other


def safe_open(path: str | os.PathLike[str], framework: str = "numpy", verify: bool = False) -> SafeOpen | CheckpointOpen:
    """Open a qformat (or plain safetensors) file lazily through a memory map, or a sharded
    checkpoint through its ``*.safetensors.index.json`` (a :class:`CheckpointOpen`).

    ``verify``: check the digests a 1.2 file records (SPEC.md §3.8) of the stored tensors of
    each tensor before it is first returned (DIGEST_MISMATCH refuses that tensor;
    DIGEST_UNSUPPORTED, an algorithm this reader lacks, the whole file).  Off by default: it
    reads every byte of a tensor, even for a slice.

    ``path`` may be an ``http://`` or ``https://`` URL (of a file or of an index, whose shards
    are resolved relative to it): the header and then only the bytes of the tensors, or of the
    block-aligned boxes of slices, asked for are fetched by HTTP range requests
    (:mod:`qformat.remote`; ``source.bytes_fetched`` counts them)."""
    if framework not in ("numpy", "np"):
        raise error("FRAMEWORK_UNKNOWN", f"the core reader returns NumPy arrays (framework 'numpy'), found {framework!r}; use the torch or JAX reader for those")
    path = os.fspath(path)
    _readable(path)
    return CheckpointOpen(path, verify) if is_index(path) else SafeOpen(path, verify=verify)


def open_bytes(data: bytes, name: str = "<bytes>") -> SafeOpen:
    """A whole file held in memory, read as :func:`safe_open` reads a file (digests are not
    verified: :func:`qformat.digests.hash_range` reads a file by its path).  Raises the container's codes (HEADER_*, OFFSETS_*,
    DATA_TRUNCATED, ...) and the file problems of the qformat object; each tensor's structural
    problems are in ``f.model.tensor_problems`` and raised when it is read.

    The cheap in-process entry point of the header, descriptor and structure rules for fuzzers
    (issue 40): ``open_bytes(b)``, then ``f.get_tensor(k)`` for ``k`` in ``f.keys()``; anything
    other than a :class:`~qformat.errors.QFormatError` is a bug."""
    import io

    data = bytes(data)
    header = parse_header(io.BytesIO(data), len(data))
    src = FileSource.from_bytes(data, header, name)
    return SafeOpen(name, Shard(name, name, header, interpret(header, src), src))


def _load_one(path: str, verify: bool = False) -> dict[str, np.ndarray]:
    with SafeOpen(path, verify=verify) as f:
        raise_first(f.model.problems())
        if verify and f.model.digests is not None:
            # SPEC.md §1.4, §3.8 (1.2.1): every listed digest, names the file lacks included, after
            # step 7 and before any decode-time check
            raise_first(f._digest_problems(sorted(f.model.digests["tensors"])))
        # SPEC.md §1.4 (1.2.1): decode-time checks go tensor by tensor in code-point order of the
        # names, whatever order the data has; the result keeps the file's order
        decoded = {name: f.get_tensor(name) for name in sorted(f.file_order())}
        return {name: decoded[name] for name in f.file_order()}


def _load_verified(path: str) -> dict[str, np.ndarray]:
    return _load_one(path, True)


def load_file(path: str | os.PathLike[str], verify: bool = False) -> dict[str, np.ndarray]:
    """Every tensor of a file, or of a sharded checkpoint given its index, quantized ones
    decoded to their logical dtype.  ``verify``: check the file's digests first (see
    :func:`safe_open`)."""
    path = os.fspath(path)
    _readable(path)
    return _load_shards(path, _load_verified if verify else _load_one)


def load_checkpoint(path: str | os.PathLike[str], verify: bool = False) -> dict[str, np.ndarray]:
    """:func:`load_file` under the name the readers use for sharded checkpoints."""
    return load_file(path, verify)


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
        meta[METADATA_KEY] = qformat_json(descs)
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
