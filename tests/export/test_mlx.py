"""Export to MLX / mlx-lm, with MLX itself (mlx[cpu]) as the oracle.

Every exported checkpoint is read back with ``mx.load`` and decoded with ``mx.dequantize``
using the group_size / bits / mode that the written config.json gives each layer (mlx-lm's
convention: defaults plus per-layer entries), and compared bit for bit with qformat's
binary32 values of the source.  The target's own NumPy decoding (``qformat.export.mlx``) is
compared with ``mx.dequantize`` too, including where it is not exact against qformat (float16
scales kept with ``scale_dtype="source"``, E8M0 code 255).  Round trips start from checkpoints
made as mlx-lm makes them (``nn.quantize`` + ``mx.save_safetensors`` + config.json, the
helpers of tests/convert/test_mlx.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

import qformat  # noqa: E402
from qformat.convert import convert  # noqa: E402
from qformat.convert.writer import items  # noqa: E402
from qformat.errors import QFormatError  # noqa: E402
from qformat.export import export, open_source  # noqa: E402
from qformat.export.base import Parts  # noqa: E402
from qformat.export.mlx import affine_decode, float_decode, global_scale_for, mlx_config, pack, unpack  # noqa: E402

from ..convert.helpers import bits_equal  # noqa: E402
from ..convert.test_mlx import AFFINE, FLOAT, _checkpoint, _np  # noqa: E402

ND = {"F16": np.float16, "BF16": ml_dtypes.bfloat16, "F32": np.float32, "U8": np.uint8, "U32": np.uint32}


# -- helpers --------------------------------------------------------------------------------------
def qformat_values(src: Path) -> dict[str, np.ndarray]:
    """qformat's binary32 values (SPEC §10 before the logical dtype) of every quantized tensor."""
    ck, described = open_source(src)
    from qformat.convert.writer import CombinedSource

    source = CombinedSource(ck, described)
    return {it.name: Parts(it.parsed, source, it.name).decoded() for it in items(ck, described) if it.parsed is not None}


def layer_params(cfg: dict, layer: str) -> dict:
    q = cfg["quantization"]
    p = {k: q[k] for k in ("group_size", "bits", "mode") if k in q}
    if isinstance(q.get(layer), dict):
        p.update({k: q[layer][k] for k in ("group_size", "bits", "mode") if k in q[layer]})
    p.setdefault("mode", "affine")
    return p


def mlx_values(out: Path) -> dict[str, tuple[np.ndarray, dict]]:
    """Every quantized layer of an exported folder, decoded by mx.dequantize with its config."""
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"] == cfg["quantization"]
    arrays: dict = {}
    for f in sorted(out.glob("*.safetensors")):
        arrays.update(mx.load(str(f)))
    res = {}
    for n in arrays:
        if not n.endswith(".scales"):
            continue
        layer = n[: -len(".scales")]
        p = layer_params(cfg, layer)
        g = arrays.get(f"{layer}.global_scale")
        kw = {"global_scale": g} if g is not None else {}
        y = mx.dequantize(arrays[f"{layer}.weight"], arrays[n], arrays.get(f"{layer}.biases"),
                          group_size=p["group_size"], bits=p["bits"], mode=p["mode"], **kw)
        res[f"{layer}.weight"] = (_np(y), p)
    return res


def raw_tensors(path: Path) -> dict[str, tuple[str, tuple, bytes]]:
    """(dtype, shape, bytes) of every tensor of a safetensors file or folder (plain header read)."""
    out = {}
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    for f in files:
        data = f.read_bytes()
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8: 8 + n])
        base = 8 + n
        for name, e in header.items():
            if name == "__metadata__":
                continue
            a, b = e["data_offsets"]
            out[name] = (e["dtype"], tuple(e["shape"]), data[base + a: base + b])
    return out


def metadata(path: Path) -> dict:
    f = sorted(path.glob("*.safetensors"))[0] if path.is_dir() else path
    data = f.read_bytes()
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8: 8 + n]).get("__metadata__")


def assert_mlx_matches(src: Path, out: Path, report) -> None:  # type: ignore[no-untyped-def]
    """Every layer exported exact decodes through mx.dequantize to qformat's binary32 values."""
    want = qformat_values(src)
    got = mlx_values(out)
    exact = {r.name for r in report.results if r.exact and r.kind != "plain"}
    assert exact and exact <= set(got), (exact, sorted(got))
    for name in exact:
        y, p = got[name]
        ok, why = bits_equal(y.astype(np.float32), want[name])
        assert ok, f"{name} ({p}): {why}"
        # qformat's values in MLX's dtype are MLX's values
        ok, why = bits_equal(y, want[name].astype(y.dtype))
        assert ok, f"{name}: {why}"
    assert metadata(out) == {"format": "mlx"}


