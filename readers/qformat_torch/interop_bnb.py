"""bitsandbytes 4-bit (Params4bit / QuantState) <-> qformat, through bitsandbytes' public API.

bitsandbytes packs a 4-bit tensor as bytes over the *flattened* tensor, element 2k in the high
nibble, with one absmax per ``blocksize`` elements (partial last block allowed):

* codes: ``{"type": "codebook", "bits": 4, "table": "nf4" | "bnb_fp4"}`` (the QuantState's
  ``code`` must equal the named table bit for bit; otherwise it is stored as ``table_tensor``),
  packed ``{"container": 8, "bit_order": "msb_first", "axis": null}``;
* scale: ``{"blocks": {"type": "flat", "size": blocksize}, "op": "multiply"}`` with the float32
  absmax, or, with double quantization (``compress_statistics``), an encoded float32 parameter:
  8-bit codes into the 256-entry ``state2.code`` table, times ``state2.absmax`` per
  ``state2.blocksize`` absmax values, plus ``offset`` (bitsandbytes computes exactly
  ``code[a] * absmax2 + offset`` in float32, two roundings: SPEC.md's scale then bias).

``dequantize_4bit`` on CPU multiplies ``table[code] * absmax`` in float32 and casts to the
QuantState's dtype, which is SPEC.md's arithmetic: the decodes agree bit for bit
(tests/readers/test_torch_interop_bnb.py).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

import qformat
from qformat import tables
from qformat.descriptor import parse_descriptor
from qformat.elements import lut as element_lut
from qformat.errors import error
from qformat.sources import ArraySource

from .dtypes import LOGICAL_TORCH, TORCH_LOGICAL, torch_to_numpy
from .qtensor import TorchQTensor

_NAMED = {"nf4": "nf4", "fp4": "bnb_fp4"}
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(np.asarray(a, np.float32).view(np.uint32), np.asarray(b, np.float32).view(np.uint32)))


def _unsupported(msg: str) -> Exception:
    return error("FEATURE_UNSUPPORTED", f"cannot convert to bitsandbytes: {msg}")


def from_bnb(weight: Any, quant_state: Any = None) -> qformat.QTensor:
    """A QTensor (components ``codes``, ``absmax`` ...) for a bitsandbytes 4-bit tensor.

    ``weight`` is a ``bnb.nn.Params4bit`` (its ``quant_state`` is used) or the packed tensor
    returned by ``bitsandbytes.functional.quantize_4bit`` together with its ``quant_state``.
    """
    qs = quant_state if quant_state is not None else getattr(weight, "quant_state", None)
    if qs is None:
        raise ValueError("from_bnb needs a QuantState (a Params4bit's quant_state, or quant_state=)")
    if qs.quant_type not in _NAMED:
        raise ValueError(f"expected quant_type 'nf4' or 'fp4', found {qs.quant_type!r}")
    shape = tuple(int(s) for s in qs.shape)
    n = math.prod(shape)
    packed = torch_to_numpy(weight.data if hasattr(weight, "data") else weight).reshape(-1).view(np.uint8)
    nbytes = -(-n // 2)
    codes = packed[:nbytes].copy()
    if n % 2:
        codes[-1] &= 0xF0  # bitsandbytes pads the odd tail with a real code: qformat wants zero padding
    code = torch_to_numpy(qs.code).astype(np.float32)
    named = _NAMED[qs.quant_type]
    comps: dict[str, np.ndarray] = {"codes": codes}
    if _bits_equal(code, np.asarray(tables.codebook_values(named), np.float32)):
        element: dict[str, Any] = {"type": "codebook", "bits": 4, "table": named}
    else:
        element = {"type": "codebook", "bits": 4, "table_tensor": "quant_map"}
        comps["quant_map"] = code
    desc: dict[str, Any] = {
        "shape": list(shape), "dtype": TORCH_LOGICAL[qs.dtype],
        "codes": {"tensor": "codes", "element": element, "packing": {"container": 8, "bit_order": "msb_first", "axis": None}},
    }
    blocks = {"type": "flat", "size": int(qs.blocksize)}
    if not qs.nested:
        comps["absmax"] = torch_to_numpy(qs.absmax).astype(np.float32).reshape(-1)
        desc["scale"] = {"blocks": blocks, "op": "multiply", "tensor": "absmax"}
    else:
        s2 = qs.state2
        nb = int(qs.absmax.numel())
        comps["absmax.codes"] = torch_to_numpy(qs.absmax).reshape(-1).view(np.uint8)
        comps["absmax.code"] = torch_to_numpy(s2.code).astype(np.float32).reshape(-1)
        comps["absmax.absmax"] = torch_to_numpy(s2.absmax).astype(np.float32).reshape(-1)
        comps["absmax.offset"] = np.asarray(torch_to_numpy(torch.as_tensor(qs.offset)), np.float32).reshape(())
        desc["scale"] = {"blocks": blocks, "op": "multiply", "encoded": {
            "shape": [nb], "dtype": "float32",
            "codes": {"tensor": "absmax.codes", "element": {"type": "codebook", "bits": 8, "table_tensor": "absmax.code"},
                      "packing": {"container": 8, "bit_order": "lsb_first", "axis": 0}},
            "scale": {"blocks": {"type": "grid", "size": [int(s2.blocksize)]}, "op": "multiply", "tensor": "absmax.absmax"},
            "bias": {"blocks": {"type": "grid", "size": [None]}, "op": "add", "tensor": "absmax.offset"},
        }}
    if qs.quant_type == "nf4":
        desc["scheme"] = "nf4"
    return qformat.QTensor(desc, comps)


def _codes_flat(comps: dict[str, np.ndarray], d: Any) -> np.ndarray:
    from qformat.regions import full_region, read_codes

    return np.asarray(read_codes(d, ArraySource(comps), full_region(d.shape))).reshape(-1)


def _f32_param(prm: Any, comps: dict[str, np.ndarray], what: str) -> np.ndarray:
    if prm.tensor is None or prm.order is not None:
        raise _unsupported(f"{what} must be a plain tensor")
    a = comps[prm.tensor]
    if a.dtype.kind != "f" or a.dtype.itemsize > 4:
        raise _unsupported(f"{what} must be float32/float16/bfloat16, found {a.dtype}")
    return np.asarray(a, np.float32).reshape(-1)


def to_bnb(q: qformat.QTensor | TorchQTensor, device: Any = "cpu") -> Any:
    """A ``bnb.nn.Params4bit`` (with its QuantState) holding exactly the same values.

    The QTensor must be a 4-bit NF4 or bitsandbytes-FP4 codebook tensor with one absmax per
    flat block of a bitsandbytes block size, either plain (float) or double-quantized as
    bitsandbytes does it (8-bit codes through a table or as integers, a float32 scale per
    nested block, a float32 offset).  qformat's ``nf4`` scheme, with or without
    ``double_quant``, qualifies.  Anything else is FEATURE_UNSUPPORTED (no silent requantization).
    """
    import bitsandbytes as bnb
    from bitsandbytes.functional import QuantState

    if isinstance(q, TorchQTensor):
        q = q.to_qtensor()
    comps = q.components
    d = parse_descriptor("<qtensor>", q.descriptor)
    el = d.codes.element
    if el.type != "codebook" or el.bits != 4:
        raise _unsupported("the element must be a 4-bit codebook")
    table, _ = element_lut(el, None if el.table_tensor is None else np.asarray(comps[el.table_tensor], np.float32))
    qtype = next((k for k, v in _NAMED.items() if _bits_equal(table, np.asarray(tables.codebook_values(v), np.float32))), None)
    if qtype is None:
        raise _unsupported("the codebook is neither bitsandbytes' NF4 nor its FP4 table")
    if d.zero is not None or d.bias is not None or d.scale is None:
        raise _unsupported("expected exactly one scale (absmax), no zero point or bias")
    sc = d.scale
    if sc.op != "multiply" or sc.blocks.type != "flat" or int(sc.blocks.size) not in BLOCKSIZES:  # type: ignore[arg-type]
        raise _unsupported(f"the scale must multiply per flat block of one of {BLOCKSIZES}")
    n = d.numel
    codes = _codes_flat(comps, d).astype(np.uint8)
    if n % 2:
        codes = np.concatenate([codes, np.zeros(1, np.uint8)])
    packed = ((codes[0::2] << 4) | codes[1::2]).astype(np.uint8)
    dtype = LOGICAL_TORCH[d.dtype]
    state2 = None
    offset = None
    if sc.encoded is None:
        absmax = torch.from_numpy(_f32_param(sc, comps, "the absmax"))
    else:
        e = sc.encoded
        ok = (e.dtype == "float32" and e.codes.element.bits == 8 and e.codes.element.type in ("int", "codebook")
              and e.codes.element.frac_bits == 0 and e.zero is None and e.scale is not None and e.bias is not None
              and e.scale.op == "multiply" and e.scale.blocks.type == "grid" and e.scale.blocks.index is None
              and e.scale.blocks.size[0] is not None and e.bias.op == "add" and e.bias.blocks.type == "grid"
              and e.bias.blocks.size[0] is None)
        if not ok:
            raise _unsupported("a double-quantized absmax must be 8-bit codes * float32 scale per block + float32 offset")
        etab, _ = element_lut(e.codes.element, None if e.codes.element.table_tensor is None
                              else np.asarray(comps[e.codes.element.table_tensor], np.float32))
        ecodes = _codes_flat(comps, e).astype(np.uint8)
        s2 = _f32_param(e.scale, comps, "the nested scale")
        off = _f32_param(e.bias, comps, "the offset")
        state2 = QuantState(absmax=torch.from_numpy(s2).to(device), code=torch.from_numpy(np.nan_to_num(etab, nan=0.0)).to(device),
                            blocksize=int(e.scale.blocks.size[0]), dtype=torch.float32)  # type: ignore[index]
        absmax = torch.from_numpy(ecodes)
        offset = torch.tensor(float(off[0]), dtype=torch.float32)
    qs = QuantState(absmax=absmax.to(device), shape=torch.Size(d.shape), code=torch.from_numpy(table.copy()).to(device),
                    blocksize=int(sc.blocks.size), quant_type=qtype, dtype=dtype,  # type: ignore[arg-type]
                    offset=None if offset is None else offset.to(device), state2=state2)
    data = torch.from_numpy(packed).reshape(-1, 1).to(device)
    return bnb.nn.Params4bit(data=data, requires_grad=False, quant_state=qs, blocksize=qs.blocksize,
                             compress_statistics=state2 is not None, quant_type=qtype, quant_storage=torch.uint8,
                             bnb_quantized=True)
