"""Dtype tables and NumPy <-> torch conversion of raw storage (bytes are reinterpreted, never converted).

Public: the torch-based readers (``qformat.transformers``) use it too.

torch has no NumPy counterpart for bfloat16 or the float8 types, and only partial support for
unsigned 16/32/64-bit integers, so every array crosses between the two as the signed integer of
its width and is then viewed in the target dtype.  Storage dtype names are safetensors' names
(qformat/tables/dtypes.json).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import torch

from qformat import dtypes as qdtypes
from qformat.errors import error

#: safetensors storage dtype name -> torch dtype (F4 reads as float4_e2m1fn_x2, F6_* as raw U8 bytes: numpy_to_torch).
STORAGE_TORCH: dict[str, torch.dtype] = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "U16": torch.uint16, "I16": torch.int16,
    "U32": torch.uint32, "I32": torch.int32, "U64": torch.uint64, "I64": torch.int64,
    "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
    "C64": torch.complex64, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "F8_E8M0": torch.float8_e8m0fnu, "F8_E4M3FNUZ": torch.float8_e4m3fnuz, "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
}
TORCH_STORAGE: dict[torch.dtype, str] = {v: k for k, v in STORAGE_TORCH.items()}

#: Logical dtype name (descriptor "dtype") -> torch dtype.
LOGICAL_TORCH: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
TORCH_LOGICAL: dict[torch.dtype, str] = {v: k for k, v in LOGICAL_TORCH.items()}

#: Signed integer dtype of each element width (bytes), the lingua franca between NumPy and torch.
_INT_NP = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
_INT_TORCH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
#: torch dtypes whose tensors go through .numpy() directly.
_NUMPY_NATIVE = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                 torch.float16, torch.float32, torch.float64, torch.complex64}


def int_view_dtype(nbytes: int) -> torch.dtype:
    """The signed torch integer dtype of an element width in bytes."""
    return _INT_TORCH[nbytes]


def storage_name(dtype: torch.dtype) -> str:
    """safetensors dtype name of a torch dtype (SAVE_INVALID when safetensors has none)."""
    name = TORCH_STORAGE.get(dtype)
    if name is None:
        raise error("SAVE_INVALID", f"torch dtype {dtype} has no safetensors dtype")
    return name


def numpy_to_torch(a: np.ndarray, device: Any = "cpu", dtype_name: str | None = None) -> torch.Tensor:
    """A torch copy of ``a`` (a view of a memory map is read here, only its own bytes), on ``device``.

    ``dtype_name`` is the safetensors dtype of the storage (default: derived from ``a.dtype``).
    """
    name = dtype_name or qdtypes.storage_name(a.dtype)
    if name == "F4":
        return _f4_to_torch(a, device)
    if name in ("F6_E2M3", "F6_E3M2"):  # read as raw bytes (SPEC.md §2.6)
        name = "U8"
    if name is None or name not in STORAGE_TORCH:
        raise error("PLAIN_DTYPE_UNSUPPORTED", f"array dtype {a.dtype} has no torch dtype")
    target = STORAGE_TORCH[name]
    # np.array(copy=True) reads exactly the viewed elements and gives a writable, contiguous array.
    c = np.array(a, copy=True, order="C")
    if c.dtype.itemsize == 0 or c.size == 0:
        return torch.empty(c.shape, dtype=target, device=device)
    if name == "BOOL":
        t = torch.from_numpy(c.view(np.uint8)).view(torch.bool)
    else:
        t = torch.from_numpy(c.view(_INT_NP[c.dtype.itemsize])).view(target)
    return t.to(device)


def _f4_to_torch(a: np.ndarray, device: Any) -> torch.Tensor:
    """Plain F4 values (one ml_dtypes float4_e2m1fn per element, SPEC.md §2.6) as torch's
    ``float4_e2m1fn_x2``, two values a byte, the last axis halved, as safetensors returns them;
    PLAIN_DTYPE_UNSUPPORTED where the last axis is odd (or the tensor has rank 0)."""
    x2 = getattr(torch, "float4_e2m1fn_x2", None)
    if x2 is None or a.ndim == 0 or a.shape[-1] % 2:
        raise error("PLAIN_DTYPE_UNSUPPORTED", f"an F4 array of shape {list(a.shape)} has no torch dtype: torch holds F4 values "
                                               "in pairs (float4_e2m1fn_x2) along an even last axis")
    codes = np.ascontiguousarray(a).view(np.uint8)
    packed = (codes[..., 0::2] & 0x0F) | (codes[..., 1::2] << 4)
    if packed.size == 0:
        return torch.empty(packed.shape, dtype=x2, device=device)
    return torch.from_numpy(np.ascontiguousarray(packed)).view(x2).to(device)


def _f4_to_numpy(t: torch.Tensor) -> np.ndarray:
    """The inverse of ``_f4_to_torch``: one ml_dtypes float4_e2m1fn per value, the last axis doubled
    (value 2k in the low nibble of byte k, SPEC.md §2.6)."""
    packed = t.view(torch.uint8).numpy()
    codes = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), np.uint8)
    codes[..., 0::2] = packed & 0x0F
    codes[..., 1::2] = packed >> 4
    return codes.view(ml_dtypes.float4_e2m1fn)


def torch_to_numpy(t: torch.Tensor) -> np.ndarray:
    """A NumPy copy of ``t`` in the matching NumPy / ml_dtypes dtype (bfloat16, float8 included)."""
    t = t.detach().to("cpu").contiguous()
    if t.dtype is getattr(torch, "float4_e2m1fn_x2", None):
        return _f4_to_numpy(t)
    if t.dtype in _NUMPY_NATIVE:
        return t.numpy().copy()
    name = storage_name(t.dtype)
    npdt = qdtypes.storage_numpy(name)
    if npdt is None:
        raise error("PLAIN_DTYPE_UNSUPPORTED", f"torch dtype {t.dtype} has no NumPy dtype")
    if t.numel() == 0:
        return np.zeros(tuple(t.shape), npdt)
    return t.view(_INT_TORCH[t.element_size()]).numpy().view(npdt).copy()


def tensor_sha256(t: torch.Tensor) -> str:
    """SHA-256 (lower-case hex) of ``t``'s bytes as safetensors stores them (row-major,
    little-endian): the digest SPEC.md §3.8 records for a stored tensor."""
    from qformat.digests import hasher

    h = hasher()
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel():
        h.update(memoryview(flat.view(torch.uint8).numpy()))
    return str(h.hexdigest())
