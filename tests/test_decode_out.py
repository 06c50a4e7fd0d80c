"""Issue 45 item 4: ``qformat.dequantize(qt, out=...)`` / ``QTensor.dequantize(out)`` decode into a
caller's buffer, refuse a wrong one before decoding, and give the reference's bits; the native
kernel's 6-bit mode (GGUF K-quants' sub-block scales, Q6_K's codes) and the once-per-decode
two-level parameters give the NumPy reference's bits at every level and for any region."""

from __future__ import annotations

import numpy as np
import pytest

import qformat
from qformat import kernels
from qformat.decode import decode
from qformat.descriptor import parse_descriptor
from qformat.dtypes import logical_numpy
from qformat.sources import ArraySource

LEVELS = [lv for lv in kernels.LEVELS if kernels._native is not None and kernels.LEVELS.index(lv) <= kernels.LEVELS.index(kernels._native.cpu_level())]


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def _cases() -> list[tuple[str, qformat.QTensor]]:
    rng = np.random.default_rng(45)
    w = rng.standard_normal((48, 512)).astype(np.float32)
    out = []
    for name, scheme, kw in [("int4 g32", "int", {"bits": 4, "group_size": 32}), ("int8", "int", {"bits": 8, "group_size": None}),
                             ("nf4", "nf4", {}), ("mxfp4", "mxfp4", {}), ("fp8", "fp8_e4m3", {}),
                             ("Q4_K", "gguf", {"type": "Q4_K"}), ("Q6_K", "gguf", {"type": "Q6_K"}), ("Q5_K", "gguf", {"type": "Q5_K"}),
                             ("Q3_K", "gguf", {"type": "Q3_K"})]:
        out.append((name, qformat.quantize(w, scheme, **kw)))
    return out


CASES = _cases()


@pytest.mark.parametrize("name,qt", CASES, ids=[c[0] for c in CASES])
def test_dequantize_out_is_the_reference(name: str, qt: qformat.QTensor) -> None:
    with kernels.use("numpy"):
        ref = qt.dequantize()
    buf = np.full(qt.shape, np.nan, qt.dtype)
    got = qformat.dequantize(qt, out=buf)
    assert got is buf and _bits(buf) == _bits(ref)
    buf2 = np.empty(qt.shape, qt.dtype)
    assert qt.dequantize(buf2, threads=2) is buf2 and _bits(buf2) == _bits(ref)
    assert _bits(qformat.dequantize(qt)) == _bits(ref)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_dequantize_out_other_dtypes(dtype: str) -> None:
    d = dict(CASES[0][1].descriptor, dtype=dtype)
    qt = qformat.QTensor(d, CASES[0][1].components)
    with kernels.use("numpy"):
        ref = qt.dequantize()
    buf = np.empty(qt.shape, logical_numpy(dtype))
    assert _bits(qformat.dequantize(qt, out=buf)) == _bits(ref)


def test_dequantize_out_refused() -> None:
    qt = CASES[0][1]
    shape = qt.shape
    from qformat.errors import QFormatError

    def refused(match: str, out: object) -> None:
        with pytest.raises(QFormatError, match=match) as e:
            qformat.dequantize(qt, out=out)
        assert e.value.code == "OUT_INVALID" and e.value.field == "out"

    refused("NumPy array", [0.0] * 4)
    refused("dtype float64", np.empty(shape, np.float64))
    refused(r"shape \(48, 511\)", np.empty((48, 511), np.float32))
    refused("not C-contiguous", np.empty(shape[::-1], np.float32).T)
    ro = np.empty(shape, np.float32)
    ro.flags.writeable = False
    refused("read-only", ro)
    with pytest.raises(TypeError, match="QTensor"):
        qformat.dequantize(np.zeros(3))
    # a refused buffer is left as it was
    buf = np.zeros((48, 511), np.float32)
    with pytest.raises(ValueError):
        qt.dequantize(buf)
    assert not buf.any()


def _six_desc(rows: int, cols: int, rng: np.random.Generator, dtype: str = "float32") -> tuple:
    """A plain 6-bit stream (four codes in three bytes, lsb first) with fp16 scales per 16."""
    wpr = cols * 6 // 8
    d = {"shape": [rows, cols], "dtype": dtype,
         "codes": {"tensor": "c", "element": {"type": "int", "bits": 6, "signedness": "twos_complement"},
                   "packing": {"container": 8, "bit_order": "lsb_first", "axis": 1}},
         "scale": {"blocks": {"type": "grid", "size": [1, 16]}, "op": "multiply", "tensor": "s"}}
    comps = {"c": rng.integers(0, 256, (rows, wpr), dtype=np.uint8),
             "s": (rng.random((rows, cols // 16), np.float32) + 0.5).astype(np.float16)}
    return parse_descriptor("w", d), ArraySource(comps)


@pytest.mark.skipif(not LEVELS, reason="the native extension is not built")
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_six_bit_kernel_mode(level: str, dtype: str) -> None:
    rng = np.random.default_rng(6)
    desc, src = _six_desc(37, 1088, rng, dtype)
    regions = [None, ((0, 37), (0, 1088)), ((3, 29), (32, 1056)), ((5, 6), (4, 1084)), ((1, 9), (16, 48)), ((0, 2), (0, 4))]
    for reg in regions:
        with kernels.use("numpy"):
            ref = decode(desc, src, reg)
        with kernels.use(level):
            got = decode(desc, src, reg, threads=2)
        assert _bits(got) == _bits(ref), reg
    # a region whose columns are not whole groups of four takes the unpacking path, same bits
    with kernels.use("numpy"):
        ref = decode(desc, src, ((0, 4), (2, 1086)))
    with kernels.use(level):
        assert _bits(decode(desc, src, ((0, 4), (2, 1086)))) == _bits(ref)


@pytest.mark.skipif(not LEVELS, reason="the native extension is not built")
def test_six_bit_mode_checks_sizes() -> None:
    bt = np.zeros(256, np.float32)
    out = np.empty((2, 8), np.float32)
    with pytest.raises(ValueError, match="codes buffer too short"):
        kernels.fused(np.zeros(11, np.uint8), 6, 2, 8, 1, bt, [], out, 0, 0, False, True)
    with pytest.raises(ValueError, match="6-bit"):
        kernels.fused(np.zeros(12, np.uint8), 6, 2, 6, 1, bt, [], np.empty((2, 6), np.float32), 0, 0, False, True)
    with pytest.raises(ValueError, match="6-bit"):
        kernels.fused(np.zeros(12, np.uint8), 6, 2, 8, 2, np.zeros(512, np.float32), [], out, 0, 0, False, True)
    kernels.fused(np.zeros(12, np.uint8), 6, 2, 8, 1, bt, [], out, 0, 0, False, True)
    assert not out.any()


@pytest.mark.skipif(not LEVELS, reason="the native extension is not built")
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q5_K", "Q3_K"])
def test_k_quants_native_regions(level: str, name: str) -> None:
    qt = dict(CASES)[name]
    desc, src = parse_descriptor("w", qt.descriptor), ArraySource(qt.components)
    for reg in [None, ((3, 40), (32, 480)), ((0, 48), (4, 508)), ((5, 6), (0, 512))]:
        with kernels.use("numpy"):
            ref = decode(desc, src, reg)
        with kernels.use(level):
            assert _bits(decode(desc, src, reg, threads=2)) == _bits(ref), reg
