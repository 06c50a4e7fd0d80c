"""Issue 45 item 4: a decode whose kernel reads the packed bytes in place runs in large chunks,
each one kernel call whose rows native threads share (``qformat.kernels.fused(threads=...)``);
a decode's own output is not streamed, a caller's large float32 buffer is.  Every path gives
the NumPy reference's bits, at every kernel level and thread count."""

from __future__ import annotations

import numpy as np
import pytest

import qformat
import qformat.decode as qd
from qformat import kernels
from qformat.decode import decode
from qformat.descriptor import parse_descriptor
from qformat.sources import ArraySource

native = pytest.mark.skipif(not kernels.enabled(), reason="the native kernel is not in use")
LEVELS = [lv for lv in kernels.LEVELS if kernels._native is not None and kernels.LEVELS.index(lv) <= kernels.LEVELS.index(kernels._native.cpu_level())]


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def _qt(scheme: str, rows: int, cols: int, dtype: str = "float32", **kw) -> qformat.QTensor:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)
    qt = qformat.quantize(w, scheme, **kw)
    return qt if dtype == "float32" else qformat.QTensor(dict(qt.descriptor, dtype=dtype), qt.components)


SCHEMES = [("int4 g32", "int", {"bits": 4, "group_size": 32}), ("int8", "int", {"bits": 8, "group_size": None}), ("nf4", "nf4", {}),
           ("mxfp4", "mxfp4", {}), ("fp8", "fp8_e4m3", {}), ("Q4_K", "gguf", {"type": "Q4_K"}), ("Q6_K", "gguf", {"type": "Q6_K"})]


@native
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name,scheme,kw", SCHEMES, ids=[s[0] for s in SCHEMES])
def test_native_threads_share_rows_bit_exact(name: str, scheme: str, kw: dict, level: str) -> None:  # type: ignore[type-arg]
    """600 x 2048 float32 is 4.9 MB: three blocks of 2 MiB of rows (the last one short) for the
    native threads; several chunks too when VIEW_CHUNK_ELEMENTS is small (each chunk's rows
    then split again).  Fresh output and out=, 1 to 4 threads: the reference's bits."""
    qt = _qt(scheme, 600, 2048, **kw)
    with kernels.use("numpy"):
        ref = _bits(qt.dequantize())
    with kernels.use(level):
        for threads in (1, 2, 3, 4):
            assert _bits(qformat.dequantize(qt, threads=threads)) == ref, (level, threads)
            buf = np.full(qt.shape, np.nan, np.float32)
            assert qformat.dequantize(qt, out=buf, threads=threads) is buf and _bits(buf) == ref, (level, threads)
        old = qd.VIEW_CHUNK_ELEMENTS
        qd.VIEW_CHUNK_ELEMENTS = 150 * 2048 + 7  # four chunks of 150 rows (Q4_K / Q6_K: whole 256-column blocks per row)
        try:
            for threads in (1, 2):
                assert _bits(qformat.dequantize(qt, threads=threads)) == ref, (level, threads)
        finally:
            qd.VIEW_CHUNK_ELEMENTS = old


@native
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_native_threads_half_outputs(dtype: str) -> None:
    qt = _qt("int", 1100, 2048, dtype, bits=4, group_size=32)  # 4.5 MB of 16-bit values: three blocks
    with kernels.use("numpy"):
        ref = _bits(qt.dequantize())
    for threads in (1, 2, 5):
        assert _bits(qformat.dequantize(qt, threads=threads)) == ref, threads


@native
def test_in_place_decides_the_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Packed bytes read in place: one kernel call per chunk with the decode's thread count, no
    Python pool; codes the kernel cannot read in place (3-bit, unpacked per chunk): chunks of
    NATIVE_CHUNK_ELEMENTS on the pool, one native thread each."""
    calls: list[tuple[int, int]] = []
    fused = kernels.fused

    def spy(*a):  # type: ignore[no-untyped-def]
        calls.append((a[2], a[12]))
        return fused(*a)

    monkeypatch.setattr(kernels, "fused", spy)
    qt = _qt("int", 600, 2048, bits=4, group_size=32)
    qformat.dequantize(qt, threads=3)
    assert calls == [(600, 3)] if kernels.native_threads() else all(t == 1 for _, t in calls)
    calls.clear()
    rows, cols = 1100, 1024
    rng = np.random.default_rng(3)
    d = {"shape": [rows, cols], "dtype": "float32",
         "codes": {"tensor": "c", "element": {"type": "int", "bits": 3, "signedness": "twos_complement"},
                   "packing": {"container": 8, "bit_order": "lsb_first", "axis": 1}},
         "scale": {"blocks": {"type": "grid", "size": [1, 64]}, "op": "multiply", "tensor": "s"}}
    desc = parse_descriptor("w", d)
    src = ArraySource({"c": rng.integers(0, 256, (rows, cols * 3 // 8), dtype=np.uint8),
                       "s": (rng.random((rows, cols // 64)) + 0.5).astype(np.float16)})
    with kernels.use("numpy"):
        ref = _bits(decode(desc, src, threads=1))
    assert _bits(decode(desc, src, threads=2)) == ref
    assert len(calls) >= 2 and all(t == 1 for _, t in calls)


@native
def test_stream_only_into_a_callers_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller's float32 buffer of at least STREAM_FROM_BYTES is streamed; decode()'s own
    output is not (the first touch has just cleared each page into cache)."""
    streams: list[bool] = []
    fused = kernels.fused

    def spy(*a):  # type: ignore[no-untyped-def]
        streams.append(bool(a[10]))
        return fused(*a)

    monkeypatch.setattr(kernels, "fused", spy)
    qt = _qt("int", 1056, 4096, bits=4, group_size=32)  # 17.3 MB
    assert 1056 * 4096 * 4 >= kernels.STREAM_FROM_BYTES
    qformat.dequantize(qt, threads=2)
    assert streams and not any(streams)
    streams.clear()
    qformat.dequantize(qt, out=np.empty(qt.shape, np.float32), threads=2)
    assert streams and all(streams)


@native
def test_fused_threads_argument() -> None:
    """fused(threads=k) writes the same bytes as one thread, and refuses threads < 1 before
    writing anything."""
    rng = np.random.default_rng(11)
    rows, cols = 700, 1024  # 2.9 MB of float32: two blocks
    codes = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
    bt = rng.standard_normal((256, 2)).astype(np.float32)
    scale = rng.random(rows * cols // 32).astype(np.float32)
    params = [(kernels.OPS["multiply"], kernels.MODE_BLOCK, scale, np.arange(rows, dtype=np.int64) * (cols // 32), None, 0, 32)]
    one = np.zeros(rows * cols, np.float32)
    kernels.fused(codes, cols // 2, rows, cols, 2, bt, params, one, 0)
    for t in (2, 3, 64, 1000):
        many = np.zeros(rows * cols, np.float32)
        kernels.fused(codes, cols // 2, rows, cols, 2, bt, params, many, 0, 0, False, False, t)
        assert _bits(many) == _bits(one), t
    untouched = np.zeros(rows * cols, np.float32)
    with pytest.raises(ValueError, match="threads"):
        kernels.fused(codes, cols // 2, rows, cols, 2, bt, params, untouched, 0, 0, False, False, 0)
    assert not untouched.any()


def test_dequantize_documents_out_and_threads() -> None:
    doc = qformat.dequantize.__doc__ or ""
    assert "out" in doc and "threads" in doc and "C-contiguous" in doc
    doc = decode.__doc__ or ""
    assert "``out``" in doc and "``threads``" in doc
