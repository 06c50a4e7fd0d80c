"""``qformat export --to bitsandbytes`` against bitsandbytes and transformers (the oracles).

Every exported weight is read back the way its consumers read it: the tensors of one weight
through ``QuantState.from_dict`` (what transformers' loader calls) and ``dequantize_4bit``, and
compared bit for bit with qformat's values.  bitsandbytes' native CPU kernel differs between
CPUs in two documented places (tests/bnb_kernel.py), so each weight is also compared, with no
exception, with bitsandbytes' reference path (``backends/default/ops.py``
``_dequantize_4bit_compute``, the pure-torch formula its kernels implement); the kernel check
accepts exactly the documented differences of the kernel found running and runs under both
kernels where the scalar one can be forced.  Round trips start from checkpoints bitsandbytes
itself writes (``bnb.nn.Linear4bit`` quantized on the CPU, as tests/convert/test_bitsandbytes.py
builds them) and must give back every tensor byte for byte.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
bnb = pytest.importorskip("bitsandbytes")
from bitsandbytes import functional as BF  # noqa: E402
from safetensors.torch import load_file as torch_load  # noqa: E402
from safetensors.torch import save_file as torch_save  # noqa: E402

import qformat  # noqa: E402
from qformat.convert import convert  # noqa: E402
from qformat.errors import QFormatError  # noqa: E402
from qformat.export import export  # noqa: E402
from qformat.export.bitsandbytes import quantization_config  # noqa: E402

from .. import bnb_kernel  # noqa: E402
from ..bnb_kernel import kernel  # noqa: E402,F401  (fixture: the native, then the scalar kernel)
from ..convert.helpers import _stored, bits_equal  # noqa: E402
from ..convert.test_bitsandbytes import _model, _save, _variant_layers  # noqa: E402

TO = "bitsandbytes"
NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread, and torch.compile off (bitsandbytes wraps its reference path in
    torch.compile(dynamic=False), which recompiles per shape; the eager function is the same)."""
    import torch._dynamo

    n, was = torch.get_num_threads(), torch._dynamo.config.disable
    torch.set_num_threads(1)
    torch._dynamo.config.disable = True
    yield
    torch.set_num_threads(n)
    torch._dynamo.config.disable = was


