"""The torch decoder against the NumPy reference, bit for bit (NaN by class).

Hypothesis draws whole descriptors with tests/test_decode.py's strategy (every element type,
packing, block kind, nested parameter and logical dtype); the torch decode of the in-memory
TorchQTensor, of the file (get_tensor, load_file) and of random get_slice boxes must equal
qformat's NumPy decode exactly.  Further tests: the final casts are round-to-nearest-even,
chunked decoding, payload errors raise the core's codes, get_slice reads only its bytes.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import qformat  # noqa: E402
import qformat_torch as qt  # noqa: E402
from qformat.packing import Packing  # noqa: E402
from qformat_torch import decode as tdecode  # noqa: E402
from qformat_torch._convert import torch_to_numpy  # noqa: E402

from ..test_decode import descriptors, pack_codes, same_bits  # noqa: E402

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def np_of(t: torch.Tensor) -> np.ndarray:
    return torch_to_numpy(t)


def test_reached_as_qformat_torch():
    assert qformat.torch is qt


@SETTINGS
@given(descriptors())
def test_in_memory_decode_equals_numpy_reference(case):
    desc, comps, _ = case
    ref = qformat.QTensor(desc, comps).dequantize()
    t = qt.TorchQTensor.from_qtensor(qformat.QTensor(desc, comps))
    got = t.dequantize()
    assert got.dtype == qt._convert.LOGICAL_TORCH[desc["dtype"]]
    assert tuple(got.shape) == ref.shape
    assert same_bits(np_of(got), ref)
    # the packed tensor survives a round trip to NumPy byte for byte
    back = t.to_qtensor()
    assert all(np.array_equal(back.components[k].view(np.uint8), np.ascontiguousarray(v).view(np.uint8)) for k, v in comps.items())


@SETTINGS
@given(descriptors(), st.data())
def test_file_decode_and_slices_equal_numpy_reference(tmp_path_factory, case, data):
    desc, comps, _ = case
    q = qformat.QTensor(desc, comps)
    full = q.dequantize()
    path = tmp_path_factory.mktemp("t") / "t.safetensors"
    qt.save_file({"t": q, "plain": torch.arange(6, dtype=torch.bfloat16)}, path)
    loaded = qt.load_file(path)
    assert same_bits(np_of(loaded["t"]), full)
    assert torch.equal(loaded["plain"], torch.arange(6, dtype=torch.bfloat16))
    shape = tuple(desc["shape"])
    key = []
    for n in shape:
        lo = data.draw(st.integers(0, n))
        key.append(slice(lo, data.draw(st.integers(lo, n))))
    with qt.safe_open(path, framework="pt") as f:
        assert f.keys() == ["plain", "t"]
        assert f.descriptor("t") == qformat.safe_open(path).descriptor("t")
        assert same_bits(np_of(f.get_slice("t")[tuple(key)]), full[tuple(key)])
        if shape and shape[0] > 0:
            i = data.draw(st.integers(0, shape[0] - 1))
            assert same_bits(np_of(f.get_slice("t")[i]), full[i])
        if len(shape) >= 2:
            lo = data.draw(st.integers(0, shape[1]))
            hi = data.draw(st.integers(lo, shape[1]))
            assert same_bits(np_of(f.get_slice("t")[:, lo:hi]), full[:, lo:hi])
        assert same_bits(np_of(f.get_qtensor("t").dequantize()), full)


def test_chunked_decode_equals_single_pass(monkeypatch):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((37, 45)).astype(np.float32)
    for scheme, params in [("nf4", {"double_quant": True, "dtype": "bfloat16"}), ("int", {"bits": 3, "group_size": 8})]:
        q = qformat.quantize(x, scheme, **params)
        whole = qt.TorchQTensor.from_qtensor(q).dequantize()
        monkeypatch.setattr(tdecode, "CHUNK_ELEMENTS", 50)
        chunked = qt.TorchQTensor.from_qtensor(q).dequantize()
        monkeypatch.undo()
        assert same_bits(np_of(chunked), np_of(whole))
        assert same_bits(np_of(whole), q.dequantize())


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


def _file_with(tmp_path, desc, comps):
    path = tmp_path / "bad.safetensors"
    qformat.save_file({"t": qformat.QTensor(desc, comps)}, path)
    return path


@pytest.mark.parametrize("named", [False, True])
def test_code_out_of_range_raises_the_core_code(tmp_path, named):
    p = Packing(8, "lsb_first", 0)
    if named:  # a 16-entry named table addressed by 5-bit codes
        codes, bits, el, comps = np.array([0, 1, 2, 20], np.uint8), 5, {"type": "codebook", "bits": 5, "table": "nf4"}, {}
    else:
        codes, bits, el = np.array([0, 1, 2, 3], np.uint8), 2, {"type": "codebook", "bits": 2, "table_tensor": "tab"}
        comps = {"tab": np.array([1, 2, 3], np.float32)}
    desc = {"shape": [4], "dtype": "float32", "codes": {"tensor": "c", "element": el, "packing": p.to_dict()}}
    path = _file_with(tmp_path, desc, {"c": pack_codes(codes, bits, p), **comps})
    with pytest.raises(qformat.QFormatError) as np_err:
        qformat.load_file(path)
    with pytest.raises(qformat.QFormatError) as t_err:
        qt.load_file(path)
    assert t_err.value.code == np_err.value.code == "CODE_OUT_OF_RANGE"
    with qt.safe_open(path) as f:  # the elements before the bad code still decode
        assert same_bits(np_of(f.get_slice("t")[:3]), qformat.safe_open(path).get_slice("t")[:3])


def test_group_index_out_of_range_raises_the_core_code(tmp_path):
    p = Packing(8, "lsb_first", 1)
    codes = np.arange(8, dtype=np.uint8).reshape(2, 4) % 4
    desc = {"shape": [2, 4], "dtype": "float32",
            "codes": {"tensor": "c", "element": {"type": "int", "bits": 2, "signedness": "unsigned"}, "packing": p.to_dict()},
            "scale": {"blocks": {"type": "grid", "size": [1, None], "index": {"axis": 1, "tensor": "g", "count": 2}},
                      "op": "multiply", "tensor": "s"}}
    comps = {"c": pack_codes(codes, 2, p), "g": np.array([0, 1, 5, 0], np.int32), "s": np.ones((2, 2), np.float32)}
    path = _file_with(tmp_path, desc, comps)
    with pytest.raises(qformat.QFormatError) as t_err:
        qt.load_file(path)
    assert t_err.value.code == "GROUP_INDEX_RANGE"
    with qt.safe_open(path) as f:
        assert f.get_slice("t")[:, :2].shape == (2, 2)


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
