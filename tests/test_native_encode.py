"""The native int group encoders (qformat/kernels/_encode.c, issue 45 item 5) give the NumPy path's
bytes: codes, scales, zero points and the ok flags, bit for bit, at every SIMD level.

The NumPy path (``kernels.use("numpy")``: int_symmetric.symmetric / int_.symmetric_reference and
int_._asymmetric) is the reference here; nothing expected is computed by the C code.  Inputs:
seeded random groups of many magnitudes, and hand-made edge groups: all zeros, NaN, +-Inf (the
functions below qformat.quantize, which refuses non-finite input), exact half-integer quotients
(ties), equal largest magnitudes of both signs, binary32 and float16 subnormals, groups at the
edges of the fast path's range (2^-50, 2^50, float16 scale overflow and underflow).
"""

from __future__ import annotations


import ml_dtypes
import numpy as np
import pytest

import qformat
from qformat import kernels
from qformat.schemes import _common, int_

pytestmark = pytest.mark.skipif(kernels._encode is None, reason="qformat.kernels._encode is not built")

LEVELS = [lv for i, lv in enumerate(kernels.LEVELS) if kernels._encode is not None and i <= kernels._encode.best_level()
          and (kernels._native is None or i <= kernels.LEVELS.index(kernels._native.cpu_level()))]


def _edge_groups(g: int, bits: int, rng: np.random.Generator) -> np.ndarray:
    """Hand-made groups of g float32 values (see the module docstring)."""
    half = 1 << (bits - 1)
    out = []
    base = rng.standard_normal(g)

    def put(*vals: float) -> np.ndarray:
        v = base.copy()
        v[: len(vals)] = vals[:g]
        return v

    out.append(np.zeros(g))
    out.append(put(np.nan))
    out.append(put(np.inf))
    out.append(put(-np.inf, 1.0))
    out.append(put(3.0, -3.0))  # equal largest magnitudes, positive first
    out.append(put(-3.0, 3.0))  # negative first
    out.append(np.full(g, 2.5))
    out.append(np.full(g, -1e-3))
    # quotients on half integers for the scale amax / half: x = (k + 1/2) * amax / half
    k = (np.arange(g) % (2 * half)) - half
    out.append(np.where(np.arange(g) == 0, float(half), k + 0.5) * 0.125)
    out.append(np.where(np.arange(g) == 0, -float(half), k + 0.5) * 3.0)
    out.append(base * 1e-40)  # binary32 subnormals
    out.append(put(1.0, 1e-40, -1e-41, 5e-45))
    for e in (-52, -50, -49, -30, -20, -16, -14, 10, 16, 19, 20, 49, 50, 51):  # range edges
        out.append(base * 2.0**e)
    out.append(put(65504.0 * half * 1.01))  # a float16 scale overflows
    out.append(put(65504.0 * half * 0.999))
    out.append(put(2.0**-24 * half, 2.0**-25))  # float16 scales in its subnormal range
    out.append(put(0.0, -0.0))
    out.append(np.tile([-0.0, 0.0], g)[:g])
    return np.array(out)


def _rows(g: int, bits: int, n: int = 120, seed: int = 0, dtype: object = np.float32) -> np.ndarray:
    """Random and edge groups as ``dtype`` (values beyond float16's range become Inf)."""
    rng = np.random.default_rng(seed)
    r = rng.standard_normal((n, g)) * np.exp(rng.uniform(-8, 8, (n, 1)))
    r[::7] = rng.standard_t(2, (len(r[::7]), g))  # heavy tails
    with np.errstate(over="ignore"):
        return np.concatenate([r, _edge_groups(g, bits, rng)]).astype(np.float32).astype(dtype)