def _folder(tmp: Path, tensors: dict, config: dict | None = None) -> Path:
    src = tmp / "src"
    src.mkdir()
    qformat.save_file(tensors, src / "model.safetensors")
    (src / "config.json").write_text(json.dumps(config or {"model_type": "test"}))
    return src


RNG = np.random.default_rng(0)
X = RNG.standard_normal((8, 256)).astype(np.float32) * 3


# -- (a) + (c): qformat sources decode through MLX bit for bit ------------------------------------
SOURCES = {
    "int4-g32-asym-bf16": ("int", {"bits": 4, "group_size": 32, "symmetric": False, "scale_dtype": "bfloat16"}, "bfloat16"),
    "int4-g64-asym-f16": ("int", {"bits": 4, "group_size": 64, "symmetric": False, "scale_dtype": "float16"}, "float16"),
    "int4-g64-asym-f32-dtype": ("int", {"bits": 4, "group_size": 64, "symmetric": False, "scale_dtype": "float16"}, "float32"),
    "int3-g128-asym": ("int", {"bits": 3, "group_size": 128, "symmetric": False, "scale_dtype": "bfloat16"}, "bfloat16"),
    "int8-g256-asym": ("int", {"bits": 8, "group_size": 256, "symmetric": False, "scale_dtype": "float16"}, "float16"),  # 2 MLX groups of 128
    "int6-perchannel-asym": ("int", {"bits": 6, "group_size": None, "symmetric": False, "scale_dtype": "float16"}, "float16"),
    "int2-g32-asym": ("int", {"bits": 2, "group_size": 32, "symmetric": False, "scale_dtype": "float16"}, "float16"),
    "int5-g64-asym": ("int", {"bits": 5, "group_size": 64, "symmetric": False, "scale_dtype": "bfloat16"}, "bfloat16"),
    "mxfp4": ("mxfp4", {}, "bfloat16"),
    "mxfp4-g64": ("mxfp4", {"block_size": 64}, "bfloat16"),  # splits into MLX's groups of 32
    "mxfp8": ("mxfp8_e4m3", {}, "bfloat16"),
    "nvfp4": ("nvfp4", {}, "float32"),
}


@pytest.mark.parametrize("key", list(SOURCES))
def test_qformat_source_decodes_through_mlx(key: str, tmp_path: Path) -> None:
    scheme, params, dtype = SOURCES[key]
    x = X.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype))
    src = _folder(tmp_path, {"model.layers.0.mlp.down_proj.weight": qformat.quantize(x, scheme, dtype=dtype, **params),
                             "model.layers.1.mlp.up_proj.weight": qformat.quantize(x[:4], scheme, dtype=dtype, **params),
                             "model.norm.weight": np.ones(256, np.float16)})
    out = tmp_path / "out"
    r = export(src, out, to="mlx")
    assert all(t.exact for t in r.results), [t.to_dict() for t in r.results]
    assert_mlx_matches(src, out, r)
    st = raw_tensors(out)
    assert st["model.norm.weight"][0] == "F16" and st["model.norm.weight"][2] == np.ones(256, np.float16).tobytes()
    layer = "model.layers.0.mlp.down_proj"
    assert st[f"{layer}.weight"][0] == "U32"
    if scheme == "int":
        assert st[f"{layer}.scales"][0] == "F32" and st[f"{layer}.biases"][0] == "F32"
    else:
        assert st[f"{layer}.scales"][0] == "U8" and f"{layer}.biases" not in st
    assert (f"{layer}.global_scale" in st) == (scheme == "nvfp4")


