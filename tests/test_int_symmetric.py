"""The binary32 path of the symmetric int encoder equals the reference rule bit for bit.

qformat/schemes/int_symmetric.py claims the same codes and scales as
int_.symmetric_reference for every input it covers; these tests feed both the same groups,
including the inputs where binary32 shortcuts would go wrong (quotients exactly halfway, values
on a code, ties between two decoded values, float16 outputs near the subnormal range, groups of
extreme magnitude), and compare every byte.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from qformat.schemes import int_, int_symmetric


def _groups(kind: str, rng: np.random.Generator, g: int) -> np.ndarray:
    n = 257
    if kind == "normal":
        return rng.standard_normal((n, g)) * 0.02
    if kind == "heavy":
        return rng.standard_t(2, (n, g)) * 0.02
    if kind == "halfway":  # x = (k + 1/2) * s with s a float16 / bfloat16 value
        s = np.float64(np.float16(rng.uniform(0.001, 0.1)))
        x = (rng.integers(-9, 9, (n, g)) + 0.5) * s
        x[:, 0] = 8 * s  # fixes amax, so the candidate scales are s-related
        return x
    if kind == "on_codes":  # values exactly on the decoded grid of Q4_0's scale
        s = np.float64(np.float16(0.0123))
        return rng.integers(-8, 8, (n, g)) * s
    if kind == "tiny":  # scales near and below float16's normal range
        return rng.standard_normal((n, g)) * np.logspace(-9, -3, n)[:, None]
    if kind == "wide":  # group magnitudes from 1e-30 to 1e30 (both edges of the search)
        return rng.standard_normal((n, g)) * np.logspace(-30, 30, n)[:, None]
    if kind == "sparse":
        x = rng.standard_normal((n, g))
        x[rng.random((n, g)) < 0.7] = 0
        x[::5] = 0
        x[1::7] = -x[1::7, :1]  # equal magnitudes of both signs: Q4_0's first-extreme rule
        return x
    raise AssertionError(kind)


KINDS = ["normal", "heavy", "halfway", "on_codes", "tiny", "wide", "sparse"]
INPUTS = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_fast_path_equals_reference(kind: str, bits: int) -> None:
    rng = np.random.default_rng(bits * 101 + KINDS.index(kind))
    checked = 0
    for (inp, npdt), dtype, sdt, g in itertools.product(INPUTS.items(), ("float32", "float16", "bfloat16"), ("float16", "bfloat16"), (32, 7, 128)):
        with np.errstate(over="ignore"):
            x = _groups(kind, rng, g).astype(npdt)
            finite = np.isfinite(x.astype(np.float64)).all(axis=1) & np.isfinite(x.astype(np.float64).astype(int_symmetric.np_dtype(dtype))).all(axis=1)
        x = x[finite]
        if not int_symmetric.covered(x.dtype, sdt, dtype):
            continue
        q_ref, s_ref, ok_ref = int_.symmetric_reference(x, bits, sdt, dtype)
        q, s, ok = int_symmetric.symmetric(x, bits, sdt, dtype, int_.symmetric_reference)
        where = f"{kind} input {inp} dtype {dtype} scale {sdt} g {g}"
        assert np.array_equal(ok, ok_ref), where
        assert np.array_equal(s[ok].view(np.uint64), s_ref[ok].view(np.uint64)), where
        assert np.array_equal(q[ok], q_ref[ok]), where
        if bits == 4 and g % 2 == 0:
            p, _, _ = int_symmetric.symmetric(x, bits, sdt, dtype, int_.symmetric_reference, packed=True)
            assert np.array_equal(p[ok], int_symmetric.nibbles(q_ref)[ok]), where
        checked += 1
    assert checked >= 18


def test_round_bits_equals_casts() -> None:
    """Integer rounding of binary32 bits equals NumPy's float16 and ml_dtypes' bfloat16 casts:
    bfloat16 on every finite input, float16 on values in its normal range and on zeros."""
    rng = np.random.default_rng(7)
    bits = np.concatenate([rng.integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(np.uint32),
                           # halfway patterns and their neighbours for both formats
                           (rng.integers(0, 2**19, 1 << 16).astype(np.uint32) << 13) | np.uint32(0x1000),
                           (rng.integers(0, 2**16, 1 << 16).astype(np.uint32) << 16) | np.uint32(0x8000),
                           (rng.integers(0, 2**16, 1 << 16).astype(np.uint32) << 16) | np.uint32(0x7FFF)])
    v = bits.view(np.float32)
    v = v[np.isfinite(v)]
    with np.errstate(over="ignore"):
        bf = v.astype(ml_dtypes.bfloat16).astype(np.float32)
    got = v.copy()
    int_symmetric.round_bits(got, "bfloat16", np.empty_like(got))
    assert np.array_equal(got.view(np.uint32), bf.view(np.uint32))
    with np.errstate(over="ignore"):
        h = v.astype(np.float16).astype(np.float32)
    normal = ((np.abs(v) >= 2.0**-14) & (np.abs(v) <= 65504)) | (v == 0)  # the callers' guarantee
    got = v.copy()
    int_symmetric.round_bits(got, "float16", np.empty_like(got))
    assert normal.sum() > 100_000
    assert np.array_equal(got[normal].view(np.uint32), h[normal].view(np.uint32))
