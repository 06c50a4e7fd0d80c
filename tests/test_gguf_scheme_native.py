"""Scheme ``gguf``'s native paths (issue 42 item 6) give the NumPy paths' tensors.

``_ggml.extract_packed`` reads the packed code components (``codes``, a K-quant's
``scale.codes`` / ``bias.codes``) out of the blocks in one pass, in row ranges on the scheme's
thread pool; :func:`qformat.kernels.use` ("numpy") turns every native kernel off, so the
converter's producers (``_Field.extract_packed``) and the NumPy quantizers run.  Both must give
the same descriptor and the same component arrays (dtype, shape, bytes) for every legacy and
K type, over 1-D, 2-D and 3-D tensors, rows spanning one or several chunks.
"""

from __future__ import annotations

import numpy as np
import pytest

import qformat
from qformat import kernels
from qformat.schemes import gguf as scheme

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
native = pytest.mark.skipif(not kernels.ggml_available() or not hasattr(kernels._ggml, "extract_packed"),
                            reason="the native GGUF extension is not built (or predates extract_packed)")


@native
@pytest.mark.parametrize("name", TYPES)
def test_native_components_are_the_converters(name, monkeypatch):
    monkeypatch.setattr(scheme, "CHUNK_ELEMENTS", 4096)  # several row ranges per tensor
    rng = np.random.default_rng(7)
    for shape in [(512,), (3, 512), (2, 3, 256), (1, 1024), (37, 768)]:
        x = (rng.standard_normal(shape) * rng.uniform(0.01, 10)).astype(np.float32)
        got = qformat.quantize(x, "gguf", type=name)
        assert scheme._native_fields(name, shape, np.zeros((0, 1), np.uint8), {}) == {}  # nothing to read: the converter's path
        with kernels.use("numpy"):
            want = qformat.quantize(x, "gguf", type=name)
        assert got.descriptor == want.descriptor
        assert set(got.components) == set(want.components)
        for k, a in got.components.items():
            b = want.components[k]
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), (name, shape, k)


@native
def test_an_error_in_one_range_is_raised_after_every_range_ends(monkeypatch):
    monkeypatch.setattr(scheme, "CHUNK_ELEMENTS", 1024)
    x = np.ones((64, 256), np.float32)
    x[40, 3] = 2.0**70  # beyond MAX_MAGNITUDE: ENCODE_INPUT_INVALID from the range holding row 40
    with pytest.raises(qformat.QFormatError) as e:
        qformat.quantize(x, "gguf", type="Q8_0")
    assert e.value.code == "ENCODE_INPUT_INVALID"
    assert qformat.quantize(np.ones((64, 256), np.float32), "gguf", type="Q8_0").descriptor  # the pool still works