def _dt(name: str) -> object:
    return {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[name]


def _numpy(rows: np.ndarray, bits: int, sym: bool, sdt: str, dtype: str, packed: bool) -> tuple[np.ndarray, ...]:
    if sym:
        return int_._symmetric(rows, bits, sdt, dtype, packed)
    q, s, z, ok = int_._asymmetric(rows, bits, sdt, dtype)
    return (int_.int_symmetric.nibbles(q) if packed else q), s, z, ok


def _compare(rows: np.ndarray, bits: int, sym: bool, sdt: str, dtype: str, packed: bool) -> None:
    with np.errstate(all="ignore"):
        want = _numpy(rows, bits, sym, sdt, dtype, packed)
        for lv in LEVELS:
            with kernels.use(lv):
                assert int_._native_covers(rows.dtype, sym, sdt, dtype)
                got = int_._native(rows, bits, sym, sdt, dtype, packed)
            for name, u, v in zip(("codes", "scales", "zeros/ok", "ok"), got, want):
                assert u.dtype == v.dtype and u.shape == v.shape, (lv, name)
                if u.tobytes() != v.tobytes():
                    bad = np.flatnonzero((u != v).reshape(len(u), -1).any(axis=1))
                    raise AssertionError(f"level {lv}, {name}: {len(bad)} groups differ, first rows {bad[:5]}: {rows[bad[0]]}")


@pytest.mark.parametrize("src", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("g", [32, 16, 7, 1, 96])
def test_symmetric_same_bytes_float32_output(src: str, bits: int, g: int) -> None:
    x = _rows(g, bits, seed=bits * 100 + g, dtype=_dt(src))
    for sdt in ("float16", "bfloat16"):
        _compare(x, bits, True, sdt, "float32", bits == 4 and g % 2 == 0)


@pytest.mark.parametrize("src", ["float16", "bfloat16"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_symmetric_same_bytes_16bit_output(src: str, dtype: str, bits: int) -> None:
    """Decoded values rounded to float16 / bfloat16: the nearer-of-two codes step too."""
    for g in (32, 9):
        rows = _rows(g, bits, seed=bits + g, dtype=_dt(src))
        for sdt in ("float16", "bfloat16"):
            _compare(rows, bits, True, sdt, dtype, False)
            if g % 2 == 0 and bits == 4:
                _compare(rows, bits, True, sdt, dtype, True)


@pytest.mark.parametrize("src", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_asymmetric_same_bytes(src: str, bits: int) -> None:
    for g in (32, 5):
        x = _rows(g, bits, seed=7 * bits + g, dtype=_dt(src))
        for sdt in ("float16", "bfloat16"):
            _compare(x, bits, False, sdt, "float32", bits == 4 and g % 2 == 0)


def test_ties_at_every_code() -> None:
    """Every element's quotient an exact half integer (or an integer) for each candidate scale:
    the float64 rule decides, as in the NumPy path."""
    rng = np.random.default_rng(3)
    rows = []
    for m in (8.0, 8.5, 8.25):
        for _ in range(40):
            amax = float(np.float16(rng.uniform(0.01, 100)))
            s = amax / m
            k = rng.integers(-16, 16, 32) / 2.0
            r = np.float32(k * s)
            r[0] = amax * (1 if rng.random() < 0.5 else -1)
            rows.append(r)
    rows = np.array(rows, np.float32)
    _compare(rows, 4, True, "float16", "float32", True)
    _compare(rows.astype(np.float16), 4, True, "float16", "float16", False)
    _compare(rows, 4, False, "float16", "float32", True)


def test_quantize_default_path_is_native_and_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """qformat.quantize takes the native path by default (where built) and writes the NumPy
    path's tensors, for several threads and layouts (axis 0, whole-axis groups, padding)."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((96, 200)) * np.exp(rng.uniform(-3, 3, (96, 1)))).astype(np.float32)
    calls = []
    real = int_._native
    monkeypatch.setattr(int_, "_native", lambda *a, **k: calls.append(1) or real(*a, **k))
    for threads in (1, 3):
        monkeypatch.setattr(_common, "THREADS", threads)
        for kw in ({}, {"bits": 8}, {"symmetric": False}, {"bits": 4, "group_size": 48}, {"axis": 0, "group_size": 16},
                   {"group_size": None, "bits": 8}, {"scale_dtype": "bfloat16", "symmetric": False}):
            calls.clear()
            got = qformat.quantize(x, "int", **kw)
            assert calls, kw
            with kernels.use("numpy"):
                want = qformat.quantize(x, "int", **kw)
            assert got.descriptor == want.descriptor, kw
            assert set(got.components) == set(want.components)
            for k, a in want.components.items():
                b = got.components[k]
                assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), (kw, threads, k)


def test_numpy_switch_and_uncovered_cases_skip_native(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.ones((4, 32), np.float32)
    with kernels.use("numpy"):
        assert not kernels.encode_available()
    assert not int_._native_covers(np.dtype(np.float64), True, "float16", "float32")
    assert not int_._native_covers(np.dtype(np.float32), True, "float32", "float32")  # float32 scales
    assert not int_._native_covers(np.dtype(np.float32), False, "float16", "float16")  # asym, rounded output
    monkeypatch.setattr(int_, "_native", lambda *a, **k: (_ for _ in ()).throw(AssertionError("native")))
    qformat.quantize(x.astype(np.float64), "int")
    qformat.quantize(x, "int", scale_dtype="float32")


def test_bad_arguments_are_refused() -> None:
    e = kernels._encode
    x = np.zeros((2, 32), np.float32)
    c, s, st = np.empty((2, 16), np.uint8), np.empty(2), np.empty(2, np.uint8)
    with pytest.raises(ValueError):
        e.int_sym(x, 0, 3, 32, 4, 1, 0, True, c, s, st)  # rows do not match the buffers
    with pytest.raises(ValueError):
        e.int_sym(x, 0, 2, 32, 4, 1, 0, True, np.empty((2, 15), np.uint8), s, st)
    with pytest.raises(ValueError):
        e.int_sym(x, 0, 2, 32, 4, 3, 0, True, c, s, st)  # scale kind
    with pytest.raises(ValueError):
        e.int_sym(x, 0, 2, 32, 8, 1, 0, True, c, s, st)  # packed needs 4 bits
    with pytest.raises(ValueError):
        e.int_asym(x, 0, 2, 32, 4, 1, True, c, s, np.empty(1), st)
    with pytest.raises(ValueError):
        e.int_sym(x, 0, 2, 32, 4, 1, 0, True, c, s, st, 9)  # a level this CPU lacks


_SANITIZED = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("qformat.kernels._encode", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
import qformat.kernels as K
K._encode = mod
import pytest
sys.exit(pytest.main(["-q", "-x", "-p", "no:cacheprovider", "-k", "ties or bad_arguments or 32-4-float32 or 32-8-bfloat16 or 16bit_output and 4- or asymmetric and 4-float16",
                      "tests/test_native_encode.py"]))
"""


def test_sanitized_encoders(tmp_path):
    """qformat/kernels/_encode.c built with -fsanitize=address,undefined runs part of this file's
    tests (every level, edge groups included) with no invalid access and no undefined behaviour."""
    import subprocess
    import sys

    from tests.test_kernels import ROOT, _sanitized_build

    so, env = _sanitized_build("_encode", tmp_path)
    env.update(QFORMAT_KERNELS="auto", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", _SANITIZED, str(so)], env=env, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert "passed" in r.stdout and r.returncode == 0 and "Sanitizer" not in r.stderr and "runtime error" not in r.stderr, (r.stdout[-3000:], r.stderr[-3000:])


def test_bench_section_quick(tmp_path, capsys):
    """bench/encode_native.py runs (tiny tensors) and checks the native bytes against NumPy's."""
    import json

    from bench.encode_native import main

    assert main(["--quick", "--json", str(tmp_path / "r.json")]) == 0
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert any(r["name"].startswith("qformat int4 g32 sym native") for r in rows)
    assert any(r["name"] == "qformat gguf Q4_0, 2 threads" for r in rows)


# -- qformat/kernels/_ggml.c (issue 45 item 5): Q4_0 / Q4_1 / Q5_0 / Q5_1 eight blocks at a time
# in AVX2, Q3_K's store on lanes, and the packed codes / F16 d / m quantize writes with the blocks.
# References: the scalar level (0) and the NumPy quantizers (qformat.schemes.ggml_blocks) for the
# blocks; per-element gathers of the blocks' bits (the layout's extract_reference) packed with
# np.packbits for the codes; the blocks' own bytes for d and m.

_FUSED = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q3_K": 3}


def _ggml_levels() -> list[int]:
    if kernels._ggml is None:
        return []
    return [0, 1] + ([2] if kernels._ggml.best_level() == 2 else [])


def _ggml_rows(seed: int, finite: bool) -> np.ndarray:
    """[19, 256] float32 (19 * 8 + 0 legacy blocks: a tail of 0..7 blocks after each 8 is taken
    by slicing below): random rows of many magnitudes and hand-made blocks: zeros and signed
    zeros, one sign with a zero at the min or max (Q4_1's order rule), equal largest magnitudes
    of both signs (Q4_0's first-of-largest rule), half-integer quotients (x * id + 8.5 exactly an
    integer: the truncation's edges), huge, tiny and subnormal blocks; with NaN and +-Inf where
    not ``finite``."""
    rng = np.random.default_rng(seed)
    r = rng.standard_normal((19, 256)) * np.exp(rng.uniform(-6, 6, (19, 1)))
    b = r.reshape(-1, 32)
    b[0] = 0.0
    b[1] = np.where(np.arange(32) % 2, -0.0, 0.0)
    b[2] = np.abs(b[2])
    b[2, 5] = 0.0
    b[3] = -np.abs(b[3])
    b[3, 7] = -0.0
    b[4, 3], b[4, 9] = 7.0, -7.0
    b[5, 3], b[5, 9] = -7.0, 7.0
    b[6] = (np.arange(32) % 16 - 8) + 0.5  # max -8 -> d 1: x + 8.5 on integers
    b[6, 0] = -8.0
    b[7] = (np.arange(32) % 31 - 15) * 0.5
    b[8] = rng.standard_normal(32) * 1e30
    b[9] = rng.standard_normal(32) * 1e-39
    b[10] = rng.standard_normal(32) * 1e-44
    b[11] = np.full(32, 3.0)
    b[12] = rng.integers(-4, 4, 32)
    b[13, :16] = 0.0
    b[14] = rng.standard_normal(32) * 2.0**62
    b[15] = rng.standard_normal(32) * 1e-37
    if not finite:
        b[20, 3] = np.nan
        b[21, 0] = np.inf
        b[22, 7] = -np.inf
        b[23, :] = np.nan
        b[24, 1], b[24, 2] = np.inf, -np.inf
        b[25] = np.inf
        b[26, ::3] = np.nan
        b[26, 1::3] = 0.0
    return r.astype(np.float32)


def _packed_reference(blocks: np.ndarray, t: str) -> np.ndarray:
    from qformat.convert.gguf import TYPES as LAYOUTS
    from qformat.schemes.gguf import TYPE_IDS

    codes = LAYOUTS[TYPE_IDS[t]].codes.extract_reference(blocks)
    bits = ((codes[..., None] >> np.arange(_FUSED[t], dtype=np.uint8)) & 1).astype(np.uint8)
    return np.packbits(bits.reshape(-1), bitorder="little")


@pytest.mark.skipif(kernels._ggml is None, reason="qformat.kernels._ggml is not built")
@pytest.mark.parametrize("t", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q3_K", "Q8_0", "Q2_K", "Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("finite", [True, False])
def test_ggml_levels_same_blocks_codes_and_parameters(t: str, finite: bool) -> None:
    """Every level's blocks equal the scalar level's (and, for finite input, the NumPy
    quantizers' with the largest magnitude returned), on every length of the 8-block batches'
    tail; for the types quantize writes codes / d / m for, those equal the blocks' own."""
    from qformat.schemes.ggml_blocks import SIZES, quantize_blocks

    if t == "Q8_0" and not finite:
        pytest.skip("Q8_0's lanes skip NaN in the block maximum, its scalar code (ggml's MAX) does not: a known "
                    "difference on input qformat.quantize refuses, older than issue 45")

    block, size = SIZES[t]
    x = _ggml_rows(3, finite).reshape(-1)
    for cut in (0, 32, 96, 224, 256 * 3 + 160) if block == 32 else (0, 256):
        xs = np.ascontiguousarray(x[: x.size - cut])
        nb = xs.size // block
        with np.errstate(all="ignore"):
            want = None if not finite else quantize_blocks(xs.reshape(-1, block), t).reshape(-1)
        first = None
        for lv in _ggml_levels():
            out = np.empty(nb * size, np.uint8)
            top = kernels._ggml.quantize(t, xs, out, lv)
            first = out if first is None else first
            assert np.array_equal(out, first), (t, lv, cut)
            if finite:
                assert np.array_equal(out, want), (t, lv, cut)
                assert top == float(np.abs(xs).max()), (t, lv, top)
            else:
                assert top == float(np.nanmax(np.where(np.isnan(xs), 0, np.abs(xs)))), (t, lv, top)
            if t not in _FUSED:
                continue
            codes = np.empty(nb * _FUSED[t] * block // 8, np.uint8)
            legacy = block == 32
            d = np.empty(nb, np.uint16) if legacy else None
            m = np.empty(nb, np.uint16) if t in ("Q4_1", "Q5_1") else None
            again = np.empty_like(out)
            kernels._ggml.quantize(t, xs, again, lv, 0, codes, d, m)
            assert np.array_equal(again, out), (t, lv)
            blocks = out.reshape(nb, size)
            assert np.array_equal(codes, _packed_reference(blocks, t)), (t, lv, cut)
            if d is not None:
                assert np.array_equal(d, blocks[:, :2].copy().view("<u2").reshape(-1)), (t, lv)
            if m is not None:
                assert np.array_equal(m, blocks[:, 2:4].copy().view("<u2").reshape(-1)), (t, lv)


@pytest.mark.skipif(kernels._ggml is None, reason="qformat.kernels._ggml is not built")
def test_ggml_codes_arguments_are_checked() -> None:
    g = kernels._ggml
    x = np.zeros(256, np.float32)
    for t, size, codes, d, m in (("Q8_0", 34 * 8, np.empty(128, np.uint8), None, None),  # no codes for Q8_0
                                 ("Q4_0", 18 * 8, np.empty(127, np.uint8), None, None),  # one byte short
                                 ("Q4_0", 18 * 8, None, np.empty(8, np.uint16), np.empty(8, np.uint16)),  # Q4_0 has no m
                                 ("Q4_1", 20 * 8, None, np.empty(7, np.uint16), None),
                                 ("Q3_K", 110, None, np.empty(1, np.uint16), None)):  # d only for the legacy types
        with pytest.raises(ValueError):
            g.quantize(t, x, np.empty(size, np.uint8), -1, 0, codes, d, m)
    with pytest.raises(ValueError):  # not C-contiguous
        g.quantize("Q4_0", x, np.empty(18 * 8, np.uint8), -1, 0, np.empty(128, np.uint8).reshape(2, 64).T)


@pytest.mark.skipif(kernels._ggml is None, reason="qformat.kernels._ggml is not built")
@pytest.mark.parametrize("t", sorted(_FUSED))
def test_gguf_scheme_fused_components_equal_numpy_path(t: str) -> None:
    """qformat.quantize(x, "gguf") with the codes / scale / bias written by the quantizer gives
    the NumPy path's components (float32 and float16 input, several row counts and threads)."""
    rng = np.random.default_rng(11)
    for shape in ((5, 512), (3, 2, 768), (256,), (40, 256)):
        for dt in (np.float32, np.float16):
            x = (rng.standard_normal(shape) * np.exp(rng.uniform(-4, 4, shape[:-1] + (1,)))).astype(dt)
            for threads in (1, 2):
                with pytest.MonkeyPatch.context() as mp:
                    mp.setattr(_common, "THREADS", threads)
                    got = qformat.quantize(x, "gguf", type=t)
                with kernels.use("numpy"):
                    want = qformat.quantize(x, "gguf", type=t)
                assert got.descriptor == want.descriptor
                assert set(got.components) == set(want.components)
                for k, a in want.components.items():
                    b = np.asarray(got.components[k])
                    a = np.asarray(a)
                    assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), (t, shape, dt, k)


@pytest.mark.parametrize("sdt", ["float16", "bfloat16"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_symmetric_scale_bits_equal_the_scales(sdt: str, dtype: str) -> None:
    """int_sym's 16-bit scale output (_native(..., scale_bits=True), what qformat.quantize uses)
    holds the NumPy path's scales in ``sdt`` exactly, at every level, subnormal float16 scales
    and the groups left to Python included."""
    if sdt == "bfloat16" and dtype == "float16":
        pytest.skip("not a covered combination")
    rows = _rows(32, 4, n=200, seed=4)
    rows[::5] *= np.float32(2.0**-20)  # float16 scales near and below its normal range
    with np.errstate(all="ignore"):
        _, s, ok = int_._symmetric(rows, 4, sdt, dtype, True)
        for lv in LEVELS:
            with kernels.use(lv):
                if not int_._native_covers(rows.dtype, True, sdt, dtype):
                    continue
                _, s2, ok2 = int_._native(rows, 4, True, sdt, dtype, True, scale_bits=True)
            assert s2.dtype == np.dtype(_dt(sdt)) and np.array_equal(ok2, ok)
            assert s2[ok].tobytes() == s[ok].astype(_dt(sdt)).tobytes(), lv
