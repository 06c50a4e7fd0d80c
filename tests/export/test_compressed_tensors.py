"""Export to compressed-tensors, with the compressed-tensors library (0.20.1) as the oracle.

- Every exact mapping decodes bit for bit through the library's own decompression
  (``BaseCompressor.get_value_from_registry(format).decompress``, which unpacks and calls
  ``quantization.lifecycle.forward.dequantize``), in the library's output dtype, against
  qformat's values in that dtype (the logical dtype when the library dequantizes in it, the
  binary32 step when the scale is written as F32).
- Checkpoints written by the library's own compressor round trip: ``qformat convert`` (in
  place and ``--repack``), export, the same tensor names, dtypes and bytes, and a config that
  gives every module the same format and weights arguments.
- qformat-quantized sources export and load; a tiny Llama loads in transformers through its
  compressed-tensors path on CPU and gives the logits of a model holding qformat's values.
- Refusals leave nothing at the destination; ``allow_rounding`` re-encodes and reports.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("compressed_tensors")

from compressed_tensors.compressors import ModelCompressor  # noqa: E402
from compressed_tensors.compressors.base import BaseCompressor  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import qformat  # noqa: E402
from qformat.convert import convert  # noqa: E402
from qformat.errors import QFormatError  # noqa: E402
from qformat.export import export, open_source  # noqa: E402
from qformat.export.base import Parts  # noqa: E402
from qformat.export.compressed_tensors import pack_int32, unpack_int32  # noqa: E402

from ..convert.helpers import _stored, bits_equal  # noqa: E402
from ..convert.test_compressed_tensors import _int, _preset, build  # noqa: E402

warnings.filterwarnings("ignore")
TO = "compressed-tensors"
_NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def _np(t: "torch.Tensor") -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.contiguous().numpy()


def _resolve(qc: dict, modules: list[str]) -> dict[str, tuple[str, dict]]:
    """module -> (format, weights args as the library parses them) under config ``qc``."""
    import re

    parsed = QuantizationConfig.model_validate(qc)
    out = {}
    for m in modules:
        for gname, scheme in parsed.config_groups.items():
            hit = any(t == m or (t.startswith("re:") and re.match(t[3:], m)) for t in scheme.targets)
            if hit:
                assert m not in out, f"{m} is targeted twice"
                fmt = scheme.format or parsed.format
                out[m] = (fmt, scheme.weights.model_dump(), scheme)
    return out


def library_decode(out: Path) -> dict[str, np.ndarray]:
    """The library's decompression of every quantized module of an exported folder."""
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    from transformers.utils.quantization_config import CompressedTensorsConfig

    ModelCompressor.from_compression_config(CompressedTensorsConfig.from_dict(qc))  # a config transformers and the library accept
    sd = {}
    for f in sorted(out.glob("*.safetensors")):
        sd.update(load_file(str(f)))
    modules = sorted({k.rsplit(".", 1)[0] for k in sd if k.endswith(("weight_scale",))})
    res = _resolve(qc, modules)
    assert set(res) == set(modules), (sorted(res), modules)
    got = {}
    for m, (fmt, _args, scheme) in res.items():
        local = {k[len(m) + 1:]: v for k, v in sd.items() if k.startswith(m + ".")}
        got[f"{m}.weight"] = _np(BaseCompressor.get_value_from_registry(fmt).decompress(local, scheme)["weight"])
    return got


def qformat_values(src: Path, name: str, dtype: np.dtype) -> np.ndarray:
    """qformat's values of ``name`` in ``dtype``: the logical values, or the binary32 step."""
    ck, described = open_source(src)
    from qformat.convert.writer import CombinedSource, items

    desc = next(i.parsed for i in items(ck, described) if i.name == name)
    parts = Parts(desc, CombinedSource(ck, described), name)
    if np.dtype(dtype) == np.dtype(_NP[desc.dtype]):
        return parts.decoded(own_dtype=True).astype(dtype)
    return parts.decoded()