def test_symmetric_int_is_exact_with_positive_scales_and_differs_in_the_sign_of_zero_otherwise(tmp_path: Path) -> None:
    # q' = c + 2^(b-1), b = -2^(b-1) * s: exact, except that MLX's s*q' + b gives +0 where
    # qformat's c * s gives -0 (code 0 under a negative scale).
    neg = -np.abs(X)  # every group's extreme is negative: Q4_0's scale sign is positive
    src = _folder(tmp_path, {"a.weight": qformat.quantize(neg, "int", bits=4, group_size=32, scale_dtype="float16", dtype="float32"),
                             "b.weight": qformat.quantize(neg, "int", bits=8, group_size=64, scale_dtype="bfloat16", dtype="float32")})
    r = export(src, tmp_path / "out", to="mlx")
    assert all(t.exact for t in r.results)
    assert_mlx_matches(src, tmp_path / "out", r)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    q = qformat.quantize(X, "int", bits=4, group_size=32, scale_dtype="float16", dtype="float32")
    assert (np.asarray(q.components["scale"]) < 0).any()
    src2 = _folder(mixed, {"a.weight": q})
    with pytest.raises(QFormatError) as e:
        export(src2, mixed / "out", to="mlx")
    assert e.value.code == "EXPORT_NOT_EXACT" and not (mixed / "out").exists()
    r = export(src2, mixed / "out", to="mlx", allow_rounding=True)
    (t,) = r.rounded
    assert t.max_abs == 0.0 and not t.reencoded  # only the sign of zero differs
    got = mlx_values(mixed / "out")["a.weight"][0]
    want = qformat_values(src2)["a.weight"]
    assert np.array_equal(got, want) and not bits_equal(got, want)[0]


# -- the NumPy model of MLX's decoding is MLX's decoding ------------------------------------------
@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32])
@pytest.mark.parametrize("bits,group", [(1, 32), (2, 64), (3, 32), (4, 64), (5, 128), (6, 32), (8, 64)])
def test_affine_decode_is_mx_dequantize(dtype, bits: int, group: int) -> None:  # type: ignore[no-untyped-def]
    w, s, b = mx.quantize(mx.array(X[:4]).astype(dtype), group_size=group, bits=bits)
    ref = _np(mx.dequantize(w, s, b, group_size=group, bits=bits)).astype(np.float32)
    got = affine_decode(np.asarray(w), _np(s), _np(b), bits, group)
    ok, why = bits_equal(got, ref)
    assert ok, why
    codes = unpack(np.asarray(w), bits, X.shape[1])
    assert np.array_equal(pack(codes, bits), np.asarray(w))


@pytest.mark.parametrize("mode", ["mxfp4", "mxfp8", "nvfp4"])
def test_float_decode_is_mx_dequantize(mode: str) -> None:
    # every scale code (E8M0 255 is +Inf in MLX) against every element code
    bits, group = (8, 32) if mode == "mxfp8" else (4, 16 if mode == "nvfp4" else 32)
    codes = np.tile(np.arange(1 << bits, dtype=np.uint8), (256, 2 * group * 16 >> bits))[:, : 2 * group]
    w = pack(codes, bits)
    sc = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 2, axis=1)
    ref = _np(mx.dequantize(mx.array(w), mx.array(sc), group_size=group, bits=bits, mode=mode)).astype(np.float32)
    ok, why = bits_equal(float_decode(mode, w, sc), ref)
    assert ok, why
    if mode == "nvfp4":
        for G in (np.float32(1.0), np.float32(37.25), np.float32(3e-3)):
            ref = _np(mx.dequantize(mx.array(w), mx.array(sc), mode=mode, global_scale=mx.array(G))).astype(np.float32)
            ok, why = bits_equal(float_decode(mode, w, sc, G), ref)
            assert ok, why


def test_nvfp4_global_scale_search() -> None:
    rng = np.random.default_rng(3)
    found = 0
    for g in rng.uniform(1e-4, 1.0, 300).astype(np.float32):
        G = global_scale_for(g)
        found += bool(np.float32(G) / np.float32(2688) == g)
    assert found > 200  # most multipliers have an MLX global scale; the rest are refused by the check


# -- (b): round trips of mlx-lm checkpoints -------------------------------------------------------
def _affine_source(tmp: Path, dtype: str) -> Path:
    defaults = {"group_size": 64, "bits": 4, "mode": "affine"}
    src, _ = _checkpoint(tmp, AFFINE, dtype, defaults, embed=True)
    return src


