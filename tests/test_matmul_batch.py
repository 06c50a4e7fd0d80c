"""The matmul kernel's few-rows path (qformat/kernels/_matmul.c ``few_f32`` / ``few_bf``, issue 45):
2 to 4 rows of x at the AVX-512 level, each weight formed once in registers for every row.

Bits first: with one-hot rows of x every product but one is zero, so the output *is* the weight
the kernel multiplied: in binary32 it must equal the weight formed from codes, table and
parameters with SPEC.md's binary32 steps (zero subtracted, scale multiplied, bias added, each
rounded: computed here with NumPy float32 arithmetic, independently of the kernel), and on the
bfloat16 dot products (bf16x) that weight rounded to bfloat16 (nearest even, ml_dtypes).  Then
the product, for 1 to 9, 17 and 512 rows (the few-rows path and the paths either side of it),
shares not a multiple of the kernel's 4 or 16 weight rows, and K spanning several of its x chunks
with a partial last one: within the float64 product of x and those weights by

- binary32 x: ``(K + 2) 2^-24 (|x| @ |W|^T)`` -- the classic bound for K binary32 products summed
  in any order with FMA (each product exact or one rounding, K - 1 additions; gamma_K <= (K+2)u
  for K u < 0.01);
- bfloat16 x (x holds bfloat16 values, weights in bfloat16's normal range): the same plus
  ``2^-8 (|x| @ |W|^T)`` for the one rounding of each weight to bfloat16 (relative 2^-8), plus
  ``(K + 2) 2^-126`` absolute for partial sums vdpbf16ps flushes to zero
  (qformat_torch.kernels.error_bound states the same terms).

Every case also runs with the few-rows path switched off (``_matmul.few(0)``: the rows_* paths),
held to the same bound, and columns outside the range asked for stay unwritten.  The bit-for-bit
test switches off the bfloat16-table path of scale-only 4-bit codes (``_matmul.bf1(0)``), which
multiplies ``bf16(t) s`` rather than ``bf16(fl(t s))`` (tests/test_matmul_row1_bf16.py).
"""

from __future__ import annotations

import contextlib

import ml_dtypes
import numpy as np
import pytest

from qformat import kernels as qk

if not qk.matmul_available() or qk.matmul_level() < 2:  # pragma: no cover - another CPU
    pytest.skip("the few-rows path runs at the AVX-512 level of the matmul extension", allow_module_level=True)

from qformat.kernels import _matmul as mm  # noqa: E402

KIND = {"nib4": 0, "i8": 1, "u8": 2, "e4m3": 3, "e5m2": 4, "lut8": 5}
BF16 = bool(mm.cpu_bf16())
C = np.arange(256, dtype=np.uint8)


def _table(kind: str, rng: np.random.Generator, bf16_values: bool = False) -> np.ndarray:
    if kind == "nib4":
        return rng.standard_normal(16).astype(np.float32)
    if kind == "i8":
        return C.view(np.int8).astype(np.float32)
    if kind == "u8":
        return C.astype(np.float32)
    if kind == "e4m3":
        return np.nan_to_num(C.view(ml_dtypes.float8_e4m3fn).astype(np.float32)).astype(np.float32)
    if kind == "e5m2":
        return C.view(ml_dtypes.float8_e5m2).astype(np.float32)
    t = rng.standard_normal(256).astype(np.float32)
    return t.astype(ml_dtypes.bfloat16).astype(np.float32) if bf16_values else t  # bfloat16 values: the VBMI planes


