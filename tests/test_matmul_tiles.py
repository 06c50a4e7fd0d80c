"""The matmul kernel's tiled path for many rows of bfloat16 x (qformat/kernels/_matmul_tiles.h
``blk_bf`` / ``blk_bfvb``, issue 45 item 3): more than FEWMAX (4) rows of x holding bfloat16
values, x of more than 1 MiB (BLK_MIN_XBYTES), ``bf16x`` set, AVX512_BF16 and no AMX (switched
off here where the CPU has it).  Weights are formed into tiles of 64 weight rows by 1024 columns
in vdpbf16ps's pair layout and multiplied by 6 rows of x at a time.

Bits first: with one-hot rows of x every product but one is zero, so each output *is* the
weight the kernel multiplied (up to the sign of a zero: -0.0 plus the other products' +0.0): the weight formed from codes, table and parameters with SPEC.md's
binary32 steps (computed here with NumPy float32 arithmetic, independently of the kernel) and
rounded to bfloat16 (nearest even, ml_dtypes) -- checked at columns on both sides of every chunk
boundary, for every code kind and form the path takes (4-bit codes with one and two groups per
32 columns, each byte conversion, a gathered table, the VBMI byte planes).

Then products of random bfloat16 x: shapes whose column count is not a multiple of the 64-row
tile or the 16-column register, K of one chunk (992), of two and a part (1088, 2176) and of many
(31872, 106496), M = 5, 17, 300, 512 and 600 (not multiples of the 6-row step nor of the 256-row
block), one and two threads, within the float64 product of x and the formed binary32 weights by
qformat_torch.kernels.error_bound's terms (without the output rounding: the output is binary32):
``(2^-8 + (K + 2) 2^-24) (|x| @ |W|^T) + (K + 2) 2^-126`` (the one bfloat16 rounding of each
weight, binary32 sums in any order, partial sums vdpbf16ps flushes to zero).  Columns outside the
range asked for stay unwritten.
"""

from __future__ import annotations

import contextlib

import ml_dtypes
import numpy as np
import pytest

from qformat import kernels as qk

if not qk.matmul_available() or qk.matmul_level() < 2 or not qk.matmul_bf16():  # pragma: no cover - another CPU
    pytest.skip("the tiled path runs on AVX512_BF16 at the AVX-512 level of the matmul extension", allow_module_level=True)

from qformat.kernels import _matmul as mm  # noqa: E402

from tests.test_matmul_batch import KIND, _case, _switch  # noqa: E402  (the same operands and switch)

XBYTES = 1 << 20  # BLK_MIN_XBYTES: x (M K bfloat16 values) must be larger for the tiled path


@contextlib.contextmanager
def _tiled_path(planes: bool):
    """AMX off (the tiled path is the AVX512_BF16 one), the VBMI planes on or off."""
    with _switch(mm.amx, False), _switch(mm.planes, planes):
        yield


def _run(x, w, kind, table, g, ps, n, threads=1, n0=0, n1=None):
    m, k = x.shape
    assert m > 4 and m * k * 2 > XBYTES  # the tiled path's batch
    n1 = n if n1 is None else n1
    y = np.full((m, n), np.nan, np.float32)
    mm.matmul(np.ascontiguousarray(x), m, k, w, n, KIND[kind], table, g, ps[0], ps[1], ps[2], y, n0, n1, 2, 1, threads)
    return y


#: (kind, group, parameters, bfloat16-valued table): each way the path forms weights.  g = 0:
#: one group per row (K columns, per-channel int8).
FORMS = [("nib4", 32, "s", False), ("nib4", 64, "zs", False), ("nib4", 16, "sb", False), ("nib4", 128, "zsb", False),
         ("i8", 0, "s", False), ("i8", 64, "s", False), ("u8", 64, "zs", False), ("e4m3", 32, "s", False), ("e5m2", 16, "sb", False),
         ("lut8", 32, "s", False), ("lut8", 16, "s", True), ("lut8", 64, "zsb", True), ("lut8", 32, "b", True), ("e4m3", 64, "s", True)]
FORM_IDS = [f"{kd}-g{g or 'K'}-{p}{'-bf16table' if t else ''}" for kd, g, p, t in FORMS]
PLANES = [True, False] if mm.planes() else [False]


def _bf16(a: np.ndarray) -> np.ndarray:
    return a.astype(ml_dtypes.bfloat16).astype(np.float32)


def _normal(wf: np.ndarray) -> bool:
    return not np.any((wf != 0) & (np.abs(wf) < 2.0**-126))