# -- reading an export back through bitsandbytes ------------------------------------------------------
def _np(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _weights(sd: dict[str, torch.Tensor]) -> list[str]:
    return sorted(k.split(".quant_state.")[0] for k in sd if ".quant_state.bitsandbytes__" in k)


def _quant_state(sd: dict[str, torch.Tensor], w: str):
    """What transformers' Bnb4bitDeserialize does: the weight's side tensors, prefix and all,
    through ``QuantState.from_dict``."""
    side = {k: v for k, v in sd.items() if k.startswith(f"{w}.")}
    return BF.QuantState.from_dict(side, device=torch.device("cpu"))


def _reference(packed: torch.Tensor, qs) -> torch.Tensor:
    """``functional.dequantize_4bit`` with its reference computation in place of the kernel."""
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute

    absmax = qs.absmax
    if qs.nested:
        absmax = BF.dequantize_blockwise(qs.absmax, qs.state2) + qs.offset
    return _dequantize_4bit_compute(packed.reshape(-1).view(torch.uint8), absmax.float(), BF.get_4bit_type(qs.quant_type, device="cpu"),
                                    qs.blocksize, tuple(qs.shape), qs.dtype)


def _formula(packed: torch.Tensor, qs) -> tuple[np.ndarray, np.ndarray]:
    """(the reference values as float32, the codes) for bnb_kernel's comparison."""
    b = _np(packed).reshape(-1).view(np.uint8)
    codes = np.stack([b >> 4, b & 15], 1).reshape(-1)[: math.prod(qs.shape)].reshape(tuple(qs.shape))
    return _np(_reference(packed, qs)).astype(np.float32), codes


def assert_decodes(out: Path, want: dict[str, np.ndarray]) -> None:
    """Every exported 4-bit weight, read as transformers reads it, decodes through bitsandbytes
    to ``want`` (qformat's values, in the logical dtype): the reference path bit for bit, the
    CPU kernel running here bit for bit except where it is documented to differ."""
    sd = {}
    for f in sorted(out.glob("*.safetensors")) if out.is_dir() else [out]:
        sd.update(torch_load(str(f)))
    found = bnb_kernel.behaviour()
    assert set(_weights(sd)) == set(want)
    for w in _weights(sd):
        qs = _quant_state(sd, w)
        packed = sd[w]
        assert packed.dtype == torch.uint8 and packed.shape == (-(-math.prod(qs.shape) // 2), 1)
        assert torch.equal(qs.code.view(torch.int32), BF.get_4bit_type(qs.quant_type, device="cpu").view(torch.int32))  # quant_map: bnb's table
        ref = _np(_reference(packed, qs))
        ok, why = bits_equal(ref, want[w])
        assert ok, f"{w}: reference: {why}"
        kern = _np(BF.dequantize_4bit(packed, qs))
        assert kern.dtype == want[w].dtype and kern.shape == want[w].shape
        formula, codes = _formula(packed, qs)
        neg = qs.quant_type == "fp4" and bnb_kernel.fp4_code8_is_negative_zero(tuple(qs.shape), qs.blocksize, qs.dtype)
        bnb_kernel.assert_kernel_agrees(kern.astype(np.float32), formula, codes, qs.quant_type, qs.blocksize, found, neg)


# -- qformat sources ------------------------------------------------------------------------------------
#: (name, shape, dtype, block_size, double_quant): aligned rows, every dtype, a partial tail block,
#: more than 256 blocks (a partial nested block), an odd element count, blocks straddling even
#: rows, a 3-D tensor, bitsandbytes' smallest and largest block sizes.
NF4_CASES = [
    ("a.weight", (16, 128), "float32", 64, False),
    ("b.weight", (16, 128), "float16", 64, True),
    ("c.weight", (24, 256), "bfloat16", 128, True),
    ("d.weight", (6, 33), "float16", 32, False),
    ("e.weight", (75, 256), "bfloat16", 64, True),
    ("f.weight", (5, 7), "float32", 32, True),
    ("g.weight", (10, 96), "float32", 64, False),
    ("h.weight", (2, 4, 96), "float16", 256, True),
    ("i.weight", (3, 4096), "bfloat16", 4096, False),
]


def _nf4_source(tmp: Path, cases=NF4_CASES, folder: bool = True) -> tuple[Path, dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    tensors: dict = {"norm.weight": np.ones(16, np.float16), "embed.weight": rng.standard_normal((8, 16)).astype(np.float32)}
    for name, shape, dtype, bs, dq in cases:
        x = (rng.standard_normal(shape) * rng.uniform(0.01, 2)).astype(NP[dtype])
        tensors[name] = qformat.quantize(x, "nf4", block_size=bs, double_quant=dq)
    if folder:
        src = tmp / "src"
        src.mkdir()
        path = src / "model.safetensors"
        (src / "config.json").write_text(json.dumps({"model_type": "test", "torch_dtype": "float16"}))
    else:
        src = path = tmp / "src.safetensors"
    qformat.save_file(tensors, path)
    return src, {k: v for k, v in qformat.load_file(path).items() if k not in ("norm.weight", "embed.weight")}


def test_qformat_nf4_exports_and_decodes_in_bitsandbytes(tmp_path, kernel):
    src, want = _nf4_source(tmp_path)
    rep = export(src, tmp_path / "out", to=TO)
    assert rep.to_dict()["exact"] and len(rep.results) == len(NF4_CASES) + 2
    assert_decodes(tmp_path / "out", want)
    out = torch_load(str(tmp_path / "out" / "model.safetensors"))
    for name, shape, dtype, bs, dq in NF4_CASES:  # the quant state, as bitsandbytes writes it
        qs = _quant_state(out, name)
        assert (tuple(qs.shape), qs.blocksize, qs.dtype, qs.nested) == (shape, bs, TORCH[dtype], dq)
        again = qs.as_dict(packed=True)[f"quant_state.bitsandbytes__nf4"]
        assert torch.equal(again, out[f"{name}.quant_state.bitsandbytes__nf4"])
    for k in ("norm.weight", "embed.weight"):  # plain tensors keep their bytes
        assert _stored(tmp_path / "out")[k] == _stored(src)[k]
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    qc = cfg["quantization_config"]
    from transformers import BitsAndBytesConfig

    assert qc == BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                    llm_int8_skip_modules=["embed", "lm_head"]).to_dict()
    assert cfg["model_type"] == "test"


def test_single_file_and_odd_padding(tmp_path):
    """A single file gives a single file; an odd nf4 tail is padded with code 7 (0.0), as
    bitsandbytes' quantize_4bit pads it."""
    src, want = _nf4_source(tmp_path, [c for c in NF4_CASES if c[0] == "f.weight"], folder=False)
    export(src, tmp_path / "out.safetensors", to=TO)
    assert_decodes(tmp_path / "out.safetensors", want)
    assert int(torch_load(str(tmp_path / "out.safetensors"))["f.weight"].reshape(-1)[-1]) & 0x0F == 7


def _handmade(nested_bs: int, bias: bool, scale: bool, element: dict) -> qformat.QTensor:
    """An nf4 tensor whose absmax is encoded other than qformat's nf4 scheme does it: nested
    blocks of ``nested_bs``, with or without a nested scale and offset, any 8-bit element."""
    rng = np.random.default_rng(nested_bs)
    shape, bs = (16, 512), 32
    nb = 16 * 512 // bs
    bits = 4 if element.get("bits") == 4 else 8
    comps = {"codes": rng.integers(0, 256, 16 * 512 // 2, dtype=np.uint8), "a": rng.integers(0, 256, nb * bits // 8, dtype=np.uint8)}
    enc: dict = {"shape": [nb], "dtype": "float32",
                 "codes": {"tensor": "a", "element": element, "packing": {"container": 8, "bit_order": "lsb_first", "axis": 0}}}
    if scale:
        comps["s"] = rng.uniform(1e-3, 1e-2, -(-nb // nested_bs)).astype(np.float32)
        enc["scale"] = {"blocks": {"type": "grid", "size": [nested_bs]}, "op": "multiply", "tensor": "s"}
    if bias:
        comps["o"] = np.array(0.3173, np.float32)
        enc["bias"] = {"blocks": {"type": "grid", "size": [None]}, "op": "add", "tensor": "o"}
    desc = {"shape": list(shape), "dtype": "float16",
            "codes": {"tensor": "codes", "element": {"type": "codebook", "bits": 4, "table": "nf4"},
                      "packing": {"container": 8, "bit_order": "msb_first", "axis": None}},
            "scale": {"blocks": {"type": "flat", "size": bs}, "op": "multiply", "encoded": enc}}
    return qformat.QTensor(desc, comps)


@pytest.mark.parametrize("nested_bs,bias,scale,element", [
    (64, True, True, {"type": "int", "bits": 8, "signedness": "twos_complement"}),
    (256, False, True, {"type": "int", "bits": 8, "signedness": "unsigned"}),
    (128, True, False, {"type": "float", "format": "e4m3fn"}),
    (32, False, False, {"type": "int", "bits": 4, "signedness": "unsigned"}),
], ids=["int8-b64", "uint8-no-offset", "e4m3-no-scale", "uint4"])
def test_other_nested_absmax_encodings(tmp_path, nested_bs, bias, scale, element):
    """Any encoded absmax of at most 8-bit codes, a per-block float32 scale and a per-tensor
    offset is bitsandbytes' double quantization: the nested quant map holds the element's
    values; a missing scale is written as 1.0, a missing offset as -0.0 (which adds nothing)."""
    from qformat.checkpoint.source import unchecked

    src = tmp_path / "src.safetensors"
    qformat.save_file({"m.weight": _handmade(nested_bs, bias, scale, element)}, src)
    report = qformat.check(src)
    if not report.ok:  # a NaN absmax (E4M3 code 0x7F without a scale): refused as check refuses it (issue 24) ...
        with pytest.raises(QFormatError) as e:
            export(src, tmp_path / "out.safetensors", to=TO)
        assert e.value.code == report.problems[0].code and not (tmp_path / "out.safetensors").exists()
        with unchecked():  # ... and exported as it is with --no-check
            export(src, tmp_path / "out.safetensors", to=TO)
    else:
        export(src, tmp_path / "out.safetensors", to=TO)
    assert_decodes(tmp_path / "out.safetensors", qformat.load_file(src))
    blob = json.loads(bytes(torch_load(str(tmp_path / "out.safetensors"))["m.weight.quant_state.bitsandbytes__nf4"].numpy()))
    assert blob["nested_blocksize"] == (nested_bs if scale else 256) and (bias or json.dumps(blob["nested_offset"]) == "-0.0")


def test_row_groups_are_flat_blocks(tmp_path):
    """An nf4 codebook scale per group of 64 along rows of 128 is bitsandbytes' flat blocks."""
    rng = np.random.default_rng(1)
    q = qformat.quantize(rng.standard_normal((8, 128)).astype(np.float32), "nf4", block_size=64)
    d = dict(q.descriptor)
    d["scale"] = {"blocks": {"type": "grid", "size": [1, 64]}, "op": "multiply", "tensor": "scale"}
    comps = dict(q.components)
    comps["scale"] = comps["scale"].reshape(8, 2).astype(np.float16)  # any storage that widens exactly
    src = tmp_path / "src.safetensors"
    qformat.save_file({"m.weight": qformat.QTensor(d, comps)}, src)
    export(src, tmp_path / "out.safetensors", to=TO)
    assert_decodes(tmp_path / "out.safetensors", qformat.load_file(src))


# -- round trips from bitsandbytes' own checkpoints ---------------------------------------------------
def _bnb_folder(tmp: Path, layers: list[tuple], quant_type: str, double: bool, dtype: str) -> Path:
    """A folder as transformers saves a bnb 4-bit model: model.safetensors from the layers'
    state dict and config.json with BitsAndBytesConfig.to_dict()."""
    from transformers import BitsAndBytesConfig

    src = tmp / "bnb"
    src.mkdir()
    _save(_model(layers), src / "model.safetensors")
    qc = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant_type, bnb_4bit_use_double_quant=double,
                            bnb_4bit_compute_dtype=TORCH[dtype]).to_dict()
    (src / "config.json").write_text(json.dumps({"model_type": "llama", "quantization_config": qc}, indent=2))
    return src


def _assert_same(src: Path, out: Path) -> None:
    before, after = _stored(src), _stored(out)
    assert sorted(before) == sorted(after)
    for k, (dt, shape, data) in before.items():
        assert after[k][:2] == (dt, shape), f"{k}: {after[k][:2]} != {(dt, shape)}"
        assert after[k][2] == data, f"{k}: bytes differ" + (f": {after[k][2][:200]!r} vs {data[:200]!r}" if "quant_state" in k else "")


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_round_trip_bitsandbytes_checkpoints(tmp_path, quant_type, kernel):
    """bnb checkpoint -> qformat convert (in place, --repack) -> export: every tensor's name,
    dtype, shape and bytes, the quant state JSON included, come back; so does the config; and
    a bnb checkpoint exports directly (read through the converter) to itself."""
    layers = [l for l in _variant_layers(quant_type) if l[6] == "bfloat16"]  # one dtype: the config's compute dtype
    src = _bnb_folder(tmp_path, layers, quant_type, True, "bfloat16")
    qc = json.loads((src / "config.json").read_text())["quantization_config"]
    for mode in ("direct", "in_place", "repack"):
        mid = src
        if mode != "direct":
            mid = tmp_path / f"q-{mode}"
            convert(src, mid, repack=mode == "repack")
        out = tmp_path / f"out-{mode}"
        rep = export(mid, out, to=TO)
        assert rep.to_dict()["exact"], mode
        _assert_same(src, out)
        cfg = json.loads((out / "config.json").read_text())
        assert cfg["quantization_config"] == qc, mode
    want = {k: v for k, v in qformat.load_file(tmp_path / "q-in_place" / "model.safetensors").items() if k.endswith(".weight")}
    assert_decodes(tmp_path / "out-in_place", want)


def test_round_trip_odd_padding(tmp_path):
    """Odd weights come back byte for byte: nf4 (converted with its padding nibble cleared, as
    qformat_codes) with bitsandbytes' padding code 7, fp4 with code 0."""
    model = _model([("model.odd", 5, 7, 32, "nf4", False, "float16"), ("model.even", 4, 64, 64, "nf4", True, "float16"),
                    ("model.odd4", 5, 7, 32, "fp4", True, "float32"), ("model.odd5", 3, 11, 64, "fp4", False, "bfloat16")])
    src = tmp_path / "src.safetensors"
    _save(model, src)
    convert(src, tmp_path / "q.safetensors")
    export(tmp_path / "q.safetensors", tmp_path / "out.safetensors", to=TO)
    _assert_same(src, tmp_path / "out.safetensors")


def test_quant_storage_is_written_as_uint8(tmp_path):
    """A weight saved with quant_storage bfloat16 comes back as the same bytes in uint8."""
    model = _model([("model.l", 8, 64, 64, "nf4", True, "bfloat16")], storage=torch.bfloat16)
    src = tmp_path / "src.safetensors"
    sd = _save(model, src)
    export(src, tmp_path / "out.safetensors", to=TO)
    out = torch_load(str(tmp_path / "out.safetensors"))
    assert out["model.l.weight"].dtype == torch.uint8 and out["model.l.weight"].shape == (256, 1)
    assert bytes(_np(out["model.l.weight"])) == bytes(_np(sd["model.l.weight"]).view(np.uint8))


# -- transformers --------------------------------------------------------------------------------------
def test_tiny_llama_loads_in_transformers(tmp_path):
    """A tiny Llama quantized by qformat (nf4, double quantization) and exported loads with
    ``AutoModelForCausalLM.from_pretrained`` through transformers' bnb 4-bit path on the CPU:
    its Linear4bit weights dequantize to qformat's values and its logits match the same model
    with those values as plain weights.  k_proj and v_proj (2048 values) stay plain under qformat's
    default rule, so the config lists them in ``llm_int8_skip_modules``."""
    pytest.importorskip("accelerate", reason="transformers' bnb 4-bit loader requires accelerate (validate_environment)")
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      vocab_size=256, max_position_embeddings=64, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path / "src")
    qformat.quantize_checkpoint(tmp_path / "src", tmp_path / "q", scheme="nf4", block_size=64, double_quant=True)
    rep = export(tmp_path / "q", tmp_path / "out", to=TO)
    assert rep.to_dict()["exact"]
    qc = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    quantized = {r.name[: -len(".weight")] for r in rep.results if r.kind != "plain"}
    kv = [f"model.layers.{i}.self_attn.{p}_proj" for i in range(2) for p in "kv"]
    assert len(quantized) == 10 and not quantized & set(kv)
    assert qc["bnb_4bit_compute_dtype"] == "bfloat16" and qc["llm_int8_skip_modules"] == sorted(["lm_head", "model.embed_tokens", *kv])

    model, info = AutoModelForCausalLM.from_pretrained(tmp_path / "out", device_map="cpu", output_loading_info=True)
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    values = qformat.load_file(tmp_path / "q" / "model.safetensors")
    lin = {n: m for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    assert set(lin) == quantized
    ref = LlamaForCausalLM(cfg).to(torch.bfloat16)
    ref.load_state_dict({k: torch.from_numpy(np.asarray(v).view(np.int16)).view(torch.bfloat16) if v.dtype == ml_dtypes.bfloat16
                         else torch.from_numpy(np.asarray(v)) for k, v in values.items()})
    for n, m in lin.items():  # the loaded weights are qformat's values (the reference path: no kernel caveat)
        ok, why = bits_equal(_np(_reference(m.weight.data, m.weight.quant_state)), values[f"{n}.weight"])
        assert ok, f"{n}: {why}"
    ids = torch.arange(12).reshape(1, 12)
    with torch.no_grad():
        got, want = model(ids).logits.float(), ref(ids).logits.float()
    print("max |logits - reference|", float((got - want).abs().max()), "of", float(want.abs().max()))
    assert torch.allclose(got, want, atol=2e-2, rtol=2e-2), (got - want).abs().max()


# -- refusals and rounding ------------------------------------------------------------------------------
def _one(tmp: Path, scheme: str, **params) -> Path:
    rng = np.random.default_rng(3)
    src = tmp / "src"
    src.mkdir()
    qformat.save_file({"m.weight": qformat.quantize(rng.standard_normal((8, 256)).astype(np.float16), scheme, **params),
                       "n.weight": np.ones(4, np.float16)}, src / "model.safetensors")
    (src / "config.json").write_text("{}")
    return src


@pytest.mark.parametrize("scheme,params,words", [
    ("int", {"bits": 4, "group_size": 64}, ["int"]),
    ("fp8_e4m3", {}, ["float"]),
    ("nf4", {"block_size": 48}, ["block of 48"]),
    ("codebook", {"values": [-1.0, -0.25, 0.0, 0.5], "block_size": 64}, ["codebook"]),
    ("mxfp4", {}, ["e2m1"]),
])
def test_refused_and_nothing_left(tmp_path, scheme, params, words):
    src = _one(tmp_path, scheme, **params)
    with pytest.raises(QFormatError) as e:
        export(src, tmp_path / "out", to=TO)
    assert e.value.code == "EXPORT_UNMAPPABLE" and e.value.tensor == "m.weight" and TO in str(e.value)
    for w in words:
        assert w in str(e.value), e.value
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_allow_rounding_reencodes_nf4_b64(tmp_path):
    """--allow-rounding re-encodes an int4 tensor as nf4 in blocks of 64 and reports its max abs
    difference and SQNR; bitsandbytes decodes the output to qformat's nf4 encoding of the values."""
    src = _one(tmp_path, "int", bits=4, group_size=64)
    rep = export(src, tmp_path / "out", to=TO, allow_rounding=True)
    (r,) = rep.rounded
    assert r.name == "m.weight" and r.reencoded == "nf4 block_size=64" and r.max_abs > 0 and 5 < r.sqnr_db < 60
    assert rep.to_dict()["rounded"][0]["sqnr_db"] == round(r.sqnr_db, 3)
    x = qformat.load_file(src / "model.safetensors")["m.weight"]
    want = qformat.quantize(x, "nf4", block_size=64).dequantize()
    assert_decodes(tmp_path / "out", {"m.weight": np.asarray(want).astype(np.float16)})


def test_config_mixed_weights():
    """The config names the quant type and double quantization most weights use."""
    from qformat.export.bitsandbytes import Form, Nested

    forms = {"a": Form("fp4", 64, "float16", (4, 64), None), "b": Form("fp4", 64, "float16", (4, 64), Nested(256, True, 0.1)),
             "c": Form("nf4", 64, "bfloat16", (4, 64), Nested(256, True, 0.1))}
    qc = quantization_config(forms, None)
    assert (qc["bnb_4bit_quant_type"], qc["bnb_4bit_use_double_quant"], qc["bnb_4bit_compute_dtype"]) == ("fp4", True, "float32")
