"""BLOOM: convert_hf_to_gguf.py ``BloomModel`` (llama.cpp ``conversion/bloom.py``).

- The fused ``query_key_value`` (weight and bias): transformers keeps each head's q, k and v
  rows together (``[n_head, 3, head_dim]``); the converter regroups them into all q rows, all k
  rows, all v rows (``attn_qkv``), which transformers' GGUF loader undoes
  (``BloomTensorProcessor``).  Whole rows move (:func:`.base.head_split_permutation`), so packed
  blocks move as they are.
- Layer norms with biases, the embedding's own layer norm (``token_embd_norm``), biases on every
  projection; ALiBi (no rotary); the output head is always the token embedding.
"""

from __future__ import annotations

from .base import Architecture

#: Hugging Face tensor names -> llama.cpp's (gguf-py tensor_mapping.py for MODEL_ARCH.BLOOM).
TENSORS: tuple[tuple[str, str], ...] = (
    (r"transformer\.word_embeddings\.weight", "token_embd.weight"),
    # gguf-py knows this norm and the post-attention one only without the "transformer." prefix
    # (llama.cpp's converter strips it; transformers maps them from the model's submodule)
    (r"(?:transformer\.)?word_embeddings_layernorm\.(weight|bias)", r"token_embd_norm.\1"),
    (r"transformer\.ln_f\.(weight|bias)", r"output_norm.\1"),
    (r"lm_head\.weight", "output.weight"),
    (r"transformer\.h\.(\d+)\.input_layernorm\.(weight|bias)", r"blk.\1.attn_norm.\2"),
    (r"transformer\.h\.(\d+)\.self_attention\.query_key_value\.(weight|bias)", r"blk.\1.attn_qkv.\2"),
    (r"transformer\.h\.(\d+)\.self_attention\.dense\.(weight|bias)", r"blk.\1.attn_output.\2"),
    (r"(?:transformer\.)?h\.(\d+)\.post_attention_layernorm\.(weight|bias)", r"blk.\1.ffn_norm.\2"),  # as above
    (r"transformer\.h\.(\d+)\.mlp\.dense_h_to_4h\.(weight|bias)", r"blk.\1.ffn_up.\2"),
    (r"transformer\.h\.(\d+)\.mlp\.dense_4h_to_h\.(weight|bias)", r"blk.\1.ffn_down.\2"),
)

ARCH = Architecture(
    name="bloom", model_arch="BLOOM", model_types=("bloom",), tensors=TENSORS,
    head_split=((r"transformer\.h\.\d+\.self_attention\.query_key_value\.(weight|bias)", "n_head"),),
    tied="always", tokenizer_model="gpt2", hf_export=False, rope_dimension_count=False,
    notes="fused query_key_value regrouped per part (whole rows move); output is the embedding")
