"""StarCoder2: convert_hf_to_gguf.py ``StarCoder2Model`` (llama.cpp ``conversion/starcoder.py``).

- Every linear layer and layer norm has a bias (``use_bias``), each llama.cpp's ``.bias`` of the
  same tensor; the MLP is ``c_fc`` (``ffn_up``) and ``c_proj`` (``ffn_down``), not gated.  These
  are ``nn.Linear`` layers (``[out, in]``), stored as they are: no transposition.
- No rotary permutation (NeoX rotary on both sides); byte-level BPE vocabulary.
"""

from __future__ import annotations

from .base import Architecture
from .llama import SKIPPED

#: Hugging Face tensor names -> llama.cpp's (gguf-py tensor_mapping.py for MODEL_ARCH.STARCODER2).
TENSORS: tuple[tuple[str, str], ...] = (
    (r"model\.embed_tokens\.weight", "token_embd.weight"),
    (r"model\.norm\.(weight|bias)", r"output_norm.\1"),
    (r"lm_head\.weight", "output.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.q_proj\.(weight|bias)", r"blk.\1.attn_q.\2"),
    (r"model\.layers\.(\d+)\.self_attn\.k_proj\.(weight|bias)", r"blk.\1.attn_k.\2"),
    (r"model\.layers\.(\d+)\.self_attn\.v_proj\.(weight|bias)", r"blk.\1.attn_v.\2"),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.(weight|bias)", r"blk.\1.attn_output.\2"),
    (r"model\.layers\.(\d+)\.mlp\.c_fc\.(weight|bias)", r"blk.\1.ffn_up.\2"),
    (r"model\.layers\.(\d+)\.mlp\.c_proj\.(weight|bias)", r"blk.\1.ffn_down.\2"),
    (r"model\.layers\.(\d+)\.input_layernorm\.(weight|bias)", r"blk.\1.attn_norm.\2"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.(weight|bias)", r"blk.\1.ffn_norm.\2"),
)

ARCH = Architecture(
    name="starcoder2", model_arch="STARCODER2", model_types=("starcoder2",), tensors=TENSORS,
    skipped=SKIPPED, tokenizer_model="gpt2", hf_export=False,
    notes="biases on every linear layer and layer norm; c_fc / c_proj MLP")
