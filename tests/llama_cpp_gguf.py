"""A small GGUF reader for the llama.cpp tests: plain ``read`` calls, no memory map, nothing of
qformat's (it checks qformat's files, so it shares no code with them).

gguf-py's ``GGUFReader`` maps the whole file with ``np.memmap`` and makes a NumPy view of it
per field part (two per string of a 49k- or 262k-token vocabulary): hundreds of thousands of
objects per reader, kept alive by every array taken from it, over files that a test's temporary
folder then deletes.  The real-model matrix of tests/test_llama_cpp_quantize.py opened six per
case (and its interpreter once died of a SIGSEGV in the garbage collector while in one); this
reader reads the header into ``bytes`` and each tensor's bytes with ``seek``/``read``, and keeps
nothing open.

- :func:`read_header`: every key/value (key, GGUF value types as gguf-py's ``ReaderField.types``
  lists them, the value's raw bytes, decoded on demand) and every tensor's info, in file order.
- :func:`tensor_bytes` / :func:`tensor_array`: one tensor's stored bytes / values.
- :func:`differences`: what differs between two GGUF files (keys, tensors, the first byte), the
  diagnostic of a failed whole-file comparison.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
#: GGUF value type -> struct format of one scalar (8 string, 9 array).
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


class GGUFFormatError(ValueError):
    """Not a GGUF file this reader understands (or a truncated one)."""


@dataclass(frozen=True)
class KV:
    key: str
    #: The value's GGUF types: [type] for a scalar or a string, [9, element type, ...] for an array.
    types: tuple[int, ...]
    #: The value's bytes as stored (after the key and the type).
    raw: bytes

    @property
    def value(self) -> Any:
        """The decoded value (a list for an array, str for a string)."""
        v, _ = _decode(self.raw, 0, self.types)
        return v


@dataclass(frozen=True)
class Tensor:
    name: str
    type: int
    #: NumPy order (GGUF stores the dimensions innermost first).
    shape: tuple[int, ...]
    #: Absolute offset of the data in the file.
    offset: int
    nbytes: int

    @property
    def type_name(self) -> str:
        from gguf.constants import GGMLQuantizationType

        try:
            return GGMLQuantizationType(self.type).name
        except ValueError:
            return f"type{self.type}"


@dataclass
class Header:
    version: int
    kvs: list[KV]
    tensors: list[Tensor]
    data_start: int
    size: int
    _by_key: dict[str, KV] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._by_key = {kv.key: kv for kv in self.kvs}

    def __contains__(self, key: str) -> bool:
        return key in self._by_key

    def __getitem__(self, key: str) -> KV:
        return self._by_key[key]

    def int(self, key: str) -> int:
        kv = self._by_key[key]
        if len(kv.types) != 1 or kv.types[0] not in SCALARS or kv.types[0] in (6, 12):
            raise TypeError(f"{key} is not an integer (types {kv.types})")
        return int(kv.value)


def _tensor_nbytes(ggml_type: int, shape: tuple[int, ...], name: str) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise GGUFFormatError(f"tensor {name}: unknown ggml type {ggml_type}") from None
    n = 1
    for d in shape:
        n *= d
    if n % block:
        raise GGUFFormatError(f"tensor {name}: {n} elements is not a multiple of the block of {block}")
    return n // block * size


class _Buf:
    """The start of a file, read on demand (the header only: never the tensor data)."""

    def __init__(self, f: Any) -> None:
        self.f, self.data, self.pos = f, b"", 0

    def need(self, n: int) -> None:
        if self.pos + n > len(self.data):
            want = max(self.pos + n - len(self.data), 1 << 20, len(self.data))
            more = self.f.read(want)
            self.data += more
            if self.pos + n > len(self.data):
                raise GGUFFormatError(f"truncated at byte {len(self.data)} (needed {n} more bytes at {self.pos})")

    def take(self, n: int) -> bytes:
        self.need(n)
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> bytes:
        return self.take(self.unpack("<Q"))

    def skip_value(self, vt: int) -> tuple[int, ...]:
        """Move past one value of type ``vt``; its types."""
        if vt in SCALARS:
            self.take(struct.calcsize(SCALARS[vt]))
            return (vt,)
        if vt == STRING:
            self.string()
            return (vt,)
        if vt == ARRAY:
            et, n = self.unpack("<I"), self.unpack("<Q")
            if et in SCALARS:
                self.take(n * struct.calcsize(SCALARS[et]))
                return (ARRAY, et)
            if et == STRING:
                for _ in range(n):
                    self.string()
                return (ARRAY, et)
            if et == ARRAY:
                sub: tuple[int, ...] = (ARRAY,)
                for _ in range(n):
                    sub = self.skip_value(ARRAY)
                return (ARRAY, *sub)
            raise GGUFFormatError(f"array of unknown value type {et}")
        raise GGUFFormatError(f"unknown value type {vt}")


def _decode(raw: bytes, pos: int, types: tuple[int, ...]) -> tuple[Any, int]:
    vt = types[0]
    if vt in SCALARS:
        fmt = SCALARS[vt]
        return struct.unpack_from(fmt, raw, pos)[0], pos + struct.calcsize(fmt)
    if vt == STRING:
        (n,) = struct.unpack_from("<Q", raw, pos)
        return raw[pos + 8:pos + 8 + n].decode("utf-8", errors="replace"), pos + 8 + n
    et, n = struct.unpack_from("<IQ", raw, pos)
    pos += 12
    if et in SCALARS:
        size = struct.calcsize(SCALARS[et])
        return list(struct.unpack_from(f"<{n}{SCALARS[et][1]}", raw, pos)), pos + n * size
    out = []
    for _ in range(n):
        v, pos = _decode(raw, pos, types[1:] if et == ARRAY else (STRING,))
        out.append(v)
    return out, pos


def read_header(path: str | Path) -> Header:
    """Every key/value and tensor info of a GGUF file (version 2 or 3, little-endian)."""
    path = Path(path)
    with open(path, "rb") as f:
        b = _Buf(f)
        if b.take(4) != MAGIC:
            raise GGUFFormatError(f"{path}: not a GGUF file")
        version = b.unpack("<I")
        if version not in (2, 3):
            raise GGUFFormatError(f"{path}: GGUF version {version}")
        n_tensors, n_kv = b.unpack("<Q"), b.unpack("<Q")
        kvs = []
        for _ in range(n_kv):
            key = b.string().decode("utf-8", errors="replace")
            vt = b.unpack("<I")
            start = b.pos
            types = b.skip_value(vt)
            kvs.append(KV(key, types, b.data[start:b.pos]))
        infos = []
        for _ in range(n_tensors):
            name = b.string().decode("utf-8", errors="replace")
            n_dims = b.unpack("<I")
            dims = [b.unpack("<Q") for _ in range(n_dims)]
            infos.append((name, b.unpack("<I"), tuple(reversed(dims)), b.unpack("<Q")))
        size = path.stat().st_size
    by_key = {kv.key: kv for kv in kvs}
    align = int(by_key["general.alignment"].value) if "general.alignment" in by_key else DEFAULT_ALIGNMENT
    data_start = -(-b.pos // align) * align
    tensors = []
    for name, t, shape, off in infos:
        nbytes = _tensor_nbytes(t, shape, name)
        if data_start + off + nbytes > size:
            raise GGUFFormatError(f"{path}: tensor {name} runs past the end of the file")
        tensors.append(Tensor(name, t, shape, data_start + off, nbytes))
    return Header(version, kvs, tensors, data_start, size)


def tensor_bytes(path: str | Path, t: Tensor) -> bytes:
    with open(path, "rb") as f:
        f.seek(t.offset)
        data = f.read(t.nbytes)
    if len(data) != t.nbytes:
        raise GGUFFormatError(f"{path}: tensor {t.name} truncated")
    return data


def tensor_array(path: str | Path, t: Tensor) -> np.ndarray:
    """A tensor as stored: float32 / float16 values (flat) for F32 / F16, otherwise its bytes
    (uint8, flat).  A copy: nothing of the file stays open."""
    raw = tensor_bytes(path, t)
    dtype = {0: "<f4", 1: "<f2"}.get(t.type, np.uint8)
    return np.frombuffer(raw, dtype=dtype).copy()


def _short(v: Any, limit: int = 120) -> str:
    s = repr(v)
    return s if len(s) <= limit else s[:limit] + f"... ({len(v) if hasattr(v, '__len__') else '?'} items)"


def differences(ref: str | Path, out: str | Path, limit: int = 12) -> list[str]:
    """What differs between two GGUF files, in words: keys (only in one, order, types, values),
    tensors (only in one, order, type, shape, bytes), the data offset, the size and the first
    differing byte.  Empty when the files are the same bytes."""
    msgs: list[str] = []
    a, b = read_header(ref), read_header(out)
    if a.version != b.version:
        msgs.append(f"GGUF version {a.version} vs {b.version}")
    ka, kb = [kv.key for kv in a.kvs], [kv.key for kv in b.kvs]
    if set(ka) != set(kb):
        msgs.append(f"keys only in the reference: {sorted(set(ka) - set(kb))}; only in qformat's: {sorted(set(kb) - set(ka))}")
    common = [k for k in ka if k in b]
    if common != [k for k in kb if k in a]:
        msgs.append("the common keys in another order")
    for k in common:
        x, y = a[k], b[k]
        if x.types != y.types:
            msgs.append(f"key {k}: types {list(x.types)} vs {list(y.types)}; values {_short(x.value)} vs {_short(y.value)}")
        elif x.raw != y.raw:
            msgs.append(f"key {k}: {_short(x.value)} vs {_short(y.value)}")
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    if set(ta) != set(tb):
        msgs.append(f"tensors only in the reference: {sorted(set(ta) - set(tb))[:limit]}; only in qformat's: {sorted(set(tb) - set(ta))[:limit]}")
    order_a, order_b = [t.name for t in a.tensors if t.name in tb], [t.name for t in b.tensors if t.name in ta]
    if order_a != order_b:
        msgs.append("the common tensors in another order")
    differing = []
    for name in order_a:
        x, y = ta[name], tb[name]
        if (x.type, x.shape) != (y.type, y.shape):
            differing.append(f"{name}: {x.type_name} {x.shape} vs {y.type_name} {y.shape}")
            continue
        bx, by = tensor_bytes(ref, x), tensor_bytes(out, y)
        if bx != by:
            d = np.flatnonzero(np.frombuffer(bx, np.uint8) != np.frombuffer(by, np.uint8))
            differing.append(f"{name} ({x.type_name} {x.shape}): {d.size} of {len(bx)} bytes differ, the first at {int(d[0])}")
    if differing:
        msgs.append(f"{len(differing)} tensors differ: " + "; ".join(differing[:limit]))
    if (a.data_start, a.size) != (b.data_start, b.size):
        msgs.append(f"data start {a.data_start} vs {b.data_start}, size {a.size} vs {b.size}")
    first = first_difference(ref, out)
    if first is not None:
        where = "header" if first < min(a.data_start, b.data_start) else "tensor data"
        msgs.append(f"first differing byte at offset {first} ({where})")
    return msgs


def first_difference(a: str | Path, b: str | Path, chunk: int = 1 << 22) -> int | None:
    """The offset of the first byte where two files differ (the shorter one's size when one is
    the other's start); None when they are the same bytes."""
    pos = 0
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(chunk), fb.read(chunk)
            if x != y:
                n = min(len(x), len(y))
                d = np.flatnonzero(np.frombuffer(x[:n], np.uint8) != np.frombuffer(y[:n], np.uint8))
                return pos + (int(d[0]) if d.size else n)
            if not x:
                return None
            pos += len(x)
