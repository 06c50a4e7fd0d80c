"""The JAX reader on a CPU device decodes with qformat's native kernel on the host (issue 23
item 5): the same bits as ``qformat.load_file`` and as the jitted jax.numpy decoder
(``decoder="jax"``), for every registered encoder scheme and the three logical dtypes; the
host path is the one that runs by default (the jitted decoder is never called), the jitted
one where asked or where the native kernel is off.  Speed: bench ``decode`` ("qformat jax
load_file, CPU"), not here.
"""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")

import numpy as np  # noqa: E402

import qformat  # noqa: E402
import qformat_jax  # noqa: E402
from qformat import kernels, schemes  # noqa: E402
from qformat_jax import _io  # noqa: E402
from tests.backends import same_bits  # noqa: E402

PARAMS = {"int": {"bits": 4, "group_size": 32}, "codebook": {"values": [-1.0, -0.25, 0.0, 0.5, 2.0]},
          "gguf": {"type": "Q5_0"}}  # rows of 128: whole 32-blocks (the K-quants need 256)


@pytest.fixture(autouse=True)
def _reader_ops_path():
    """Overrides the readers' conftest fixture: this module tests the native host path."""
    with kernels.use("auto"):
        yield


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("jax") / "m.safetensors"
    tensors = {}
    for i, s in enumerate(sorted(schemes.ids())):
        for dt in ("float32", "bfloat16", "float16"):
            w = rng.standard_normal((24, 128)).astype(np.float32)
            tensors[f"{s}.{dt}"] = qformat.quantize(w, s, dtype=dt, **PARAMS.get(s, {}))
    tensors["plain"] = rng.standard_normal((3, 5)).astype(np.float32)
    qformat.save_file(tensors, path)
    return path


def test_default_cpu_load_is_the_host_path_and_matches_bit_for_bit(saved, monkeypatch) -> None:
    if not kernels.enabled():
        pytest.skip("the native kernel is not built here")
    ref = qformat.load_file(saved)
    calls = []
    real = _io.jitted
    monkeypatch.setattr(_io, "jitted", lambda *a, **k: calls.append(a) or real(*a, **k))
    host = qformat_jax.load_file(saved)
    assert calls == []  # nothing went through the jitted decoder
    dev = qformat_jax.load_file(saved, decoder="jax")
    assert len(calls) == len(ref) - 1  # every quantized tensor did
    assert sorted(host) == sorted(ref)
    for name, want in ref.items():
        assert host[name].dtype == dev[name].dtype
        assert same_bits(np.asarray(host[name]), want), name
        assert same_bits(np.asarray(dev[name]), want), name


def test_regions_match_on_both_paths(saved) -> None:
    ref = qformat.load_file(saved)
    with qformat.safe_open(saved) as f:
        for name in ("int.bfloat16", "nf4.float32", "nvfp4.float16", "mxfp6_e3m2.float32"):
            for region in (((0, 24), (0, 128)), ((3, 17), (32, 96)), ((5, 6), (7, 9))):
                want = ref[name][tuple(slice(*r) for r in region)]
                for decoder in ("auto", "jax"):
                    got = qformat_jax.load_region(f, name, region, decoder=decoder)
                    assert same_bits(np.asarray(got), want), (name, region, decoder)


def test_without_the_native_kernel_the_jitted_decoder_runs(saved) -> None:
    with kernels.use("numpy"):
        assert not qformat_jax.host_decodes(jax.devices("cpu")[0])
        out = qformat_jax.load_file(saved)
    assert same_bits(np.asarray(out["nf4.float32"]), qformat.load_file(saved)["nf4.float32"])


def test_decode_on_host_and_bad_decoder(saved) -> None:
    q = qformat.quantize(np.linspace(-1, 1, 256, dtype=np.float32).reshape(2, 128), "nf4")
    assert same_bits(np.asarray(qformat_jax.decode_on_host(q)), q.dequantize())
    with pytest.raises(ValueError, match="decoder must be one of auto, jax"):
        qformat_jax.load_file(saved, decoder="gpu")
