"""``qformat convert`` from GGUF: every type bit-exact with gguf-py, metadata kept, hostile files refused.

Sources are written with gguf-py's own ``GGUFWriter``.  Types gguf-py can quantize (Q4_0, Q4_1,
Q5_0, Q5_1, Q8_0, MXFP4) are quantized from real float data with ``gguf.quants.quantize``; the
K-quants (which gguf-py only dequantizes) are random block bytes with finite f16 ``d``/``dmin``,
valid input to its dequantizer.  Some blocks get edge scales (f16 subnormals, +-0, 65504; MXFP4
exponent bytes 0 and 254).  The expected values are always ``gguf.quants.dequantize`` of the
raw bytes: the oracle, never the converter.  Hostile headers are built byte by byte from the
GGUF layout (ggml docs/gguf.md).
"""

from __future__ import annotations

import json
import struct
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

import qformat
from qformat.container import read_header
from qformat.convert import describe
from qformat.convert.gguf import MAX_INLINE_VALUE_BYTES
from qformat.errors import QFormatError

from .helpers import _stored, assert_converts

#: Types gguf-py quantizes: built from float data.
QUANTIZABLE = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4]
#: K-quants: byte offsets of their f16 super-block scales (ggml-common.h block_q*_K).
K_SCALES = {T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}
#: f16 scales planted in a few blocks: smallest and largest subnormal, +-0, largest finite, 1.
EDGE_F16 = np.array([0x0001, 0x03FF, 0x0000, 0x8000, 0x7BFF, 0x3C00], np.uint16)


def write_gguf(path: Path, tensors: list[tuple[str, np.ndarray, T | None]], kv=None, alignment: int | None = None) -> Path:  # type: ignore[no-untyped-def]
    """A GGUF file written by gguf-py; ``tensors``: (name, data, raw ggml type or None for plain)."""
    w = gguf.GGUFWriter(str(path), arch="test")
    if alignment is not None:
        w.add_custom_alignment(alignment)
        w.add_uint32("general.alignment", alignment)
    for f in kv or []:
        f(w)
    for name, data, qt in tensors:
        if qt is None:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _edge_scales(raw: np.ndarray, qt: T) -> None:
    """Plant edge values into the scale fields of the first blocks (in place)."""
    bs, ts = gguf.GGML_QUANT_SIZES[qt]
    blocks = raw.reshape(-1, ts)
    if qt == T.MXFP4:
        blocks[0, 0], blocks[1, 0] = 0, 254  # E8M0 extremes gguf-py reads as finite scales
        return
    offs = K_SCALES.get(qt, (0,) if qt in (T.Q4_0, T.Q5_0, T.Q8_0) else (0, 2))
    for i, v in enumerate(EDGE_F16[: blocks.shape[0]]):
        for o in offs:
            blocks[i, o : o + 2] = np.array([v], np.uint16).view(np.uint8)


