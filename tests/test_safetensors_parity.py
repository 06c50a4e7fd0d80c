"""safetensors parity (SPEC.md §2.4, issue 28), with the installed safetensors as the oracle.

1. Random files written by safetensors' own writer (``serialize_file``) over every dtype it
   writes, with edge shapes (empty axes, rank 0, high ranks), odd names (the empty one included)
   and metadata or none: qformat returns the same keys, dtypes, shapes, bytes, metadata and
   ``load_file`` order as safetensors' reader (``deserialize``, ``safe_open``); ``qformat check``
   finds nothing, and ``--strict`` only the empty name (TENSOR_NAME_INVALID) where it is used.
2. Structure-aware mutants of such files: wherever safetensors' reader accepts one, qformat
   returns the same content or refuses it with a code SPEC.md §2.4 names; wherever safetensors
   refuses one, qformat refuses it too.
3. The edge cases of safetensors' own test suite, as fixtures.
4. ``get_slice`` against NumPy indexing of the whole tensor (steps, empty lists, Ellipsis).
"""

from __future__ import annotations

import ctypes
import json
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import qformat
from qformat.container import STRICT_ALSO, STRICT_CODES
from qformat.errors import QFormatError

st = pytest.importorskip("safetensors")
from safetensors import SafetensorError, TensorSpec, deserialize, safe_open, serialize_file  # noqa: E402

#: safetensors' writer dtype name -> (header dtype, element bytes; F4: 2 values a byte)
WRITER_DTYPES = {
    "bool": ("BOOL", 1), "uint8": ("U8", 1), "int8": ("I8", 1), "uint16": ("U16", 2), "int16": ("I16", 2),
    "uint32": ("U32", 4), "int32": ("I32", 4), "uint64": ("U64", 8), "int64": ("I64", 8), "float16": ("F16", 2),
    "bfloat16": ("BF16", 2), "float32": ("F32", 4), "float64": ("F64", 8), "complex64": ("C64", 8),
    "float8_e4m3fn": ("F8_E4M3", 1), "float8_e5m2": ("F8_E5M2", 1), "float8_e8m0fnu": ("F8_E8M0", 1),
    "float8_e4m3fnuz": ("F8_E4M3FNUZ", 1), "float8_e5m2fnuz": ("F8_E5M2FNUZ", 1), "float4_e2m1fn_x2": ("F4", 1),
}
#: Codes qformat may refuse a file with where safetensors' reader reads it (SPEC.md §2.4).
DOCUMENTED_REFUSALS = {"HEADER_DUPLICATE_KEY", "TENSOR_ENTRY_INVALID", "SHAPE_UNREPRESENTABLE"}
N_FILES = 160
N_MUTANTS = 240
NAMES = ["w", "", "a.b", "model.layers.0.weight", "é", "x" * 40, "__metadata__x", "0", " ", "a/b"]


def test_the_writer_dtypes_are_the_ones_listed() -> None:
    """Every dtype the installed writer accepts is listed above, and each is a storage dtype."""
    buf = ctypes.create_string_buffer(16)
    with pytest.raises(SafetensorError) as ei:
        TensorSpec(dtype="no-such-dtype", shape=[1], data_ptr=ctypes.addressof(buf), data_len=1)
    listed = str(ei.value).split("Supported dtypes:")[1].strip().rstrip(".")
    assert {d.strip() for d in listed.split(",")} == set(WRITER_DTYPES)
    assert {h for h, _ in WRITER_DTYPES.values()} <= set(qformat.tables.dtypes())


# -- comparing what the two libraries return -------------------------------------------------------
def _stored_bytes(a: np.ndarray, dtype: str) -> bytes:
    """The stored bytes of qformat's plain array (SPEC.md §2.6: F4 repacked, low nibble first)."""
    if dtype == "F4":
        nib = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        return (nib[0::2] | (nib[1::2] << 4)).astype(np.uint8).tobytes()
    return np.ascontiguousarray(a).tobytes()