def _float_source(tmp: Path) -> Path:
    mx.random.seed(1)
    x = (mx.random.normal((4, 48)) * 3).astype(mx.bfloat16)
    g = mx.array(float(mx.abs(x.astype(mx.float32)).max().item()), dtype=mx.float32)
    gw, gscales = mx.quantize(x, mode="nvfp4", global_scale=g)
    extra = {"glob.weight": gw, "glob.scales": gscales, "glob.global_scale": g}
    src, _ = _checkpoint(tmp, FLOAT, "bfloat16", {"group_size": 32, "bits": 4, "mode": "mxfp4"}, extra=extra)
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization"]["glob"] = {"mode": "nvfp4", "group_size": 16, "bits": 4}
    cfg["quantization_config"] = cfg["quantization"]
    (src / "config.json").write_text(json.dumps(cfg))
    return src


def _assert_same_checkpoint(a: Path, b: Path) -> None:
    ta, tb = raw_tensors(a), raw_tensors(b)
    assert sorted(ta) == sorted(tb)
    for n in ta:
        assert ta[n] == tb[n], f"{n}: {ta[n][:2]} vs {tb[n][:2]}"
    ca, cb = json.loads((a / "config.json").read_text()), json.loads((b / "config.json").read_text())
    assert ca["quantization"] == cb["quantization"] and cb["quantization_config"] == cb["quantization"]


@pytest.mark.parametrize("kind", ["affine-float32", "float-modes"])
def test_round_trip_is_byte_identical(kind: str, tmp_path: Path) -> None:
    src = _affine_source(tmp_path, "float32") if kind == "affine-float32" else _float_source(tmp_path)
    for how in ("direct", "in_place", "repack"):
        mid = src
        if how != "direct":
            mid = tmp_path / f"q-{how}"
            convert(src, mid, repack=(how == "repack"))
        out = tmp_path / f"out-{how}"
        r = export(mid, out, to="mlx")
        assert all(t.exact for t in r.results), [t.to_dict() for t in r.rounded]
        _assert_same_checkpoint(src, out)
        assert_mlx_matches(mid, out, r)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_round_trip_of_narrow_scales(dtype: str, tmp_path: Path) -> None:
    """float16/bfloat16 scales: by default written in float32, where MLX's arithmetic is
    qformat's (exact); ``scale_dtype="source"`` keeps the bytes, and MLX's rounding of s*q to
    the scales' dtype makes them inexact against qformat (reported with --allow-rounding)."""
    src = _affine_source(tmp_path, dtype)
    mid = tmp_path / "q"
    convert(src, mid)
    out = tmp_path / "out"
    r = export(mid, out, to="mlx")
    assert all(t.exact for t in r.results)
    assert_mlx_matches(mid, out, r)
    t_src, t_out = raw_tensors(src), raw_tensors(out)
    assert sorted(t_src) == sorted(t_out)
    for n, (dt, shape, data) in t_src.items():
        if n.endswith((".scales", ".biases")):
            assert t_out[n][:2] == ("F32", shape)
            assert np.array_equal(np.frombuffer(t_out[n][2], np.float32), np.frombuffer(data, ND[dt]).astype(np.float32))
        else:
            assert t_out[n] == (dt, shape, data), n
    kept = tmp_path / "kept"
    with pytest.raises(QFormatError) as e:
        export(mid, kept, to="mlx", scale_dtype="source")
    assert e.value.code == "EXPORT_NOT_EXACT" and not kept.exists()
    r = export(mid, kept, to="mlx", scale_dtype="source", allow_rounding=True)
    _assert_same_checkpoint(src, kept)
    assert r.rounded and all(0 < t.max_abs < 0.05 and not t.reencoded for t in r.rounded)
    # the target's NumPy decoding of the kept bytes is MLX's
    arrays = {n: _np(a) for n, a in mx.load(str(kept / "model.safetensors")).items()}
    for layer, (y, p) in mlx_values(kept).items():
        base = layer[: -len(".weight")]
        got = affine_decode(np.asarray(arrays[layer]), arrays[f"{base}.scales"], arrays[f"{base}.biases"], p["bits"], p["group_size"])
        ok, why = bits_equal(got, y.astype(np.float32))
        assert ok, f"{layer}: {why}"


