"""The ``torchao`` converter against torchao 0.18 itself (the oracle).

Checkpoints are made the way torchao users make them: ``quantize_(model, config)`` on CPU,
then ``flatten_tensor_state_dict(model.state_dict())`` saved with ``safetensors.torch.save_file``
(torchao/prototype/safetensors).  Expected values: each tensor's own ``dequantize()``.

Two classes have no CPU oracle:

- ``Int4Tensor``: torchao quantizes it with mslk (``int4_row_quantize_zp`` + ``pack_int4``) and
  only multiplies it with mslk's CUDA kernels; neither is installed here.  The test builds the
  tensor with torchao's own constructor from a transcription of mslk's quantizer (FBGEMM
  fbgemm_gpu/experimental/gen_ai/gen_ai/quantize.py; the packer is checked against a
  hand-computed example), saves it with torchao's serializer, and takes as expected values a
  transcription of mslk's reference dequantization (mslk/gemm/triton/int4_gemm.py, the ROCm
  kernel: ``((nibble ^ 8) - 8) * scale + zero`` in float32, then rounded).
- ``NF4Tensor``: torchao cannot save it to safetensors; ``save_nf4`` below writes the on-disk
  form this converter defines (mapping/torchao.md), following torchao's own key and metadata
  convention; expected values are ``get_original_weight()``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchao = pytest.importorskip("torchao")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from torchao.prototype.safetensors.safetensors_support import flatten_tensor_state_dict, unflatten_tensor_state_dict  # noqa: E402
from torchao.quantization import (  # noqa: E402
    Float8WeightOnlyConfig, Int4Tensor, Int8WeightOnlyConfig, IntxWeightOnlyConfig, MappingType, NF4Tensor, PerAxis, PerGroup,
    PerTensor, quantize_, to_nf4,
)

import qformat  # noqa: E402
from qformat.convert import Checkpoint, describe  # noqa: E402
from qformat.convert.torchao import TorchAO  # noqa: E402
from qformat.errors import QFormatError  # noqa: E402

from .helpers import assert_converts, bits_equal  # noqa: E402

DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
NP = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: ml_dtypes.bfloat16}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: on a small shared machine torch's OpenMP threads only contend."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _np(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _save(sd: dict[str, torch.Tensor], path: Path) -> None:
    data, md = flatten_tensor_state_dict(sd)
    save_file({k: v.contiguous() for k, v in data.items()}, str(path), metadata=md)


def _quantized_model(layers: list[tuple[str, int, int, str, object]]) -> torch.nn.Module:
    """Linear layers (name, in, out, dtype, config), each quantized by torchao with its config."""
    g = torch.Generator().manual_seed(0)
    m = torch.nn.Module()
    for name, k, n, dt, _ in layers:
        lin = torch.nn.Linear(k, n)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(n, k, generator=g) * (1 + torch.arange(n)[:, None] % 4) * 0.1)
        m.add_module(name, lin.to(DT[dt]))
    for name, _, _, _, cfg in layers:
        quantize_(m, cfg, filter_fn=lambda mod, fqn, name=name: fqn == name)
    return m


def _check_reload(out: Path, expected: dict[str, np.ndarray]) -> None:
    """The in-place output still loads in torchao (names, bytes and metadata kept)."""
    with safe_open(str(out), "pt") as f:
        md = f.metadata()
    assert "qformat" in md
    tensors, _ = unflatten_tensor_state_dict(load_file(str(out)), {k: v for k, v in md.items() if k != "qformat"})
    for name, want in expected.items():
        if name in tensors:
            assert bits_equal(_np(tensors[name].dequantize()), want)[0], name


AFFINE = [  # IntxUnpackedToInt8Tensor (int1..int8, symmetric or not, per group or axis) and Int8Tensor
    ("int4_sym_g32", 64, 6, "bfloat16", IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32))),
    ("int4_asym_g16", 48, 5, "float16", IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(16), mapping_type=MappingType.ASYMMETRIC)),
    ("int3_axis", 40, 7, "float32", IntxWeightOnlyConfig(weight_dtype=torch.int3, granularity=PerAxis(0))),
    ("int8_g32_asym", 64, 3, "bfloat16", IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerGroup(32), mapping_type=MappingType.ASYMMETRIC)),
    ("int1_g8", 16, 4, "bfloat16", IntxWeightOnlyConfig(weight_dtype=torch.int1, granularity=PerGroup(8), mapping_type=MappingType.ASYMMETRIC)),
    ("i8_row", 64, 6, "bfloat16", Int8WeightOnlyConfig()),
    ("i8_g32", 64, 5, "float32", Int8WeightOnlyConfig(granularity=PerGroup(32))),
    ("i8_row_f16", 40, 3, "float16", Int8WeightOnlyConfig()),
]
FLOAT8 = [
    ("f8_row", 64, 6, "bfloat16", Float8WeightOnlyConfig()),
    ("f8_e5m2", 48, 5, "float32", Float8WeightOnlyConfig(weight_dtype=torch.float8_e5m2)),
    ("f8_tensor", 40, 3, "float16", Float8WeightOnlyConfig(granularity=PerTensor())),
]


@pytest.mark.parametrize("layers,classes", [(AFFINE, {"IntxUnpackedToInt8Tensor", "Int8Tensor"}), (FLOAT8, {"Float8Tensor"})],
                         ids=["intx_int8", "float8"])
def test_quantize_checkpoints(tmp_path, layers, classes):
    model = _quantized_model(layers)
    src = tmp_path / "model.safetensors"
    _save(model.state_dict(), src)
    expected = {f"{name}.weight": _np(getattr(model, name).weight.dequantize()) for name, *_ in layers}
    kinds = {type(getattr(model, name).weight).__name__ for name, *_ in layers}
    assert kinds == classes
    out = assert_converts(src, expected, tmp_path, detect_as="torchao")
    _check_reload(out["in_place"], expected)
    stored = load_file(str(out["in_place"]))
    assert all(f"{name}.bias" in stored for name, *_ in layers)  # plain tensors stay plain


# -- Int4Tensor ------------------------------------------------------------------------------------
def pack_int4(x: torch.Tensor) -> torch.Tensor:
    """mslk/FBGEMM ``pack_int4`` (gen_ai/quantize.py): element 2k in the low nibble, 2k+1 in the high."""
    low, high = x[..., ::2], x[..., 1::2]
    return torch.bitwise_or(torch.bitwise_and(low, 0xF), torch.bitwise_left_shift(high, 4)).contiguous()


def int4_row_quantize_zp(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mslk/FBGEMM ``int4_row_quantize_zp`` (gen_ai/quantize.py), for a 2-D [N, K] input."""
    chunks = torch.split(x.to(torch.float), group_size, dim=-1)
    mx = [c.amax(dim=1, keepdim=True) for c in chunks]
    mn = [c.amin(dim=1, keepdim=True) for c in chunks]
    scales = [(a - b).clamp(min=1e-6) / 15 for a, b in zip(mx, mn)]
    zeros = [b + s * 8 for b, s in zip(mn, scales)]
    out = [c.sub(b).div(s).round().clamp_(0, 15) for c, b, s in zip(chunks, mn, scales)]
    out = torch.cat([(c - 8).to(torch.int8) for c in out], dim=-1)
    return out, torch.cat(scales, dim=-1).t().contiguous(), torch.cat(zeros, dim=-1).t().contiguous()


