"""Llama (and Mistral, which llama.cpp writes as ``llama``): convert_hf_to_gguf.py ``LlamaModel``.

Tensor names are gguf-py's ``tensor_mapping.py`` for ``MODEL_ARCH.LLAMA``; q_proj / k_proj rows
take llama.cpp's rotary order (``LlamaModel.permute``: per head, the two halves interleaved, with
``num_attention_heads`` for q and ``num_key_value_heads`` for k); Llama 3 rope scaling becomes
the ``rope_freqs.weight`` tensor; the tokenizer is byte-level BPE (``gpt2``).
"""

from __future__ import annotations

from .base import Architecture

#: Hugging Face tensor names -> llama.cpp's (gguf-py tensor_mapping.py, MODEL_TENSOR names).
TENSORS: tuple[tuple[str, str], ...] = (
    (r"model\.embed_tokens\.weight", "token_embd.weight"),
    (r"model\.norm\.weight", "output_norm.weight"),
    (r"lm_head\.weight", "output.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.q_proj\.(weight|bias)", r"blk.\1.attn_q.\2"),
    (r"model\.layers\.(\d+)\.self_attn\.k_proj\.(weight|bias)", r"blk.\1.attn_k.\2"),
    (r"model\.layers\.(\d+)\.self_attn\.v_proj\.(weight|bias)", r"blk.\1.attn_v.\2"),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.(weight|bias)", r"blk.\1.attn_output.\2"),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.weight", r"blk.\1.ffn_gate.weight"),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.weight", r"blk.\1.ffn_up.weight"),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.weight", r"blk.\1.ffn_down.weight"),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", r"blk.\1.attn_norm.weight"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", r"blk.\1.ffn_norm.weight"),
)
#: Hugging Face tensors llama.cpp does not use (convert_hf_to_gguf.py skips them).
SKIPPED = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",)
#: q and k rows in llama.cpp's rotary order, with the config key of each one's head count.
ROTARY = ((r"model\.layers\.\d+\.self_attn\.q_proj\.(weight|bias)", "num_attention_heads"),
          (r"model\.layers\.\d+\.self_attn\.k_proj\.(weight|bias)", "num_key_value_heads"))

ARCH = Architecture(
    name="llama", model_arch="LLAMA", model_types=("llama", "mistral"), tensors=TENSORS, skipped=SKIPPED, rotary=ROTARY,
    tokenizer_model="gpt2", rope_types=("default", "linear", "llama3"),
    notes="q/k rows permuted for llama.cpp's rotary order; Llama 3 rope scaling as rope_freqs.weight")
