"""A NumPy-only reader of GGUF files (ggml ``docs/gguf.md``), hardened against hostile input.

Layout (little-endian): magic ``GGUF``, uint32 version (2 or 3), uint64 tensor_count, uint64
kv_count; kv_count key/value pairs (a string key, a uint32 value type 0-12, the value; arrays
hold a uint32 element type, a uint64 count and the elements, possibly arrays themselves);
tensor_count tensor infos (a string name, uint32 n_dims, n_dims uint64 dims innermost first,
uint32 ggml type, uint64 offset); then, padded to ``general.alignment`` (default 32), the data
section, where each tensor's bytes start at its offset.  Strings are a uint64 byte length and
UTF-8 bytes.

Every count, length, dimension and offset is checked against the file's size *before* anything
is sized from it, so a hostile header fails with ``CONVERT_SOURCE_INVALID`` (naming the field,
what was expected and what was found) instead of allocating or looping on an invented count; and
no two tensors may share bytes, so the tensors' sizes add up to at most the file's.
A variant this reader does not handle (a big-endian file, another container version, a ggml
type without a mapping) is ``CONVERT_UNSUPPORTED``.  The file is memory-mapped: tensor bytes
are views, never copied.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from .base import source_error, unsupported

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
#: ggml's GGML_MAX_DIMS: a tensor info with more dims is refused.
MAX_DIMS = 4
#: Deepest nesting of arrays inside a KV value (an array of arrays is depth 2).
MAX_ARRAY_DEPTH = 8
#: Header bytes are parsed in Python; a longer key or tensor name than this is refused.
MAX_NAME_BYTES = 65536

#: GGUF value types: id -> (name, struct format or None, size in bytes or None).
VALUE_TYPES: dict[int, tuple[str, str | None, int | None]] = {
    0: ("uint8", "<u1", 1), 1: ("int8", "<i1", 1), 2: ("uint16", "<u2", 2), 3: ("int16", "<i2", 2),
    4: ("uint32", "<u4", 4), 5: ("int32", "<i4", 4), 6: ("float32", "<f4", 4), 7: ("bool", "<u1", 1),
    8: ("string", None, None), 9: ("array", None, None), 10: ("uint64", "<u8", 8), 11: ("int64", "<i8", 8),
    12: ("float64", "<f8", 8),
}
#: Fewest bytes one value of each type takes (strings and arrays: their length fields).
_MIN_VALUE_BYTES = {k: (v[2] if v[2] is not None else (8 if k == 8 else 12)) for k, v in VALUE_TYPES.items()}

#: ggml type ids (ggml.h / gguf-py constants.py) -> (name, elements per block, bytes per block).
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18), 42: ("Q2_0", 64, 18),
}


def type_name(t: int) -> str:
    """The ggml name of type id ``t`` (``type 99`` for an id ggml does not define)."""
    e = GGML_TYPES.get(t)
    return e[0] if e is not None else f"type {t}"


@dataclass(frozen=True)
class KV:
    """One metadata value: ``type`` a GGUF value type name; for arrays ``element_type`` and
    ``value`` a list (of Python scalars, or of nested :class:`KV` arrays)."""

    type: str
    value: Any
    element_type: str | None = None


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: NumPy-order ``shape`` (GGUF dims reversed), ggml type, absolute byte range."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # relative to the data section, as stored
    start: int  # absolute file offset
    nbytes: int

    @property
    def type_name(self) -> str:
        return type_name(self.ggml_type)


class GGUFFile:
    """A parsed GGUF file: ``version``, ``alignment``, ``kv`` (key -> :class:`KV`, file order),
    ``tensors`` (name -> :class:`TensorInfo`, file order), and :meth:`raw` for tensor bytes."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        self.name = os.path.basename(self.path)
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < 24:
                    raise source_error(f"{self.name} is {size} bytes, expected at least 24 (magic, version, tensor_count, kv_count)", field="header")
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise source_error(f"cannot read {self.name}: {e}") from None
        self.size = size
        self._buf = memoryview(self._mm)
        self._bytes = np.frombuffer(self._mm, dtype=np.uint8)
        self._pos = 0
        self.kv: dict[str, KV] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._parse()

    # -- low-level reads, each bounds-checked -----------------------------------------------
    def _need(self, n: int, what: str) -> None:
        if n > self.size - self._pos:
            raise source_error(f"{what}: expected {n} bytes at offset {self._pos}, found the end of the file at {self.size} (truncated)", field=what)

    def _u(self, fmt: str, n: int, what: str) -> int:
        self._need(n, what)
        (v,) = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += n
        return int(v)

    def _u32(self, what: str) -> int:
        return self._u("<I", 4, what)

    def _u64(self, what: str) -> int:
        return self._u("<Q", 8, what)

    def _str(self, what: str, limit: int | None = None) -> str:
        n = self._u64(f"{what} length")
        if limit is not None and n > limit:
            raise source_error(f"{what} is {n} bytes long, expected at most {limit}", field=what)
        self._need(n, what)
        raw = bytes(self._buf[self._pos : self._pos + n])
        self._pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise source_error(f"{what}: expected UTF-8 text, found {e.reason} at byte {e.start}", field=what) from None

    def _strs(self, n: int, what: str) -> list[str]:
        """``n`` strings (an array's elements ``what[j]``): what ``_str`` reads and checks, with
        the same errors, in one loop (a vocabulary is hundreds of thousands of them)."""
        mm, size, pos = self._mm, self.size, self._pos
        unpack = struct.unpack_from
        out: list[str] = []
        append = out.append
        for j in range(n):
            if size - pos < 8:
                self._pos = pos
                self._need(8, f"{what}[{j}] length")
            (length,) = unpack("<Q", mm, pos)
            pos += 8
            if length > size - pos:
                self._pos = pos
                self._need(length, f"{what}[{j}]")
            raw = mm[pos : pos + length]
            pos += length
            try:
                append(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                raise source_error(f"{what}[{j}]: expected UTF-8 text, found {e.reason} at byte {e.start}", field=f"{what}[{j}]") from None
        self._pos = pos
        return out

    def _count(self, n: int, each: int, what: str) -> None:
        """Refuse a count whose smallest encoding would already run past the end of the file."""
        room = self.size - self._pos
        if n * each > room:
            raise source_error(f"{what} is {n}, expected at most {room // each}: entries take at least {each} bytes and {room} bytes are left in the file", field=what)

    # -- structure ------------------------------------------------------------------------------
    def _parse(self) -> None:
        magic = bytes(self._buf[0:4])
        if magic != MAGIC:
            raise source_error(f"magic is {magic!r}, expected {MAGIC!r}", field="header.magic")
        self._pos = 4
        version = self._u32("header.version")
        if version not in VERSIONS:
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            if swapped in (1, 2, 3):
                raise unsupported(f"the version field reads {version:#010x} little-endian ({swapped} big-endian): big-endian GGUF files are not supported, expected a little-endian file of version 2 or 3", field="header.version")
            if version == 1:
                raise unsupported("version is 1 (32-bit lengths, not supported), expected 2 or 3", field="header.version")
            raise unsupported(f"version is {version}, expected 2 or 3", field="header.version")
        self.version = version
        n_tensors = self._u64("header.tensor_count")
        n_kv = self._u64("header.kv_count")
        self._count(n_kv, 8 + 4 + 1, "header.kv_count")
        for i in range(n_kv):
            key = self._str(f"kv[{i}].key", MAX_NAME_BYTES)
            if key in self.kv:
                raise source_error(f"key {key!r} appears twice, expected unique keys", field=f"kv[{i}].key")
            vt = self._u32(f"kv[{key}].type")
            self.kv[key] = self._value(vt, f"kv[{key}]", 0)
        self.alignment = DEFAULT_ALIGNMENT
        al = self.kv.get("general.alignment")
        if al is not None:
            if al.type != "uint32":
                raise source_error(f"general.alignment has type {al.type}, expected uint32", field="kv[general.alignment]")
            a = int(al.value)
            if a == 0 or a & (a - 1):
                raise source_error(f"general.alignment is {a}, expected a non-zero power of two", field="kv[general.alignment]")
            self.alignment = a
        self._count(n_tensors, 8 + 4 + 4 + 8, "header.tensor_count")
        infos = []
        seen: set[str] = set()
        for i in range(n_tensors):
            name = self._str(f"tensor_info[{i}].name", MAX_NAME_BYTES)
            where = f"tensor_info[{name}]"
            if name in seen:
                raise source_error(f"tensor {name!r} appears twice, expected unique names", tensor=name, field=f"{where}.name")
            nd = self._u32(f"{where}.n_dims")
            if not 1 <= nd <= MAX_DIMS:
                raise source_error(f"n_dims is {nd}, expected 1 to {MAX_DIMS}", tensor=name, field=f"{where}.n_dims")
            dims = [self._u64(f"{where}.dims") for _ in range(nd)]
            for d in dims:
                if d >= 1 << 63:
                    raise source_error(f"a dimension is {d}, expected below 2^63 (ggml's dims are int64)", tensor=name, field=f"{where}.dims")
            t = self._u32(f"{where}.type")
            off = self._u64(f"{where}.offset")
            seen.add(name)
            infos.append((name, dims, t, off))
        self.data_start = -(-self._pos // self.alignment) * self.alignment
        data_size = self.size - self.data_start
        for name, dims, t, off in infos:
            where = f"tensor_info[{name}]"
            shape = tuple(reversed(dims))
            if t not in GGML_TYPES:
                raise unsupported(f"ggml type id is {t}, expected one of the ggml types {sorted(GGML_TYPES)}", tensor=name, field=f"{where}.type")
            tname, bs, ts = GGML_TYPES[t]
            if dims[0] % bs:
                raise source_error(f"row length (dims[0]) is {dims[0]}, expected a multiple of the {tname} block size {bs}", tensor=name, field=f"{where}.dims")
            nbytes = dims[0] // bs * ts
            for d in dims[1:]:
                nbytes *= d  # Python integers: no overflow; compared with the file size below
            if off % self.alignment:
                raise source_error(f"offset is {off}, expected a multiple of general.alignment {self.alignment}", tensor=name, field=f"{where}.offset")
            if off > data_size or nbytes > data_size - off:
                raise source_error(f"data is [{off}, {off + nbytes}) of the data section (dims {dims}, {tname}), expected to end by the end of the file at {max(0, data_size)} (truncated or dims too large)", tensor=name, field=f"{where}.offset")
            self.tensors[name] = TensorInfo(name, shape, t, off, self.data_start + off, nbytes)
        self._check_disjoint()

    def _check_disjoint(self) -> None:
        """Refuse tensors whose bytes overlap: each tensor's data is its own (ggml lays them out
        one after the other), so everything read or written per tensor adds up to at most the
        data section, never the same bytes many times (a small file naming one region for
        thousands of tensors)."""
        spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in self.tensors.values() if t.nbytes)
        for (a0, a1, a), (b0, b1, b) in zip(spans, spans[1:]):
            if b0 < a1:
                raise source_error(f"data is [{b0}, {b1}) of the data section, which overlaps tensor {a!r} at [{a0}, {a1}); "
                                   "expected each tensor's bytes to be its own", tensor=b, field=f"tensor_info[{b}].offset")

    def _value(self, vt: int, what: str, depth: int) -> KV:
        if vt not in VALUE_TYPES:
            raise source_error(f"value type is {vt}, expected 0 to 12", field=what)
        tname, fmt, size = VALUE_TYPES[vt]
        if vt == 8:
            return KV("string", self._str(what))
        if vt == 9:
            if depth >= MAX_ARRAY_DEPTH:
                raise source_error(f"arrays nest deeper than expected: at most {MAX_ARRAY_DEPTH} levels", field=what)
            et = self._u32(f"{what}.element_type")
            if et not in VALUE_TYPES:
                raise source_error(f"array element type is {et}, expected 0 to 12", field=f"{what}.element_type")
            n = self._u64(f"{what}.count")
            self._count(n, _MIN_VALUE_BYTES[et], f"{what}.count")
            ename, efmt, esize = VALUE_TYPES[et]
            if efmt is not None and esize is not None:
                arr = np.frombuffer(self._mm, dtype=np.dtype(efmt), count=n, offset=self._pos)
                self._pos += n * esize
                if et == 7:
                    self._check_bool(arr, what)
                    return KV("array", [bool(v) for v in arr.tolist()], ename)
                return KV("array", arr.tolist(), ename)
            if et == 8:
                return KV("array", self._strs(n, what), ename)
            return KV("array", [self._value(9, f"{what}[{j}]", depth + 1) for j in range(n)], ename)
        assert fmt is not None and size is not None
        self._need(size, what)
        v = np.frombuffer(self._mm, dtype=np.dtype(fmt), count=1, offset=self._pos)
        self._pos += size
        if vt == 7:
            self._check_bool(v, what)
            return KV("bool", bool(v[0]))
        return KV(tname, v[0].item())

    @staticmethod
    def _check_bool(a: np.ndarray, what: str) -> None:
        bad = a > 1
        if bad.any():
            raise source_error(f"a bool is {int(a[bad][0])}, expected 0 or 1", field=what)

    # -- tensor data ----------------------------------------------------------------------------
    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes, a read-only uint8 view of the memory map."""
        t = self.tensors[name]
        return self._bytes[t.start : t.start + t.nbytes]