def _case(kind: str, n: int, k: int, g: int, params: str, seed: int, bf16_values: bool = False):
    """(codes, table, [z, s, b], float32 weights [n, k]) with the parameters named in ``params``."""
    rng = np.random.default_rng(seed)
    table = _table(kind, rng, bf16_values)
    w = rng.integers(0, 256, (n, k // 2 if kind == "nib4" else k), dtype=np.uint8)
    if kind == "e4m3":
        w &= 0xF7  # no NaN code (the caller's rule for this kind)
    if kind == "e5m2":
        w &= 0xBF  # finite codes only
    ps = [(rng.standard_normal((n, k // g)) * (0.5 if r == "s" else 1.0)).astype(np.float32) if r in params else None for r in "zsb"]
    codes = np.stack([w & 15, w >> 4], -1).reshape(n, k) if kind == "nib4" else w
    wf = table[codes]  # float32, then SPEC.md's binary32 steps per group
    z, s, b = (np.repeat(p, g, 1) if p is not None else None for p in ps)
    if z is not None:
        wf = (wf - z).astype(np.float32)
    if s is not None:
        wf = (wf * s).astype(np.float32)
    if b is not None:
        wf = (wf + b).astype(np.float32)
    return w, table, ps, wf


@contextlib.contextmanager
def _switch(fn, on: bool):
    before = bool(fn())
    fn(int(on))
    try:
        yield
    finally:
        fn(int(before))


def _run(x, w, kind, table, g, ps, n, bf, threads=1, n0=0, n1=None):
    m, k = x.shape
    n1 = n if n1 is None else n1
    y = np.full((m, n), np.nan, np.float32)
    mm.matmul(np.ascontiguousarray(x), m, k, w, n, KIND[kind], table, g, ps[0], ps[1], ps[2], y, n0, n1, 2, int(bf), threads)
    return y


#: (kind, group, parameters, bfloat16-valued table) covering each way the few-rows path forms
#: weights: 4-bit codes with g % 32 == 0 (one folded table per group) and g = 16 (two groups per
#: 32 columns), every byte conversion, a gathered table, and the VBMI byte planes.
FORMS = [("nib4", 32, "s", False), ("nib4", 64, "zs", False), ("nib4", 16, "sb", False), ("nib4", 128, "zsb", False),
         ("i8", 1024, "s", False), ("u8", 64, "zs", False), ("e4m3", 32, "s", False), ("e5m2", 16, "sb", False),
         ("lut8", 32, "s", False), ("lut8", 16, "s", True), ("lut8", 64, "zsb", True), ("lut8", 32, "b", True)]
FORM_IDS = [f"{kd}-g{g}-{p}{'-bf16table' if t else ''}" for kd, g, p, t in FORMS]
PLANES = [True, False] if mm.planes() else [False]


@pytest.mark.parametrize("planes", PLANES, ids=lambda p: "planes" if p else "convert")
@pytest.mark.parametrize("kind, g, params, bft", FORMS, ids=FORM_IDS)
def test_few_rows_multiply_the_formed_weights_bit_for_bit(kind, g, params, bft, planes) -> None:
    """One-hot rows of x, 2, 3 and 4 at a time (K = 2048: every column of a chunk's start, middle
    and end): the output is each weight, bit for bit; on the bfloat16 dot products, that weight
    rounded to bfloat16 (these tables and parameters give no bfloat16 subnormal weight)."""
    n, k = 21, 2048
    w, table, ps, wf = _case(kind, n, k, g, params, seed=len(kind) + g, bf16_values=bft)
    eye = np.eye(k, dtype=np.float32)
    paths = [(False, wf)] + ([(True, wf.astype(ml_dtypes.bfloat16).astype(np.float32))] if BF16 else [])
    # (the bfloat16-table path of scale-only 4-bit codes, mm.bf1, multiplies other weights: its own
    # test is tests/test_matmul_row1_bf16.py)
    with _switch(mm.planes, planes), _switch(mm.few, True), _switch(mm.bf1, False):
        for bf, want in paths:
            assert not (bf and np.any((want != 0) & (np.abs(want) < 2.0**-126)))
            for m in (2, 3, 4):
                cols = list(range(0, k, 97))[: 3 * m]  # spread over the chunks
                for a in range(0, len(cols) - m + 1, m):
                    got = _run(eye[cols[a:a + m]], w, kind, table, g, ps, n, bf)
                    assert np.array_equal(got.view(np.uint32), want[:, cols[a:a + m]].T.view(np.uint32)), (m, bf, cols[a:a + m])


def _bound(x64, wf64, k, bf):
    absdot = np.abs(x64) @ np.abs(wf64).T
    return ((2.0**-8 if bf else 0.0) + (k + 2) * 2.0**-24) * absdot + (k + 2) * 2.0**-126


BOUND_FORMS = [("nib4", 32, "s", False), ("nib4", 16, "sb", False), ("i8", 64, "s", False), ("lut8", 16, "s", True)]


@pytest.mark.parametrize("kind, g, params, bft", BOUND_FORMS, ids=[f"{kd}-g{g}-{p}" for kd, g, p, _ in BOUND_FORMS])
def test_products_within_the_bound_for_every_batch(kind, g, params, bft) -> None:
    """1-9, 17 and 512 rows of x (binary32 and bfloat16 values, both bf16x settings), 37 output
    columns (not a multiple of 4 or 16), K = 2112 (two x chunks and part of a third at 4 rows),
    one and three threads, the few-rows path on and off: within the stated bound of the float64
    product with the formed weights."""
    n, k = 37, 2112
    w, table, ps, wf = _case(kind, n, k, g, params, seed=g, bf16_values=bft)
    wf64 = wf.astype(np.float64)
    rng = np.random.default_rng(k)
    for m in list(range(1, 10)) + [17, 512]:
        x = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16).astype(np.float32)
        ref = x.astype(np.float64) @ wf64.T
        for bf in (False, True) if BF16 else (False,):
            bound = _bound(x.astype(np.float64), wf64, k, bf)
            for few in (True, False):
                with _switch(mm.few, few):
                    for threads in (1, 3):
                        y = _run(x, w, kind, table, g, ps, n, bf, threads)
                        err = np.abs(y.astype(np.float64) - ref)
                        assert bool((err <= bound).all()), (m, bf, few, threads, float((err / bound).max()))


def test_few_rows_binary32_x_and_column_ranges() -> None:
    """x that is not bfloat16 values (the binary32 path whatever bf16x says is not asked), partial
    column ranges on one and several threads: within the bound, nothing written outside the range."""
    n, k, g = 150, 1024, 32
    w, table, ps, wf = _case("nib4", n, k, g, "zs", seed=5)
    rng = np.random.default_rng(6)
    for m in (2, 3, 4):
        x = rng.standard_normal((m, k)).astype(np.float32)
        ref = x.astype(np.float64) @ wf.astype(np.float64).T
        bound = _bound(x.astype(np.float64), wf.astype(np.float64), k, False)
        for n0, n1 in ((0, n), (3, 70), (69, 150), (16, 17), (5, 5)):
            for threads in (1, 2, 4):
                y = _run(x, w, "nib4", table, g, ps, n, False, threads, n0, n1)
                assert bool((np.abs(y[:, n0:n1] - ref[:, n0:n1]) <= bound[:, n0:n1]).all()), (m, n0, n1, threads)
                assert np.isnan(y[:, :n0]).all() and np.isnan(y[:, n1:]).all()


def test_few_switch_reads_and_restores() -> None:
    assert mm.few() is True
    assert mm.few(0) is False
    assert mm.few(1) is True
