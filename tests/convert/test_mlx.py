"""The ``mlx`` converter against MLX itself (the oracle, mlx[cpu]).

Checkpoints are made as mlx-lm makes them: ``nn.quantize(model, ..., class_predicate=...)``
(per-layer parameters from the predicate), ``mx.save_safetensors`` of the flattened
parameters and ``config.json`` with ``"quantization": {"group_size", "bits", "mode",
LAYER_PATH: {...}}``.  Expected values come from ``mx.dequantize``.

MLX's affine dequantization computes in the scales' dtype: ``fl(fl(s*q) + b)``, the product
rounded to float16/bfloat16 before the bias is added, where qformat (SPEC §10) computes
``s*q + b`` in binary32 and rounds once.  For float16/bfloat16 scales the qformat readers are
therefore compared bit for bit with an independent binary32 transcription of the spec's
formula (codes taken from MLX itself: ``mx.dequantize`` with unit scales and zero biases), and
MLX's difference from it is bounded separately; with float32 scales MLX is matched bit for
bit, as are the float modes (mxfp4, mxfp8, nvfp4, nvfp4 with a global scale).
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
nn = pytest.importorskip("mlx.nn")
from mlx.utils import tree_flatten  # noqa: E402

from qformat.convert import Checkpoint, describe  # noqa: E402
from qformat.convert.mlx import MLX  # noqa: E402
from qformat.errors import QFormatError  # noqa: E402

from .helpers import assert_converts, bits_equal  # noqa: E402

MX = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}
NP = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}

#: layer -> (in, out, per-layer quantization); the first uses the config's defaults.
AFFINE = {
    "layers.0": (64, 5, None),                                         # bits 4, group 64 (defaults)
    "layers.1": (96, 3, {"bits": 3, "group_size": 32}),                # 3-bit stream across words
    "layers.2": (128, 2, {"bits": 5, "group_size": 128}),
    "layers.3": (64, 3, {"bits": 6, "group_size": 32}),
    "layers.4": (64, 2, {"bits": 8, "group_size": 64}),
    "layers.5": (64, 3, {"bits": 2, "group_size": 32}),
    "layers.6": (32, 2, {"bits": 1, "group_size": 32}),
}
FLOAT = {
    "layers.0": (64, 3, None),                                         # mxfp4 (defaults)
    "layers.1": (64, 2, {"mode": "mxfp8", "group_size": 32, "bits": 8}),
    "layers.2": (32, 3, {"mode": "nvfp4", "group_size": 16, "bits": 4}),
}


class Model(nn.Module):
    def __init__(self, spec, embed=False):
        super().__init__()
        self.layers = [nn.Linear(i, o, bias=False) for i, o, _ in spec.values()]
        if embed:
            self.embed = nn.Embedding(6, 64)


def _np(a) -> np.ndarray:
    if a.dtype == mx.bfloat16:
        return np.asarray(a.view(mx.uint16)).view(ml_dtypes.bfloat16)
    return np.asarray(a)


def _checkpoint(tmp: Path, spec, dtype: str, defaults: dict, embed=False, extra=None) -> tuple[Path, dict]:
    """An mlx-lm style folder: model.safetensors + config.json; returns (folder, parameters)."""
    mx.random.seed(0)
    model = Model(spec, embed)
    model.set_dtype(MX[dtype])
    per_layer = {k: q for k, (_, _, q) in spec.items() if q is not None}
    nn.quantize(model, defaults.get("group_size"), defaults.get("bits"), mode=defaults.get("mode", "affine"),
                class_predicate=lambda path, m: ({**defaults, **per_layer[path]} if path in per_layer else hasattr(m, "to_quantized")))
    weights = dict(tree_flatten(model.parameters()))
    weights.update(extra or {})
    src = tmp / "src"
    src.mkdir()
    mx.save_safetensors(str(src / "model.safetensors"), weights, metadata={"format": "mlx"})
    quant = dict(defaults)
    quant.update({k: {**defaults, **q} for k, q in per_layer.items()})
    (src / "config.json").write_text(json.dumps({"model_type": "test", "quantization": quant, "quantization_config": quant}))
    return src, weights


def _mode(defaults, q):
    p = {"mode": "affine", **defaults, **(q or {})}
    return p["mode"], p.get("group_size"), p.get("bits")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_affine(dtype, tmp_path):
    defaults = {"group_size": 64, "bits": 4, "mode": "affine"}
    src, wts = _checkpoint(tmp_path, AFFINE, dtype, defaults, embed=True)
    layers = {**{k: q for k, (_, _, q) in AFFINE.items()}, "embed": None}
    expected, differ = {}, 0
    for layer, q in layers.items():
        _, gs, bits = _mode(defaults, q)
        w, s, b = wts[f"{layer}.weight"], wts[f"{layer}.scales"], wts[f"{layer}.biases"]
        lib = _np(mx.dequantize(w, s, b, group_size=gs, bits=bits))
        assert lib.dtype == NP[dtype]
        # The codes as MLX reads them: unit scales and zero biases give q exactly.
        one = mx.ones(s.shape, dtype=mx.float32)
        codes = _np(mx.dequantize(w, one, mx.zeros_like(one), group_size=gs, bits=bits))
        assert codes.max() < 2**bits and np.array_equal(codes, np.round(codes))
        S = np.repeat(_np(s).astype(np.float32), gs, axis=-1)
        B = np.repeat(_np(b).astype(np.float32), gs, axis=-1)
        ref = (codes * S + B).astype(np.float32).astype(NP[dtype])  # SPEC §10: binary32 steps, one rounding
        if dtype == "float32":
            ok, why = bits_equal(ref, lib)
            assert ok, f"{layer}: {why}"
        else:
            # MLX: fl(fl(s*q) + b) in the scales' dtype.  |lib - ref| <= 1/2 ulp(s*q) (MLX's
            # extra rounding) + 1 ulp of the larger result (both final roundings).
            f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
            sq = (codes * S).astype(NP[dtype])
            big = np.maximum(np.abs(f64(lib)), np.abs(f64(ref))).astype(NP[dtype])
            diff = np.abs(f64(lib) - f64(ref))
            assert (diff <= 0.5 * f64(np.spacing(np.abs(sq))) + f64(np.spacing(big))).all(), layer
            differ += int((diff > 0).sum())
        expected[f"{layer}.weight"] = ref
    if dtype != "float32":
        assert differ > 0  # the documented difference is real on this data
    assert_converts(src, expected, tmp_path, detect_as="mlx")
    _, _, d = describe(src)
    assert d.descriptors["layers.1.weight"]["codes"]["packing"] == {"container": 32, "bit_order": "lsb_first", "axis": 1}
    assert d.descriptors["layers.1.weight"]["shape"] == [3, 96]


def test_float_modes(tmp_path):
    # nvfp4 with mx.quantize's global scale: no nn layer writes one, so it is added by hand as
    # LAYER.global_scale next to the layer's weight and scales.
    mx.random.seed(1)
    x = (mx.random.normal((4, 48)) * 3).astype(mx.bfloat16)
    g = mx.array([float(mx.abs(x.astype(mx.float32)).max().item())], dtype=mx.float32)
    gw, gscales = mx.quantize(x, mode="nvfp4", global_scale=g)
    extra = {"glob.weight": gw, "glob.scales": gscales, "glob.global_scale": g}
    defaults = {"group_size": 32, "bits": 4, "mode": "mxfp4"}
    src, wts = _checkpoint(tmp_path, FLOAT, "bfloat16", defaults, extra=extra)
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization"]["glob"] = {"mode": "nvfp4", "group_size": 16, "bits": 4}
    (src / "config.json").write_text(json.dumps(cfg))
    expected = {}
    for layer, (_, _, q) in FLOAT.items():
        mode, gs, bits = _mode(defaults, q)
        lib = mx.dequantize(wts[f"{layer}.weight"], wts[f"{layer}.scales"], mode=mode)
        assert lib.dtype == mx.bfloat16  # the default MLX returns for uint8 scales
        expected[f"{layer}.weight"] = _np(lib)
    lib = mx.dequantize(gw, gscales, mode="nvfp4", global_scale=g)
    assert lib.dtype == mx.float32  # the float32 global scale makes MLX's default float32
    expected["glob.weight"] = _np(lib)
    assert_converts(src, expected, tmp_path, detect_as="mlx")
    _, _, d = describe(src)
    enc = d.descriptors["layers.0.weight"]["scale"]["encoded"]
    assert enc["codes"]["element"] == {"type": "float", "format": "e8m0fnu"} and enc["codes"]["tensor"] == "layers.0.scales"
    gd = d.descriptors["glob.weight"]["scale"]["encoded"]["scale"]
    assert d.added[gd["tensor"]].dtype == np.float32
    assert d.added[gd["tensor"]] == np.float32(np.asarray(g)[0]) / np.float32(2688)


def _expect_error(src: Path, code: str, text: str) -> None:
    with pytest.raises(QFormatError) as e:
        MLX().describe(Checkpoint(src))
    assert e.value.code == code, e.value
    assert text in str(e.value), str(e.value)


def test_errors(tmp_path):
    defaults = {"group_size": 64, "bits": 4, "mode": "affine"}
    spec = {"layers.0": (64, 5, None), "layers.1": (96, 3, {"bits": 3, "group_size": 32})}
    src, wts = _checkpoint(tmp_path, spec, "float16", defaults)
    cfg_path = src / "config.json"
    cfg = json.loads(cfg_path.read_text())
    # The config's group size disagrees with the scales' shape (K no longer fits the words).
    cfg_path.write_text(json.dumps({**cfg, "quantization": {**cfg["quantization"], "layers.1": {"bits": 3, "group_size": 64}}}))
    _expect_error(src, "CONVERT_SOURCE_INVALID", "so K = 192 and layers.1.weight must have K*3/32 = 18 words per row; it has 9")
    cfg_path.write_text(json.dumps({**cfg, "quantization": {**cfg["quantization"], "mode": "fp3"}}))
    _expect_error(src, "CONVERT_UNSUPPORTED", "'fp3'")
    cfg_path.write_text(json.dumps({**cfg, "quantization": {**cfg["quantization"], "layers.0": False}}))
    _expect_error(src, "CONVERT_SOURCE_INVALID", "not quantized")
    cfg_path.write_text(json.dumps({**cfg, "quantization": {**cfg["quantization"], "bits": 7}}))
    _expect_error(src, "CONVERT_UNSUPPORTED", "affine bits 7")
    cfg_path.write_text(json.dumps({k: v for k, v in cfg.items() if k not in ("quantization",)}))
    _expect_error(src, "CONVERT_SOURCE_INVALID", "no 'quantization' object")
    cfg_path.write_text(json.dumps(cfg))
    # Scales whose rows do not match the weight's.
    wts = dict(wts)
    wts["layers.0.scales"] = wts["layers.0.scales"][:2]
    mx.save_safetensors(str(src / "model.safetensors"), wts, metadata={"format": "mlx"})
    _expect_error(src, "CONVERT_SOURCE_INVALID", "expected [5] + [groups]")


def test_null_metadata_as_mx_save_safetensors_writes_by_default(tmp_path):
    """``mx.save_safetensors(path, arrays)`` writes ``"__metadata__": null``: the converter reads
    it as the safetensors library does (no metadata) and decodes like MLX; the converted file
    has an object there; a qformat reader reads null as no metadata and ``check --strict`` reports it."""
    import subprocess
    import sys

    import qformat

    mx.random.seed(1)
    wq, scales, biases = mx.quantize(mx.random.normal((4, 64)), group_size=32, bits=4)  # float32: MLX rounds once too
    src = tmp_path / "src"
    src.mkdir()
    arrays = {"layers.0.weight": wq, "layers.0.scales": scales, "layers.0.biases": biases}
    mx.save_safetensors(str(src / "model.safetensors"), arrays)  # no metadata argument
    raw = (src / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert json.loads(raw[8 : 8 + n])["__metadata__"] is None
    (src / "config.json").write_text(json.dumps({"model_type": "test", "quantization": {"group_size": 32, "bits": 4}}))
    want = _np(mx.dequantize(arrays["layers.0.weight"], arrays["layers.0.scales"], arrays["layers.0.biases"], group_size=32, bits=4))
    dst = tmp_path / "out"
    qformat.convert.convert(src, dst)
    got = qformat.load_file(dst / "model.safetensors")["layers.0.weight"]
    assert bits_equal(got, want)
    # since 1.2 a qformat reader reads null as no metadata and only a strict checker reports it
    # (SPEC.md §2.4)
    assert bits_equal(qformat.load_file(src / "model.safetensors")["layers.0.weight"], np.asarray(arrays["layers.0.weight"]))
    ok = subprocess.run([sys.executable, "-m", "qformat", "check", "--json", str(src / "model.safetensors")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout
    out = subprocess.run([sys.executable, "-m", "qformat", "check", "--strict", "--json", str(src / "model.safetensors")], capture_output=True, text=True)
    assert out.returncode != 0 and "METADATA_INVALID" in out.stdout and "Traceback" not in out.stderr
