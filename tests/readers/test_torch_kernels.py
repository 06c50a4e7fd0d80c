"""QLinear's forward paths (readers/qformat_torch/kernels.py).

- The exact (decode) path equals ``F.linear(x, W.to(x.dtype), b)`` bit for bit, W being
  qformat's decoded weight; the chunked decode equals the whole decode bit for bit.
- The native paths (torch's CPU int4 pack and int8 per-channel kernels, bfloat16 inputs): the
  weights the kernel implies equal the decoded weight bit for bit where the mapping is exact;
  the output stays within :func:`kernels.error_bound` of the exact float64 product with the
  kernel's weight:

      |y - x @ W'^T| <= u |x @ W'^T| + (u + (K + 2) 2^-24) (|x| @ |W'|^T),   u = 2^-8 (bfloat16)

  (output rounding to bfloat16, binary32 accumulation in any order, and a rounding of each
  dequantized weight to bfloat16, which a kernel may do on some CPUs).  The decode path's own
  F.linear in bfloat16 is held to the same bound.  Measured on an AVX-512 machine: at most 0.2
  of the bound for the kernels and the decode path alike (max |error| ~ 1/2 ulp of the output).
- Policy "auto" (the default) also takes the kernels where the kernel's weight is one or two
  bfloat16 roundings from the decoded weight W (a bfloat16 logical dtype, float16 scales): the
  output stays within ``error_bound(..., weight_roundings=r)`` of the exact product with W
  itself, the weight term growing to ``(1 + r) 2^-8 (1 + 2^-6)``.
- A failed capability probe (op missing or wrong) falls back to the decode path.
"""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import qformat  # noqa: E402
import qformat_torch as qt  # noqa: E402
from qformat_torch import kernels  # noqa: E402
from qformat_torch.decode import decode  # noqa: E402
from qformat_torch.nn import QLinear  # noqa: E402
from qformat_torch.sources import TensorSource  # noqa: E402

N, K = 256, 512
CASES = {
    "int4 g32 sym": ("int", {"bits": 4, "group_size": 32}),
    "int4 g32 asym": ("int", {"bits": 4, "group_size": 32, "symmetric": False}),
    "int4 g128 sym": ("int", {"bits": 4, "group_size": 128}),
    "int4 g128 asym": ("int", {"bits": 4, "group_size": 128, "symmetric": False}),
    "int8 per channel": ("int", {"bits": 8, "group_size": None}),
}
NATIVE = {"int4": kernels.Int4Grouped, "int8": kernels.Int8PerChannel}


def weights(seed: int = 0, n: int = N, k: int = K) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((n, k)) * 0.02).astype(np.float32)


def quantized(case: str, **extra) -> qformat.QTensor:
    scheme, params = CASES[case]
    return qformat.quantize(weights(), scheme, **params, **extra)


def cpu_note() -> str:
    return f"cpu capability {torch.backends.cpu.get_cpu_capability()}"


def int8_implied(p: kernels.Prepared) -> torch.Tensor:
    """q * s per row, from the kernel's own int8 weight and scales (float64)."""
    return p.tensors["weight"].double() * p.tensors["scales"].double()[:, None]


def int4_implied(q: qformat.QTensor, p: kernels.Prepared) -> torch.Tensor:
    """(u - 8) * s + c with u the unsigned nibble of each code (two's complement codes + 8,
    unsigned codes as they are), s and c from the kernel's scales_and_zeros."""
    d = q.descriptor
    n, k = d["shape"]
    g = int(p.tensors["group"])
    byte = torch.from_numpy(np.asarray(q.components["codes"]).view(np.uint8).astype(np.int64))
    u = torch.stack([byte & 15, byte >> 4], -1).reshape(n, -1)[:, :k]
    if d["codes"]["element"]["signedness"] == "twos_complement":
        u = (u + 8) & 15
    sz = p.tensors["scales_and_zeros"].double()  # [K/g, N, 2]
    s = sz[..., 0].T.repeat_interleave(g, 1)
    c = sz[..., 1].T.repeat_interleave(g, 1)
    return (u.double() - 8) * s + c


