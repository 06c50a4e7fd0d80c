"""ModelOpt NVFP4 exports.

ModelOpt (nvidia-modelopt) cannot be installed here, so the checkpoints come from a NumPy
transcription of its packer, ``NVFP4QTensor.quantize`` in
modelopt/torch/quantization/qtensor/nvfp4_tensor.py (NVIDIA/TensorRT-Model-Optimizer):
``weight_scale_2 = amax / (6 * 448)``, ``weight_scale = e4m3(block_amax / (6 * weight_scale_2))``
(1.0 where the block is zero), codes from ``_cast_fp4`` (``searchsorted`` over the E2M1
bounds, plus one at ``e2m1_bounds[[1, 3, 5]]`` = 0.75, 1.75, 3.5, so ties go to even; the
source comment says 2.5, the code says 3.5), packed ``(q[..., 1::2] << 4) | q[..., 0::2]``.
The packer is checked against a hand-computed example.  Expected values come from a separate
transcription of ``NVFP4QTensor.dequantize`` (``e2m1_values[code] * (float32(weight_scale) *
weight_scale_2)`` in float32, then cast to the model dtype), which is the descriptor's own
sequence of binary32 steps.  One difference, by construction of ModelOpt's table: its
``e2m1_values`` maps code 0x8 to +0.0, where E2M1 (OCP, SPEC §6.3, and the NVFP4 hardware
path) has -0.0.  qformat keeps E2M1; the test checks that the two differ exactly in the sign
of those zeros and nowhere else, and compares everything else bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402

from qformat.convert import convert  # noqa: E402
from qformat.errors import QFormatError  # noqa: E402

from .helpers import assert_converts  # noqa: E402

E2M1_BOUNDS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5], np.float32)
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def cast_fp4(x: np.ndarray) -> np.ndarray:
    """``NVFP4QTensor._cast_fp4``: E2M1 codes (sign << 3 | magnitude index)."""
    sign = (x < 0).astype(np.uint8)
    a = np.abs(x)
    ordinal = np.searchsorted(E2M1_BOUNDS, a, side="left").astype(np.uint8)  # torch.searchsorted, right=False
    odd = np.isin(a, E2M1_BOUNDS[[1, 3, 5]]).astype(np.uint8)
    return (sign << 3) + ordinal + odd


def pack(q: np.ndarray) -> np.ndarray:
    return ((q[..., 1::2] << 4) | q[..., 0::2]).astype(np.uint8)


def quantize(w: np.ndarray, block: int = 16) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``NVFP4QTensor.quantize`` for a float32 ``w`` [..., N, K] (K % 16 == 0): packed, scale, scale_2."""
    s2 = np.float32(np.abs(w).max()) / np.float32(6.0 * 448.0)
    blocks = w.reshape(*w.shape[:-1], -1, block)
    amax = np.abs(blocks).max(-1)
    pbs = (amax / (np.float32(6.0) * s2)).astype(np.float32)
    pbs[pbs == 0] = 1.0
    ws = pbs.astype(ml_dtypes.float8_e4m3fn)
    scaled = blocks / (ws.astype(np.float32) * s2)[..., None]
    return pack(cast_fp4(scaled.reshape(w.shape))), ws, np.float32(s2)


def dequantize(packed: np.ndarray, ws: np.ndarray, s2: np.float32, dtype) -> np.ndarray:
    """``NVFP4QTensor.dequantize`` (non-fast path), transcribed."""
    codes = np.empty((*packed.shape[:-1], packed.shape[-1] * 2), np.uint8)
    codes[..., 0::2] = packed & 0x0F
    codes[..., 1::2] = packed >> 4
    vals = E2M1_VALUES[codes]
    pbs = ws.astype(np.float32) * np.float32(s2)
    out = vals.reshape(*vals.shape[:-1], -1, 16) * pbs[..., None]
    return out.reshape(vals.shape).astype(dtype)


def test_packer_hand_example():
    x = np.array([0.5, -1.0, 6.0, 0.0, 0.75, -0.25, 3.5, 2.5], np.float32)
    # Ties go to the even E2M1 value: 0.75 -> 1.0 and 3.5 -> 4.0 (the "odd bounds" e2m1_bounds[[1, 3, 5]]
    # are 0.75, 1.75, 3.5), 2.5 -> 2.0 and -0.25 -> -0.0: codes 1, A, 7, 0, 2, 8, 6, 4.
    assert cast_fp4(x).tolist() == [0x1, 0xA, 0x7, 0x0, 0x2, 0x8, 0x6, 0x4]
    assert pack(cast_fp4(x)).tolist() == [0xA1, 0x07, 0x82, 0x46]
    row = pack(cast_fp4(np.concatenate([x, np.zeros(8, np.float32)])))[None]  # [1, 8]: one block of 16
    got = dequantize(row, np.ones((1, 1), ml_dtypes.float8_e4m3fn), np.float32(2.0), np.float32)
    assert got[0, :8].tolist() == [1.0, -2.0, 12.0, 0.0, 2.0, 0.0, 8.0, 4.0]
    assert not np.signbit(got[0, 5])  # ModelOpt's e2m1_values[8] is +0, not E2M1's -0


