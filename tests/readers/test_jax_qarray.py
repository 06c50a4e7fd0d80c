"""QArray pytrees, jit, a packed forward pass, load_file and the conformance reader."""

from __future__ import annotations

import json

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import qformat  # noqa: E402
from qformat.errors import QFormatError  # noqa: E402
from qformat_jax import QArray, conformance_reader, dequantize, load_checkpoint, load_file, load_region  # noqa: E402

from ..test_decode import same_bits  # noqa: E402


@pytest.fixture(scope="module")
def mlp_file(tmp_path_factory):
    rng = np.random.default_rng(0)
    tensors = {
        "w1": qformat.quantize(rng.normal(size=(64, 96)).astype(np.float32), "int", bits=4, group_size=32),
        "b1": rng.normal(size=64).astype(np.float32),
        "w2": qformat.quantize(rng.normal(size=(16, 64)).astype(np.float32), "nf4", double_quant=True),
        "w3": qformat.quantize(rng.normal(size=(16, 16)).astype(np.float32), "nvfp4", dtype="bfloat16"),
        "steps": np.arange(3, dtype=np.int64),
    }
    path = tmp_path_factory.mktemp("mlp") / "mlp.safetensors"
    qformat.save_file(tensors, path)
    return path


def test_load_file_matches_numpy(mlp_file):
    ref = qformat.load_file(mlp_file)
    got = load_file(mlp_file)
    assert set(got) == set(ref)
    for name, want in ref.items():
        g = got[name]
        if want.dtype == np.int64:  # 64-bit plain tensors stay NumPy without jax_enable_x64
            assert isinstance(g, np.ndarray) and np.array_equal(g, want)
            continue
        assert isinstance(g, jax.Array) and g.dtype == want.dtype
        assert same_bits(np.asarray(g), want), name


def test_packed_forward_pass(mlp_file):
    """A tiny MLP whose weights stay packed QArrays on the device and decode inside jit."""
    ref = qformat.load_file(mlp_file)
    params = load_file(mlp_file, packed=True)
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


def test_dequantize_components_inside_jit(mlp_file):
    ref = qformat.load_file(mlp_file)
    with qformat.safe_open(mlp_file) as f:
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


def test_load_region_cuts_a_box(mlp_file):
    ref = qformat.load_file(mlp_file)
    log: list = []
    with qformat.safe_open(mlp_file) as f:
        box = load_region(f, "w1", ((3, 17), (40, 70)), read_log=log)
    assert same_bits(np.asarray(box), ref["w1"][3:17, 40:70])
    assert log[0]["aligned"] == ((3, 17), (32, 96))


def test_conformance_reader_and_checkpoint(mlp_file, tmp_path):
    got = conformance_reader(str(mlp_file))
    ref = qformat.load_file(mlp_file)
    assert set(got) == set(ref) and all(isinstance(v, np.ndarray) for v in got.values())
    assert all(same_bits(got[n], ref[n]) for n in ("w1", "w2", "w3", "b1"))
    # a sharded checkpoint through its index
    qformat.save_file({"a": ref["b1"]}, tmp_path / "m-1.safetensors")
    qformat.save_file({"w": qformat.quantize(ref["w1"], "mxfp4")}, tmp_path / "m-2.safetensors")
    wm = {}
    for shard in ("m-1.safetensors", "m-2.safetensors"):
        with qformat.safe_open(tmp_path / shard) as f:
            wm.update({n: shard for n in f.header.entries})
    (tmp_path / "m.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    ck = load_checkpoint(tmp_path / "m.safetensors.index.json")
    want = qformat.load_checkpoint(tmp_path / "m.safetensors.index.json")
    assert set(ck) == set(want) and all(same_bits(np.asarray(ck[n]), want[n]) for n in want)
    # a refused tensor raises the core's error with its code
    wm["a"] = "m-2.safetensors"  # listed in the wrong shard
    (tmp_path / "m.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    with pytest.raises(QFormatError) as e:
        conformance_reader(str(tmp_path / "m.safetensors.index.json"))
    assert e.value.code == "INDEX_MISMATCH"
