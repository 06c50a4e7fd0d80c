"""Qwen2: convert_hf_to_gguf.py ``Qwen2Model``: llama's tensor names (with q/k/v biases), rows as
transformers has them (llama.cpp's NeoX rotary for qwen2 needs no permutation), byte-level BPE."""

from __future__ import annotations

from .base import Architecture
from .llama import SKIPPED, TENSORS

ARCH = Architecture(name="qwen2", model_arch="QWEN2", model_types=("qwen2",), tensors=TENSORS, skipped=SKIPPED,
                    tokenizer_model="gpt2", notes="llama's names, no rotary permutation")
