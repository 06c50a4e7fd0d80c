"""Every decoding backend (tests/backends.py: the NumPy reference, qformat.torch, qformat.jax)
against the reference, bit for bit (NaN by class), through each backend's public API.

* hypothesis over tests/strategies.py ``descriptors()`` (every element, packing, block, nesting
  feature), once per logical dtype: the in-memory decode equals the per-element transcription
  of SPEC.md (conformance/spec_reference.py) and qformat's NumPy decode;
* the same with random bit patterns in every float parameter and codebook table (subnormals,
  Inf, NaN, overflowing and underflowing products);
* files: save, check, load_file, random get_slice boxes, a row, a column range, the packed
  tensor decoded; a mixed file and a sharded checkpoint; the whole conformance corpus through
  the backend's conformance reader (in-process protocol);
* targeted cases: the XLA hazards of SPEC.md section 10.2 arithmetic (FMA contraction,
  subnormal flushing, division by a reciprocal, large integer parameters), chunked decoding,
  payload errors raising the core's codes.
"""

from __future__ import annotations

import importlib
import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qformat
from qformat import conformance as conf
from qformat.packing import Packing

from conformance.spec_reference import decode as spec_decode

from . import backends
from .backends import equal_values, same_bits
from .filebuild import fma_desc, pack, table_desc
from .strategies import descriptors, random_bit_descriptors

ROOT = Path(__file__).resolve().parent.parent
DTYPES = ["float32", "float16", "bfloat16"]
HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]
RANDOM_BIT_EXAMPLES = 120


@pytest.fixture(params=list(backends.BACKENDS))
def backend(request) -> backends.Backend:
    return backends.get(request.param)


def reference(desc, comps) -> np.ndarray:
    with np.errstate(all="ignore"):
        return qformat.QTensor(desc, comps).dequantize()


def check_decode(b: backends.Backend, desc, comps, spec: bool = True) -> np.ndarray:
    """The backend's in-memory decode equals the NumPy reference and (``spec``) the transcription."""
    want = reference(desc, comps)
    got = b.decode(qformat.QTensor(desc, comps))
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    assert same_bits(got, want), (b.name, desc, got, want)
    if spec:
        assert same_bits(got, spec_decode(desc, comps)), (b.name, desc)
    return got


# -- random descriptors ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_matches_spec_transcription(backend, dtype):
    @settings(max_examples=backend.examples, deadline=None, suppress_health_check=HEALTH)
    @given(descriptors(dtype=dtype))
    def run(case):
        desc, comps, _ = case
        check_decode(backend, desc, comps)

    run()


def test_decode_matches_reference_on_random_bits(backend):
    """Random bit patterns in float parameters and tables: half of them with tiny exponents."""

    @settings(max_examples=RANDOM_BIT_EXAMPLES, deadline=None, suppress_health_check=HEALTH)
    @given(random_bit_descriptors())
    def run(case):
        desc, comps, _ = case
        check_decode(backend, desc, comps)

    run()


def test_file_roundtrip_and_slices(backend, tmp_path_factory):
    @settings(max_examples=backend.file_examples, deadline=None, suppress_health_check=HEALTH)
    @given(descriptors(), st.data())
    def run(case, data):
        desc, comps, _ = case
        q = qformat.QTensor(desc, comps)
        full = q.dequantize()
        plain = np.arange(6).astype(ml_dtypes.bfloat16)
        path = tmp_path_factory.mktemp("rt") / "t.safetensors"
        backend.save_file({"t": q, "plain": plain}, path)
        report = qformat.check(path)
        # Random parameters may legitimately decode to Inf/NaN or 0 divisors (e.g. a large E8M0
        # scale rounded to float16): the checker must say so, and nothing else.
        assert {p.code for p in report.problems} <= {"PARAM_NONFINITE", "PARAM_DIVISOR_ZERO"}, [p.to_dict() for p in report.problems]
        loaded = backend.load_file(path)
        assert same_bits(loaded["t"], full)
        assert same_bits(loaded["plain"], plain)
        shape = tuple(desc["shape"])
        key = []
        for n in shape:
            lo = data.draw(st.integers(0, n))
            key.append(slice(lo, data.draw(st.integers(lo, n))))
        with backend.open(path) as f:
            assert f.keys() == ["plain", "t"]
            assert f.descriptor("t") == qformat.safe_open(path).descriptor("t")
            assert same_bits(f.slice("t", tuple(key)), full[tuple(key)])
            if shape and shape[0] > 0:
                i = data.draw(st.integers(0, shape[0] - 1))
                assert same_bits(f.slice("t", i), full[i])
            if len(shape) >= 2:
                lo = data.draw(st.integers(0, shape[1]))
                hi = data.draw(st.integers(lo, shape[1]))
                assert same_bits(f.slice("t", (slice(None), slice(lo, hi))), full[:, lo:hi])
            assert same_bits(f.qtensor("t"), full)

    run()


