"""Gemma 3 (text): convert_hf_to_gguf.py ``Gemma3Model`` (llama.cpp ``conversion/gemma.py``).

- Norms: ``Gemma3RMSNorm`` computes ``x * (1 + w)``; llama.cpp multiplies by its weight alone, so
  its converter stores ``w + 1`` for every tensor whose name ends in ``norm.weight`` (the four
  per-layer norms, q_norm / k_norm and the final norm), in binary32; transformers' GGUF loader
  subtracts 1 again.
- No rotary permutation (llama.cpp runs Gemma with NeoX rotary, as transformers does).
- The output head is always the token embedding (no ``output.weight``).
- The vocabulary is SentencePiece (``tokenizer.ggml.model`` ``llama``) from ``tokenizer.model``,
  with ``add_space_prefix`` false.
- Keys beyond every text model's: ``key_length`` / ``value_length`` (head_dim), the sliding window,
  the final logit soft-capping when set; the rope base is the full-attention layers'.
"""

from __future__ import annotations

from typing import Any

from .base import Architecture

#: Hugging Face tensor names -> llama.cpp's (gguf-py tensor_mapping.py for MODEL_ARCH.GEMMA3).
TENSORS: tuple[tuple[str, str], ...] = (
    (r"model\.embed_tokens\.weight", "token_embd.weight"),
    (r"model\.norm\.weight", "output_norm.weight"),
    (r"lm_head\.weight", "output.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.q_proj\.weight", r"blk.\1.attn_q.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.k_proj\.weight", r"blk.\1.attn_k.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.v_proj\.weight", r"blk.\1.attn_v.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight", r"blk.\1.attn_output.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.q_norm\.weight", r"blk.\1.attn_q_norm.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.k_norm\.weight", r"blk.\1.attn_k_norm.weight"),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.weight", r"blk.\1.ffn_gate.weight"),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.weight", r"blk.\1.ffn_up.weight"),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.weight", r"blk.\1.ffn_down.weight"),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", r"blk.\1.attn_norm.weight"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", r"blk.\1.post_attention_norm.weight"),
    (r"model\.layers\.(\d+)\.pre_feedforward_layernorm\.weight", r"blk.\1.ffn_norm.weight"),
    (r"model\.layers\.(\d+)\.post_feedforward_layernorm\.weight", r"blk.\1.post_ffw_norm.weight"),
)


def _sliding_window(cfg: dict[str, Any]) -> Any:
    # the converter writes it unless every layer is sliding (sliding_window_pattern 1)
    if cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern")) == 1:
        return None
    return cfg.get("sliding_window")


ARCH = Architecture(
    name="gemma3", model_arch="GEMMA3", model_types=("gemma3_text",), tensors=TENSORS,
    norm_shift=(r".*norm\.weight", 1.0), tied="always", tokenizer_model="llama",
    hparams=(("{arch}.attention.sliding_window", "uint32", _sliding_window),
             ("{arch}.final_logit_softcapping", "float32", lambda c: c.get("final_logit_softcapping") or None)),
    rope_dimension_count=False, rope_section="full_attention",
    notes="norms stored as w + 1; output is the embedding; SentencePiece vocabulary")
