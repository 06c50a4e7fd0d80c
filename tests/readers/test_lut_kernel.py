"""qformat's own matmul kernel (qformat/kernels/_matmul.c) behind QLinear's ``lut_grouped`` path.

Bits first: each weight the kernel multiplies is formed with the decoder's binary32 steps, so
with one-hot rows of x (``x = I``, float32: every product but one is zero, the sum exact) the
kernel's output *is* its weight matrix, compared with qformat's decoded binary32 weight bit for
bit (NaN by class), for every encoder scheme of at most 8 bits (parametrized over the registry)
and on every kernel level this CPU has (the portable loop, AVX2, AVX-512).  Then the product: on random
activations the output stays within :func:`qformat_torch.kernels.error_bound` of the exact
float64 product with the decoded weight (binary32 sums with FMA in the kernel's order, the output
rounded to x's dtype, and for a bfloat16 logical dtype the one rounding of each weight the
kernel does not do); a wrong weight fails that bound.  Speed is measured in bench/, not here.
"""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402

import qformat  # noqa: E402
from qformat import kernels as qk  # noqa: E402
from qformat import schemes  # noqa: E402
from qformat_torch import kernels  # noqa: E402
from qformat_torch.nn import QLinear  # noqa: E402

if not qk.matmul_available():  # pragma: no cover - a machine without the extension
    pytest.skip("the native matmul extension is not built here (the NumPy-path test covers this machine)", allow_module_level=True)

#: Parameters per registered encoder scheme (every scheme the registry holds must appear: a new
#: scheme joins this test or fails test_every_scheme_is_covered).
PARAMS: dict[str, list[dict]] = {
    "int": [{"bits": 4, "group_size": 32}, {"bits": 4, "group_size": 64, "symmetric": False},
            {"bits": 8, "group_size": 128, "symmetric": False}, {"bits": 3, "group_size": 32}, {"bits": 8, "group_size": None}],
    "nf4": [{}], "mxfp4": [{}], "nvfp4": [{}], "mxint8": [{}],
    "mxfp6_e2m3": [{}], "mxfp6_e3m2": [{}], "mxfp8_e4m3": [{}], "mxfp8_e5m2": [{}],
    "fp8_e4m3": [{}], "fp8_e5m2": [{}],
    "codebook": [{"values": [-1.5, -0.75, -0.25, 0.0, 0.25, 0.75, 1.5, 3.0]}],
    "gguf": [{"type": "Q4_K"}, {"type": "Q6_K"}, {"type": "Q4_0"}, {"type": "Q8_0"}],
}
CASES = [pytest.param(s, p, id=f"{s}-{'-'.join(f'{k}{v}' for k, v in p.items() if k != 'values') or 'default'}")
         for s, ps in PARAMS.items() for p in ps]
#: The matmul kernel's levels this CPU runs (qk.use caps the matmul at the level it names).
with qk.use("auto"):
    LEVELS = list(qk.LEVELS[:1 + qk.matmul_level()])
    #: Several bfloat16 rows of x at the AVX-512 level: AMX tiles where this CPU has them, and the
    #: AVX512_BF16 dot products (AMX switched off) -- both run here where AMX does.
    BF16_PATHS = (["amx"] if qk.matmul_amx() else []) + ["dot"]
    #: Byte codes with bfloat16 values at the AVX-512 level: the AVX512_VBMI byte planes where this
    #: CPU has them, and the conversion loop (planes switched off) -- both run here where VBMI does.
    from qformat.kernels import _matmul as _mm

    BYTE_PATHS = (["planes"] if _mm.planes() else []) + ["convert"]


def _byte_path(name: str):
    return _switched(_mm.planes, name == "planes")


@contextlib.contextmanager
def _switched(switch, on: bool):
    """``switch(flag)`` (qk.matmul_amx, _matmul.planes: no argument reads it) set inside the block."""
    before = bool(switch())
    switch(int(on))
    try:
        yield
    finally:
        switch(int(before))


def _bf16_path(name: str):
    return _switched(qk.matmul_amx, name == "amx")
N, K = 96, 256


@pytest.fixture(autouse=True)
def _reader_ops_path():
    """Overrides the readers' conftest fixture (which keeps decodes off the native kernels):
    this module tests the native matmul, on the best level this CPU has unless a test says."""
    with qk.use("auto"):
        yield


