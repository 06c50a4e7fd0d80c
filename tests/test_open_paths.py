"""``qformat.load_file`` / ``safe_open`` take a file or a sharded checkpoint's index, and say
what any other path is and which command reads it."""

from __future__ import annotations

import json

import numpy as np
import pytest

import qformat


def _sharded(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 64)).astype(np.float32)
    qformat.save_file({"a": qformat.quantize(x, "int", bits=4, group_size=32), "p": x[:1]}, tmp_path / "m-1.safetensors")
    qformat.save_file({"b": qformat.quantize(x, "nf4")}, tmp_path / "m-2.safetensors")
    wm = {}
    for f in ("m-1.safetensors", "m-2.safetensors"):
        with qformat.safe_open(tmp_path / f) as h:
            wm.update({n: f for n in h.header.entries})
    idx = tmp_path / "model.safetensors.index.json"
    idx.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": wm}))
    want = qformat.load_file(tmp_path / "m-1.safetensors") | qformat.load_file(tmp_path / "m-2.safetensors")
    return idx, want


def test_load_file_and_safe_open_read_an_index(tmp_path):
    idx, want = _sharded(tmp_path)
    got = qformat.load_file(idx)
    assert sorted(got) == sorted(want) == ["a", "b", "p"]
    for k in want:
        assert np.array_equal(got[k].view(np.uint32), want[k].view(np.uint32))
    with qformat.safe_open(idx) as f:
        assert f.keys() == ["a", "b", "p"]
        assert f.is_quantized("b") and not f.is_quantized("p")
        assert f.descriptor("a")["codes"]["element"]["bits"] == 4
        assert np.array_equal(f.get_slice("b")[3:5], want["b"][3:5])
        assert f.get_qtensor_slice("a", (slice(0, 8), slice(0, 32))).shape == (8, 32)
        with pytest.raises(qformat.QFormatError) as e:
            f.get_tensor("nope")
        assert e.value.code == "TENSOR_NOT_FOUND"
    assert [n for n, _ in qformat.iter_tensors(idx)] == ["a", "b", "p"]


def test_an_index_that_disagrees_with_a_shard_is_refused(tmp_path):
    idx, _ = _sharded(tmp_path)
    obj = json.loads(idx.read_text())
    obj["weight_map"]["ghost"] = "m-1.safetensors"
    idx.write_text(json.dumps(obj))
    for fn in (qformat.load_file, qformat.safe_open):
        with pytest.raises(qformat.QFormatError) as e:
            fn(idx)
        assert e.value.code == "INDEX_MISMATCH"


@pytest.mark.parametrize("kind", ["folder", "folder-with-index", "gguf", "config-json", "missing"])
def test_other_paths_say_what_they_are(tmp_path, kind):
    if kind == "folder":
        path, words = tmp_path, ["is a folder", "qformat convert"]
    elif kind == "folder-with-index":
        _sharded(tmp_path)
        path, words = tmp_path, ["is a folder", "model.safetensors.index.json"]
    elif kind == "gguf":
        path = tmp_path / "m.gguf"
        path.write_bytes(b"GGUF" + b"\0" * 60)
        words = ["GGUF", "qformat convert"]
    elif kind == "config-json":
        path = tmp_path / "config.json"
        path.write_text('{"model_type": "bert"}')
        words = ["not a sharded-checkpoint index", "qformat convert"]
    else:
        path, words = tmp_path / "nothing.safetensors", ["does not exist"]
    for fn in (qformat.load_file, qformat.safe_open):
        with pytest.raises(qformat.QFormatError) as e:
            fn(path)
        # a GGUF file is NOT_SAFETENSORS since SPEC.md 1.2.1 (§2.3: a required code, what the file holds)
        assert e.value.code == {"config-json": "INDEX_INVALID", "gguf": "NOT_SAFETENSORS"}.get(kind, "FILE_UNREADABLE")
        assert all(w in str(e.value) for w in words), str(e.value)


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_framework_readers_load_an_index(tmp_path, backend):
    """``load_file`` of the torch and JAX readers takes an index too, with the core's rules."""
    pytest.importorskip(backend)
    idx, want = _sharded(tmp_path)
    mod = qformat.torch if backend == "torch" else qformat.jax
    got = mod.load_file(idx)
    assert sorted(got) == sorted(want)
    for k in want:
        assert np.array_equal(np.asarray(got[k]).view(np.uint32), want[k].view(np.uint32)), k
