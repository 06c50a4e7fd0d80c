"""Source ``mlx``: quantized checkpoints as mlx-lm writes them (``mx.save_safetensors``).

For each quantized layer ``P`` (mlx/nn/layers/quantized.py ``QuantizedLinear``,
``QuantizedEmbedding``): ``P.weight`` (``U32``, the packed codes, ``[..., K*bits/32]``),
``P.scales`` (``[..., K/group_size]``) and, in mode ``affine`` only, ``P.biases`` (same shape
as the scales).  ``config.json`` holds ``"quantization": {"group_size", "bits", "mode"}``
(``mode`` absent means ``affine``) and, per mlx-lm, optional per-layer overrides
``"quantization": {LAYER_PATH: {"group_size", "bits", "mode"}}`` (``false``: not quantized).

Decoding (mlx/ops.cpp ``dequantize``; checked against ``mx.dequantize`` in the tests):

- ``affine`` (bits 1-6, 8): codes are a continuous LSB-first bit stream per row of ``U32``
  words; ``w = scales * q + biases``; the logical dtype is the scales' dtype.
- ``mxfp4``: E2M1 codes, 8 per word, low nibble first; ``U8`` E8M0 scale per 32.
- ``mxfp8``: E4M3 codes, 4 per word, low byte first; ``U8`` E8M0 scale per 32.
- ``nvfp4``: E2M1 codes; ``U8`` E4M3 scale per 16.  With ``mx.quantize``'s optional global
  scale ``g`` (stored as ``P.global_scale``, see mapping/mlx.md), MLX computes
  ``e2m1 * (e4m3 * fl32(g / 2688))``.
- The float modes' logical dtype is what ``mx.dequantize`` returns by default: bfloat16, or
  float32 for nvfp4 with a (float32) global scale.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .base import Checkpoint, Converter, Described, source_error, unsupported

_FLOAT = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}
_AFFINE_BITS = (1, 2, 3, 4, 5, 6, 8)
_AFFINE_GROUPS = (32, 64, 128)
#: mode -> (code bits, element, group size, scale element)
_FLOAT_MODES: dict[str, tuple[int, dict[str, Any], int, str]] = {
    "mxfp4": (4, {"type": "float", "format": "e2m1fn"}, 32, "e8m0fnu"),
    "mxfp8": (8, {"type": "float", "format": "e4m3fn"}, 32, "e8m0fnu"),
    "nvfp4": (4, {"type": "float", "format": "e2m1fn"}, 16, "e4m3fn"),
}
#: The constant of MLX's nvfp4 global scale: 448 (E4M3 max) * 6 (E2M1 max).
NVFP4_GLOBAL_DIVISOR = 448.0 * 6.0


def _quantization(ck: Checkpoint) -> dict[str, Any] | None:
    cfg = ck.config
    q = cfg.get("quantization") if isinstance(cfg, dict) else None
    return q if isinstance(q, dict) else None


def _params(q: dict[str, Any], layer: str) -> dict[str, Any] | None:
    """group_size, bits and mode of one layer (a per-layer override, else the defaults); None
    when the config says the layer is not quantized."""
    field = "quantization"
    base = {k: q[k] for k in ("group_size", "bits", "mode") if k in q}
    if layer in q:
        o = q[layer]
        field = f"quantization.{layer}"
        if o is False:
            return None
        if not isinstance(o, dict):
            raise source_error(f"config.json {field} is {o!r}, expected an object of group_size/bits/mode or false", field=field)
        base = {**base, **{k: o[k] for k in ("group_size", "bits", "mode") if k in o}}
    mode = base.get("mode", "affine")
    if not isinstance(mode, str):
        raise source_error(f"mode is {mode!r}, expected a string", field=f"{field}.mode")
    for k in ("group_size", "bits"):
        v = base.get(k)
        if k in base and (isinstance(v, bool) or not isinstance(v, int)):
            raise source_error(f"{k} is {v!r}, expected an integer", field=f"{field}.{k}")
    if mode == "affine":
        for k in ("group_size", "bits"):
            if k not in base:
                raise source_error(f"config.json quantization has no {k!r} for layer {layer!r}", field=f"{field}.{k}")
        if base["bits"] not in _AFFINE_BITS:
            raise unsupported(f"affine bits {base['bits']} (supported: {list(_AFFINE_BITS)})", field=f"{field}.bits")
        if base["group_size"] not in _AFFINE_GROUPS:
            raise unsupported(f"affine group_size {base['group_size']} (supported: {list(_AFFINE_GROUPS)})", field=f"{field}.group_size")
    elif mode in _FLOAT_MODES:
        bits, _, gs, _ = _FLOAT_MODES[mode]
        # MLX fixes these; a config that says otherwise does not describe MLX's mode.
        if base.get("bits", bits) != bits or base.get("group_size", gs) != gs:
            raise unsupported(f"mode {mode} with bits {base.get('bits')} and group_size {base.get('group_size')} (MLX uses bits {bits}, group_size {gs})", field=field)
        base = {"bits": bits, "group_size": gs}
    else:
        raise unsupported(f"quantization mode {mode!r} (supported: affine, {', '.join(_FLOAT_MODES)})", field=f"{field}.mode")
    return {**base, "mode": mode}


class MLX(Converter):
    name = "mlx"
    title = "MLX / mlx-lm (affine 1-8 bit, mxfp4, mxfp8, nvfp4; config.json quantization)"

    def detect(self, ck: Checkpoint) -> bool:
        if ck.kind != "safetensors":
            return False
        q = _quantization(ck)
        if q is None or not ("bits" in q or "mode" in q or "group_size" in q):
            return False
        return any(n.endswith(".scales") for n in ck.names())

    def describe(self, ck: Checkpoint) -> Described:
        q = _quantization(ck)
        if q is None:
            raise source_error("config.json has no 'quantization' object (group_size, bits, mode)", field="quantization")
        out = Described()
        names = ck.names()
        for sn in names:
            if not sn.endswith(".scales"):
                continue
            layer = sn[: -len(".scales")]
            params = _params(q, layer)
            if params is None:
                raise source_error(f"config.json says layer {layer!r} is not quantized, but it has scales", tensor=sn, field=f"quantization.{layer}")
            self._layer(ck, out, layer, params)
        if not out.descriptors:
            raise source_error("no quantized layer found: no tensor named LAYER.scales")
        return out

    def _layer(self, ck: Checkpoint, out: Described, layer: str, p: dict[str, Any]) -> None:
        wn, sn, bn = f"{layer}.weight", f"{layer}.scales", f"{layer}.biases"
        mode, bits, gs = p["mode"], p["bits"], p["group_size"]
        w = ck.require(wn, ["U32"])
        if len(w.shape) < 1:
            raise source_error("shape is [], expected packed rows [..., K*bits/32]", tensor=wn)
        r = len(w.shape)
        affine = mode == "affine"
        s = ck.require(sn, list(_FLOAT) if affine else ["U8"], rank=r)
        if s.shape[:-1] != w.shape[:-1]:
            raise source_error(f"shape is {list(s.shape)}, expected {list(w.shape[:-1])} + [groups] like {wn} {list(w.shape)}", tensor=sn)
        k = s.shape[-1] * gs
        if k * bits != w.shape[-1] * 32:
            raise source_error(f"{sn} has {s.shape[-1]} groups of {gs}, so K = {k} and {wn} must have K*{bits}/32 = {k * bits / 32:g} words per row; it has {w.shape[-1]}", tensor=sn)
        shape = [*w.shape[:-1], k]
        blocks = {"type": "grid", "size": [1] * (r - 1) + [gs]}
        packing = {"container": 32, "bit_order": "lsb_first", "axis": r - 1}
        gn = f"{layer}.global_scale"
        if affine:
            ck.require(bn, [s.dtype])
            if ck.info(bn).shape != s.shape:  # type: ignore[union-attr]
                raise source_error(f"shape is {list(ck.info(bn).shape)}, expected the scales' {list(s.shape)}", tensor=bn)  # type: ignore[union-attr]
            if gn in ck:
                raise unsupported("a global scale with mode affine", tensor=gn)
            out.descriptors[wn] = {
                "shape": shape, "dtype": _FLOAT[s.dtype],
                "codes": {"tensor": wn, "element": {"type": "int", "bits": bits, "signedness": "unsigned"}, "packing": packing},
                "scale": {"blocks": blocks, "op": "multiply", "tensor": sn},
                "bias": {"blocks": blocks, "op": "add", "tensor": bn},
            }
            return
        if bn in ck:
            raise source_error(f"mode {mode} has no biases, but {bn} exists", tensor=bn)
        _, element, _, scale_fmt = _FLOAT_MODES[mode]
        nested: dict[str, Any] = {
            "shape": list(s.shape), "dtype": "float32",
            "codes": {"tensor": sn, "element": {"type": "float", "format": scale_fmt},
                      "packing": {"container": 8, "bit_order": "lsb_first", "axis": r - 1}},
        }
        dtype = "bfloat16"  # mx.dequantize's default for uint8 scales
        if gn in ck:
            dtype = "float32"  # with a float32 global scale, mx.dequantize returns float32
            if mode != "nvfp4":
                raise unsupported(f"a global scale with mode {mode} (only nvfp4 has one)", tensor=gn)
            g = ck.require(gn, ["F32"])
            if math.prod(g.shape) != 1:
                raise source_error(f"shape is {list(g.shape)}, expected one value", tensor=gn)
            # MLX multiplies the E4M3 scale by fl32(g / 2688), computed once in binary32; that
            # quotient is a value the checkpoint does not store, so it is added as a tensor.
            gv = np.asarray(ck.array(gn), np.float32).reshape(())
            with np.errstate(all="ignore"):
                folded = np.float32(gv) / np.float32(NVFP4_GLOBAL_DIVISOR)
            name = out.add(f"{layer}.qformat_global_scale", np.asarray(folded, np.float32).reshape(()))
            nested["scale"] = {"blocks": {"type": "grid", "size": [None] * r}, "op": "multiply", "tensor": name}
        out.descriptors[wn] = {
            "shape": shape, "dtype": dtype,
            "codes": {"tensor": wn, "element": element, "packing": packing},
            "scale": {"blocks": blocks, "op": "multiply", "encoded": nested},
        }