def test_every_scheme_is_covered() -> None:
    assert sorted(PARAMS) == sorted(schemes.ids())


def _layer(scheme: str, params: dict, dtype: str = "float32", seed: int = 0) -> QLinear:
    w = (np.random.default_rng(seed).standard_normal((N, K)) * 0.05).astype(np.float32)
    qt_ = qformat.quantize(w, scheme, **params, **({} if dtype == "float32" else {"dtype": dtype}))
    from qformat_torch.qtensor import TorchQTensor

    return QLinear(TorchQTensor.from_qtensor(qt_, torch.device("cpu")), None)


def _decoded(ql: QLinear) -> torch.Tensor:
    return ql.dequantize_weight().to(torch.float32)


@pytest.mark.parametrize("level, byte_path", [(lv, "convert") for lv in LEVELS] + [("avx512", p) for p in BYTE_PATHS if p != "convert"])
@pytest.mark.parametrize("rows", [K, 1])
@pytest.mark.parametrize("scheme, params", CASES)
def test_kernel_weights_equal_the_decoded_weights_bit_for_bit(scheme: str, params: dict, level: str, byte_path: str, rows: int) -> None:
    """With one-hot rows of x the output is the weights; ``rows=1`` sends each one-hot row alone
    (the one-row loop forms weights on its own code path)."""
    ql = _layer(scheme, params)
    assert ql.kernel_path in ("lut_grouped", "int4_grouped", "int8_per_channel")
    p = kernels.LutGrouped().prepare(ql._parsed, ql.component_tensors(), "native")
    assert p is not None and p.exact
    eye = torch.eye(K, dtype=torch.float32)
    with qk.use(level), _byte_path(byte_path):
        got = torch.cat([p.path.forward(p, eye[i:i + rows]) for i in range(0, K, rows)]).T  # [N, K]: row n of W
    want = _decoded(ql)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan], want[~nan]), f"{(got != want).sum()} weights differ"


#: (level, bfloat16 path): every level with the dot products, and AMX at the AVX-512 level.
LEVEL_PATHS = [(lv, "dot") for lv in LEVELS] + [("avx512", p) for p in BF16_PATHS if p != "dot"]


@pytest.mark.parametrize("level, bf16_path", LEVEL_PATHS)
@pytest.mark.parametrize("m", [1, 3, 8, 64])
@pytest.mark.parametrize("scheme, params", CASES)
def test_product_within_the_bound(scheme: str, params: dict, m: int, level: str, bf16_path: str) -> None:
    ql = _layer(scheme, params)
    p = kernels.LutGrouped().prepare(ql._parsed, ql.component_tensors(), "native")
    w = _decoded(ql).double()
    gen = torch.Generator().manual_seed(m)
    for dt in (torch.bfloat16, torch.float32):
        x = torch.randn(m, K, generator=gen).to(dt)
        with qk.use(level), _bf16_path(bf16_path):
            y = p.path.forward(p, x).double()
        ref = x.double() @ w.T
        bound = kernels.error_bound(ref, x.double().abs() @ w.abs().T, K, dt)
        assert bool(((y - ref).abs() <= bound).all()), float(((y - ref).abs() / bound).max())


GGUF_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "MXFP4"]


@pytest.mark.parametrize("name", GGUF_TYPES)
def test_gguf_types_as_converted_run_on_the_kernel(name: str, tmp_path) -> None:
    """Random GGUF blocks of each type, converted: QLinear runs them on the kernel (float32
    activations, as the converted float32 logical dtype), and the product with the decoded
    weight stays within the bound; the weights equal the decoded ones bit for bit."""
    from gguf import GGMLQuantizationType as T

    from qformat.convert import convert
    from qformat_torch.qtensor import TorchQTensor
    from tests.convert.test_gguf import quant_data, write_gguf

    raw = quant_data(T[name], (64, 512), np.random.default_rng(0), edges=False)
    src = write_gguf(tmp_path / "m.gguf", [("w", raw, T[name])])
    convert(src, tmp_path / "m.safetensors")
    with qformat.safe_open(tmp_path / "m.safetensors") as f:
        ql = QLinear(TorchQTensor.from_qtensor(f.get_qtensor("w"), torch.device("cpu")), None)
    assert ql.kernel_path == "lut_grouped"
    w = _decoded(ql).double()
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y = ql(x).double()
        cols = ql(torch.eye(512)).T
    ref = x.double() @ w.T
    assert bool(((y - ref).abs() <= kernels.error_bound(ref, x.double().abs() @ w.abs().T, 512, torch.float32)).all())
    assert torch.equal(cols, w.float())


