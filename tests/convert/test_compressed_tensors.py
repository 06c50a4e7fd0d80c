"""compressed-tensors checkpoints, built and decompressed by the compressed-tensors library itself.

Each checkpoint comes from the library's own save path: a small torch model with a
``QuantizationConfig`` applied (``apply_quantization_config``), random scales and zero points,
``ModelCompressor.from_pretrained_model(model, format).compress_model(model)``, the state
dict saved with safetensors and ``ModelCompressor.update_config`` writing config.json.  The
expected values are the library's own decompression of the saved tensors
(``BaseCompressor.get_value_from_registry(format).decompress(state_dict, scheme)``, which
calls ``compressed_tensors.quantization.lifecycle.forward.dequantize``).

Precision: the library computes ``(q - zp) * scale`` in the scale's dtype.  For a bfloat16 or
float16 scale, ``q - zp`` (at most 9 significant bits) is exact, and torch's CPU kernels
compute the product in binary32 (exact: at most 8 + 11 significant bits) and round once to
the scale's dtype, which is what qformat's binary32 step followed by the conversion to the
logical dtype does.  NVFP4 divides its bfloat16 scale by the float32 ``[1]`` global scale
(type promotion gives binary32, as qformat's ``divide``), multiplies in binary32 and rounds
to bfloat16 once.  MXFP4 widens the E8M0 exponent with ``2.0 ** (e - 127)`` in bfloat16
(exact for every code but 255, which the library turns into +Inf where E8M0 says NaN; the
test keeps 255 out and checks that case separately).  So every variant is compared bit for bit.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
ct = pytest.importorskip("compressed_tensors")

from compressed_tensors.compressors import ModelCompressor  # noqa: E402
from compressed_tensors.compressors.base import BaseCompressor  # noqa: E402
from compressed_tensors.quantization import (  # noqa: E402
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    apply_quantization_config,
)
from safetensors.torch import load_file, save_file  # noqa: E402

import qformat  # noqa: E402
from qformat.convert import convert  # noqa: E402
from qformat.errors import QFormatError  # noqa: E402

from .helpers import assert_converts  # noqa: E402

warnings.filterwarnings("ignore")


class Tiny(torch.nn.Module):
    """Linear layers under Hugging Face style names (``model.layers.0.self_attn.q_proj``...);
    ``lm_head`` is left unquantized (``ignore``)."""

    def __init__(self, shapes: dict[str, tuple[int, int]], dtype: torch.dtype):
        super().__init__()
        self.model = torch.nn.Module()
        layer = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList([layer])
        layer.self_attn = torch.nn.Module()
        for name, (n, k) in shapes.items():
            setattr(layer.self_attn, name, torch.nn.Linear(k, n, bias=False, dtype=dtype))
        self.lm_head = torch.nn.Linear(8, 4, bias=False, dtype=dtype)


def to_np(t: "torch.Tensor") -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.contiguous().numpy()


def build(tmp: Path, fmt: str, layers: dict[str, tuple[QuantizationArgs, int, int]], dtype=torch.bfloat16,
          seed: int = 0, edit=None, class_target: bool = False) -> tuple[Path, dict[str, np.ndarray]]:
    """Save a compressed-tensors checkpoint in ``tmp/src`` with one quantized Linear per entry
    of ``layers`` (name -> (weights args, N, K)), each in its own config group targeted by a
    ``re:`` pattern (or, with ``class_target``, one group targeting ``Linear``); return it and
    the library's decompression of the saved tensors."""
    g = torch.Generator().manual_seed(seed)
    model = Tiny({name: (n, k) for name, (_, n, k) in layers.items()}, dtype)
    with torch.no_grad():
        for prm in model.parameters():
            prm.copy_(torch.randn(prm.shape, generator=g) * 0.05)
    if class_target:
        args0 = next(iter(layers.values()))[0]
        assert all(a == args0 for a, _, _ in layers.values())
        groups = {"group_0": QuantizationScheme(targets=["Linear"], weights=args0)}
    else:
        groups = {f"group_{i}": QuantizationScheme(targets=[f"re:.*self_attn\\.{name}$"], weights=args)
                  for i, (name, (args, _, _)) in enumerate(layers.items())}
    qc = QuantizationConfig(config_groups=groups, ignore=["lm_head"])
    apply_quantization_config(model, qc)
    mods = {name: m for name, m in model.named_modules() if hasattr(m, "quantization_scheme")}
    assert len(mods) == len(layers)
    with torch.no_grad():
        for m in mods.values():
            args = m.quantization_scheme.weights
            w = m.weight.float()
            if args.type == "float" and args.num_bits == 4:
                if hasattr(m, "weight_global_scale"):
                    m.weight_global_scale.copy_(6 * 448 / w.abs().max() * (1 + torch.rand(1, generator=g)))
                    gs = m.weight_global_scale.float()
                else:
                    gs = torch.ones(1)
                amax = w.abs().reshape(w.shape[0], -1, args.group_size).amax(-1)
                m.weight_scale.copy_((amax / 6 * gs).clamp(min=1e-3))
                if not hasattr(m, "weight_global_scale"):  # MX: powers of two
                    m.weight_scale.copy_(torch.exp2(torch.ceil(torch.log2(m.weight_scale.float()))))
            else:
                m.weight_scale.copy_(torch.rand(m.weight_scale.shape, generator=g) * 0.02 + 0.002)
                if not args.symmetric:
                    lo = -(2 ** (args.num_bits - 1))
                    m.weight_zero_point.copy_(torch.randint(lo, -lo, m.weight_zero_point.shape, generator=g))
    comp = ModelCompressor.from_pretrained_model(model, fmt)
    comp.compress_model(model)
    sd = {k_: v.detach().contiguous() for k_, v in model.state_dict().items()}
    if edit is not None:
        edit(sd, g)
    src = tmp / "src"
    src.mkdir()
    save_file(sd, str(src / "model.safetensors"))
    comp.update_config(str(src))
    # Oracle: the library's decompression of the tensors as saved.
    saved = load_file(str(src / "model.safetensors"))
    compressor = BaseCompressor.get_value_from_registry(fmt)
    expected = {}
    for name in mods:
        local = {k_[len(name) + 1:]: v for k_, v in saved.items() if k_.startswith(name + ".")}
        expected[f"{name}.weight"] = to_np(compressor.decompress(local, mods[name].quantization_scheme)["weight"])
    return src, expected