def within_bound(y: torch.Tensor, x: torch.Tensor, w64: torch.Tensor, roundings: int = 0) -> float:
    """max |y - x @ w64^T| / bound (<= 1 passes)."""
    x64 = x.reshape(-1, x.shape[-1]).double()
    ref = x64 @ w64.T
    bound = kernels.error_bound(ref, x64.abs() @ w64.abs().T, x.shape[-1], x.dtype, roundings)
    return float(((y.reshape(ref.shape).double() - ref).abs() / bound).max())


# -- the exact path ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", list(CASES) + ["nf4", "mxfp4", "nvfp4", "fp8_e4m3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_exact_path_is_f_linear_with_the_decoded_weight(case, dtype):
    q = quantized(case) if case in CASES else qformat.quantize(weights(), case)
    bias = torch.randn(N)
    m = QLinear(q, bias, kernel="decode")
    assert m.kernel_path == "decode"
    w = m.weight
    for shape in [(1, K), (3, 5, K), (64, K)]:
        x = torch.randn(shape).to(dtype)
        assert torch.equal(m(x), F.linear(x, w.to(dtype), bias.to(dtype)))


@pytest.mark.parametrize("case", list(CASES))
def test_float32_inputs_take_the_exact_path_under_any_policy(case):
    q = quantized(case, scale_dtype="bfloat16")
    m = QLinear(q, kernel="native")
    x = torch.randn(4, K)
    assert torch.equal(m(x), F.linear(x, m.weight))  # torch's float32 kernels are slower than decoding: never used


@pytest.mark.parametrize("case,logical,target,rows", [
    ("int4 g32 asym", "float32", torch.bfloat16, 7), ("int4 g128 sym", "bfloat16", torch.float32, 100),
    ("int8 per channel", "float32", torch.float32, 33), ("nf4", "float32", torch.bfloat16, 16),
    ("nvfp4", "bfloat16", torch.bfloat16, 50), ("fp8_e4m3", "float16", torch.bfloat16, 64)])
def test_chunked_decode_equals_the_whole_decode(case, logical, target, rows):
    q = quantized(case, dtype=logical) if case in CASES else qformat.quantize(weights(), case, dtype=logical)
    m = QLinear(q, kernel="decode", chunk_rows=rows)
    comps = m.component_tensors()
    whole = decode(m._parsed, TensorSource(comps, torch.device("cpu"))).to(target)
    assert torch.equal(kernels.decode_chunked(m._parsed, comps, target, chunk_rows=rows), whole)
    assert torch.equal(kernels.decode_chunked(m._parsed, comps, target), whole)
    x = torch.randn(2, K).to(target)
    assert torch.equal(m(x), F.linear(x, whole))


def test_cache_and_stream_options():
    q = quantized("int4 g32 asym")
    x = torch.randn(3, K, dtype=torch.bfloat16)
    exact = QLinear(q, kernel="decode")
    cached = QLinear(q, kernel="decode", cache=True)
    assert torch.equal(cached(x), exact(x)) and torch.bfloat16 in cached._decoded
    assert torch.equal(cached(x), exact(x))  # served from the cache
    streamed = QLinear(q, kernel="decode", stream=True, chunk_rows=64)
    w = exact.weight.to(torch.bfloat16)
    want = torch.cat([F.linear(x, w[a : a + 64]) for a in range(0, N, 64)], -1)
    assert torch.equal(streamed(x), want)
    assert within_bound(streamed(x), x, exact.weight.double()) <= 1


def test_decode_path_keeps_the_weight_for_autograd():
    q = qformat.quantize(weights(), "nf4")
    m = QLinear(q, kernel="decode")
    x = torch.randn(2, K, requires_grad=True)
    y = m(x)
    m(torch.randn(2, K))  # would overwrite a shared workspace
    y.sum().backward()
    assert torch.allclose(x.grad, torch.ones(2, N) @ m.weight, rtol=1e-5, atol=1e-6)  # not another forward's weight


