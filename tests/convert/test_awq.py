"""``qformat convert --from awq``: AutoAWQ GEMM checkpoints.

No AWQ library installs on this CPU machine, so the oracle is written from AutoAWQ's code:

- the packer transcribes ``awq/modules/linear/gemm.py`` ``WQLinear_GEMM.from_linear`` (eight
  4-bit codes per int32 along N, nibble ``i`` holding column ``8c + [0, 2, 4, 6, 1, 3, 5, 7][i]``;
  zeros packed the same way, stored as they are), checked against words computed by hand;
- the dequantization transcribes ``awq/utils/packing_utils.py`` ``unpack_awq``,
  ``reverse_awq_order`` and ``dequantize_gemm`` (shifts, the reverse order
  ``[0, 4, 1, 5, 2, 6, 3, 7]``, masks, ``repeat_interleave`` of scales and zeros over the
  group, ``(iweight - izeros) * scales``), computed with torch in fp16 as AutoAWQ does.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

import qformat
from qformat.convert import Checkpoint, convert, get
from qformat.errors import QFormatError

from .helpers import assert_converts

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]


def awq_pack(intweight: np.ndarray) -> np.ndarray:
    """[R, N] 4-bit codes -> int32 [R, N/8] (WQLinear_GEMM.from_linear's loop over columns)."""
    pack_num = 8
    # AutoAWQ sizes this ``N // 32 * w_bit``, the same as N / 8 for its N (multiples of 32);
    # written N * 4 // 32 so that the odd test widths (N = 24, 40, 72) keep every column.
    out = np.zeros((intweight.shape[0], intweight.shape[1] * 4 // 32), dtype=np.uint32)
    iw = intweight.astype(np.uint32)
    for col in range(intweight.shape[1] // pack_num):
        for i in range(pack_num):
            out[:, col] |= iw[:, col * pack_num + AWQ_ORDER[i]] << np.uint32(i * 4)
    return out.view(np.int32)


def test_packer_matches_hand_computed_words():
    # SPEC §7.12 d: columns 0..7 holding their own index -> 0x75316420
    assert awq_pack(np.arange(8)[None, :]).view(np.uint32)[0, 0] == 0x75316420
    # column 1 alone sits in nibble 4 (bits 16..19); column 6 alone in nibble 3 (bits 12..15)
    assert awq_pack(np.eye(8, dtype=np.int64)[1][None, :] * 9).view(np.uint32)[0, 0] == 0x00090000
    assert awq_pack(np.eye(8, dtype=np.int64)[6][None, :] * 0xF).view(np.uint32)[0, 0] == 0x0000F000
    # a second word holds columns 8..15
    w = awq_pack(np.r_[np.zeros(8, np.int64), np.full(8, 3)][None, :]).view(np.uint32)
    assert list(w[0]) == [0, 0x33333333]


def dequantize_gemm(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, group_size: int) -> np.ndarray:
    """AutoAWQ packing_utils.dequantize_gemm, in torch; returns W [N, K] in the scales' dtype."""
    bits = 4
    shifts = torch.arange(0, 32, bits)
    qw, qz = torch.from_numpy(qweight), torch.from_numpy(qzeros)
    iweights = torch.bitwise_right_shift(qw[:, :, None], shifts[None, None, :]).to(torch.int8).view(qw.shape[0], -1)
    izeros = torch.bitwise_right_shift(qz[:, :, None], shifts[None, None, :]).to(torch.int8).view(qz.shape[0], -1)
    rev = torch.arange(iweights.shape[-1], dtype=torch.int32).view(-1, 32 // bits)[:, AWQ_REVERSE_ORDER].view(-1)
    iweights, izeros = iweights[:, rev], izeros[:, rev]
    iweights = torch.bitwise_and(iweights, (2**bits) - 1)
    izeros = torch.bitwise_and(izeros, (2**bits) - 1)
    if scales.dtype == np.float16:
        sc = torch.from_numpy(scales)
    else:
        sc = torch.from_numpy(scales.view(np.int16)).view(torch.bfloat16)
    sc = sc.repeat_interleave(group_size, dim=0)
    izeros = izeros.repeat_interleave(group_size, dim=0)
    w = (iweights - izeros) * sc
    assert w.dtype == sc.dtype
    return w.T.contiguous().view(torch.int16).numpy().view(scales.dtype)


def test_dequant_hand_example():
    # K = 2, N = 8, one group: row 0 codes = column index, row 1 all 15; zeros 4; scale 0.25
    q = np.stack([np.arange(8), np.full(8, 15)])
    w = dequantize_gemm(awq_pack(q), awq_pack(np.full((1, 8), 4)), np.full((1, 8), 0.25, np.float16), 2)
    assert w[:, 0].tolist() == [(c - 4) * 0.25 for c in range(8)]
    assert w[:, 1].tolist() == [2.75] * 8


def _scales(rng, shape, dtype):
    s = (rng.uniform(2e-3, 6e-2, shape) * rng.choice([1.0, 1e-3], shape, p=[0.9, 0.1])).astype(np.float32)
    if dtype == "float16":
        return s.astype(np.float16)
    import ml_dtypes
    return s.astype(ml_dtypes.bfloat16)


def make_module(rng, N, K, gs, dtype="float16"):
    G = K if gs == -1 else gs
    ng = K // G
    q = rng.integers(0, 16, (K, N))
    z = rng.integers(0, 16, (ng, N))
    t = {"qweight": awq_pack(q), "qzeros": awq_pack(z), "scales": _scales(rng, (ng, N), dtype)}
    want = dequantize_gemm(t["qweight"], t["qzeros"], t["scales"], G)
    g = np.arange(K) // G
    ref = ((q - z[g]) * t["scales"].astype(np.float64)[g]).T  # exact in float64, then one rounding
    assert np.array_equal(want.astype(np.float64), ref.astype(want.dtype).astype(np.float64))
    return t, want


def _out(tmp_path: Path, name: str) -> Path:
    (tmp_path / name).mkdir()
    return tmp_path / name


def write_ckpt(folder: Path, layers, qc, config_name="config.json", shards=1):
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"{p}.{k}": v for p, t in layers.items() for k, v in t.items()}
    tensors["lm_head.weight"] = np.ones((4, 8), np.float16)
    if shards == 1:
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    else:
        names, wm = list(tensors), {}
        for i in range(shards):
            fn = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = names[i::shards]
            save_file({n: tensors[n] for n in part}, str(folder / fn), metadata={"format": "pt"})
            wm.update({n: fn for n in part})
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    if qc is not None:
        body = {"model_type": "mistral", "quantization_config": qc} if config_name == "config.json" else qc
        (folder / config_name).write_text(json.dumps(body))
    return folder


def awq_config(gs, version="gemm", **kw):
    return {"quant_method": "awq", "bits": 4, "group_size": gs, "zero_point": True, "version": version,
            "modules_to_not_convert": None, **kw}


VARIANTS = [(128, 72, 256, "float16"), (32, 40, 96, "float16"), (64, 24, 64, "bfloat16"), (-1, 24, 64, "float16")]


@pytest.mark.parametrize("gs,N,K,dtype", VARIANTS, ids=[f"g{v[0]}-N{v[1]}-K{v[2]}-{v[3]}" for v in VARIANTS])
def test_converts_bit_exact(gs, N, K, dtype, tmp_path):
    rng = np.random.default_rng([gs + 2, N, K])
    t, want = make_module(rng, N, K, gs, dtype)
    t["bias"] = rng.standard_normal(N).astype(np.float16)
    src = write_ckpt(tmp_path / "src", {"model.layers.0.mlp.up_proj": t}, awq_config(gs, version="GEMM"))
    out = assert_converts(src, {"model.layers.0.mlp.up_proj.weight": want}, tmp_path, detect_as="awq")
    with qformat.safe_open(out["in_place"] / "model.safetensors") as f:
        d = f.descriptor("model.layers.0.mlp.up_proj.weight")
        assert d["codes"]["packing"] == {"container": 32, "bit_order": "lsb_first", "axis": 1, "order": [1, 0],
                                         "slot_order": AWQ_ORDER}
        assert d["zero"]["encoded"]["codes"]["packing"] == d["codes"]["packing"]
        assert "code_offset" not in d["zero"]["encoded"]["codes"]["element"]
        assert np.array_equal(f.get_tensor("model.layers.0.mlp.up_proj.bias"), t["bias"])


def test_autoawq_quant_config_and_no_config(tmp_path):
    rng = np.random.default_rng(1)
    t, want = make_module(rng, 40, 128, 64)
    # AutoAWQ's own quant_config.json
    src = write_ckpt(tmp_path / "a", {"m.q_proj": t}, {"zero_point": True, "q_group_size": 64, "w_bit": 4, "version": "GEMM"},
                     config_name="quant_config.json")
    assert_converts(src, {"m.q_proj.weight": want}, _out(tmp_path, "a_out"), detect_as="awq")
    # no config: the layout is told apart from GPTQ by the shapes (qweight [K, N/8], no g_idx)
    src = write_ckpt(tmp_path / "b", {"m.q_proj": t}, None)
    assert not get("gptq").detect(Checkpoint(src))
    assert_converts(src, {"m.q_proj.weight": want}, _out(tmp_path, "b_out"), detect_as="awq")


def test_sharded_source(tmp_path):
    rng = np.random.default_rng(2)
    layers, want = {}, {}
    for i, (N, K) in enumerate([(24, 64), (72, 128)]):
        p = f"model.layers.{i}.mlp.gate_proj"
        layers[p], want[p + ".weight"] = make_module(rng, N, K, 32)
    src = write_ckpt(tmp_path / "src", layers, awq_config(32), shards=2)
    assert Checkpoint(src).sharded
    assert_converts(src, want, tmp_path, detect_as="awq")


def test_gptq_is_not_detected_as_awq(tmp_path):
    folder = tmp_path / "g"
    folder.mkdir()
    save_file({"m.qweight": np.zeros((8, 24), np.int32), "m.qzeros": np.zeros((2, 3), np.int32),
               "m.scales": np.ones((2, 24), np.float16), "m.g_idx": (np.arange(64) // 32).astype(np.int32)},
              str(folder / "model.safetensors"))
    assert not get("awq").detect(Checkpoint(folder))
    assert get("gptq").detect(Checkpoint(folder))


def _err(src, code, tensor=None, field=None):
    with pytest.raises(QFormatError) as e:
        convert(src, src.parent / (src.name + "-out"), from_format="awq")
    assert e.value.code == code, e.value
    if tensor is not None:
        assert e.value.tensor == tensor, e.value
    if field is not None:
        assert e.value.field == field, e.value
    return str(e.value)


def test_errors(tmp_path):
    rng = np.random.default_rng(4)
    base, _ = make_module(rng, 24, 64, 32)
    cfg = awq_config(32)
    _err(write_ckpt(tmp_path / "zp", {"m": base}, dict(cfg, zero_point=False)), "CONVERT_UNSUPPORTED", field="quantization_config.zero_point")
    for v in ("gemv", "gemv_fast", "marlin"):
        _err(write_ckpt(tmp_path / v, {"m": base}, dict(cfg, version=v)), "CONVERT_UNSUPPORTED", field="quantization_config.version")
    _err(write_ckpt(tmp_path / "b3", {"m": base}, dict(cfg, bits=3)), "CONVERT_UNSUPPORTED", field="quantization_config.bits")

    t = {k: v for k, v in base.items() if k != "qzeros"}
    msg = _err(write_ckpt(tmp_path / "noz", {"m": t}, cfg), "CONVERT_SOURCE_INVALID", tensor="m.qzeros")
    assert "expected a tensor" in msg

    t = dict(base, scales=np.ones((3, 24), np.float16))
    msg = _err(write_ckpt(tmp_path / "sc", {"m": t}, cfg), "CONVERT_SOURCE_INVALID", tensor="m.scales")
    assert "[3, 24]" in msg and "[2, 24]" in msg

    t = dict(base, qweight=base["qweight"][:, :2])
    msg = _err(write_ckpt(tmp_path / "qw", {"m": t}, cfg), "CONVERT_SOURCE_INVALID", tensor="m.qweight")
    assert "[64, 3]" in msg

    t = dict(base, qzeros=np.zeros((2, 4), np.int32))
    _err(write_ckpt(tmp_path / "qz", {"m": t}, cfg), "CONVERT_SOURCE_INVALID", tensor="m.qzeros")

    # K = 64 is not a multiple of 48, which WQLinear_GEMM asserts
    t = dict(base, scales=np.ones((2, 24), np.float16))
    msg = _err(write_ckpt(tmp_path / "kg", {"m": t}, awq_config(48)), "CONVERT_SOURCE_INVALID", tensor="m.qweight")
    assert "multiple of group_size 48" in msg
