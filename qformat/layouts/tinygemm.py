"""``tinygemm_int4_cuda``: torch's tinygemm int4 layout for CUDA tensor cores (SPEC.md §11.3).

The layout is the output of ``aten/src/ATen/native/cuda/int4mm.cu``
``_convert_weight_to_int4pack_cuda`` / ``matrix_to_m16n8k16_Bint4_layout`` (the non-ROCm
branch; ROCm uses 16-wide n tiles and is a different layout).  For a logical weight ``[N, K]``
of 4-bit codes ``q[n, k]`` and ``inner_k_tiles = T`` (2, 4 or 8), the device tensor ``D`` is
``uint32 [N/8, K/(16T), 32, T/2]`` and nibble ``j`` (bits ``4j .. 4j+3``) of
``D[nt, ko, t, w]`` holds ``q[n, k]`` with

    n = 8*nt + t // 4
    k = 16*(ko*T + 2*w) + 2*(t % 4) + 8*(i % 2) + 16*(i // 2) + h,   i = j % 4, h = j // 4

(the kernel reads the bytes ``kBase0 + t%4``, ``+4``, ``kBase0 + 8 + t%4``, ``+4`` of the
``[n][k/2]`` uint8 input, whose high nibble is the even ``k``; it writes the four high nibbles to
bits 0-15 and the four low nibbles to bits 16-31).  Every nibble of ``D`` holds exactly one code,
so :func:`pack` and :func:`unpack` are a permutation and its inverse.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..descriptor import Descriptor
from .base import Add, DeviceLayout, register

NAME = "tinygemm_int4_cuda"
INNER_K_TILES = (2, 4, 8)
GROUP_SIZES = (32, 64, 128, 256)
N_TILE = 8
K_TILE = 16


def device_shape(n: int, k: int, inner_k_tiles: int) -> tuple[int, int, int, int]:
    """Shape of the device tensor for a logical ``[n, k]`` weight."""
    return (n // N_TILE, k // (inner_k_tiles * K_TILE), 32, inner_k_tiles // 2)


@lru_cache(maxsize=16)
def _index(n: int, k: int, inner_k_tiles: int) -> tuple[np.ndarray, np.ndarray]:
    """Per device nibble (device index + nibble j, flattened), its logical (n, k)."""
    T = inner_k_tiles
    nt, ko, t, w, j = np.meshgrid(*(np.arange(s) for s in device_shape(n, k, T) + (8,)), indexing="ij")
    i, h = j % 4, j // 4
    nn = N_TILE * nt + t // 4
    kk = K_TILE * (ko * T + 2 * w) + 2 * (t % 4) + 8 * (i % 2) + 16 * (i // 2) + h
    nn.setflags(write=False)
    kk.setflags(write=False)
    return nn.reshape(-1), kk.reshape(-1)


def pack(codes: np.ndarray, inner_k_tiles: int) -> np.ndarray:
    """Logical 4-bit codes ``[N, K]`` -> the device tensor (uint32, shape :func:`device_shape`)."""
    n, k = codes.shape
    nn, kk = _index(n, k, inner_k_tiles)
    nib = codes[nn, kk].astype(np.uint32).reshape(-1, 8)
    words = np.zeros(nib.shape[0], np.uint32)
    for j in range(8):
        words |= nib[:, j] << np.uint32(4 * j)
    return words.reshape(device_shape(n, k, inner_k_tiles))


def unpack(words: np.ndarray, n: int, k: int, inner_k_tiles: int) -> np.ndarray:
    """The device tensor -> logical 4-bit codes ``[N, K]`` (uint8); the inverse of :func:`pack`."""
    w = np.ascontiguousarray(words).view(np.uint32).reshape(-1)
    nib = np.stack([(w >> np.uint32(4 * j)) & np.uint32(0xF) for j in range(8)], axis=1).reshape(-1)
    nn, kk = _index(n, k, inner_k_tiles)
    out = np.empty((n, k), np.uint8)
    out[nn, kk] = nib
    return out


def _positions(n: int, k: int, inner_k_tiles: int) -> np.ndarray:
    nn, kk = _index(n, k, inner_k_tiles)
    pos = np.empty(n * k, np.int64)
    pos[nn * k + kk] = np.arange(nn.size)
    return pos.reshape(n, k)


class TinyGemmInt4Cuda(DeviceLayout):
    """``tinygemm_int4_cuda`` (parameter ``inner_k_tiles``): 4-bit codes, scale and optional
    additive bias per group along K, stored ``[K/G, N]``."""

    name = NAME
    bits = (4,)
    group_sizes = GROUP_SIZES
    per_channel = False
    bias = True

    @staticmethod
    def _tiles(desc: Descriptor) -> int:
        return int(desc.layout_parameters["inner_k_tiles"])

    def shape_problems(self, desc: Descriptor, add: Add) -> None:
        n, k = desc.shape
        t = self._tiles(desc)
        if n % N_TILE or k % (t * K_TILE):
            add("LAYOUT_SHAPE", "shape", f"layout {NAME!r} with inner_k_tiles {t} needs N a multiple of 8 and K a multiple of {t * 16}, found [N, K] = {[n, k]}")

    def device_shape(self, desc: Descriptor) -> tuple[int, ...]:
        n, k = desc.shape
        return device_shape(n, k, self._tiles(desc))

    def unpack(self, desc: Descriptor, device: np.ndarray) -> np.ndarray:
        n, k = desc.shape
        return unpack(device, n, k, self._tiles(desc))

    def pack(self, desc: Descriptor, codes: np.ndarray) -> np.ndarray:
        return pack(codes, self._tiles(desc))

    def code_positions(self, desc: Descriptor) -> np.ndarray:
        n, k = desc.shape
        return _positions(n, k, self._tiles(desc))


LAYOUT = register(TinyGemmInt4Cuda())
