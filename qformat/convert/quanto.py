"""Source ``quanto``: checkpoints of optimum-quanto (0.2.x), the state dict of a frozen model.

A quanto checkpoint is ``model.state_dict()`` saved with safetensors plus ``quanto_qmap.json``
(``quantization_map(model)``: module name -> ``{"weights": QTYPE, "activations": QTYPE}``).
The qtype lives only in that JSON file; the group size and the weight's shape are not stored
anywhere (quanto recomputes them from the model definition when it reloads).  For module
``M`` the weight is stored as (optimum/quanto/tensor/weights/qbits.py, qbytes.py):

- ``qint2`` / ``qint4``: ``M.weight._data._data`` (``U8``, packed by
  optimum/quanto/tensor/packed.py ``pack_weights``), ``M.weight._scale`` and
  ``M.weight._shift`` (``[rows, 1, ...]``, one per group).  The unpacked codes form the
  *grouped* tensor ``[rows, X, ...]``: ``[N*K/gs, gs]`` with groups, the weight itself
  (``[N, K]``, or a convolution's 4-D shape) without.  Packing puts grouped rows ``[0, R)``
  in bits 0-3 and rows ``[R, 2R)`` in bits 4-7 of the byte grid ``[R, X, ...]``,
  ``R = ceil(rows / 2)`` (2-bit: four planes, ``R = ceil(rows / 4)``).
  Dequantization (optimum/quanto/tensor/qbits.py ``QBitsDequantizer``): a float shift gives
  ``w = scale * q - shift``; an integer (``U8``) shift gives ``w = scale * (q - shift)``.
- ``qint8`` / ``qfloat8_*``: ``M.weight._data`` (``I8`` or an ``F8_*`` dtype) and
  ``M.weight._scale`` (``[N, 1, ...]`` per output channel, or all ones per tensor);
  ``w = scale * data`` (optimum/quanto/tensor/qbytes.py ``QBytesDequantizer``).

The logical dtype is the scale's dtype (what ``dequantize()`` returns).  The logical shape is
exact for weights without groups and for grouped weights whose module has a 1-D ``M.bias``
(a Linear layer: ``[len(bias), numel / len(bias)]``); otherwise it is the grouped shape
``[N*K/gs, gs]``, the same values in the same row-major order (see mapping/quanto.md).
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from ..packing import Packing
from ..schemes._common import codes_entry, pack, packing
from .base import Checkpoint, Converter, Described, lazy, source_error, unsupported

QMAP = "quanto_qmap.json"

_FLOAT = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}
_QBITS = {"qint2": 2, "qint4": 4}
#: qtype name -> (storage dtype of ``_data``, element).  ``qfloat8`` is quanto's alias of e4m3fn.
_QBYTES: dict[str, tuple[str, dict[str, Any] | None]] = {
    "qint8": ("I8", {"type": "int", "bits": 8, "signedness": "twos_complement"}),
    "qfloat8": ("F8_E4M3", {"type": "float", "format": "e4m3fn"}),
    "qfloat8_e4m3fn": ("F8_E4M3", {"type": "float", "format": "e4m3fn"}),
    "qfloat8_e5m2": ("F8_E5M2", {"type": "float", "format": "e5m2"}),
    # e4m3fnuz is no float format of SPEC §6.3: described by an in-file codebook (None here).
    "qfloat8_e4m3fnuz": ("F8_E4M3FNUZ", None),
}


def quanto_group_size(in_features: int) -> int | None:
    """The group size quanto's QModuleMixin picks for 2/4-bit weights (nn/qmodule.py), or None."""
    gs = 128
    if in_features > gs:
        while in_features % gs != 0 and gs > 32:
            gs -= 32
        if in_features % gs == 0:
            return gs
    return None


def e4m3fnuz_table() -> np.ndarray:
    """The 256 binary32 values of float8_e4m3fnuz codes (code 0x80 is NaN), from ml_dtypes."""
    import ml_dtypes

    return np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fnuz).astype(np.float32)