@pytest.mark.parametrize("planes", PLANES, ids=lambda p: "planes" if p else "convert")
@pytest.mark.parametrize("kind, g, params, bft", FORMS, ids=FORM_IDS)
def test_tiles_multiply_the_formed_weights_bit_for_bit(kind, g, params, bft, planes) -> None:
    """One-hot rows of x (300 and 512 rows, two chunks and a part: columns at and beside each
    chunk boundary, the first and the last): each output is the formed weight rounded to
    bfloat16, bit for bit, in every one of 150 (37) weight rows, on one and two threads."""
    for m, k, n in ((300, 2176, 150), (512, 1088, 37)):
        gg = g or k
        if k % gg:
            continue
        w, table, ps, wf = _case(kind, n, k, gg, params, seed=len(kind) + gg + m, bf16_values=bft)
        want = _bf16(wf)
        assert _normal(want)
        edges = [c for b in range(0, k, 1024) for c in (b - 1, b, b + 1, b + 31, b + 32, b + 63, b + 64) if 0 <= c < k] + [k - 1]
        rest = np.random.default_rng(m).choice(np.setdiff1d(np.arange(k), edges), m - len(edges), replace=False)
        cols = np.concatenate([edges, rest])
        x = np.zeros((m, k), np.float32)
        x[np.arange(m), cols] = 1.0
        with _tiled_path(planes):
            for threads in (1, 2):
                got, exp = _run(x, w, kind, table, gg, ps, n, threads), want[:, cols].T
                # bit for bit, but for the sign of a zero weight (-0.0 times 1 plus the +0.0 products is +0.0)
                assert np.array_equal(np.where(exp == 0, 0, got).view(np.uint32), np.where(exp == 0, 0, exp).view(np.uint32)), (m, k, threads)
                assert np.all(got[exp == 0] == 0), (m, k, threads)


#: (M, K, N): K of one chunk (992 < 1024), two and a part, many; N not a multiple of 64 or 16
SHAPES = [(600, 992, 150), (512, 1088, 37), (300, 2176, 150), (17, 31872, 150), (5, 106496, 70)]


def _bound(x64, wf64, k):
    absdot = np.abs(x64) @ np.abs(wf64).T
    return (2.0**-8 + (k + 2) * 2.0**-24) * absdot + (k + 2) * 2.0**-126


@pytest.mark.parametrize("planes", PLANES, ids=lambda p: "planes" if p else "convert")
@pytest.mark.parametrize("kind, g, params, bft", FORMS, ids=FORM_IDS)
def test_tiles_products_within_the_bound(kind, g, params, bft, planes) -> None:
    """Random bfloat16 x on every shape the group divides, one and two threads: within the bound
    of the float64 product with the formed binary32 weights."""
    ran = 0
    for m, k, n in SHAPES:
        gg = g or k
        if k % gg or gg > 4096:
            continue
        w, table, ps, wf = _case(kind, n, k, gg, params, seed=m + k + gg, bf16_values=bft)
        assert _normal(_bf16(wf))
        rng = np.random.default_rng(m * k)
        x = _bf16(rng.standard_normal((m, k)).astype(np.float32))
        x64, wf64 = x.astype(np.float64), wf.astype(np.float64)
        ref = x64 @ wf64.T
        bound = _bound(x64, wf64, k)
        with _tiled_path(planes):
            for threads in (1, 2):
                y = _run(x, w, kind, table, gg, ps, n, threads)
                err = np.abs(y.astype(np.float64) - ref)
                assert bool((err <= bound).all()), (m, k, n, threads, float(np.nanmax(err / bound)))
        ran += 1
    assert ran >= 2


def test_tiles_column_ranges_leave_the_rest_unwritten() -> None:
    """Partial column ranges (starting and ending inside a 16-column register and a 64-row tile)
    on one, two and three threads: within the bound inside, NaN (as filled) outside."""
    m, k, n, g = 300, 2176, 200, 32
    w, table, ps, wf = _case("nib4", n, k, g, "zs", seed=9, bf16_values=False)
    rng = np.random.default_rng(10)
    x = _bf16(rng.standard_normal((m, k)).astype(np.float32))
    x64, wf64 = x.astype(np.float64), wf.astype(np.float64)
    ref, bound = x64 @ wf64.T, _bound(x64, wf64, k)
    with _tiled_path(False):
        for n0, n1 in ((0, n), (3, 70), (69, 200), (16, 17), (65, 193), (5, 5)):
            for threads in (1, 2, 3):
                y = _run(x, w, "nib4", table, g, ps, n, threads, n0, n1)
                assert bool((np.abs(y[:, n0:n1] - ref[:, n0:n1]) <= bound[:, n0:n1]).all()), (n0, n1, threads)
                assert np.isnan(y[:, :n0]).all() and np.isnan(y[:, n1:]).all(), (n0, n1, threads)


def test_tiles_agree_with_the_rows_path_within_the_bound() -> None:
    """The same product through the tiled path (x of 1.3 MB) and, with x one row smaller than the
    threshold allows, the rows path (rows_bf16): both within the bound of the same float64 product,
    and of each other by the sum of their bounds."""
    k, n, g = 2048, 150, 32
    w, table, ps, wf = _case("nib4", n, k, g, "s", seed=11, bf16_values=False)
    rng = np.random.default_rng(12)
    m_rows = XBYTES // (2 * k)  # 256 rows: exactly 1 MiB, not more: rows_bf16
    x = _bf16(rng.standard_normal((m_rows + 64, k)).astype(np.float32))
    x64, wf64 = x.astype(np.float64), wf.astype(np.float64)
    ref, bound = x64 @ wf64.T, _bound(x64, wf64, k)
    with _tiled_path(False):
        tiled = _run(x, w, "nib4", table, g, ps, n)
        y = np.full((m_rows, n), np.nan, np.float32)
        mm.matmul(np.ascontiguousarray(x[:m_rows]), m_rows, k, w, n, 0, table, g, None, ps[1], None, y, 0, n, 2, 1, 1)
    assert bool((np.abs(tiled - ref) <= bound).all())
    assert bool((np.abs(y - ref[:m_rows]) <= bound[:m_rows]).all())
    assert bool((np.abs(tiled[:m_rows].astype(np.float64) - y) <= 2 * bound[:m_rows]).all())
