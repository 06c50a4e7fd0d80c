"""A quantized embedding stays packed through ``from_pretrained`` (issue 42 item 6, issue 45
item 6): the input embedding decodes only the rows it is asked for, a head tied to it runs as
a QLinear over the same buffers (:mod:`qformat_torch.embedding`).

Oracles: the decoded table (gguf-py's dequantization, ``oracle``) and transformers' own model
with that table as a plain parameter.  Under the "decode" kernel policy the logits are
bit-identical to the dense model's (the head is F.linear on the decoded table); under "auto"
the head's kernel is held to :func:`qformat_torch.kernels.error_bound`.  Asking for the
embedding's ``weight`` makes it the plain decoded embedding it was (the tie declared again).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

import qformat  # noqa: E402
import qformat.convert  # noqa: E402
import qformat.transformers  # noqa: E402,F401
from qformat_torch import kernels  # noqa: E402
from qformat_torch.embedding import PackedEmbedding, TiedHead  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

from ..convert.test_gguf import oracle, quant_data, write_gguf  # noqa: E402
from .test_load_mismatch import renamed, rewrite  # noqa: E402

IDS = torch.tensor([[3, 17, 42, 99, 5, 250, 7, 64, 128, 1, 17, 18, 19, 255, 0]])


def _folder(tmp_path, qtype: str, tie: bool):
    from gguf import GGMLQuantizationType

    qt = GGMLQuantizationType[qtype]
    cfg = LlamaConfig(hidden_size=256, num_hidden_layers=1, intermediate_size=256, vocab_size=256, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tie)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "fp")
    raw = quant_data(qt, (256, 256), np.random.default_rng(0), edges=False)
    qformat.convert.convert(write_gguf(tmp_path / "e.gguf", [("token_embd.weight", raw, qt)]), tmp_path / "e.safetensors")
    with qformat.safe_open(tmp_path / "e.safetensors") as f:
        emb = f.get_qtensor("token_embd.weight")

    def swap(t):
        return {**renamed({"token_embd.weight": emb}, lambda n: "model.embed_tokens.weight"),
                **{k: v for k, v in t.items() if k != "model.embed_tokens.weight"}}

    qdir = rewrite(tmp_path / "fp", tmp_path / "q", swap)
    config = json.loads((qdir / "config.json").read_text())
    (qdir / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "qformat"}}))
    want = torch.from_numpy(oracle(raw, qt, (256, 256)))
    ref = LlamaForCausalLM.from_pretrained(tmp_path / "fp")
    with torch.no_grad():
        ref.model.embed_tokens.weight.copy_(want)
    return qdir, want, ref


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q6_K"])  # Q6_K: nested (encoded) scales, decoded by runs of rows
def test_tied_embedding_stays_packed_and_decodes_the_rows_bit_for_bit(qtype, tmp_path):
    qdir, want, ref = _folder(tmp_path, qtype, True)
    old = kernels.get_kernel_policy()
    try:
        kernels.set_kernel_policy("decode")
        model, info = AutoModelForCausalLM.from_pretrained(qdir, output_loading_info=True)
        assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
        emb, head = model.get_input_embeddings(), model.get_output_embeddings()
        assert isinstance(emb, PackedEmbedding) and isinstance(emb, torch.nn.Embedding) and isinstance(head, TiedHead)
        assert "weight" not in dict(emb.named_parameters()) and not list(head.state_dict())
        with torch.no_grad():
            rows = emb(IDS)
            assert torch.equal(rows.view(torch.int32), want[IDS].view(torch.int32))
            assert torch.equal(emb.weight_decoded().view(torch.int32), want.view(torch.int32))
            a, b = model(IDS).logits, ref(IDS).logits
            assert torch.equal(a.view(torch.int32), b.view(torch.int32))  # F.linear on the decoded table
            gen = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
            assert torch.equal(model.generate(IDS[:, :4], **gen), ref.generate(IDS[:, :4], **gen))
        assert isinstance(model.get_input_embeddings(), PackedEmbedding)  # the forward never unpacked it
        kernels.set_kernel_policy("auto")
        with torch.no_grad():
            y = model(IDS).logits.double()
            h = ref.model(IDS).last_hidden_state.double()
        exact = h @ want.double().T
        bound = kernels.error_bound(exact, h.abs() @ want.double().abs().T, 256, torch.float32)
        assert bool(((y - exact).abs() <= bound).all())  # the layers are plain: the hidden states are ref's
    finally:
        kernels.set_kernel_policy(old)


def test_asking_for_the_weight_unpacks_and_ties_again(tmp_path):
    qdir, want, ref = _folder(tmp_path, "Q8_0", True)
    model = AutoModelForCausalLM.from_pretrained(qdir)
    assert isinstance(model.lm_head, TiedHead)
    w = model.lm_head.weight  # the head asks the embedding: both become plain, sharing one parameter
    assert type(model.model.embed_tokens) is torch.nn.Embedding and model.model.embed_tokens.weight is w
    assert type(model.lm_head) is torch.nn.Linear and model.lm_head.weight is w
    assert torch.equal(w, want)
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, ref(IDS).logits)


def test_save_keeps_the_packed_embedding_in_its_scheme(tmp_path):
    qdir, want, ref = _folder(tmp_path, "Q8_0", True)
    model = AutoModelForCausalLM.from_pretrained(qdir)
    model.save_pretrained(tmp_path / "saved")
    with qformat.safe_open(qdir / "model.safetensors") as f:
        src = f.get_qtensor("model.embed_tokens.weight")
    with qformat.safe_open(tmp_path / "saved" / "model.safetensors") as f:
        assert "lm_head.weight" not in f.keys() and not any(k.startswith("lm_head") for k in f.keys())
        got = f.get_qtensor("model.embed_tokens.weight")
    assert got.descriptor["scheme"] == "gguf_q8_0"
    assert {k: v.tobytes() for k, v in got.components.items()} == {k: v.tobytes() for k, v in src.components.items()}
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    assert isinstance(again.model.embed_tokens, PackedEmbedding)
    with torch.no_grad():
        assert torch.equal(again(IDS).logits, model(IDS).logits)
