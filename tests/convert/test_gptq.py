"""``qformat convert --from gptq``: GPTQ v1/v2 checkpoints, 2/3/4/8 bits, groups, act-order.

No GPTQ library installs on this CPU machine, so the oracle is written from the public code:

- the packer transcribes AutoGPTQ ``auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py``
  ``QuantLinear.pack`` (qweight along K, qzeros along N, the 3-bit word-crossing stream), with
  the v1 zero points stored as ``(z - 1) mod 2^b`` per code (the ``zeros -= 1`` of that pack;
  GPTQModel's ``convert_gptq_v1_to_v2_format`` adds the 1 back); it is checked against words
  computed by hand below;
- the dequantization transcribes the torch path of AutoGPTQ
  ``auto_gptq/nn_modules/qlinear/qlinear_cuda.py`` ``QuantLinear.forward`` (shifts by ``wf``,
  masks, the 3-bit splice of codes 10 and 21, ``zeros + 1`` for v1 with the ``& maxq`` of
  AutoGPTQ's triton kernel, then ``scales[g_idx] * (weight - zeros[g_idx])``), computed with
  torch in the scales' dtype as the runtime does.  It shares no code with qformat's decoder.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

import qformat
from qformat.convert import Checkpoint, convert, describe, get
from qformat.errors import QFormatError

from .helpers import assert_converts, bits_equal


# -- the packer (AutoGPTQ qlinear_cuda_old.pack, transcribed) -------------------------------------

def _pack_stream(vals: np.ndarray, bits: int, nwords: int) -> np.ndarray:
    """Pack ``vals`` [L, M] (codes along axis 0) into [nwords, M] uint32 words, the loop of
    AutoGPTQ ``pack``: 2/4/8 bits whole codes per word; 3 bits 10 codes, then code 10 split
    (2 bits at 30-31, 1 bit in the next word), 10 codes shifted by 1, code 21 split (1 bit at 31,
    2 in the next word), 10 codes shifted by 2.  Rows past L are zero (padding)."""
    per = {2: 16, 3: 32, 4: 8, 8: 4}[bits]
    L = vals.shape[0]
    padded = np.zeros((-(-L // per) * per, vals.shape[1]), dtype=np.uint32)
    padded[:L] = vals
    out = np.zeros((-(-padded.shape[0] * bits // 32), vals.shape[1]), dtype=np.uint32)
    i = row = 0
    while row < out.shape[0]:
        if bits in (2, 4, 8):
            for j in range(i, i + 32 // bits):
                out[row] |= padded[j] << np.uint32(bits * (j - i))
            i += 32 // bits
            row += 1
        else:
            for j in range(i, i + 10):
                out[row] |= padded[j] << np.uint32(3 * (j - i))
            i += 10
            out[row] |= padded[i] << np.uint32(30)
            row += 1
            out[row] |= (padded[i] >> np.uint32(2)) & np.uint32(1)
            i += 1
            for j in range(i, i + 10):
                out[row] |= padded[j] << np.uint32(3 * (j - i) + 1)
            i += 10
            out[row] |= padded[i] << np.uint32(31)
            row += 1
            out[row] |= (padded[i] >> np.uint32(1)) & np.uint32(3)
            i += 1
            for j in range(i, i + 10):
                out[row] |= padded[j] << np.uint32(3 * (j - i) + 2)
            i += 10
            row += 1
    return out[:nwords]


def pack_qweight(q: np.ndarray, bits: int) -> np.ndarray:
    """q [K, N] codes -> qweight int32 [K*b/32, N]."""
    return _pack_stream(q.astype(np.uint32), bits, -(-q.shape[0] * bits // 32)).view(np.int32)


def pack_qzeros(z: np.ndarray, bits: int, v1: bool) -> np.ndarray:
    """z [groups, N] true zero points -> qzeros int32 [groups, ceil(N*b/32)] (packed along N).
    v1 stores z - 1 modulo 2^b per code (AutoGPTQ ``zeros -= 1``)."""
    st = ((z.astype(np.int64) - 1) % (1 << bits) if v1 else z).astype(np.uint32)
    return _pack_stream(st.T, bits, -(-z.shape[1] * bits // 32)).T.copy().view(np.int32)


def test_packer_matches_hand_computed_words():
    col = lambda v: np.array(v, dtype=np.uint32)[:, None]  # noqa: E731
    # 4-bit: code j at bits 4j..4j+3 of the word
    assert pack_qweight(col([1, 2, 3, 4, 5, 6, 7, 8]), 4).view(np.uint32)[0, 0] == 0x87654321
    # 2-bit: codes 0,1,2,3 repeated -> each byte 0b11_10_01_00
    assert pack_qweight(col([0, 1, 2, 3] * 4), 2).view(np.uint32)[0, 0] == 0xE4E4E4E4
    # 8-bit: bytes in little-endian order of significance
    assert pack_qweight(col([0x11, 0x22, 0x33, 0x44]), 8).view(np.uint32)[0, 0] == 0x44332211
    # 3-bit: SPEC §7.12 c's codes 5,3,6,1,7,2 form the stream integer 0x1739D
    w = pack_qweight(col([5, 3, 6, 1, 7, 2] + [0] * 26), 3).view(np.uint32)[:, 0]
    assert list(w) == [0x1739D, 0, 0]
    # 3-bit: code 10 (stream bits 30..32) = 7 -> bits 30, 31 of word 0 and bit 0 of word 1;
    # code 21 (bits 63..65) = 5 = 0b101 -> bit 31 of word 1 (its low bit 1), bits 0..1 of word 2 = 0b10
    c = [0] * 32
    c[10], c[21] = 7, 5
    assert list(pack_qweight(col(c), 3).view(np.uint32)[:, 0]) == [0xC0000000, 0x80000001, 0x2]
    # qzeros along N, v1: z = 8 everywhere (4-bit sym) stores 7; z = 0..7 stores 15, 0, 1, .., 6
    assert pack_qzeros(np.full((1, 8), 8), 4, v1=True).view(np.uint32)[0, 0] == 0x77777777
    assert pack_qzeros(np.arange(8)[None, :], 4, v1=True).view(np.uint32)[0, 0] == 0x6543210F
    assert pack_qzeros(np.arange(8)[None, :], 4, v1=False).view(np.uint32)[0, 0] == 0x76543210


# -- the oracle dequantization (AutoGPTQ qlinear_cuda torch path, transcribed) ---------------------

def _unpack_along0(words: torch.Tensor, bits: int) -> torch.Tensor:
    """words int32 [W, M] -> codes [W*32/b, M] as AutoGPTQ unpacks qweight."""
    if bits in (2, 4, 8):
        wf = torch.arange(0, 32, bits, dtype=torch.int32)
        w = torch.bitwise_right_shift(words.unsqueeze(1).expand(-1, 32 // bits, -1), wf[None, :, None])
        w = torch.bitwise_and(w.to(torch.int16), (1 << bits) - 1)
        return w.reshape(-1, words.shape[1])
    wf = torch.tensor([[0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 0],
                       [0, 1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31],
                       [0, 2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 0]], dtype=torch.int32).reshape(1, 3, 12)
    w = words.reshape(words.shape[0] // 3, 3, 1, words.shape[1]).expand(-1, -1, 12, -1)
    w = (w >> wf.unsqueeze(-1)) & 0x7
    w[:, 0, 10] = (w[:, 0, 10] & 0x3) | ((w[:, 1, 0] << 2) & 0x4)
    w[:, 1, 11] = (w[:, 1, 11] & 0x1) | ((w[:, 2, 0] << 1) & 0x6)
    w = w & 0x7
    return torch.cat([w[:, 0, :11], w[:, 1, 1:12], w[:, 2, 1:11]], dim=1).reshape(-1, words.shape[1]).to(torch.int16)


def dequant(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, g_idx: np.ndarray, bits: int, v1: bool,
            scale_dtype: torch.dtype) -> np.ndarray:
    """W [N, K] in the scales' dtype, as the runtime computes it."""
    K, N = g_idx.shape[0], scales.shape[1]
    weight = _unpack_along0(torch.from_numpy(qweight), bits)[:K]
    zw = torch.from_numpy(qzeros)
    if bits == 3:  # AutoGPTQ unpacks qzeros with the same splice, over groups of 3 words
        zw = torch.cat([zw, torch.zeros(zw.shape[0], (-zw.shape[1]) % 3, dtype=torch.int32)], dim=1)
    zeros = _unpack_along0(zw.T.contiguous(), bits).T[:, :N]
    if v1:
        zeros = (zeros + 1) & ((1 << bits) - 1)
    sc = torch.from_numpy(scales.view(np.int16)).view(scale_dtype)
    g = torch.from_numpy(g_idx.astype(np.int64))
    w = sc[g] * (weight - zeros[g])  # int16 tensor times fp16/bf16: one rounding in the scales' dtype
    assert w.dtype == scale_dtype
    out = w.T.contiguous()
    return out.view(torch.int16).numpy().view(scales.dtype)


