"""The native paths a GGUF export and ``qformat quantize --preset`` take (issue 42 item 6) give the
bits their NumPy references give:

- :func:`qformat.packing.unpack_rows` reads a least-significant-bit-first stream (and the slot
  packings that are one) with ``_ggml.unpack``: the codes :func:`unpack_rows_numpy` gives, for
  every width, container, straddling choice and row length, rows of any leading shape and
  strided words; packings it does not take (``msb_first``, slot orders, planes, spare bits) go
  to NumPy and still match;
- ``_ggml.insert`` without a code table (the stored codes are the block's, Q5_0 / Q8_0 of scheme
  ``gguf``) and with one (Q4_0's signed forms) writes what :func:`_insert_numpy` writes;
- scheme ``gguf``'s row ranges cover every row once, in order, each within the chunk size, as
  many as a multiple of the threads; and the blocks do not depend on the split.
"""

from __future__ import annotations

import numpy as np
import pytest

import qformat
from qformat import kernels
from qformat.export.gguf import BY_NAME, _insert, _insert_numpy
from qformat.packing import Packing, pack_rows, unpack_rows, unpack_rows_numpy
from qformat.schemes import _common
from qformat.schemes import gguf as scheme_gguf

native = pytest.mark.skipif(not kernels.ggml_available() or not hasattr(kernels._ggml, "unpack"),
                            reason="the native GGUF extension is not built")


def _packings() -> list[Packing]:
    out = []
    for container in (8, 16, 32):
        for straddle in (True, False):
            out.append(Packing(container, "lsb_first", 1, straddle=straddle))
            out.append(Packing(container, "msb_first", 1, straddle=straddle))
    out.append(Packing(8, "lsb_first", 1, slot_order=(1, 0)))  # 4-bit slots swapped: not a stream
    out.append(Packing(8, "lsb_first", 1, planes_span=32))
    return out


@native
@pytest.mark.parametrize("bits", range(1, 9))
def test_unpack_rows_native_is_the_numpy_one(bits: int) -> None:
    rng = np.random.default_rng(bits)
    took_native = 0
    for p in _packings():
        if p.problems(bits):
            continue
        for length in (1, 7, 31, 32, 33, 576, 1001):
            codes = rng.integers(0, 1 << bits, (2, 3, length), dtype=np.uint8)
            words = pack_rows(codes, bits, p)
            got = unpack_rows(words, bits, p, length)
            want = unpack_rows_numpy(words, bits, p, length)
            assert got.dtype == want.dtype == np.uint8 and got.shape == want.shape == codes.shape
            assert (got == want).all() and (got == codes).all(), (bits, p, length)
            strided = np.repeat(words, 2, axis=1)[:, ::2]  # a non-contiguous view of the same words
            assert (unpack_rows(strided, bits, p, length) == want).all()
            took_native += (p.bit_order == "lsb_first" and (not p.uses_slots(bits) or (p.container == 8 and 8 % bits == 0
                            and p.slot_order is None and p.planes_span is None)))
    assert took_native  # the native path ran for this width


@native
def test_unpack_rows_native_reads_only_the_codes() -> None:
    """Bytes after a row's codes (the last container's spare bits, alignment words) are ignored."""
    rng = np.random.default_rng(7)
    p = Packing(8, "lsb_first", 1)
    for bits in (3, 5, 6, 7):
        for length in (5, 33, 100):
            words = rng.integers(0, 256, (4, p.words_per_row(length, bits) + 3), dtype=np.uint8)
            assert (unpack_rows(words, bits, p, length) == unpack_rows_numpy(words, bits, p, length)).all(), (bits, length)


@native
def test_insert_with_and_without_a_table_is_numpy() -> None:
    rng = np.random.default_rng(11)
    for name in ("Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q6_K"):
        t = BY_NAME[name]
        f = t.codes
        codes = rng.integers(0, 1 << f.bits, (257, f.parts[0][0].size), dtype=np.uint8)
        lut = rng.permutation(256).astype(np.uint8) & np.uint8((1 << f.bits) - 1)
        for table in (None, lut):
            a, b = np.zeros((257, t.size), np.uint8), np.zeros((257, t.size), np.uint8)
            _insert(a, f, codes, table)
            _insert_numpy(b, f, codes if table is None else table[codes])
            assert (a == b).all(), (name, table is None)


@pytest.mark.parametrize("n,row,threads", [(1536, 576, 2), (192, 576, 2), (576, 192, 3), (3, 5, 2), (1, 1 << 20, 2), (262144, 640, 8),
                                           (1000, 1000, 1), (0, 64, 2)])
def test_row_ranges_cover_every_row_once(n: int, row: int, threads: int) -> None:
    bounds = scheme_gguf._bounds(n, row, threads)
    if n == 0:
        assert bounds == [(0, 0)]
        return
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert all(hi > lo for lo, hi in bounds)
    rows_per = max(1, scheme_gguf.CHUNK_ELEMENTS // row)
    assert all(hi - lo <= rows_per for lo, hi in bounds)
    if threads > 1 and n * row >= scheme_gguf.SPLIT_ELEMENTS and n >= threads:
        assert len(bounds) % threads == 0
    sizes = [hi - lo for lo, hi in bounds]
    assert max(sizes) - min(sizes) <= 1


def test_blocks_do_not_depend_on_the_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.random.default_rng(5).standard_normal((300, 512)).astype(np.float32)
    outs = []
    for threads in (1, 2, 3):
        monkeypatch.setattr(_common, "THREADS", threads)
        q = qformat.quantize(x, "gguf", type="Q5_0")
        outs.append({k: np.asarray(v).tobytes() for k, v in q.components.items()})
    assert outs[0] == outs[1] == outs[2]
