"""Phi-3 (text): convert_hf_to_gguf.py ``Phi3MiniModel`` (llama.cpp ``conversion/phi.py``).

- Fused projections on both sides: transformers' ``Phi3Attention.qkv_proj`` (q, k and v rows one
  after another) is llama.cpp's ``attn_qkv`` and ``Phi3MLP.gate_up_proj`` (gate rows, then up
  rows) is its ``ffn_up`` of double height, so the tensors keep their rows and only change names
  (no split, nothing to do on packed blocks).
- No rotary permutation (llama.cpp runs phi3 with NeoX rotary, as transformers does).
- Keys beyond every text model's: the original context length of the rope scaling, the rotary
  dimension count from ``partial_rotary_factor``, the sliding window (0 when unset: Phi-4).
  Long-context rope factors (``rope_factors_long/short``) are not mapped.
- The vocabulary: byte-level BPE when tokenizer_config.json names ``GPT2Tokenizer`` (Phi-4),
  else SentencePiece from ``tokenizer.model``.
"""

from __future__ import annotations

from .base import Architecture
from .llama import SKIPPED

#: Hugging Face tensor names -> llama.cpp's (gguf-py tensor_mapping.py for MODEL_ARCH.PHI3).
TENSORS: tuple[tuple[str, str], ...] = (
    (r"model\.embed_tokens\.weight", "token_embd.weight"),
    (r"model\.norm\.weight", "output_norm.weight"),
    (r"lm_head\.weight", "output.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.qkv_proj\.weight", r"blk.\1.attn_qkv.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight", r"blk.\1.attn_output.weight"),
    (r"model\.layers\.(\d+)\.mlp\.gate_up_proj\.weight", r"blk.\1.ffn_up.weight"),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.weight", r"blk.\1.ffn_down.weight"),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", r"blk.\1.attn_norm.weight"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", r"blk.\1.ffn_norm.weight"),
)

ARCH = Architecture(
    name="phi3", model_arch="PHI3", model_types=("phi3",), tensors=TENSORS,
    skipped=SKIPPED, tokenizer_model="gpt2", hf_export=False,
    notes="fused qkv_proj / gate_up_proj kept whole as attn_qkv / ffn_up")
