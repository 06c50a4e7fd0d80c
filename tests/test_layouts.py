"""Device layouts (SPEC.md §11): tinygemm_int4_cuda, marlin_dense, the forbidden CPU layout.

* NumPy pack/unpack are exact inverses (hypothesis, random shapes meeting the constraints);
* each pack is checked against an independent, literal transcription of the kernel's own
  packing code (cited below) and against hand-computed words (the examples of SPEC.md §11.3,
  §11.4), the transcriptions themselves against the same hand-computed words;
* device -> canonical -> device is lossless, through files, for the NumPy, torch and JAX readers;
* ``qformat check`` refuses the CPU int4pack layout with LAYOUT_FORBIDDEN;
* the torch reader's load-time tinygemm repack gives the dequantized matmul within bf16
  rounding on CPU (the CUDA layout can only run on CUDA: there it is verified by the NumPy
  transcription of int4mm.cu, and by a CUDA-only test that is skipped without a GPU).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import qformat
from qformat import layouts as L
from qformat.layouts import marlin, tinygemm

# -- independent transcriptions of the kernels' packing code --------------------------------


def tinygemm_kernel_transcription(w_u8: np.ndarray, inner_k_tiles: int) -> np.ndarray:
    """pytorch aten/src/ATen/native/cuda/int4mm.cu, ``_convert_weight_to_int4pack_cuda`` and
    ``matrix_to_m16n8k16_Bint4_layout`` (non-ROCm branch), one CUDA thread at a time.
    ``w_u8``: uint8 [n][k/2], the even k in the high nibble (the op's input)."""
    n, k2 = w_u8.shape
    k = k2 * 2
    n_tiles, k_super = -(-n // 8), -(-k // (inner_k_tiles * 16))
    out = np.zeros((n_tiles, k_super, 32, inner_k_tiles // 2), np.uint32)
    for k_outer in range(k_super):  # blockIdx.x
        for n_tile in range(n_tiles):  # blockIdx.y
            for t in range(32):  # threadIdx.x
                for inner in range(0, inner_k_tiles, 2):
                    n0 = n_tile * 8 + t // 4
                    k_base0 = (k_outer * inner_k_tiles + inner) * 16 // 2
                    ks = [k_base0 + t % 4, k_base0 + t % 4 + 4]
                    k_base1 = k_base0 + 16 // 2
                    ks += [k_base1 + t % 4, k_base1 + t % 4 + 4]
                    v = [int(w_u8[n0, kk]) if (n0 < n and kk < k2) else 0 for kk in ks]
                    pack = ((v[3] & 0xF) << 28) | ((v[2] & 0xF) << 24) | ((v[1] & 0xF) << 20) | ((v[0] & 0xF) << 16) \
                        | ((v[3] & 0xF0) << 8) | ((v[2] & 0xF0) << 4) | (v[1] & 0xF0) | ((v[0] & 0xF0) >> 4)
                    out[n_tile, k_outer, t, inner // 2] = pack
    return out


def marlin_kernel_transcription(codes_nk: np.ndarray, bits: int) -> np.ndarray:
    """IST-DASLab/marlin ``marlin/__init__.py`` (``_get_perms``, ``Layer.pack``) as generalised
    to 8 bits by vLLM ``marlin_utils_test.py`` (``get_weight_perm``, ``marlin_permute_weights``,
    ``marlin_weights``).  Input: the stored codes (q + 2^(b-1)) of ``linear.weight`` [N, K]."""
    perm = []
    for i in range(32):
        perm1 = []
        col = i // 4
        for block in [0, 1]:
            for row in [2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4 + 4), 2 * (i % 4 + 4) + 1]:
                perm1.append(16 * row + col + 8 * block)
        for j in range(4):
            perm.extend([p + 256 * j for p in perm1])
    perm = np.array(perm)
    interleave = np.array([0, 2, 4, 6, 1, 3, 5, 7]) if bits == 4 else np.array([0, 2, 1, 3])
    perm = perm.reshape((-1, len(interleave)))[:, interleave].ravel()
    w = codes_nk.T  # linear.weight.data.t(): [K, N]
    size_k, size_n = w.shape
    tile = 16
    w = w.reshape((size_k // tile, tile, size_n // tile, tile)).transpose((0, 2, 1, 3)).reshape((size_k // tile, size_n * tile))
    res = w.reshape((-1, perm.size))[:, perm].reshape(w.shape).astype(np.uint32)
    pack_factor = 32 // bits
    q = np.zeros((res.shape[0], res.shape[1] // pack_factor), dtype=np.uint32)
    for i in range(pack_factor):
        q |= res[:, i::pack_factor] << bits * i
    return q


def marlin_scale_transcription(s: np.ndarray, size_k: int, group_size: int) -> np.ndarray:
    """vLLM ``marlin_utils.py`` ``get_scale_perms`` / ``marlin_permute_scales``; ``s`` [K/G, N]."""
    scale_perm = []
    for i in range(8):
        scale_perm.extend([i + 8 * j for j in range(8)])
    scale_perm_single = []
    for i in range(4):
        scale_perm_single.extend([2 * i + j for j in [0, 1, 8, 9, 16, 17, 24, 25]])
    size_n = s.shape[-1]
    if group_size < size_k and group_size != -1:
        s = s.reshape((-1, len(scale_perm)))[:, scale_perm]
    else:
        s = s.reshape((-1, len(scale_perm_single)))[:, scale_perm_single]
    return s.reshape((-1, size_n))


def _nk_codes(n: int, k: int, mod: int) -> np.ndarray:
    return ((np.arange(n)[:, None] + np.arange(k)[None, :]) % mod).astype(np.uint8)


# -- hand-computed words (SPEC.md §11.3, §11.4 examples) ------------------------------------
def test_tinygemm_hand_example():
    q = _nk_codes(8, 32, 16)
    u8 = ((q[:, ::2] << 4) | q[:, 1::2]).astype(np.uint8)
    for words in (tinygemm.pack(q, 2), tinygemm_kernel_transcription(u8, 2)):
        assert words.shape == (1, 1, 32, 1)
        assert int(words[0, 0, 0, 0]) == 0x91918080  # row 0: k 0,8,16,24 | 1,9,17,25
        assert int(words[0, 0, 5, 0]) == 0xC4C4B3B3  # row 1: k 2,10,18,26 | 3,11,19,27


@pytest.mark.parametrize("bits, word", [(4, 0x19910880), (8, 0x09010800)])
def test_marlin_hand_example(bits: int, word: int):
    q = _nk_codes(64, 128, 1 << bits)
    for d in (marlin.pack(q, bits), marlin_kernel_transcription(q, bits)):
        assert d.shape == (128 // 16, 64 * 16 * bits // 32)
        assert int(d[0, 0]) == word
    assert marlin.weight_perm(4)[:8].tolist() == [0, 128, 8, 136, 16, 144, 24, 152]


def test_marlin_scale_perm_hand_example():
    assert marlin.SCALE_PERM[:10].tolist() == [0, 8, 16, 24, 32, 40, 48, 56, 1, 9]
    assert marlin.SCALE_PERM_SINGLE[:10].tolist() == [0, 1, 8, 9, 16, 17, 24, 25, 2, 3]


# -- pack == transcription; pack/unpack inverses (hypothesis) -------------------------------
@settings(max_examples=15, deadline=None)
@given(nt=st.integers(1, 3), t=st.sampled_from([2, 4, 8]), kt=st.integers(1, 2), seed=st.integers(0, 2**32 - 1))
def test_tinygemm_pack_matches_kernel_and_inverts(nt: int, t: int, kt: int, seed: int):
    rng = np.random.default_rng(seed)
    n, k = 8 * nt, 16 * t * kt
    q = rng.integers(0, 16, size=(n, k)).astype(np.uint8)
    d = tinygemm.pack(q, t)
    u8 = ((q[:, ::2] << 4) | q[:, 1::2]).astype(np.uint8)
    assert np.array_equal(d, tinygemm_kernel_transcription(u8, t))
    assert np.array_equal(tinygemm.unpack(d, n, k, t), q)
    words = rng.integers(0, 2**32, size=d.shape, dtype=np.uint64).astype(np.uint32)  # every word is a valid device word
    assert np.array_equal(tinygemm.pack(tinygemm.unpack(words, n, k, t), t), words)


@settings(max_examples=10, deadline=None)
@given(nm=st.integers(1, 2), km=st.integers(1, 2), bits=st.sampled_from([4, 8]), seed=st.integers(0, 2**32 - 1))
def test_marlin_pack_matches_kernel_and_inverts(nm: int, km: int, bits: int, seed: int):
    rng = np.random.default_rng(seed)
    n, k = 64 * nm, 128 * km
    q = rng.integers(0, 1 << bits, size=(n, k)).astype(np.uint8)
    d = marlin.pack(q, bits)
    assert np.array_equal(d, marlin_kernel_transcription(q, bits))
    assert np.array_equal(marlin.unpack(d, n, k, bits), q)
    words = rng.integers(0, 2**32, size=d.shape, dtype=np.uint64).astype(np.uint32)
    assert np.array_equal(marlin.pack(marlin.unpack(words, n, k, bits), bits), words)
    for g in (32, 64, 128, None):
        rows = 1 if g is None else k // g
        s = rng.normal(size=(rows, n)).astype(np.float16)
        ps = marlin.permute_scales(s, g, k)
        assert np.array_equal(ps, marlin_scale_transcription(s, k, -1 if g is None else g))
        assert np.array_equal(marlin.unpermute_scales(ps, g, k), s)


def test_code_positions_agree_with_pack():
    """The gather maps the JAX reader uses (qformat.layouts.code_positions) locate every code."""
    rng = np.random.default_rng(5)
    for name, params, shape, bits, g in CASES:
        desc, comps, _ = _device(name, params, shape, bits, g, rng)
        d = qformat.descriptor.Descriptor.from_dict(desc)
        q = qformat.decode.read_codes(*L.canonical_view(d, qformat.sources.ArraySource(comps)), ((0, shape[0]), (0, shape[1])))
        pos = L.code_positions(d)
        words = comps[d.codes.tensor].view(np.uint32).reshape(-1)
        per = 32 // bits
        got = (words[pos // per] >> (bits * (pos % per)).astype(np.uint32)) & ((1 << bits) - 1)
        assert np.array_equal(got, q)


# -- files: device -> canonical -> device, readers, check ------------------------------------
CASES = [
    ("tinygemm_int4_cuda", {"inner_k_tiles": 2}, (8, 64), 4, 32),
    ("tinygemm_int4_cuda", {"inner_k_tiles": 8}, (24, 256), 4, 256),
    ("marlin_dense", {}, (64, 256), 4, 64),
    ("marlin_dense", {}, (128, 128), 4, None),
    ("marlin_dense", {}, (64, 128), 8, 128),  # G == K: the per-channel scale permutation
]


def _device(name, params, shape, bits, group, rng):
    w = rng.normal(size=shape).astype(np.float32)
    qt = qformat.quantize(w, "int", bits=bits, group_size=group, symmetric=True, dtype="bfloat16")
    d, c = L.to_layout(qt.descriptor, qt.components, name, params)
    return d, c, qt


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2][0]}x{c[2][1]}-b{c[3]}-g{c[4]}")
def test_device_canonical_device_is_lossless(case, tmp_path: Path):
    import qformat_jax
    import qformat_torch
    import torch

    rng = np.random.default_rng(11)
    d, c, qt = _device(*case, rng)
    ref = qt.dequantize().view(np.uint16)
    assert d["layout"]["name"] == case[0]
    assert d["scale"]["order"] == [1, 0]
    # canonical -> device -> canonical -> device: the same device bytes
    cd, cc = L.to_canonical(d, c)
    assert "layout" not in cd
    d2, c2 = L.to_layout(cd, cc, case[0], case[1])
    assert d2 == d and all(np.array_equal(c[k], c2[k]) for k in c)
    path = tmp_path / "w.safetensors"
    qformat.save_file({"w": qformat.QTensor(d, c)}, path)
    meta = qformat.safe_open(path).header.metadata
    assert json.loads(meta["qformat"])["version"] == "1.2"  # a 1.1 layout, and digests (1.2)
    assert qformat.check(path).ok
    assert np.array_equal(qformat.load_file(path)["w"].view(np.uint16), ref)
    assert np.array_equal(qformat_torch.load_file(path)["w"].view(torch.int16).numpy().view(np.uint16), ref)
    assert np.array_equal(np.asarray(qformat_jax.load_file(path)["w"]).view(np.uint16), ref)
    with qformat.safe_open(path) as f:  # any box decodes (the whole component is unpacked)
        assert np.array_equal(f.get_slice("w")[3:7, 5:40].view(np.uint16), ref[3:7, 5:40])
        with pytest.raises(qformat.QFormatError) as ei:
            f.get_qtensor_slice("w", (slice(0, 8), slice(0, 32)))
        assert ei.value.code == "SLICE_INVALID"
    # canonical file: version 1.2 (digests only), same values
    cpath = tmp_path / "c.safetensors"
    qformat.save_file({"w": qformat.QTensor(cd, cc)}, cpath)
    assert json.loads(qformat.safe_open(cpath).header.metadata["qformat"])["version"] == "1.2"
    assert np.array_equal(qformat.load_file(cpath)["w"].view(np.uint16), ref)


def test_repack_unpacks_a_device_layout(tmp_path: Path):
    from qformat.convert.repack import repack
    from qformat.descriptor import Descriptor
    from qformat.sources import ArraySource

    d, c, qt = _device("marlin_dense", {}, (64, 128), 4, 32, np.random.default_rng(2))
    out, arrays = repack("w", Descriptor.from_dict(d), ArraySource(c))
    assert "layout" not in out
    assert np.array_equal(qformat.QTensor(out, arrays).dequantize().view(np.uint16), qt.dequantize().view(np.uint16))


def _write_raw(tmp_path: Path, desc: dict, comps: dict, version: str) -> Path:
    from tests.filebuild import build_file

    path = tmp_path / "f.safetensors"
    path.write_bytes(build_file(comps, qformat=json.dumps({"version": version, "tensors": {"w": desc}})))
    return path


@pytest.mark.parametrize("version, code", [("1.1", "LAYOUT_FORBIDDEN"), ("1.0", "LAYOUT_UNKNOWN")])
def test_cpu_int4pack_layout_is_refused(version: str, code: str, tmp_path: Path):
    """A file declaring torch's CPU int4pack layout fails ``qformat check`` with its own code
    (in a 1.0 file the 1.1 name is unknown, as a 1.0 reader reports it)."""
    import torch

    d, c, _ = _device("tinygemm_int4_cuda", {"inner_k_tiles": 2}, (16, 64), 4, 32, np.random.default_rng(4))
    cd, cc = L.to_canonical(d, c)
    codes = qformat.decode.read_codes(qformat.descriptor.Descriptor.from_dict(cd), qformat.sources.ArraySource(cc), ((0, 16), (0, 64)))
    cpu = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.from_numpy(codes.astype(np.int32)), 2).numpy()
    cd = dict(cd, layout={"name": "tinygemm_int4_cpu", "parameters": {}})
    cc = dict(cc, codes=cpu)
    path = _write_raw(tmp_path, cd, cc, version)
    rep = qformat.check(path)
    assert [p.code for p in rep.problems] == [code]
    with pytest.raises(qformat.QFormatError) as ei:
        qformat.load_file(path)
    assert ei.value.code == code
    from qformat.cli import main

    assert main(["check", str(path)]) != 0


def test_required_version():
    d, c, qt = _device("tinygemm_int4_cuda", {"inner_k_tiles": 2}, (8, 64), 4, 32, np.random.default_rng(1))
    assert qformat.required_version([qt.descriptor]) == "1.0"
    assert qformat.required_version([qt.descriptor, d]) == "1.1"
    nested = {"shape": [2], "dtype": "float32", "codes": qt.descriptor["codes"],
              "scale": {"blocks": {"type": "grid", "size": [None]}, "op": "multiply", "encoded": d}}
    assert qformat.required_version({"x": nested}) == "1.1"


@pytest.mark.parametrize("mutate, code", [
    (lambda d: d["layout"]["parameters"].update(inner_k_tiles=3), "LAYOUT_INVALID"),
    (lambda d: d["layout"]["parameters"].update(inner_k_tiles=True), "LAYOUT_INVALID"),
    (lambda d: d["layout"]["parameters"].update(inner_k_tiles=4.0), None),  # an integer however written (§3.2)
    (lambda d: d.update(bias={"blocks": {"type": "grid", "size": [1, 64]}, "op": "add", "tensor": "scale"}), "LAYOUT_MISMATCH"),
    (lambda d: d["scale"].update(op="divide"), "LAYOUT_MISMATCH"),
    (lambda d: d.update(zero=d["scale"]), "LAYOUT_MISMATCH"),
    (lambda d: d["codes"]["element"].update(bits=8), "LAYOUT_MISMATCH"),
])
def test_tinygemm_descriptor_rules(mutate, code):
    from qformat.descriptor import Descriptor

    d, c, _ = _device("tinygemm_int4_cuda", {"inner_k_tiles": 4}, (8, 128), 4, 32, np.random.default_rng(6))
    mutate(d)
    probs = L.problems(Descriptor.from_dict(d), 1, 1)
    assert [p.code for p in probs][:1] == ([code] if code else [])


# -- torch: load-time tinygemm repack ------------------------------------------------------
@pytest.mark.parametrize("group, inner, stored", [(32, 2, "canonical"), (128, 8, "canonical"), (64, 4, "tinygemm_int4_cuda")])
def test_torch_tinygemm_repack_matches_dequantized_matmul_cpu(group: int, inner: int, stored: str):
    """On CPU the repack goes through torch's _convert_weight_to_int4pack_for_cpu and runs
    _weight_int4pack_mm_for_cpu.  Bound: the kernel takes bf16 activations (given exactly),
    bf16 scale and zero (the file's scale is bf16: exact), and rounds its output to bf16
    (relative 2^-8); its dequantized weight may also be held in bf16 (relative 2^-8 per
    term).  So |y - x W^T| <= 2^-7 * (|x| |W|^T) + 2^-8 |x W^T|, elementwise."""
    import torch
    from qformat_torch.layouts import TinyGemmLinear

    if not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
        pytest.skip("this torch build has no CPU tinygemm kernel")
    rng = np.random.default_rng(group)
    n, k = 48, 256
    w = rng.normal(size=(n, k)).astype(np.float32)
    qt = qformat.quantize(w, "int", bits=4, group_size=group, symmetric=True, dtype="bfloat16", scale_dtype="bfloat16")
    if stored != "canonical":
        qt = qformat.QTensor(*L.to_layout(qt.descriptor, qt.components, stored, {"inner_k_tiles": inner}))
    wd = torch.from_numpy(qt.dequantize().astype(np.float32))
    lin = TinyGemmLinear(qt, device="cpu", inner_k_tiles=inner)
    x = torch.from_numpy(rng.normal(size=(5, k)).astype(np.float32)).to(torch.bfloat16)
    y = lin(x).float()
    ref = x.float() @ wd.T
    bound = 2.0**-7 * (x.float().abs() @ wd.abs().T) + 2.0**-8 * ref.abs()
    assert bool((y - ref).abs().le(bound).all()), float(((y - ref).abs() - bound).max())


def test_torch_tinygemm_refuses_asymmetric():
    import torch  # noqa: F401
    from qformat_torch.layouts import tinygemm_weight

    qt = qformat.quantize(np.random.default_rng(0).normal(size=(8, 64)).astype(np.float32), "int", bits=4, group_size=32, symmetric=False)
    with pytest.raises(qformat.QFormatError) as ei:
        tinygemm_weight(qt)
    assert ei.value.code == "LAYOUT_MISMATCH"


@pytest.mark.skipif("not __import__('torch').cuda.is_available()")
def test_torch_tinygemm_cuda_matches_numpy_layout_and_matmul():  # pragma: no cover - needs a GPU
    """Where a GPU is present: torch's own CUDA packing gives the NumPy layout's bytes, and the
    CUDA kernel on them gives the dequantized matmul within bf16 rounding."""
    import torch
    from qformat_torch.layouts import tinygemm_matmul, tinygemm_weight

    rng = np.random.default_rng(0)
    qt = qformat.quantize(rng.normal(size=(64, 256)).astype(np.float32), "int", bits=4, group_size=128, symmetric=True,
                          dtype="bfloat16", scale_dtype="bfloat16")
    ours = tinygemm_weight(qt, "cuda", 8)
    theirs = tinygemm_weight(qt, "cuda", 8, use_private_pack=True)
    assert torch.equal(ours.packed.cpu(), theirs.packed.cpu())
    x = torch.from_numpy(rng.normal(size=(16, 256)).astype(np.float32)).to(torch.bfloat16).cuda()
    wd = torch.from_numpy(qt.dequantize().astype(np.float32)).cuda()
    y = tinygemm_matmul(x, ours).float()
    ref = x.float() @ wd.T
    assert bool((y - ref).abs().le(2.0**-7 * (x.float().abs() @ wd.abs().T) + 2.0**-8 * ref.abs()).all())
