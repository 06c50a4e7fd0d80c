"""The container against safetensors itself: what its writer makes, qformat reads; what qformat
writes, safetensors reads; and where qformat is deliberately stricter than safetensors' reader.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import qformat
from qformat.errors import QFormatError

from .filebuild import int4_expected, int4_tensor, raw_file

st_numpy = pytest.importorskip("safetensors.numpy")
from safetensors import SafetensorError  # noqa: E402

NUMPY_DTYPES = [np.float32, np.float16, np.float64, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
                np.int64, np.uint64, np.bool_, np.complex64, ml_dtypes.bfloat16]


def _sample(dtype: Any, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    return (rng.standard_normal(shape) * 100).astype(dt)


def _tensors() -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for i, dt in enumerate(NUMPY_DTYPES):
        name = np.dtype(dt).name
        out[f"{name}.matrix"] = _sample(dt, (3, 5), i)
        out[f"{name}.odd"] = _sample(dt, (7,), i + 100)
    out["scalar"] = np.array(2.5, np.float32)
    out["empty"] = np.zeros((0, 4), np.float16)
    out["rank4"] = _sample(np.float32, (2, 1, 3, 2))
    out["unicode.名前"] = np.arange(3, dtype=np.int32)
    return out


def _assert_same(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


def test_reads_what_safetensors_writes(tmp_path: Path) -> None:
    t = _tensors()
    p = tmp_path / "st.safetensors"
    st_numpy.save_file(t, str(p), metadata={"format": "np", "note": "ünïcode"})
    got = qformat.load_file(p)
    assert set(got) == set(t)
    for k in t:
        _assert_same(got[k], t[k])
    with qformat.safe_open(p) as f:
        assert f.metadata() == {"format": "np", "note": "ünïcode"}
        assert f.keys() == sorted(t)
        assert not any(f.is_quantized(k) for k in t)
        np.testing.assert_array_equal(f.get_slice("float32.matrix")[1:, 2:4], t["float32.matrix"][1:, 2:4])
    assert qformat.check(p).ok


def test_reads_safetensors_files_without_metadata_and_empty(tmp_path: Path) -> None:
    st_numpy.save_file({}, str(tmp_path / "empty.safetensors"))
    assert qformat.load_file(tmp_path / "empty.safetensors") == {}
    st_numpy.save_file({"a": np.ones(2, np.float32)}, str(tmp_path / "a.safetensors"))
    assert qformat.load_file(tmp_path / "a.safetensors")["a"].tolist() == [1.0, 1.0]
    assert qformat.check(tmp_path).ok


def test_safetensors_reads_what_qformat_writes(tmp_path: Path) -> None:
    t = _tensors()
    big_endian = np.arange(6, dtype=">f4").reshape(2, 3)
    strided = np.arange(24, dtype=np.int16).reshape(4, 6)[::2, ::3]
    transposed = np.arange(12, dtype=np.float64).reshape(3, 4).T
    extra = {"big_endian": big_endian, "strided": strided, "transposed": transposed}
    p = tmp_path / "q.safetensors"
    qformat.save_file({**t, **extra}, p, metadata={"a": "b"})
    got = st_numpy.load_file(str(p))
    for k in t:
        _assert_same(got[k], t[k])
    for k, v in extra.items():
        np.testing.assert_array_equal(got[k], v)
        assert got[k].dtype == v.dtype.newbyteorder("=")
    # and qformat reads its own file back identically
    mine = qformat.load_file(p)
    for k in got:
        _assert_same(mine[k], got[k])
    assert qformat.check(p).ok


def test_quantized_file_degrades_to_plain_components_in_safetensors(tmp_path: Path) -> None:
    d, c = int4_tensor("w")
    p = tmp_path / "q.safetensors"
    qformat.save_file({"w": qformat.QTensor(d, c), "b": np.ones(3, np.float32)}, p, metadata={"user": "x"})
    got = st_numpy.load_file(str(p))
    assert set(got) == set(c) | {"b"}
    for k in c:
        _assert_same(got[k], c[k])
    from safetensors import safe_open as st_open

    with st_open(str(p), framework="np") as f:
        meta = f.metadata()
    assert meta["user"] == "x"
    q = json.loads(meta["qformat"])
    assert q["version"] == "1.2" and set(q["tensors"]) == {"w"}  # 1.2: the writer records digests (SPEC.md §3.8)
    assert q["digests"]["algorithm"] == "sha256" and set(q["digests"]["tensors"]) == set(c) | {"b"}
    import hashlib

    assert all(q["digests"]["tensors"][k] == hashlib.sha256(np.ascontiguousarray(got[k]).tobytes()).hexdigest() for k in got)
    np.testing.assert_array_equal(qformat.load_file(p)["w"], int4_expected(d, c))


def test_writer_pads_header_with_spaces_to_a_multiple_of_8(tmp_path: Path) -> None:
    for n in range(1, 12):
        p = tmp_path / f"{n}.safetensors"
        qformat.save_file({"x" * n: np.ones(n, np.uint8)}, p, metadata={"k": "v" * n})
        raw = p.read_bytes()
        (hlen,) = struct.unpack("<Q", raw[:8])
        assert (8 + hlen) % 8 == 0
        header = raw[8 : 8 + hlen].decode("utf-8")
        body = header.rstrip(" ")
        assert body.endswith("}") and len(header) - len(body) < 8
        json.loads(body)


def test_writer_aligns_each_tensor_to_its_width(tmp_path: Path) -> None:
    p = tmp_path / "a.safetensors"
    qformat.save_file({"a": np.ones(3, np.int8), "b": np.ones(3, np.float64), "c": np.ones(5, np.float16), "d": np.ones(1, np.float32)}, p)
    raw = p.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + hlen])
    width = {"I8": 1, "F64": 8, "F16": 2, "F32": 4}
    for name, e in header.items():
        assert (8 + hlen + e["data_offsets"][0]) % width[e["dtype"]] == 0, name


@pytest.mark.parametrize("spaces", [0, 1, 7, 8, 1000])
def test_space_padding_of_any_length_is_accepted(spaces: int, tmp_path: Path) -> None:
    h = json.dumps({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}) + " " * spaces
    p = tmp_path / "p.safetensors"
    p.write_bytes(raw_file(h, np.arange(2, dtype=np.float32).tobytes(), pad=False))
    assert qformat.load_file(p)["t"].tolist() == [0.0, 1.0]
    assert st_numpy.load_file(str(p))["t"].tolist() == [0.0, 1.0]


# -- where qformat is stricter than safetensors' reader -------------------------------------
_E = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
_D = np.arange(2, dtype=np.float32).tobytes()
_ES = json.dumps(_E)

STRICT = [
    pytest.param('{"t":%s,"t":%s}' % (_ES, _ES), "HEADER_DUPLICATE_KEY", id="duplicate-tensor"),
    pytest.param('{"__metadata__":{"a":"1","a":"2"},"t":%s}' % _ES, "HEADER_DUPLICATE_KEY", id="duplicate-metadata-key"),
    pytest.param(json.dumps({"t": dict(_E, extra="x")}), "TENSOR_ENTRY_INVALID", id="extra-field"),
]

#: What safetensors' reader accepts and its writer never writes: read since spec 1.2 (SPEC.md
#: §2.4), reported only by ``qformat check --strict``.
LENIENT = [
    pytest.param(" " + json.dumps({"t": _E}), "t", "HEADER_LEADING_WHITESPACE", id="leading-space"),
    pytest.param("\n\t\r " + json.dumps({"t": _E}), "t", "HEADER_LEADING_WHITESPACE", id="leading-whitespace"),
    pytest.param(json.dumps({"": _E}), "", "TENSOR_NAME_INVALID", id="empty-name"),
    pytest.param(json.dumps({"t": _E}) + "\t\n", "t", "HEADER_PADDING_NOT_SPACE", id="whitespace-padding"),
]


@pytest.mark.parametrize("header, name, code", LENIENT)
def test_read_as_safetensors_reads_it(header: str, name: str, code: str, tmp_path: Path) -> None:
    data = raw_file(header, _D, pad=False)
    p = tmp_path / "s.safetensors"
    p.write_bytes(data)
    assert {k: v.tolist() for k, v in st_numpy.load(data).items()} == {name: [0.0, 1.0]}
    assert {k: v.tolist() for k, v in qformat.load_file(p).items()} == {name: [0.0, 1.0]}
    assert qformat.check(p).ok
    assert [x.code for x in qformat.check(p, strict=True).problems] == [code]


@pytest.mark.parametrize("header, code", STRICT)
def test_stricter_than_safetensors(header: str, code: str, tmp_path: Path) -> None:
    data = raw_file(header, _D)
    # safetensors' own reader accepts it ...
    loaded = st_numpy.load(data)
    assert [v.tolist() for v in loaded.values()] == [[0.0, 1.0]]
    # ... qformat refuses it, with a stable code
    p = tmp_path / "s.safetensors"
    p.write_bytes(data)
    with pytest.raises(QFormatError) as ei:
        qformat.load_file(p)
    assert ei.value.code == code
    assert [x.code for x in qformat.check(p).problems] == [code]


BOTH_REFUSE = [
    pytest.param(raw_file(json.dumps({"t": _E}).encode() + b"\0" * 8, _D, pad=False), "HEADER_INVALID_JSON", id="nul-padding"),
    pytest.param(raw_file("\ufeff" + json.dumps({"t": _E}), _D), "HEADER_INVALID_JSON", id="bom"),
    pytest.param(raw_file(json.dumps({"t": _E}), _D + b"x"), "TRAILING_BYTES", id="trailing-bytes"),
    pytest.param(raw_file(json.dumps({"t": dict(_E, data_offsets=[4, 12])}), b"\0" * 12), "OFFSETS_INVALID", id="hole"),
    pytest.param(raw_file(json.dumps({"t": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}), b"\0\0"), "SUB_BYTE_MISALIGNED", id="f4-odd"),
    pytest.param(raw_file(json.dumps({"__metadata__": {"a": 1}, "t": _E}), _D), "METADATA_INVALID", id="metadata-int"),
    pytest.param(raw_file('{"t":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}', _D), "HEADER_DUPLICATE_KEY",
                 id="duplicate-field-in-entry"),
]


@pytest.mark.parametrize("data, code", BOTH_REFUSE)
def test_refused_by_both(data: bytes, code: str, tmp_path: Path) -> None:
    with pytest.raises(SafetensorError):
        st_numpy.load(data)
    p = tmp_path / "s.safetensors"
    p.write_bytes(data)
    with pytest.raises(QFormatError) as ei:
        qformat.load_file(p)
    assert ei.value.code == code


def test_float8_components_interoperate_with_safetensors_torch(tmp_path: Path) -> None:
    """F8 dtypes (which safetensors.numpy cannot load) round-trip through safetensors.torch."""
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    t = {"e4m3": np.array([0.5, -2, 448], ml_dtypes.float8_e4m3fn), "e5m2": np.array([1, -0.25, 57344], ml_dtypes.float8_e5m2)}
    if hasattr(torch, "float8_e8m0fnu"):
        t["e8m0"] = np.array([1, 2, 0.5], ml_dtypes.float8_e8m0fnu)
    p = tmp_path / "f8.safetensors"
    qformat.save_file(t, p)
    got = st_torch.load_file(str(p))
    for k, v in t.items():
        assert got[k].view(torch.uint8).numpy().tobytes() == v.tobytes(), k
    st_torch.save_file(got, str(tmp_path / "back.safetensors"))
    back = qformat.load_file(tmp_path / "back.safetensors")
    for k, v in t.items():
        _assert_same(back[k], v)


def _open_bytes_cases() -> list[Any]:
    from .filebuild import valid_file

    good = valid_file()
    mine = [("valid", good), ("truncated", good[:-3]), ("trailing", good + b"\0"), ("empty", b""), ("short", b"\x10\0\0")]
    return [pytest.param(d, id=i) for i, d in mine] + [pytest.param(p.values[0], id=p.id) for p in BOTH_REFUSE]


@pytest.mark.parametrize("data", _open_bytes_cases())
def test_open_bytes_reads_what_a_file_reads(data: bytes, tmp_path: Path) -> None:
    """qformat.io.open_bytes, the in-memory entry point for fuzzers (issue 40): the same tensors,
    or the same code, as load_file of the same bytes in a file."""
    from qformat.io import open_bytes

    p = tmp_path / "f.safetensors"
    p.write_bytes(data)
    try:
        want: Any = qformat.load_file(p)
    except QFormatError as e:
        want = e.code
    try:
        f = open_bytes(data)
        got: Any = {k: f.get_tensor(k) for k in f.keys()}
    except QFormatError as e:
        got = e.code
    if isinstance(want, str):
        assert got == want
    else:
        assert sorted(got) == sorted(want) and all(np.array_equal(got[k], want[k]) for k in want)
