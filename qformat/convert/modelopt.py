"""Source ``modelopt``: NVIDIA TensorRT Model Optimizer (ModelOpt) NVFP4 exports.

The export's config is ``hf_quant_config.json`` ``{"quantization": {"quant_algo": "NVFP4",
"group_size": 16, "exclude_modules": [...]}}`` or, in newer exports, config.json
``quantization_config`` with ``quant_method`` ``modelopt`` and the same ``quant_algo``.  A
quantized linear ``P`` holds (modelopt/torch/quantization/qtensor/nvfp4_tensor.py,
``NVFP4QTensor.quantize``/``dequantize``):

- ``P.weight`` U8 ``[..., N, K/2]``: E2M1 codes packed ``(q[..., 1::2] << 4) | q[..., 0::2]``
  (element 2k in the low nibble);
- ``P.weight_scale`` F8_E4M3 ``[..., N, K/16]``: a scale per 16 along K;
- ``P.weight_scale_2`` F32 scalar: the per-tensor scale, a *multiplier*
  (``per_block_scale = float32(weight_scale) * weight_scale_2``);
- ``P.input_scale`` F32: the activation scale, left as a plain tensor.

``dequantize`` computes ``e2m1_values[code] * per_block_scale`` in float32 and casts to the
model dtype, exactly the descriptor's binary32 steps; the logical dtype is config.json's
``torch_dtype`` (bfloat16 when absent).  The logical tensor is ``P.weight`` itself (in place,
SPEC §4.3).  With ``quant_algo`` ``MIXED_PRECISION`` the layers listed as NVFP4 under
``quantized_layers`` are described; other algorithms are ``CONVERT_UNSUPPORTED``.
"""

from __future__ import annotations

from typing import Any

from .base import Checkpoint, Converter, Described, source_error, unsupported
from .compressed_tensors import check_shape, fp4_descriptor, nvfp4_scale

_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}


def _quant_section(ck: Checkpoint) -> dict[str, Any] | None:
    """ModelOpt's quantization settings: hf_quant_config.json's ``quantization`` or config.json's
    ``quantization_config`` with ``quant_method`` ``modelopt``."""
    if ck.kind != "safetensors":
        return None
    hq = ck.side_json("hf_quant_config.json")
    if isinstance(hq, dict) and isinstance(hq.get("quantization"), dict):
        return hq["quantization"]
    qc = ck.config.get("quantization_config") if isinstance(ck.config, dict) else None
    if isinstance(qc, dict) and qc.get("quant_method") == "modelopt":
        return qc
    return None


class ModelOpt(Converter):
    name = "modelopt"
    title = "ModelOpt NVFP4 exports (hf_quant_config.json or quant_method modelopt)"
    priority = 20

    def detect(self, ck: Checkpoint) -> bool:
        return _quant_section(ck) is not None

    def describe(self, ck: Checkpoint) -> Described:
        q = _quant_section(ck)
        if q is None:
            raise source_error("no hf_quant_config.json with a 'quantization' object and no config.json quantization_config "
                               "with quant_method 'modelopt'", field="quantization")
        algo = q.get("quant_algo")
        per_layer: dict[str, Any] | None = None
        if algo == "MIXED_PRECISION":
            per_layer = q.get("quantized_layers")
            if not isinstance(per_layer, dict):
                raise source_error("quant_algo MIXED_PRECISION without a quantized_layers object", field="quantization.quantized_layers")
        elif algo != "NVFP4":
            raise unsupported(f"ModelOpt quant_algo {algo!r} is not supported (NVFP4 and MIXED_PRECISION with NVFP4 layers are)",
                              field="quantization.quant_algo")
        gs = q.get("group_size", 16)
        cfg = ck.config if isinstance(ck.config, dict) else {}
        dtype = _DTYPES.get(str(cfg.get("torch_dtype", cfg.get("dtype", "bfloat16"))).replace("torch.", ""), "bfloat16")
        out = Described()
        for n in ck.names():
            if not n.endswith(".weight_scale_2"):
                continue
            p = n[: -len(".weight_scale_2")]
            lgs = gs
            if per_layer is not None:
                lay = per_layer.get(p)
                if not isinstance(lay, dict) or lay.get("quant_algo") not in ("NVFP4", "NVFP4_AWQ"):
                    raise unsupported(f"layer {p!r} has quant_algo {lay.get('quant_algo') if isinstance(lay, dict) else None!r} "
                                      "under quantized_layers; only NVFP4 is supported", tensor=f"{p}.weight")
                lgs = lay.get("group_size", gs)
            if lgs != 16:
                raise unsupported(f"NVFP4 group_size {lgs!r}: only 16 is supported", tensor=f"{p}.weight")
            self._nvfp4(ck, p, dtype, out)
        if not out.descriptors:
            raise source_error("no NVFP4 layer found: expected tensors P.weight (U8), P.weight_scale (F8_E4M3) and P.weight_scale_2 (F32)")
        return out

    @staticmethod
    def _nvfp4(ck: Checkpoint, p: str, dtype: str, out: Described) -> None:
        w = f"{p}.weight"
        wi = ck.require(w, ("U8",))
        if len(wi.shape) < 2:
            raise source_error(f"shape is {list(wi.shape)}, expected [..., N, K/2] (rank 2 or more)", tensor=w)
        shape = list(wi.shape[:-1]) + [wi.shape[-1] * 2]
        grid = shape[:-1] + [-(-shape[-1] // 16)]
        check_shape(ck, f"{p}.weight_scale", grid, ("F8_E4M3",), f"an E4M3 scale per 16 of the weight {shape}")
        s2 = ck.require(f"{p}.weight_scale_2", ("F32",))
        if any(d != 1 for d in s2.shape):
            raise source_error(f"shape is {list(s2.shape)}, expected a scalar ([] or [1])", tensor=f"{p}.weight_scale_2")
        par = nvfp4_scale(f"{p}.weight_scale", grid, f"{p}.weight_scale_2", "multiply")
        out.descriptors[w] = fp4_descriptor(w, shape, dtype, par, "nvfp4")
