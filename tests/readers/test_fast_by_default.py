"""Fast by default (issue 23 item 4): what a user types reaches torch's native CPU kernels.

A tiny bfloat16 Llama is quantized on load with ``QFormatConfig(scheme="int", bits=4,
group_size=32)`` (or int8 per channel) and nothing else: the scales are stored in bfloat16 (the
default for a bfloat16 logical dtype), every quantized Linear runs the native kernel under the
default policy, each layer's output is within the documented bound of the exact product with
qformat's decoded weight (``kernels.error_bound(..., weight_roundings=1)``: the decoded weight is
the bfloat16 rounding of ``q * s``, the kernel multiplies ``q * s`` itself), and
``kernel="decode"`` still gives F.linear on the decoded weight bit for bit.  A float16
checkpoint keeps float16 scales, and ``qformat quantize`` of the bfloat16 folder writes what
``save_pretrained`` writes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import torch.nn.functional as F  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

import qformat  # noqa: E402
import qformat.transformers as qtf  # noqa: E402
from qformat.io import SafeOpen  # noqa: E402
from qformat_torch import kernels  # noqa: E402
from qformat_torch.nn import QLinear  # noqa: E402
from tests.readers.test_transformers import tiny_config  # noqa: E402

CASES = {"int4 g32": ({"bits": 4, "group_size": 32}, "int4_grouped"),
         "int8 per channel": ({"bits": 8, "group_size": None}, "int8_per_channel")}


def _config() -> LlamaConfig:
    # hidden 64, intermediate 128: every decoder Linear fits both kernels (N % 16, K % 32)
    return tiny_config()


@pytest.fixture(scope="module")
def bf16_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("fast") / "bf16"
    LlamaForCausalLM(_config()).to(torch.bfloat16).eval().save_pretrained(out)
    return out


def _need(name: str) -> None:
    path = next(p for p in kernels.PATHS if p.name == name)
    if not kernels.probe(path):
        pytest.skip(f"{name}: torch's native op is unavailable or wrong here ({torch.backends.cpu.get_cpu_capability()})")


def _within_bound(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, roundings: int) -> float:
    x64, w64 = x.double(), w.double()
    ref = x64 @ w64.T
    bound = kernels.error_bound(ref, x64.abs() @ w64.abs().T, x.shape[-1], x.dtype, roundings)
    return float(((y.double() - ref).abs() / bound).max())


@pytest.mark.parametrize("case", list(CASES))
def test_quantize_on_load_defaults_take_the_kernel(bf16_dir, tmp_path, case):
    params, path = CASES[case]
    _need(path)
    assert kernels.get_kernel_policy() == "auto"
    m = AutoModelForCausalLM.from_pretrained(bf16_dir, dtype=torch.bfloat16,
                                             quantization_config=qtf.QFormatConfig(scheme="int", **params))
    ql = {n: x for n, x in m.named_modules() if isinstance(x, QLinear)}
    assert len(ql) == 14  # 7 decoder Linears x 2 layers (the default rule keeps lm_head)
    for n, x in ql.items():
        assert x.descriptor["dtype"] == "bfloat16"
        assert x.component_tensors()["scale"].dtype == torch.bfloat16, n  # stored as the kernel takes them
        assert x.kernel_path == path, n
        p = x._native
        assert p.roundings == 1 and not p.exact, p.why  # only the logical dtype's rounding of q*s
        xin = torch.randn(5, x.in_features, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(3))
        r = _within_bound(x(xin), xin, x.weight, 1)
        assert r <= 1, f"{n}: {r:.3f} of the bound"
    ids = torch.tensor([[1, 17, 42, 99, 5, 250, 7, 64]])
    with torch.inference_mode():
        fast = m(ids).logits
        kernels.set_kernel_policy("decode")
        try:
            exact = m(ids).logits
            assert {x.kernel_path for x in ql.values()} == {"decode"}
            one = next(iter(ql.values()))
            xin = torch.randn(3, one.in_features, dtype=torch.bfloat16)
            assert torch.equal(one(xin), F.linear(xin, one.weight.to(torch.bfloat16)))
        finally:
            kernels.set_kernel_policy("auto")
    assert not torch.equal(fast, exact)  # two paths, really taken
    assert bool((fast.argmax(-1) == exact.argmax(-1)).all())
    # the saved folder reloads onto the kernels, and is what `qformat quantize` writes
    m.save_pretrained(tmp_path / "saved")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "saved", dtype=torch.bfloat16)
    assert {x.kernel_path for x in again.modules() if isinstance(x, QLinear)} == {path}
    qformat.quantize_checkpoint(bf16_dir, tmp_path / "cli", scheme="int", **params)
    with SafeOpen(tmp_path / "cli" / "model.safetensors") as a, SafeOpen(tmp_path / "saved" / "model.safetensors") as b:
        assert a.model.raw == b.model.raw
        scales = [n for n in a.header.entries if n.endswith(".scale")]
        assert scales and {a.header.entries[n].dtype for n in scales} == {"BF16"}


def test_float16_sources_keep_float16_scales(tmp_path):
    """The default scale dtype changes only for a bfloat16 logical dtype."""
    torch.manual_seed(0)
    LlamaForCausalLM(_config()).to(torch.float16).save_pretrained(tmp_path / "fp16")
    qformat.quantize_checkpoint(tmp_path / "fp16", tmp_path / "q", scheme="int", bits=4, group_size=32)
    with SafeOpen(tmp_path / "q" / "model.safetensors") as f:
        scales = [n for n in f.header.entries if n.endswith(".scale")]
        assert scales and {f.header.entries[n].dtype for n in scales} == {"F16"}


def test_kernel_option_keeps_the_exact_path(bf16_dir, tmp_path):
    """``QFormatConfig(kernel="decode")``: every QLinear of the load decodes (quantizing on load,
    and loading a qformat checkpoint through ``qformat_config``); config.json does not record it."""
    _need("int4_grouped")
    cfg = qtf.QFormatConfig(scheme="int", bits=4, group_size=32, kernel="decode")
    m = AutoModelForCausalLM.from_pretrained(bf16_dir, dtype=torch.bfloat16, quantization_config=cfg)
    ql = [x for x in m.modules() if isinstance(x, QLinear)]
    assert ql and {x.kernel_path for x in ql} == {"decode"} and {x.kernel for x in ql} == {"decode"}
    m.save_pretrained(tmp_path / "saved")
    assert "kernel" not in (tmp_path / "saved" / "config.json").read_text()
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "saved", dtype=torch.bfloat16,
                                                 config=qtf.qformat_config(tmp_path / "saved", qtf.QFormatConfig(kernel="decode")))
    assert {x.kernel_path for x in again.modules() if isinstance(x, QLinear)} == {"decode"}
    with pytest.raises(ValueError):
        qtf.QFormatConfig(kernel="fast")
