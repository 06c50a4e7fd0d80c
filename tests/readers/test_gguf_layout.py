"""GGUF model files into Hugging Face model folders that keep their weights packed (issue 22 item 1).

For each architecture transformers' GGUF loader supports, a tiny model is written as GGUF
(tests/gguf_models.py: llama.cpp's names, rotary q/k order, Gemma's ``norm + 1``, legacy types
quantized by gguf-py, K-quant blocks, a quantized embedding tied or not), converted with
``qformat convert model.gguf out/``, loaded with ``from_pretrained(out)`` and compared with
transformers' own ``from_pretrained(..., gguf_file=...)`` of the same file: the logits are
bit-identical (both decode exactly as gguf-py does, in float32, and QLinear multiplies the
decoded weight with F.linear as nn.Linear does), greedy generation gives the same tokens, and
the tokenizer encodes alike.  Bad input is refused with a code and nothing is written.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import qformat  # noqa: E402
import qformat.transformers  # noqa: E402,F401  (registers quant_method "qformat")
from qformat.errors import QFormatError  # noqa: E402
from qformat_torch.nn import QLinear  # noqa: E402
from qformat_transformers.gguf_layout import convert_gguf  # noqa: E402

from ..gguf_models import ARCHS, hf_model, write_gguf  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog, 0123 times."
#: Per architecture: tied embeddings or not, and the types of a few tensors besides the default
#: Q8_0 (K-quants where rows are whole super-blocks of 256; the embedding stays quantized).
CASES = {
    "llama": (False, {"ffn_down": "Q4_K", "attn_v": "Q4_0", "output": "Q6_K"}),
    "mistral": (False, {"ffn_gate": "Q5_1", "ffn_down": "Q5_K"}),
    "qwen2": (False, {"ffn_down": "Q3_K", "attn_q": "Q4_1"}),
    "qwen3": (True, {"ffn_down": "Q2_K", "ffn_up": "Q5_0"}),
    "gemma2": (True, {"ffn_down": "Q6_K"}),
    "gemma3": (True, {"ffn_down": "Q4_K", "token_embd": "Q4_0"}),
    "phi3": (False, {"ffn_down": "Q4_K"}),
}


@functools.lru_cache(maxsize=None)
def _source(root: str, arch: str) -> Path:
    tie, types = CASES[arch]
    folder = Path(root) / f"hf-{arch}"
    hf_model(arch, folder, tie=tie)
    return write_gguf(folder, Path(root) / f"{arch}.gguf", arch, types=types)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("gguf-models"))


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("arch", sorted(CASES))
def test_gguf_model_runs_packed_like_transformers_gguf_loader(root, tmp_path, arch):
    src = _source(root, arch)
    out = tmp_path / "out"
    s = convert_gguf(src, out)
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file() and (out / "model.safetensors").is_file()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "qformat" and cfg["dtype"] == "float32"
    # the config is transformers' own reading of the GGUF, with only these members changed
    auto = transformers.AutoConfig.from_pretrained(str(src.parent), gguf_file=src.name).to_dict()
    changed = {"quantization_config", "dtype", "architectures", "_name_or_path"}
    assert {k: v for k, v in cfg.items() if k not in changed} == {k: v for k, v in json.loads(json.dumps(auto)).items() if k not in changed}
    assert s.permuted == (sorted(n for n in s.permuted if "q_proj" in n or "k_proj" in n) if ARCHS[arch][1] == "llama" else [])
    if ARCHS[arch][1] == "llama":
        assert len(s.permuted) == 4  # q and k of both layers

    ref = transformers.AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out))
    assert type(model) is type(ref) and model.dtype == ref.dtype == torch.float32
    # every quantized Linear weight of the GGUF is a QLinear; nothing was decoded at load
    with qformat.safe_open(str(out / "model.safetensors")) as f:
        packed = {n for n in f.keys() if f.descriptor(n) is not None}
    quantized_linear = [n for n, m in ref.named_modules() if isinstance(m, torch.nn.Linear) and f"{n}.weight" in packed]
    qlinears = [n for n, m in model.named_modules() if isinstance(m, QLinear)]
    assert qlinears and sorted(qlinears) == sorted(quantized_linear)

    tok_ref = transformers.AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    ids = tok(TEXT, return_tensors="pt").input_ids
    assert ids.tolist() == tok_ref(TEXT, return_tensors="pt").input_ids.tolist()
    a, b = _logits(ref, ids), _logits(model, ids)
    assert torch.equal(a, b), f"max abs difference {(a - b).abs().max().item()}"
    gen = dict(max_new_tokens=6, do_sample=False, pad_token_id=tok_ref.eos_token_id)
    assert torch.equal(ref.generate(ids, **gen), model.generate(ids, **gen))


@pytest.mark.parametrize("arch", sorted(CASES))
def test_folder_exports_back_to_the_same_gguf(root, tmp_path, arch):
    """Issue 42 items 1 and 3: the folder keeps what the GGUF said (``__metadata__["gguf"]``: every
    key/value, the tensor list and order) and ``qformat export --to gguf`` maps transformers'
    names back by the architecture table (llama's q/k rows permuted again, Gemma's norms plus 1):
    the exported file is the source GGUF byte for byte.  An architecture the table does not
    have is refused by name, nothing written."""
    from qformat.architectures import by_gguf
    from qformat.export import export

    src = _source(root, arch)
    out, back = tmp_path / "out", tmp_path / "back.gguf"
    convert_gguf(src, out)
    garch = ARCHS[arch][1]
    if by_gguf(garch) is None:
        with pytest.raises(QFormatError) as e:
            export(out, back, to="gguf")
        assert e.value.code == "EXPORT_UNMAPPABLE" and repr(garch) in str(e.value), e.value
        assert not back.exists()
        return
    rep = export(out, back, to="gguf")
    assert rep.to_dict()["exact"] is True
    assert back.read_bytes() == src.read_bytes()


def test_cli_layout_follows_the_destination(root, tmp_path, capsys):
    """The CLI's layout rule, in this process (transformers is imported already; the llama_cpp
    tests run the same command in a subprocess on llama.cpp's own files), and a refusal as a
    user sees it: one line with its code, exit 2, nothing written."""
    from qformat.cli import main

    src = _source(root, "llama")
    assert main(["convert", "--quiet", str(src), str(tmp_path / "folder")]) == 0
    assert "LlamaForCausalLM" in capsys.readouterr().out and (tmp_path / "folder" / "config.json").is_file()
    assert main(["convert", "--quiet", str(src), str(tmp_path / "one.safetensors")]) == 0  # GGUF names, one file
    assert "blk.0.attn_q.weight" in qformat.load_file(tmp_path / "one.safetensors")
    # a destination named like a file never becomes a folder (the one destination rule of every command)
    assert main(["convert", "--quiet", str(src), str(tmp_path / "forced.safetensors"), "--layout", "hf"]) == 2
    assert "CONVERT_DESTINATION_INVALID" in capsys.readouterr().err and not (tmp_path / "forced.safetensors").exists()
    r = subprocess.run([sys.executable, "-m", "qformat", "convert", str(tmp_path / "one.safetensors"), str(tmp_path / "x"),
                        "--layout", "hf"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "CONVERT_UNSUPPORTED" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "x").exists()


def test_q4_0_model_takes_the_native_int4_kernel_where_the_policy_allows(root, tmp_path):
    from qformat_torch import kernels

    folder = Path(root) / "hf-llama"
    _source(root, "llama")
    src = write_gguf(folder, tmp_path / "q4.gguf", "llama", qtype="Q4_0", types={"token_embd": "Q8_0", "output": "Q8_0"})
    convert_gguf(src, tmp_path / "out")
    old = kernels.get_kernel_policy()
    try:
        kernels.set_kernel_policy("auto")  # the default: Q4_0's float16 scales round to bfloat16 (a relative 2^-8)
        m = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), dtype=torch.bfloat16)
        paths = {m.get_submodule(n).kernel_path for n, x in m.named_modules() if isinstance(x, QLinear) and ".layers." in n}
        assert paths == {"int4_grouped"}
        kernels.set_kernel_policy("decode")  # a layer re-selects its path at its next forward
        with torch.no_grad():
            m(torch.tensor([[1, 2, 3]]))
        paths = {x.kernel_path for x in m.modules() if isinstance(x, QLinear)}
        assert paths == {"decode"}
    finally:
        kernels.set_kernel_policy(old)


# -- refused, nothing written --------------------------------------------------------------------------
def _refused(src: Path, dst: Path, code: str, *words: str) -> None:
    with pytest.raises(QFormatError) as e:
        convert_gguf(src, dst)
    assert e.value.code == code, e.value
    for w in words:
        assert w in str(e.value), e.value
    assert not dst.exists()
    assert not [p for p in dst.parent.iterdir() if p.name.startswith(".qformat-")]


@pytest.mark.parametrize("gguf_arch,why", [("gemma", "not one transformers"), ("qwen2moe", "merges or splits"),
                                           ("lfm2", "merges or splits"), ("bert", "not one transformers")])
def test_unsupported_architecture_is_named(root, tmp_path, gguf_arch, why):
    _source(root, "llama")
    src = write_gguf(Path(root) / "hf-llama", tmp_path / "m.gguf", "llama", gguf_arch=gguf_arch)
    _refused(src, tmp_path / "out", "CONVERT_UNSUPPORTED", repr(gguf_arch), why)


@pytest.mark.parametrize("key", ["llama.block_count", "llama.feed_forward_length", "llama.embedding_length",
                                 "llama.attention.head_count", "llama.attention.layer_norm_rms_epsilon"])
def test_missing_hyperparameter_is_named(root, tmp_path, key):
    _source(root, "llama")
    src = write_gguf(Path(root) / "hf-llama", tmp_path / "m.gguf", "llama", drop=(key,))
    _refused(src, tmp_path / "out", "CONVERT_SOURCE_INVALID", key)


def test_hyperparameters_that_do_not_fit_the_tensors(root, tmp_path):
    _source(root, "llama")
    src = write_gguf(Path(root) / "hf-llama", tmp_path / "m.gguf", "llama", override={"llama.feed_forward_length": 384})
    _refused(src, tmp_path / "out", "CONVERT_SOURCE_INVALID", "expects", "384")


def test_missing_tokenizer_is_named(root, tmp_path):
    _source(root, "llama")
    src = write_gguf(Path(root) / "hf-llama", tmp_path / "m.gguf", "llama", drop=("tokenizer.",))
    _refused(src, tmp_path / "out", "CONVERT_UNSUPPORTED", "tokenizer.ggml.model")


def test_not_a_gguf_source(tmp_path):
    qformat.save_file({"w": np.zeros((4, 32), np.float32)}, tmp_path / "m.safetensors")
    _refused(tmp_path / "m.safetensors", tmp_path / "out", "CONVERT_UNSUPPORTED", "GGUF")
