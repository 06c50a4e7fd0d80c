"""The architecture matrix's table (issue 42 item 2): one tiny random-weight model per
architecture that both transformers' GGUF loader and llama.cpp's converter support.

``MODELS`` maps a matrix id (the test id) to an :class:`ArchSpec`; ``tests/test_arch_matrix.py``
runs every (entry, preset) pair through ``tests/arch_matrix.py``: build the model with
transformers (seeded) -> llama.cpp's ``convert_hf_to_gguf.py`` (F16) -> ``llama-quantize`` preset
-> ``qformat convert`` -> transformers vs its own GGUF loader -> ``qformat export --to gguf`` ->
llama.cpp against the original GGUF.

Adding an architecture is one entry here (and, for qformat, one module in
``qformat/architectures/``):

- ``config_class`` / ``model_class``: transformers class names (``transformers.<name>``);
- ``config``: the config's keyword arguments beyond the ones every entry gets (``COMMON``:
  hidden 256, 2 layers, 4 heads, 2 KV heads, intermediate 512; the vocabulary and special token
  ids come from the tokenizer).  Hidden 256 keeps every row a whole number of k-quant super
  blocks (256 values), so ``llama-quantize`` uses the preset's own types, not fallbacks;
- ``tokenizer``: a key of ``TOKENIZERS`` (``tests/arch_matrix.py`` builds each once): ``llama-bpe``,
  ``qwen2``, ``gpt-2`` (llama.cpp's ``models/ggml-vocab-*.gguf`` as transformers imports them, which
  the converter recognises by pre-tokenizer fingerprint) or ``gemma3`` (SentencePiece: the
  ``tokenizer.model`` made from the vocabulary of the Gemma 3 270M GGUF, ``tests/real_models.py``);
- ``gguf_arch``: the ``general.architecture`` llama.cpp's converter writes for it;
- ``presets``: the ``llama-quantize`` types to run (``F16``: the converter's output itself);
- ``xfail``: None, or why the architecture cannot go through: its tests then check that
  ``qformat convert`` refuses llama.cpp's GGUF of it by name (CONVERT_UNSUPPORTED naming
  ``gguf_arch``, nothing written: never a half-mapped folder) and are recorded as xfail with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: llama.cpp vocabularies the matrix can use (``models/ggml-vocab-<name>.gguf`` of the sdist), or
#: ``gemma3`` for the Gemma 3 270M GGUF's SentencePiece vocabulary.
TOKENIZERS = ("llama-bpe", "qwen2", "gpt-2", "gemma3")

#: Every entry's size (config keys differ per family: an entry overrides or drops them in ``config``
#: with the value None).
COMMON: dict[str, Any] = {
    "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "intermediate_size": 512, "max_position_embeddings": 2048, "tie_word_embeddings": False,
}

#: The presets most entries run: the converter's F16, one legacy block type and the k-quant mix
#: (Q4_K_M mixes Q4_K, Q6_K and, for rows it cannot take, Q5_0 / Q8_0).
PRESETS = ("F16", "Q4_0", "Q4_K_M")


#: Why the MoE entries are refused: transformers' GGUF loader splits llama.cpp's stacked expert
#: tensors (``ffn_gate_exps``...) into per-expert or fused parameters as it loads them, which a
#: packed tensor's components cannot follow yet (gguf_layout.MERGED_ARCHITECTURES).
MOE_REFUSED = ("transformers' GGUF loader splits or merges the stacked expert tensors on load; qformat convert refuses "
               "the architecture by name (CONVERT_UNSUPPORTED) rather than write a folder it cannot map")


@dataclass(frozen=True)
class ArchSpec:
    """One row of the matrix (see the module docstring)."""

    config_class: str
    model_class: str
    tokenizer: str
    gguf_arch: str
    config: dict[str, Any] = field(default_factory=dict)
    presets: tuple[str, ...] = PRESETS
    seed: int = 0
    xfail: str | None = None
    notes: str = ""

    def config_kwargs(self) -> dict[str, Any]:
        """``COMMON`` with this entry's overrides (a value None drops the key)."""
        merged = {**COMMON, **self.config}
        return {k: v for k, v in merged.items() if v is not None}