def _raw(p: kernels.Prepared, x: np.ndarray, bf16: bool) -> np.ndarray:
    """The kernel's binary32 output for float32 ``x`` (no rounding to x's dtype after it)."""
    t = p.tensors
    arr = lambda name: t[name].numpy() if name in t else None  # noqa: E731
    out = np.empty((x.shape[0], t["codes"].shape[0]), np.float32)
    qk.matmul(np.ascontiguousarray(x, np.float32), t["codes"].numpy(), p.meta["kind"], t["table"].numpy(), p.meta["group"],
              arr("zero"), arr("scale"), arr("bias"), out, threads=2, bf16=bf16)
    return out


needs_bf16 = pytest.mark.skipif(not (qk.matmul_available() and qk.matmul_bf16()), reason="no AVX512_BF16 matmul level on this CPU")


@needs_bf16
@pytest.mark.parametrize("scheme, params", CASES)
@pytest.mark.parametrize("bf16_path", BF16_PATHS)
def test_bf16_dot_products_multiply_the_decoded_weight_rounded_to_bfloat16(scheme: str, params: dict, bf16_path: str) -> None:
    """Several rows of bfloat16 x on AVX512_BF16: with one-hot rows the kernel's binary32 output
    is each weight as it multiplies it, which must be qformat's decoded binary32 weight rounded
    to bfloat16 (nearest even, torch's ``.to(torch.bfloat16)``) bit for bit (these weights have
    no bfloat16 subnormal; QLinear asks for this path only where that is proved, see the next
    tests)."""
    ql = _layer(scheme, params)
    p = kernels.LutGrouped().prepare(ql._parsed, ql.component_tensors(), "native")
    with _bf16_path(bf16_path):
        got = torch.from_numpy(_raw(p, np.eye(K, dtype=np.float32), bf16=True)).T
    want = _decoded(ql).to(torch.bfloat16).to(torch.float32)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan], want[~nan]), f"{(got != want).sum()} weights differ"


@needs_bf16
@pytest.mark.parametrize("bf16_path", BF16_PATHS)
def test_bf16_dot_products_leave_subnormal_activations_to_the_binary32_path(bf16_path: str) -> None:
    """vdpbf16ps takes a subnormal input as zero: x with one subnormal bfloat16 value gives
    exactly the binary32 path's output; the same x without it takes the bfloat16 products (the
    outputs then differ, the weights being rounded)."""
    ql = _layer("nf4", {})
    p = kernels.LutGrouped().prepare(ql._parsed, ql.component_tensors(), "native")
    assert p.meta["bf16_normal"]
    x = torch.randn(8, K, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16).float().numpy()
    with _bf16_path(bf16_path):
        assert not np.array_equal(_raw(p, x, bf16=True), _raw(p, x, bf16=False))
        x[5, 7] = np.float32(2.0**-130)  # a bfloat16 subnormal
        assert np.array_equal(_raw(p, x, bf16=True), _raw(p, x, bf16=False))


def test_weights_below_bfloat16s_normal_range_keep_the_binary32_products() -> None:
    """Scales so small that some weights are bfloat16 subnormals: not proved normal, so QLinear's
    forward does not take the bfloat16 dot products (which would take those weights as zero):
    with one-hot bfloat16 rows its output is each decoded weight rounded to bfloat16, subnormals
    included."""
    w = (np.random.default_rng(0).standard_normal((N, K)) * 3e-38).astype(np.float32)
    from qformat_torch.qtensor import TorchQTensor

    ql = QLinear(TorchQTensor.from_qtensor(qformat.quantize(w, "nf4"), torch.device("cpu")), None)
    p = kernels.LutGrouped().prepare(ql._parsed, ql.component_tensors(), "native")
    assert not p.meta["bf16_normal"]
    want = _decoded(ql).to(torch.bfloat16)
    assert int(((want.float().abs() < 2.0**-126) & (want != 0)).sum()) > 0
    got = p.path.forward(p, torch.eye(K, dtype=torch.bfloat16)).T
    assert torch.equal(got, want)


