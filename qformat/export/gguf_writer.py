"""A streaming writer of GGUF v3 files (ggml ``docs/gguf.md``), NumPy only.

The layout is the one :mod:`qformat.convert.gguf_file` reads (and gguf-py's ``GGUFWriter``
writes): magic ``GGUF``, uint32 version 3, uint64 tensor count, uint64 KV count, the KVs (a
string key, a uint32 value type, the value), the tensor infos (name, uint32 n_dims, the dims
innermost first, uint32 ggml type, uint64 offset into the data section), zero padding to the
alignment, then each tensor's bytes at its offset, each padded to the alignment as gguf-py
pads them.  Everything is little-endian.

The whole header is made first from the tensors' names, types and shapes (their sizes follow
from the block sizes); each tensor's bytes are produced only when the writer reaches it and
dropped after writing, so memory holds one tensor at a time, or one slice of rows of it where
the entry yields its bytes in slices (``TensorEntry.chunks``: what ``qformat export --to gguf``
does for the block types, so a large tensor's decoded values never exist whole).  The file is
written to a private temporary file beside the destination, read back by qformat's own GGUF reader (every offset
and size checked), and renamed into place: on any error nothing is left at the destination.

KV values are given in the JSON form :mod:`qformat.convert.gguf` stores them in
(``{"type", "value"}``, arrays with ``"element_type"``, nested arrays as such objects, NaN and
infinities as the strings ``"nan"``, ``"inf"``, ``"-inf"``).
"""

from __future__ import annotations

import contextlib
import os
import struct
import tempfile
from dataclasses import dataclass
from typing import IO, Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from ..convert.gguf_file import DEFAULT_ALIGNMENT, GGML_TYPES, MAGIC, VALUE_TYPES
from ..errors import error

VERSION = 3
#: GGUF value type name -> id (``uint8`` 0 ... ``float64`` 12).
VALUE_TYPE_IDS: dict[str, int] = {v[0]: k for k, v in VALUE_TYPES.items()}
#: ggml type name -> id (``F32`` 0, ``Q4_0`` 2, ...).
GGML_TYPE_IDS: dict[str, int] = {v[0]: k for k, v in GGML_TYPES.items()}


@dataclass
class TensorEntry:
    """One tensor of the file: its name, ggml type name, NumPy-order (logical) shape, and
    ``produce()``, which returns its bytes (any array whose buffer is the little-endian data)
    when the writer reaches it; or ``chunks()``, which yields them in consecutive pieces, each
    written as it comes (memory then holds one piece, not the tensor)."""

    name: str
    ggml_type: str
    shape: tuple[int, ...]
    produce: Callable[[], np.ndarray]
    chunks: Callable[[], Iterator[np.ndarray]] | None = None

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.ggml_type, self.shape)


def tensor_nbytes(ggml_type: str, shape: Sequence[int]) -> int:
    """Bytes of a tensor of ``ggml_type`` and NumPy-order ``shape`` (rows of whole blocks)."""
    _, bs, ts = GGML_TYPES[GGML_TYPE_IDS[ggml_type]]
    if not shape or shape[-1] % bs:
        raise ValueError(f"a {ggml_type} tensor needs a last axis that is a multiple of {bs}, got {tuple(shape)}")
    n = int(shape[-1]) // bs * ts
    for d in shape[:-1]:
        n *= int(d)
    return n