# -- (d): refusals and --allow-rounding ------------------------------------------------------------
REFUSED = {
    "nf4 codebook": (("nf4", {"block_size": 64}), "codebook"),
    "7-bit codes": (("int", {"bits": 7, "group_size": 32}), "7-bit"),
    "groups of 16": (("int", {"bits": 4, "group_size": 16, "symmetric": False}), "groups of [16]"),
    "groups down the columns": (("int", {"bits": 4, "group_size": 32, "axis": 0}), "last axis"),
    "fp8 per tensor": (("fp8_e4m3", {}), "e4m3fn elements"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refusals_leave_nothing(case: str, tmp_path: Path) -> None:
    (scheme, params), text = REFUSED[case]
    src = _folder(tmp_path, {"model.norm.weight": np.ones(256, np.float32),
                             "model.layers.0.mlp.down_proj.weight": qformat.quantize(X.astype(np.float16), scheme, **params)})
    with pytest.raises(QFormatError) as e:
        export(src, tmp_path / "out", to="mlx")
    assert e.value.code == "EXPORT_UNMAPPABLE" and e.value.tensor == "model.layers.0.mlp.down_proj.weight"
    assert text in str(e.value) and "mlx" in str(e.value)
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_a_quantized_tensor_must_be_named_layer_weight(tmp_path: Path) -> None:
    src = _folder(tmp_path, {"emb": qformat.quantize(X, "int", bits=4, group_size=64, symmetric=False)})
    with pytest.raises(QFormatError) as e:
        export(src, tmp_path / "out", to="mlx", allow_rounding=True)
    assert e.value.code == "EXPORT_UNMAPPABLE" and "'.weight'" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_allow_rounding_reencodes_affine_4bit(tmp_path: Path) -> None:
    x16 = X.astype(np.float16)
    src = _folder(tmp_path, {"a.weight": qformat.quantize(x16, "nf4", block_size=64),
                             "b.weight": qformat.quantize(x16, "int", bits=4, group_size=64, symmetric=False, scale_dtype="float16")})
    r = export(src, tmp_path / "out", to="mlx", allow_rounding=True)
    (t,) = r.rounded
    assert t.name == "a.weight" and t.reencoded and "symmetric=False" in t.reencoded and "group_size=64" in t.reencoded
    assert 0 < t.max_abs < 1 and 10 < t.sqnr_db < 40
    got = mlx_values(tmp_path / "out")
    assert got["a.weight"][1] == {"group_size": 64, "bits": 4, "mode": "affine"}
    # MLX decodes the re-encoding: compare with the source's values to the reported accuracy
    want = qformat_values(src)["a.weight"].astype(np.float64)
    y = got["a.weight"][0].astype(np.float64)
    assert np.max(np.abs(y - want)) == pytest.approx(t.max_abs)
    assert_mlx_matches(src, tmp_path / "out", r)  # b.weight: exact


def test_cli_export_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from qformat.cli import main

    src = _folder(tmp_path, {"a.weight": qformat.quantize(X.astype(np.float16), "int", bits=4, group_size=64, symmetric=False)})
    assert main(["export", str(src), str(tmp_path / "out"), "--to", "mlx", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["exact"] and rep["kinds"] == {"affine b4 g64": 1}


# -- config.json --------------------------------------------------------------------------------
def test_config_defaults_and_per_layer_entries() -> None:
    a = {"group_size": 64, "bits": 4, "mode": "affine"}
    b = {"group_size": 32, "bits": 4, "mode": "mxfp4"}
    cfg = mlx_config({"model_type": "llama", "quantization_config": {"quant_method": "gptq"}},
                     {"l.0": a, "l.1": a, "l.2": b})
    assert cfg["quantization"] == {**a, "l.2": b} == cfg["quantization_config"] and cfg["model_type"] == "llama"
    # the source's defaults and entries are kept where they hold; stale ones are dropped
    old = {"group_size": 32, "bits": 4, "mode": "mxfp4", "l.0": a, "l.9": False, "l.8": a, "l.2": {"bits": 8}}
    cfg = mlx_config({"quantization": old}, {"l.0": a, "l.1": a, "l.2": b})
    assert cfg["quantization"] == {"group_size": 32, "bits": 4, "mode": "mxfp4", "l.0": a, "l.1": a, "l.9": False}
    assert mlx_config({"quantization": old, "x": 1}, {}) == {"x": 1}


# -- (e): mlx-lm's loader ------------------------------------------------------------------------
def test_mlx_lm_loads_the_export(tmp_path: Path) -> None:
    """mlx-lm's load_model builds a tiny llama from the exported folder (per-layer entries
    included) and its forward pass matches the dequantized weights' (skipped without mlx_lm)."""
    utils = pytest.importorskip("mlx_lm.utils")
    hidden, inter, vocab = 64, 128, 32
    cfg = {"model_type": "llama", "hidden_size": hidden, "intermediate_size": inter, "num_attention_heads": 2,
           "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": vocab, "rms_norm_eps": 1e-5,
           "tie_word_embeddings": False, "rope_theta": 10000.0}
    rng = np.random.default_rng(5)
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "lm_head.weight": (vocab, hidden)}
    for p, s in (("self_attn.q_proj", (hidden, hidden)), ("self_attn.k_proj", (hidden, hidden)), ("self_attn.v_proj", (hidden, hidden)),
                 ("self_attn.o_proj", (hidden, hidden)), ("mlp.gate_proj", (inter, hidden)), ("mlp.up_proj", (inter, hidden)),
                 ("mlp.down_proj", (hidden, inter))):
        shapes[f"model.layers.0.{p}.weight"] = s
    tensors: dict = {"model.norm.weight": np.ones(hidden, np.float32),
                     "model.layers.0.input_layernorm.weight": np.ones(hidden, np.float32),
                     "model.layers.0.post_attention_layernorm.weight": np.ones(hidden, np.float32)}
    for n, s in shapes.items():
        x = (rng.standard_normal(s) * 0.1).astype(np.float32)
        if "down_proj" in n:
            tensors[n] = qformat.quantize(x, "mxfp4", dtype="float32")
        elif "gate_proj" in n:
            tensors[n] = qformat.quantize(x, "int", bits=8, group_size=32, symmetric=False, scale_dtype="float16", dtype="float32")
        else:
            tensors[n] = qformat.quantize(x, "int", bits=4, group_size=64, symmetric=False, scale_dtype="float16", dtype="float32")
    src = _folder(tmp_path, tensors, cfg)
    out = tmp_path / "out"
    export(src, out, to="mlx")
    model, config = utils.load_model(out)
    assert config["quantization"]["model.layers.0.mlp.down_proj"]["mode"] == "mxfp4"
    assert model.model.layers[0].mlp.down_proj.mode == "mxfp4" and model.model.layers[0].mlp.gate_proj.bits == 8
    want = qformat_values(src)
    x = mx.array(rng.standard_normal((3, inter)).astype(np.float32))
    for name, layer in (("mlp.down_proj", model.model.layers[0].mlp.down_proj), ("mlp.gate_proj", model.model.layers[0].mlp.gate_proj)):
        w = want[f"model.layers.0.{name}.weight"]
        xin = x[:, : w.shape[1]]
        np.testing.assert_allclose(np.asarray(layer(xin)), np.asarray(xin) @ w.T, rtol=1e-4, atol=1e-5)
    logits = model(mx.array([[1, 2, 3]]))
    assert logits.shape == (1, 3, vocab) and bool(mx.all(mx.isfinite(logits)).item())


@pytest.mark.parametrize("signedness,offset", [("offset_binary", 0), ("twos_complement", 3), ("unsigned", 5)])
def test_other_integer_encodings_shift_into_unsigned_codes(signedness: str, offset: int, tmp_path: Path) -> None:
    """offset_binary and code_offset codes become MLX's unsigned codes; an unsigned element with
    a code offset and a bias (subtract) keeps the scale-and-bias form."""
    import copy

    from qformat.qtensor import QTensor

    q = qformat.quantize(-np.abs(X[:, :128]), "int", bits=8, group_size=32, scale_dtype="float16", dtype="float32")
    v = np.asarray(q.components["codes"]).astype(np.int64)  # two's complement values
    d = copy.deepcopy(q.descriptor)
    d["codes"]["element"] = {"type": "int", "bits": 8, "signedness": signedness, **({"code_offset": offset} if offset else {})}
    comps = dict(q.components)
    if signedness == "offset_binary":
        u = v + 128
    elif signedness == "twos_complement":
        u = v % 256
    else:  # unsigned codes v + 128 with a bias of -128 * ... as a stored bias subtracted
        u = v + 128
        d["bias"] = {"blocks": d["scale"]["blocks"], "op": "subtract", "tensor": "bias"}
        comps["bias"] = (np.asarray(q.components["scale"], np.float32) * 128).astype(np.float32)
    comps["codes"] = ((u - offset) % 256).astype(np.uint8)
    src = _folder(tmp_path, {"a.weight": QTensor(d, comps)})
    r = export(src, tmp_path / "out", to="mlx")
    assert all(t.exact for t in r.results), [t.to_dict() for t in r.results]
    assert_mlx_matches(src, tmp_path / "out", r)