MODELS: dict[str, ArchSpec] = {
    # -- llama family (engineer 1) -------------------------------------------------------------------
    "llama": ArchSpec("LlamaConfig", "LlamaForCausalLM", "llama-bpe", "llama",
                      {"rms_norm_eps": 1e-5, "rope_theta": 500000.0}),
    "mistral": ArchSpec("MistralConfig", "MistralForCausalLM", "llama-bpe", "llama",
                        {"rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "sliding_window": None, "head_dim": 64}),
    # -- qwen family (engineer 1) ----------------------------------------------------------------------
    "qwen2": ArchSpec("Qwen2Config", "Qwen2ForCausalLM", "qwen2", "qwen2",
                      {"rms_norm_eps": 1e-6, "rope_theta": 1000000.0}),
    # head_dim 128: transformers' GGUF loader maps no key to qwen3's head_dim, so it builds every
    # qwen3 GGUF with Qwen3Config's default 128 (a file of another head size is refused by qformat
    # convert, CONVERT_SOURCE_INVALID naming the tensor whose shape the config does not give)
    "qwen3": ArchSpec("Qwen3Config", "Qwen3ForCausalLM", "qwen2", "qwen3",
                      {"rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "head_dim": 128}),
    # -- gemma family (engineer 1): SentencePiece ----------------------------------------------------
    "gemma2": ArchSpec("Gemma2Config", "Gemma2ForCausalLM", "gemma3", "gemma2",
                       {"rms_norm_eps": 1e-6, "head_dim": 64, "sliding_window": 512, "query_pre_attn_scalar": 64,
                        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "tie_word_embeddings": True}),
    "gemma3": ArchSpec("Gemma3TextConfig", "Gemma3ForCausalLM", "gemma3", "gemma3",
                       {"rms_norm_eps": 1e-6, "head_dim": 64, "sliding_window": 512, "query_pre_attn_scalar": 64,
                        "tie_word_embeddings": True}),
    # -- MoE (engineer 1): refused by name ----------------------------------------------------------
    "qwen2_moe": ArchSpec("Qwen2MoeConfig", "Qwen2MoeForCausalLM", "qwen2", "qwen2moe",
                          {"rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "num_experts": 4, "num_experts_per_tok": 2,
                           "moe_intermediate_size": 256, "shared_expert_intermediate_size": 512}, presets=("F16",),
                          xfail=MOE_REFUSED),
    "qwen3_moe": ArchSpec("Qwen3MoeConfig", "Qwen3MoeForCausalLM", "qwen2", "qwen3moe",
                          {"rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "head_dim": 128, "num_experts": 4,
                           "num_experts_per_tok": 2, "moe_intermediate_size": 256}, presets=("F16",), xfail=MOE_REFUSED),
    # -- phi3, stablelm, starcoder2, gpt2, bloom, falcon: engineer 2 adds them here -------------------
    # phi3: transformers' qkv_proj / gate_up_proj are llama.cpp's attn_qkv / ffn_up as they are
    # (fused on both sides, same rows); the GPT-2 vocabulary takes the converter's BPE path
    # (tokenizer_config.json's GPT2Tokenizer, as Phi-4) instead of a tokenizer.model
    "phi3": ArchSpec("Phi3Config", "Phi3ForCausalLM", "gpt-2", "phi3",
                     {"rms_norm_eps": 1e-5, "original_max_position_embeddings": 2048}, presets=PRESETS + ("Q8_0",)),
    # stablelm: layer norms with biases, q/k/v biases, partial rotary (a quarter of each head)
    "stablelm": ArchSpec("StableLmConfig", "StableLmForCausalLM", "gpt-2", "stablelm",
                         {"partial_rotary_factor": 0.25, "use_qkv_bias": True, "use_parallel_residual": False,
                          "layer_norm_eps": 1e-5}, presets=PRESETS + ("Q8_0",)),
    # starcoder2: biases on every linear layer and layer norm, c_fc / c_proj MLP
    "starcoder2": ArchSpec("Starcoder2Config", "Starcoder2ForCausalLM", "gpt-2", "starcoder2",
                           {"use_bias": True, "norm_epsilon": 1e-5}, presets=PRESETS + ("Q8_0",)),
    # gpt2: Conv1D weights ([in, out]) that llama.cpp stores transposed: packed, they keep their
    # bytes under a transposed storage order.  1024 positions: transformers' GGUF loader maps
    # context_length to n_ctx only, so n_positions keeps GPT2Config's default 1024 (and the
    # converter reads n_ctx); the feed-forward size is GPT-2's 4 * hidden (n_inner unset); the
    # output head is the embedding (a GGUF output.weight is renamed by transformers' loader)
    "gpt2": ArchSpec("GPT2Config", "GPT2LMHeadModel", "gpt-2", "gpt2",
                     {"max_position_embeddings": 1024, "n_ctx": 1024, "num_key_value_heads": None, "intermediate_size": None,
                      "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}, presets=PRESETS + ("Q8_0",)),
    # bloom: the fused query_key_value, per head in transformers and all q / all k / all v in
    # llama.cpp, is a move of whole rows (packed blocks move as they are); ALiBi, tied output
    "bloom": ArchSpec("BloomConfig", "BloomForCausalLM", "gpt-2", "bloom",
                      {"num_key_value_heads": None, "intermediate_size": None, "max_position_embeddings": None,
                       "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}, presets=PRESETS + ("Q8_0",)),
    # falcon (the 7B form: one KV head, parallel attention): refused by name, see the reason
    "falcon": ArchSpec("FalconConfig", "FalconForCausalLM", "gpt-2", "falcon",
                       {"num_kv_heads": 1, "multi_query": True, "new_decoder_architecture": False, "parallel_attn": True,
                        "bias": False, "alibi": False, "layer_norm_epsilon": 1e-5, "num_key_value_heads": None,
                        "intermediate_size": None, "tie_word_embeddings": True}, presets=("F16",),
                       xfail="transformers' GGUF loader does not read llama.cpp's falcon.attention.layer_norm_epsilon (it builds "
                             "FalconConfig's default) nor undo the regrouped query_key_value for more than one KV head; qformat "
                             "convert refuses the architecture by name (CONVERT_UNSUPPORTED)"),
}
