"""The float encoders' fast kernels (qformat/schemes/_float_fast.py) equal the steps they
replace: ml_dtypes' rounding (cast_codes), the reference packer, NumPy's block maxima and
np.searchsorted."""

from __future__ import annotations

import numpy as np
import pytest

from qformat.schemes import _float_fast as ff
from qformat.schemes._common import cast_codes, pack


@pytest.mark.parametrize("fmt", ["e2m1fn", "e2m3fn", "e3m2fn", "e4m3fn", "e5m2"])
def test_float_codes_equal_cast_codes_on_every_exponent_and_top_mantissa_pattern(fmt: str) -> None:
    # every sign / exponent / top-12-mantissa pattern, with low bits that make exact ties,
    # values just above and below them
    hi = np.arange(1 << 21, dtype=np.uint32) << np.uint32(11)
    for low in (0, 1, 0x3FF, 0x400, 0x401, 0x7FF):
        y = (hi | np.uint32(low)).view(np.float32)
        y = y[np.isfinite(y)]
        got, want = ff.float_codes(y, fmt), cast_codes(y, fmt)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (fmt, low, y[bad[:5]], got[bad[:5]], want[bad[:5]])


@pytest.mark.parametrize("bits", range(1, 9))
def test_pack_codes_equal_pack(bits: int) -> None:
    rng = np.random.default_rng(bits)
    shapes = [(8,), (3, 16), (2, 5, 24), (40,), (1, 8), (7, 3)]
    checked = 0
    for shape in shapes:
        if not ff.packs_flat(shape, bits):
            continue
        q = rng.integers(0, 1 << bits, int(np.prod(shape))).astype(np.uint8)
        a, b = ff.pack_codes(q, bits, shape), pack(q.reshape(shape), bits)
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), (bits, shape)
        checked += 1
    assert checked >= 2


@pytest.mark.parametrize("block", [1, 2, 3, 6, 16, 48, 64])
def test_row_amax_equals_numpy(block: int) -> None:
    rng = np.random.default_rng(block)
    x = rng.standard_normal((96, 192)).astype(np.float32)
    x[3] = 0
    x[4, 5] = -7
    x[5, :] = -0.0
    x[6, ::3] = np.float32(1e-45)  # subnormals
    xb = np.ascontiguousarray(x.reshape(-1, block))
    got, want = ff.row_amax(xb), np.max(np.abs(xb), axis=1)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_count_above_equals_searchsorted() -> None:
    rng = np.random.default_rng(3)
    t = np.sort(rng.standard_normal(15)).astype(np.float32)
    y = np.concatenate([rng.standard_normal(100_000).astype(np.float32), t, np.nextafter(t, np.float32(np.inf)), np.nextafter(t, np.float32(-np.inf))])
    assert np.array_equal(ff.count_above(y, list(t)), np.searchsorted(t, y, side="left"))
