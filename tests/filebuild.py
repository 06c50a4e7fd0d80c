"""Build safetensors / qformat files byte by byte, for tests that need broken or unusual files.

Nothing here uses qformat's writer or its encoders (qformat.schemes): headers are assembled
from dicts or raw text, tensor data from NumPy arrays or raw bytes, and codes are packed with
:func:`qformat.packing.pack_rows` only.  So a test can produce exactly the bytes it means to,
including bytes no correct writer would ever produce.

Typical use::

    desc, comps = int4_tensor("w")                       # a hand-written valid descriptor
    data = build_file({**comps, "b": np.ones(3, np.float32)}, qformat=qformat_object({"w": desc}))
    path.write_bytes(data)
"""

from __future__ import annotations

import json
import struct
from typing import Any, Mapping, Sequence, Union

import ml_dtypes
import numpy as np

from qformat.packing import Packing, pack_rows

#: NumPy dtype -> safetensors dtype name (independent of qformat's own table).
ST_DTYPE = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "U8",
    np.dtype(np.int8): "I8",
    np.dtype(np.uint16): "U16",
    np.dtype(np.int16): "I16",
    np.dtype(np.uint32): "U32",
    np.dtype(np.int32): "I32",
    np.dtype(np.uint64): "U64",
    np.dtype(np.int64): "I64",
    np.dtype(np.float16): "F16",
    np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype(np.float32): "F32",
    np.dtype(np.float64): "F64",
    np.dtype(np.complex64): "C64",
    np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3",
    np.dtype(ml_dtypes.float8_e5m2): "F8_E5M2",
    np.dtype(ml_dtypes.float8_e8m0fnu): "F8_E8M0",
}

#: A tensor to lay out: a NumPy array, or (safetensors dtype, shape, raw bytes) taken verbatim.
Tensorish = Union[np.ndarray, "tuple[str, Sequence[int], bytes]"]


def raw_tensor(t: Tensorish) -> tuple[str, list[int], bytes]:
    """(dtype name, shape, little-endian bytes) of an array or a raw triple."""
    if isinstance(t, tuple):
        dt, shape, data = t
        return dt, list(shape), bytes(data)
    a = np.asarray(t)
    name = ST_DTYPE[np.dtype(a.dtype).newbyteorder("=")]
    a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
    return name, list(a.shape), a.tobytes()


def layout(tensors: Mapping[str, Tensorish]) -> tuple[dict[str, Any], bytes]:
    """Header entries with consecutive offsets (in the mapping's order) and the data buffer."""
    header: dict[str, Any] = {}
    chunks = []
    off = 0
    for name, t in tensors.items():
        dt, shape, data = raw_tensor(t)
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        chunks.append(data)
        off += len(data)
    return header, b"".join(chunks)


def header_bytes(header: Mapping[str, Any] | str | bytes, pad: bool = True) -> bytes:
    """The header as bytes: dicts are dumped compactly; ``pad`` adds spaces to a multiple of 8."""
    if isinstance(header, Mapping):
        hb = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    elif isinstance(header, str):
        hb = header.encode("utf-8")
    else:
        hb = bytes(header)
    if pad:
        hb += b" " * (-len(hb) % 8)
    return hb


def raw_file(header: Mapping[str, Any] | str | bytes, data: bytes = b"", *, pad: bool = True,
             length: int | None = None) -> bytes:
    """8-byte length prefix (``length`` overrides the true one) + header + data, verbatim."""
    hb = header_bytes(header, pad)
    n = len(hb) if length is None else length
    return struct.pack("<Q", n) + hb + data


def qformat_object(tensors: Mapping[str, Any], version: Any = "1.0", **extra: Any) -> dict[str, Any]:
    """The qformat metadata object {"version", "tensors", **extra}."""
    return {"version": version, "tensors": dict(tensors), **extra}


def build_file(tensors: Mapping[str, Tensorish], metadata: Mapping[str, str] | None = None,
               qformat: Mapping[str, Any] | str | None = None, *, pad: bool = True) -> bytes:
    """A complete file; ``qformat`` (object, or raw text) goes to __metadata__["qformat"]."""
    entries, data = layout(tensors)
    header: dict[str, Any] = {}
    meta = dict(metadata or {})
    if qformat is not None:
        meta["qformat"] = qformat if isinstance(qformat, str) else json.dumps(qformat, separators=(",", ":"))
    if meta:
        header["__metadata__"] = meta
    header.update(entries)
    return raw_file(header, data, pad=pad)