def _offset_order(path: Path) -> list[str]:
    """safetensors' load_file order (tensors sharing a begin offset tie in a hash order there)."""
    with safe_open(str(path), "np") as f:
        keys = f.offset_keys()
    return keys


def assert_same(path: Path) -> None:
    """qformat reads ``path`` as safetensors does: keys, dtypes, shapes, bytes, metadata, order."""
    data = path.read_bytes()
    ref = dict(deserialize(data))
    with safe_open(str(path), "np") as f:
        ref_meta = f.metadata()
        ref_keys = f.keys()
    with qformat.safe_open(path) as q:
        assert q.keys() == ref_keys
        assert q.metadata() == ref_meta
        for name, info in ref.items():
            e = q.header.entries[name]
            assert (e.dtype, list(e.shape)) == (info["dtype"], list(info["shape"])), name
            a = q.get_tensor(name)
            if e.dtype in ("F6_E2M3", "F6_E3M2"):
                assert a.dtype == np.uint8 and a.shape == (len(info["data"]),)
            else:
                assert a.shape == tuple(info["shape"]), name
            assert _stored_bytes(a, e.dtype) == bytes(info["data"]), name
    order = list(qformat.load_file(path))
    begins = [e.begin for e in q.header.entries.values()]
    if len(set(begins)) == len(begins):  # unique offsets: the order is determined
        assert order == _offset_order(path)
    else:
        assert sorted(order) == sorted(ref)
    assert qformat.check(path).ok, [p.code for p in qformat.check(path).problems]
    # the writer writes the empty name: the one thing strict checking reports in its files
    assert [p.code for p in qformat.check(path, strict=True).problems] == (["TENSOR_NAME_INVALID"] if "" in ref else [])


# -- 1. random files from safetensors' writer --------------------------------------------------------
def _random_shape(rng: np.random.Generator) -> list[int]:
    r = rng.random()
    if r < 0.03:
        return [1] * int(rng.integers(17, 65))  # ranks above 1.1's 16, up to the writer's 64
    rank = int(rng.integers(0, 5))
    shape = [int(rng.integers(0, 5)) for _ in range(rank)]
    if rng.random() < 0.1 and rank:
        shape[int(rng.integers(rank))] = 0
    return shape


def _write_random(rng: np.random.Generator, path: Path) -> None:
    keep: list[Any] = []
    specs = {}
    names = list(rng.permutation(NAMES))[: int(rng.integers(1, 6))]
    for name in names:
        wdt = list(WRITER_DTYPES)[int(rng.integers(len(WRITER_DTYPES)))]
        shape = _random_shape(rng)
        width = WRITER_DTYPES[wdt][1]
        if wdt == "float4_e2m1fn_x2":  # the writer takes the packed shape and doubles the last axis
            shape = shape or [1]
        nbytes = int(np.prod(shape, dtype=np.int64)) * width
        raw = rng.integers(0, 256, size=nbytes, dtype=np.uint8)
        if wdt == "bool":
            raw &= 1
        buf = ctypes.create_string_buffer(raw.tobytes(), max(nbytes, 1))
        keep.append(buf)
        specs[str(name)] = TensorSpec(dtype=wdt, shape=shape, data_ptr=ctypes.addressof(buf), data_len=nbytes)
    meta = None if rng.random() < 0.4 else {"format": "pt", "k": str(rng.integers(1 << 30)), "": "ü"}
    serialize_file(specs, str(path), metadata=meta)


def test_random_files_written_by_safetensors(tmp_path: Path) -> None:
    rng = np.random.default_rng(28)
    seen: set[str] = set()
    for i in range(N_FILES):
        p = tmp_path / f"r{i}.safetensors"
        _write_random(rng, p)
        seen.update(e["dtype"] for _, e in deserialize(p.read_bytes()))
        assert_same(p)
    assert seen == {h for h, _ in WRITER_DTYPES.values()}  # every dtype the writer writes was read


