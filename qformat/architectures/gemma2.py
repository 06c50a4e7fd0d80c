"""Gemma 2: convert_hf_to_gguf.py ``Gemma2Model`` (llama.cpp ``conversion/gemma.py``).

- Norms: ``Gemma2RMSNorm`` computes ``x * (1 + w)``; the converter stores ``w + 1`` for every
  tensor whose name ends in ``norm.weight`` (the four per-layer norms and the final norm), in
  binary32; transformers' GGUF loader subtracts 1 again (as Gemma 3; no q/k norms here).
- No rotary permutation; the output head is always the token embedding (the converter skips
  ``lm_head.weight``).
- SentencePiece vocabulary (``tokenizer.ggml.model`` ``llama``) with ``add_space_prefix`` false.
- Keys of its own (the converter does not call TextModel's ``set_gguf_parameters``: no rope keys):
  ``key_length`` / ``value_length`` (head_dim), the attention and final logit soft-capping and the
  sliding window, in that order.
"""

from __future__ import annotations

from .base import Architecture
from .gemma3 import TENSORS as GEMMA3_TENSORS

#: Hugging Face tensor names -> llama.cpp's (gguf-py tensor_mapping.py for MODEL_ARCH.GEMMA2):
#: Gemma 3's without the q / k norms and without ``output`` (not a GEMMA2 tensor).
TENSORS: tuple[tuple[str, str], ...] = tuple(t for t in GEMMA3_TENSORS
                                             if t[1] != "output.weight" and not t[1].endswith(("attn_q_norm.weight", "attn_k_norm.weight")))

ARCH = Architecture(
    name="gemma2", model_arch="GEMMA2", model_types=("gemma2",), tensors=TENSORS,
    norm_shift=(r".*norm\.weight", 1.0), tied="always", tokenizer_model="llama",
    hparams=(("{arch}.attn_logit_softcapping", "float32", lambda c: c.get("attn_logit_softcapping")),
             ("{arch}.final_logit_softcapping", "float32", lambda c: c.get("final_logit_softcapping")),
             ("{arch}.attention.sliding_window", "uint32", lambda c: c.get("sliding_window"))),
    rope_dimension_count=False,
    notes="norms stored as w + 1; output is the embedding; logit soft-capping keys; SentencePiece vocabulary")