def quant_data(qt: T, shape: tuple[int, ...], rng: np.random.Generator, edges: bool = True) -> np.ndarray:
    """Raw GGUF bytes of a tensor of logical ``shape`` (uint8, rows of whole blocks)."""
    bs, ts = gguf.GGML_QUANT_SIZES[qt]
    if qt in QUANTIZABLE:
        x = (rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 30.0], size=shape[:-1] + (1,))).astype(np.float32)
        raw = np.ascontiguousarray(quantize(x, qt))
    else:
        raw = rng.integers(0, 256, shape[:-1] + (shape[-1] // bs * ts,), dtype=np.uint8)
        blocks = raw.reshape(-1, ts)
        for o in K_SCALES[qt]:
            d = (rng.standard_normal(blocks.shape[0]) * 0.05).astype(np.float16)
            blocks[:, o : o + 2] = d.view(np.uint8).reshape(-1, 2)
    if edges:
        _edge_scales(raw, qt)
    return raw


def oracle(raw: np.ndarray, qt: T, shape: tuple[int, ...]) -> np.ndarray:
    """gguf-py's decoded values (float32) in the logical shape."""
    with np.errstate(over="ignore", invalid="ignore"):  # Inf/NaN results are part of what is compared
        return np.asarray(dequantize(raw, qt), np.float32).reshape(shape)


def _same_outputs(paths: dict[str, Path]) -> None:
    """Both modes write the same canonical components (GGUF has no in-place form)."""
    a, b = _stored(paths["in_place"]), _stored(paths["repack"])
    assert a == b
    ma = read_header(paths["in_place"]).metadata or {}
    mb = read_header(paths["repack"]).metadata or {}
    assert json.loads(ma["qformat"]) == json.loads(mb["qformat"])


# -- every quantized type ----------------------------------------------------------------------
@pytest.mark.parametrize("qt", QUANTIZABLE + list(K_SCALES), ids=lambda t: t.name)
def test_quantized_type_is_bit_exact(qt: T, tmp_path: Path) -> None:
    rng = np.random.default_rng(int(qt))
    bs = gguf.GGML_QUANT_SIZES[qt][0]
    shapes = {"blk.0.w2d": (5 if bs == 32 else 3, 2 * bs), "blk.0.w3d": (2, 3, bs)}
    tensors, expected = [], {}
    for name, shape in shapes.items():
        raw = quant_data(qt, shape, rng)
        tensors.append((name, raw, qt))
        expected[name] = oracle(raw, qt, shape)
    src = write_gguf(tmp_path / "m.gguf", tensors)
    paths = assert_converts(src, expected, tmp_path, detect_as="gguf", in_place=False)
    _same_outputs(paths)
    desc = json.loads(read_header(paths["repack"]).metadata["qformat"])["tensors"]["blk.0.w2d"]
    assert desc["scheme"] == "gguf_" + qt.name.lower() and desc["dtype"] == "float32"


def test_q4_k_descriptor(tmp_path: Path) -> None:
    """The Q4_K descriptor has the two-level shape Appendix C documents (nested d*sc and dmin*m)."""
    rng = np.random.default_rng(1)
    raw = quant_data(T.Q4_K, (2, 512), rng, edges=False)
    src = write_gguf(tmp_path / "m.gguf", [("w", raw, T.Q4_K)])
    _, _, described = describe(src)
    d = described.descriptors["w"]
    assert d["codes"]["element"] == {"type": "int", "bits": 4, "signedness": "unsigned"}
    assert d["scale"]["blocks"]["size"] == [1, 32] and d["bias"]["op"] == "subtract"
    inner = d["scale"]["encoded"]
    assert inner["shape"] == [2, 16] and inner["codes"]["element"]["bits"] == 6
    assert inner["scale"] == {"blocks": {"type": "grid", "size": [1, 8]}, "op": "multiply", "tensor": "w.scale.scale"}
    assert described.added["w.scale.scale"].dtype == np.float16 and described.added["w.scale.scale"].shape == (2, 2)


def test_mxfp4_exponent_255_uses_ggml_table(tmp_path: Path) -> None:
    """ggml reads E8M0 255 as 2^127 (qformat's e8m0fnu: NaN): the nested table keeps it exact."""
    rng = np.random.default_rng(7)
    raw = quant_data(T.MXFP4, (3, 64), rng)
    blocks = raw.reshape(-1, 17)
    blocks[2, 0] = 255
    blocks[3, 0] = 255
    blocks[3, 1:] = np.arange(16, dtype=np.uint8) * 17  # every code, both nibbles
    expected = oracle(raw, T.MXFP4, (3, 64))
    assert np.isfinite(expected[1, :32]).any() and np.isinf(expected[1, 32:]).any()  # 2^127 * 12 overflows
    src = write_gguf(tmp_path / "m.gguf", [("x", raw, T.MXFP4)])
    paths = assert_converts(src, {"x": expected}, tmp_path, in_place=False)
    desc = json.loads(read_header(paths["in_place"]).metadata["qformat"])["tensors"]["x"]
    assert desc["scale"]["encoded"]["codes"]["element"]["table_tensor"] == "x.scale.table"


def test_mxfp4_code_8_is_positive_zero(tmp_path: Path) -> None:
    """gguf-py decodes code 8 (E2M1 -0) as +0.0; the converted file must too (sign bit included)."""
    raw = np.zeros((1, 17), np.uint8)
    raw[0, 0] = 127
    raw[0, 1:] = 0x88
    expected = oracle(raw, T.MXFP4, (1, 32))
    assert not np.signbit(expected).any()
    src = write_gguf(tmp_path / "m.gguf", [("z", raw, T.MXFP4)])
    assert_converts(src, {"z": expected}, tmp_path, in_place=False)


@pytest.mark.parametrize("qt", [T.Q4_1, T.Q4_K], ids=lambda t: t.name)
def test_nonfinite_scales_decode_like_gguf_py(qt: T, tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    bs, ts = gguf.GGML_QUANT_SIZES[qt]
    raw = quant_data(qt, (2, 2 * bs), rng, edges=False)
    blocks = raw.reshape(-1, ts)
    blocks[0, 0:2] = np.array([0x7C00], np.uint16).view(np.uint8)  # d = +Inf
    blocks[1, 2:4] = np.array([0x7E00], np.uint16).view(np.uint8)  # m / dmin = NaN
    expected = oracle(raw, qt, (2, 2 * bs))
    assert np.isnan(expected).any()
    src = write_gguf(tmp_path / "m.gguf", [("w", raw, qt)])
    paths = assert_converts(src, {"w": expected}, tmp_path, in_place=False)
    desc = json.loads(read_header(paths["repack"]).metadata["qformat"])["tensors"]["w"]
    assert desc["allow_nonfinite_params"] is True


# -- plain tensors -------------------------------------------------------------------------------
def test_plain_tensors(tmp_path: Path) -> None:
    """F32/F16/BF16 (and F64, I32) stay plain in their dtype; their float32 widening is gguf-py's."""
    import ml_dtypes

    rng = np.random.default_rng(5)
    f32 = rng.standard_normal((3, 5)).astype(np.float32)
    f16 = rng.standard_normal((2, 3, 4)).astype(np.float16)
    bf_raw = np.ascontiguousarray(quantize(rng.standard_normal((5, 6)).astype(np.float32), T.BF16))
    f64 = rng.standard_normal(7)
    i32 = rng.integers(-(2**31), 2**31, (3, 2), dtype=np.int32)
    src = write_gguf(tmp_path / "m.gguf", [("a", f32, None), ("b", f16, None), ("c", bf_raw, T.BF16), ("d", f64, None), ("e", i32, None)])
    bf = bf_raw.view(ml_dtypes.bfloat16).reshape(5, 6)
    expected = {"a": f32, "b": f16, "c": bf, "d": f64, "e": i32}
    assert_converts(src, expected, tmp_path, detect_as="gguf", in_place=False)
    got = qformat.load_file(tmp_path / "out-repack.safetensors")
    for name, qt, raw in (("b", T.F16, f16), ("c", T.BF16, bf_raw)):
        want = np.asarray(dequantize(np.ascontiguousarray(raw), qt), np.float32).reshape(got[name].shape)
        assert np.array_equal(got[name].astype(np.float32).view(np.uint32), want.view(np.uint32))


# -- metadata ------------------------------------------------------------------------------------
def test_metadata_kept(tmp_path: Path) -> None:
    """Every KV pair lands in __metadata__["gguf"]; a huge array gets its own gguf.kv.* member."""
    tokens = [f"tok{i}\u00e9" for i in range(8000)]  # > 64 KiB of JSON
    assert len(json.dumps(tokens)) > MAX_INLINE_VALUE_BYTES
    kv = [
        lambda w: w.add_uint8("t.u8", 255), lambda w: w.add_int8("t.i8", -128),
        lambda w: w.add_uint16("t.u16", 65535), lambda w: w.add_int16("t.i16", -32768),
        lambda w: w.add_uint32("t.u32", 2**32 - 1), lambda w: w.add_int32("t.i32", -(2**31)),
        lambda w: w.add_float32("t.f32", 0.1), lambda w: w.add_bool("t.bool", True),
        lambda w: w.add_string("t.str", "h\u00e9llo \"q\""), lambda w: w.add_uint64("t.u64", 2**64 - 1),
        lambda w: w.add_int64("t.i64", -(2**63)), lambda w: w.add_float64("t.f64", -1e300),
        lambda w: w.add_float32("t.inf", float("inf")),
        lambda w: w.add_array("t.arr_i32", [1, -2, 3]),
        lambda w: w.add_key_value("t.arr_u16", [1, 2, 65535], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.UINT16),
        lambda w: w.add_array("t.arr_f32", [0.5, 1e-30]),
        lambda w: w.add_array("t.arr_str", ["a", "", "c"]),
        lambda w: w.add_array("t.nested", [[1, 2], [3]]),
        lambda w: w.add_array("tokenizer.ggml.tokens", tokens),
    ]
    raw = quant_data(T.Q8_0, (2, 32), np.random.default_rng(0))
    src = write_gguf(tmp_path / "m.gguf", [("w", raw, T.Q8_0)], kv=kv, alignment=64)
    paths = assert_converts(src, {"w": oracle(raw, T.Q8_0, (2, 32))}, tmp_path, in_place=False)
    meta = json.loads(read_header(paths["in_place"]).metadata["gguf"])
    assert meta["version"] == 3 and meta["alignment"] == 64
    assert meta["tensors"] == [["w", "Q8_0", [2, 32]]]
    got = meta["kv"]
    reader = gguf.GGUFReader(str(src))  # the oracle for every scalar and flat array
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("t.nested", "tokenizer.ggml.tokens", "t.inf"):
            continue
        want = field.contents()
        assert got[key]["type"] == ("array" if isinstance(want, list) else gguf.GGUFValueType(field.types[0]).name.lower()), key
        assert got[key]["value"] == want, key
    assert got["t.arr_u16"]["element_type"] == "uint16" and got["t.arr_str"]["element_type"] == "string"
    assert got["t.inf"] == {"type": "float32", "value": "inf"}
    assert got["t.nested"] == {"type": "array", "element_type": "array", "value": [
        {"type": "array", "element_type": "int32", "value": [1, 2]}, {"type": "array", "element_type": "int32", "value": [3]}]}
    stub = got["tokenizer.ggml.tokens"]
    assert stub == {"type": "array", "element_type": "string", "length": len(tokens), "metadata": "gguf.kv.tokenizer.ggml.tokens",
                    "bytes": stub["bytes"]}
    member = read_header(paths["in_place"]).metadata["gguf.kv.tokenizer.ggml.tokens"]
    assert stub["bytes"] == len(member.encode("utf-8"))
    moved = json.loads(member)
    assert moved["type"] == "array" and moved["value"] == reader.fields["tokenizer.ggml.tokens"].contents()
    assert set(qformat.load_file(paths["in_place"])) == {"w"}  # the model's tensors, nothing else


def test_metadata_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Key/values that would take more header than MAX_METADATA_BYTES are refused, naming the
    largest, and nothing is written (the bound is lowered here instead of writing 64 MiB)."""
    import qformat.convert.gguf as cg

    tokens = [f"tok{i}" for i in range(20000)]
    src = write_gguf(tmp_path / "m.gguf", [("w", np.ones(32, np.float32), None)], kv=[lambda w: w.add_array("tokenizer.ggml.tokens", tokens)])
    need = sum(cg.header_bytes(k, t) for k, t in cg._metadata(cg.GGUFFile(str(src))).items())
    assert need > cg.MAX_INLINE_VALUE_BYTES
    monkeypatch.setattr(cg, "MAX_METADATA_BYTES", need - 1)
    with pytest.raises(QFormatError) as e:
        qformat.convert.convert(src, tmp_path / "o.safetensors")
    assert e.value.code == "CONVERT_UNSUPPORTED" and "gguf.kv.tokenizer.ggml.tokens" in str(e.value)
    assert not (tmp_path / "o.safetensors").exists()
    monkeypatch.setattr(cg, "MAX_METADATA_BYTES", need)
    qformat.convert.convert(src, tmp_path / "o.safetensors")
    header = read_header(tmp_path / "o.safetensors")
    members = {k: v for k, v in header.metadata.items() if k.startswith("gguf")}
    assert sum(cg.header_bytes(k, v) for k, v in members.items()) == need
    raw = (tmp_path / "o.safetensors").read_bytes()
    raw = raw[8 : 8 + struct.unpack("<Q", raw[:8])[0]]
    for k, v in members.items():  # header_bytes counts each member as the header holds it
        assert (json.dumps(k, ensure_ascii=False) + ":" + json.dumps(v, ensure_ascii=False)).encode("utf-8") in raw


def test_metadata_bound_leaves_room_in_the_header() -> None:
    """The bound leaves over a third of safetensors' 100 MB header to the tensor index and descriptors."""
    from qformat import tables
    from qformat.convert.gguf import MAX_METADATA_BYTES

    assert MAX_METADATA_BYTES <= tables.limits()["max_header_bytes"] * 2 // 3


# -- unsupported and hostile files ---------------------------------------------------------------
def _s(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def _tinfo(name: bytes, dims: list[int], t: int, off: int) -> bytes:
    return _s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", t, off)


def _file(n_t: int, n_kv: int, body: bytes, data: bytes = b"", version: bytes = struct.pack("<I", 3)) -> bytes:
    head = b"GGUF" + version + struct.pack("<QQ", n_t, n_kv) + body
    return head + b"\0" * (-len(head) % 32) + data


F32_1x8 = _tinfo(b"w", [8], 0, 0)
HOSTILE = {
    "bad magic": (b"GGML" + _file(0, 0, b"")[4:], "CONVERT_SOURCE_INVALID", "header.magic"),
    "too short": (b"GGUF\3\0\0\0", "CONVERT_SOURCE_INVALID", "header"),
    "tensor_count 2^60": (_file(2**60, 0, b""), "CONVERT_SOURCE_INVALID", "header.tensor_count"),
    "kv_count 2^60": (_file(0, 2**60, b""), "CONVERT_SOURCE_INVALID", "header.kv_count"),
    "key length past end": (_file(0, 1, struct.pack("<Q", 2**40) + b"abc"), "CONVERT_SOURCE_INVALID", "kv[0].key"),
    "string value past end": (_file(0, 1, _s(b"k") + struct.pack("<IQ", 8, 2**50) + b"x" * 16), "CONVERT_SOURCE_INVALID", "kv[k]"),
    "array count 2^62": (_file(0, 1, _s(b"k") + struct.pack("<IIQ", 9, 4, 2**62) + b"\0" * 16), "CONVERT_SOURCE_INVALID", "kv[k].count"),
    "string array count 2^61": (_file(0, 1, _s(b"k") + struct.pack("<IIQ", 9, 8, 2**61) + b"\0" * 16), "CONVERT_SOURCE_INVALID", "kv[k].count"),
    "value type 13": (_file(0, 1, _s(b"k") + struct.pack("<I", 13) + b"\0" * 8), "CONVERT_SOURCE_INVALID", "kv[k]"),
    "bool 2": (_file(0, 1, _s(b"k") + struct.pack("<IB", 7, 2) + b"\0" * 8), "CONVERT_SOURCE_INVALID", "kv[k]"),
    "arrays nested 9 deep": (_file(0, 1, _s(b"k") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 9 + struct.pack("<IQ", 0, 0)), "CONVERT_SOURCE_INVALID", "kv[k]"),
    "duplicate key": (_file(0, 2, (_s(b"k") + struct.pack("<II", 4, 1)) * 2), "CONVERT_SOURCE_INVALID", "kv[1].key"),
    "key not UTF-8": (_file(0, 1, _s(b"\xff") + struct.pack("<II", 4, 1)), "CONVERT_SOURCE_INVALID", "kv[0].key"),
    "alignment 48": (_file(0, 1, _s(b"general.alignment") + struct.pack("<II", 4, 48)), "CONVERT_SOURCE_INVALID", "kv[general.alignment]"),
    "alignment as uint64": (_file(0, 1, _s(b"general.alignment") + struct.pack("<IQ", 10, 32)), "CONVERT_SOURCE_INVALID", "kv[general.alignment]"),
    "offset not aligned": (_file(1, 0, _tinfo(b"w", [8], 0, 4), b"\0" * 64), "CONVERT_SOURCE_INVALID", "tensor_info[w].offset"),
    "data past end": (_file(1, 0, _tinfo(b"w", [64], 0, 0), b"\0" * 32), "CONVERT_SOURCE_INVALID", "tensor_info[w].offset"),
    "dims product overflows": (_file(1, 0, _tinfo(b"w", [2**32, 2**32, 2**32, 2**32], 0, 0), b"\0" * 32), "CONVERT_SOURCE_INVALID", "tensor_info[w].offset"),
    "dim 2^63": (_file(1, 0, _tinfo(b"w", [2**63, 1], 0, 0), b"\0" * 32), "CONVERT_SOURCE_INVALID", "tensor_info[w].dims"),
    "n_dims 5": (_file(1, 0, _tinfo(b"w", [1, 1, 1, 1, 8], 0, 0), b"\0" * 32), "CONVERT_SOURCE_INVALID", "tensor_info[w].n_dims"),
    "n_dims 2^31": (_file(1, 0, _s(b"w") + struct.pack("<I", 2**31) + b"\0" * 40), "CONVERT_SOURCE_INVALID", "tensor_info[w].n_dims"),
    "row not whole blocks": (_file(1, 0, _tinfo(b"w", [33, 1], 2, 0), b"\0" * 64), "CONVERT_SOURCE_INVALID", "tensor_info[w].dims"),
    "duplicate tensor": (_file(2, 0, F32_1x8 + F32_1x8, b"\0" * 32), "CONVERT_SOURCE_INVALID", "tensor_info[w].name"),
    # 200 infos naming one 1 MB region wrote 200 MB from a 1 MB file before the check
    "tensors share bytes": (_file(2, 0, _tinfo(b"a", [8], 0, 0) + _tinfo(b"b", [16], 0, 0), b"\0" * 64), "CONVERT_SOURCE_INVALID", "tensor_info[b].offset"),
    "tensors overlap in part": (_file(2, 0, _tinfo(b"a", [16], 0, 0) + _tinfo(b"b", [8], 0, 32), b"\0" * 64), "CONVERT_SOURCE_INVALID", "tensor_info[b].offset"),
    "tensor infos truncated": (_file(1, 0, F32_1x8)[:50], "CONVERT_SOURCE_INVALID", "tensor_info"),
    "big-endian": (_file(0, 0, b"", version=struct.pack(">I", 3)), "CONVERT_UNSUPPORTED", "header.version"),
    "version 1": (_file(0, 0, b"", version=struct.pack("<I", 1)), "CONVERT_UNSUPPORTED", "header.version"),
    "version 4": (_file(0, 0, b"", version=struct.pack("<I", 4)), "CONVERT_UNSUPPORTED", "header.version"),
    "ggml type 99": (_file(1, 0, _tinfo(b"w", [8], 99, 0), b"\0" * 32), "CONVERT_UNSUPPORTED", "tensor_info[w].type"),
}


def _refused(path: Path, code: str, field_start: str) -> QFormatError:
    tracemalloc.start()
    try:
        with pytest.raises(QFormatError) as ei:
            describe(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    e = ei.value
    assert e.code == code, str(e)
    assert (e.field or "").startswith(field_start), (e.field, str(e))
    assert peak < 1 << 20, f"refusing allocated {peak} bytes"
    return e


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_header_refused_cleanly(case: str, tmp_path: Path) -> None:
    data, code, field = HOSTILE[case]
    p = tmp_path / "bad.gguf"
    p.write_bytes(data)
    e = _refused(p, code, field)
    assert "expected" in e.message, e.message


def test_truncated_real_file_refused(tmp_path: Path) -> None:
    raw = quant_data(T.Q4_0, (2, 64), np.random.default_rng(0))
    good = write_gguf(tmp_path / "m.gguf", [("w", raw, T.Q4_0)], kv=[lambda w: w.add_string("s", "abc")]).read_bytes()
    end = len(good) - (-raw.nbytes % 32)  # gguf-py pads the last tensor to the alignment; cut before that
    for cut in (23, 30, 60, end - raw.nbytes - 1, end - 1):
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(good[:cut])
        e = _refused(p, "CONVERT_SOURCE_INVALID", "")
        assert "expected" in e.message, e.message


def test_unsupported_type_named(tmp_path: Path) -> None:
    raw = np.zeros((1, 40), np.uint8)  # one Q8_1 block (gguf-py's size), the one type still refused
    src = write_gguf(tmp_path / "m.gguf", [("w", raw, T.Q8_1)])
    with pytest.raises(QFormatError) as ei:
        describe(src)
    assert ei.value.code == "CONVERT_UNSUPPORTED" and "Q8_1" in ei.value.message and ei.value.tensor == "w"


def test_component_name_collision_refused(tmp_path: Path) -> None:
    """A GGUF tensor named like another tensor's component (``w.codes``) cannot be written."""
    raw = quant_data(T.Q4_0, (1, 32), np.random.default_rng(0), edges=False)
    src = write_gguf(tmp_path / "m.gguf", [("w", raw, T.Q4_0), ("w.codes", np.zeros(4, np.float32), None)])
    with pytest.raises(QFormatError) as ei:
        describe(src)
    assert ei.value.code == "CONVERT_UNSUPPORTED" and "w.codes" in ei.value.message
