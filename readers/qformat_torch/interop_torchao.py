"""torchao tensors <-> qformat, through torchao's public tensor classes.

Converted both ways, with the qformat decode equal to torchao's own ``dequantize()`` /
``get_original_weight()`` bit for bit (tests/readers/test_torch_interop_torchao.py):

* ``NF4Tensor`` (``torchao.quantization.to_nf4``).  torchao computes its scalers in the tensor's
  dtype: ``s = (q / factor).to(dtype) + mean`` (each op rounded to that dtype) and then
  ``w = nf4[code] * s`` with its own 4-decimal NF4 table stored in that dtype.  qformat says the
  same thing exactly with two nested encoded parameters:

  - top: codebook 4-bit ``table_tensor`` = torchao's ``nf4`` (in its dtype), packed
    ``container 8, msb_first, axis null`` (element 2k in the high nibble), scale = flat blocks
    of ``block_size``, multiply, encoded E1;
  - E1 (shape [n_blocks], dtype = the tensor's dtype): element "1" (a 1-bit unsigned code with
    ``code_offset`` 1, all codes 0), scale = E2 per element, bias = ``scaler_mean`` (add), so
    E1 = round_dtype(fp32(E2) + mean): torchao's ``+ self.scaler_mean`` in the dtype;
  - E2 (shape [n_blocks], dtype = the tensor's dtype): 8-bit two's complement codes
    ``quantized_scalers``, scale = ``quantization_factor`` per ``scaler_block_size``, op
    divide, so E2 = round_dtype(q / factor): torchao's ``(q / factor).to(dtype)``.

  A 16-bit dtype's product or quotient of two 16-bit values is computed by torch in float32 and
  rounded once to the dtype; qformat rounds the same float32 result at the end of each nested
  level, hence the equality.  (A ``factor`` of Inf, from a block of equal absmax values, needs
  ``allow_nonfinite_params``; it is set only then.)
* ``Int8Tensor`` (``Int8WeightOnlyConfig``) and ``IntxUnpackedToInt8Tensor``
  (``IntxWeightOnlyConfig``, int1..int8, symmetric or asymmetric): ``(q - zero_point) * scale``
  with per-block ``block_size``; qformat packs the codes at their real width (two's
  complement, rows along the last axis) with an integer zero and the scale in its stored dtype.
* ``Float8Tensor`` (``Float8WeightOnlyConfig``, e4m3fn / e5m2): ``fp8 * scale``.

Not converted: ``Int4Tensor`` / ``Int4PreshuffledTensor`` (``Int4WeightOnlyConfig``) need the
mslk CUDA kernels to quantize and to dequantize, ``Int4TilePackedTo4dTensor`` needs CUDA,
``Int4PlainInt32Tensor`` supports no CPU device, ``IntxOpaqueTensor`` is an opaque
kernel-specific layout, and the MX / NVFP4 tensors live in ``torchao.prototype``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

import qformat
from qformat.regions import full_region, read_codes
from qformat.descriptor import Descriptor, parse_descriptor
from qformat.elements import lut as element_lut
from qformat.errors import error
from qformat.packing import Packing, pack_rows
from qformat.sources import ArraySource

from .dtypes import LOGICAL_TORCH, TORCH_LOGICAL, numpy_to_torch, torch_to_numpy
from .qtensor import TorchQTensor

_INT_DTYPES = {b: getattr(torch, f"int{b}") for b in range(1, 8)} | {8: torch.int8}
_FLOAT8 = {torch.float8_e4m3fn: "e4m3fn", torch.float8_e5m2: "e5m2"}


def _unsupported(target: str, msg: str) -> Exception:
    return error("FEATURE_UNSUPPORTED", f"cannot convert to torchao {target}: {msg}")


def _np(t: torch.Tensor) -> np.ndarray:
    return torch_to_numpy(t)


def _as_numpy_qtensor(q: qformat.QTensor | TorchQTensor) -> tuple[qformat.QTensor, Descriptor]:
    if isinstance(q, TorchQTensor):
        q = q.to_qtensor()
    return q, parse_descriptor("<qtensor>", q.descriptor)


def _codes(q: qformat.QTensor, d: Descriptor) -> np.ndarray:
    return np.asarray(read_codes(d, ArraySource(q.components), full_region(d.shape)))


def _packing(rank: int) -> dict[str, Any]:
    return {"container": 8, "bit_order": "lsb_first", "axis": rank - 1 if rank else None}


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes of the logical shape packed along the last axis (bytes, LSB first)."""
    c = codes.reshape(1) if codes.ndim == 0 else codes
    return pack_rows(c.astype(np.uint8), bits, Packing.from_dict(_packing(c.ndim)))


