"""Packing: pack and unpack are exact inverses, and agree with SPEC.md's formulas bit by bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qformat.packing import Packing, pack_rows, unpack_rows

from conformance.spec_reference import unpack_row

from .strategies import packings


@settings(max_examples=400, deadline=None)
@given(packings(), st.integers(0, 70), st.integers(1, 3), st.data())
def test_pack_unpack_inverse(pk, length, rows, data):
    bits, p = pk
    codes = np.array(data.draw(st.lists(st.integers(0, (1 << bits) - 1), min_size=rows * length, max_size=rows * length)),
                     dtype=np.uint8).reshape(rows, length)
    words = pack_rows(codes, bits, p)
    assert words.dtype == p.word_dtype
    assert words.shape == (rows, p.words_per_row(length, bits))
    np.testing.assert_array_equal(unpack_rows(words, bits, p, length), codes)


@settings(max_examples=300, deadline=None)
@given(packings(), st.integers(0, 40), st.data())
def test_unpack_matches_spec_formulas(pk, length, data):
    """Random words (padding included) decode as the SPEC's per-bit formulas say."""
    bits, p = pk
    wpr = p.words_per_row(length, bits)
    words = np.array(data.draw(st.lists(st.integers(0, (1 << p.container) - 1), min_size=wpr, max_size=wpr)),
                     dtype=p.word_dtype)
    got = unpack_rows(words[None, :], bits, p, length)[0].tolist()
    want = unpack_row([int(w) for w in words], bits, p.to_dict(), length)
    assert got == want


@settings(max_examples=200, deadline=None)
@given(packings(), st.integers(1, 40), st.data())
def test_padding_detected_by_repack(pk, length, data):
    """pack(unpack(w)) == w exactly when every padding bit of w is zero."""
    bits, p = pk
    wpr = p.words_per_row(length, bits)
    codes = np.array(data.draw(st.lists(st.integers(0, (1 << bits) - 1), min_size=length, max_size=length)), np.uint8)[None]
    words = pack_rows(codes, bits, p)
    np.testing.assert_array_equal(pack_rows(unpack_rows(words, bits, p, length), bits, p), words)
    total = wpr * p.container
    used = length * bits
    if total > used:
        # Setting any bit outside the codes must be caught; find one by trial.
        flat = words.copy()
        for bit in range(total):
            w, b = divmod(bit, p.container)
            trial = flat.copy()
            trial[0, w] ^= p.word_dtype.type(1 << b)
            if (unpack_rows(trial, bits, p, length) == codes).all():
                assert not (pack_rows(unpack_rows(trial, bits, p, length), bits, p) == trial).all()
                break


def test_known_bytes():
    """Worked examples from SPEC.md and the formats they describe."""
    lsb32 = Packing(32, "lsb_first", 0)
    # compressed-tensors pack-quantized: offset binary, element 2k in the low nibble.
    q = np.array([[-8, -7, 0, 1, 2, 3, 4, 7]]) + 8
    assert int(pack_rows(q, 4, lsb32)[0, 0]) == 0xFCBA9810
    # bitsandbytes: element 0 in the high nibble = msb_first.
    assert pack_rows(np.array([[1, 2]]), 4, Packing(8, "msb_first", 0)).tolist() == [[0x12]]
    # ONNX int4: first element in the low nibble.
    assert pack_rows(np.array([[1, 2]]), 4, Packing(8, "lsb_first", 0)).tolist() == [[0x21]]
    # 3-bit stream straddling a byte: code 7 at element 2 occupies bits 6, 7, 8.
    assert pack_rows(np.array([[0, 0, 7]]), 3, Packing(8, "lsb_first", 0)).tolist() == [[0xC0, 0x01]]
    assert pack_rows(np.array([[0, 0, 7]]), 3, Packing(8, "msb_first", 0)).tolist() == [[0x03, 0x80]]
    # AWQ: slot i holds column order[i].
    awq = Packing(32, "lsb_first", 0, slot_order=(0, 2, 4, 6, 1, 3, 5, 7))
    w = int(pack_rows(np.arange(8)[None], 4, awq)[0, 0])
    assert [(w >> (4 * i)) & 15 for i in range(8)] == [0, 2, 4, 6, 1, 3, 5, 7]
    # GGUF Q4_0 split halves: byte j holds element j (low) and j + 16 (high).
    q40 = Packing(8, "lsb_first", 0, planes_span=32)
    b = pack_rows(np.arange(32)[None] % 16, 4, q40)[0]
    assert [(int(x) & 15, int(x) >> 4) for x in b[:3]] == [(0, 0), (1, 1), (2, 2)]
    e = pack_rows(np.array([[1] + [0] * 15 + [2] + [0] * 15]), 4, q40)[0]
    assert int(e[0]) == 0x21 and not e[1:].any()
    # quanto: planes over the whole axis (odd length 5: rows 0-2 low nibble, 3-4 high).
    qp = Packing(8, "lsb_first", 0, planes_span=5)
    assert pack_rows(np.array([[1, 2, 3, 4, 5]]), 4, qp).tolist() == [[0x41, 0x52, 0x03]]


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("container", [8, 16, 32])
@pytest.mark.parametrize("bit_order", ["lsb_first", "msb_first"])
def test_words_per_row(bits, container, bit_order):
    p = Packing(container, bit_order, 0)
    for length in (0, 1, 31, 32, 33, 1000):
        w = p.words_per_row(length, bits)
        assert w * container >= length * bits
        assert (w - 1) * container < length * bits or length == 0