def test_f4_reads_as_e2m1fn_values(tmp_path: Path) -> None:
    """Plain F4 from torch's float4_e2m1fn_x2 through safetensors.torch: value 2k in the low nibble."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    codes = np.arange(16, dtype=np.uint8).reshape(2, 8)
    packed = torch.from_numpy(codes[:, 0::2] | (codes[:, 1::2] << 4)).view(torch.float4_e2m1fn_x2)
    p = tmp_path / "f4.safetensors"
    save_file({"f": packed}, str(p))
    got = qformat.load_file(p)["f"]
    assert got.dtype == np.dtype(ml_dtypes.float4_e2m1fn) and got.shape == (2, 8)
    np.testing.assert_array_equal(got.view(np.uint8), codes)
    assert got.astype(np.float32)[0].tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    import qformat_torch

    t = qformat_torch.load_file(p)["f"]  # torch gets what safetensors.torch gives
    assert t.dtype == torch.float4_e2m1fn_x2 and t.shape == packed.shape
    assert torch.equal(t.view(torch.uint8), packed.view(torch.uint8))
    odd = tmp_path / "odd.safetensors"
    odd.write_bytes(_raw(json.dumps({"f": {"dtype": "F4", "shape": [2, 3], "data_offsets": [0, 3]}}), b"\x21\x43\x65"))
    assert qformat.load_file(odd)["f"].view(np.uint8).tolist() == [[1, 2, 3], [4, 5, 6]]
    with pytest.raises(QFormatError) as ei:
        qformat_torch.load_file(odd)
    assert ei.value.code == "PLAIN_DTYPE_UNSUPPORTED"


# -- 2. structure-aware mutants --------------------------------------------------------------------------
def _raw(header: str | bytes, data: bytes = b"") -> bytes:
    hb = header.encode("utf-8") if isinstance(header, str) else header
    return struct.pack("<Q", len(hb)) + hb + data


def _split(data: bytes) -> tuple[str, bytes]:
    n = struct.unpack("<Q", data[:8])[0]
    return data[8 : 8 + n].decode("utf-8"), data[8 + n :]


def _mutate(rng: np.random.Generator, data: bytes) -> bytes:
    text, body = _split(data)
    obj = json.loads(text)
    names = [k for k in obj if k != "__metadata__"]
    name = names[int(rng.integers(len(names)))] if names else None
    kind = int(rng.integers(14))
    ws = "".join(rng.choice([" ", "\t", "\n", "\r"], size=int(rng.integers(1, 4))))
    if kind == 0:
        return _raw(ws + text, body)
    if kind == 1:
        return _raw(text.rstrip(" ") + ws, body)
    if kind == 2 and name is not None:  # rename to the empty name (or collide)
        obj[""] = obj.pop(name)
        return _raw(json.dumps(obj), body)
    if kind == 3 and name is not None:
        obj[name]["extra"] = 1
        return _raw(json.dumps(obj), body)
    if kind == 4 and name is not None:  # a repeated tensor name
        return _raw(text.rstrip(" ")[:-1] + "," + json.dumps(name) + ":" + json.dumps(obj[name]) + "}", body)
    if kind == 5 and name is not None:  # rank change keeping the size
        obj[name]["shape"] = [1] * int(rng.integers(60, 70)) + obj[name]["shape"]
        return _raw(json.dumps(obj), body)
    if kind == 6 and name is not None:  # an empty tensor with huge axes
        obj[name]["shape"] = [0, int(rng.choice([2**20, 2**40, 2**62, 2**63 - 1, 2**64 - 1]))]
        b, e = obj[name]["data_offsets"]
        if e != b:
            return data
        return _raw(json.dumps(obj), body)
    if kind == 7:  # trailing byte
        return data + b"\0"
    if kind == 8 and body:  # truncated
        return data[:-1]
    if kind == 9:  # a NUL or other byte as padding
        return _raw(text.rstrip(" ") + rng.choice(["\0", "\x0b", "x", "\ufeff"]), body)
    if kind == 10 and name is not None:  # dtype changed
        obj[name]["dtype"] = str(rng.choice(["F6_E2M3", "F6_E3M2", "U8", "F4", "f32", "F8_E4M3"]))
        return _raw(json.dumps(obj), body)
    if kind == 11:  # metadata shapes
        obj["__metadata__"] = [None, {}, {"a": 1}, {"a": "b"}, "x"][int(rng.integers(5))]
        return _raw(json.dumps(obj), body)
    if kind == 12 and len(text) > 2:  # one byte of the header text replaced
        i = int(rng.integers(len(text)))
        return _raw(text[:i] + str(rng.choice(list('{}[],:"0 9e-.\\'))) + text[i + 1 :], body)
    if kind == 13 and name is not None:  # offsets moved
        b, e = obj[name]["data_offsets"]
        d = int(rng.integers(-2, 3))
        obj[name]["data_offsets"] = [max(0, b + d), max(0, e + d)]
        return _raw(json.dumps(obj), body)
    return _raw(ws + text.rstrip(" ") + ws, body)


def test_mutants(tmp_path: Path) -> None:
    rng = np.random.default_rng(2028)
    src = tmp_path / "src.safetensors"
    both_read = refused_documented = both_refuse = 0
    for i in range(N_MUTANTS):
        if i % 8 == 0:
            _write_random(rng, src)
        m = _mutate(rng, src.read_bytes())
        p = tmp_path / "m.safetensors"
        p.write_bytes(m)
        try:
            dict(deserialize(m))
            with safe_open(str(p), "np") as f:
                f.metadata()
            st_ok = True
        except (SafetensorError, ValueError, TypeError, OverflowError):
            st_ok = False
        try:
            qformat.load_file(p)
            q_code = None
        except QFormatError as e:
            q_code = e.code
        if not st_ok:
            assert q_code is not None, f"qformat reads a file safetensors refuses: {m[:200]!r}"
            both_refuse += 1
        elif q_code is None:
            assert_same_lenient(p)
            both_read += 1
        else:
            assert q_code in DOCUMENTED_REFUSALS, f"{q_code} for a file safetensors reads: {m[:200]!r}"
            assert q_code in {x.code for x in qformat.check(p).problems}  # check reports it as well
            refused_documented += 1
    assert both_read > 50 and both_refuse > 20 and refused_documented > 5, (both_read, both_refuse, refused_documented)


def assert_same_lenient(path: Path) -> None:
    """assert_same, where check --strict may report only the lenient codes (SPEC.md §2.4)."""
    data = path.read_bytes()
    ref = dict(deserialize(data))
    got = qformat.load_file(path)
    assert sorted(got) == sorted(ref)
    with qformat.safe_open(path) as q:
        with safe_open(str(path), "np") as f:
            assert q.metadata() == f.metadata()
        for name, info in ref.items():
            e = q.header.entries[name]
            assert (e.dtype, list(e.shape)) == (info["dtype"], list(info["shape"]))
            assert _stored_bytes(got[name], e.dtype) == bytes(info["data"])
    assert qformat.check(path).ok
    assert {x.code for x in qformat.check(path, strict=True).problems} <= set(STRICT_CODES) | set(STRICT_ALSO)


# -- 3. safetensors' own test-suite edge cases --------------------------------------------------------------
_E = '{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
_D = np.arange(2, dtype=np.float32).tobytes()

EDGE_CASES = [  # (id, file bytes, None = both read it the same, or the code qformat refuses with)
    ("no-tensors", _raw("{}"), None),
    ("no-tensors-padded", _raw("{}      "), None),
    ("metadata-only", _raw('{"__metadata__":{"format":"pt"}}'), None),
    ("metadata-null", _raw('{"__metadata__":null,"t":%s}' % _E, _D), None),  # what mx.save_safetensors writes
    ("zero-sized", _raw('{"t":{"dtype":"F32","shape":[2,0],"data_offsets":[0,0]}}'), None),
    ("rank-0", _raw('{"t":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}', b"\0\0\x80\x3f"), None),
    ("leading-whitespace", _raw("   \n" + '{"t":%s}' % _E, _D), None),
    ("tab-newline-padding", _raw('{"t":%s}\t\n\r ' % _E, _D), None),
    ("empty-name", _raw('{"":%s}' % _E, _D), None),
    ("empty-huge-axes", _raw('{"t":{"dtype":"F32","shape":[0,1099511627776,1099511627776],"data_offsets":[0,0]}}'),
     "SHAPE_UNREPRESENTABLE"),
    ("empty-2-63-1", _raw('{"t":{"dtype":"F32","shape":[9223372036854775807,0],"data_offsets":[0,0]}}'), "SHAPE_UNREPRESENTABLE"),
    ("empty-2-63-1-u8", _raw('{"t":{"dtype":"U8","shape":[9223372036854775807,0],"data_offsets":[0,0]}}'), None),
    ("rank-65", _raw('{"t":{"dtype":"U8","shape":[%s],"data_offsets":[0,1]}}' % ",".join(["1"] * 65), b"\0"),
     "TENSOR_ENTRY_INVALID"),
    ("duplicate-name", _raw('{"t":%s,"t":%s}' % (_E, _E), _D), "HEADER_DUPLICATE_KEY"),
    ("extra-member", _raw('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}}', _D), "TENSOR_ENTRY_INVALID"),
]
BOTH_REFUSE = [
    ("json-attack-huge-shape", _raw('{"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}', _D)),
    ("truncated", _raw('{"t":%s}' % _E, _D[:7])),
    ("trailing", _raw('{"t":%s}' % _E, _D + b"\0")),
    ("header-too-large", struct.pack("<Q", 100_000_001) + b"{}"),
    ("header-past-end", struct.pack("<Q", 1000) + b"{}"),
    ("not-an-object", _raw("[]")),
    ("nul-padding", _raw('{"t":%s}\0' % _E, _D)),
    ("hole", _raw('{"t":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', b"\0" * 12)),
    ("f4-odd-count", _raw('{"t":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}', b"\0\0")),
]


@pytest.mark.parametrize("data, code", [pytest.param(d, c, id=i) for i, d, c in EDGE_CASES])
def test_safetensors_edge_cases(data: bytes, code: str | None, tmp_path: Path) -> None:
    p = tmp_path / "e.safetensors"
    p.write_bytes(data)
    dict(deserialize(data))  # safetensors reads each of them
    if code is None:
        assert_same_lenient(p)
    else:
        with pytest.raises(QFormatError) as ei:
            qformat.load_file(p)
        assert ei.value.code == code
        assert code in {x.code for x in qformat.check(p).problems}


@pytest.mark.parametrize("data", [pytest.param(d, id=i) for i, d in BOTH_REFUSE])
def test_both_refuse(data: bytes, tmp_path: Path) -> None:
    p = tmp_path / "e.safetensors"
    p.write_bytes(data)
    with pytest.raises((SafetensorError, ValueError)):
        dict(deserialize(data))
    with pytest.raises(QFormatError):
        qformat.load_file(p)


def test_save_file_of_torch_edge_cases(tmp_path: Path) -> None:
    """What safetensors.torch.save_file writes in its own tests: rank 17 and 64, the empty name,
    zero-sized tensors, every torch dtype it maps."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    cases = {"rank17": {"a": torch.zeros([1] * 17)}, "rank64": {"a": torch.ones([1] * 63 + [2])}, "empty-name": {"": torch.zeros(2)},
             "zero": {"z": torch.zeros((2, 0)), "y": torch.zeros((0,), dtype=torch.float16)},
             "e8m0": {"e": torch.tensor([127, 128, 255], dtype=torch.uint8).view(torch.float8_e8m0fnu)}}
    for name, tensors in cases.items():
        p = tmp_path / f"{name}.safetensors"
        save_file(tensors, str(p), metadata={"format": "pt"})
        assert_same(p)