def test_pack_int4_hand_example():
    """Values [-8, 7, -1, 0]: bytes (low | high << 4) = 0x78, 0x0F, stored as int8 [120, 15]."""
    assert pack_int4(torch.tensor([[-8, 7, -1, 0]], dtype=torch.int8)).tolist() == [[120, 15]]


def _int4(shape: tuple[int, ...], gs: int, dtype: torch.dtype, seed: int, activation_dtype=torch.bfloat16) -> Int4Tensor:
    """An Int4Tensor as torchao's ``Int4Tensor.from_hp`` builds it (scale and zero cast to the weight's dtype)."""
    w = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
    parts = [int4_row_quantize_zp(x, gs) for x in (w if w.ndim == 3 else [w])]
    if activation_dtype == torch.float8_e4m3fn:  # symmetric: zero points all 0 (_int4_symmetric_quantize)
        parts = [(q, s, torch.zeros_like(s)) for q, s, _ in parts]
    q = torch.stack([pack_int4(p[0]) for p in parts]) if w.ndim == 3 else pack_int4(parts[0][0])
    s = torch.stack([p[1] for p in parts]) if w.ndim == 3 else parts[0][1]
    z = torch.stack([p[2] for p in parts]) if w.ndim == 3 else parts[0][2]
    return Int4Tensor(qdata=q, scale=s.to(dtype), zero_point=z.to(dtype), block_size=[1] * (w.ndim - 1) + [gs],
                      shape=w.shape, activation_dtype=activation_dtype)