def test_dequant_hand_example():
    # K = 8, N = 1, 4-bit v1, one group: codes 0..7, z = 3 (stored 2), s = 0.5 -> (q - 3) * 0.5
    qw = pack_qweight(np.arange(8)[:, None], 4)
    qz = pack_qzeros(np.array([[3]]), 4, v1=True)
    assert qz.view(np.uint32)[0, 0] == 2
    w = dequant(qw, qz, np.array([[0.5]], np.float16), np.zeros(8, np.int32), 4, True, torch.float16)
    assert w.tolist() == [[-1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0]]


# -- random checkpoints ---------------------------------------------------------------------------



def _scales(rng, shape, dtype: str) -> np.ndarray:
    s = (rng.uniform(2e-3, 6e-2, shape) * rng.choice([1.0, 1e-3], shape, p=[0.9, 0.1])).astype(np.float32)
    if dtype == "float16":
        return s.astype(np.float16)
    import ml_dtypes
    return s.astype(ml_dtypes.bfloat16)


def make_module(rng, N, K, bits, gs, v1, desc_act, dtype, sym=False, zero_all=None):
    """Tensors of one GPTQ layer (true codes/zeros drawn at random) and the oracle's weight."""
    G = K if gs == -1 else gs
    ng = -(-K // G)
    q = rng.integers(0, 1 << bits, (K, N))
    z = np.full((ng, N), 1 << (bits - 1)) if sym else rng.integers(0, 1 << bits, (ng, N))
    if zero_all is not None:
        z[:] = zero_all
    g = np.arange(K) // G
    if desc_act:
        g = rng.permutation(g)  # act-order: natural row order, non-monotonic group of each row
    t = {"qweight": pack_qweight(q, bits), "qzeros": pack_qzeros(z, bits, v1), "scales": _scales(rng, (ng, N), dtype),
         "g_idx": g.astype(np.int32)}
    want = dequant(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], bits, v1, getattr(torch, dtype))
    # the oracle is the formula itself, checked in float64 on the true codes (no wrap in play)
    sc64 = t["scales"].astype(np.float64)
    ref = (sc64[g] * (q - z[g])).T
    assert np.array_equal(want.astype(np.float64), ref.astype(want.dtype).astype(np.float64))
    return t, want