# -- 4. get_slice: NumPy indexing of the decoded tensor -------------------------------------------------
KEYS = [np.s_[::2], np.s_[1:8:3], np.s_[:, ::3], np.s_[[]], np.s_[:, []], np.s_[[], 1], np.s_[1, []], np.s_[..., 1],
        np.s_[1, ..., 2], np.s_[0:0:2], np.s_[-1], np.s_[10:], np.s_[2:1], np.s_[np.int64(1)], np.s_[..., ::2, 1:5:2],
        np.s_[-3:, -1::4], np.s_[()], np.s_[...], np.s_[:, 7], np.s_[3:100:7, 1::2]]


@pytest.mark.parametrize("key", [pytest.param(k, id=repr(k)) for k in KEYS])
def test_get_slice_is_numpy_indexing(key: Any, tmp_path: Path) -> None:
    from qformat.schemes import quantize

    x = np.random.default_rng(5).standard_normal((12, 8)).astype(np.float32)
    p = tmp_path / "s.safetensors"
    qformat.save_file({"w": quantize(x, "int", bits=4, group_size=4), "p": x}, p)
    with qformat.safe_open(p) as f:
        for name in ("w", "p"):
            whole = f.get_tensor(name)
            got = f.get_slice(name)[key]
            want = whole[key]
            assert got.shape == want.shape and got.dtype == want.dtype
            assert got.tobytes() == np.ascontiguousarray(want).tobytes()