def _int(bits, strategy, symmetric, gs=None):
    return QuantizationArgs(num_bits=bits, type="int", strategy=strategy, symmetric=symmetric, group_size=gs)


def _packed_layers() -> dict[str, tuple[QuantizationArgs, int, int]]:
    # One config group per layer, so one checkpoint holds every width.  Group layers: N = 13,
    # so zero points packed along dim 0 straddle words for every b; K % 32 == 0 (the library's
    # _process_group refuses anything else).  Channel layers: N = 19 and K = 75, not a multiple
    # of 32 / b, for the widths that straddle words.  Symmetric layers only drop the zero
    # point.  (Each tensor costs two JAX compilations per mode, so the list is kept short.)
    layers = {}
    for b in range(1, 9):
        layers[f"w{b}_group_asym"] = (_int(b, "group", False, 32), 13, 96)
    for b in (1, 3, 5, 6, 7):
        layers[f"w{b}_channel_asym"] = (_int(b, "channel", False), 19, 75)
    layers["w4_group_sym"] = (_int(4, "group", True, 32), 13, 64)
    layers["w3_channel_sym"] = (_int(3, "channel", True), 6, 75)
    layers["w4_tensor_asym"] = (_int(4, "tensor", False), 5, 40)  # tensor strategy: plain int8 zero point
    return layers