def assert_library_decodes(src: Path, out: Path) -> dict[str, np.ndarray]:
    """The library's values equal qformat's: in the logical dtype when the library returns
    it, else (an F32 scale, or MXFP4's bfloat16 for another dtype) the binary32 step."""
    got = library_decode(out)
    assert got
    for name, lib in got.items():
        want = qformat_values(src, name, lib.dtype)
        ok, why = bits_equal(lib if lib.dtype == want.dtype else lib.astype(np.float32), want)
        assert ok, f"{name}: {why}"
    return got


# -- packing -------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", range(1, 9))
def test_packing_matches_library(bits):
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    rng = np.random.default_rng(bits)
    q = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), (5, 77)).astype(np.int8)
    lib = pack_to_int32(torch.from_numpy(q), bits).numpy()
    ours = pack_int32((q.astype(np.int32) + (1 << (bits - 1))).astype(np.uint8), bits)
    assert ours.dtype == np.int32 and np.array_equal(ours, lib)
    assert np.array_equal(unpack_int32(ours, bits, 77) - (1 << (bits - 1)), q)


# -- qformat-quantized sources ------------------------------------------------------------------
def _source(tmp: Path, dtype: str, tensors: dict[str, tuple[str, dict, tuple[int, int]]], seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    src = tmp / f"src-{dtype}"
    src.mkdir()
    out = {}
    for name, (scheme, params, shape) in tensors.items():
        x = (rng.standard_normal(shape) * 0.05).astype(np.float32).astype(_NP[dtype])
        out[name] = qformat.quantize(x, scheme, **params) if scheme else x
    qformat.save_file(out, src / "model.safetensors")
    (src / "config.json").write_text(json.dumps({"model_type": "test"}))
    return src


_QF = {
    "model.layers.0.self_attn.q_proj.weight": ("int", dict(bits=4, group_size=32), (24, 64)),
    "model.layers.0.self_attn.k_proj.weight": ("int", dict(bits=4, group_size=32, symmetric=False), (16, 64)),
    "model.layers.0.self_attn.v_proj.weight": ("int", dict(bits=4, group_size=128), (16, 256)),
    "model.layers.0.self_attn.o_proj.weight": ("int", dict(bits=4, group_size=128, symmetric=False), (16, 256)),
    "model.layers.0.mlp.up_proj.weight": ("int", dict(bits=8, group_size=None), (20, 48)),
    "model.layers.0.mlp.gate_proj.weight": ("int", dict(bits=3, group_size=None, symmetric=False), (19, 75)),
    "model.layers.0.mlp.down_proj.weight": ("fp8_e4m3", dict(granularity="channel"), (12, 40)),
    "model.layers.1.mlp.down_proj.weight": ("fp8_e4m3", dict(granularity="tensor"), (12, 40)),
    "model.layers.1.mlp.up_proj.weight": ("fp8_e4m3", dict(granularity="block", block_size=[128, 128]), (150, 296)),
    "model.layers.1.mlp.gate_proj.weight": ("mxfp4", {}, (8, 64)),
    # groups along axis 0 are the library's block strategy [32, 1] (zero points unpacked, I8)
    "model.layers.2.mlp.up_proj.weight": ("int", dict(bits=4, group_size=32, axis=0), (64, 16)),
    "model.layers.2.mlp.down_proj.weight": ("int", dict(bits=4, group_size=32, axis=0, symmetric=False), (64, 16)),
    "model.norm.weight": (None, {}, (64,)),
    "lm_head.weight": (None, {}, (8, 64)),
}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_qformat_sources_decode_in_library(tmp_path, dtype):
    """int4 g32/g128 sym and asym, int8 per channel, int3 asym, FP8 channel/tensor/block, MXFP4
    (and NVFP4 for bfloat16): exported, decompressed by the library bit for bit."""
    # scales in the logical dtype (a float32 tensor takes qformat's default float16 scales,
    # widened exactly); FP8's scales are float32, so FP8 maps for float32 tensors only
    tensors = {n: (sc, {**pr, "scale_dtype": dtype} if sc == "int" and dtype != "float32" else pr, sh) for n, (sc, pr, sh) in _QF.items()
               if sc != "fp8_e4m3" or dtype == "float32"}
    if dtype == "bfloat16":
        tensors["model.layers.1.self_attn.q_proj.weight"] = ("nvfp4", {}, (8, 80))
    src = _source(tmp_path, dtype, tensors)
    rep = export(src, tmp_path / "out", to=TO)
    assert rep.to_dict()["exact"], rep.to_dict()
    got = assert_library_decodes(src, tmp_path / "out")
    assert len(got) == len([t for t in tensors.values() if t[0]])
    qc = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    assert qc["ignore"] == ["lm_head"] and json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "test"
    sd = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert sd["model.layers.0.self_attn.q_proj.weight_packed"].dtype == torch.int32
    # the scale is written in the logical dtype
    assert sd["model.layers.0.self_attn.q_proj.weight_scale"].dtype == getattr(torch, dtype)
    assert "model.norm.weight" in sd and "lm_head.weight" in sd


def test_nvfp4_multiplying_global_scale(tmp_path):
    """qformat's NVFP4 multiplies by g; the library divides by G: G is chosen so that
    fp32(s / G) == fp32(s * g) for every E4M3 value, and the library agrees bit for bit."""
    src = _source(tmp_path, "bfloat16", {f"m{i}.weight": ("nvfp4", {}, (8, 48)) for i in range(4)}, seed=3)
    export(src, tmp_path / "out", to=TO)
    assert_library_decodes(src, tmp_path / "out")
    qc = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    assert qc["format"] == "nvfp4-pack-quantized" and qc["config_groups"]["group_0"]["weights"]["strategy"] == "tensor_group"


# -- round trips -----------------------------------------------------------------------------------
def _fp8(strategy, **kw):
    return QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy=strategy, **kw)


