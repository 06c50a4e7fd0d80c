"""``marlin_dense``: the Marlin / GPTQ-Marlin dense weight layout (SPEC.md §11.4).

Transcribed from IST-DASLab/marlin ``marlin/__init__.py`` (``_get_perms``, ``Layer.pack``) and
vLLM ``model_executor/layers/quantization/utils/marlin_utils_test.py`` (``get_weight_perm``,
``marlin_permute_weights``, ``marlin_weights``) and ``marlin_utils.py``
(``get_scale_perms``, ``marlin_permute_scales``).  For a logical weight ``[N, K]`` of ``b``-bit
codes (b = 4 or 8), with ``P = 32 / b`` codes per word:

1. ``A = q.T`` (``[K, N]``), cut into 16x16 tiles: ``A2[kt, nt*256 + r*16 + c] = A[16kt + r, 16nt + c]``
   (``[K/16, 16N]``);
2. every run of 1024 entries of each row of ``A2`` is gathered by ``PERM_b``:
   ``R[kt, 1024u + m] = A2[kt, 1024u + PERM_b[m]]``;
3. ``D[kt, x] = sum_{i<P} R[kt, P*x + i] << (b*i)`` (uint32 ``[K/16, 16N/P]``).

Scales ``s`` stored ``[K/G, N]`` (grouped, G < K) or ``[1, N]`` (per channel) are permuted over
their row-major flat order in runs of 64 (``SCALE_PERM``) or 32 (``SCALE_PERM_SINGLE``):
``device[64u + m] = s_flat[64u + SCALE_PERM[m]]``.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..descriptor import Descriptor
from .base import Add, DeviceLayout, register

NAME = "marlin_dense"
BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)
K_MULTIPLE = 128
N_MULTIPLE = 64
TILE = 16


@lru_cache(maxsize=2)
def weight_perm(bits: int) -> np.ndarray:
    """The 1024-entry gather of one run: mma fragment order, then the interleave of ``bits``."""
    perm = []
    for i in range(32):
        perm1 = []
        col = i // 4
        for block in (0, 1):
            for row in (2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4 + 4), 2 * (i % 4 + 4) + 1):
                perm1.append(16 * row + col + 8 * block)
        for j in range(4):
            perm.extend(p + 256 * j for p in perm1)
    interleave = np.array([0, 2, 4, 6, 1, 3, 5, 7] if bits == 4 else [0, 2, 1, 3])
    out = np.array(perm).reshape(-1, len(interleave))[:, interleave].reshape(-1)
    out.setflags(write=False)
    return out


def _scale_perms() -> tuple[np.ndarray, np.ndarray]:
    grouped = [i + 8 * j for i in range(8) for j in range(8)]
    single = [2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)]
    return np.array(grouped), np.array(single)


SCALE_PERM, SCALE_PERM_SINGLE = _scale_perms()


def device_shape(n: int, k: int, bits: int) -> tuple[int, int]:
    return (k // TILE, n * TILE * bits // 32)


def grouped(group: int | None, k: int) -> bool:
    """True when the scales use the per-64 permutation (a group size below K)."""
    return group is not None and group < k


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Logical codes ``[N, K]`` -> the device tensor (uint32 ``[K/16, N*16*bits/32]``)."""
    n, k = codes.shape
    a = codes.T.reshape(k // TILE, TILE, n // TILE, TILE).transpose(0, 2, 1, 3).reshape(k // TILE, n * TILE)
    perm = weight_perm(bits)
    r = a.reshape(-1, perm.size)[:, perm].reshape(a.shape).astype(np.uint32)
    per = 32 // bits
    out = np.zeros((r.shape[0], r.shape[1] // per), np.uint32)
    for i in range(per):
        out |= r[:, i::per] << np.uint32(bits * i)
    return out


def unpack(words: np.ndarray, n: int, k: int, bits: int) -> np.ndarray:
    """The device tensor -> logical codes ``[N, K]`` (uint8); the inverse of :func:`pack`."""
    w = np.ascontiguousarray(words).view(np.uint32).reshape(k // TILE, -1)
    per = 32 // bits
    r = np.empty((w.shape[0], w.shape[1] * per), np.uint8)
    mask = np.uint32((1 << bits) - 1)
    for i in range(per):
        r[:, i::per] = (w >> np.uint32(bits * i)) & mask
    perm = weight_perm(bits)
    a = np.empty_like(r)
    a.reshape(-1, perm.size)[:, perm] = r.reshape(-1, perm.size)
    return a.reshape(k // TILE, n // TILE, TILE, TILE).transpose(0, 2, 1, 3).reshape(k, n).T.copy()


def permute_scales(s: np.ndarray, group: int | None, k: int) -> np.ndarray:
    """Canonical scales (any shape, row-major ``[K/G, N]`` order) -> the device order."""
    perm = SCALE_PERM if grouped(group, k) else SCALE_PERM_SINGLE
    flat = np.ascontiguousarray(s).reshape(-1, perm.size)
    return flat[:, perm].reshape(s.shape)


def unpermute_scales(s: np.ndarray, group: int | None, k: int) -> np.ndarray:
    """Device-order scales -> canonical order; the inverse of :func:`permute_scales`."""
    perm = SCALE_PERM if grouped(group, k) else SCALE_PERM_SINGLE
    out = np.empty_like(np.ascontiguousarray(s)).reshape(-1, perm.size)
    out[:, perm] = np.ascontiguousarray(s).reshape(-1, perm.size)
    return out.reshape(s.shape)


class MarlinDense(DeviceLayout):
    """``marlin_dense``: 4- or 8-bit codes in Marlin's tile order, the scale stored ``[K/G, N]``
    (``order`` ``[1, 0]``) and permuted per 64 (grouped) or per 32 (per channel)."""

    name = NAME
    bits = BITS
    group_sizes = GROUP_SIZES
    per_channel = True
    bias = False
    param_order = (1, 0)

    def shape_problems(self, desc: Descriptor, add: Add) -> None:
        n, k = desc.shape
        if k % K_MULTIPLE or n % N_MULTIPLE:
            add("LAYOUT_SHAPE", "shape", f"layout {NAME!r} needs K a multiple of {K_MULTIPLE} and N a multiple of {N_MULTIPLE}, found [N, K] = {[n, k]}")

    def device_shape(self, desc: Descriptor) -> tuple[int, ...]:
        n, k = desc.shape
        return device_shape(n, k, desc.codes.element.bits)

    def unpack(self, desc: Descriptor, device: np.ndarray) -> np.ndarray:
        n, k = desc.shape
        return unpack(device, n, k, desc.codes.element.bits)

    def pack(self, desc: Descriptor, codes: np.ndarray) -> np.ndarray:
        return pack(codes, desc.codes.element.bits)

    def code_positions(self, desc: Descriptor) -> np.ndarray:
        n, k = desc.shape
        a = np.arange(n * k, dtype=np.int64).reshape(n, k)
        t = a.T.reshape(k // TILE, TILE, n // TILE, TILE).transpose(0, 2, 1, 3).reshape(k // TILE, n * TILE)
        perm = weight_perm(desc.codes.element.bits)
        r = t.reshape(-1, perm.size)[:, perm].reshape(-1)
        pos = np.empty(n * k, np.int64)
        pos[r] = np.arange(r.size)
        return pos.reshape(n, k)

    @staticmethod
    def _group(desc: Descriptor) -> int | None:
        return desc.scale.blocks.size[1]  # type: ignore[union-attr,index]

    def scale_to_canonical(self, desc: Descriptor, stored: np.ndarray) -> np.ndarray:
        return unpermute_scales(stored, self._group(desc), desc.shape[1])

    def scale_from_canonical(self, desc: Descriptor, natural: np.ndarray) -> np.ndarray:
        return permute_scales(natural, self._group(desc), desc.shape[1])

    def scale_gather(self, desc: Descriptor) -> np.ndarray:
        count = int(np.prod(desc.scale.blocks.grid_shape(desc.shape)))  # type: ignore[union-attr]
        return permute_scales(np.arange(count, dtype=np.int64), self._group(desc), desc.shape[1]).argsort()


LAYOUT = register(MarlinDense())
