"""Qwen3: convert_hf_to_gguf.py ``Qwen3Model`` (llama.cpp ``conversion/qwen.py``, a ``Qwen2Model``):
llama's tensor names plus the per-head q / k RMS norms (``attn_q_norm`` / ``attn_k_norm``, gguf-py
tensor_mapping.py for MODEL_ARCH.QWEN3), rows as transformers has them (llama.cpp runs qwen3 with
NeoX rotary, as transformers does: no permutation), no q/k/v biases by default (mapped when
present), byte-level BPE vocabulary.  The converter writes only every text model's keys
(``key_length`` / ``value_length`` from ``head_dim``, which :mod:`qformat.export.gguf` writes)."""

from __future__ import annotations

from .base import Architecture
from .llama import SKIPPED, TENSORS

#: Hugging Face tensor names -> llama.cpp's: llama's, and the q / k norms.
QK_NORMS: tuple[tuple[str, str], ...] = (
    (r"model\.layers\.(\d+)\.self_attn\.q_norm\.weight", r"blk.\1.attn_q_norm.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.k_norm\.weight", r"blk.\1.attn_k_norm.weight"),
)

ARCH = Architecture(name="qwen3", model_arch="QWEN3", model_types=("qwen3",), tensors=TENSORS + QK_NORMS, skipped=SKIPPED,
                    tokenizer_model="gpt2", notes="llama's names with q/k norms, no rotary permutation")
