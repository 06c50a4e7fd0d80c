"""``qformat convert SRC DST --repack`` of a folder a converter describes in place gives a
self-contained qformat checkpoint (issue 22, item 5).

For every converter, on the folders its own tests build (tests/convert/test_<format>.py): the
repacked folder holds only the model's tensors (each fixture lists them from what it built:
the quantized layers' weights and the plain tensors it wrote), none of the source format's
side tensors or side files (quant-state blobs, codebooks, folded ``g_idx``, ``weight_shape``,
``quanto_qmap.json``, ``hf_quant_config.json``), config.json's ``quantization_config`` is
qformat's, ``qformat check`` passes, every model tensor decodes bit for bit as the in-place
conversion does, and the rest of the folder (tokenizer, subfolders) is carried.  The in-place
conversion keeps the source's config.json and side files as they were.

Then through transformers: a tiny Llama whose decoder Linears are quantized by bitsandbytes,
GPTQ, AWQ and compressed-tensors conventions, repacked, loads with plain
``AutoModelForCausalLM.from_pretrained`` and its logits equal those of the same model holding
qformat's decoding of the source.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

import qformat
from qformat.convert import convert

from .helpers import bits_equal

#: Side files every fixture folder gets, which must reach both outputs unchanged.
CARRIED = {"tokenizer.json": '{"version": "1.0"}', "1_Pooling/config.json": '{"pooling_mode_mean_tokens": true}'}


@contextlib.contextmanager
def _eager() -> Iterator[None]:
    """torch.compile off while bitsandbytes quantizes: it wraps its CPU 4-bit path in
    torch.compile(dynamic=False), which compiles for every shape (seconds each) to the same
    formula (see tests/convert/test_bitsandbytes.py)."""
    import torch._dynamo

    was = torch._dynamo.config.disable
    torch._dynamo.config.disable = True
    try:
        yield
    finally:
        torch._dynamo.config.disable = was


def _bitsandbytes(tmp: Path) -> tuple[Path, set[str], set[str]]:
    pytest.importorskip("bitsandbytes")
    import torch
    from safetensors.torch import save_file

    from .test_bitsandbytes import _model

    # an odd-sized nf4 weight (its codes are added, the stored tensor dropped), a double-quantized fp4 one
    layers = [("model.layers.0.mlp.odd", 5, 7, 32, "nf4", False, "float16"), ("model.layers.0.mlp.up", 16, 128, 64, "fp4", True, "float32")]
    with _eager():
        sd = {k: v.detach().contiguous() for k, v in _model(layers).state_dict().items()}
    sd["model.norm.weight"] = torch.ones(8)
    src = tmp / "src"
    src.mkdir()
    save_file(sd, str(src / "model.safetensors"), metadata={"format": "pt"})
    (src / "config.json").write_text(json.dumps({"model_type": "llama", "quantization_config": {
        "quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True}}))
    return src, {f"{name}.weight" for name, *_ in layers} | {"model.norm.weight"}, set()


def _gptq(desc_act: bool) -> Callable[[Path], tuple[Path, set[str], set[str]]]:
    def build(tmp: Path) -> tuple[Path, set[str], set[str]]:
        from .test_gptq import gptq_config, make_module, write_ckpt

        rng = np.random.default_rng(3)
        p = "model.layers.0.mlp.up_proj"
        t = make_module(rng, 24, 64, 4, 32, False, desc_act, "float16")[0]  # g_idx folded, or an act-order group index
        t["bias"] = rng.standard_normal(24).astype(np.float16)
        src = write_ckpt(tmp / "src", {p: t}, gptq_config(4, 32, "gptq", desc_act))
        return src, {f"{p}.weight", f"{p}.bias", "model.embed_tokens.weight"}, set()

    return build


def _awq(tmp: Path) -> tuple[Path, set[str], set[str]]:
    from .test_awq import awq_config, make_module, write_ckpt

    p = "model.layers.0.mlp.up_proj"
    src = write_ckpt(tmp / "src", {p: make_module(np.random.default_rng(4), 24, 64, 32)[0]}, awq_config(32))
    return src, {f"{p}.weight", "lm_head.weight"}, set()


def _compressed_tensors(fmt: str) -> Callable[[Path], tuple[Path, set[str], set[str]]]:
    def build(tmp: Path) -> tuple[Path, set[str], set[str]]:
        pytest.importorskip("compressed_tensors")
        from .test_compressed_tensors import _int, _preset, build as ct_build

        layers = {"q_proj": (_int(4, "group", False, 32), 13, 64)} if fmt == "pack-quantized" else {"q_proj": (_preset("NVFP4A16"), 8, 32)}
        src, expected = ct_build(tmp, fmt, layers, seed=2)
        return src, set(expected) | {"lm_head.weight"}, set()

    return build


def _gpt_oss(tmp: Path) -> tuple[Path, set[str], set[str]]:
    pytest.importorskip("transformers")
    from .test_gpt_oss import build

    src, expected = build(tmp, hf=True)
    return src, set(expected) | {f"{n}_bias" for n in expected} | {"model.embed_tokens.weight"}, set()


def _mlx(tmp: Path) -> tuple[Path, set[str], set[str]]:
    pytest.importorskip("mlx.core")
    from .test_mlx import _checkpoint

    spec = {"layers.0": (64, 5, None), "layers.1": (96, 3, {"bits": 3, "group_size": 32})}
    src, _ = _checkpoint(tmp, spec, "float32", {"group_size": 64, "bits": 4, "mode": "affine"})
    return src, {f"{layer}.weight" for layer in spec}, set()


def _modelopt(tmp: Path) -> tuple[Path, set[str], set[str]]:
    from .test_modelopt import build

    p = "model.layers.0.self_attn.q_proj"
    src, _ = build(tmp, {p: (24, 64)})
    # input_scale is an activation scale: no weight descriptor is built from it, so it stays plain.
    return src, {f"{p}.weight", f"{p}.input_scale", "lm_head.weight"}, {"hf_quant_config.json"}


def _quanto(tmp: Path) -> tuple[Path, set[str], set[str]]:
    pytest.importorskip("optimum.quanto")
    from .test_quanto import DTYPES, _checkpoint, _model

    src, weights = _checkpoint(tmp, ["qint4"], "float32")
    plain_model = set(_model(DTYPES["float32"], ["qint4"]).state_dict())
    # quanto's modules also hold activation scales (input_scale, output_scale): not weights, kept plain.
    act = {f"{w[:-len('.weight')]}.{s}" for w in weights for s in ("input_scale", "output_scale")}
    return src, plain_model | act, {"quanto_qmap.json"}


def _torchao(tmp: Path) -> tuple[Path, set[str], set[str]]:
    pytest.importorskip("torchao")
    from .test_torchao import AFFINE, _quantized_model, _save

    layers = [AFFINE[1], AFFINE[5]]  # int4 asymmetric per group (zero points), int8 per row
    model = _quantized_model(layers)
    src = tmp / "src"
    src.mkdir()
    _save(model.state_dict(), src / "model.safetensors")
    (src / "config.json").write_text('{"model_type": "test"}')
    return src, {f"{name}.{p}" for name, *_ in layers for p in ("weight", "bias")}, set()


def _qformat(tmp: Path) -> tuple[Path, set[str], set[str]]:
    x = np.random.default_rng(5).standard_normal((16, 64)).astype(np.float32)
    src = tmp / "src"
    src.mkdir()
    qformat.save_file({"a": qformat.quantize(x, "int", bits=4, group_size=32), "b": qformat.quantize(x, "nf4", double_quant=True),
                       "plain": x[:2]}, src / "model.safetensors")
    (src / "config.json").write_text(json.dumps({"model_type": "test", "quantization_config": {
        "quant_method": "qformat", "spec_version": "1.0", "rules": [], "default": {"scheme": "int", "bits": 4}}}))
    return src, {"a", "b", "plain"}, set()


#: converter id -> builder of (source folder, the model's tensor names, the source's side files the converter reads)
SOURCES: dict[str, tuple[str, Callable[[Path], tuple[Path, set[str], set[str]]]]] = {
    "bitsandbytes": ("bitsandbytes", _bitsandbytes),
    "gptq": ("gptq", _gptq(False)),
    "gptq-act-order": ("gptq", _gptq(True)),
    "awq": ("awq", _awq),
    "compressed-tensors-pack": ("compressed-tensors", _compressed_tensors("pack-quantized")),
    "compressed-tensors-nvfp4": ("compressed-tensors", _compressed_tensors("nvfp4-pack-quantized")),
    "gpt-oss": ("gpt-oss", _gpt_oss),
    "mlx": ("mlx", _mlx),
    "modelopt": ("modelopt", _modelopt),
    "quanto": ("quanto", _quanto),
    "torchao": ("torchao", _torchao),
    "qformat": ("qformat", _qformat),
}


def _versions(folder: Path) -> list[str]:
    from qformat.container import read_header

    out = []
    for p in sorted(folder.glob("*.safetensors")):
        md = read_header(p).metadata or {}
        if "qformat" in md:
            out.append(json.loads(md["qformat"])["version"])
    return out


@pytest.mark.parametrize("case", list(SOURCES))
def test_repack_is_self_contained(case, tmp_path):
    fmt, build = SOURCES[case]
    src, model_tensors, read_side = build(tmp_path)
    for name, text in CARRIED.items():
        (src / name).parent.mkdir(exist_ok=True)
        (src / name).write_text(text)
    assert qformat.convert.describe(src)[1].name == fmt
    inplace, repacked = tmp_path / "in-place", tmp_path / "repacked"
    convert(src, inplace)
    convert(src, repacked, repack=True)

    rep = qformat.check([repacked])
    assert rep.ok, rep.to_dict()
    got = qformat.load_checkpoint(repacked) if (repacked / "model.safetensors.index.json").exists() else \
        {k: v for p in sorted(repacked.glob("*.safetensors")) for k, v in qformat.load_file(p).items()}
    assert set(got) == model_tensors, f"left over: {sorted(set(got) - model_tensors)}, missing: {sorted(model_tensors - set(got))}"
    ref = {k: v for p in sorted(inplace.glob("*.safetensors")) for k, v in qformat.load_file(p).items()}
    for name in model_tensors:
        ok, why = bits_equal(got[name], ref[name])
        assert ok, f"{name}: {why}"

    # config.json: qformat's quantization_config (the files' own spec version); the rest kept
    if (src / "config.json").exists():
        before = json.loads((src / "config.json").read_text())
        after = json.loads((repacked / "config.json").read_text())
        qc = after.pop("quantization_config")
        assert qc["quant_method"] == "qformat" and qc["spec_version"] == max(_versions(repacked)), qc
        if fmt == "qformat":  # a qformat source's recorded recipe stays
            assert {k: qc[k] for k in ("rules", "default")} == {k: before["quantization_config"][k] for k in ("rules", "default")}
        assert after == {k: v for k, v in before.items() if k != "quantization_config"}
        assert json.loads((inplace / "config.json").read_text()) == before  # in place: the source's config unchanged
    # side files: the converter's own left behind under --repack, kept in place; the rest carried
    for name in read_side:
        assert not (repacked / name).exists() and (inplace / name).read_bytes() == (src / name).read_bytes(), name
    for out in (inplace, repacked):
        for name, text in CARRIED.items():
            assert (out / name).read_text() == text, (out, name)


# -- through transformers ---------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["bitsandbytes", "gptq", "awq", "compressed-tensors"])
def test_repacked_loads_with_plain_from_pretrained(fmt, tmp_path):
    """No ``config=`` override: the repacked config.json names qformat, so ``from_pretrained``
    picks qformat's quantizer by itself; logits equal the reference built from qformat's
    decoding of the source (the in-place conversion)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import qformat.transformers  # noqa: F401  (registers quant_method "qformat")
    from safetensors import safe_open

    from ..readers.test_transformers import IDS, decoder_linears, inplace_source, qlinears, reference, tiny_config

    torch.manual_seed(0)
    fp_dir = tmp_path / "fp"
    transformers.LlamaForCausalLM(tiny_config()).eval().save_pretrained(fp_dir)
    with _eager():
        inplace = inplace_source(fmt, fp_dir, tmp_path)  # builds tmp_path/<fmt>-src, converts it in place
    src, out = tmp_path / f"{fmt}-src", tmp_path / f"{fmt}-repacked"
    convert(src, out, repack=True)
    with safe_open(str(out / "model.safetensors"), "np") as f:
        stored = set(f.keys())
    assert not any(n.rsplit(".", 1)[-1] in ("g_idx", "weight_shape", "absmax", "quant_map") or ".quant_state." in n for n in stored)
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert sorted(qlinears(model)) == sorted(decoder_linears(model))
    ref = reference(fp_dir, inplace)
    from qformat_torch import kernels as tk

    with torch.no_grad():
        fast = model(IDS).logits  # the default policy: native kernels where they map (float32 sums in their own order)
        tk.set_kernel_policy("decode")  # the exact path: F.linear on the decoded weights, bit for bit
        try:
            logits = model(IDS).logits
        finally:
            tk.set_kernel_policy("auto")
        assert torch.isfinite(logits).all()
        assert torch.equal(logits, ref(IDS).logits)
        assert torch.allclose(fast, logits, rtol=1e-4, atol=1e-5), float((fast - logits).abs().max())