def _read_qmap(ck: Checkpoint) -> dict[str, str]:
    """module name -> weights qtype (``none`` entries left out), strictly validated."""
    raw = ck.side_json(QMAP)
    if raw is None:
        raise source_error(f"{QMAP} is missing beside the weights: the qtype of every quanto weight lives only there", field=QMAP)
    if not isinstance(raw, dict):
        raise source_error(f"{QMAP} is {type(raw).__name__}, expected an object of module name -> {{weights, activations}}", field=QMAP)
    out: dict[str, str] = {}
    for module, entry in raw.items():
        where = f"{QMAP}[{module!r}]"
        if not isinstance(entry, dict):
            raise source_error(f"{where} is {type(entry).__name__}, expected an object with 'weights' and 'activations'", field=where)
        for key in ("weights", "activations"):
            if not isinstance(entry.get(key), str):
                raise source_error(f"{where} has no string {key!r} (found {entry.get(key)!r})", field=f"{where}.{key}")
        extra = sorted(set(entry) - {"weights", "activations"})
        if extra:
            raise source_error(f"{where} has unknown members {extra}; expected only 'weights' and 'activations'", field=where)
        w = entry["weights"]
        if w == "none":
            continue
        if w not in _QBITS and w not in _QBYTES:
            raise unsupported(f"{where}.weights is {w!r}; supported: none, {', '.join(sorted([*_QBITS, *_QBYTES]))}", field=f"{where}.weights")
        out[module] = w
    return out


def _weight_prefixes(ck: Checkpoint) -> set[str]:
    """Stored ``M.weight`` prefixes that look like quanto weights (a ``._scale`` next to ``._data``)."""
    names = set(ck.names())
    out = set()
    for n in names:
        if n.endswith("._scale"):
            p = n[: -len("._scale")]
            if p.split(".")[-1] == "weight" and (f"{p}._data" in names or f"{p}._data._data" in names):
                out.add(p)
    return out


