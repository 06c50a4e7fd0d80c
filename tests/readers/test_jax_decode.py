"""JAX-specific decoding checks (the shared bit-exact suite is tests/test_backends.py).

tests/test_backends.py runs qformat.jax (one jitted computation per tensor, exact=True) against
the per-element SPEC.md transcription and the NumPy reference: hypothesis over every
descriptor feature once per logical dtype, random bit patterns in every float parameter and
table, files and load_region boxes, the targeted XLA hazards of SPEC.md section 10.2 (FMA
contraction, FTZ/DAZ, division by a reciprocal, large integer parameters), payload errors and
the conformance corpus.  Here: what plain binary32 XLA (exact=False) does on those hazards, that
QArray.check refuses a code past a short codebook, and when the exact decoder may take its
binary32 path.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import qformat  # noqa: E402
from qformat.errors import QFormatError  # noqa: E402
from qformat_jax import QArray, dequantize  # noqa: E402

from ..backends import same_bits  # noqa: E402
from ..filebuild import fma_desc, table_desc  # noqa: E402


def jax_decode(desc, comps, exact=True):
    """qformat.jax's eager decode: one jitted computation; a bad code raises the core's code."""
    return np.asarray(dequantize(qformat.QTensor(desc, comps), exact=exact))


def check(desc, comps):
    with np.errstate(all="ignore"):
        want = qformat.QTensor(desc, comps).dequantize()
    got = jax_decode(desc, comps)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert same_bits(got, want), (desc, got, want)


def test_fma_contraction_under_plain_binary32():
    """x*s + b (tests/filebuild.py fma_desc): exact gives 0 everywhere (checked there for
    every backend); plain binary32 jax.numpy (exact=False) is what XLA:CPU contracts: record,
    don't require."""
    desc, comps = fma_desc()
    got = jax_decode(desc, comps)
    assert (got == 0).all() and not np.signbit(got).any()
    fast = jax_decode(desc, comps, exact=False)
    assert set(np.unique(fast).tolist()) <= {0.0, 2.0**-24}


def test_check_refuses_a_code_past_a_short_codebook():
    desc, comps = table_desc([1.0, 2.0])
    comps["c"] = np.array([0, 1, 2], np.uint8)
    desc["shape"] = [3]
    with pytest.raises(QFormatError) as e:
        dequantize(qformat.QTensor(desc, comps))
    assert e.value.code == "CODE_OUT_OF_RANGE"
    with pytest.raises(QFormatError) as e:
        QArray.from_qtensor(qformat.QTensor(desc, comps)).check()
    assert e.value.code == "CODE_OUT_OF_RANGE"


# -- the binary32 path of the exact decoder: chosen only where it gives the same bits ---------------
def _chosen(desc, comps):
    from qformat.descriptor import parse_descriptor
    from qformat_jax.decode import f32_path_chosen

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
    got = jax_decode(desc, comps)
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
    exact = jax_decode(desc, comps)
    plain = jax_decode(desc, comps, exact=False)
    assert (exact == np.float32(2.0**-127)).all()
    if jax.default_backend() == "cpu":
        assert (plain == 0).all()  # FTZ: why subnormal results must take the binary64 path
