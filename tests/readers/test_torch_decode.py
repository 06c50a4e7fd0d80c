"""Torch-specific decoding checks (the shared bit-exact suite is tests/test_backends.py).

tests/test_backends.py runs qformat.torch against the per-element SPEC.md transcription and the
NumPy reference: in-memory TorchQTensor decodes, files (load_file, get_slice boxes, rows,
column ranges, get_qtensor), random bit patterns, chunked decoding, payload errors, the
conformance corpus.  Here: reached as qformat.torch, a TorchQTensor round trip to NumPy keeps
every packed byte, the final casts are round-to-nearest-even, get_slice reads only its bytes,
framework and device arguments.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402

import qformat  # noqa: E402
import qformat_torch as qt  # noqa: E402

from ..backends import same_bits, torch_to_numpy  # noqa: E402
from ..strategies import descriptors  # noqa: E402

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def np_of(t: torch.Tensor) -> np.ndarray:
    return torch_to_numpy(t)


def test_reached_as_qformat_torch():
    assert qformat.torch is qt


@SETTINGS
@given(descriptors())
def test_packed_tensor_round_trips_to_numpy_byte_for_byte(case):
    desc, comps, _ = case
    t = qt.TorchQTensor.from_qtensor(qformat.QTensor(desc, comps))
    assert tuple(t.shape) == tuple(desc["shape"])
    back = t.to_qtensor()
    assert all(np.array_equal(back.components[k].view(np.uint8), np.ascontiguousarray(v).view(np.uint8)) for k, v in comps.items())


def test_final_casts_are_round_to_nearest_even():
    """torch's CPU float32 -> float16 / bfloat16 casts equal ml_dtypes' (RNE, overflow to Inf),
    vectorised and strided, over random bit patterns plus every bfloat16 halfway case class."""
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, size=1 << 20, dtype=np.uint64).astype(np.uint32)
    top = rng.integers(0, 2**16, size=1 << 16, dtype=np.uint32) << 16
    fp16_edges = np.array([65504, 65519.99, 65520, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 2.0**-14], np.float32).view(np.uint32)
    bits = np.concatenate([bits, top | 0x8000, top | 0x7FFF, top | 0x8001, top, fp16_edges, fp16_edges | 0x80000000])
    x = bits.view(np.float32)
    t = torch.from_numpy(x.copy())
    for tdt, ndt in [(torch.float16, np.float16), (torch.bfloat16, ml_dtypes.bfloat16)]:
        with np.errstate(over="ignore", invalid="ignore"):
            want = x.astype(ndt)
        assert same_bits(np_of(t.to(tdt)), want)
        assert same_bits(np_of(t[::3].to(tdt)), want[::3])


def test_get_slice_reads_only_the_bytes_it_needs(tmp_path, monkeypatch):
    from qformat_torch import sources

    x = np.random.default_rng(1).standard_normal((512, 256)).astype(np.float32)
    q = qformat.quantize(x, "int", bits=4, group_size=32)  # codes U8 [512, 128], scale F16 [512, 8]
    path = tmp_path / "w.safetensors"
    qt.save_file({"w": q}, path)
    read = []
    real = sources.numpy_to_torch
    monkeypatch.setattr(sources, "numpy_to_torch", lambda a, *args: (read.append(a.nbytes), real(a, *args))[1])
    with qt.safe_open(path) as f:
        rows = f.get_slice("w")[100:164]
        assert sum(read) == 64 * 128 + 64 * 8 * 2
        read.clear()
        cols = f.get_slice("w")[:, 64:128]
        assert sum(read) == 512 * 32 + 512 * 2 * 2
    full = q.dequantize()
    assert same_bits(np_of(rows), full[100:164]) and same_bits(np_of(cols), full[:, 64:128])


def test_framework_name_and_device_arguments(tmp_path):
    path = tmp_path / "p.safetensors"
    qt.save_file({"a": torch.ones(2)}, path)
    with pytest.raises(qformat.QFormatError) as e:
        qt.safe_open(path, framework="flax")
    assert e.value.code == "FRAMEWORK_UNKNOWN"
    out = qt.load_file(path, device="cpu", dtype=torch.float16)
    assert out["a"].dtype == torch.float16 and out["a"].device.type == "cpu"


def test_decodes_under_inference_mode_and_after(tmp_path):
    """torch.inference_mode() is thread-local: the decoder's worker threads enter the caller's
    mode (they write the output in place), and its kept scratch buffers serve both modes."""
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal((2048, 1024)).astype(np.float32)  # several chunks: threads
    qformat.save_file({"w": qformat.quantize(x, "int", bits=4, group_size=32, dtype="bfloat16")}, tmp_path / "w.safetensors")
    ref = qformat.load_file(tmp_path / "w.safetensors")["w"]
    with torch.inference_mode():
        inside = qt.load_file(tmp_path / "w.safetensors")["w"]
    outside = qt.load_file(tmp_path / "w.safetensors")["w"]
    for t in (inside, outside):
        assert same_bits(torch_to_numpy(t), ref)