def _out(tmp_path: Path, name: str) -> Path:
    (tmp_path / name).mkdir()
    return tmp_path / name


def write_ckpt(folder: Path, layers: dict[str, dict[str, np.ndarray]], qc: dict | None, shards: int = 1,
               config_name: str = "config.json") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"{p}.{k}": v for p, t in layers.items() for k, v in t.items()}
    tensors["model.embed_tokens.weight"] = np.arange(12, dtype=np.float16).reshape(3, 4)
    if shards == 1:
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    else:
        names = list(tensors)
        parts = [names[i::shards] for i in range(shards)]
        wm = {}
        for i, part in enumerate(parts):
            fn = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            save_file({n: tensors[n] for n in part}, str(folder / fn), metadata={"format": "pt"})
            wm.update({n: fn for n in part})
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    if qc is not None:
        body = {"model_type": "llama", "quantization_config": qc} if config_name == "config.json" else qc
        (folder / config_name).write_text(json.dumps(body))
    return folder


def gptq_config(bits, gs, fmt, desc_act, sym=False):
    return {"quant_method": "gptq", "bits": bits, "group_size": gs, "desc_act": desc_act, "sym": sym,
            "checkpoint_format": fmt, "damp_percent": 0.01, "true_sequential": True}


# (bits, group size, checkpoint_format, desc_act, scales dtype, sym, N, K)
VARIANTS = [
    (4, 128, "gptq", False, "float16", False, 72, 256),
    (4, 32, "gptq_v2", True, "float16", False, 40, 96),
    (3, 64, "gptq", False, "float16", True, 64, 96),      # K not a multiple of the group size
    (3, 32, "gptq_v2", True, "bfloat16", False, 32, 128),
    (2, -1, "gptq", False, "float16", False, 24, 64),     # per channel
    (2, 32, "gptq_v2", True, "float16", False, 72, 64),
    (8, 64, "gptq", True, "bfloat16", False, 40, 96),     # act-order with a partial last group
    (8, -1, "gptq_v2", False, "float16", True, 24, 64),
]