def test_pack_quantized(tmp_path):
    """Every width the library packs (1-8), group and channel, symmetric and asymmetric."""
    src, expected = build(tmp_path, "pack-quantized", _packed_layers(), seed=1)
    ck = qformat.convert.Checkpoint(src)
    for b in range(1, 9):
        p = f"model.layers.0.self_attn.w{b}_group_asym"
        assert ck.info(f"{p}.weight_packed").dtype == "I32"
        assert list(ck.info(f"{p}.weight_packed").shape) == [13, 3 * b]
        assert list(ck.info(f"{p}.weight_zero_point").shape) == [-(-13 * b // 32), 3]
    assert_converts(src, expected, tmp_path, detect_as="compressed-tensors")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["f16", "f32"])
def test_pack_quantized_scale_dtypes(tmp_path, dtype):
    """The logical dtype is the scale's: the library dequantizes in it."""
    src, expected = build(tmp_path, "pack-quantized", {"q_proj": (_int(3, "group", False, 16), 9, 48)}, dtype=dtype)
    want = "float16" if dtype == torch.float16 else "float32"
    assert next(iter(expected.values())).dtype == np.dtype(want)
    assert_converts(src, expected, tmp_path)


def test_class_name_target(tmp_path):
    """One config group targeting the class name ``Linear`` (what most checkpoints do)."""
    layers = {"q_proj": (_int(4, "group", True, 32), 8, 64), "o_proj": (_int(4, "group", True, 32), 12, 32)}
    src, expected = build(tmp_path, "pack-quantized", layers, class_target=True)
    assert json.loads((src / "config.json").read_text())["quantization_config"]["config_groups"]["group_0"]["targets"] == ["Linear"]
    assert_converts(src, expected, tmp_path, detect_as="compressed-tensors")


def test_pack_quantized_layout_hand_example():
    """SPEC §7.12 a: codes [-8, -7, 0, 1, 2, 3, 4, 7] pack to the word 0xFCBA9810 (library)."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    w = pack_to_int32(torch.tensor([[-8, -7, 0, 1, 2, 3, 4, 7]], dtype=torch.int8), 4)
    assert w.numpy().view(np.uint32).tolist() == [[0xFCBA9810]]


def _preset(name: str) -> QuantizationArgs:
    return QuantizationArgs(**getattr(ct.quantization.quant_scheme, name)["weights"].model_dump())


def test_nvfp4(tmp_path):
    layers = {"q_proj": (_preset("NVFP4A16"), 24, 80), "o_proj": (_preset("NVFP4A16"), 7, 32)}
    src, expected = build(tmp_path, "nvfp4-pack-quantized", layers, seed=3)
    ck = qformat.convert.Checkpoint(src)
    assert ck.info("model.layers.0.self_attn.q_proj.weight_global_scale").dtype == "F32"
    assert ck.info("model.layers.0.self_attn.q_proj.weight_scale").dtype == "F8_E4M3"
    out = assert_converts(src, expected, tmp_path, detect_as="compressed-tensors")
    d = json.loads(qformat.container.read_header(out["in_place"] / "model.safetensors").metadata["qformat"])
    assert d["tensors"]["model.layers.0.self_attn.q_proj.weight"]["scale"]["encoded"]["scale"]["op"] == "divide"


def _mx_scales(sd, g):
    # E8M0 exponents the library decodes exactly, including 0 (2^-127, a bfloat16 subnormal) and 254.
    for k_, v in sd.items():
        if k_.endswith("weight_scale"):
            codes = torch.randint(100, 140, v.shape, generator=g, dtype=torch.int32)
            codes.view(-1)[:3] = torch.tensor([0, 1, 254])[: codes.numel()]
            sd[k_] = codes.to(torch.uint8)


def test_mxfp4(tmp_path):
    layers = {"q_proj": (_preset("MXFP4A16"), 6, 96), "o_proj": (_preset("MXFP4A16"), 5, 32)}
    src, expected = build(tmp_path, "mxfp4-pack-quantized", layers, seed=4, edit=_mx_scales)
    assert_converts(src, expected, tmp_path, detect_as="compressed-tensors")


def test_mxfp4_code_255_is_nan(tmp_path):
    """E8M0 0xFF is NaN (OCP MX); the library's ``2.0 ** (255 - 127)`` in bfloat16 is +Inf, so
    its block decodes to +-Inf (NaN where the code is zero); qformat gives NaN throughout."""

    def edit(sd, g):
        _mx_scales(sd, g)
        sd["model.layers.0.self_attn.q_proj.weight_scale"][0, 0] = 255

    src, expected = build(tmp_path, "mxfp4-pack-quantized", {"q_proj": (_preset("MXFP4A16"), 6, 64)}, seed=5, edit=edit)
    lib = expected["model.layers.0.self_attn.q_proj.weight"].astype(np.float32)
    assert np.isinf(lib[0, :32]).any() and not np.isfinite(lib[0, :32]).any()
    convert(src, tmp_path / "out")
    got = qformat.load_file(tmp_path / "out" / "model.safetensors")["model.layers.0.self_attn.q_proj.weight"].astype(np.float32)
    assert np.isnan(got[0, :32]).all()
    np.testing.assert_array_equal(got[1:], lib[1:])
    np.testing.assert_array_equal(got[0, 32:], lib[0, 32:])


def test_float_quantized(tmp_path):
    fp8 = dict(num_bits=8, type="float", symmetric=True)
    layers = {
        "q_proj": (QuantizationArgs(**fp8, strategy="channel"), 13, 40),
        "k_proj": (QuantizationArgs(**fp8, strategy="tensor"), 5, 24),
        # 128 x 128 blocks with N and K not multiples of 128: partial blocks at both edges.
        "v_proj": (QuantizationArgs(**fp8, strategy="block", block_structure=[128, 128]), 150, 296),
    }
    src, expected = build(tmp_path, "float-quantized", layers, seed=6)
    ck = qformat.convert.Checkpoint(src)
    assert ck.info("model.layers.0.self_attn.q_proj.weight").dtype == "F8_E4M3"
    assert list(ck.info("model.layers.0.self_attn.v_proj.weight_scale").shape) == [2, 3]
    assert_converts(src, expected, tmp_path, detect_as="compressed-tensors")


def test_int_quantized(tmp_path):
    layers = {"q_proj": (_int(8, "channel", True), 7, 33), "o_proj": (_int(8, "group", False, 16), 5, 48)}
    src, expected = build(tmp_path, "int-quantized", layers, seed=7)
    assert_converts(src, expected, tmp_path, detect_as="compressed-tensors")


def test_error_shape_mismatch(tmp_path):
    """weight_shape that disagrees with weight_packed is CONVERT_SOURCE_INVALID, naming both."""

    def edit(sd, g):
        sd["model.layers.0.self_attn.q_proj.weight_shape"] = torch.tensor([13, 200])

    src, _ = build(tmp_path, "pack-quantized", {"q_proj": (_int(4, "channel", True), 13, 64)}, edit=edit)
    with pytest.raises(QFormatError) as e:
        convert(src, tmp_path / "out")
    assert e.value.code == "CONVERT_SOURCE_INVALID"
    msg = str(e.value)
    assert "q_proj.weight_shape" in msg and "[13, 200]" in msg and "[13, 8]" in msg and "[13, 25]" in msg


def test_error_scale_dtype(tmp_path):
    def edit(sd, g):
        sd["model.layers.0.self_attn.q_proj.weight_scale"] = sd["model.layers.0.self_attn.q_proj.weight_scale"].to(torch.int32)

    src, _ = build(tmp_path, "nvfp4-pack-quantized", {"q_proj": (_preset("NVFP4A16"), 8, 32)}, edit=edit)
    with pytest.raises(QFormatError) as e:
        convert(src, tmp_path / "out")
    assert e.value.code == "CONVERT_SOURCE_INVALID"
    assert "q_proj.weight_scale" in str(e.value) and "I32" in str(e.value) and "F8_E4M3" in str(e.value)


def test_unsupported_format(tmp_path):
    src, _ = build(tmp_path, "pack-quantized", {"q_proj": (_int(4, "channel", True), 8, 32)})
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"]["format"] = "marlin-24"
    cfg["quantization_config"]["config_groups"]["group_0"]["format"] = "marlin-24"
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(QFormatError) as e:
        convert(src, tmp_path / "out", from_format="compressed-tensors")
    assert e.value.code == "CONVERT_UNSUPPORTED" and "marlin-24" in str(e.value) and "pack-quantized" in str(e.value)
