"""Device layouts in the torch reader (SPEC.md §11).

* Decoding a tensor stored in a device layout: the device tensor is unpacked to its canonical
  component with the NumPy reference (:mod:`qformat.layouts`), then decoded as usual
  (:func:`canonical_view`), so the torch reader gives the NumPy reader's bits.
* Saving: :func:`to_canonical` turns a tensor in a device layout back into ``canonical``.
* Loading for a kernel: :func:`tinygemm_weight` repacks canonical (or device-layout) int4
  weights into torch's tinygemm format *for the running device*, and :class:`TinyGemmLinear`
  runs ``_weight_int4pack_mm`` on it.  On CUDA the packed tensor is the ``tinygemm_int4_cuda``
  layout, made by the NumPy reference (torch's private ``_convert_weight_to_int4pack`` is an
  optional, guarded alternative); on CPU it is torch's ``_convert_weight_to_int4pack_for_cpu``
  output, whose bytes depend on the CPU and therefore never go into a file
  (``tinygemm_int4_cpu`` is forbidden, §11.5).  Private operators are used only behind
  ``hasattr`` guards, never by the core.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

import qformat
from qformat import layouts as L
from qformat.descriptor import Descriptor
from qformat.errors import error
from qformat.regions import full_region, grid_array, read_codes
from qformat.sources import ArraySource

from .sources import canonical_source


#: (canonical descriptor, torch source of canonical components) of a device-layout tensor: the
#: core's :func:`qformat.layouts.canonical_view` through the reader's NumPy view of the source.
canonical_view = canonical_source


def to_canonical(q: Any) -> qformat.QTensor:
    """A (Torch)QTensor in any layout -> a core QTensor in layout ``canonical`` (lossless)."""
    from .qtensor import as_qtensor

    core = as_qtensor(q) if not isinstance(q, qformat.QTensor) else q
    d, c = L.to_canonical(core.descriptor, core.components)
    return qformat.QTensor(d, c)


# -- load-time repack for the tinygemm kernel ----------------------------------------------
@dataclasses.dataclass
class TinyGemmWeight:
    """A weight ready for ``_weight_int4pack_mm``: packed int4, group size, scale_and_zeros."""

    packed: torch.Tensor
    group_size: int
    scale_and_zeros: torch.Tensor  # bf16 [K/G, N, 2]
    shape: tuple[int, int]
    device: torch.device


def _kernel_inputs(q: qformat.QTensor) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
    """(uint8 offset-binary codes [N, K], G, scale [K/G, N] f32, zero [K/G, N] f32) of a tensor
    whose values are exactly (q - 8) * s (+ z): symmetric 4-bit weights with a scale per group."""
    d, c = L.to_canonical(q.descriptor, q.components)
    desc = Descriptor.from_dict(d)
    el = desc.codes.element
    s = desc.scale
    ok = (len(desc.shape) == 2 and el.type == "int" and el.bits == 4 and el.signedness in ("offset_binary", "twos_complement")
          and not el.code_offset and not el.frac_bits and desc.zero is None and s is not None and s.tensor is not None
          and s.op == "multiply" and s.blocks.type == "grid" and s.blocks.index is None and s.blocks.size[0] == 1
          and s.blocks.size[1] in L.tinygemm.GROUP_SIZES and desc.shape[1] % s.blocks.size[1] == 0
          and (desc.bias is None or (desc.bias.tensor is not None and desc.bias.op == "add" and desc.bias.blocks == s.blocks)))
    if not ok:
        raise error("LAYOUT_MISMATCH", f"tinygemm needs symmetric 4-bit int codes with a plain multiply scale (and optional add bias) per group of {L.tinygemm.GROUP_SIZES} along K, found {d}")
    src = ArraySource(c)
    codes = read_codes(desc, src, full_region(desc.shape))
    if el.signedness == "twos_complement":
        codes = codes ^ np.uint8(8)
    n, k = desc.shape
    g = int(s.blocks.size[1])

    def grid(prm: Any) -> np.ndarray:
        return np.ascontiguousarray(grid_array(prm, desc, src).astype(np.float32).T)  # [K/G, N]

    zero = grid(desc.bias) if desc.bias is not None else np.zeros((k // g, n), np.float32)
    return codes, g, grid(s), zero


def tinygemm_weight(q: Any, device: Any = "cpu", inner_k_tiles: int = 8, use_private_pack: bool = False) -> TinyGemmWeight:
    """Repack a 4-bit weight into torch's tinygemm format for ``device`` (load time, not saved).

    Scale and zero are rounded to bfloat16, the only dtype the kernels take: the product then
    agrees with the dequantized weights within bf16 rounding.  On CUDA the packed tensor is
    the ``tinygemm_int4_cuda`` layout built by the NumPy reference, or by torch's private
    ``_convert_weight_to_int4pack`` when ``use_private_pack`` (both give the same bytes);
    on CPU it is torch's ``_convert_weight_to_int4pack_for_cpu`` output (CPU-specific bytes).
    """
    from .qtensor import as_qtensor

    core = as_qtensor(q) if not isinstance(q, qformat.QTensor) else q
    codes, g, s, z = _kernel_inputs(core)
    n, k = codes.shape
    dev = torch.device(device)
    sz = torch.stack([torch.from_numpy(s), torch.from_numpy(z)], dim=-1).to(torch.bfloat16).to(dev).contiguous()
    if dev.type == "cuda":
        if n % 8 or k % (inner_k_tiles * 16):
            raise error("LAYOUT_SHAPE", f"tinygemm_int4_cuda with inner_k_tiles {inner_k_tiles} needs N % 8 == 0 and K % {inner_k_tiles * 16} == 0, found {[n, k]}")
        if use_private_pack and hasattr(torch.ops.aten, "_convert_weight_to_int4pack"):
            u8 = torch.from_numpy(((codes[:, ::2] << 4) | codes[:, 1::2]).astype(np.uint8)).to(dev)
            packed = torch.ops.aten._convert_weight_to_int4pack(u8, inner_k_tiles)
        else:
            packed = torch.from_numpy(L.tinygemm.pack(codes, inner_k_tiles).view(np.int32)).to(dev)
    else:
        if not hasattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu"):
            raise error("LAYOUT_UNKNOWN", "this torch build has no _convert_weight_to_int4pack_for_cpu operator")
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.from_numpy(codes.astype(np.int32)), inner_k_tiles)
    return TinyGemmWeight(packed, g, sz, (n, k), dev)


def tinygemm_matmul(x: torch.Tensor, w: TinyGemmWeight) -> torch.Tensor:
    """``x @ W.T`` with the tinygemm kernel of ``w``'s device (bf16 in, bf16 out)."""
    x = x.to(torch.bfloat16).contiguous()
    if w.device.type == "cuda":
        return torch.ops.aten._weight_int4pack_mm(x, w.packed, w.group_size, w.scale_and_zeros)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, w.packed, w.group_size, w.scale_and_zeros)


class TinyGemmLinear(torch.nn.Module):
    """A linear layer whose weight was repacked into tinygemm at load time."""

    def __init__(self, weight: Any, bias: torch.Tensor | None = None, device: Any = "cpu", inner_k_tiles: int = 8):
        super().__init__()
        self.w = tinygemm_weight(weight, device, inner_k_tiles)
        self.bias = None if bias is None else torch.nn.Parameter(bias.to(device), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        y = tinygemm_matmul(x.reshape(-1, x.shape[-1]), self.w)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*lead, y.shape[-1])