@pytest.mark.parametrize("bits,gs,fmt,desc_act,dtype,sym,N,K", VARIANTS,
                         ids=[f"b{v[0]}-g{v[1]}-{v[2]}-{'act' if v[3] else 'seq'}-{v[4]}-{'sym' if v[5] else 'asym'}" for v in VARIANTS])
def test_converts_bit_exact(bits, gs, fmt, desc_act, dtype, sym, N, K, tmp_path):
    rng = np.random.default_rng([bits, K, N])
    t, want = make_module(rng, N, K, bits, gs, fmt == "gptq", desc_act, dtype, sym)
    t["bias"] = rng.standard_normal(N).astype(np.float16)
    src = write_ckpt(tmp_path / "src", {"model.layers.0.mlp.down_proj": t}, gptq_config(bits, gs, fmt, desc_act, sym))
    out = assert_converts(src, {"model.layers.0.mlp.down_proj.weight": want}, tmp_path, detect_as="gptq")
    with qformat.safe_open(out["in_place"] / "model.safetensors") as f:
        d = f.descriptor("model.layers.0.mlp.down_proj.weight")
        assert d["codes"] == {"tensor": "model.layers.0.mlp.down_proj.qweight",
                              "element": {"type": "int", "bits": bits, "signedness": "unsigned"},
                              "packing": {"container": 32, "bit_order": "lsb_first", "axis": 0, "order": [1, 0]}}
        assert d["zero"]["encoded"]["codes"]["element"].get("code_offset", 0) == (1 if fmt == "gptq" else 0)
        idx = d["scale"]["blocks"].get("index")
        assert (idx is not None) == desc_act
        assert d["zero"]["blocks"] == d["scale"]["blocks"]
        # the bias and the untouched tensors stay plain
        assert np.array_equal(f.get_tensor("model.layers.0.mlp.down_proj.bias"), t["bias"])


