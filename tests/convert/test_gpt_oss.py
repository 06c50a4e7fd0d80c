"""gpt-oss MXFP4 checkpoints, decoded by transformers' own gpt-oss dequantizer.

Oracle: ``transformers.integrations.mxfp4.convert_moe_packed_tensors`` (runs on CPU): a
bfloat16 lookup of the E2M1 value of each nibble (low nibble = even element), then
``torch.ldexp(values, scale - 127)`` in bfloat16, then ``transpose(1, 2)`` to the layout of
``GptOssExperts`` parameters.  The gpt-oss reference (gpt_oss/torch/weights.py
``_get_mxfp4_tensor``) is the same lookup and ``ldexp`` without the transpose, so its values
for the original ``X.blocks``/``X.scales`` names are the oracle's transposed back.

Precision: an E2M1 value times a power of two is exact in bfloat16 down to its subnormals
(the smallest result, ``0.5 * 2^-127``, is ``2^-128``) and overflows to Inf in both, so the
comparison is bit for bit for every exponent 0 to 254.  Exponent 255 is NaN in E8M0 (OCP MX,
SPEC §6.3); the oracle's ``ldexp(x, 128)`` gives +-Inf (and +-0 for a zero code):
``test_scale_255`` checks that difference, the only one.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
from safetensors.torch import save_file  # noqa: E402

import qformat  # noqa: E402
from qformat.convert import convert  # noqa: E402
from qformat.errors import QFormatError  # noqa: E402

from .helpers import assert_converts  # noqa: E402


def to_np(t: "torch.Tensor") -> np.ndarray:
    return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)


def random_pair(rng: np.random.Generator, lead: tuple[int, ...], g: int, lo: int = 110, hi: int = 135):
    blocks = rng.integers(0, 256, (*lead, g, 16), dtype=np.uint8)
    scales = rng.integers(lo, hi, (*lead, g), dtype=np.uint8)
    flat = scales.reshape(-1)
    flat[:4] = [0, 1, 254, 127]  # 2^-127 (subnormal results), 2^-126, 2^127 (overflow to Inf), 1
    return blocks, scales


def oracle(blocks: np.ndarray, scales: np.ndarray) -> "torch.Tensor":
    """[E, K, N] bfloat16, as transformers dequantizes a gpt-oss expert weight."""
    return mxfp4.convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales))


def build(tmp: Path, hf: bool, seed: int = 0, edit=None) -> tuple[Path, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    sd: dict[str, np.ndarray] = {}
    expected = {}
    # gate_up [E=2, N=10, G=3] (K = 96), down [E=2, N=6, G=1] (K = 32): N not a multiple of 8.
    for name, (lead, g) in {"gate_up_proj": ((2, 10), 3), "down_proj": ((2, 6), 1)}.items():
        blocks, scales = random_pair(rng, lead, g)
        if hf:
            base = f"model.layers.0.mlp.experts.{name}"
            sd[f"{base}_blocks"], sd[f"{base}_scales"] = blocks, scales
            sd[f"{base}_bias"] = rng.standard_normal(lead).astype(np.float32)
            expected[base] = to_np(oracle(blocks, scales))  # [E, K, N]
        else:
            base = f"block.0.mlp.{'mlp1' if name == 'gate_up_proj' else 'mlp2'}_weight"
            sd[f"{base}.blocks"], sd[f"{base}.scales"] = blocks, scales
            sd[f"{base.replace('weight', 'bias')}"] = rng.standard_normal(lead).astype(ml_dtypes.bfloat16)
            expected[base] = to_np(oracle(blocks, scales).transpose(1, 2))  # [E, N, K]
    sd["model.embed_tokens.weight" if hf else "embedding.weight"] = rng.standard_normal((4, 8)).astype(ml_dtypes.bfloat16)
    if edit is not None:
        edit(sd)
    src = tmp / "src"
    src.mkdir()

    def tt(a):
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16) if a.dtype == ml_dtypes.bfloat16 else torch.from_numpy(a)

    save_file({k: tt(v) for k, v in sd.items()}, str(src / "model.safetensors"))
    cfg: dict = {"architectures": ["GptOssForCausalLM"], "num_local_experts": 2, "torch_dtype": "bfloat16"}
    if hf:
        cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.embed_tokens", "lm_head"]}
    (src / "config.json").write_text(json.dumps(cfg))
    return src, expected


def test_hand_example():
    """One block: byte k holds element 2k (low nibble) and 2k + 1 (high nibble); scale 2^(e-127)."""
    blocks = np.zeros((1, 1, 1, 16), np.uint8)
    blocks[0, 0, 0, :2] = [0x2F, 0x91]  # elements 0..3: codes F, 2, 1, 9 -> -6, 1, 0.5, -0.5
    out = oracle(blocks, np.full((1, 1, 1), 128, np.uint8)).float()[0, :4, 0]  # times 2
    assert out.tolist() == [-12.0, 2.0, 1.0, -1.0]


@pytest.mark.parametrize("hf", [True, False], ids=["hf-names", "original-names"])
def test_mxfp4(tmp_path, hf):
    src, expected = build(tmp_path, hf)
    out = assert_converts(src, expected, tmp_path, detect_as="gpt-oss")
    if hf:  # the logical tensor has the runtime parameter's shape [E, hidden, 2 * intermediate]
        got = qformat.load_file(out["in_place"] / "model.safetensors")
        assert got["model.layers.0.mlp.experts.gate_up_proj"].shape == (2, 96, 10)
        assert got["model.layers.0.mlp.experts.gate_up_proj_bias"].shape == (2, 10)


def test_scale_255(tmp_path):
    def edit(sd):
        sd["model.layers.0.mlp.experts.down_proj_scales"][0, 0, 0] = 255

    src, expected = build(tmp_path, True, edit=edit)
    name = "model.layers.0.mlp.experts.down_proj"
    blocks = np.array(qformat.convert.Checkpoint(src).array(f"{name}_blocks"))
    scales = np.array(qformat.convert.Checkpoint(src).array(f"{name}_scales"))
    lib = oracle(blocks, scales).float().numpy()  # [E, K, N]: expert 0, row 0 of N, block 0 is [0, :32, 0]
    assert np.isinf(lib[0, :32, 0]).any() and not np.isnan(lib[0, :32, 0]).any()
    convert(src, tmp_path / "out")
    got = qformat.load_file(tmp_path / "out" / "model.safetensors")[name].astype(np.float32)
    assert np.isnan(got[0, :32, 0]).all()
    mask = np.ones(lib.shape, bool)
    mask[0, :32, 0] = False
    np.testing.assert_array_equal(got[mask], lib[mask])


def test_error_scales_shape(tmp_path):
    def edit(sd):
        sd["model.layers.0.mlp.experts.gate_up_proj_scales"] = sd["model.layers.0.mlp.experts.gate_up_proj_scales"][:, :, :2].copy()

    src, _ = build(tmp_path, True, edit=edit)
    with pytest.raises(QFormatError) as e:
        convert(src, tmp_path / "out")
    assert e.value.code == "CONVERT_SOURCE_INVALID"
    msg = str(e.value)
    assert "gate_up_proj_scales" in msg and "[2, 10, 2]" in msg and "[2, 10, 3]" in msg
