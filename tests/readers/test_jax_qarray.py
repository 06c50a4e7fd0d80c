"""QArray pytrees, jit, a packed forward pass, load_file and load_region (the conformance reader
and load_checkpoint: tests/test_backends.py, with every backend)."""

from __future__ import annotations

import json

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import qformat  # noqa: E402
from qformat_jax import QArray, dequantize, load_file, load_region  # noqa: E402

from ..backends import same_bits  # noqa: E402


def test_load_file_matches_numpy(mixed_file):
    """JAX arrays (64-bit plain tensors stay NumPy); the values: tests/test_backends.py too."""
    ref = qformat.load_file(mixed_file)
    got = load_file(mixed_file)
    assert set(got) == set(ref)
    for name, want in ref.items():
        g = got[name]
        if want.dtype == np.int64:  # 64-bit plain tensors stay NumPy without jax_enable_x64
            assert isinstance(g, np.ndarray) and np.array_equal(g, want)
            continue
        assert isinstance(g, jax.Array) and g.dtype == want.dtype
        assert same_bits(np.asarray(g), want), name


def test_packed_forward_pass(mixed_file):
    """A tiny MLP whose weights stay packed QArrays on the device and decode inside jit."""
    ref = qformat.load_file(mixed_file)
    params = load_file(mixed_file, packed=True)
    assert all(isinstance(params[n], QArray) for n in ("w1", "w2", "w3"))
    packed_bytes = sum(params[n].nbytes for n in ("w1", "w2", "w3"))
    dense_bytes = sum(ref[n].nbytes for n in ("w1", "w2", "w3"))
    assert packed_bytes * 3 < dense_bytes
    leaves = jax.tree_util.tree_leaves({k: v for k, v in params.items() if k != "steps"})
    assert all(isinstance(x, jax.Array) for x in leaves)

    def forward(p, x, dq):
        h = jax.nn.relu(x @ dq(p["w1"]).T + p["b1"])
        h = h @ dq(p["w2"]).T
        return h @ dq(p["w3"]).astype(jnp.float32).T

    x = jax.random.normal(jax.random.PRNGKey(0), (4, 96), jnp.float32)
    packed = {k: v for k, v in params.items() if k != "steps"}
    y = jax.jit(lambda p, x: forward(p, x, lambda q: q.dequantize()))(packed, x)
    dense = {k: jnp.asarray(ref[k]) for k in ("w1", "b1", "w2", "w3")}
    y_ref = jax.jit(lambda p, x: forward(p, x, lambda w: w))(dense, x)
    np.testing.assert_allclose(np.asarray(y), np.asarray(y_ref), rtol=1e-6, atol=1e-6)
    # the weights decoded inside jit are the reference bits
    for n in ("w1", "w2", "w3"):
        assert same_bits(np.asarray(jax.jit(lambda q: q.dequantize())(params[n])), ref[n])


def test_dequantize_components_inside_jit(mixed_file):
    ref = qformat.load_file(mixed_file)
    with qformat.safe_open(mixed_file) as f:
        qt = f.get_qtensor("w2")
    desc = qt.descriptor
    comps = {k: jnp.asarray(np.asarray(v)) for k, v in qt.components.items()}
    out = jax.jit(lambda c: dequantize(c, desc))(comps)
    assert same_bits(np.asarray(out), ref["w2"])
    assert same_bits(np.asarray(dequantize(qt)), ref["w2"])
    q = QArray.from_qtensor(qt)
    q2 = jax.tree_util.tree_map(lambda a: a, q)  # pytree round trip keeps the static descriptor
    assert q2.shape == (16, 64) and json.dumps(q2.descriptor) == json.dumps(q.descriptor)
    assert same_bits(np.asarray(q2.dequantize()), ref["w2"])


def test_load_region_cuts_a_box(mixed_file):
    ref = qformat.load_file(mixed_file)
    log: list = []
    with qformat.safe_open(mixed_file) as f:
        box = load_region(f, "w1", ((3, 17), (40, 70)), read_log=log)
    assert same_bits(np.asarray(box), ref["w1"][3:17, 40:70])
    assert log[0]["aligned"] == ((3, 17), (32, 96))
