"""The matmul kernel's bfloat16-table path (qformat/kernels/_matmul.c ``row1_bfs`` for one row of
x, ``few_bfs`` for 2 to 8, issue 45): bfloat16 x, 4-bit codes whose parameter is a scale alone
(int4 symmetric, nf4, mxfp4, nvfp4), the 16 table values rounded to bfloat16 once and each
group's dot product scaled once.

Bits first: with a one-hot x the output is the weight the kernel multiplied, which must be
``float32(bf16(t[c])) * s`` rounded once to binary32 (the table value rounded to bfloat16 by
ml_dtypes, nearest even, then one binary32 multiplication by NumPy): not qformat's binary32 weight
``fl(t[c] s)``, which the binary32 path (``_matmul.bf1(0)``) multiplies and this test also checks,
so a table that bfloat16 does not hold exactly shows which path ran.  Then products of random
bfloat16 x, every group size the path takes (16, 32, 64, 128, 256), K with and without a last 64
columns (the path reads 128 columns per load and the last 64 another way), column ranges on one
and several threads: within the bound of ``qformat_torch.kernels.error_bound`` for bfloat16
activations, against the float64 product with qformat's binary32 weights:
``(2^-8 + (K + 2) 2^-24) (|x| @ |W|^T) + (K + 2) 2^-126`` (one rounding of each weight to
bfloat16, binary32 sums of any order and depth K + 2, flushed subnormal partial sums).  And the
cases the path must refuse: a subnormal x, a table value that is subnormal in bfloat16, a zero
point or bias, bf16x not given; each must give the binary32 path's output bit for bit.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from qformat import kernels as qk

if not qk.matmul_available() or qk.matmul_level() < 2:  # pragma: no cover - another CPU
    pytest.skip("the one-row bfloat16 path runs at the AVX-512 level of the matmul extension", allow_module_level=True)

from qformat.kernels import _matmul as mm  # noqa: E402
from tests.test_matmul_batch import _switch  # noqa: E402

if not mm.bf1():  # pragma: no cover - an AVX-512 CPU without AVX512_BF16
    pytest.skip("this CPU has no AVX512_BF16: the one-row bfloat16 path does not run", allow_module_level=True)

NIB4 = 0
NF4 = np.array([-1.0, -0.6961928, -0.5250731, -0.3949175, -0.2844414, -0.1847734, -0.0910500, 0.0, 0.0795803, 0.1609302,
                0.2461123, 0.3379152, 0.4407098, 0.5626170, 0.7229568, 1.0], np.float32)
INT4 = np.arange(-8, 8, dtype=np.float32)
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def _bf1(on: bool):
    """The bfloat16-table path switched on or off for a block (test_matmul_batch's switch)."""
    return _switch(mm.bf1, on)


def _bf16(a: np.ndarray) -> np.ndarray:
    return a.astype(ml_dtypes.bfloat16).astype(np.float32)


def _case(n: int, k: int, g: int, table: np.ndarray, seed: int):
    rng = np.random.default_rng(seed)
    w = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    s = (rng.random((n, k // g)) * 0.05 + 1e-3).astype(np.float32) * rng.choice([-1, 1], (n, k // g)).astype(np.float32)
    codes = np.stack([w & 15, w >> 4], -1).reshape(n, k)
    return w, s, codes


def _run(x, w, table, g, z, s, b, n, bf=True, threads=1, n0=0, n1=None):
    m, k = x.shape
    y = np.full((m, n), np.nan, np.float32)
    mm.matmul(np.ascontiguousarray(x, np.float32), m, k, w, n, NIB4, table, g, z, s, b, y, n0, n if n1 is None else n1, 2, int(bf), threads)
    return y


ONE_HOT = [(k, g) for k in (704, 768) for g in (16, 32, 64, 128, 256) if k % g == 0]


@pytest.mark.parametrize("k, g", ONE_HOT, ids=[f"K{k}-g{g}" for k, g in ONE_HOT])
@pytest.mark.parametrize("tname", ["nf4", "int4"])
def test_one_hot_x_gives_the_bfloat16_table_value_times_the_scale(k, g, tname) -> None:
    """K = 768 (six 128-column steps) with 1, 2, 3 and 8 rows of x; K = 704 (five steps and a last
    64 columns, which one row takes and several do not) with one: each row one-hot at a
    different column (every 37th)."""
    table = NF4 if tname == "nf4" else INT4
    n = 19
    w, s, codes = _case(n, k, g, table, seed=g)
    sfull = np.repeat(s, g, 1)
    want_bf = (_bf16(table)[codes] * sfull).astype(np.float32)  # one binary32 rounding of bf16(t) * s
    want_f32 = (table[codes] * sfull).astype(np.float32)  # qformat's binary32 weight
    differ = False
    cols = list(range(0, k, 37))
    for m in (1, 2, 3, 8) if k % 128 == 0 else (1,):  # row1_bfs, then few_bfs with 2 and 1 weight rows in lockstep
        for a in range(0, len(cols) - m + 1, m):
            x = np.zeros((m, k), np.float32)
            x[np.arange(m), cols[a:a + m]] = 1.0
            with _bf1(True):
                got = _run(x, w, table, g, None, s, None, n)
            with _bf1(False):
                old = _run(x, w, table, g, None, s, None, n)
            assert np.array_equal(got, want_bf[:, cols[a:a + m]].T), (m, cols[a:a + m])
            # the binary32 path's weight: qformat's, rounded to bfloat16 where several rows of
            # bfloat16 x take the bfloat16 dot products (few_bf, rows_bf16)
            want_old = want_f32 if m == 1 else _bf16(want_f32)
            assert np.array_equal(old, want_old[:, cols[a:a + m]].T), (m, cols[a:a + m])
            differ |= m == 1 and not np.array_equal(got, old)
    # one row: nf4's values are not bfloat16 values, so the two paths must differ somewhere; int4's are
    assert differ == (tname == "nf4")


def _bound(x64, wf64, k):
    return (2.0**-8 + (k + 2) * 2.0**-24) * (np.abs(x64) @ np.abs(wf64).T) + (k + 2) * 2.0**-126


#: (K, group): K of one last 64 columns only, of 128-column loads and a last 64, of loads only
SHAPES = [(k, g) for k in (64, 192, 2048, 4160) for g in (16, 32, 64, 128, 256) if k % g == 0]


@pytest.mark.parametrize("k, g", SHAPES, ids=[f"K{k}-g{g}" for k, g in SHAPES])
@pytest.mark.parametrize("tname", ["nf4", "int4", "e2m1"])
def test_products_within_the_bound(k, g, tname) -> None:
    """1, 2, 4, 5 and 8 rows of x, 37 or 150 output columns (not a multiple of the 16 weight rows
    a block takes), one and three threads, whole and partial column ranges: within the bound of
    the float64 product with qformat's binary32 weights, nothing written outside the range."""
    table = {"nf4": NF4, "int4": INT4, "e2m1": E2M1}[tname]
    n = 37 if k < 4000 else 150
    w, s, codes = _case(n, k, g, table, seed=k + g)
    wf64 = (table[codes] * np.repeat(s, g, 1)).astype(np.float32).astype(np.float64)
    rng = np.random.default_rng(k * g)
    wt64 = table[codes].astype(np.float64)
    for m in (1, 2, 4, 5, 8):
        x = _bf16(rng.standard_normal((m, k)).astype(np.float32))
        ref = x.astype(np.float64) @ wf64.T
        bound = _bound(x.astype(np.float64), wf64, k)
        with _bf1(True):
            for threads in (1, 3):
                for n0, n1 in ((0, n), (5, 30), (16, 17), (3, 3)):
                    y = _run(x, w, table, g, None, s, None, n, True, threads, n0, n1)
                    err = np.abs(y[:, n0:n1].astype(np.float64) - ref[:, n0:n1])
                    assert bool((err <= bound[:, n0:n1]).all()), (m, threads, n0, n1, float((err / bound[:, n0:n1]).max()))
                    assert np.isnan(y[:, :n0]).all() and np.isnan(y[:, n1:]).all()
            # no scale at all: the table values themselves
            y = _run(x, w, table, g, None, None, None, n)
            assert bool((np.abs(y.astype(np.float64) - x.astype(np.float64) @ wt64.T) <= _bound(x.astype(np.float64), wt64, k)).all())


def test_refusals_take_the_binary32_path_bit_for_bit() -> None:
    """What the path must not take: each case's output equals the binary32 path's (bf1 off)."""
    n, k, g = 40, 512, 32
    w, s, _ = _case(n, k, g, NF4, seed=1)
    rng = np.random.default_rng(2)
    x = _bf16(rng.standard_normal((1, k)).astype(np.float32))
    xsub = x.copy()
    xsub[0, 77] = 2.0**-130  # a subnormal: vdpbf16ps would take it as zero
    tsub = NF4.copy()
    tsub[3] = 2.0**-130
    z = rng.standard_normal((n, k // g)).astype(np.float32)
    cases = {
        "subnormal x": dict(x=xsub, table=NF4, z=None, b=None, bf=True),
        "subnormal table value": dict(x=x, table=tsub, z=None, b=None, bf=True),
        "zero point": dict(x=x, table=NF4, z=z, b=None, bf=True),
        "bias": dict(x=x, table=NF4, z=None, b=z, bf=True),
        "bf16x not given": dict(x=x, table=NF4, z=None, b=None, bf=False),
    }
    for name, c in cases.items():
        with _bf1(True):
            on = _run(c["x"], w, c["table"], g, c["z"], s, c["b"], n, c["bf"])
        with _bf1(False):
            off = _run(c["x"], w, c["table"], g, c["z"], s, c["b"], n, c["bf"])
        assert np.array_equal(on.view(np.uint32), off.view(np.uint32)), name
    # and the path does run on the same operands without the refusal's cause (nf4 is not
    # bfloat16-exact, so its output differs from the binary32 path's)
    with _bf1(True):
        on = _run(x, w, NF4, g, None, s, None, n)
    with _bf1(False):
        off = _run(x, w, NF4, g, None, s, None, n)
    assert not np.array_equal(on, off)


def test_bf1_switch_reads_and_restores() -> None:
    assert mm.bf1() is True
    assert mm.bf1(0) is False
    assert mm.bf1(1) is True


# -- 6-bit codes in bytes (kind lut6: GGUF's Q6_K), one row: row1_bfs6 -------------------------------
LUT6, LUT8 = 6, 5
Q6 = np.arange(-32, 32, dtype=np.float32)  # Q6_K's element values


def _case6(n: int, k: int, g: int, table64: np.ndarray, seed: int):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 64, (n, k), dtype=np.uint8)
    s = (rng.random((n, k // g)) * 0.05 + 1e-3).astype(np.float32) * rng.choice([-1, 1], (n, k // g)).astype(np.float32)
    table = np.zeros(256, np.float32)
    table[:64] = table64
    return codes, s, table


def _run6(x, codes, table, g, z, s, b, n, kind=LUT6, bf=True, threads=1, n0=0, n1=None):
    m, k = x.shape
    y = np.full((m, n), np.nan, np.float32)
    mm.matmul(np.ascontiguousarray(x, np.float32), m, k, codes, n, kind, table, g, z, s, b, y, n0, n if n1 is None else n1, 2, int(bf), threads)
    return y


SIX = [(k, g) for k in (64, 192, 1024) for g in (16, 32, 64, 128) if k % g == 0]


@pytest.mark.parametrize("k, g", SIX, ids=[f"K{k}-g{g}" for k, g in SIX])
@pytest.mark.parametrize("tname", ["q6", "random"])
def test_six_bit_codes_one_hot_and_bound(k, g, tname) -> None:
    """One-hot x: ``float32(bf16(t[c])) * s`` rounded once (random 64 values, which bfloat16 does not
    hold, and Q6_K's integers, which it does); random bfloat16 x on one and three threads and
    column ranges: within the bound; lut6 with the path off and lut8 give the same bits."""
    rng = np.random.default_rng(k + g)
    t64 = Q6 if tname == "q6" else rng.standard_normal(64).astype(np.float32)
    n = 23
    codes, s, table = _case6(n, k, g, t64, seed=k * g)
    sfull = np.repeat(s, g, 1)
    want = (_bf16(table)[codes] * sfull).astype(np.float32)
    for col in range(0, k, 29):
        x = np.zeros((1, k), np.float32)
        x[0, col] = 1.0
        with _bf1(True):
            assert np.array_equal(_run6(x, codes, table, g, None, s, None, n)[0], want[:, col]), col
    wf64 = (table[codes] * sfull).astype(np.float32).astype(np.float64)
    x = _bf16(rng.standard_normal((1, k)).astype(np.float32))
    ref = x.astype(np.float64) @ wf64.T
    bound = _bound(x.astype(np.float64), wf64, k)
    with _bf1(True):
        for threads in (1, 3):
            for n0, n1 in ((0, n), (5, 20), (7, 7)):
                y = _run6(x, codes, table, g, None, s, None, n, threads=threads, n0=n0, n1=n1)
                assert bool((np.abs(y[:, n0:n1] - ref[:, n0:n1]) <= bound[:, n0:n1]).all()), (threads, n0, n1)
                assert np.isnan(y[:, :n0]).all() and np.isnan(y[:, n1:]).all()
    with _bf1(False):
        off6 = _run6(x, codes, table, g, None, s, None, n)
        off8 = _run6(x, codes, table, g, None, s, None, n, kind=LUT8)
    assert np.array_equal(off6.view(np.uint32), off8.view(np.uint32))


def test_six_bit_codes_refusals_and_other_rows() -> None:
    """lut6 takes row1_bfs6 only for one row of bfloat16 x with a scale alone: with a zero point,
    a bias, bf16x not given, a subnormal x, or 2 and 5 rows it gives lut8's bits."""
    n, k, g = 40, 256, 16
    rng = np.random.default_rng(9)
    codes, s, table = _case6(n, k, g, rng.standard_normal(64).astype(np.float32), seed=3)
    x1 = _bf16(rng.standard_normal((1, k)).astype(np.float32))
    xsub = x1.copy()
    xsub[0, 5] = 2.0**-130
    z = rng.standard_normal((n, k // g)).astype(np.float32)
    cases = [(x1, z, None, True), (x1, None, z, True), (x1, None, None, False), (xsub, None, None, True),
             (_bf16(rng.standard_normal((2, k)).astype(np.float32)), None, None, True),
             (_bf16(rng.standard_normal((5, k)).astype(np.float32)), None, None, True)]
    with _bf1(True):
        for i, (x, zz, bb, bf) in enumerate(cases):
            a = _run6(x, codes, table, g, zz, s, bb, n, kind=LUT6, bf=bf)
            b = _run6(x, codes, table, g, zz, s, bb, n, kind=LUT8, bf=bf)
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), i
        # and one row with a scale alone does take it (random values: not bfloat16-exact)
        a = _run6(x1, codes, table, g, None, s, None, n, kind=LUT6)
        b = _run6(x1, codes, table, g, None, s, None, n, kind=LUT8)
        assert not np.array_equal(a, b)