class Quanto(Converter):
    name = "quanto"
    title = "optimum-quanto (qint2, qint4, qint8, qfloat8 weights; quanto_qmap.json)"

    def detect(self, ck: Checkpoint) -> bool:
        if ck.kind != "safetensors":
            return False
        return os.path.isfile(os.path.join(ck.folder, QMAP)) or bool(_weight_prefixes(ck))

    def describe(self, ck: Checkpoint) -> Described:
        qmap = _read_qmap(ck)
        out = Described()
        seen = set()
        for module, qtype in qmap.items():
            prefix = f"{module}.weight" if module else "weight"
            seen.add(prefix)
            if qtype in _QBITS:
                self._qbits(ck, out, module, prefix, _QBITS[qtype])
            else:
                self._qbytes(ck, out, prefix, qtype)
        for p in sorted(_weight_prefixes(ck) - seen):
            module = p[: -len(".weight")] if p != "weight" else ""
            raise source_error(f"tensor {p}._scale is a quantized quanto weight, but {QMAP} has no entry for module {module!r} with its qtype", tensor=f"{p}._scale", field=QMAP)
        return out

    # -- qint2 / qint4 ----------------------------------------------------------------------
    def _qbits(self, ck: Checkpoint, out: Described, module: str, prefix: str, bits: int) -> None:
        data_n, scale_n, shift_n = f"{prefix}._data._data", f"{prefix}._scale", f"{prefix}._shift"
        data = ck.require(data_n, ["U8"])
        scale = ck.require(scale_n, list(_FLOAT))
        shift = ck.require(shift_n, [scale.dtype, "U8"])
        n = 8 // bits
        if len(data.shape) < 2:
            raise source_error(f"shape is {list(data.shape)}, expected the packed grouped tensor of rank 2 or more", tensor=data_n)
        if len(scale.shape) != len(data.shape) or any(s != 1 for s in scale.shape[1:]) or scale.shape[0] < 1:
            raise source_error(f"shape is {list(scale.shape)}, expected [rows{', 1' * (len(data.shape) - 1)}] (one scale per grouped row of {data_n} {list(data.shape)})", tensor=scale_n)
        rows = scale.shape[0]
        if data.shape[0] != -(-rows // n):
            raise source_error(f"{scale_n} has {rows} rows, so {data_n} must have ceil({rows}/{n}) = {-(-rows // n)} packed rows; it has {data.shape[0]} (shape {list(data.shape)})", tensor=scale_n)
        if shift.shape != scale.shape:
            raise source_error(f"shape is {list(shift.shape)}, expected the scale's {list(scale.shape)}", tensor=shift_n)
        grouped = [rows, *data.shape[1:]]
        width = math.prod(data.shape[1:])
        if width < 1:
            raise source_error(f"shape is {list(data.shape)}: an empty group", tensor=data_n)
        shape = self._logical_shape(ck, module, grouped, rows, width)
        element = {"type": "int", "bits": bits, "signedness": "unsigned"}
        if shape == grouped:
            # Grouped rows [s*R, (s+1)*R) in slot s of the byte grid: per column of the grouped
            # tensor, SPEC §7.8 planes spanning the whole column, rows packed along axis 0.
            codes = {"tensor": data_n, "element": element,
                     "packing": {"container": 8, "bit_order": "lsb_first", "axis": 0, "planes": {"span": rows}}}
            blocks: dict[str, Any] = {"type": "grid", "size": [1] + [None] * (len(grouped) - 1)}
        else:
            blocks = {"type": "flat", "size": width}
            if rows % n == 0:
                # Flattened row-major, byte j holds position j + s*R*width in slot s: planes over
                # the whole flattened tensor (SPEC §7.8, one segment) when rows = n*R exactly.
                codes = {"tensor": data_n, "element": element,
                         "packing": {"container": 8, "bit_order": "lsb_first", "axis": None, "planes": {"span": rows * width}}}
            else:
                # Plane s is R*width bytes long but the last one is partly empty: no single planes
                # span describes that over the flattened [N, K] weight, so add canonical codes.
                def codes_of(data_n: str = data_n, shape: list[int] = shape) -> np.ndarray:
                    return pack(unpack_planes(ck.array(data_n), bits, rows).reshape(shape), bits)

                words = Packing.from_dict(packing(len(shape))).words_per_row(shape[-1], bits)
                name = out.add(f"{prefix}.qformat_codes", lazy("U8", tuple(shape[:-1]) + (words,), codes_of))  # made when written
                codes = codes_entry(name, element, len(shape))
        desc: dict[str, Any] = {"shape": shape, "dtype": _FLOAT[scale.dtype], "codes": codes,
                                "scale": {"blocks": blocks, "op": "multiply", "tensor": scale_n}}
        if shift.dtype == "U8":
            desc["zero"] = {"blocks": blocks, "tensor": shift_n}  # scale * (q - shift)
        else:
            desc["bias"] = {"blocks": blocks, "op": "subtract", "tensor": shift_n}  # scale * q - shift
        out.descriptors[prefix] = desc

    @staticmethod
    def _logical_shape(ck: Checkpoint, module: str, grouped: list[int], rows: int, width: int) -> list[int]:
        """[N, K] when a 1-D bias gives N and quanto's group-size rule confirms K; else the grouped shape."""
        bias = ck.info(f"{module}.bias" if module else "bias")
        if bias is None or len(bias.shape) != 1 or len(grouped) != 2:
            return grouped
        n_out = bias.shape[0]
        total = rows * width
        if n_out < 1 or n_out == rows or total % n_out:
            return grouped
        k = total // n_out
        if k % width or quanto_group_size(k) != width:
            return grouped
        return [n_out, k]

    # -- qint8 / qfloat8 --------------------------------------------------------------------
    def _qbytes(self, ck: Checkpoint, out: Described, prefix: str, qtype: str) -> None:
        data_n, scale_n = f"{prefix}._data", f"{prefix}._scale"
        storage, element = _QBYTES[qtype]
        data = ck.require(data_n, [storage])
        scale = ck.require(scale_n, list(_FLOAT))
        r = len(data.shape)
        if r < 1:
            raise source_error("shape is [], expected a weight of rank 1 or more", tensor=data_n)
        if all(s == 1 for s in scale.shape):
            size: list[int | None] = [None] * r  # per tensor
        elif len(scale.shape) == r and scale.shape[0] == data.shape[0] and all(s == 1 for s in scale.shape[1:]):
            size = [1] + [None] * (r - 1)  # per output channel (axis 0)
        else:
            raise source_error(f"shape is {list(scale.shape)}, expected [{data.shape[0]}{', 1' * (r - 1)}] (per output channel) or all ones (per tensor) for {data_n} {list(data.shape)}", tensor=scale_n)
        if element is None:
            element = {"type": "codebook", "bits": 8, "table_tensor": out.add(f"{prefix}.qformat_table", e4m3fnuz_table())}
        out.descriptors[prefix] = {
            "shape": list(data.shape), "dtype": _FLOAT[scale.dtype],
            "codes": {"tensor": data_n, "element": element,
                      "packing": {"container": 8, "bit_order": "lsb_first", "axis": r - 1}},
            "scale": {"blocks": {"type": "grid", "size": size}, "op": "multiply", "tensor": scale_n},
        }


def unpack_planes(packed: np.ndarray, bits: int, rows: int) -> np.ndarray:
    """quanto's packed bytes ``[R, ...]`` -> codes ``[rows, ...]`` (inverse of packed.py pack_weights):
    slot ``s`` (bits ``[s*bits, (s+1)*bits)``) of byte row ``q`` holds grouped row ``s*R + q``."""
    p = np.asarray(packed, np.uint8)
    n = 8 // bits
    planes = [(p >> (s * bits)) & ((1 << bits) - 1) for s in range(n)]
    return np.concatenate(planes, axis=0)[:rows]