# -- native paths -----------------------------------------------------------------------------------------
def _need(path_cls) -> kernels.KernelPath:
    path = next(p for p in kernels.PATHS if isinstance(p, path_cls))
    if not kernels.probe(path):
        pytest.skip(f"{path.name}: torch's native op is unavailable or wrong here ({cpu_note()})")
    return path


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("scale_dtype", ["bfloat16", "float16"])
def test_native_path(case, scale_dtype):
    _need(NATIVE[case[:4]])
    q = quantized(case, scale_dtype=scale_dtype)
    exact_mapping = scale_dtype == "bfloat16" and "asym" not in case  # asym: the offset (8 - z) * s rounds
    bias = torch.randn(N)
    auto = QLinear(q, bias, kernel="auto")
    m = QLinear(q, bias, kernel="native")
    assert m.kernel_path == NATIVE[case[:4]].name
    # auto: also float16 scales (a relative rounding), not an asymmetric offset (an absolute one)
    assert auto.kernel_path == (m.kernel_path if "asym" not in case else "decode")
    p = m._native
    assert p.exact == exact_mapping, p.why
    w = m.weight.double()  # qformat's decoded weight (float32 logical)
    w_kernel = int4_implied(q, p) if case.startswith("int4") else int8_implied(p)
    if exact_mapping:
        assert torch.equal(w_kernel, w)
    else:  # a parameter rounds to bfloat16: report how far the kernel's weight is from qformat's
        assert float((w_kernel - w).abs().max()) <= 2.0**-8 * 16 * float(w.abs().max())
    for shape in [(1, K), (5, K), (2, 32, K)]:
        x = torch.randn(shape, dtype=torch.bfloat16)
        y = m(x)
        assert y.dtype == torch.bfloat16 and y.shape == shape[:-1] + (N,)
        y0 = m._native(x.reshape(-1, K))  # the kernel alone, against its own weight
        assert torch.equal(y, (y0 + bias.to(torch.bfloat16)).reshape(y.shape))
        r = within_bound(y0, x, w_kernel)
        assert r <= 1, f"{case}: error {r:.3f} of the bound ({cpu_note()})"
        rd = within_bound(F.linear(x, m.weight.to(torch.bfloat16)), x, w)  # the decode path, same bound
        assert rd <= 1


def test_native_int8_shares_the_codes_buffer():
    _need(kernels.Int8PerChannel)
    m = QLinear(quantized("int8 per channel", scale_dtype="bfloat16"))
    assert m.kernel_path == "int8_per_channel"
    codes = m.component_tensors()["codes"]
    shared = m._native.tensors["weight"].data_ptr() == codes.data_ptr()
    assert shared == (codes.data_ptr() % 64 == 0)  # an unaligned buffer is copied (next test)


