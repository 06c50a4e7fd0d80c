"""Source ``gpt-oss``: OpenAI gpt-oss MXFP4 checkpoints (original and Hugging Face names).

The MoE expert weights are OCP MXFP4: E2M1 codes, one E8M0 exponent per 32 along the last
(input) axis.  Each weight is two U8 tensors (gpt_oss/torch/weights.py ``_get_mxfp4_tensor``;
transformers/integrations/mxfp4.py ``convert_moe_packed_tensors``):

- blocks ``[..., N, G, 16]``: 16 bytes per block of 32, element ``2k`` of a block in the low
  nibble of byte ``k`` and ``2k + 1`` in the high nibble;
- scales ``[..., N, G]``: the block's exponent ``e``, the scale being ``2^(e - 127)``.

Names: the original repository stores ``X.blocks`` / ``X.scales`` (``block.0.mlp.mlp1_weight``)
and the reference decodes them to ``X`` of shape ``[..., N, G*32]``; Hugging Face stores
``P_blocks`` / ``P_scales`` (``model.layers.0.mlp.experts.gate_up_proj``), whose runtime
parameter ``P`` is the *transpose* of the last two axes (``convert_moe_packed_tensors`` ends
with ``transpose(1, 2)``; ``GptOssExperts.gate_up_proj`` is ``[E, hidden, 2 * intermediate]``).
The logical tensors keep those names and shapes: ``X`` is ``[..., N, G*32]``, ``P`` is
``[..., G*32, N]``, described by ``codes.packing.order`` swapping the last two axes.  Blocks
have one more axis than the logical tensor, so the codes use ``axis`` null (the flattened
blocks are exactly the stored code grid, two codes per byte, ``lsb_first``).  Both references
decode to bfloat16.  Config: config.json ``quantization_config.quant_method`` ``mxfp4``.
"""

from __future__ import annotations

from typing import Any

from .base import Checkpoint, Converter, Described, source_error



def _pairs(ck: Checkpoint) -> list[tuple[str, str, str, bool]]:
    """(logical name, blocks, scales, hf naming) for every blocks/scales pair."""
    out = []
    for n in ck.names():
        for bs, ss, hf in ((".blocks", ".scales", False), ("_blocks", "_scales", True)):
            if n.endswith(bs):
                base = n[: -len(bs)]
                if base + ss in ck:
                    out.append((base, n, base + ss, hf))
    return out


class GptOss(Converter):
    name = "gpt-oss"
    title = "gpt-oss MXFP4 (X.blocks/X.scales, or Hugging Face P_blocks/P_scales with quant_method mxfp4)"
    priority = 30

    def detect(self, ck: Checkpoint) -> bool:
        if ck.kind != "safetensors":
            return False
        qc = ck.quantization_config()
        if isinstance(qc, dict) and qc.get("quant_method") == "mxfp4":
            return True
        # The original repository's checkpoint has no quantization config: recognise the tensors.
        for base, b, s, hf in _pairs(ck):
            bi, si = ck.info(b), ck.info(s)
            if not hf and bi is not None and si is not None and bi.dtype == "U8" and si.dtype == "U8" and bi.shape[-1:] == (16,):
                return True
        return False

    def describe(self, ck: Checkpoint) -> Described:
        out = Described()
        for base, b, s, hf in _pairs(ck):
            out.descriptors[base] = self._one(ck, b, s, hf)
        if not out.descriptors:
            raise source_error("no MXFP4 weight found: expected U8 tensor pairs X.blocks/X.scales or P_blocks/P_scales")
        return out

    @staticmethod
    def _one(ck: Checkpoint, blocks: str, scales: str, hf: bool) -> dict[str, Any]:
        bi = ck.require(blocks, ("U8",))
        if len(bi.shape) < 3 or bi.shape[-1] != 16:
            raise source_error(f"shape is {list(bi.shape)}, expected [..., N, G, 16] (16 bytes per block of 32)", tensor=blocks)
        grid = list(bi.shape[:-1])  # [..., N, G]
        si = ck.require(scales, ("U8",))
        if list(si.shape) != grid:
            raise source_error(f"shape is {list(si.shape)}, expected {grid} (one E8M0 exponent per block of {blocks})", tensor=scales)
        r = len(grid)
        stored = grid[:-1] + [grid[-1] * 32]  # [..., N, K]: the stored code grid
        e8m0 = {"type": "float", "format": "e8m0fnu"}
        if hf:
            order = list(range(r - 2)) + [r - 1, r - 2]
            shape = [stored[i] for i in order]  # [..., K, N]
            size: list[int | None] = [1] * (r - 2) + [32, 1]
            nested_shape = [grid[i] for i in order]  # [..., G, N]
            scale_codes = {"tensor": scales, "element": e8m0,
                           "packing": {"container": 8, "bit_order": "lsb_first", "axis": r - 1, "order": order}}
            packing: dict[str, Any] = {"container": 8, "bit_order": "lsb_first", "axis": None, "order": order}
        else:
            shape, size, nested_shape = stored, [1] * (r - 1) + [32], grid
            scale_codes = {"tensor": scales, "element": e8m0, "packing": {"container": 8, "bit_order": "lsb_first", "axis": r - 1}}
            packing = {"container": 8, "bit_order": "lsb_first", "axis": None}
        return {"shape": shape, "dtype": "bfloat16", "scheme": "mxfp4",
                "codes": {"tensor": blocks, "element": {"type": "float", "format": "e2m1fn"}, "packing": packing},
                "scale": {"blocks": {"type": "grid", "size": size}, "op": "multiply",
                          "encoded": {"shape": nested_shape, "dtype": "float32", "codes": scale_codes}}}