def int4_reference(t: Int4Tensor) -> np.ndarray:
    """mslk's reference dequantization (gemm/triton/int4_gemm.py): the signed nibble
    ``(n ^ 8) - 8`` times the group's scale plus its zero point, in float32, then the tensor's dtype."""
    b = _np(t.qdata).view(np.uint8)
    nib = np.stack([b & 15, b >> 4], -1).reshape(*b.shape[:-1], -1).astype(np.int32)
    v = ((nib ^ 8) - 8).astype(np.float32)
    gs, k = t.block_size[-1], t.shape[-1]
    grp = np.arange(k) // gs
    s = np.swapaxes(_np(t.scale).astype(np.float32), -1, -2)[..., grp]  # [..., N, K]
    z = np.swapaxes(_np(t.zero_point).astype(np.float32), -1, -2)[..., grp]
    return (v * s + z).astype(NP[t.dtype])


INT4 = [("layers.0.mlp.down_proj.weight", (6, 256), 128, torch.bfloat16, torch.bfloat16),
        ("layers.0.mlp.up_proj.weight", (5, 96), 64, torch.bfloat16, torch.bfloat16),  # a partial last group
        ("layers.1.experts.w1", (2, 4, 64), 32, torch.float16, torch.bfloat16),       # 3-D (MoE) weights
        ("layers.1.mlp.fp8_act.weight", (3, 64), 32, torch.bfloat16, torch.float8_e4m3fn)]


def test_int4_tensor(tmp_path):
    sd: dict[str, torch.Tensor] = {"layers.0.mlp.down_proj.bias": torch.zeros(6)}
    for i, (name, shape, gs, dt, act) in enumerate(INT4):
        sd[name] = _int4(shape, gs, dt, i, act)
    src = tmp_path / "model.safetensors"
    _save(sd, src)
    expected = {name: int4_reference(sd[name]) for name, *_ in INT4}
    out = assert_converts(src, expected, tmp_path, detect_as="torchao")
    # torchao reloads the in-place output
    with safe_open(str(out["in_place"]), "pt") as f:
        md = {k: v for k, v in f.metadata().items() if k != "qformat"}
    back, _ = unflatten_tensor_state_dict(load_file(str(out["in_place"])), md)
    assert all(torch.equal(back[n].qdata, sd[n].qdata) for n, *_ in INT4)


def test_int4_fma_bound(tmp_path):
    """The CUDA (CUTLASS) kernel may evaluate ``v * s + z`` as one fused multiply-add rounded
    straight to bfloat16; qformat rounds the float32 sum, then to bfloat16 (SPEC §10.2).  With a
    16-bit scale ``v * s`` is exact, so the two differ only when the exact sum needs more than
    24 bits and its float32 rounding lands on a bfloat16 tie: by at most one bfloat16 ulp."""
    t = _int4((16, 512), 32, torch.bfloat16, 7)
    src = tmp_path / "m.safetensors"
    _save({"l.weight": t}, src)
    got = qformat.load_file(qformat.convert.convert(src, tmp_path / "o.safetensors").files[0])["l.weight"]
    b = _np(t.qdata).view(np.uint8)
    v = ((np.stack([b & 15, b >> 4], -1).reshape(16, 512).astype(np.int32) ^ 8) - 8).astype(np.float64)
    grp = np.arange(512) // 32
    exact = v * _np(t.scale).astype(np.float64).T[:, grp] + _np(t.zero_point).astype(np.float64).T[:, grp]  # exact in binary64
    g64 = got.astype(np.float64)
    fits = exact.astype(np.float32).astype(np.float64) == exact  # the float32 sum is exact: no double rounding
    assert fits.mean() > 0.5
    # where it fits, one rounding of the exact value (what an FMA into bfloat16 gives) equals qformat's
    assert bits_equal(got[fits], exact[fits].astype(np.float32).astype(ml_dtypes.bfloat16))[0]
    # elsewhere the two roundings differ by at most one bfloat16 ulp from the exact value
    ulp = np.spacing(np.abs(got.astype(np.float32))).astype(np.float64) * 2.0**16
    assert (np.abs(g64 - exact) <= ulp).all()