def test_native_int8_on_a_buffer_off_the_16_byte_boundary():
    """Codes at an 8-byte offset (as a safetensors file may place them): torch's AVX-512 int8
    kernel crashed on such a weight from 4 rows of activations up.  Run in a child process (a
    crash must fail this test, not the test runner): the kernel takes an aligned copy, and 1 to
    9 rows give the kernel's product within its bound of the decoded weight."""
    import subprocess
    import sys

    _need(kernels.Int8PerChannel)
    code = """
import numpy as np, torch, qformat
from qformat_torch import QLinear, TorchQTensor
from qformat_torch import kernels
# torch's int8 kernel is the subject: qformat's own (first on AVX-512 machines) is left out
kernels.PATHS[:] = [p for p in kernels.PATHS if p.name != "lut_grouped"]
rng = np.random.default_rng(0)
q = qformat.quantize(rng.standard_normal((1024, 1024)).astype(np.float32), "int", bits=8, group_size=None, scale_dtype="bfloat16", dtype="bfloat16")
comps = dict(TorchQTensor.from_qtensor(q).components)
name = q.descriptor["codes"]["tensor"]
a = np.asarray(q.components[name])
raw = np.zeros(a.nbytes + 72, np.uint8)
k = (-raw.ctypes.data % 64) + 8  # 8 bytes past a 64-byte boundary: not 16-byte aligned
v = raw[k : k + a.nbytes].view(a.dtype).reshape(a.shape)
v[...] = a
comps[name] = torch.from_numpy(v)
m = QLinear(TorchQTensor(q.descriptor, comps), kernel="native")
assert m.component_tensors()["codes"].data_ptr() % 16 == 8
assert m.kernel_path == "int8_per_channel", m.kernel_path
w = m.weight.double()
for rows in range(1, 10):
    x = torch.randn(rows, 1024, dtype=torch.bfloat16)
    y = m(x).double()
    ref = x.double() @ w.T
    bound = 2.0**-7 * (x.double().abs() @ w.abs().T) + 1e-6
    assert bool(((y - ref).abs() <= bound).all()), rows
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stderr[-3000:])


def test_failed_probe_falls_back_to_decode(monkeypatch):
    def missing(self):
        raise AttributeError("torch.ops.aten has no such op")

    monkeypatch.setattr(kernels, "_PROBED", {})
    for cls in NATIVE.values():
        monkeypatch.setattr(cls, "probe_case", missing)
    for case in ("int4 g32 sym", "int8 per channel"):
        m = QLinear(quantized(case, scale_dtype="bfloat16"), kernel="native")
        assert m.kernel_path == "decode"
        x = torch.randn(3, K, dtype=torch.bfloat16)
        assert torch.equal(m(x), F.linear(x, m.weight.to(torch.bfloat16)))
    assert kernels._PROBED and not any(kernels._PROBED.values())


def test_wrong_answer_fails_the_probe(monkeypatch):
    path = next(p for p in kernels.PATHS if isinstance(p, kernels.Int8PerChannel))
    monkeypatch.setattr(kernels, "_PROBED", {})
    monkeypatch.setattr(kernels.Int8PerChannel, "forward", lambda self, p, x: torch.zeros(x.shape[0], p.tensors["weight"].shape[0], dtype=x.dtype))
    assert not kernels.probe(path)


def test_policy_switch_and_state_dict(tmp_path):
    _need(kernels.Int4Grouped)
    q = quantized("int4 g32 sym", scale_dtype="bfloat16")
    m = QLinear(q, torch.randn(N))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    assert m.kernel_path == "int4_grouped"
    assert set(before) == {"bias"} | {b for b, _ in m._components.values()}  # only the qformat components
    x = torch.randn(2, K, dtype=torch.bfloat16)
    y_native = m(x)
    try:
        qt.nn.kernels.set_kernel_policy("decode")
        assert torch.equal(m(x), F.linear(x, m.weight.to(torch.bfloat16), m.bias.to(torch.bfloat16)))
        assert m.kernel_path == "decode"
    finally:
        kernels.set_kernel_policy("auto")
    assert torch.equal(m(x), y_native) and m.kernel_path == "int4_grouped"
    with pytest.raises(ValueError):
        QLinear(q, kernel="fast")
    # .to() keeps the path; loading other weights re-packs the kernel's copy
    m = m.to(torch.bfloat16)
    assert m.kernel_path == "int4_grouped" and torch.equal(m(x), y_native)
    other = QLinear(qformat.quantize(weights(1), "int", bits=4, group_size=32, scale_dtype="bfloat16"), torch.randn(N))
    m.load_state_dict(other.state_dict())
    assert torch.equal(m(x), other(x))
    # save_model / load_model keep working and pick the native path again
    model = nn.Sequential(QLinear(q, torch.randn(N)))
    path = tmp_path / "m.safetensors"
    qt.save_model(model, path)
    fresh = qt.load_model(nn.Sequential(nn.Linear(K, N)), path)
    assert isinstance(fresh[0], QLinear) and fresh[0].kernel_path == "int4_grouped"
    assert torch.equal(fresh(x), model(x))


def test_shapes_the_kernels_do_not_take_decode():
    _need(kernels.Int4Grouped)
    w = weights(0, 40, 96)  # N % 16 != 0: the int4 repack refuses; K % 32 != 0 for int8 below
    m = QLinear(qformat.quantize(w, "int", bits=4, group_size=32, scale_dtype="bfloat16"))
    assert m.kernel_path == "decode"
    m8 = QLinear(qformat.quantize(weights(0, 48, 40), "int", bits=8, group_size=None, scale_dtype="bfloat16"))
    assert m8.kernel_path == "decode"
    x = torch.randn(3, 40, dtype=torch.bfloat16)
    assert torch.equal(m8(x), F.linear(x, m8.weight.to(torch.bfloat16)))


def test_decode_path_under_inference_mode():
    m = QLinear(qformat.quantize(weights(), "nvfp4"), kernel="decode")
    x = torch.randn(2, K, dtype=torch.bfloat16)
    want = F.linear(x, m.weight.to(torch.bfloat16))
    with torch.inference_mode():
        assert torch.equal(m(x), want)
        assert torch.equal(QLinear(qformat.quantize(weights(), "nvfp4"), kernel="decode", stream=True, chunk_rows=N)(x), want)


def test_three_bit_codes_map_onto_the_int4_kernel():
    """Any integer codes spanning at most 16 values fit the int4 kernel (here 3-bit codes in a
    stream packing, read through the core's read plan)."""
    _need(kernels.Int4Grouped)
    q = qformat.quantize(weights(), "int", bits=3, group_size=64, scale_dtype="bfloat16")
    m = QLinear(q)
    assert m.kernel_path == "int4_grouped" and m._native.exact
    x = torch.randn(4, K, dtype=torch.bfloat16)
    assert within_bound(m(x), x, m.weight.double()) <= 1


def _mapping_rss(t: torch.Tensor) -> int | None:
    """Resident bytes of the file mapping that holds ``t`` (/proc/self/smaps), None when ``t``
    is not in a file mapping."""
    ptr, cur = t.data_ptr(), None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                a, b = (int(x, 16) for x in head[0].split("-"))
                cur = a <= ptr < b and len(head) >= 6 and head[5].startswith("/")
            elif cur and head[0] == "Rss:":
                return int(head[1]) * 1024
    return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_native_path_gives_back_mapped_components(tmp_path):
    """Components that are views of a mapped file (as transformers' from_pretrained loads them)
    give their pages back once the int4 kernel holds its repacked copy: the layer keeps one copy
    resident, and state_dict still gives the stored components byte for byte."""
    _need(kernels.Int4Grouped)
    from safetensors import safe_open as st_open

    n, k = 1024, 4096
    q = qformat.quantize(weights(3, n, k), "int", bits=4, group_size=32, scale_dtype="bfloat16")
    path = tmp_path / "w.safetensors"
    qformat.save_file({"w": q}, path)
    with st_open(str(path), framework="pt") as f:
        stored = {c: f.get_slice(c)[...] for c in f.keys()}
    comps = {c[len("w."):]: t for c, t in stored.items()}
    codes = max(comps.values(), key=lambda t: t.numel() * t.element_size())
    if _mapping_rss(codes) is None:
        pytest.skip("safetensors did not map the file")
    want = {c: t.clone() for c, t in comps.items()}
    # the decode path keeps the components in use: resident once read
    ref = QLinear(qt.TorchQTensor(q.descriptor, comps), kernel="decode")
    x = torch.randn(3, k, dtype=torch.bfloat16)
    y_ref = ref(x)
    nbytes = codes.numel() * codes.element_size()
    assert _mapping_rss(codes) >= nbytes
    m = QLinear(qt.TorchQTensor(q.descriptor, comps))
    assert m.kernel_path == "int4_grouped"
    assert _mapping_rss(codes) < nbytes // 4  # given back (and the decode layer's view reads them again on use)
    assert m.kernel_nbytes >= nbytes
    y = m(x)
    assert within_bound(y, x, ref.weight.double()) <= 1
    got = m.packed_weight().components
    assert sorted(got) == sorted(want) and all(torch.equal(got[c], want[c]) for c in want)
    assert torch.equal(ref(x), y_ref) and torch.equal(m(x), y)


# -- the default policy on what qformat's defaults write (issue 23 item 4) --------------------------------
@pytest.mark.parametrize("case", ["int4 g32 sym", "int4 g128 sym", "int8 per channel"])
@pytest.mark.parametrize("logical,scale_dtype,roundings", [
    ("bfloat16", None, 1),          # a bf16 model quantized with the defaults: bf16 scales, q*s rounds once
    ("bfloat16", "float16", 2),     # an older file: float16 scales round to bf16 too
    ("float32", "float16", 1),
    ("float16", None, 2),           # float16 scales (the default there) and a float16 logical dtype
])
def test_default_policy_takes_the_kernel_within_the_documented_bound(case, logical, scale_dtype, roundings):
    """Under the default policy a bfloat16 forward runs the kernel for int4 g32/g128 and int8 per
    channel whatever the scale and logical dtypes, and its output is within
    ``error_bound(weight_roundings=r)`` of the exact product with qformat's decoded weight (r as
    the kernel reports it); the decode policy gives F.linear on the decoded weight bit for bit."""
    _need(NATIVE[case[:4]])
    scheme, params = CASES[case]
    extra = {} if scale_dtype is None else {"scale_dtype": scale_dtype}
    q = qformat.quantize(weights(7), scheme, dtype=logical, **params, **extra)
    if scale_dtype is None:  # the default follows the logical dtype
        assert q.components["scale"].dtype.name == ("bfloat16" if logical == "bfloat16" else "float16")
    m = QLinear(q)
    assert m.kernel is None and kernels.get_kernel_policy() == "auto"
    assert m.kernel_path == NATIVE[case[:4]].name
    assert m._native.roundings == roundings and not m._native.exact, m._native.why
    w = m.weight.double()  # decoded, in the logical dtype
    for shape in [(1, K), (9, K)]:
        x = torch.randn(shape, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(shape[0]))
        r = within_bound(m(x), x, w, roundings)
        assert r <= 1, f"{case} {logical} {scale_dtype}: error {r:.3f} of the bound ({cpu_note()})"
        # the same bound without the roundings is what a decoded weight is held to; the kernel
        # output must not already be bit-identical to the decode path (the test would be vacuous)
    d = QLinear(q, kernel="decode")
    x = torch.randn(4, K, dtype=torch.bfloat16)
    assert torch.equal(d(x), F.linear(x, m.weight.to(torch.bfloat16)))
    assert not torch.equal(m(x), d(x))


def test_error_bound_with_roundings_is_tight_enough_to_fail():
    """Weights six roundings away (the r = 2 bound allows three, with the output's own rounding
    and the accumulation on top) break the r = 2 bound; two roundings pass: the bound is not so
    loose that any weight passes."""
    k = 16
    x = torch.ones(1, k, dtype=torch.bfloat16)
    w = torch.full((1, k), 1.0, dtype=torch.float64)
    off = w * (1 + 6 * 2.0**-8)  # every weight off the same way: the errors add up
    assert within_bound(x.double() @ off.T, x, w, 2) > 1
    assert within_bound(x.double() @ (w * (1 + 2 * 2.0**-8)).T, x, w, 2) <= 1


def test_auto_keeps_offset_roundings_for_native_only():
    """An asymmetric int4 weight (its offset (8 - z) * s rounds to bfloat16: an error not relative
    to the weight) decodes under the default policy, runs the kernel under "native"."""
    _need(kernels.Int4Grouped)
    q = quantized("int4 g32 asym", scale_dtype="bfloat16", dtype="bfloat16")
    assert QLinear(q).kernel_path == "decode"
    n = QLinear(q, kernel="native")
    assert n.kernel_path == "int4_grouped" and "offset" in n._native.why