# -- files, checkpoints, the conformance corpus ------------------------------------------------------
def _stored_names(path: Path) -> list[str]:
    """Every tensor entry of a safetensors file, read from its header bytes."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return [k for k in json.loads(data[8 : 8 + n]) if k != "__metadata__"]


def test_load_file_and_checkpoint_match_reference(backend, mixed_file, tmp_path):
    ref = qformat.load_file(mixed_file)
    got = backend.load_file(mixed_file)
    assert set(got) == set(ref)
    for name, want in ref.items():
        assert equal_values(got[name], want), name
    got = backend.conformance_reader(str(mixed_file))
    assert set(got) == set(ref) and all(isinstance(v, np.ndarray) for v in got.values())
    assert all(same_bits(got[n], ref[n]) for n in ("w1", "w2", "w3", "b1"))
    # a sharded checkpoint through its index
    qformat.save_file({"a": ref["b1"]}, tmp_path / "m-1.safetensors")
    qformat.save_file({"w": qformat.quantize(ref["w1"], "mxfp4")}, tmp_path / "m-2.safetensors")
    wm = {n: shard for shard in ("m-1.safetensors", "m-2.safetensors") for n in _stored_names(tmp_path / shard)}
    index = tmp_path / "m.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": wm}))
    ck = backend.load_checkpoint(index)
    want = qformat.load_checkpoint(index)
    assert set(ck) == set(want) and all(same_bits(ck[n], want[n]) for n in want)
    # a refused tensor raises the core's error with its code
    wm["a"] = "m-2.safetensors"  # listed in the wrong shard
    index.write_text(json.dumps({"weight_map": wm}))
    with pytest.raises(qformat.QFormatError) as e:
        backend.conformance_reader(str(index))
    assert e.value.code == "INDEX_MISMATCH"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    committed = ROOT / "conformance" / "v1"
    if (committed / "manifest.json").is_file():
        return str(committed)
    from conformance import generate  # the corpus is not committed yet: build it (about a second)

    out = tmp_path_factory.mktemp("corpus") / "v1"
    assert generate.main(["--root", str(out)]) == 0
    return str(out)


def test_reader_passes_the_corpus(backend, corpus):
    cases = conf.select(conf.load_manifest(corpus)["cases"], [], [], list(backend.corpus_skip_features))
    lines: list[str] = []
    summary = conf.run(corpus, list(cases), lambda c: conf.run_python(backend.conformance_reader, corpus, c), lines.append, backend.name)
    results = [json.loads(x) for x in lines[:-1]]
    failed = {r["id"]: r["detail"] for r in results if r["result"] != "pass"}
    assert not failed, failed
    assert len(results) == len(cases)
    assert summary["passed"] == len(cases) > 0


# -- targeted cases: SPEC.md section 10.2 arithmetic where binary32 XLA differs ----------------------
def test_no_fma_contraction(backend):
    desc, comps = fma_desc()
    got = check_decode(backend, desc, comps)
    assert (got == 0).all() and not np.signbit(got).any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_subnormals_kept(backend, dtype):
    tiny = [2.0**-126, 2.0**-127, -(2.0**-140), 2.0**-149, 3 * 2.0**-149, 1.0, 2.0**-20, 2.0**-24]
    cases = [
        table_desc(tiny, dtype, scale=("multiply", np.float32([0.5]))),  # normal -> subnormal
        table_desc(tiny, dtype, scale=("divide", np.float32([3.0]))),
        table_desc(tiny, dtype, scale=("multiply", np.float32([2.0**100]))),  # subnormal in -> normal
        table_desc(tiny, dtype, zero=(None, np.float32([2.0**-127])), bias=("add", np.float32([2.0**-149]))),
        table_desc(tiny, dtype, scale=("multiply", np.float32([2.0**-130]).astype(ml_dtypes.bfloat16))),
    ]
    for desc, comps in cases:
        check_decode(backend, desc, comps)


def test_true_division_by_a_gathered_divisor(backend):
    """XLA rewrites a / gather(b) as a * (1/b); SPEC.md section 10.2 wants one rounded division."""
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
        check_decode(backend, desc, comps)
        desc["scale"]["blocks"] = {"type": "grid", "size": [None]}
        del comps["g"]
        check_decode(backend, desc, comps)


def test_large_integer_parameters_round_to_nearest_even(backend):
    vals = np.array([2**24 + 1, 2**25 + 3, 2**31 - 1, 16777219], np.uint32)
    for dt in (np.uint32, np.int32):
        desc, comps = table_desc([1.0] * 4, scale=("multiply", vals.astype(dt)))
        check_decode(backend, desc, comps)


# -- chunked decoding --------------------------------------------------------------------------------
def _chunk_cases():
    rng = np.random.default_rng(7)
    shape = (37, 45)
    codes = rng.integers(0, 16, size=shape).astype(np.uint8)
    p = Packing(8, "lsb_first", 1)
    desc = {"shape": list(shape), "dtype": "bfloat16",
            "codes": {"tensor": "c", "element": {"type": "codebook", "bits": 4, "table": "nf4"}, "packing": p.to_dict()},
            "scale": {"blocks": {"type": "flat", "size": 64}, "op": "multiply", "tensor": "s"}}
    comps = {"c": pack(codes, 4, p), "s": rng.random(-(-codes.size // 64)).astype(np.float32)}
    yield "nf4-flat64", qformat.QTensor(desc, comps)
    x = np.random.default_rng(3).standard_normal((37, 45)).astype(np.float32)
    yield "nf4-double-quant", qformat.quantize(x, "nf4", double_quant=True, dtype="bfloat16")
    yield "int3-g8", qformat.quantize(x, "int", bits=3, group_size=8)


def test_chunked_decode_equals_single_pass(backend, monkeypatch):
    if backend.chunk_knob is None:
        pytest.skip(f"{backend.name} decodes whole tensors (no chunk size)")
    module, attr = backend.chunk_knob
    mod = importlib.import_module(module)
    for name, q in _chunk_cases():
        whole = backend.decode(q)
        monkeypatch.setattr(mod, attr, 50)
        chunked = backend.decode(q)
        monkeypatch.undo()
        assert same_bits(chunked, whole), name
        assert same_bits(whole, q.dequantize()), name


# -- payload errors: the core's codes ----------------------------------------------------------------
def _error_cases():
    """(id, descriptor, components, code, elements before the first bad one along axis 0)."""
    p = Packing(8, "lsb_first", 0)
    el = {"type": "codebook", "bits": 5, "table": "nf4"}  # a 16-entry named table addressed by 5-bit codes
    yield ("named-table", {"shape": [4], "dtype": "float32", "codes": {"tensor": "c", "element": el, "packing": p.to_dict()}},
           {"c": pack(np.array([0, 1, 2, 20], np.uint8), 5, p)}, "CODE_OUT_OF_RANGE", 3)
    el = {"type": "codebook", "bits": 2, "table_tensor": "tab"}
    yield ("table-tensor", {"shape": [4], "dtype": "float32", "codes": {"tensor": "c", "element": el, "packing": p.to_dict()}},
           {"c": pack(np.array([0, 1, 2, 3], np.uint8), 2, p), "tab": np.array([1, 2, 3], np.float32)}, "CODE_OUT_OF_RANGE", 3)
    desc, comps = table_desc([1.0, 2.0])
    comps["c"] = np.array([0, 1, 2], np.uint8)
    desc["shape"] = [3]
    yield "short-codebook", desc, comps, "CODE_OUT_OF_RANGE", 2
    p = Packing(8, "lsb_first", 1)
    codes = np.arange(8, dtype=np.uint8).reshape(2, 4) % 4
    desc = {"shape": [2, 4], "dtype": "float32",
            "codes": {"tensor": "c", "element": {"type": "int", "bits": 2, "signedness": "unsigned"}, "packing": p.to_dict()},
            "scale": {"blocks": {"type": "grid", "size": [1, None], "index": {"axis": 1, "tensor": "g", "count": 2}},
                      "op": "multiply", "tensor": "s"}}
    yield ("group-index-2d", desc, {"c": pack(codes, 2, p), "g": np.array([0, 1, 5, 0], np.int32), "s": np.ones((2, 2), np.float32)},
           "GROUP_INDEX_RANGE", None)
    desc, comps = table_desc([1.0] * 4)
    desc["scale"] = {"blocks": {"type": "grid", "size": [None], "index": {"axis": 0, "tensor": "g", "count": 2}}, "op": "multiply", "tensor": "s"}
    comps.update(s=np.float32([1, 2]), g=np.array([0, 1, 2, 0], np.int64))
    yield "group-index-int64", desc, comps, "GROUP_INDEX_RANGE", 2


ERROR_CASES = list(_error_cases())


@pytest.mark.parametrize("case", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_payload_errors_raise_the_core_code(backend, tmp_path, case):
    _, desc, comps, code, good = case
    with pytest.raises(qformat.QFormatError) as e:
        backend.decode(qformat.QTensor(desc, comps))
    assert e.value.code == code
    path = tmp_path / "bad.safetensors"
    qformat.save_file({"t": qformat.QTensor(desc, comps)}, path)
    with pytest.raises(qformat.QFormatError) as np_err:
        qformat.load_file(path)
    with pytest.raises(qformat.QFormatError) as b_err:
        backend.load_file(path)
    assert b_err.value.code == np_err.value.code == code
    with backend.open(path) as f:
        if code == "GROUP_INDEX_RANGE" and len(desc["shape"]) == 2:  # columns with good group indices
            key, want = (slice(None), slice(0, 2)), None
        elif good is not None:  # the elements before the bad code
            key, want = (slice(0, good),), qformat.safe_open(path).get_slice("t")[:good]
        else:
            return
        if not backend.exact_box_payload:  # it decodes (and checks) a whole block-aligned box
            try:
                part = f.slice("t", key)
            except qformat.QFormatError as e:
                assert e.code == code
                return
        else:  # they still decode
            part = f.slice("t", key)
        if want is None:
            assert part.shape == (2, 2)
        else:
            assert same_bits(part, want)