def test_qformats_kernel_goes_first_at_the_avx512_level() -> None:
    """Path order: at the AVX-512 level qformat's kernel is taken before torch's int8 (and int4)
    ones (measured faster in bench `generate`); below it torch's int8 kernel keeps an int8
    per-channel bfloat16 layer, where its probe passes here."""
    w = (np.random.default_rng(0).standard_normal((N, K)) * 0.05).astype(np.float32)
    q = qformat.quantize(w, "int", bits=8, group_size=None, scale_dtype="bfloat16", dtype="bfloat16")
    from qformat_torch.qtensor import TorchQTensor

    with qk.use("avx2"):
        ql = QLinear(TorchQTensor.from_qtensor(q, torch.device("cpu")), None)
        want = "int8_per_channel" if kernels.probe(kernels.Int8PerChannel()) else "lut_grouped"
        assert ql.kernel_path == want
    if "avx512" in LEVELS:
        ql = QLinear(TorchQTensor.from_qtensor(q, torch.device("cpu")), None)
        assert ql.kernel_path == "lut_grouped"


@pytest.mark.parametrize("route", ["openmp", "pool"])
def test_threads_split_the_columns_without_changing_a_bit(route: str) -> None:
    """A layer wide enough for several threads: its columns are split over the threads of the
    process's OpenMP runtime (torch's, loaded here) or over the extension's own pool, and every
    output equals the one-thread output bit for bit (each column is computed whole by one
    thread, shares being whole 16 columns)."""
    from qformat.kernels import _matmul

    before = _matmul.threading()
    _matmul.threading(int(route == "openmp"))
    try:
        if _matmul.threading() != route:
            pytest.skip(f"no {route} route in this process")
        n, k = 1000, 256  # not a multiple of 16: the last share has a tail
        w = (np.random.default_rng(1).standard_normal((n, k)) * 0.05).astype(np.float32)
        from qformat_torch.qtensor import TorchQTensor

        ql = QLinear(TorchQTensor.from_qtensor(qformat.quantize(w, "nf4"), torch.device("cpu")), None)
        p = kernels.LutGrouped().prepare(ql._parsed, ql.component_tensors(), "native")
        t = p.tensors
        for m in (1, 8):
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16).float().numpy()
            for bf16 in (False, True):
                outs = []
                for threads in (1, 2, 3):
                    out = np.full((m, n), np.nan, np.float32)
                    qk.matmul(x, t["codes"].numpy(), p.meta["kind"], t["table"].numpy(), p.meta["group"], None,
                              t["scale"].numpy(), None, out, threads=threads, bf16=bf16)
                    outs.append(out)
                assert not np.isnan(outs[0]).any()
                assert all(np.array_equal(o, outs[0]) for o in outs[1:]), (m, bf16)
    finally:
        _matmul.threading(int(before == "openmp"))


def test_a_wrong_weight_fails_the_bound() -> None:
    """The bound is tight enough to see one weight off by one code step."""
    ql = _layer("nf4", {})
    p = kernels.LutGrouped().prepare(ql._parsed, ql.component_tensors(), "native")
    w = _decoded(ql).double()
    codes = p.tensors["codes"].clone()
    codes[5, 10] ^= 0x01  # the low nibble: code of weight (5, 20) moves by one
    bad = kernels.Prepared(p.path, dict(p.tensors, codes=codes), p.dtype, True, meta=p.meta)
    x = torch.zeros(1, K)
    x[0, 20] = 1.0
    x[0, 21] = 0.5
    y = bad.path.forward(bad, x).double()
    ref = x.double() @ w.T
    bound = kernels.error_bound(ref, x.double().abs() @ w.abs().T, K, torch.float32)
    assert not bool(((y - ref).abs() <= bound).all())


