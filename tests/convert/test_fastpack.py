"""The converters' byte-level fast paths give exactly the reference's bytes (issue 11, item 5).

``qformat.convert._fastpack`` replaces the generic packer and the GGUF per-element bit maps
on the conversion path; these tests compare them with the reference implementations on random
codes of every width, odd and even row lengths, and every ggml block layout.
"""

from __future__ import annotations

import numpy as np
import pytest

from qformat.convert import gguf
from qformat.convert import _fastpack
from qformat.convert._fastpack import canonical_copy, nibble_planes, pack_canonical
from qformat.packing import Packing, unpack_rows
from qformat.schemes._common import pack, packing


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("shape", [(3, 1), (2, 7), (5, 32), (4, 33), (1, 255), (2, 3, 17), (6,), (0, 5), (3, 0)])
def test_pack_canonical_is_pack(bits, shape):
    rng = np.random.default_rng(bits * 100 + len(shape))
    codes = rng.integers(0, 1 << bits, shape, dtype=np.uint8)
    got, want = pack_canonical(codes, bits), pack(codes, bits)
    assert got.dtype == want.dtype == np.uint8
    assert got.shape == want.shape
    assert np.array_equal(got, want)


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("length", [1, 5, 8, 13, 64, 65])
def test_canonical_copy_clears_padding_like_unpack_pack(bits, length):
    rng = np.random.default_rng(bits + length)
    p = Packing.from_dict(packing(2))
    stored = rng.integers(0, 256, (3, p.words_per_row(length, bits)), dtype=np.uint8)  # padding bits set
    want = pack(unpack_rows(stored, bits, p, length), bits)
    assert np.array_equal(canonical_copy(stored, length, bits), want)


@pytest.mark.parametrize("type_id", sorted(gguf.TYPES))
def test_gguf_fields_extract_like_the_reference(type_id):
    spec = gguf.TYPES[type_id]
    rng = np.random.default_rng(type_id)
    blocks = rng.integers(0, 256, (37, spec.size), dtype=np.uint8)
    for field in (spec.codes, spec.sc, spec.mins):
        if field is not None:
            assert np.array_equal(field.extract(blocks), field.extract_reference(blocks)), field
    # non-contiguous rows (a strided view of the memory map) as the converter may pass
    view = np.repeat(blocks, 2, axis=0)[::2]
    assert np.array_equal(spec.codes.extract(view), spec.codes.extract_reference(blocks))


@pytest.mark.parametrize("type_id", sorted(gguf.TYPES))
def test_gguf_packed_codes_equal_packing_the_reference(type_id):
    """extract_packed (the nibble-plane path for Q4_0 / Q4_1 / Q4_K, the general one for the
    rest) equals the canonical packing of the per-element reference, for whole-row shapes
    with one and several blocks per row, in one chunk and in many, on one thread and two."""
    spec = gguf.TYPES[type_id]
    rng = np.random.default_rng(1000 + type_id)
    count = spec.codes.parts[0][0].size
    planes = nibble_planes(spec.codes._runs, count, spec.size)
    assert (planes is not None) == (spec.name in ("Q4_0", "Q4_1", "Q4_K")), spec.name
    for rows, per_row in ((7, 1), (5, 3), (64, 2)):
        blocks = rng.integers(0, 256, (rows * per_row, spec.size), dtype=np.uint8)
        shape = (rows, per_row * count)
        want = pack(spec.codes.extract_reference(blocks).reshape(shape), spec.codes.bits)
        for chunk, threads in ((1 << 20, 1), (count, 2)):
            old = _fastpack.CHUNK_CODES
            _fastpack.CHUNK_CODES = chunk
            try:
                got = _fastpack.extract_packed(blocks, count, spec.codes._runs, shape, spec.codes.bits, threads)
            finally:
                _fastpack.CHUNK_CODES = old
            assert np.array_equal(got, want), (spec.name, rows, per_row, chunk, threads)