def pad(n: int, alignment: int) -> int:
    """``n`` rounded up to a multiple of ``alignment``."""
    return -(-n // alignment) * alignment


# -- values ------------------------------------------------------------------------------------------
_U64 = struct.Struct("<Q")


def _string(s: str) -> bytes:
    b = s.encode("utf-8")
    return _U64.pack(len(b)) + b


def _number(x: Any) -> Any:
    if isinstance(x, str):  # JSON has no NaN/Inf: the converter writes them as strings
        return {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}[x]
    return x


def encode_value(vtype: str, value: Any, element_type: str | None = None) -> bytes:
    """A value of GGUF type ``vtype`` (its bytes without the leading type id)."""
    if vtype == "string":
        return _string(str(value))
    if vtype == "array":
        if element_type is None:
            raise ValueError("an array value needs its element_type")
        head = struct.pack("<IQ", VALUE_TYPE_IDS[element_type], len(value))
        if element_type == "string":
            # a vocabulary is ~10^5 strings: lengths and bytes interleaved in one join
            enc = [str(v).encode("utf-8") for v in value]
            parts: list[bytes] = [b""] * (2 * len(enc))
            parts[0::2] = map(_U64.pack, map(len, enc))
            parts[1::2] = enc
            return head + b"".join(parts)
        if element_type == "array":
            return head + b"".join(encode_value("array", v["value"], v["element_type"]) for v in value)
        fmt = VALUE_TYPES[VALUE_TYPE_IDS[element_type]][1]
        if not any(isinstance(v, str) for v in value):  # no "nan"/"inf" strings: NumPy converts the list at once
            items = value if element_type != "bool" else [1 if v else 0 for v in value]
            return head + np.asarray(items, dtype=np.dtype(fmt)).tobytes()
        items = [_number(v) for v in value]
        if element_type == "bool":
            items = [1 if v else 0 for v in items]
        return head + np.asarray(items, dtype=np.dtype(fmt)).tobytes()
    fmt = VALUE_TYPES[VALUE_TYPE_IDS[vtype]][1]
    v = _number(value)
    if vtype == "bool":
        v = 1 if v else 0
    return np.asarray(v, dtype=np.dtype(fmt)).tobytes()


def encode_kv(key: str, item: dict[str, Any]) -> bytes:
    """One key/value pair; ``item`` is ``{"type", "value"[, "element_type"]}``."""
    t = item["type"]
    return _string(key) + struct.pack("<I", VALUE_TYPE_IDS[t]) + encode_value(t, item["value"], item.get("element_type"))


def header(kvs: Iterable[tuple[str, dict[str, Any]]], tensors: Sequence[TensorEntry], alignment: int) -> bytes:
    """Everything before the data section (unpadded): magic, counts, KVs and tensor infos."""
    kv_bytes = [encode_kv(k, v) for k, v in kvs]
    out = [MAGIC, struct.pack("<IQQ", VERSION, len(tensors), len(kv_bytes)), *kv_bytes]
    offset = 0
    for t in tensors:
        out.append(_string(t.name))
        out.append(struct.pack("<I", len(t.shape)))
        out.append(struct.pack(f"<{len(t.shape)}Q", *reversed(t.shape)))  # ne[0] is the last axis
        out.append(struct.pack("<IQ", GGML_TYPE_IDS[t.ggml_type], offset))
        offset += pad(t.nbytes, alignment)
    return b"".join(out)


# -- the file ------------------------------------------------------------------------------------------
def write_gguf(dst: str, kvs: Sequence[tuple[str, dict[str, Any]]], tensors: Sequence[TensorEntry], *,
               alignment: int = DEFAULT_ALIGNMENT, written: Callable[[TensorEntry], None] | None = None) -> int:
    """Write a GGUF file at ``dst`` atomically; returns its size in bytes.

    ``written(entry)`` runs after each tensor's bytes are written (release source pages
    there).  The caller checks the destination first (it is replaced if it exists).
    """
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"alignment {alignment} is not a power of two")
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise error("EXPORT_UNMAPPABLE", f"gguf: two tensors would be written as {dup!r}", tensor=dup)
    head = header(kvs, tensors, alignment)
    folder = os.path.dirname(os.path.abspath(dst))
    fd, tmp = tempfile.mkstemp(prefix=".qformat-", suffix=".gguf.tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(head)
            if tensors:  # no data section, no padding (gguf-py writes a vocabulary-only file so)
                _pad_to(f, len(head), alignment)
            for t in tensors:
                _write_tensor(f, t, alignment)
                if written is not None:
                    written(t)
            f.flush()
            os.fsync(f.fileno())
        _verify(tmp, names)
        from ..atomic import default_mode

        os.chmod(tmp, os.stat(dst).st_mode & 0o777 if os.path.exists(dst) else default_mode())
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return os.path.getsize(dst)


def _pad_to(f: IO[bytes], n: int, alignment: int) -> None:
    k = pad(n, alignment) - n
    if k:
        f.write(b"\0" * k)


def _little(a: Any) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return np.ascontiguousarray(a)


def _write_tensor(f: IO[bytes], t: TensorEntry, alignment: int) -> None:
    if t.chunks is not None:
        n = 0
        for piece in t.chunks():
            a = _little(piece)
            n += a.nbytes
            if n > t.nbytes:
                break
            f.write(memoryview(a.reshape(-1).view(np.uint8)))
            del a, piece
    else:
        a = _little(t.produce())
        n = a.nbytes
        if n == t.nbytes:
            f.write(memoryview(a.reshape(-1).view(np.uint8)))
        del a
    if n != t.nbytes:
        size = f"more than {t.nbytes}" if n > t.nbytes else str(n)
        raise error("EXPORT_NOT_EXACT", f"gguf: {t.ggml_type} data of shape {list(t.shape)} is {size} bytes, expected {t.nbytes}", tensor=t.name)
    _pad_to(f, t.nbytes, alignment)


def _verify(path: str, names: list[str]) -> None:
    """The written file must parse with qformat's own (hardened) GGUF reader, same tensors."""
    from ..convert.gguf_file import GGUFFile

    g = GGUFFile(path)
    try:
        if list(g.tensors) != names:
            raise error("SAVE_INVALID", f"the written GGUF file lists tensors {list(g.tensors)[:3]}..., expected {names[:3]}...")
    finally:
        with contextlib.suppress(BufferError, ValueError):  # views still alive: the GC closes the map
            g._buf.release()
            del g._bytes
            g._mm.close()
