"""The transposed description of a packed tensor (qformat.architectures.base.transposed_descriptor,
used for GPT-2's Conv1D weights, which llama.cpp stores transposed): the same components, no
byte changed, decode to the transpose of what the original descriptor decodes to, bit for bit,
for every ggml block form (one level: Q8_0, Q4_0, Q5_1; two levels: Q4_K, Q6_K); transposing
twice describes the original tensor again; what has no such description is refused."""

from __future__ import annotations

import numpy as np
import pytest

import qformat
from qformat.architectures import ARCHITECTURES
from qformat.architectures.base import transposed_descriptor
from qformat.qtensor import QTensor


@pytest.mark.parametrize("gtype", ["Q8_0", "Q4_0", "Q5_1", "Q4_K", "Q6_K"])
def test_transposed_description_decodes_to_the_transpose(gtype: str) -> None:
    x = np.random.default_rng(11).standard_normal((48, 512)).astype(np.float32)
    q = qformat.quantize(x, "gguf", type=gtype)
    t = QTensor(transposed_descriptor(q.descriptor), q.components)
    assert t.shape == (512, 48)
    a, b = q.dequantize(), t.dequantize()
    assert np.array_equal(a.T.view(np.uint32), np.ascontiguousarray(b).view(np.uint32))
    back = QTensor(transposed_descriptor(t.descriptor), q.components).dequantize()
    assert np.array_equal(a.view(np.uint32), back.view(np.uint32))


def test_what_has_no_transposed_description_is_refused() -> None:
    q = qformat.quantize(np.ones((2, 4, 32), np.float32), "gguf", type="Q8_0")
    with pytest.raises(ValueError, match="rank 3"):
        transposed_descriptor(q.descriptor)


def test_gpt2_table_transposes_only_the_conv1d_weights() -> None:
    a = ARCHITECTURES["gpt2"]
    for n in ("transformer.h.0.attn.c_attn.weight", "transformer.h.3.attn.c_proj.weight", "transformer.h.1.mlp.c_fc.weight",
              "transformer.h.1.mlp.c_proj.weight"):
        assert a.transposes(n)
    for n in ("transformer.h.0.attn.c_attn.bias", "transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight"):
        assert not a.transposes(n)
    assert a.gguf_name("transformer.h.2.mlp.c_fc.weight") == "blk.2.ffn_up.weight"
    assert not any(ARCHITECTURES[k].transposed for k in ("phi3", "stablelm", "starcoder2"))


def test_bloom_head_split_is_the_converters_regrouping() -> None:
    """Bloom's fused query_key_value: the table's row order is what llama.cpp's converter does
    (``BloomModel.modify_tensors``, written here in NumPy), and transformers' GGUF loader
    (``BloomTensorProcessor``) takes the GGUF rows back to the checkpoint's."""
    from transformers.modeling_gguf_pytorch_utils import BloomTensorProcessor

    n_head, n_embed = 4, 32
    w = np.random.default_rng(5).standard_normal((3 * n_embed, n_embed)).astype(np.float32)
    qkv = w.reshape(n_head, 3, n_embed // n_head, n_embed)
    gguf_rows = np.concatenate([qkv[:, i].reshape(-1, n_embed) for i in range(3)])
    perm = ARCHITECTURES["bloom"].permutation("transformer.h.0.self_attention.query_key_value.weight", 3 * n_embed, {"n_head": n_head})
    assert perm is not None and np.array_equal(w[perm], gguf_rows)
    back = BloomTensorProcessor(config={"n_head": n_head, "hidden_size": n_embed}).process(gguf_rows, "blk.0.attn_qkv.weight").weights
    assert np.array_equal(back, w)
