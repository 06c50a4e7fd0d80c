"""Encoders give the same bytes whatever the thread count or chunk size (issue 11, item 4).

Every scheme's encoder works on independent rows (groups / blocks), chunked and spread over
threads by ``qformat.schemes._common.map_chunks``; the result must not depend on either.
"""

from __future__ import annotations

import numpy as np
import pytest

import qformat.schemes
import ml_dtypes

from qformat.schemes import _common, _float_fast, int_, quantize

_PARAMS = {"codebook": {"values": [-1.0, -0.4, 0.0, 0.3, 1.0]}}
# gguf takes rows of whole blocks: its data's last axis is widened to a multiple of 256
_GGUF = [{"type": t} for t in ("Q4_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")]
_EXTRA = {"int": [{}, {"bits": 8, "group_size": None}, {"symmetric": False, "axis": 0, "group_size": 3},
                  {"scale_dtype": "float32", "dtype": "bfloat16"}]}


def _data(shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(11)
    return (rng.standard_normal(shape) * np.exp(rng.uniform(-2, 2, shape[:1] + (1,) * (len(shape) - 1)))).astype(np.float32)


@pytest.mark.parametrize("scheme", qformat.schemes.ids())
@pytest.mark.parametrize("shape", [(67, 150), (3, 5, 40)], ids=["67x150", "3x5x40"])
def test_same_bytes_for_every_thread_count_and_chunk_size(monkeypatch: pytest.MonkeyPatch, scheme: str, shape: tuple[int, ...]) -> None:
    if scheme == "gguf":
        shape = shape[:-1] + (-(-shape[-1] // 256) * 256,)
    x = _data(shape)
    for params in _GGUF if scheme == "gguf" else _EXTRA.get(scheme, [_PARAMS.get(scheme, {})]):
        monkeypatch.setattr(_common, "THREADS", 1)
        monkeypatch.setattr(_common, "CHUNK_ELEMENTS", 1 << 24)
        want = quantize(x, scheme, **params)
        for threads, chunk in [(2, 64), (2, 1000), (3, 1), (1, 97)]:
            monkeypatch.setattr(_common, "THREADS", threads)
            monkeypatch.setattr(_common, "CHUNK_ELEMENTS", chunk)
            monkeypatch.setattr(int_, "CHUNK_ELEMENTS", None)  # the encoders' own defaults: _common's
            monkeypatch.setattr(_float_fast, "CHUNK_ELEMENTS", None)
            got = quantize(x, scheme, **params)
            assert got.descriptor == want.descriptor
            assert set(got.components) == set(want.components)
            for k, a in want.components.items():
                b = got.components[k]
                assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), (scheme, params, threads, chunk, k)


@pytest.mark.parametrize("in_dtype", ["float16", "bfloat16"])
def test_int_fast_path_same_bytes_for_every_thread_count_and_chunk_size(monkeypatch: pytest.MonkeyPatch, in_dtype: str) -> None:
    """The symmetric int encoder's binary32 path on 16-bit input (decoded values rounded to the
    input's dtype), packed 4-bit and unpacked 8-bit codes."""
    x = _data((67, 160)).astype(ml_dtypes.bfloat16 if in_dtype == "bfloat16" else np.float16)
    for params in ({}, {"bits": 8, "group_size": 16}):
        monkeypatch.setattr(_common, "THREADS", 1)
        monkeypatch.setattr(int_, "CHUNK_ELEMENTS", 1 << 24)
        want = quantize(x, "int", **params)
        for threads, chunk in [(2, 64), (3, 1), (2, 999)]:
            monkeypatch.setattr(_common, "THREADS", threads)
            monkeypatch.setattr(int_, "CHUNK_ELEMENTS", chunk)
            got = quantize(x, "int", **params)
            assert got.descriptor == want.descriptor
            for k, a in want.components.items():
                assert a.tobytes() == got.components[k].tobytes(), (in_dtype, params, threads, chunk, k)


def test_map_chunks_keeps_order_and_calls_empty_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_common, "THREADS", 2)
    assert _common.map_chunks(lambda a, b: (a, b), 10, 3, chunk=7) == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]
    assert _common.map_chunks(lambda a, b: (a, b), 0, 3) == [(0, 0)]