_ROUND_TRIPS = {
    "pack": ("pack-quantized", {
        "q_proj": (_int(4, "group", False, 32), 16, 96),
        "k_proj": (_int(4, "channel", True), 12, 64),
        "v_proj": (_int(8, "channel", True), 12, 40),
        "o_proj": (_int(3, "group", False, 32), 13, 64),
        "w8g": (_int(8, "group", False, 16), 9, 48),
        "w4t": (_int(4, "tensor", False), 5, 40),
    }),
    "int8": ("int-quantized", {"q_proj": (_int(8, "channel", True), 7, 33), "o_proj": (_int(8, "group", False, 16), 5, 48)}),
    "nvfp4": ("nvfp4-pack-quantized", {"q_proj": (_preset("NVFP4A16"), 24, 80), "o_proj": (_preset("NVFP4A16"), 7, 32)}),
    "mxfp4": ("mxfp4-pack-quantized", {"q_proj": (_preset("MXFP4A16"), 6, 96)}),
    "fp8": ("float-quantized", {"q_proj": (_fp8("channel"), 13, 40), "k_proj": (_fp8("tensor"), 5, 24),
                                "v_proj": (_fp8("block", block_structure=[128, 128]), 150, 296)}),
}


@pytest.mark.parametrize("case", list(_ROUND_TRIPS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_round_trip(tmp_path, case, dtype):
    fmt, layers = _ROUND_TRIPS[case]
    if dtype == torch.float16 and fmt.endswith("fp4-pack-quantized"):
        pytest.skip("the library's FP4 formats are bfloat16")
    src, expected = build(tmp_path, fmt, layers, dtype=dtype, seed=11)
    before = _stored(src)
    src_qc = json.loads((src / "config.json").read_text())["quantization_config"]
    modules = sorted({k.rsplit(".", 1)[0] for k in before if k.endswith("weight_scale")})
    for mode in ("direct", "in_place", "repack"):
        mid = src if mode == "direct" else tmp_path / f"qf-{mode}"
        if mode != "direct":
            convert(src, mid, repack=(mode == "repack"))
        out = tmp_path / f"out-{mode}"
        rep = export(mid, out, to=TO)
        assert rep.to_dict()["exact"]
        got = library_decode(out)
        for name, want in expected.items():
            ok, why = bits_equal(got[name], want)
            assert ok, f"{mode}: {name}: {why}"
        if mode == "repack" and fmt == "int-quantized":
            # A repacked folder is qformat's own: its config.json no longer names compressed-tensors
            # (tests/convert/test_repack_self_contained.py), so nothing asks for int-quantized and the
            # export writes its default for int8, pack-quantized: the same values (above), other tensors.
            qc = json.loads((out / "config.json").read_text())["quantization_config"]
            assert {g["format"] for g in qc["config_groups"].values()} == {"pack-quantized"}
            continue
        after = _stored(out)
        assert sorted(after) == sorted(before), (mode, sorted(set(after) ^ set(before)))
        for name, (dt, shape, data) in before.items():
            assert after[name][:2] == (dt, shape), (mode, name, after[name][:2], dt, shape)
            assert after[name][2] == data, f"{mode}: the bytes of {name} differ"
        qc = json.loads((out / "config.json").read_text())["quantization_config"]
        a, b = _resolve(src_qc, modules), _resolve(qc, modules)
        assert {m: v[:2] for m, v in a.items()} == {m: v[:2] for m, v in b.items()}, mode
        assert qc["ignore"] == ["lm_head"]


# -- transformers ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,scheme,params", [
    (torch.bfloat16, "int", dict(bits=4, group_size=32, scale_dtype="bfloat16")),
    pytest.param(torch.bfloat16, "int", dict(bits=4, group_size=32, symmetric=False, scale_dtype="bfloat16"), marks=pytest.mark.xfail(
        strict=True, reason="upstream: transformers builds the module with PackedQuantizationCompressor.compress on the meta "
        "device, which leaves weight_zero_point unpacked [N, G], while the library's writer packs it to [ceil(N*b/32), G]; "
        "transformers then re-initialises the zero points (the exported zero points have the shape and bytes the library writes: test_round_trip)")),
    (torch.bfloat16, "int", dict(bits=8, group_size=None, scale_dtype="bfloat16")),
    (torch.float32, "fp8_e4m3", {}),
], ids=["int4g32", "int4g32asym", "int8", "fp8-f32"])
def test_tiny_llama_transformers(tmp_path, dtype, scheme, params):
    """A random tiny Llama, quantized by qformat, exported and loaded by transformers'
    compressed-tensors path on CPU (it keeps the weights compressed and decompresses them
    with the library on the first forward pass): the logits, and the decompressed weights,
    equal those of the same model holding qformat's decoded weights."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(dtype)
    model.save_pretrained(tmp_path / "plain")
    qformat.quantize_checkpoint(tmp_path / "plain", tmp_path / "q", scheme=scheme, **params)
    export(tmp_path / "q", tmp_path / "ct", to=TO)
    ct_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ct")
    # the reference goes through the same loading path (buffers such as RoPE's inv_freq included)
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "plain")
    sd = {}
    for f in sorted((tmp_path / "q").glob("*.safetensors")):
        for k, v in qformat.load_file(f).items():
            sd[k] = torch.from_numpy(np.asarray(v).view(np.int16)).view(torch.bfloat16) if v.dtype == ml_dtypes.bfloat16 else torch.from_numpy(np.asarray(v))
    missing, unexpected = ref.load_state_dict(sd, strict=False)
    assert not unexpected and all("rotary" in m or m == "lm_head.weight" for m in missing), (missing, unexpected)
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    quantized = [n for n, _ in ct_model.named_parameters() if n.endswith("weight_packed") or n.endswith("weight_scale")]
    assert quantized
    with torch.no_grad():
        a = ct_model(ids).logits
        b = ref(ids).logits
        assert a.dtype == dtype
        for n, p_ in ct_model.named_parameters():
            if n.endswith("proj.weight"):
                ok, why = bits_equal(_np(p_.detach()), _np(ref.get_parameter(n).detach()))
                assert ok, f"{n}: {why}"
    assert torch.equal(a, b)


# -- refusals and rounding -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,scheme,params,shape,why", [
    ("float32", "int", dict(bits=4, group_size=32), (8, 48), "do not divide"),
    ("float32", "nf4", {}, (8, 64), "codebook"),
    ("float32", "nvfp4", {}, (8, 64), "bfloat16"),
    ("float32", "int", dict(bits=4, group_size=32), (2, 8, 64), "rank 3"),
    ("bfloat16", "int", dict(bits=4, group_size=32, scale_dtype="float16"), (8, 64), "stored as F16"),
    ("bfloat16", "fp8_e4m3", {}, (8, 64), "stored as F32"),
    ("float16", "int", dict(bits=4, group_size=32, scale_dtype="bfloat16"), (8, 64), "stored as BF16"),
])
def test_refusal_leaves_nothing(tmp_path, dtype, scheme, params, shape, why):
    src = _source(tmp_path, dtype, {"a.weight": (scheme, params, shape), "b.weight": ("int", dict(bits=4, group_size=32, scale_dtype=dtype), (8, 64))})
    with pytest.raises(QFormatError) as e:
        export(src, tmp_path / "out", to=TO)
    assert e.value.code == "EXPORT_UNMAPPABLE" and "a.weight" in str(e.value) and why in str(e.value), str(e.value)
    assert not (tmp_path / "out").exists()


def test_allow_rounding_reencodes(tmp_path):
    """--allow-rounding: NF4, int4 groups that do not divide the row and float16 scales of a
    bfloat16 tensor are re-encoded as
    symmetric int (groups of 32 where they divide the row, else per channel) with scales in
    the source's dtype, and reported with their max abs difference and SQNR; the library
    then decodes the written tensors to qformat's values of the re-encoding."""
    src = _source(tmp_path, "bfloat16", {"a.weight": ("nf4", {}, (8, 64)), "b.weight": ("int", dict(bits=4, group_size=32), (8, 48)),
                                         "c.weight": ("int", dict(bits=4, group_size=32, scale_dtype="bfloat16"), (8, 64)),
                                         "d.weight": ("int", dict(bits=4, group_size=32, scale_dtype="float16"), (8, 64))})
    rep = export(src, tmp_path / "out", to=TO, allow_rounding=True).to_dict()
    assert not rep["exact"]
    rounded = {r["name"]: r for r in rep["rounded"]}
    assert sorted(rounded) == ["a.weight", "b.weight", "d.weight"]
    assert rounded["a.weight"]["reencoded"] == "int bits=4 group_size=32 scale_dtype=bfloat16 symmetric=True"
    assert rounded["b.weight"]["reencoded"] == "int bits=4 group_size=None scale_dtype=bfloat16 symmetric=True"
    # float16 scales of a bfloat16 tensor: the same int4 g32, re-encoded with bfloat16 scales
    assert rounded["d.weight"]["reencoded"] == "int bits=4 group_size=32 scale_dtype=bfloat16 symmetric=True"
    for r in rounded.values():
        assert 0 < r["max_abs_diff"] < 0.05 and r["sqnr_db"] > 10
    qc = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    assert sorted(t for g in qc["config_groups"].values() for t in g["targets"]) == ["a", "b", "c", "d"]
    got = library_decode(tmp_path / "out")
    ok, why = bits_equal(got["c.weight"], qformat_values(src, "c.weight", got["c.weight"].dtype))
    assert ok, why


def test_not_exact_zero_point_out_of_range(tmp_path):
    """A zero point outside the library's signed b-bit range cannot be packed: EXPORT_NOT_EXACT."""
    src = tmp_path / "src"
    src.mkdir()
    q = qformat.quantize(np.linspace(-1, 1, 8 * 64, dtype=np.float32).reshape(8, 64), "int", bits=4, group_size=32, symmetric=False)
    comps = dict(q.components)
    comps["zero"] = np.full_like(comps["zero"], 20)  # codes are 4-bit; a zero point of 20 is legal in qformat
    qformat.save_file({"a.weight": qformat.QTensor(q.descriptor, comps)}, src / "model.safetensors")
    with pytest.raises(QFormatError) as e:
        export(src, tmp_path / "out", to=TO)
    assert e.value.code == "EXPORT_NOT_EXACT"
    assert not (tmp_path / "out").exists()