# -- hand-written valid descriptors ---------------------------------------------------------
def packing(container: int = 8, bit_order: str = "lsb_first", axis: int | None = 1, **kw: Any) -> dict[str, Any]:
    return {"container": container, "bit_order": bit_order, "axis": axis, **kw}


def pack(codes: np.ndarray, bits: int, pk: Mapping[str, Any]) -> np.ndarray:
    """Pack a logical code grid along the packing's axis (no ``order``), as unsigned words."""
    p = Packing.from_dict(pk)
    codes = np.asarray(codes, np.uint8)
    if p.axis is None:
        return pack_rows(codes.reshape(1, -1), bits, p).reshape(-1)
    moved = np.moveaxis(codes, p.axis, -1)
    return np.moveaxis(pack_rows(moved, bits, p), -1, p.axis)


def int4_tensor(name: str = "w", shape: tuple[int, int] = (4, 8), group: int = 4, seed: int = 0,
                dtype: str = "float32") -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A 4-bit asymmetric integer tensor: unsigned codes in U8 (two per byte, lsb first, along
    axis 1), a U8 zero point and an F16 scale per group of ``group`` along axis 1.

    Returns (descriptor, components); components are named ``{name}.codes``, ``.zero``, ``.scale``.
    """
    rng = np.random.default_rng(seed)
    n, k = shape
    codes = rng.integers(0, 16, size=shape, dtype=np.uint8)
    groups = -(-k // group)
    zero = rng.integers(0, 16, size=(n, groups), dtype=np.uint8)
    scale = (rng.random((n, groups)) + 0.5).astype(np.float16)
    pk = packing(8, "lsb_first", 1)
    desc = {
        "shape": [n, k], "dtype": dtype,
        "codes": {"tensor": f"{name}.codes", "element": {"type": "int", "bits": 4, "signedness": "unsigned"},
                  "packing": pk},
        "zero": {"blocks": {"type": "grid", "size": [1, group]}, "tensor": f"{name}.zero"},
        "scale": {"blocks": {"type": "grid", "size": [1, group]}, "op": "multiply", "tensor": f"{name}.scale"},
        "scheme": "int",
    }
    comps = {f"{name}.codes": pack(codes, 4, pk).astype(np.uint8), f"{name}.zero": zero, f"{name}.scale": scale}
    return desc, comps


def int4_expected(desc: Mapping[str, Any], comps: Mapping[str, np.ndarray], codes: np.ndarray | None = None) -> np.ndarray:
    """Reference decode of an :func:`int4_tensor` (binary32, one rounding per step)."""
    name = desc["codes"]["tensor"].rsplit(".", 1)[0]
    n, k = desc["shape"]
    group = desc["scale"]["blocks"]["size"][1]
    if codes is None:
        words = comps[f"{name}.codes"]
        codes = np.stack([words & 0xF, words >> 4], axis=-1).reshape(n, -1)[:, :k]
    cols = np.arange(k) // group
    z = comps[f"{name}.zero"].astype(np.float32)[:, cols]
    s = comps[f"{name}.scale"].astype(np.float32)[:, cols]
    x = (codes.astype(np.float32) - z) * s
    return x.astype(np.float32)


def codebook_tensor(name: str = "c", n: int = 8, table_len: int = 10, bits: int = 4,
                    codes: Sequence[int] | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A 1-D codebook tensor with its own F32 table of ``table_len`` entries, no parameters."""
    if codes is None:
        codes = [i % table_len for i in range(n)]
    pk = packing(8, "lsb_first", None)
    desc = {
        "shape": [n], "dtype": "float32",
        "codes": {"tensor": f"{name}.codes", "element": {"type": "codebook", "bits": bits, "table_tensor": f"{name}.table"},
                  "packing": pk},
    }
    comps = {f"{name}.codes": pack(np.asarray(codes), bits, pk).astype(np.uint8),
             f"{name}.table": np.linspace(-1, 1, table_len).astype(np.float32)}
    return desc, comps


def valid_file(extra_plain: bool = True, seed: int = 0) -> bytes:
    """A small valid qformat file: int4 tensor "w" [4, 8] and (optionally) a plain F32 "b"."""
    desc, comps = int4_tensor("w", seed=seed)
    tensors: dict[str, Tensorish] = dict(comps)
    if extra_plain:
        tensors["b"] = np.arange(3, dtype=np.float32)
    return build_file(tensors, metadata={"note": "test"}, qformat=qformat_object({"w": desc}))