# -- NF4Tensor -------------------------------------------------------------------------------------------
def save_nf4(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Save NF4Tensors (and plain tensors) in the on-disk form mapping/torchao.md defines: torchao's
    own ``flatten_tensor_state_dict`` convention (keys ``MODULE._PARAM_FIELD``, one metadata JSON
    ``{"_type", "_data", "_tensor_data_names"}`` per tensor, ``tensor_names``), with the inner
    tensors of ``NF4Tensor.__tensor_flatten__`` and its attributes."""
    data: dict[str, torch.Tensor] = {}
    md: dict[str, str] = {"tensor_names": json.dumps(list(tensors))}
    for name, t in tensors.items():
        if isinstance(t, NF4Tensor):
            module, param = name.rsplit(".", 1)
            fields, _ = t.__tensor_flatten__()
            for f in fields:
                data[f"{module}._{param}_{f}"] = getattr(t, f).detach().contiguous()
            md[name] = json.dumps({"_type": "NF4Tensor", "_data": {
                "block_size": t.block_size, "n_blocks": t.n_blocks, "scaler_block_size": t.scaler_block_size,
                "shape": list(t.shape), "dtype": {"_type": "torch.dtype", "_data": str(t.dtype).split(".")[-1]}},
                "_tensor_data_names": fields})
        else:
            data[name] = t.contiguous()
            md[name] = json.dumps({"_type": "Tensor"})
    save_file(data, str(path), metadata=md)


def load_nf4(path: Path, name: str) -> NF4Tensor:
    """The NF4Tensor back from :func:`save_nf4`'s file (shows the form is complete)."""
    import sys

    md = json.loads(safe_open(str(path), "pt").metadata()[name])
    module, param = name.rsplit(".", 1)
    st = load_file(str(path))
    inner = {f: st[f"{module}._{param}_{f}"] for f in md["_tensor_data_names"]}
    d = md["_data"]
    dtype = getattr(torch, d["dtype"]["_data"])
    args = sys.modules[NF4Tensor.__module__].SubclassTensorArgs(
        torch.Size(d["shape"]), tuple(math.prod(d["shape"][i + 1:]) for i in range(len(d["shape"]))), 0, dtype, torch.device("cpu"), False)
    return NF4Tensor.__tensor_unflatten__(inner, {"tensor_meta": args, "block_size": d["block_size"], "n_blocks": d["n_blocks"],
                                                  "scaler_block_size": d["scaler_block_size"]}, None, None)


def test_nf4_tensor(tmp_path):
    g = torch.Generator().manual_seed(3)
    ws = {"model.layers.0.q_proj.weight": ((32, 64), torch.bfloat16, 64, 8),
          "model.layers.0.k_proj.weight": ((16, 128), torch.float32, 32, 16),
          "model.layers.1.v_proj.weight": ((8, 96), torch.float16, 32, 4),
          # every block has the same absmax: torchao's factor is 256 / 0 = Inf (allow_nonfinite_params)
          "model.layers.1.o_proj.weight": ((8, 64), torch.bfloat16, 32, 4)}
    sd: dict[str, torch.Tensor] = {"model.layers.0.q_proj.bias": torch.zeros(32, dtype=torch.bfloat16)}
    for name, (shape, dt, bs, sbs) in ws.items():
        w = torch.randn(shape, generator=g)
        if name.endswith("o_proj.weight"):
            w = w.clamp(-0.5, 0.5)
            w.view(-1, bs)[:, 0] = 1.0
        sd[name] = to_nf4(w.to(dt), block_size=bs, scaler_block_size=sbs)
    src = tmp_path / "model.safetensors"
    save_nf4(sd, src)
    expected = {n: _np(sd[n].get_original_weight()) for n in ws}
    for n in ws:  # the saved form is complete: NF4Tensor rebuilt from it decodes identically, also via .to(dtype)
        assert bits_equal(_np(load_nf4(src, n).get_original_weight()), expected[n])[0]
        assert bits_equal(_np(sd[n].to(sd[n].dtype)), expected[n])[0]
    assert not np.isfinite(_np(sd["model.layers.1.o_proj.weight"].quantization_factor).astype(np.float32)).all()
    out = assert_converts(src, expected, tmp_path, detect_as="torchao")
    d = json.loads(safe_open(str(out["in_place"]), "pt").metadata()["qformat"])["tensors"]
    assert d["model.layers.0.q_proj.weight"]["scale"]["encoded"]["dtype"] == "bfloat16"


# -- errors ----------------------------------------------------------------------------------------------
def _small(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor], dict[str, str]]:
    model = _quantized_model([("l", 32, 4, "bfloat16", IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(16)))])
    data, md = flatten_tensor_state_dict(model.state_dict())
    return tmp_path / "src.safetensors", {k: v.contiguous() for k, v in data.items()}, md