def test_sharded_source(tmp_path):
    rng = np.random.default_rng(7)
    layers, want = {}, {}
    for i, (N, K) in enumerate([(24, 64), (40, 96), (72, 128)]):
        p = f"model.layers.{i}.self_attn.o_proj"
        layers[p], want[p + ".weight"] = make_module(rng, N, K, 4, 32, True, True, "float16")
    src = write_ckpt(tmp_path / "src", layers, gptq_config(4, 32, "gptq", True), shards=2)
    ck = Checkpoint(src)
    assert ck.sharded and len(ck.files) == 2
    # the g_idx of some layer lives in the other shard than its qweight: the writer moves it
    assert len({ck.file_of(f"{p}.{s}") for p in layers for s in ("qweight", "g_idx")}) == 2
    out = assert_converts(src, want, tmp_path, detect_as="gptq")
    idx = json.loads((out["in_place"] / "model.safetensors.index.json").read_text())
    for p in layers:
        assert idx["weight_map"][p + ".weight"] == idx["weight_map"][p + ".qweight"] == idx["weight_map"][p + ".g_idx"]


def test_v1_true_zero_point_zero(tmp_path):
    """A v1 asym zero point of 0 is stored as -1, i.e. 15 in its nibble (packing-layouts §1);
    code_offset 1 reads it back as (15 + 1) mod 16 = 0, the value quantized."""
    rng = np.random.default_rng(3)
    t, want = make_module(rng, 40, 64, 4, 32, True, False, "float16")
    # force the zero point of column 5 (and all of group 1) to 0 and rebuild
    G, N, K = 32, 40, 64
    z = np.asarray(_unpack_along0(torch.from_numpy(t["qzeros"]).T.contiguous(), 4).T[:, :N]).astype(np.int64)
    z = (z + 1) % 16
    z[0, 5] = 0
    z[1, :] = 0
    t["qzeros"] = pack_qzeros(z, 4, v1=True)
    words = t["qzeros"].view(np.uint32)
    assert (words[0, 0] >> 20) & 0xF == 0xF and words[1, 0] == 0xFFFFFFFF
    want = dequant(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], 4, True, torch.float16)
    q = np.asarray(_unpack_along0(torch.from_numpy(t["qweight"]), 4)).astype(np.int64)
    s = t["scales"].astype(np.float32)
    g = np.arange(K) // G
    assert np.array_equal(want, (s[g] * (q - z[g])).T.astype(np.float16))
    src = write_ckpt(tmp_path / "src", {"lm.fc": t}, gptq_config(4, 32, "gptq", False))
    assert_converts(src, {"lm.fc.weight": want}, tmp_path)


def test_detected_without_config_and_with_quantize_config(tmp_path):
    rng = np.random.default_rng(11)
    # no config at all: tensors only; act-order inferred from a non-monotonic g_idx, 3 bits from shapes
    t, want = make_module(rng, 32, 96, 3, 32, True, True, "float16")
    src = write_ckpt(tmp_path / "a", {"m.proj": t}, None)
    assert_converts(src, {"m.proj.weight": want}, _out(tmp_path, "a_out"), detect_as="gptq")
    # no config, monotonic g_idx: grouped by k // G with G read from g_idx
    t, want = make_module(rng, 24, 64, 4, 16, True, False, "float16")
    src = write_ckpt(tmp_path / "b", {"m.proj": t}, None)
    _, _, d = describe(src)
    assert d.descriptors["m.proj.weight"]["scale"]["blocks"] == {"type": "grid", "size": [1, 16]}
    assert_converts(src, {"m.proj.weight": want}, _out(tmp_path, "b_out"), detect_as="gptq")
    # AutoGPTQ's quantize_config.json (no quant_method key in older releases)
    t, want = make_module(rng, 40, 64, 8, 32, False, False, "float16")
    qc = gptq_config(8, 32, "gptq_v2", False)
    del qc["quant_method"]
    src = write_ckpt(tmp_path / "c", {"m.proj": t}, qc, config_name="quantize_config.json")
    assert_converts(src, {"m.proj.weight": want}, _out(tmp_path, "c_out"), detect_as="gptq")