@pytest.mark.parametrize("scheme, params", [("nf4", {}), ("mxfp4", {}), ("int", {"bits": 4, "group_size": 32, "symmetric": False})])
def test_bfloat16_models_take_the_kernel_by_default_within_the_documented_bound(scheme: str, params: dict) -> None:
    """A bfloat16 logical dtype: the kernel keeps each weight's binary32 value, the decode path
    rounds it to bfloat16: one relative rounding (Prepared.roundings), and the default policy
    ("auto") takes the kernel."""
    ql = _layer(scheme, params, dtype="bfloat16")
    assert ql.kernel_path == "lut_grouped" and ql._native.roundings == 1
    w = _decoded(ql).double()
    x = torch.randn(4, K, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with torch.no_grad():
        y = ql(x).double()
    ref = x.double() @ w.T
    bound = kernels.error_bound(ref, x.double().abs() @ w.abs().T, K, torch.bfloat16, weight_roundings=1)
    assert bool(((y - ref).abs() <= bound).all())


def test_decode_policy_and_gradients_keep_the_exact_path() -> None:
    ql = _layer("nf4", {})
    x = torch.randn(2, K)
    kernels.set_kernel_policy("decode")
    try:
        with torch.no_grad():
            y = ql(x)
        assert ql.kernel_path == "decode"
        assert torch.equal(y, torch.nn.functional.linear(x, _decoded(ql)))
    finally:
        kernels.set_kernel_policy("auto")
    xg = torch.randn(2, K, requires_grad=True)
    ql(xg).sum().backward()  # the kernel has no backward: this goes through F.linear
    # a gradient flows (F.linear's backward: ones @ W, summed in torch's order)
    assert xg.grad is not None and torch.allclose(xg.grad, _decoded(ql).sum(0).expand(2, K), rtol=1e-5, atol=1e-6)


def test_without_native_kernels_qlinear_decodes() -> None:
    ql = _layer("mxfp4", {})
    with qk.use("numpy"):
        assert not qk.matmul_available()
        assert kernels.select(ql._parsed, ql.component_tensors(), torch.device("cpu"), "auto") is None


@pytest.mark.parametrize("bad, msg", [
    (dict(x=np.zeros((1, 10), np.float32)), "x too short"),
    (dict(codes=np.zeros((4, 3), np.uint8)), "codes too short"),
    (dict(table=np.zeros(15, np.float32)), "table"),
    (dict(g=12), "bad sizes"),
    (dict(scale=np.zeros((4, 1), np.float32)), "parameter too short"),
    (dict(out=np.zeros((1, 3), np.float32)), "y too short"),
    (dict(rows=(0, 5)), "column range"),
])
def test_the_raw_kernel_checks_every_size(bad: dict, msg: str) -> None:
    from qformat.kernels import _matmul

    a = dict(x=np.zeros((1, 64), np.float32), codes=np.zeros((4, 32), np.uint8), table=np.zeros(16, np.float32), g=32,
             scale=np.zeros((4, 2), np.float32), out=np.zeros((1, 4), np.float32), rows=(0, 4))
    a.update(bad)
    with pytest.raises(ValueError, match=msg):
        _matmul.matmul(a["x"], 1, 64, a["codes"], 4, 0, a["table"], a["g"], None, a["scale"], None, a["out"], *a["rows"], 0)


def test_weights_outside_the_logical_normal_range_are_not_taken_by_default() -> None:
    """A bfloat16 logical dtype rounds a subnormal weight with an absolute error, which the
    relative bound does not cover (found by the fuzz run): with scales that make weights
    subnormal the default policy decodes, "native" still takes the kernel; a zero point (4-bit)
    is proved per group the same way."""
    from qformat_torch.qtensor import TorchQTensor

    w = (np.random.default_rng(0).standard_normal((N, K)) * 0.05).astype(np.float32)
    for params in ({}, {"symmetric": False}):
        q = qformat.quantize(w, "int", bits=4, group_size=32, dtype="bfloat16", **params)
        comps = dict(q.components)
        ok = QLinear(TorchQTensor.from_qtensor(qformat.QTensor(q.descriptor, comps), torch.device("cpu")), None)
        assert ok.kernel_path in ("lut_grouped", "int4_grouped")
        tiny = dict(comps, scale=(comps["scale"].astype(np.float32) * np.float32(2.0**-122)).astype(comps["scale"].dtype))
        layer = QLinear(TorchQTensor.from_qtensor(qformat.QTensor(q.descriptor, tiny), torch.device("cpu")), None)
        assert layer.kernel_path not in ("lut_grouped",)  # the default policy: decode (or torch's kernel where it maps)
        d, c = layer._parsed, layer.component_tensors()
        assert kernels.LutGrouped().prepare(d, c, "auto") is None
        p = kernels.LutGrouped().prepare(d, c, "native")
        assert p is not None and not p.exact and "normal range" in p.why