def _grid(block_size: Any, shape: tuple[int, ...]) -> list[int | None]:
    return [None if int(b) >= int(n) else int(b) for b, n in zip(block_size, shape)]


def _grid_array(t: torch.Tensor, shape: tuple[int, ...], block_size: Any) -> np.ndarray:
    """A per-block torchao parameter as a NumPy array shaped like qformat's grid."""
    grid = [-(-int(n) // int(b)) if int(b) < int(n) else 1 for b, n in zip(block_size, shape)]
    return _np(t).reshape(grid)


# -- NF4 -------------------------------------------------------------------------------------------
def from_nf4(t: Any) -> qformat.QTensor:
    """A QTensor decoding bit for bit like ``t.get_original_weight()`` (see the module docstring)."""
    dt = TORCH_LOGICAL[t.dtype]
    shape = tuple(int(s) for s in t.shape)
    nb = int(t.n_blocks)
    factor = _np(t.quantization_factor).reshape(-1)
    e2 = {"shape": [nb], "dtype": dt,
          "codes": {"tensor": "scalers", "element": {"type": "int", "bits": 8, "signedness": "twos_complement"},
                    "packing": {"container": 8, "bit_order": "lsb_first", "axis": 0}},
          "scale": {"blocks": {"type": "grid", "size": [int(t.scaler_block_size)]}, "op": "divide", "tensor": "factor"}}
    if not np.isfinite(factor.astype(np.float32)).all():
        e2["allow_nonfinite_params"] = True
    e1 = {"shape": [nb], "dtype": dt,
          "codes": {"tensor": "one", "element": {"type": "int", "bits": 1, "signedness": "unsigned", "code_offset": 1},
                    "packing": {"container": 8, "bit_order": "lsb_first", "axis": 0}},
          "scale": {"blocks": {"type": "grid", "size": [1]}, "op": "multiply", "encoded": e2},
          "bias": {"blocks": {"type": "grid", "size": [None]}, "op": "add", "tensor": "mean"}}
    desc = {"shape": list(shape), "dtype": dt,
            "codes": {"tensor": "codes", "element": {"type": "codebook", "bits": 4, "table_tensor": "nf4"},
                      "packing": {"container": 8, "bit_order": "msb_first", "axis": None}},
            "scale": {"blocks": {"type": "flat", "size": int(t.block_size)}, "op": "multiply", "encoded": e1},
            "scheme": "nf4"}
    comps = {
        "codes": _np(t.quantized_data).reshape(-1).view(np.uint8),
        "nf4": _np(t.nf4).reshape(-1),
        "one": np.zeros(-(-nb // 8), np.uint8),
        "scalers": _np(t.quantized_scalers).reshape(-1).view(np.int8),
        "factor": factor,
        "mean": _np(t.scaler_mean).reshape(()),
    }
    return qformat.QTensor(desc, comps)


def to_nf4(q: qformat.QTensor | TorchQTensor, device: Any = "cpu") -> Any:
    """A torchao ``NF4Tensor`` from a QTensor of :func:`from_nf4`'s form (else FEATURE_UNSUPPORTED).

    Only that exact arithmetic is an NF4Tensor; to turn any other tensor into one, dequantize it
    and call ``torchao.quantization.to_nf4`` (a new, lossy quantization).
    """
    from torchao.quantization import NF4Tensor

    q, d = _as_numpy_qtensor(q)
    c = q.components
    try:
        e1 = d.scale.encoded  # type: ignore[union-attr]
        e2 = e1.scale.encoded  # type: ignore[union-attr]
        el = d.codes.element
        ok = (el.type == "codebook" and el.bits == 4 and el.table_tensor is not None and d.zero is None and d.bias is None
              and d.scale.op == "multiply" and d.scale.blocks.type == "flat"  # type: ignore[union-attr]
              and e1.dtype == d.dtype and e1.zero is None and e1.codes.element.to_dict() == {"type": "int", "bits": 1, "signedness": "unsigned", "code_offset": 1}
              and e1.scale.op == "multiply" and e1.scale.blocks.to_dict() == {"type": "grid", "size": [1]}
              and e1.bias is not None and e1.bias.op == "add" and e1.bias.tensor is not None and e1.bias.blocks.size == (None,)
              and e2.dtype == d.dtype and e2.zero is None and e2.bias is None
              and e2.codes.element.to_dict() == {"type": "int", "bits": 8, "signedness": "twos_complement"}
              and e2.scale is not None and e2.scale.op == "divide" and e2.scale.tensor is not None
              and e2.scale.blocks.type == "grid" and e2.scale.blocks.size[0] is not None and e2.scale.blocks.index is None
              and len(d.shape) <= 2 and d.numel % 2 == 0)
    except AttributeError:
        ok = False
    if not ok:
        raise _unsupported("NF4Tensor", "expected the structure from_nf4 writes (nf4 table * round(round(q / factor) + mean)); "
                                        "dequantize and call torchao.quantization.to_nf4 to requantize instead")
    dtype = LOGICAL_TORCH[d.dtype]
    table = c[el.table_tensor]
    if table.size != 16:
        raise _unsupported("NF4Tensor", "the codebook must have 16 entries")
    codes = _codes(q, d).reshape(-1).astype(np.uint8)
    packed = (codes[0::2] << 4) | codes[1::2]
    scalers = _codes(q, e2).astype(np.int64)
    scalers = np.where(scalers >= 128, scalers - 256, scalers).astype(np.int8) if scalers.dtype != np.int8 else scalers
    nbs = int(e2.scale.blocks.size[0])  # type: ignore[index]
    if int(e2.shape[0]) % nbs:
        raise _unsupported("NF4Tensor", "the number of blocks must be a multiple of the scaler block size")

    def tt(a: np.ndarray) -> torch.Tensor:
        return numpy_to_torch(np.asarray(a), device).to(dtype)

    args = _subclass_args(torch.Size(d.shape), dtype, torch.device(device))
    return NF4Tensor(args, int(d.scale.blocks.size), int(e1.shape[0]), nbs,  # type: ignore[union-attr, arg-type]
                     numpy_to_torch(scalers.astype(np.int8), device),
                     tt(c[e2.scale.tensor]).reshape(-1), tt(c[e1.bias.tensor]).reshape(()),  # type: ignore[index, union-attr]
                     numpy_to_torch(packed.astype(np.uint8), device), tt(table).reshape(-1))


def _subclass_args(shape: torch.Size, dtype: torch.dtype, device: torch.device) -> Any:
    """NF4Tensor's constructor metadata (``SubclassTensorArgs``, its module's public dataclass)."""
    import sys

    from torchao.quantization import NF4Tensor

    args_cls = sys.modules[NF4Tensor.__module__].SubclassTensorArgs
    strides = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
    return args_cls(shape, strides, 0, dtype, device, False)


# -- affine integers (Int8Tensor, IntxUnpackedToInt8Tensor) -----------------------------------------
def from_affine(t: Any, bits: int = 8) -> qformat.QTensor:
    """A QTensor for an ``Int8Tensor`` (bits 8) or ``IntxUnpackedToInt8Tensor`` (its target bits)."""
    shape = tuple(int(s) for s in t.shape)
    bs = tuple(int(b) for b in t.block_size)
    grid = _grid(bs, shape)
    q = _np(t.qdata).astype(np.int64)
    desc: dict[str, Any] = {"shape": list(shape), "dtype": TORCH_LOGICAL[t.dtype],
                            "codes": {"tensor": "codes", "element": {"type": "int", "bits": bits, "signedness": "twos_complement"},
                                      "packing": _packing(len(shape))}}
    comps: dict[str, np.ndarray] = {"codes": q.astype(np.int8) if bits == 8 else _pack(q & ((1 << bits) - 1), bits)}
    zp = getattr(t, "zero_point", None)
    if zp is not None:
        desc["zero"] = {"blocks": {"type": "grid", "size": grid}, "tensor": "zero"}
        comps["zero"] = _grid_array(zp, shape, bs)
    desc["scale"] = {"blocks": {"type": "grid", "size": grid}, "op": "multiply", "tensor": "scale"}
    comps["scale"] = _grid_array(t.scale, shape, bs)
    desc["scheme"] = "int"
    return qformat.QTensor(desc, comps)


def _affine_parts(q: qformat.QTensor, d: Descriptor, target: str, max_bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int], int]:
    """(signed codes int8, zero int8 grid, scale grid, block_size, bits) of an integer QTensor."""
    el = d.codes.element
    if el.type != "int" or el.frac_bits or el.bits > max_bits:
        raise _unsupported(target, f"the element must be an integer of at most {max_bits} bits without frac_bits")
    if d.scale is None or d.bias is not None or d.scale.op != "multiply":
        raise _unsupported(target, "expected (codes - zero) * scale: a multiplying scale, no bias")
    prms = [p for p in (d.zero, d.scale) if p is not None]
    for p in prms:
        if p.blocks.type != "grid" or p.blocks.index is not None or p.tensor is None or p.order is not None:
            raise _unsupported(target, "zero and scale must be plain per-block (grid) tensors")
    if d.zero is not None and d.zero.blocks.size != d.scale.blocks.size:
        raise _unsupported(target, "zero and scale must share their blocks")
    shape = d.shape
    block_size = [int(n) if s is None else int(s) for s, n in zip(d.scale.blocks.size, shape)]  # type: ignore[arg-type]
    for b, n in zip(block_size, shape):
        if n % b:
            raise _unsupported(target, f"torchao needs blocks that divide the shape, found block {b} on an axis of {n}")
    # Integer values of the codes (exact: no frac_bits), shifted so they fit a signed target.
    table, _ = element_lut(el)
    v = table[_codes(q, d)].astype(np.int64)
    shift = 1 << (el.bits - 1) if el.signedness == "unsigned" else 0
    grid = d.scale.blocks.grid_shape(shape)
    c = q.components
    z = np.zeros(grid, np.float64) if d.zero is None else np.asarray(c[d.zero.tensor], np.float64).reshape(grid)  # type: ignore[index]
    if not np.array_equal(z, np.round(z)):
        raise _unsupported(target, "the zero point must be integer")
    qv, zv = v - shift, z.astype(np.int64) - shift
    lo, hi = -(1 << (el.bits - 1)), (1 << (el.bits - 1)) - 1
    if qv.size and (qv.min() < lo or qv.max() > hi) or zv.size and (zv.min() < -128 or zv.max() > 127):
        raise _unsupported(target, "codes or zero points do not fit a signed target of the same width")
    return qv.astype(np.int8), zv.astype(np.int8), np.asarray(c[d.scale.tensor]).reshape(grid), block_size, el.bits  # type: ignore[index]


def to_int8(q: qformat.QTensor | TorchQTensor, device: Any = "cpu") -> Any:
    """A torchao ``Int8Tensor``: 8-bit integer codes (two's complement, or unsigned with a zero
    point), an integer zero point per block (optional), a multiplying scale per block."""
    from torchao.quantization import Int8Tensor

    q, d = _as_numpy_qtensor(q)
    qv, zv, scale, block_size, bits = _affine_parts(q, d, "Int8Tensor", 8)
    if bits != 8:
        raise _unsupported("Int8Tensor", f"expected 8-bit codes, found {bits} (use to_intx)")
    s = numpy_to_torch(scale, device).to(torch.float32)  # exact widening; torchao keeps float32 scales
    return Int8Tensor(numpy_to_torch(qv, device), s, block_size, LOGICAL_TORCH[d.dtype], zero_point=numpy_to_torch(zv, device))


def to_intx(q: qformat.QTensor | TorchQTensor, device: Any = "cpu") -> Any:
    """A torchao ``IntxUnpackedToInt8Tensor`` (target int1..int8 = the element's bits)."""
    from torchao.quantization import IntxUnpackedToInt8Tensor

    q, d = _as_numpy_qtensor(q)
    qv, zv, scale, block_size, bits = _affine_parts(q, d, "IntxUnpackedToInt8Tensor", 8)
    return IntxUnpackedToInt8Tensor(numpy_to_torch(qv, device), numpy_to_torch(scale, device), numpy_to_torch(zv, device),
                                    _INT_DTYPES[bits], block_size, LOGICAL_TORCH[d.dtype], None)


# -- float8 ----------------------------------------------------------------------------------------------
def from_float8(t: Any) -> qformat.QTensor:
    """A QTensor for a torchao ``Float8Tensor`` (e4m3fn or e5m2 codes times a float32 scale)."""
    fmt = _FLOAT8.get(t.qdata.dtype)
    if fmt is None:
        raise ValueError(f"unsupported float8 dtype {t.qdata.dtype}")
    shape = tuple(int(s) for s in t.shape)
    bs = tuple(int(b) for b in t.block_size)
    grid = _grid(bs, shape)
    desc = {"shape": list(shape), "dtype": TORCH_LOGICAL[t.dtype],
            "codes": {"tensor": "codes", "element": {"type": "float", "format": fmt}, "packing": _packing(len(shape))},
            "scale": {"blocks": {"type": "grid", "size": grid}, "op": "multiply", "tensor": "scale"},
            "scheme": "fp8_e4m3" if fmt == "e4m3fn" else "fp8_e5m2"}
    return qformat.QTensor(desc, {"codes": _np(t.qdata), "scale": _grid_array(t.scale, shape, bs)})


def to_float8(q: qformat.QTensor | TorchQTensor, device: Any = "cpu") -> Any:
    """A torchao ``Float8Tensor``: e4m3fn / e5m2 codes with one multiplying scale per block."""
    from torchao.quantization import Float8Tensor

    q, d = _as_numpy_qtensor(q)
    el = d.codes.element
    tdt = {v: k for k, v in _FLOAT8.items()}.get(el.format or "")
    if el.type != "float" or tdt is None:
        raise _unsupported("Float8Tensor", "the element must be float e4m3fn or e5m2")
    sc = d.scale
    if d.zero is not None or d.bias is not None or sc is None or sc.op != "multiply" or sc.tensor is None \
            or sc.blocks.type != "grid" or sc.blocks.index is not None or sc.order is not None:
        raise _unsupported("Float8Tensor", "expected codes * scale with a plain per-block (grid) scale")
    block_size = [int(n) if s is None else int(s) for s, n in zip(sc.blocks.size, d.shape)]  # type: ignore[arg-type]
    if any(n % b for b, n in zip(block_size, d.shape)):
        raise _unsupported("Float8Tensor", "torchao needs blocks that divide the shape")
    grid = sc.blocks.grid_shape(d.shape)
    codes = _codes(q, d).astype(np.uint8)
    qdata = torch.from_numpy(codes).view(tdt).to(device)
    scale = numpy_to_torch(np.asarray(q.components[sc.tensor]).reshape(grid), device).to(torch.float32)
    return Float8Tensor(qdata, scale, block_size, dtype=LOGICAL_TORCH[d.dtype])


# -- dispatch ----------------------------------------------------------------------------------------------
def from_torchao(t: Any) -> qformat.QTensor:
    """A QTensor for any supported torchao tensor (NF4Tensor, Int8Tensor, IntxUnpackedToInt8Tensor, Float8Tensor)."""
    from torchao.quantization import Float8Tensor, Int8Tensor, IntxUnpackedToInt8Tensor, NF4Tensor

    if isinstance(t, NF4Tensor):
        return from_nf4(t)
    if isinstance(t, Int8Tensor):
        return from_affine(t, 8)
    if isinstance(t, IntxUnpackedToInt8Tensor):
        bits = next(b for b, d in _INT_DTYPES.items() if d == t.target_dtype)
        return from_affine(t, bits)
    if isinstance(t, Float8Tensor):
        return from_float8(t)
    raise _unsupported(type(t).__name__, "no qformat conversion for this tensor type")