def _refused(path: Path, code: str, *words: str) -> None:
    with pytest.raises(QFormatError) as e:
        describe(path, "torchao")
    assert e.value.code == code, e.value
    for w in words:
        assert w in str(e.value), e.value


@pytest.mark.parametrize("case,code,words", [
    ("unknown class", "CONVERT_UNSUPPORTED", ["'EvilTensor'", "l.weight"]),
    ("refused class", "CONVERT_UNSUPPORTED", ["Int4TilePackedTo4dTensor", "tinygemm"]),
    ("corrupt json", "CONVERT_SOURCE_INVALID", ["not valid JSON", "l.weight"]),
    ("duplicate key", "CONVERT_SOURCE_INVALID", ["repeats", "_type"]),
    ("names not list", "CONVERT_SOURCE_INVALID", ["tensor_names"]),
    ("names missing entry", "CONVERT_SOURCE_INVALID", ["'l.ghost'"]),
    ("missing inner tensor", "CONVERT_SOURCE_INVALID", ["l._weight_scale"]),
    ("unknown attribute", "CONVERT_UNSUPPORTED", ["'__reduce__'"]),
    ("bad dtype", "CONVERT_SOURCE_INVALID", ["target_dtype"]),
    ("block size", "CONVERT_SOURCE_INVALID", ["block_size [1, 12]"]),
])
def test_bad_metadata(tmp_path, case, code, words):
    src, data, md = _small(tmp_path)
    meta = json.loads(md["l.weight"])
    if case == "unknown class":
        meta["_type"] = "EvilTensor"
    elif case == "refused class":
        meta["_type"] = "Int4TilePackedTo4dTensor"
    elif case == "unknown attribute":
        meta["_data"]["__reduce__"] = "os.system"
    elif case == "bad dtype":
        meta["_data"]["target_dtype"] = "int4"
    elif case == "block size":
        meta["_data"]["block_size"] = [1, 12]
    elif case == "missing inner tensor":
        del data["l._weight_scale"]
    md["l.weight"] = json.dumps(meta)
    if case == "corrupt json":
        md["l.weight"] = md["l.weight"][:-2]
    elif case == "duplicate key":
        md["l.weight"] = '{"_type": "Tensor", ' + md["l.weight"][1:]
    elif case == "names not list":
        md["tensor_names"] = '{"l.weight": 1}'
    elif case == "names missing entry":
        md["tensor_names"] = json.dumps(["l.weight", "l.ghost"])
    save_file(data, str(src), metadata=md)
    _refused(src, code, *words)


def test_not_torchao(tmp_path):
    save_file({"w": torch.zeros(2)}, str(tmp_path / "a.safetensors"))
    assert not TorchAO().detect(Checkpoint(tmp_path / "a.safetensors"))
    _refused(tmp_path / "a.safetensors", "CONVERT_SOURCE_INVALID", "tensor_names")


def test_sharded(tmp_path):
    """Shards of one flattened state dict, each repeating the metadata (entries read once)."""
    model = _quantized_model(FLOAT8)
    data, md = flatten_tensor_state_dict(model.state_dict())
    src = tmp_path / "src"
    src.mkdir()
    first = {k: v.contiguous() for k, v in data.items() if k.startswith("f8_row.")}
    rest = {k: v.contiguous() for k, v in data.items() if not k.startswith("f8_row.")}
    save_file(first, str(src / "model-00001-of-00002.safetensors"), metadata=md)
    save_file(rest, str(src / "model-00002-of-00002.safetensors"), metadata=md)
    wm = {k: "model-00001-of-00002.safetensors" for k in first} | {k: "model-00002-of-00002.safetensors" for k in rest}
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    expected = {f"{name}.weight": _np(getattr(model, name).weight.dequantize()) for name, *_ in FLOAT8}
    assert_converts(src / "model.safetensors.index.json", expected, tmp_path, detect_as="torchao")
