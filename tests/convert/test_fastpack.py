"""The converters' byte-level fast paths give exactly the reference's bytes (issue 11, item 5).

``qformat.convert._fastpack`` replaces the generic packer and the GGUF per-element bit maps
on the conversion path; these tests compare them with the reference implementations on random
codes of every width, odd and even row lengths, and every ggml block layout.
"""

from __future__ import annotations

import numpy as np
import pytest

from qformat.convert import gguf
from qformat.convert._fastpack import canonical_copy, pack_canonical
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