def test_get_slice_with_a_step_matches_safetensors(tmp_path: Path) -> None:
    p = tmp_path / "s.safetensors"
    a = np.arange(80, dtype=np.float32).reshape(10, 8)
    qformat.save_file({"a": a}, p)
    with safe_open(str(p), "np") as sf, qformat.safe_open(p) as qf:
        for key in (np.s_[::2], np.s_[1:8:3], np.s_[:, ::3], np.s_[[]], np.s_[..., 1]):
            np.testing.assert_array_equal(qf.get_slice("a")[key], sf.get_slice("a")[key])
    for key, words in ((np.s_[::-1], "positive"), (np.s_[..., ...], "one Ellipsis"), (np.s_[[1]], "must be empty")):
        with qformat.safe_open(p) as qf, pytest.raises(QFormatError) as ei:
            qf.get_slice("a")[key]
        assert ei.value.code == "SLICE_INVALID" and words in str(ei.value)


# -- empty tensors of any valid shape, in every reader ----------------------------------------------------
@pytest.mark.parametrize("shape, dtype, code", [
    ([2**63 - 1, 0], "U8", None), ([2**40, 0, 2**20], "U8", None), ([0, 2**30, 2**30], "F32", None),
    ([0, 2**40, 2**40], "F32", "SHAPE_UNREPRESENTABLE"), ([2**63 - 1, 0], "F32", "SHAPE_UNREPRESENTABLE"),
    ([2**61, 0, 4], "F4", "SHAPE_UNREPRESENTABLE"),
])
def test_empty_tensors_in_numpy_torch_and_jax(shape: list[int], dtype: str, code: str | None, tmp_path: Path) -> None:
    p = tmp_path / "z.safetensors"
    p.write_bytes(_raw(json.dumps({"z": {"dtype": dtype, "shape": shape, "data_offsets": [0, 0]}})))
    readers = [qformat.load_file]
    for mod in ("qformat_torch", "qformat_jax"):
        try:
            readers.append(__import__(mod).load_file)
        except ImportError:
            pass
    for load in readers:
        if code is None:
            assert tuple(load(p)["z"].shape) == tuple(shape)
        else:
            with pytest.raises(QFormatError) as ei:
                load(p)
            assert ei.value.code == code
    assert [x.code for x in qformat.check(p).problems] == ([] if code is None else [code])
