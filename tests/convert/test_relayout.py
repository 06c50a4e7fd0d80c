"""Moving whole rows of packed tensors and renaming what a converter described (issue 22 item 1).

:func:`qformat.slicing.row_components` says which components follow the logical rows;
reordering those (``qformat.convert.relayout``) must give, bit for bit, the decoded tensor with
its rows reordered, for every row-separable scheme, and refuse the others by name.  On GGUF
sources (every ggml type the converter reads) a renamed, row-permuted conversion decodes to
gguf-py's values in the new row order.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

import qformat
from qformat.convert import describe
from qformat.convert.relayout import Move, relayout, reorder_rows
from qformat.convert.writer import write
from qformat.descriptor import parse_descriptor
from qformat.errors import QFormatError
from qformat.slicing import row_components

from .test_gguf import K_SCALES, write_gguf

X = np.random.default_rng(0).standard_normal((48, 256)).astype(np.float32)
SEPARABLE = [
    ("int", dict(bits=4, group_size=32)), ("int", dict(bits=8, group_size=None)),
    ("int", dict(bits=3, group_size=64, symmetric=False)), ("nf4", {}), ("fp8_e4m3", dict(granularity="tensor")),
    ("fp8_e5m2", dict(granularity="channel")), ("mxfp4", {}), ("mxfp6_e2m3", {}), ("nvfp4", {}),
    ("codebook", dict(values=[-1.0, -0.25, 0.0, 0.5, 1.5])),
]
NOT_SEPARABLE = [
    (("nf4", dict(double_quant=True)), "flat blocks"),
    (("fp8_e4m3", dict(granularity="block", block_size=[16, 16])), "span 16 rows"),
]


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and bool((a.view(np.uint8) == b.view(np.uint8)).all())


@pytest.mark.parametrize("scheme,params", SEPARABLE, ids=lambda v: str(v))
def test_reordering_row_components_reorders_the_decoded_rows(scheme, params):
    q = qformat.quantize(X, scheme, **params)
    follows = row_components(parse_descriptor("w", q.descriptor))
    assert follows[q.descriptor["codes"]["tensor"]] is True
    order = np.random.default_rng(1).permutation(X.shape[0])
    comps = {n: (reorder_rows(a, order) if follows[n] else a) for n, a in q.components.items()}
    moved = qformat.QTensor(q.descriptor, comps)
    assert _same_bits(moved.dequantize(), q.dequantize()[order])


@pytest.mark.parametrize("case,why", NOT_SEPARABLE, ids=lambda v: str(v))
def test_rows_that_share_parameters_are_refused(case, why):
    scheme, params = case
    q = qformat.quantize(X, scheme, **params)
    with pytest.raises(QFormatError) as e:
        row_components(parse_descriptor("w", q.descriptor))
    assert e.value.code == "SLICE_INVALID" and why in e.value.message


def test_one_dimensional_tensor_has_no_rows():
    q = qformat.quantize(X.reshape(-1), "int", bits=8, group_size=32)
    with pytest.raises(QFormatError, match="no rows"):
        row_components(parse_descriptor("w", q.descriptor))


def _gguf_tensor(qt: T, rng: np.random.Generator) -> np.ndarray:
    if qt in K_SCALES:
        block, size = gguf.GGML_QUANT_SIZES[qt]
        raw = rng.integers(0, 256, (8, 512 // block * size), dtype=np.uint8)
        blocks = raw.reshape(-1, size)
        for off in K_SCALES[qt]:
            blocks[:, off:off + 2] = rng.uniform(0.01, 1, (blocks.shape[0], 1)).astype(np.float16).view(np.uint8)
        return raw
    return quantize(rng.standard_normal((8, 512)).astype(np.float32), qt)


@pytest.mark.parametrize("qt", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4], ids=lambda t: t.name)
def test_gguf_tensor_renamed_and_permuted_decodes_to_gguf_py_rows(tmp_path: Path, qt):
    rng = np.random.default_rng(int(qt))
    raw = _gguf_tensor(qt, rng)
    plain = rng.standard_normal(8).astype(np.float32)
    src = write_gguf(tmp_path / "m.gguf", [("blk.0.attn_q.weight", raw, qt), ("blk.0.attn_norm.weight", plain, None), ("extra", plain, None)])
    ck, _, described = describe(src)
    order = rng.permutation(8)
    moves = {"blk.0.attn_q.weight": Move("model.q.weight", order),
             "blk.0.attn_norm.weight": Move("model.norm.weight", None, lambda a: a - np.float32(1))}
    out = relayout(described, moves)
    write(ck, out, str(tmp_path / "out.safetensors"))
    got = qformat.load_file(tmp_path / "out.safetensors")
    assert sorted(got) == ["model.norm.weight", "model.q.weight"]  # "extra" had no move: left out
    want = np.asarray(dequantize(raw, qt), np.float32).reshape(8, 512)[order]
    assert _same_bits(got["model.q.weight"], want)
    assert _same_bits(got["model.norm.weight"], plain - np.float32(1))


def test_relayout_refuses_value_changes_of_quantized_tensors_and_name_clashes(tmp_path: Path):
    raw = quantize(np.ones((8, 32), np.float32), T.Q8_0)
    src = write_gguf(tmp_path / "m.gguf", [("a", raw, T.Q8_0), ("b", np.ones(4, np.float32), None)])
    _, _, described = describe(src)
    with pytest.raises(QFormatError, match="plain tensor"):
        relayout(described, {"a": Move("a", None, lambda x: x)})
    with pytest.raises(QFormatError, match="would both be named"):
        relayout(described, {"a": Move("x"), "b": Move("x")})
