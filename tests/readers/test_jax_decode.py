"""The JAX decoder against the NumPy reference, bit for bit, under jax.jit.

* hypothesis over tests.test_decode.descriptors() (every element, packing, block, nesting
  feature), once per logical dtype, with the decode jitted as one computation;
* the same with random bit patterns in every float parameter and codebook table (subnormals,
  Inf, NaN, overflowing and underflowing products), where plain binary32 XLA arithmetic fails;
* targeted cases for the three XLA behaviours that break SPEC.md §10.2 arithmetic on CPU: a
  multiply followed by an add contracted to one FMA, subnormals flushed (FTZ/DAZ), and a
  division by a broadcast or gathered divisor rewritten as a multiplication by its reciprocal.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

jax = pytest.importorskip("jax")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import qformat  # noqa: E402
from qformat.errors import QFormatError  # noqa: E402
from qformat_jax import QArray, dequantize  # noqa: E402
from qformat_jax._decode import descriptor_json, jitted  # noqa: E402

from ..test_decode import descriptors, same_bits  # noqa: E402

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def jax_decode(desc, comps, exact=True):
    q = QArray.from_qtensor(qformat.QTensor(desc, comps))
    out, ok = jitted(descriptor_json(desc), exact)(q.components)
    return np.asarray(out), bool(ok)


def check(desc, comps):
    with np.errstate(all="ignore"):
        want = qformat.QTensor(desc, comps).dequantize()
    got, ok = jax_decode(desc, comps)
    assert ok
    assert got.dtype == want.dtype and got.shape == want.shape
    assert same_bits(got, want), (desc, got, want)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@SETTINGS
@given(case=st.data())
def test_jit_decode_matches_numpy(dtype, case):
    desc, comps, _ = case.draw(descriptors(dtype=dtype))
    check(desc, comps)


def _code_tensors(desc):
    out = {desc["codes"]["tensor"]}
    for role in ("zero", "scale", "bias"):
        if role in desc and "encoded" in desc[role]:
            out |= _code_tensors(desc[role]["encoded"])
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(descriptors(), st.integers(0, 2**32 - 1))
def test_jit_decode_matches_numpy_on_random_bits(case, seed):
    """Random bit patterns in float parameters and tables: half of them with tiny exponents."""
    desc, comps, _ = case
    rng = np.random.default_rng(seed)
    codes = _code_tensors(desc)
    for name, a in list(comps.items()):
        if name in codes or np.dtype(a.dtype).kind not in "fV" or a.dtype.itemsize == 1:
            continue
        u = rng.integers(0, 1 << (8 * a.itemsize), size=a.shape, dtype=np.uint64).astype(f"u{a.itemsize}")
        if rng.random() < 0.5:  # exponent bits mostly clear: subnormal and tiny normal values
            u &= np.array(0x80FFFFFF if a.itemsize == 4 else 0x80FF, dtype=u.dtype)
        comps[name] = u.view(a.dtype)
    check(desc, comps)


# -- targeted XLA hazards -------------------------------------------------------------------
def _table_desc(values, dtype="float32", **params):
    """A one-code-per-byte codebook tensor whose element values are ``values`` (F32 table)."""
    n = len(values)
    desc = {"shape": [n], "dtype": dtype,
            "codes": {"tensor": "c", "element": {"type": "codebook", "bits": 8, "table_tensor": "t"},
                      "packing": {"container": 8, "bit_order": "lsb_first", "axis": 0}}}
    comps = {"c": np.arange(n, dtype=np.uint8), "t": np.asarray(values, np.float32)}
    for role, (op, vals) in params.items():
        vals = np.asarray(vals)
        desc[role] = {"blocks": {"type": "grid", "size": [1 if vals.size == n else None]}, "tensor": role}
        if op:
            desc[role]["op"] = op
        comps[role] = vals
    return desc, comps


def test_no_fma_contraction():
    """x*s + b with x = s = 1+2^-12, b = -(1+2^-11): 0 with two roundings, 2^-24 with an FMA."""
    x = np.float32(1 + 2**-12)
    desc, comps = _table_desc([x] * 16, scale=("multiply", np.float32([x])), bias=("add", np.float32([-(1 + 2**-11)])))
    got, _ = jax_decode(desc, comps)
    assert (got == 0).all() and not np.signbit(got).any()
    check(desc, comps)
    # plain binary32 jax.numpy (exact=False) is what XLA:CPU contracts; record, don't require
    fast, _ = jax_decode(desc, comps, exact=False)
    assert set(np.unique(fast).tolist()) <= {0.0, 2.0**-24}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_subnormals_kept(dtype):
    tiny = [2.0**-126, 2.0**-127, -(2.0**-140), 2.0**-149, 3 * 2.0**-149, 1.0, 2.0**-20, 2.0**-24]
    cases = [
        _table_desc(tiny, dtype, scale=("multiply", np.float32([0.5]))),  # normal -> subnormal
        _table_desc(tiny, dtype, scale=("divide", np.float32([3.0]))),
        _table_desc(tiny, dtype, scale=("multiply", np.float32([2.0**100]))),  # subnormal in -> normal
        _table_desc(tiny, dtype, zero=(None, np.float32([2.0**-127])), bias=("add", np.float32([2.0**-149]))),
        _table_desc(tiny, dtype, scale=("multiply", np.float32([2.0**-130]).astype(ml_dtypes.bfloat16))),
    ]
    for desc, comps in cases:
        check(desc, comps)


def test_true_division_by_a_gathered_divisor():
    """XLA rewrites a / gather(b) as a * (1/b); SPEC.md §10.2 wants one rounded division."""
    rng = np.random.default_rng(1)
    v = rng.uniform(0.5, 8, 4096).astype(np.float32)
    x = np.float32(3)
    bad = v[(x * (np.float32(1) / v)).astype(np.float32) != x / v]
    assert bad.size  # such divisors exist
    n = 16
    for s in bad[:4]:
        desc = {"shape": [n], "dtype": "float32",
                "codes": {"tensor": "c", "element": {"type": "int", "bits": 8, "signedness": "unsigned"},
                          "packing": {"container": 8, "bit_order": "lsb_first", "axis": 0}},
                "scale": {"blocks": {"type": "grid", "size": [None], "index": {"axis": 0, "tensor": "g", "count": 1}},
                          "op": "divide", "tensor": "s"}}
        comps = {"c": np.full(n, 3, np.uint8), "s": np.float32([s]), "g": np.zeros(n, np.int32)}
        check(desc, comps)
        desc["scale"]["blocks"] = {"type": "grid", "size": [None]}
        del comps["g"]
        check(desc, comps)


def test_large_integer_parameters_round_to_nearest_even():
    vals = np.array([2**24 + 1, 2**25 + 3, 2**31 - 1, 16777219], np.uint32)
    for dt in (np.uint32, np.int32):
        desc, comps = _table_desc([1.0] * 4, scale=("multiply", vals.astype(dt)))
        check(desc, comps)


# -- errors ------------------------------------------------------------------------------------
def test_code_past_a_short_codebook_is_refused():
    desc, comps = _table_desc([1.0, 2.0])
    comps["c"] = np.array([0, 1, 2], np.uint8)
    desc["shape"] = [3]
    with pytest.raises(QFormatError) as e:
        dequantize(qformat.QTensor(desc, comps))
    assert e.value.code == "CODE_OUT_OF_RANGE"
    _, ok = jax_decode(desc, comps)
    assert not ok


def test_group_index_out_of_range_is_refused():
    desc, comps = _table_desc([1.0] * 4)
    desc["scale"] = {"blocks": {"type": "grid", "size": [None], "index": {"axis": 0, "tensor": "g", "count": 2}}, "op": "multiply", "tensor": "s"}
    comps.update(s=np.float32([1, 2]), g=np.array([0, 1, 2, 0], np.int64))
    with pytest.raises(QFormatError) as e:
        dequantize(qformat.QTensor(desc, comps))
    assert e.value.code == "GROUP_INDEX_RANGE"


# -- the binary32 path of the exact decoder: chosen only where it gives the same bits ---------------
def _chosen(desc, comps):
    from qformat.descriptor import parse_descriptor
    from qformat_jax._decode import f32_path_chosen

    q = QArray.from_qtensor(qformat.QTensor(desc, comps))
    return f32_path_chosen(parse_descriptor("t", desc), q.components)


def _int4(rows=6, cols=64, zero=None, scale=None, bias=None, dtype="float32", seed=0):
    rng = np.random.default_rng(seed)
    desc = {"shape": [rows, cols], "dtype": dtype,
            "codes": {"tensor": "c", "element": {"type": "int", "bits": 4, "signedness": "twos_complement" if zero is None else "unsigned"},
                      "packing": {"container": 8, "bit_order": "lsb_first", "axis": 1}}}
    comps = {"c": rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)}
    for role, spec in (("zero", zero), ("scale", scale), ("bias", bias)):
        if spec is None:
            continue
        op, vals = spec
        desc[role] = {"blocks": {"type": "grid", "size": [1, 32]}, "tensor": role}
        if op:
            desc[role]["op"] = op
        comps[role] = np.broadcast_to(np.asarray(vals), (rows, cols // 32)).copy()
    return desc, comps


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("desc_comps", [
    _int4(scale=("multiply", np.float16(0.0123))),                                           # sym int4, fp16 scale
    _int4(zero=(None, np.uint8(8)), scale=("multiply", np.float32(3.1e-3))),                 # asym
    _int4(scale=("multiply", np.float32(2.0**-126))),                                        # products down to 2^-126: still normal
    _int4(zero=(None, np.float32(0.75)), bias=("add", np.float32(-1.5))),                    # subtract then add: no multiply to contract
], ids=["sym", "asym", "smallest-normal-products", "zero-bias"])
def test_f32_path_chosen_and_exact(desc_comps, dtype):
    desc, comps = desc_comps
    desc = dict(desc, dtype=dtype)
    assert _chosen(desc, comps)
    check(desc, comps)


@pytest.mark.parametrize("desc_comps,why", [
    (_int4(scale=("multiply", np.float32(1.1))), None),
    (_int4(scale=("multiply", np.float32(1.1)), bias=("add", np.float32(0.25))), "a multiply followed by an add: FMA"),
    (_int4(scale=("divide", np.float32(3.0))), "division: reciprocal multiplication"),
    (_int4(scale=("multiply", np.float32(2.0**-127))), "a subnormal parameter: DAZ"),
    (_int4(scale=("multiply", np.float32(2.0**-125))), None),
    (_int4(zero=(None, np.float32(2.0**-110)), scale=("multiply", np.float32(1.0))), "x - z can be below 2^-126: FTZ"),
], ids=["control", "fma", "divide", "subnormal-scale", "control-2", "subnormal-difference"])
def test_f32_path_refused_where_it_could_differ(desc_comps, why):
    desc, comps = desc_comps
    assert _chosen(desc, comps) == (why is None), why
    check(desc, comps)


def test_f32_path_refused_when_products_underflow():
    """e2m1 (smallest non-zero 0.5) times 2^-126: 2^-127 is subnormal, FTZ would flush it."""
    desc = {"shape": [4, 32], "dtype": "float32",
            "codes": {"tensor": "c", "element": {"type": "float", "format": "e2m1fn"},
                      "packing": {"container": 8, "bit_order": "lsb_first", "axis": 1}},
            "scale": {"blocks": {"type": "grid", "size": [1, 32]}, "op": "multiply", "tensor": "s"}}
    comps = {"c": np.full((4, 16), 0x11, np.uint8), "s": np.full((4, 1), 2.0**-126, np.float32)}
    assert not _chosen(desc, comps)
    got, _ = jax_decode(desc, comps)
    assert (got.view(np.uint32) == np.float32(2.0**-127).view(np.uint32)).all()  # 0.5 * 2^-126, kept
    check(desc, comps)
    comps["s"][:] = 2.0**-125  # 0.5 * 2^-125 = 2^-126: normal, so binary32 is safe
    assert _chosen(desc, comps)
    check(desc, comps)


def test_f32_path_on_plain_binary32_xla_really_flushes():
    """The hazard the run-time check guards against is real on this backend: plain binary32
    (exact=False) flushes 0.5 * 2^-126 to zero, the exact decoder does not."""
    desc = {"shape": [32], "dtype": "float32",
            "codes": {"tensor": "c", "element": {"type": "float", "format": "e2m1fn"},
                      "packing": {"container": 8, "bit_order": "lsb_first", "axis": 0}},
            "scale": {"blocks": {"type": "grid", "size": [None]}, "op": "multiply", "tensor": "s"}}
    comps = {"c": np.full(16, 0x11, np.uint8), "s": np.float32([2.0**-126])}
    exact, _ = jax_decode(desc, comps)
    plain, _ = jax_decode(desc, comps, exact=False)
    assert (exact == np.float32(2.0**-127)).all()
    if jax.default_backend() == "cpu":
        assert (plain == 0).all()  # FTZ: why subnormal results must take the binary64 path
