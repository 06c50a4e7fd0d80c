"""Build safetensors / qformat files byte by byte, for tests that need broken or unusual files.

Nothing here uses qformat's writer or its encoders (qformat.schemes): headers are assembled
from dicts or raw text, tensor data from NumPy arrays or raw bytes, and codes are packed with
:func:`qformat.packing.pack_rows` only.  So a test can produce exactly the bytes it means to,
including bytes no correct writer would ever produce.

The raw writer itself (:func:`raw_file`, :func:`build_file`, :func:`layout`, :func:`raw_tensor`,
:data:`ST_DTYPE`) is conformance/build.py's, the one shared with the corpus generator (which must
not import tests/); this module re-exports it and adds hand-written descriptors and small files.

Typical use::

    desc, comps = int4_tensor("w")                       # a hand-written valid descriptor
    data = build_file({**comps, "b": np.ones(3, np.float32)}, qformat=qformat_object({"w": desc}))
    path.write_bytes(data)
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from conformance.build import (  # noqa: F401  (the one raw safetensors writer, re-exported)
    ST_DTYPE,
    Tensorish,
    build_file,
    header_bytes,
    layout,
    raw_file,
    raw_tensor,
)
from qformat.packing import Packing, pack_rows


def qformat_object(tensors: Mapping[str, Any], version: Any = "1.0", **extra: Any) -> dict[str, Any]:
    """The qformat metadata object {"version", "tensors", **extra}."""
    return {"version": version, "tensors": dict(tensors), **extra}


# -- hand-written valid descriptors ---------------------------------------------------------
def packing(container: int = 8, bit_order: str = "lsb_first", axis: int | None = 1, **kw: Any) -> dict[str, Any]:
    return {"container": container, "bit_order": bit_order, "axis": axis, **kw}


def pack(codes: np.ndarray, bits: int, pk: Mapping[str, Any] | Packing) -> np.ndarray:
    """Canonical codes (logical order) -> the codes component, per SPEC.md: transposed by the
    packing's ``order`` when it has one, packed along its axis (or flat), as unsigned words."""
    p = pk if isinstance(pk, Packing) else Packing.from_dict(pk)
    codes = np.asarray(codes, np.uint8)
    order = p.order or tuple(range(codes.ndim))
    s = codes.transpose(order)
    if p.axis is None:
        return pack_rows(s.reshape(1, -1), bits, p).reshape(-1)
    moved = np.moveaxis(s, p.axis, -1)
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


def table_desc(values, dtype="float32", **params):
    """A one-code-per-byte codebook tensor whose element values are ``values`` (F32 table)."""
    n = len(values)
    desc = {"shape": [n], "dtype": dtype,
            "codes": {"tensor": "c", "element": {"type": "codebook", "bits": 8, "table_tensor": "t"},
                      "packing": {"container": 8, "bit_order": "lsb_first", "axis": 0}}}
    comps = {"c": np.arange(n, dtype=np.uint8), "t": np.asarray(values, np.float32)}
    for role, (op, vals) in params.items():
        vals = np.asarray(vals)
        desc[role] = {"blocks": {"type": "grid", "size": [1 if vals.size == n else None]}, "tensor": role}
        if op:
            desc[role]["op"] = op
        comps[role] = vals
    return desc, comps


def fma_desc():
    """x*s + b with x = s = 1+2^-12, b = -(1+2^-11): 0 with two roundings, 2^-24 with an FMA."""
    x = np.float32(1 + 2**-12)
    return table_desc([x] * 16, scale=("multiply", np.float32([x])), bias=("add", np.float32([-(1 + 2**-11)])))


def valid_file(extra_plain: bool = True, seed: int = 0) -> bytes:
    """A small valid qformat file: int4 tensor "w" [4, 8] and (optionally) a plain F32 "b"."""
    desc, comps = int4_tensor("w", seed=seed)
    tensors: dict[str, Tensorish] = dict(comps)
    if extra_plain:
        tensors["b"] = np.arange(3, dtype=np.float32)
    return build_file(tensors, metadata={"note": "test"}, qformat=qformat_object({"w": desc}))
