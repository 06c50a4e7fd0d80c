"""GPT-2: convert_hf_to_gguf.py ``GPT2Model`` (llama.cpp ``conversion/gpt2.py``).

- Transposed weights: transformers' GPT-2 uses ``Conv1D`` layers whose weight is ``[in, out]``
  (``y = x @ W + b``); the converter transposes ``c_attn``, ``c_proj`` and ``c_fc`` to llama.cpp's
  ``[out, in]`` before quantizing, so the GGUF's blocks run along ``in``, and transformers' GGUF
  loader transposes them back (``GPT2TensorProcessor``).  A packed tensor cannot be transposed
  block by block; it is described transposed instead: the same components, the logical tensor
  ``[in, out]`` with a transposed storage order (SPEC.md §7.3, §9.2), which qformat decodes into
  the ``Conv1D`` weight, and which ``qformat export --to gguf`` turns back into the GGUF's rows.
- The fused ``c_attn`` (q, k, v one after another) is llama.cpp's ``attn_qkv`` as it is.
- Layer norms with biases, biases on every projection, learned position embeddings
  (``wpe``: ``position_embd``).  The output head is the token embedding unless the GGUF has an
  ``output.weight`` (``lm_head``).
- No rotary; byte-level BPE vocabulary.
"""

from __future__ import annotations

from .base import Architecture

#: Hugging Face tensor names -> llama.cpp's (gguf-py tensor_mapping.py for MODEL_ARCH.GPT2).
TENSORS: tuple[tuple[str, str], ...] = (
    (r"transformer\.wte\.weight", "token_embd.weight"),
    (r"transformer\.wpe\.weight", "position_embd.weight"),
    (r"transformer\.ln_f\.(weight|bias)", r"output_norm.\1"),
    (r"lm_head\.weight", "output.weight"),
    (r"transformer\.h\.(\d+)\.ln_1\.(weight|bias)", r"blk.\1.attn_norm.\2"),
    (r"transformer\.h\.(\d+)\.attn\.c_attn\.(weight|bias)", r"blk.\1.attn_qkv.\2"),
    (r"transformer\.h\.(\d+)\.attn\.c_proj\.(weight|bias)", r"blk.\1.attn_output.\2"),
    (r"transformer\.h\.(\d+)\.ln_2\.(weight|bias)", r"blk.\1.ffn_norm.\2"),
    (r"transformer\.h\.(\d+)\.mlp\.c_fc\.(weight|bias)", r"blk.\1.ffn_up.\2"),
    (r"transformer\.h\.(\d+)\.mlp\.c_proj\.(weight|bias)", r"blk.\1.ffn_down.\2"),
)
#: The Conv1D weights, which llama.cpp stores transposed.
TRANSPOSED = (r"transformer\.h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight",)

ARCH = Architecture(
    name="gpt2", model_arch="GPT2", model_types=("gpt2",), tensors=TENSORS,
    skipped=(r"transformer\.h\.\d+\.attn\.(bias|masked_bias)",), transposed=TRANSPOSED, tokenizer_model="gpt2", hf_export=False,
    rope_dimension_count=False, notes="Conv1D weights stored transposed (packed: a transposed storage order)")