def test_awq_is_not_detected_as_gptq(tmp_path):
    # AWQ GEMM shapes: qweight [K, N/8], scales [K/G, N], no g_idx
    folder = tmp_path / "awq"
    folder.mkdir()
    save_file({"m.qweight": np.zeros((64, 3), np.int32), "m.qzeros": np.zeros((2, 3), np.int32),
               "m.scales": np.ones((2, 24), np.float16)}, str(folder / "model.safetensors"))
    assert not get("gptq").detect(Checkpoint(folder))


def _err(src, code, tensor=None, field=None, from_format="gptq"):
    with pytest.raises(QFormatError) as e:
        convert(src, src.parent / (src.name + "-out"), from_format=from_format)
    assert e.value.code == code, e.value
    if tensor is not None:
        assert e.value.tensor == tensor, e.value
    if field is not None:
        assert e.value.field == field, e.value
    return str(e.value)


def test_errors(tmp_path):
    rng = np.random.default_rng(5)
    base, _ = make_module(rng, 24, 64, 4, 32, True, False, "float16")
    cfg = gptq_config(4, 32, "gptq", False)

    t = {k: v for k, v in base.items() if k != "qzeros"}
    msg = _err(write_ckpt(tmp_path / "noz", {"m": t}, cfg), "CONVERT_SOURCE_INVALID", tensor="m.qzeros")
    assert "expected a tensor" in msg

    t = dict(base, scales=base["scales"][:1])
    msg = _err(write_ckpt(tmp_path / "scales", {"m": t}, cfg), "CONVERT_SOURCE_INVALID", tensor="m.scales")
    assert "[1, 24]" in msg and "[2, 24]" in msg

    t = dict(base, qzeros=base["qzeros"][:, :2])
    msg = _err(write_ckpt(tmp_path / "qz", {"m": t}, cfg), "CONVERT_SOURCE_INVALID", tensor="m.qzeros")
    assert "[2, 2]" in msg and "[2, 3]" in msg

    _err(write_ckpt(tmp_path / "bits5", {"m": base}, gptq_config(5, 32, "gptq", False)), "CONVERT_UNSUPPORTED", field="quantization_config.bits")
    _err(write_ckpt(tmp_path / "bitsstr", {"m": base}, dict(cfg, bits="4")), "CONVERT_SOURCE_INVALID", field="quantization_config.bits")
    _err(write_ckpt(tmp_path / "marlin", {"m": base}, dict(cfg, checkpoint_format="marlin")), "CONVERT_UNSUPPORTED",
         field="quantization_config.checkpoint_format")

    t = dict(base, g_idx=np.where(np.arange(64) == 3, 2, base["g_idx"]).astype(np.int32))
    msg = _err(write_ckpt(tmp_path / "grange", {"m": t}, dict(cfg, desc_act=True)), "CONVERT_SOURCE_INVALID", tensor="m.g_idx")
    assert "g_idx[3] is 2" in msg

    t = dict(base, g_idx=base["g_idx"][::-1].copy())  # act-order g_idx while the config says desc_act false
    msg = _err(write_ckpt(tmp_path / "gdis", {"m": t}, cfg), "CONVERT_SOURCE_INVALID", tensor="m.g_idx")
    assert "desc_act is false" in msg

    t = {k: v for k, v in base.items() if k != "g_idx"}
    _err(write_ckpt(tmp_path / "nog", {"m": t}, dict(cfg, desc_act=True)), "CONVERT_SOURCE_INVALID", tensor="m.g_idx")

    t = dict(base, qweight=base["qweight"].view(np.float32))
    msg = _err(write_ckpt(tmp_path / "dtype", {"m": t}, cfg), "CONVERT_SOURCE_INVALID", tensor="m.qweight")
    assert "F32" in msg and "I32" in msg


def test_bits_equal_sanity():
    # the comparison the helpers rely on tells a last-bit difference apart
    a = np.array([1.0, 2.0], np.float16)
    b = a.copy()
    b.view(np.uint16)[1] += 1
    assert not bits_equal(a, b)[0]
