"""StableLM (StableLM 2): convert_hf_to_gguf.py ``StableLMModel`` (llama.cpp ``conversion/stablelm.py``).

- Layer norms with biases (``nn.LayerNorm``): each norm's ``bias`` is llama.cpp's ``.bias`` of
  the same tensor; q/k/v biases when ``use_qkv_bias``.
- Partial rotary: llama.cpp rotates the first ``rope.dimension_count`` dimensions of each head
  (``partial_rotary_factor`` times the head size) in NeoX order, as transformers does, so no row
  moves.
- Not mapped: the per-head q/k layer norms of ``qk_layernorm`` models (llama.cpp stacks the heads'
  norms into one tensor; transformers' GGUF loader does not split them back), refused by name.
"""

from __future__ import annotations

from .base import Architecture
from .llama import SKIPPED

#: Hugging Face tensor names -> llama.cpp's (gguf-py tensor_mapping.py for MODEL_ARCH.STABLELM).
TENSORS: tuple[tuple[str, str], ...] = (
    (r"model\.embed_tokens\.weight", "token_embd.weight"),
    (r"model\.norm\.(weight|bias)", r"output_norm.\1"),
    (r"lm_head\.weight", "output.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.q_proj\.(weight|bias)", r"blk.\1.attn_q.\2"),
    (r"model\.layers\.(\d+)\.self_attn\.k_proj\.(weight|bias)", r"blk.\1.attn_k.\2"),
    (r"model\.layers\.(\d+)\.self_attn\.v_proj\.(weight|bias)", r"blk.\1.attn_v.\2"),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight", r"blk.\1.attn_output.weight"),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.weight", r"blk.\1.ffn_gate.weight"),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.weight", r"blk.\1.ffn_up.weight"),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.weight", r"blk.\1.ffn_down.weight"),
    (r"model\.layers\.(\d+)\.input_layernorm\.(weight|bias)", r"blk.\1.attn_norm.\2"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.(weight|bias)", r"blk.\1.ffn_norm.\2"),
)

ARCH = Architecture(
    name="stablelm", model_arch="STABLELM", model_types=("stablelm",), tensors=TENSORS,
    skipped=SKIPPED, tokenizer_model="gpt2", hf_export=False,
    notes="layer norms with biases; partial rotary (NeoX order, no permutation)")