def _torch(a: np.ndarray) -> "torch.Tensor":
    if a.dtype == ml_dtypes.float8_e4m3fn:
        return torch.from_numpy(a.view(np.uint8).copy()).view(torch.float8_e4m3fn)
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def build(tmp: Path, layers: dict[str, tuple[int, ...]], config: str = "hf_quant_config", dtype: str = "bfloat16",
          seed: int = 0, edit=None) -> tuple[Path, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    np_dtype = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}[dtype]
    sd, expected = {}, {}
    for p, shape in layers.items():
        w = (rng.standard_normal(shape) * 0.05).astype(np_dtype).astype(np.float32)
        w[..., :16] = 0  # an all-zero block: scale 1.0
        packed, ws, s2 = quantize(w)
        sd[f"{p}.weight"], sd[f"{p}.weight_scale"] = packed, ws
        sd[f"{p}.weight_scale_2"] = np.array(s2, np.float32)
        sd[f"{p}.input_scale"] = np.array(rng.random() + 0.5, np.float32)
        lib = dequantize(packed, ws, s2, np_dtype)
        # E2M1 code 0x8 is -0.0; ModelOpt's table gives +0.0 there (the only difference).
        codes8 = np.zeros(lib.shape, bool)
        codes8[..., 0::2], codes8[..., 1::2] = (packed & 0x0F) == 8, (packed >> 4) == 8
        want = lib.copy()
        want[codes8] = -want[codes8]
        assert codes8.any() and (lib[codes8] == 0).all() and not np.signbit(lib[codes8].astype(np.float32)).any()
        expected[f"{p}.weight"] = want
    sd["lm_head.weight"] = rng.standard_normal((4, 8)).astype(np.float32).astype(np_dtype)
    if edit is not None:
        edit(sd)
    src = tmp / "src"
    src.mkdir()
    save_file({k: _torch(v) for k, v in sd.items()}, str(src / "model.safetensors"))
    quant = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": ["lm_head"]}
    cfg: dict = {"architectures": ["LlamaForCausalLM"], "torch_dtype": dtype}
    if config == "hf_quant_config":
        (src / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt", "version": "0.29.0"}, "quantization": quant}))
    else:
        cfg["quantization_config"] = {"quant_method": "modelopt", **quant}
    (src / "config.json").write_text(json.dumps(cfg))
    return src, expected


LAYERS = {
    "model.layers.0.self_attn.q_proj": (24, 64),
    "model.layers.0.mlp.down_proj": (7, 48),  # odd N
    "model.layers.0.mlp.experts.gate_up_proj": (2, 6, 32),  # 3-D (MoE) weight
}


@pytest.mark.parametrize("config,dtype", [("hf_quant_config", "bfloat16"), ("quantization_config", "float16")])
def test_nvfp4(tmp_path, config, dtype):
    src, expected = build(tmp_path, LAYERS, config, dtype)
    assert_converts(src, expected, tmp_path, detect_as="modelopt")


def test_error_scale_shape(tmp_path):
    def edit(sd):
        sd["model.layers.0.self_attn.q_proj.weight_scale"] = sd["model.layers.0.self_attn.q_proj.weight_scale"][:, :3]

    src, _ = build(tmp_path, {"model.layers.0.self_attn.q_proj": (24, 64)}, edit=edit)
    with pytest.raises(QFormatError) as e:
        convert(src, tmp_path / "out")
    assert e.value.code == "CONVERT_SOURCE_INVALID"
    msg = str(e.value)
    assert "q_proj.weight_scale" in msg and "[24, 3]" in msg and "[24, 4]" in msg


def test_unsupported_algo(tmp_path):
    src, _ = build(tmp_path, {"model.layers.0.self_attn.q_proj": (8, 32)})
    (src / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "W4A8_AWQ"}}))
    with pytest.raises(QFormatError) as e:
        convert(src, tmp_path / "out")
    assert e.value.code == "CONVERT_UNSUPPORTED" and "W4A8_AWQ" in str(e.value)
