"""The default selection rule of ``qformat quantize`` knows llama.cpp's GGUF tensor names as it knows
Hugging Face's.

For tiny transformers models of several architectures (built on the meta device: real names and
shapes, no weights), each tensor's GGUF name is the one gguf-py's tensor name map gives for that
architecture (what llama.cpp's converter writes).  The rule must select a tensor under its GGUF
name exactly when it selects it under its Hugging Face name: embeddings (``token_embd``,
``position_embd``, ``token_types``), the head (``output``, tied or not, and ``cls``) and norms
(``*_norm``) stay unquantized in both families.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import qformat
from qformat.recipe import default_selected, embedding_shapes
from qformat.sources import TensorInfo

ARCHS = [
    # (transformers model class, config class and arguments, gguf-py MODEL_ARCH member, prefix llama.cpp's converter strips)
    ("LlamaForCausalLM", "LlamaConfig", dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                             num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False), "LLAMA", ""),
    ("LlamaForCausalLM", "LlamaConfig", dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                             num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True), "LLAMA", ""),
    ("GPT2LMHeadModel", "GPT2Config", dict(n_embd=64, n_layer=2, n_head=2, vocab_size=320, n_positions=128), "GPT2", ""),
    ("BertForSequenceClassification", "BertConfig", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                                         intermediate_size=128, vocab_size=320, num_labels=80), "BERT", "bert."),
]


def _families(model_cls: str, cfg_cls: str, kwargs: dict, arch: str, strip: str) -> tuple[dict[str, TensorInfo], dict[str, TensorInfo], dict[str, str]]:
    """(Hugging Face infos, GGUF infos, HF name -> GGUF name) of every tensor gguf-py's map names."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import gguf

    with torch.device("meta"):
        model = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**kwargs))
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch], kwargs.get("num_hidden_layers", kwargs.get("n_layer")))
    hf: dict[str, TensorInfo] = {}
    gg: dict[str, TensorInfo] = {}
    names: dict[str, str] = {}
    sd = model.state_dict()
    if kwargs.get("tie_word_embeddings") and "lm_head.weight" not in sd:
        sd["lm_head.weight"] = next(v for k, v in sd.items() if k.endswith("embed_tokens.weight"))  # a tied head saved as a copy
    for k, v in sd.items():
        g = tmap.get_name(k.removeprefix(strip), try_suffixes=(".weight", ".bias"))
        if g is None:
            continue
        info = TensorInfo("F16", tuple(v.shape))
        hf[k], gg[g], names[k] = info, info, g
    return hf, gg, names


@pytest.mark.parametrize("model_cls,cfg_cls,kwargs,arch,strip", ARCHS, ids=[f"{a[0]}-{'tied' if a[2].get('tie_word_embeddings') else 'untied'}" for a in ARCHS])
def test_gguf_names_select_as_hugging_face_names(model_cls: str, cfg_cls: str, kwargs: dict, arch: str, strip: str) -> None:
    hf, gg, names = _families(model_cls, cfg_cls, kwargs, arch, strip)
    hf_emb, gg_emb = embedding_shapes(hf), embedding_shapes(gg)
    assert hf_emb == gg_emb and hf_emb  # the embeddings are recognised in both families
    picked = {k: default_selected(k, hf[k], hf_emb) for k in hf}
    for k, g in names.items():
        assert default_selected(g, gg[g], gg_emb) == picked[k], f"{k} -> {g}"
    assert any(picked.values()) and not all(picked.values())
    for g in gg:  # what must never be quantized by default, by its GGUF name
        if g.split(".")[0] in ("token_embd", "position_embd", "token_types", "output", "cls") or g.split(".")[-2].endswith("_norm"):
            assert not default_selected(g, gg[g], gg_emb), g


def test_every_gguf_embedding_name_is_an_embedding() -> None:
    """gguf-py's embedding tensors, by name alone (whatever their shape)."""
    import gguf

    from qformat.recipe import is_embedding

    M = gguf.MODEL_TENSOR
    for t in (M.TOKEN_EMBD, M.POS_EMBD, M.TOKEN_TYPES, M.PER_LAYER_TOKEN_EMBD):
        name = gguf.TENSOR_NAMES[t].format(bid=0) + ".weight"
        assert is_embedding(name), name
        assert not default_selected(name, TensorInfo("F16", (256, 256)))
    for t in (M.OUTPUT, M.CLS, M.OUTPUT_NORM, M.ATTN_NORM, M.FFN_NORM, M.TOKEN_EMBD_NORM):
        name = gguf.TENSOR_NAMES[t].format(bid=0) + ".weight"
        assert not default_selected(name, TensorInfo("F16", (256, 256))), name
    assert default_selected(gguf.TENSOR_NAMES[M.FFN_UP].format(bid=0) + ".weight", TensorInfo("F16", (256, 256)))


def test_quantize_a_gguf_named_checkpoint(tmp_path: Path) -> None:
    """``qformat quantize`` of a plain checkpoint with GGUF names keeps the embedding, its tied
    head copy and the norms, and quantizes the block weights."""
    rng = np.random.default_rng(0)
    f16 = lambda *s: rng.standard_normal(s).astype(np.float16)  # noqa: E731
    emb = f16(320, 64)
    tensors = {"token_embd.weight": emb, "output.weight": emb.copy(), "output_norm.weight": f16(64),
               "blk.0.attn_norm.weight": f16(64), "blk.0.attn_q.weight": f16(64, 64), "blk.0.ffn_up.weight": f16(128, 64)}
    qformat.save_file(tensors, tmp_path / "src.safetensors")
    s = qformat.quantize_checkpoint(tmp_path / "src.safetensors", tmp_path / "q.safetensors", scheme="int", bits=4, group_size=32)
    assert s.quantized_tensors == 2
    with qformat.safe_open(tmp_path / "q.safetensors") as f:
        quantized = {n for n in f.keys() if f.descriptor(n) is not None}
    assert quantized == {"blk.0.attn_q.weight", "blk.0.ffn_up.weight"}
