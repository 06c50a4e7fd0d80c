"""Error paths: every stable error code in tables/errors.json has at least one test.

Each case builds a bad input (usually the bytes of a whole file, built by tests/filebuild.py
without qformat's writer) and names the call that must fail.  The test asserts the exact
``.code`` and the category subclass of the raised :class:`qformat.errors.QFormatError`, and,
for file-level codes, that ``qformat.check(path)`` reports a problem with that code.  The last
test of the table section fails when a code is added to tables/errors.json without a case here.

Further sections: hostile inputs (huge claimed sizes, deep nesting, byte fuzzing), atomic
writes, and a scan of qformat/ for dangerous dynamic-code calls.
"""

from __future__ import annotations

import copy
import io
import json
import os
import struct
import time
import tokenize
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qformat
from qformat import tables
from qformat.export import export as export_checkpoint
from qformat.errors import InvalidFileError, MalformedFileError, QFormatError, UnsupportedError, UsageError

from .strategies import json_paths
from .filebuild import (
    build_file,
    codebook_tensor,
    int4_expected,
    int4_tensor,
    pack,
    packing,
    qformat_object,
    raw_file,
    valid_file,
)

CATEGORY = {"malformed": MalformedFileError, "invalid": InvalidFileError,
            "unsupported": UnsupportedError, "usage": UsageError}
ALL_CODES = set(tables.errors())


def assert_error(exc: BaseException, code: str) -> None:
    """``exc`` is a QFormatError with exactly ``code`` and the subclass of its category."""
    assert isinstance(exc, QFormatError), f"expected QFormatError {code}, got {type(exc).__name__}: {exc}"
    assert exc.code == code, f"expected {code}, got {exc.code}: {exc}"
    cat = tables.errors()[code]["category"]
    assert isinstance(exc, CATEGORY[cat]), f"{code} should be a {CATEGORY[cat].__name__}, is {type(exc).__name__}"
    assert exc.category == cat
    assert str(exc).startswith(f"[{code}]")


def raises_code(code: str, fn: Callable[[], Any]) -> QFormatError:
    with pytest.raises(QFormatError) as ei:
        fn()
    assert_error(ei.value, code)
    return ei.value


def _sha(b: Any) -> str:
    import hashlib

    return hashlib.sha256(bytes(b)).hexdigest()


def check_codes(path: Path | str) -> list[str]:
    rep = qformat.check(path, digests=True)
    codes = [p.code for p in rep.problems]
    assert rep.ok == (not codes)
    assert set(codes) <= ALL_CODES
    return codes


# ==========================================================================================
# Builders
# ==========================================================================================
ENT = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
DATA8 = np.arange(2, dtype=np.float32).tobytes()


def hdr(text: str | bytes, data: bytes = DATA8, **kw: Any) -> Callable[[], bytes]:
    """A file from raw header text (padded with spaces unless pad=False) and data."""
    return lambda: raw_file(text, data, **kw)


def ent(**changes: Any) -> str:
    """A tensor entry 't' (F32 [2] at [0, 8]) with fields changed, as header text."""
    e = dict(ENT, **changes)
    return json.dumps({"t": e})


def setf(path: str, value: Any, t: str = "w") -> Callable[[dict, dict], None]:
    """Edit: set a dotted field of descriptor ``t``."""
    def edit(descs: dict, tensors: dict) -> None:
        *head, last = path.split(".")
        d = descs[t]
        for k in head:
            d = d[k]
        d[last] = copy.deepcopy(value)
    return edit


def delf(path: str, t: str = "w") -> Callable[[dict, dict], None]:
    def edit(descs: dict, tensors: dict) -> None:
        *head, last = path.split(".")
        d = descs[t]
        for k in head:
            d = d[k]
        del d[last]
    return edit


def put(name: str, value: Any) -> Callable[[dict, dict], None]:
    """Edit: set (or, with None, remove) a stored tensor."""
    def edit(descs: dict, tensors: dict) -> None:
        if value is None:
            tensors.pop(name)
        else:
            tensors[name] = value() if callable(value) else value
    return edit


def add_tensor(name: str, seed: int = 1, **kw: Any) -> Callable[[dict, dict], None]:
    """Edit: add a second valid int4 logical tensor ``name``."""
    def edit(descs: dict, tensors: dict) -> None:
        d, c = int4_tensor(name, seed=seed, **kw)
        descs[name] = d
        tensors.update(c)
    return edit


def wfile(*edits: Callable[[dict, dict], None], version: Any = "1.0", top: dict | None = None,
          shape: tuple[int, int] = (4, 8), group: int = 4, qjson: Callable[[str], str] | None = None) -> bytes:
    """The int4 tensor "w" plus a plain "b", with edits applied to descriptors/tensors;
    ``qjson`` rewrites the compact qformat JSON text (for things a dict cannot hold)."""
    desc, comps = int4_tensor("w", shape, group)
    tensors: dict[str, Any] = dict(comps)
    tensors["b"] = np.arange(3, dtype=np.float32)
    descs = {"w": desc}
    for e in edits:
        e(descs, tensors)
    text = json.dumps(qformat_object(descs, version, **(top or {})), separators=(",", ":"))
    if qjson is not None:
        new = qjson(text)
        assert new != text, "the qjson rewrite did not apply"
        text = new
    return build_file(tensors, qformat=text)


def W(*edits: Callable[[dict, dict], None], **kw: Any) -> Callable[[], bytes]:
    return lambda: wfile(*edits, **kw)


def qtext(text: str) -> Callable[[], bytes]:
    """A file whose __metadata__["qformat"] is ``text`` verbatim (plus a plain tensor)."""
    return lambda: build_file({"b": np.ones(2, np.float32)}, qformat=text)


def encoded_scale(prefix: str, shape: tuple[int, int], levels: int) -> tuple[dict, dict]:
    """A descriptor of ``shape`` (8-bit codes, all 2) whose per-tensor scale is encoded again,
    ``levels`` descriptors deep in all; the innermost scale is a plain F32 0.5.  Its values are
    2 ** (levels - 1)."""
    pk = packing(8, "lsb_first", 1)
    d: dict[str, Any] = {"shape": list(shape), "dtype": "float32",
                         "codes": {"tensor": f"{prefix}.codes", "element": {"type": "int", "bits": 8, "signedness": "unsigned"},
                                   "packing": pk}}
    comps: dict[str, Any] = {f"{prefix}.codes": np.full(shape, 2, np.uint8)}
    blocks = {"type": "grid", "size": [None, None]}
    if levels <= 1:
        d["scale"] = {"blocks": blocks, "op": "multiply", "tensor": f"{prefix}.s"}
        comps[f"{prefix}.s"] = np.array([0.5], np.float32)
    else:
        sub, subc = encoded_scale(prefix + ".e", (1, 1), levels - 1)
        d["scale"] = {"blocks": blocks, "op": "multiply", "encoded": sub}
        comps.update(subc)
    return d, comps


def nested(levels: int, shape: tuple[int, int] | None = None) -> Callable[[dict, dict], None]:
    """Edit: replace w's plain scale by an encoded one ``levels`` deep (depth = levels)."""
    def edit(descs: dict, tensors: dict) -> None:
        d, c = encoded_scale("w.se", shape or (4, 2), levels)
        descs["w"]["scale"] = {"blocks": {"type": "grid", "size": [1, 4]}, "op": "multiply", "encoded": d}
        tensors.pop("w.scale")
        tensors.update(c)
    return edit


def gidx(values: list[int], dtype: Any = np.int32) -> Callable[[dict, dict], None]:
    """Edit: w's scale indexed by a group index (count 2) along axis 1, no zero point."""
    def edit(descs: dict, tensors: dict) -> None:
        d = descs["w"]
        del d["zero"]
        tensors.pop("w.zero")
        d["scale"] = {"blocks": {"type": "grid", "size": [1, None], "index": {"axis": 1, "tensor": "w.g_idx", "count": 2}},
                      "op": "multiply", "tensor": "w.scale"}
        tensors["w.g_idx"] = np.array(values, dtype)
    return edit


def codes_padded(row_alignment: int, bad: bool) -> Callable[[dict, dict], None]:
    """Edit: w's rows aligned to ``row_alignment`` words (extra zero words, one set if bad)."""
    def edit(descs: dict, tensors: dict) -> None:
        descs["w"]["codes"]["packing"]["row_alignment"] = row_alignment
        old = tensors["w.codes"]
        wpr = -(-old.shape[1] // row_alignment) * row_alignment
        new = np.zeros((old.shape[0], wpr), np.uint8)
        new[:, : old.shape[1]] = old
        if bad:
            new[1, -1] = 0x10
        tensors["w.codes"] = new
    return edit


def set_word(name: str, index: tuple[int, ...], mask: int) -> Callable[[dict, dict], None]:
    def edit(descs: dict, tensors: dict) -> None:
        a = tensors[name].copy()
        a[index] |= mask
        tensors[name] = a
    return edit


def set_word_f(name: str, index: tuple[int, ...], value: float) -> Callable[[dict, dict], None]:
    """Edit: set one element of a float tensor."""
    def edit(descs: dict, tensors: dict) -> None:
        a = tensors[name].copy()
        a[index] = value
        tensors[name] = a
    return edit


def set_word_u8(name: str, index: tuple[int, ...], byte: int) -> Callable[[dict, dict], None]:
    """Edit: set the raw byte of one element of an 8-bit tensor (any 8-bit dtype)."""
    def edit(descs: dict, tensors: dict) -> None:
        a = tensors[name].copy()
        a.view(np.uint8)[index] = byte
        tensors[name] = a
    return edit


def cb_file(codes: list[int], table_len: int = 10, bits: int = 4, pad_mask: int = 0) -> Callable[[], bytes]:
    """A codebook tensor "c" (axis null, one stream); ``pad_mask`` is OR-ed into the last byte."""
    def make() -> bytes:
        d, c = codebook_tensor("c", n=len(codes), table_len=table_len, bits=bits, codes=codes)
        c["c.codes"] = c["c.codes"].copy()
        c["c.codes"][-1] |= pad_mask
        return build_file(c, qformat=qformat_object({"c": d}))
    return make


def named_cb_file(table: str, bits: int, codes: list[int]) -> Callable[[], bytes]:
    def make() -> bytes:
        pk = packing(8, "lsb_first", None)
        d = {"shape": [len(codes)], "dtype": "float32",
             "codes": {"tensor": "c.codes", "element": {"type": "codebook", "bits": bits, "table": table}, "packing": pk}}
        return build_file({"c.codes": pack(np.array(codes), bits, pk).astype(np.uint8)}, qformat=qformat_object({"c": d}))
    return make


def deep(n: int) -> str:
    return "[" * n + "]" * n


def q_with_depth(depth: int) -> str:
    """A valid qformat object (an ignorable extension's configuration nests) of JSON depth ``depth``."""
    k = depth - 3  # the object, its extensions array and the extension object hold the configuration
    return ('{"version":"1.0","tensors":{},"extensions":[{"name":"org.example.deep","must_understand":false,"configuration":'
            + '{"a":' * (k - 1) + "{}" + "}" * (k - 1) + "}]}")


# ==========================================================================================
# File-level cases: code -> bytes of a bad file
# ==========================================================================================
@dataclass(frozen=True)
class FileCase:
    code: str
    make: Callable[[], bytes]
    #: What load_file does: "raises" the code; "ok" (decoders must decode it, e.g. padding);
    #: "any" (a payload rule only checkers must verify: either decodes or raises the code).
    load: str = "raises"
    #: Other codes check() may report besides ``code`` (by default: none).
    also: frozenset[str] = frozenset()


def C(code: str, id: str, make: Callable[[], bytes], load: str = "raises", bug: str | None = None,
      also: tuple[str, ...] = ()) -> Any:
    marks = [pytest.mark.xfail(strict=True, reason=f"BUG: {bug}")] if bug else []
    return pytest.param(FileCase(code, make, load, frozenset(also)), id=f"{code}-{id}", marks=marks)


def device_w(layout: str, params: dict | None = None, shape: tuple[int, int] = (64, 128), bits: int = 4,
             group: int | None = 32, mutate: Callable[[dict, dict], None] | None = None) -> Callable[[dict, dict], None]:
    """Edit: replace "w" by a valid tensor in a 1.1 device layout (SPEC.md §11), then ``mutate``
    its (descriptor, components)."""
    def edit(descs: dict, tensors: dict) -> None:
        from qformat.layouts import to_layout

        for k in [k for k in tensors if k.startswith("w.")]:
            tensors.pop(k)
        w = np.random.default_rng(3).normal(size=shape).astype(np.float32)
        qt = qformat.quantize(w, "int", bits=bits, group_size=group, symmetric=True, dtype="bfloat16")
        qt = qt.renamed(lambda c: "w." + c)
        d, c = to_layout(qt.descriptor, qt.components, layout, params)
        if mutate is not None:
            mutate(d, c)
        descs["w"] = d
        tensors.update(c)
    return edit


def _set(path: str, value: Any) -> Callable[[dict, dict], None]:
    def m(d: dict, c: dict) -> None:
        *head, last = path.split(".")
        for k in head:
            d = d[k]
        d[last] = value
    return m


_BIG = struct.pack("<Q", 100_000_001)
_TWO = json.dumps({"t": ENT, "u": dict(ENT, data_offsets=[8, 16])})

FILE_CASES = [
    # -- the safetensors container -------------------------------------------------------
    C("HEADER_TOO_SMALL", "empty", lambda: b""),
    C("HEADER_TOO_SMALL", "7-bytes", lambda: b"\x02\x00\x00\x00\x00\x00\x00"),
    C("HEADER_TOO_LARGE", "just-over-limit", lambda: _BIG + b"{}      "),
    C("NOT_SAFETENSORS", "a-readme", lambda: b"# A model\n\nSee the paper.\n"),
    C("NOT_SAFETENSORS", "a-zip", lambda: b"PK\x03\x04\x14\x00\x00\x00" + bytes(64)),
    C("HEADER_TOO_LARGE", "u64-max", lambda: b"\xff" * 8 + b"{}"),
    C("HEADER_LENGTH_INVALID", "zero", lambda: struct.pack("<Q", 0) + b"{}"),
    C("HEADER_LENGTH_INVALID", "past-end", hdr("{}", b"", length=1000)),
    C("HEADER_LENGTH_INVALID", "one-past-end", lambda: struct.pack("<Q", 9) + b"{}      "),
    C("HEADER_NOT_UTF8", "0xff", hdr(b'{"\xff":1}', b"")),
    C("HEADER_NOT_UTF8", "surrogate", hdr(b'{"\xed\xa0\x80":1}', b"")),
    C("HEADER_NOT_UTF8", "overlong", hdr(b'{"\xc0\xaf":1}', b"")),
    C("HEADER_NOT_UTF8", "cut-sequence", hdr(b'{"t":1}\xe2\x82', b"", pad=False)),
    C("HEADER_INVALID_JSON", "leading-vertical-tab", hdr("\x0b" + ent())),
    C("HEADER_INVALID_JSON", "leading-nbsp", hdr("\u00a0" + ent())),
    C("HEADER_INVALID_JSON", "leading-nul", hdr("\x00" + ent())),
    C("HEADER_INVALID_JSON", "lone-surrogate", hdr('{"__metadata__":{"a":"\\ud800"},"t":%s}' % json.dumps(ENT))),
    C("HEADER_INVALID_JSON", "lone-surrogate-in-name", hdr('{"\\udfff":%s}' % json.dumps(ENT))),
    C("HEADER_INVALID_JSON", "depth-65", hdr('{"__metadata__":{"a":' + deep(63) + "}}", b"")),
    C("HEADER_INVALID_JSON", "syntax", hdr('{"t":}')),
    C("HEADER_INVALID_JSON", "unterminated", hdr('{"t":{"dtype":"F32"')),
    C("HEADER_INVALID_JSON", "nul-padding", hdr(ent().encode() + b"\x00" * 8, pad=False)),
    C("HEADER_INVALID_JSON", "vertical-tab-padding", hdr(ent().encode() + b"\x0b", pad=False)),
    C("HEADER_INVALID_JSON", "text-after-newline-padding", hdr(ent().encode() + b"\n  x    ", pad=False)),
    C("HEADER_INVALID_JSON", "bom", hdr("\ufeff" + ent())),
    C("HEADER_INVALID_JSON", "trailing-text", hdr(ent() + " x")),
    C("HEADER_INVALID_JSON", "two-objects", hdr(ent() + "{}")),
    C("HEADER_INVALID_JSON", "array", hdr("[]", b"")),
    C("HEADER_INVALID_JSON", "string", hdr('"x"', b"")),
    C("HEADER_INVALID_JSON", "nan", hdr('{"t":{"dtype":"F32","shape":[NaN],"data_offsets":[0,8]}}')),
    C("HEADER_INVALID_JSON", "infinity", hdr('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,Infinity]}}')),
    C("HEADER_INVALID_JSON", "minus-infinity", hdr('{"__metadata__":{"a":"b"},"x":-Infinity}')),
    C("HEADER_INVALID_JSON", "single-quotes", hdr("{'t':1}")),
    C("HEADER_INVALID_JSON", "deep-nesting", hdr('{"x":' + deep(10_000) + "}", b"")),
    C("HEADER_DUPLICATE_KEY", "tensor-name", hdr('{"t":%s,"t":%s}' % (json.dumps(ENT), json.dumps(ENT)))),
    C("HEADER_DUPLICATE_KEY", "in-metadata", hdr('{"__metadata__":{"a":"1","a":"2"},"t":%s}' % json.dumps(ENT))),
    C("HEADER_DUPLICATE_KEY", "metadata-twice", hdr('{"__metadata__":{},"__metadata__":{},"t":%s}' % json.dumps(ENT))),
    C("HEADER_DUPLICATE_KEY", "in-entry", hdr('{"t":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}')),
    C("TENSOR_ENTRY_INVALID", "extra-field", hdr(ent(extra=1))),
    C("TENSOR_ENTRY_INVALID", "missing-offsets", hdr(json.dumps({"t": {"dtype": "F32", "shape": [2]}}))),
    C("TENSOR_ENTRY_INVALID", "not-object", hdr(json.dumps({"t": [1, 2]}))),
    C("TENSOR_ENTRY_INVALID", "dtype-number", hdr(ent(dtype=32))),
    C("TENSOR_ENTRY_INVALID", "shape-string", hdr(ent(shape="2"))),
    C("TENSOR_ENTRY_INVALID", "shape-float", hdr(ent(shape=[2.0]))),
    C("TENSOR_ENTRY_INVALID", "shape-bool", hdr(ent(shape=[True, 2]))),
    C("TENSOR_ENTRY_INVALID", "shape-negative", hdr(ent(shape=[-2]))),
    C("TENSOR_ENTRY_INVALID", "offsets-one", hdr(ent(data_offsets=[0]))),
    C("TENSOR_ENTRY_INVALID", "offsets-three", hdr(ent(data_offsets=[0, 8, 8]))),
    C("TENSOR_ENTRY_INVALID", "offsets-negative", hdr(ent(data_offsets=[-8, 0]))),
    C("TENSOR_ENTRY_INVALID", "offsets-null", hdr(ent(data_offsets=None))),
    C("TENSOR_ENTRY_INVALID", "rank-65", hdr(ent(shape=[1] * 64 + [2]))),
    C("DTYPE_UNKNOWN", "F128", hdr(ent(dtype="F128"))),
    C("DTYPE_UNKNOWN", "lower-case", hdr(ent(dtype="f32"))),
    C("DTYPE_UNKNOWN", "gguf-name", hdr(ent(dtype="Q4_0"))),
    C("METADATA_INVALID", "int-value", hdr(json.dumps({"__metadata__": {"a": 1}, "t": ENT}))),
    C("METADATA_INVALID", "null-value", hdr(json.dumps({"__metadata__": {"a": None}, "t": ENT}))),
    C("METADATA_INVALID", "object-value", hdr(json.dumps({"__metadata__": {"a": {"b": "c"}}, "t": ENT}))),
    C("METADATA_INVALID", "list", hdr(json.dumps({"__metadata__": ["a"], "t": ENT}))),
    C("METADATA_INVALID", "string", hdr(json.dumps({"__metadata__": "a", "t": ENT}))),
    C("SIZE_OVERFLOW", "count-2^64", hdr(ent(shape=[2**32, 2**32], data_offsets=[0, 8]))),
    C("SIZE_OVERFLOW", "bits-2^67", hdr(ent(shape=[2**62], data_offsets=[0, 8]))),
    C("SIZE_OVERFLOW", "huge-dim", hdr(ent(shape=[10**30], data_offsets=[0, 8]))),
    C("SIZE_OVERFLOW", "5000-digit-dim", hdr('{"t":{"dtype":"F32","shape":[' + "9" * 5000 + '],"data_offsets":[0,8]}}')),
    C("SIZE_OVERFLOW", "after-zero-dim-is-fine-but-not-this", hdr(ent(shape=[2**40, 2**40, 2**40], data_offsets=[0, 8]))),
    C("SUB_BYTE_MISALIGNED", "F4-odd", hdr(json.dumps({"t": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}), b"\0\0")),
    C("SUB_BYTE_MISALIGNED", "F4-1x3", hdr(json.dumps({"t": {"dtype": "F4", "shape": [1, 3], "data_offsets": [0, 1]}}), b"\0")),
    C("SUB_BYTE_MISALIGNED", "F6-1", hdr(json.dumps({"t": {"dtype": "F6_E2M3", "shape": [1], "data_offsets": [0, 1]}}), b"\0")),
    C("SUB_BYTE_MISALIGNED", "F6-2", hdr(json.dumps({"t": {"dtype": "F6_E3M2", "shape": [2], "data_offsets": [0, 2]}}), b"\0\0")),
    C("TENSOR_SIZE_MISMATCH", "short-span", hdr(ent(data_offsets=[0, 4]), DATA8[:4])),
    C("TENSOR_SIZE_MISMATCH", "long-span", hdr(ent(data_offsets=[0, 12]), DATA8 + b"\0" * 4)),
    C("TENSOR_SIZE_MISMATCH", "5000-digit-end", hdr('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,' + "9" * 5000 + "]}}")),
    C("TENSOR_ENTRY_INVALID", "minus-5000-digit-dim", hdr('{"t":{"dtype":"F32","shape":[-' + "9" * 5000 + '],"data_offsets":[0,8]}}')),
    C("TENSOR_SIZE_MISMATCH", "F4-span", hdr(json.dumps({"t": {"dtype": "F4", "shape": [4], "data_offsets": [0, 4]}}), b"\0" * 4)),
    C("OFFSETS_INVALID", "reversed", hdr(ent(data_offsets=[8, 0]))),
    C("OFFSETS_INVALID", "overlap", hdr(json.dumps({"t": ENT, "u": dict(ENT, data_offsets=[4, 12])}), DATA8 + b"\0" * 4)),
    C("OFFSETS_INVALID", "same-range", hdr(json.dumps({"t": ENT, "u": ENT}))),
    C("OFFSETS_INVALID", "hole", hdr(json.dumps({"t": ENT, "u": dict(ENT, data_offsets=[12, 20])}), DATA8 * 2 + b"\0" * 4)),
    C("OFFSETS_INVALID", "first-not-zero", hdr(ent(data_offsets=[4, 12]), b"\0" * 12)),
    C("OFFSETS_INVALID", "empty-tensor-in-hole", hdr(json.dumps({"t": ENT, "z": {"dtype": "F32", "shape": [0], "data_offsets": [100, 100]}}))),
    C("DATA_TRUNCATED", "short", hdr(_TWO, DATA8 + DATA8[:5])),
    C("DATA_TRUNCATED", "no-data", hdr(ent(), b"")),
    C("TRAILING_BYTES", "one-byte", hdr(ent(), DATA8 + b"\0")),
    C("TRAILING_BYTES", "no-tensors", hdr("{}", b"\0" * 8)),
    # -- the qformat metadata object -----------------------------------------------------
    C("QFORMAT_JSON_INVALID", "not-json", qtext("not json")),
    C("QFORMAT_JSON_INVALID", "empty", qtext("")),
    C("QFORMAT_JSON_INVALID", "array", qtext("[]")),
    C("QFORMAT_JSON_INVALID", "string", qtext('"1.0"')),
    C("QFORMAT_JSON_INVALID", "trailing-text", qtext('{"version":"1.0","tensors":{}} x')),
    C("QFORMAT_JSON_INVALID", "duplicate-key", qtext('{"version":"1.0","version":"1.0","tensors":{}}')),
    C("QFORMAT_JSON_INVALID", "duplicate-tensor", W(qjson=lambda s: s.replace('{"w":', '{"w":{},"w":', 1))),
    C("QFORMAT_JSON_INVALID", "duplicate-in-descriptor", W(qjson=lambda s: s.replace('"dtype":"float32"', '"dtype":"float32","dtype":"float32"'))),
    C("QFORMAT_JSON_INVALID", "nan", qtext('{"version":"1.0","tensors":{},"x":NaN}')),
    C("QFORMAT_JSON_INVALID", "nul", qtext('{"version":"1.0","tensors":{}}\u0000')),
    C("QFORMAT_JSON_INVALID", "leading-space", qtext(' {"version":"1.0","tensors":{}}')),
    C("QFORMAT_JSON_INVALID", "lone-surrogate", qtext('{"version":"1.0","tensors":{},"x":"\\ud800"}')),
    C("QFORMAT_JSON_INVALID", "depth-65", qtext(q_with_depth(65))),
    C("QFORMAT_JSON_INVALID", "deep-nesting", qtext('{"version":"1.0","tensors":{},"x":' + deep(10_000) + "}")),
    C("QFORMAT_JSON_INVALID", "over-16MiB", qtext('{"version":"1.0","tensors":{}}' + " " * (16 << 20))),
    C("VERSION_MISSING", "no-version", qtext('{"tensors":{}}')),
    C("VERSION_MISSING", "empty-object", qtext("{}")),
    C("VERSION_MISSING", "with-tensors", W(qjson=lambda s: s.replace('"version":"1.0",', ""))),
    C("VERSION_INVALID", "1", W(version="1")),
    C("VERSION_INVALID", "1.00", W(version="1.00")),
    C("VERSION_INVALID", "01.0", W(version="01.0")),
    C("VERSION_INVALID", "number-1.0", W(version=1.0)),
    C("VERSION_INVALID", "number-1", W(version=1)),
    C("VERSION_INVALID", "null", W(version=None)),
    C("VERSION_INVALID", "1.0.0", W(version="1.0.0")),
    C("VERSION_INVALID", "v1.0", W(version="v1.0")),
    C("VERSION_INVALID", "space", W(version=" 1.0")),
    C("VERSION_INVALID", "empty", W(version="")),
    C("VERSION_INVALID", "unicode-digits", W(version="\u0661.\u0660")),
    C("VERSION_INVALID", "trailing-newline", W(version="1.0\n")),
    C("VERSION_UNSUPPORTED", "2.0", W(version="2.0")),
    C("VERSION_UNSUPPORTED", "0.9", W(version="0.9")),
    C("VERSION_UNSUPPORTED", "huge-major", W(version="999999999.0")),
    C("SCHEMA_VIOLATION", "unknown-top-field", W(top={"producer": "x"})),
    C("SCHEMA_VIOLATION", "tensors-list", qtext('{"version":"1.0","tensors":[]}')),
    C("SCHEMA_VIOLATION", "no-tensors", qtext('{"version":"1.0"}')),
    C("SCHEMA_VIOLATION", "unknown-descriptor-field", W(setf("future", 1))),
    C("SCHEMA_VIOLATION", "unknown-packing-field", W(setf("codes.packing.future", 1))),
    C("SCHEMA_VIOLATION", "descriptor-not-object", W(lambda d, t: d.__setitem__("w", 5))),
    C("SCHEMA_VIOLATION", "missing-codes", W(delf("codes"))),
    C("SCHEMA_VIOLATION", "zero-with-op", W(setf("zero.op", "multiply"))),
    C("SCHEMA_VIOLATION", "scale-op-add", W(setf("scale.op", "add"))),
    C("SCHEMA_VIOLATION", "scale-without-blocks", W(delf("scale.blocks"))),
    C("SCHEMA_VIOLATION", "param-tensor-and-encoded", W(setf("scale.encoded", {}))),
    C("SCHEMA_VIOLATION", "param-neither-tensor-nor-encoded", W(delf("scale.tensor"))),
    C("SCHEMA_VIOLATION", "codes-tensor-empty", W(setf("codes.tensor", ""))),
    C("SCHEMA_VIOLATION", "unknown-codes-field", W(setf("codes.future", 1))),
    C("SCHEMA_VIOLATION", "unknown-layout-field", W(setf("layout", {"name": "canonical", "future": 1}))),
    C("SCHEMA_VIOLATION", "unknown-planes-field", W(setf("codes.packing.planes", {"span": 2, "future": 1}))),
    C("SCHEMA_VIOLATION", "scheme-too-long", W(setf("scheme", "x" * 65))),
    C("SCHEMA_VIOLATION", "allow-nonfinite-string", W(setf("allow_nonfinite_params", "yes"))),
    C("SCHEMA_VIOLATION", "two-specific-codes", W(setf("dtype", "int8"), setf("codes.element.bits", 9))),
    C("SCHEMA_VIOLATION", "specific-and-general", W(setf("dtype", "int8"), setf("future", 1))),
    C("SCHEMA_VIOLATION", "inside-nested-descriptor", W(nested(1), setf("scale.encoded.dtype", "int8"))),
    C("SCHEMA_VIOLATION", "65-tensor-extensions",
      W(setf("extensions", [{"name": f"org.example.x{i}", "must_understand": False} for i in range(65)]))),
    C("SCHEMA_VIOLATION", "extension-without-name", W(top={"extensions": [{"must_understand": False}]})),
    C("SCHEMA_VIOLATION", "65-file-extensions", W(top={"extensions": [{"name": f"org.example.x{i}", "must_understand": False} for i in range(65)]})),
    C("SCHEMA_VIOLATION", "empty-logical-name", W(lambda d, t: d.__setitem__("", d.pop("w")))),
    C("DTYPE_INVALID", "int8", W(setf("dtype", "int8"))),
    C("DTYPE_INVALID", "float64", W(setf("dtype", "float64"))),
    C("DTYPE_INVALID", "storage-name", W(setf("dtype", "F32"))),
    C("DTYPE_INVALID", "not-a-string", W(setf("dtype", 32))),
    C("SHAPE_INVALID", "negative", W(setf("shape", [-4, 8]))),
    C("SHAPE_INVALID", "rank-65", W(setf("shape", [1] * 65))),
    C("SHAPE_INVALID", "entry-2^53", W(setf("shape", [4, 2**53]))),
    C("SHAPE_INVALID", "not-a-list", W(setf("shape", "4x8"))),
    C("SHAPE_INVALID", "numel-2^64", W(setf("shape", [2**32, 2**32]))),
    C("SHAPE_INVALID", "5000-digit-entry", W(qjson=lambda s: s.replace('"shape":[4,8]', '"shape":[4,' + "9" * 5000 + "]", 1))),
    C("ELEMENT_INVALID", "bits-9", W(setf("codes.element.bits", 9))),
    C("ELEMENT_INVALID", "bits-0", W(setf("codes.element.bits", 0))),
    C("ELEMENT_INVALID", "unknown-float-format", W(setf("codes.element", {"type": "float", "format": "e3m4"}))),
    C("ELEMENT_INVALID", "unknown-codebook", W(setf("codes.element", {"type": "codebook", "bits": 4, "table": "nf5"}))),
    C("ELEMENT_INVALID", "codebook-table-and-tensor", W(setf("codes.element", {"type": "codebook", "bits": 4, "table": "nf4", "table_tensor": "w.codes"}))),
    C("ELEMENT_INVALID", "unknown-element-field", W(setf("codes.element.future", 1))),
    C("ELEMENT_INVALID", "missing-signedness", W(delf("codes.element.signedness"))),
    C("PACKING_INVALID", "container-64", W(setf("codes.packing.container", 64))),
    C("PACKING_INVALID", "missing-axis", W(delf("codes.packing.axis"))),
    C("PACKING_INVALID", "negative-axis", W(setf("codes.packing.axis", -1))),
    C("PACKING_INVALID", "planes-span-0", W(setf("codes.packing.planes", {"span": 0}))),
    C("LAYOUT_INVALID", "missing-name", W(setf("layout", {"parameters": {}}))),
    C("LAYOUT_INVALID", "empty-name", W(setf("layout", {"name": ""}))),
    C("LAYOUT_INVALID", "parameters-list", W(setf("layout", {"name": "canonical", "parameters": []}))),
    C("BLOCKS_INVALID", "block-size-0", W(setf("scale.blocks.size", [1, 0]))),
    C("BLOCKS_INVALID", "unknown-blocks-type", W(setf("scale.blocks.type", "tiles"))),
    C("BLOCKS_INVALID", "unknown-blocks-field", W(setf("scale.blocks.future", 1))),
    C("BLOCKS_INVALID", "zero-and-scale-blocks", W(setf("scale.blocks.size", [1, 0]), setf("zero.blocks.size", [0, 4]))),
    C("FEATURE_UNSUPPORTED", "1.3-unknown-descriptor-field", W(setf("future", 1), version="1.3")),
    C("FEATURE_UNSUPPORTED", "1.3-unknown-element-field", W(setf("codes.element.future", 1), version="1.3")),
    C("EXTENSION_NAME_INVALID", "file-no-dot", W(top={"extensions": [{"name": "nodots"}]})),
    C("EXTENSION_NAME_INVALID", "file-upper", W(top={"extensions": [{"name": "Org.Example", "must_understand": False}]})),
    C("EXTENSION_NAME_INVALID", "file-empty-part", W(top={"extensions": [{"name": "org..x"}]})),
    C("EXTENSION_NAME_INVALID", "file-trailing-newline",
      W(top={"extensions": [{"name": "org.example.x\n", "must_understand": False}]})),
    C("EXTENSION_NAME_INVALID", "file-reserved-namespace",
      W(top={"extensions": [{"name": "qformat.future", "must_understand": False}]})),
    C("EXTENSION_NAME_INVALID", "tensor-no-dot", W(setf("extensions", [{"name": "x", "must_understand": False}]))),
    C("EXTENSION_NAME_INVALID", "file-duplicate",
      W(top={"extensions": [{"name": "org.example.x", "must_understand": False}, {"name": "org.example.x", "must_understand": False}]})),
    C("EXTENSION_NAME_INVALID", "tensor-trailing-newline",
      W(setf("extensions", [{"name": "org.example.x\n", "must_understand": False}]))),
    C("EXTENSION_NAME_INVALID", "tensor-reserved-namespace",
      W(setf("extensions", [{"name": "qformat.future", "must_understand": False}]))),
    C("EXTENSION_NAME_INVALID", "tensor-duplicate",
      W(setf("extensions", [{"name": "org.example.x", "must_understand": False}, {"name": "org.example.x"}]))),
    C("EXTENSION_NAME_INVALID", "nested-descriptor",
      W(nested(1), setf("scale.encoded.extensions", [{"name": "Bad", "must_understand": False}]))),
    C("EXTENSION_UNKNOWN", "file-scope", W(top={"extensions": [{"name": "org.example.x"}]})),
    C("EXTENSION_UNKNOWN", "file-scope-explicit", W(top={"extensions": [{"name": "org.example.x", "must_understand": True}]})),
    C("EXTENSION_UNKNOWN", "tensor-scope", W(setf("extensions", [{"name": "org.example.x", "configuration": {"a": 1}}]))),
    C("EXTENSION_UNKNOWN", "nested-descriptor", W(nested(2), setf("scale.encoded.extensions", [{"name": "org.example.x"}]))),
    C("EXTENSION_UNKNOWN", "reserved-name-in-newer-minor", W(top={"extensions": [{"name": "qformat.future"}]}, version="1.3")),
    # -- descriptor semantics ------------------------------------------------------------
    C("LAYOUT_UNKNOWN", "marlin", W(setf("layout", {"name": "marlin", "parameters": {}}))),
    C("LAYOUT_UNKNOWN", "cpu-int4pack", W(setf("layout", {"name": "cpu_int4pack"}))),
    C("LAYOUT_INVALID", "canonical-with-parameters", W(setf("layout", {"name": "canonical", "parameters": {"tile": 16}}))),
    # -- device layouts (1.1, SPEC.md §11) -----------------------------------------------
    C("LAYOUT_FORBIDDEN", "tinygemm-cpu", W(setf("layout", {"name": "tinygemm_int4_cpu"}), version="1.1")),
    C("LAYOUT_FORBIDDEN", "tinygemm-cpu-with-parameters", W(setf("layout", {"name": "tinygemm_int4_cpu", "parameters": {"inner_k_tiles": 2}}), version="1.1")),
    C("LAYOUT_UNKNOWN", "tinygemm-cpu-in-1.0-file", W(setf("layout", {"name": "tinygemm_int4_cpu"}))),
    C("LAYOUT_UNKNOWN", "tinygemm-cuda-in-1.0-file", W(device_w("tinygemm_int4_cuda", {"inner_k_tiles": 2}))),
    C("LAYOUT_INVALID", "tinygemm-inner-k-tiles-16", W(device_w("tinygemm_int4_cuda", {"inner_k_tiles": 2}, mutate=_set("layout.parameters.inner_k_tiles", 16)), version="1.1")),
    C("LAYOUT_INVALID", "tinygemm-no-parameters", W(device_w("tinygemm_int4_cuda", {"inner_k_tiles": 2}, mutate=_set("layout.parameters", {})), version="1.1")),
    C("LAYOUT_INVALID", "marlin-unknown-parameter", W(device_w("marlin_dense", {}, mutate=_set("layout.parameters", {"tile": 16})), version="1.1")),
    C("FEATURE_UNSUPPORTED", "tinygemm-inner-k-tiles-16-newer-minor", W(device_w("tinygemm_int4_cuda", {"inner_k_tiles": 2}, mutate=_set("layout.parameters.inner_k_tiles", 16)), version="1.3")),
    C("LAYOUT_SHAPE", "tinygemm-k-not-multiple-of-64", W(device_w("tinygemm_int4_cuda", {"inner_k_tiles": 2}, shape=(8, 96), mutate=_set("layout.parameters.inner_k_tiles", 4)), version="1.1")),
    C("LAYOUT_SHAPE", "marlin-n-not-multiple-of-64", W(device_w("marlin_dense", {}, shape=(64, 128), mutate=_set("shape", [32, 256])), version="1.1")),
    C("LAYOUT_GROUP_SIZE", "tinygemm-group-16", W(device_w("tinygemm_int4_cuda", {"inner_k_tiles": 2}, shape=(8, 64), mutate=_set("scale.blocks.size", [1, 16])), version="1.1")),
    C("LAYOUT_GROUP_SIZE", "marlin-group-256", W(device_w("marlin_dense", {}, shape=(64, 512), group=128, mutate=_set("scale.blocks.size", [1, 256])), version="1.1")),
    C("LAYOUT_MISMATCH", "marlin-unsigned-element", W(device_w("marlin_dense", {}, mutate=_set("codes.element.signedness", "unsigned")), version="1.1")),
    C("LAYOUT_MISMATCH", "tinygemm-8-bit-container", W(device_w("tinygemm_int4_cuda", {"inner_k_tiles": 2}, mutate=_set("codes.packing.container", 8)), version="1.1")),
    C("COMPONENT_SHAPE", "tinygemm-device-shape", W(device_w("tinygemm_int4_cuda", {"inner_k_tiles": 2}, mutate=lambda d, c: c.__setitem__("w.codes", c["w.codes"].reshape(8, -1))), version="1.1")),
    C("NAME_CONFLICT", "logical-is-plain", W(lambda d, t: d.__setitem__("b", d.pop("w")))),
    C("NAME_CONFLICT", "logical-is-other-component", W(add_tensor("v"), lambda d, t: d.__setitem__("w.scale", d.pop("v")))),
    C("COMPONENT_MISSING", "codes", W(setf("codes.tensor", "nope"))),
    C("COMPONENT_MISSING", "scale-removed", W(put("w.scale", None))),
    C("COMPONENT_MISSING", "table-tensor", W(setf("codes.element", {"type": "codebook", "bits": 4, "table_tensor": "nope"}))),
    C("COMPONENT_MISSING", "group-index", W(gidx([0] * 8), put("w.g_idx", None))),
    C("COMPONENT_CLAIMED_TWICE", "two-descriptors", W(add_tensor("v"), setf("scale.tensor", "w.scale", t="v"), put("v.scale", None))),
    C("COMPONENT_CLAIMED_TWICE", "zero-and-scale", W(setf("zero.tensor", "w.scale"), put("w.zero", None))),
    C("COMPONENT_CLAIMED_TWICE", "group-index-in-two-tensors", W(gidx([0] * 8), add_tensor("v"), setf("scale.blocks", {
        "type": "grid", "size": [1, None], "index": {"axis": 1, "tensor": "w.g_idx", "count": 2}}, t="v"))),
    C("COMPONENT_CLAIMED_TWICE", "group-index-also-a-zero", W(gidx([0] * 8), setf("zero", {
        "blocks": {"type": "flat", "size": 4}, "tensor": "w.g_idx"}))),
    C("COMPONENT_CLAIMED_TWICE", "codes-as-scale", W(setf("scale.tensor", "w.codes"), put("w.scale", None),
                                                   setf("scale.blocks.size", [1, 2]))),
    C("COMPONENT_DTYPE", "container32-as-U8", W(setf("codes.packing.container", 32)), also=("COMPONENT_SHAPE",)),
    C("COMPONENT_DTYPE", "scale-I64", W(put("w.scale", np.ones((4, 2), np.int64)))),
    C("COMPONENT_DTYPE", "scale-F64", W(put("w.scale", np.ones((4, 2), np.float64)))),
    C("COMPONENT_DTYPE", "scale-BOOL", W(put("w.scale", np.ones((4, 2), np.bool_)))),
    C("COMPONENT_DTYPE", "codes-F4", W(put("w.codes", ("F4", [4, 8], b"\0" * 16))), also=("COMPONENT_SHAPE",)),
    C("COMPONENT_DTYPE", "group-index-float", W(gidx([0] * 8, np.float32))),
    C("COMPONENT_DTYPE", "group-index-U64", W(gidx([0] * 8, np.uint64))),
    C("COMPONENT_DTYPE", "scale-U64", W(put("w.scale", np.ones((4, 2), np.uint64)))),
    C("COMPONENT_SHAPE", "codes", W(put("w.codes", np.zeros((4, 5), np.uint8)))),
    C("COMPONENT_SHAPE", "codes-transposed", W(put("w.codes", np.zeros((8, 2), np.uint8)))),
    C("COMPONENT_SHAPE", "scale", W(put("w.scale", np.ones((4, 3), np.float16)))),
    C("COMPONENT_SHAPE", "scale-same-count", W(put("w.scale", np.ones((2, 4), np.float16)))),
    C("COMPONENT_SHAPE", "group-index-length", W(gidx([0] * 7))),
    C("SHAPE_INVALID", "nested-shape", W(nested(1, shape=(2, 4)))),
    C("SHAPE_INVALID", "nested-rank", W(lambda d, t: nested(1, shape=(4, 2))(d, t),
                                        setf("scale.encoded.shape", [8]))),
    C("ELEMENT_INVALID", "code-offset-16", W(setf("codes.element.code_offset", 16))),
    C("CODEBOOK_INVALID", "table-17", W(setf("codes.element", {"type": "codebook", "bits": 4, "table_tensor": "w.t"}),
                                        put("w.t", np.zeros(17, np.float32)))),
    C("CODEBOOK_INVALID", "table-empty", W(setf("codes.element", {"type": "codebook", "bits": 4, "table_tensor": "w.t"}),
                                           put("w.t", np.zeros(0, np.float32)))),
    C("CODEBOOK_INVALID", "table-2d", W(setf("codes.element", {"type": "codebook", "bits": 4, "table_tensor": "w.t"}),
                                        put("w.t", np.zeros((2, 2), np.float32)))),
    C("CODEBOOK_INVALID", "table-int", W(setf("codes.element", {"type": "codebook", "bits": 4, "table_tensor": "w.t"}),
                                         put("w.t", np.zeros(16, np.int32)))),
    C("CODEBOOK_INVALID", "nf4-in-3-bits", named_cb_file("nf4", 3, [0, 1, 2, 3])),
    C("PACKING_INVALID", "slot-order-straddling-3bit",
      W(setf("codes.element", {"type": "int", "bits": 3, "signedness": "unsigned"}), setf("codes.packing.slot_order", [1, 0]),
        put("w.codes", np.zeros((4, 3), np.uint8)))),
    C("PACKING_INVALID", "planes-straddling-3bit",
      W(setf("codes.element", {"type": "int", "bits": 3, "signedness": "unsigned"}), setf("codes.packing.planes", {"span": 4}),
        put("w.codes", np.zeros((4, 3), np.uint8)))),
    C("PACKING_INVALID", "slot-order-not-permutation", W(setf("codes.packing.slot_order", [0, 0]))),
    C("PACKING_INVALID", "slot-order-too-long", W(setf("codes.packing.slot_order", [0, 1, 2]))),
    C("PACKING_INVALID", "axis-out-of-range", W(setf("codes.packing.axis", 2))),
    C("PACKING_INVALID", "order-not-permutation", W(setf("codes.packing.order", [0, 0]))),
    C("PACKING_INVALID", "order-wrong-rank", W(setf("codes.packing.order", [0, 1, 2]))),
    C("BLOCKS_INVALID", "grid-rank", W(setf("scale.blocks.size", [4]))),
    C("BLOCKS_INVALID", "index-axis-has-size", W(gidx([0] * 8), setf("scale.blocks.size", [1, 4]))),
    C("BLOCKS_INVALID", "index-axis-missing", W(gidx([0] * 8), setf("scale.blocks.index.axis", 2))),
    C("BLOCKS_INVALID", "param-order-not-permutation", W(setf("scale.order", [1, 1]))),
    C("DEPTH_EXCEEDED", "4-levels", W(nested(4))),
    C("DEPTH_EXCEEDED", "9-levels", W(nested(9))),
    # -- payload -------------------------------------------------------------------------
    C("DIGEST_MISMATCH", "flipped-byte", W(version="1.2", top={"digests": {"algorithm": "sha256", "tensors": {"w.codes": _sha(np.zeros(1, np.uint8))}}}), load="ok"),
    C("DIGEST_MISMATCH", "short-digest", W(version="1.2", top={"digests": {"algorithm": "sha256", "tensors": {"b": "ab"}}}), load="ok"),
    C("DIGEST_MISMATCH", "no-such-stored-tensor", W(version="1.2", top={"digests": {"algorithm": "sha256", "tensors": {"nope": _sha(b"")}}}), load="ok"),
    C("DIGEST_UNSUPPORTED", "unknown-algorithm", W(version="1.2", top={"digests": {"algorithm": "blake3", "tensors": {"b": "ab"}}}), load="ok"),
    C("SCHEMA_VIOLATION", "digests-in-1.1-file", W(version="1.1", top={"digests": {"algorithm": "sha256", "tensors": {}}})),
    C("SCHEMA_VIOLATION", "digests-upper-case-hex", W(version="1.2", top={"digests": {"algorithm": "sha256", "tensors": {"b": "AB"}}})),
    C("SCHEMA_VIOLATION", "digests-extra-member", W(version="1.2", top={"digests": {"algorithm": "sha256", "tensors": {}, "x": 1}})),
    C("FEATURE_UNSUPPORTED", "digests-malformed-newer-minor", W(version="1.3", top={"digests": {"algorithm": "sha256"}})),
    C("PADDING_NONZERO", "odd-row-high-nibble", W(set_word("w.codes", (0, 3), 0x80), shape=(4, 7)), load="ok"),
    C("PADDING_NONZERO", "alignment-word", W(codes_padded(3, bad=True)), load="ok"),
    C("PADDING_NONZERO", "stream-tail", cb_file([1, 2, 3], pad_mask=0x40), load="ok"),
    C("PARAM_NONFINITE", "nan-scale", W(set_word_f("w.scale", (1, 1), np.nan)), load="any"),
    C("PARAM_NONFINITE", "inf-scale", W(set_word_f("w.scale", (0, 0), np.inf)), load="any"),
    C("PARAM_NONFINITE", "e8m0-0xff-scale",
      W(put("w.scale", lambda: np.full((4, 2), 0x7F, np.uint8).view(ml_dtypes.float8_e8m0fnu)),
        set_word_u8("w.scale", (2, 1), 0xFF)), load="any"),
    C("PARAM_NONFINITE", "nan-zero-point", W(put("w.zero", lambda: np.full((4, 2), np.nan, np.float32))), load="any"),
    C("PARAM_DIVISOR_ZERO", "divide-by-zero", W(setf("scale.op", "divide"), set_word_f("w.scale", (3, 0), 0.0)), load="any"),
    C("PARAM_DIVISOR_ZERO", "divide-by-minus-zero", W(setf("scale.op", "divide"), set_word_f("w.scale", (3, 1), -0.0)), load="any"),
    C("PARAM_DIVISOR_ZERO", "integer-divisor", W(setf("scale.op", "divide"), put("w.scale", lambda: np.array([[1, 2], [3, 0], [1, 1], [2, 2]], np.int32))), load="any"),
    C("PARAM_DIVISOR_ZERO", "encoded-divisor", W(nested(1), setf("scale.op", "divide"), put("w.se.codes", lambda: np.array([[2, 2], [2, 0], [2, 2], [2, 2]], np.uint8))), load="any"),
    C("PARAM_DIVISOR_ZERO", "even-when-nonfinite-allowed", W(setf("allow_nonfinite_params", True), setf("scale.op", "divide"), set_word_f("w.scale", (0, 0), 0.0)), load="any"),
    C("PARAM_INT_RANGE", "I32-2^24+1", W(put("w.zero", lambda: np.full((4, 2), 2**24 + 1, np.int32))), load="any"),
    C("PARAM_INT_RANGE", "I32-negative", W(put("w.zero", lambda: np.full((4, 2), -(2**24) - 1, np.int32))), load="any"),
    C("PARAM_INT_RANGE", "U32-max", W(put("w.zero", lambda: np.full((4, 2), 2**32 - 1, np.uint32))), load="any"),
    C("GROUP_INDEX_RANGE", "too-large", W(gidx([0, 1, 0, 1, 2, 1, 0, 1]))),
    C("GROUP_INDEX_RANGE", "negative", W(gidx([0, 1, 0, 1, -1, 1, 0, 1]))),
    C("GROUP_INDEX_RANGE", "i64-min", W(gidx([0, 1, 0, 1, -(2**63), 1, 0, 1], np.int64))),
    C("GROUP_INDEX_RANGE", "u32-max", W(gidx([0, 1, 0, 1, 2**32 - 1, 1, 0, 1], np.uint32))),
    C("CODE_OUT_OF_RANGE", "10-entry-table", cb_file([0, 1, 12, 3, 4, 5, 6, 7])),
    C("CODE_OUT_OF_RANGE", "last-code", cb_file([0, 10])),
    C("CODE_OUT_OF_RANGE", "nf4-in-5-bits", named_cb_file("nf4", 5, [0, 1, 20, 15])),
    C("SHAPE_UNREPRESENTABLE", "empty-2-40-2-40", lambda: build_file({"t": ("F32", [0, 2**40, 2**40], b"")})),
    C("SHAPE_UNREPRESENTABLE", "empty-2-63-1-f32", lambda: build_file({"t": ("F32", [2**63 - 1, 0], b"")})),
    C("SHAPE_UNREPRESENTABLE", "empty-beside-qformat", W(put("p", ("F16", [2**62, 0, 3], b"")))),
]


@pytest.mark.parametrize("case", FILE_CASES)
def test_file_error(case: FileCase, write_bytes: Callable[..., Path]) -> None:
    path = write_bytes(case.make())
    t0 = time.perf_counter()
    if case.load == "raises":
        raises_code(case.code, lambda: qformat.load_file(path))
    elif case.load == "ok":
        qformat.load_file(path)
    else:
        try:
            qformat.load_file(path)
        except QFormatError as e:
            assert_error(e, case.code)
    codes = check_codes(path)
    assert case.code in codes, f"check() reported {codes}, expected {case.code}"
    assert set(codes) <= {case.code} | case.also, f"check() reported {codes}, expected only {case.code}"
    assert time.perf_counter() - t0 < 20


@pytest.mark.parametrize("case", [c for c in FILE_CASES if c.values[0].load == "raises"][::7],
)
def test_file_error_through_safe_open(case: FileCase, write_bytes: Callable[..., Path]) -> None:
    """A sample of the cases: safe_open + get_tensor refuses with the same code as load_file."""
    path = write_bytes(case.make())
    with pytest.raises(QFormatError) as ei:
        with qformat.safe_open(path) as f:
            for name in f.keys():
                f.get_tensor(name)
    assert_error(ei.value, case.code)


# ==========================================================================================
# Sharded checkpoints (check only: there is no index loader)
# ==========================================================================================
S1, S2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


def sharded(folder: Path, edit: Callable[[dict], Any] | None = None, text: str | bytes | None = None) -> Path:
    """Two shards (w + plain b; v) and an index listing every stored tensor and logical name."""
    folder.mkdir(parents=True, exist_ok=True)
    d1, c1 = int4_tensor("w")
    d2, c2 = int4_tensor("v", seed=1)
    (folder / S1).write_bytes(build_file({**c1, "b": np.ones(2, np.float32)}, qformat=qformat_object({"w": d1})))
    (folder / S2).write_bytes(build_file(c2, qformat=qformat_object({"v": d2})))
    wm = {n: S1 for n in [*c1, "b", "w"]}
    wm.update({n: S2 for n in [*c2, "v"]})
    index: dict[str, Any] = {"metadata": {"total_size": 0}, "weight_map": wm}
    if edit is not None:
        edit(index)
    p = folder / "model.safetensors.index.json"
    if text is None:
        p.write_text(json.dumps(index))
    else:
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


def I(code: str, id: str, edit: Callable[[dict], Any] | None = None, text: str | bytes | None = None) -> Any:
    return pytest.param(code, edit, text, id=f"{code}-{id}")


def _wm(fn: Callable[[dict], Any]) -> Callable[[dict], Any]:
    return lambda index: fn(index["weight_map"])


INDEX_CASES = [
    I("INDEX_INVALID", "not-json", text="not json"),
    I("INDEX_INVALID", "not-utf8", text=b'{"weight_map":{"\xff":"x"}}'),
    I("INDEX_INVALID", "duplicate-key", text='{"weight_map":{"b":"%s","b":"%s"}}' % (S1, S1)),
    I("INDEX_INVALID", "deep-nesting", text='{"weight_map":{},"x":' + deep(10_000) + "}"),
    I("INDEX_INVALID", "array", text="[]"),
    I("INDEX_INVALID", "leading-whitespace", text=' {"weight_map":{}}'),
    I("INDEX_INVALID", "bom", text='\ufeff{"weight_map":{}}'),
    I("INDEX_INVALID", "trailing-text", text='{"weight_map":{}} x'),
    I("INDEX_INVALID", "nan", text='{"weight_map":{},"metadata":{"total_size":NaN}}'),
    I("INDEX_INVALID", "lone-surrogate", text='{"weight_map":{"\\ud800":"%s"}}' % S1),
    I("INDEX_INVALID", "too-large", text='{"weight_map":{}}' + " " * (64 << 20)),
    I("INDEX_INVALID", "nul-in-shard-name", edit=_wm(lambda wm: wm.__setitem__("x", "a\x00.safetensors"))),
    I("INDEX_INVALID", "dot", edit=_wm(lambda wm: wm.__setitem__("x", "."))),
    I("INDEX_INVALID", "no-weight-map", edit=lambda ix: ix.pop("weight_map")),
    I("INDEX_INVALID", "weight-map-list", edit=lambda ix: ix.__setitem__("weight_map", [S1])),
    I("INDEX_INVALID", "shard-not-string", edit=_wm(lambda wm: wm.__setitem__("b", 1))),
    I("INDEX_INVALID", "missing-shard", edit=_wm(lambda wm: wm.__setitem__("x", "model-00003-of-00003.safetensors"))),
    I("INDEX_INVALID", "parent-dir", edit=_wm(lambda wm: wm.__setitem__("x", "../x.safetensors"))),
    I("INDEX_INVALID", "parent-dir-only", edit=_wm(lambda wm: wm.__setitem__("x", ".."))),
    I("INDEX_INVALID", "absolute", edit=_wm(lambda wm: wm.__setitem__("x", "/etc/passwd"))),
    I("INDEX_INVALID", "subfolder", edit=_wm(lambda wm: wm.__setitem__("x", "sub/x.safetensors"))),
    I("INDEX_INVALID", "backslash", edit=_wm(lambda wm: wm.__setitem__("x", "..\\x.safetensors"))),
    I("INDEX_MISMATCH", "listed-absent", edit=_wm(lambda wm: wm.__setitem__("ghost", S1))),
    I("INDEX_MISMATCH", "present-unlisted", edit=_wm(lambda wm: wm.pop("b"))),
    I("INDEX_MISMATCH", "component-unlisted", edit=_wm(lambda wm: wm.pop("v.scale"))),
    I("INDEX_MISMATCH", "wrong-shard", edit=_wm(lambda wm: wm.__setitem__("b", S2))),
]


def test_sharded_checkpoint_ok(tmp_path: Path) -> None:
    p = sharded(tmp_path / "ckpt")
    assert check_codes(p) == []
    assert check_codes(p.parent) == []
    rep = qformat.check(p)
    assert sorted(os.path.basename(f.path) for f in rep.files) == [S1, S2]


@pytest.mark.parametrize("code, edit, text", INDEX_CASES)
def test_index_error(code: str, edit: Any, text: Any, tmp_path: Path) -> None:
    p = sharded(tmp_path / "ckpt", edit, text)
    assert code in check_codes(p)
    assert code in check_codes(p.parent), "checking the folder must check its index too"


def test_index_may_end_with_json_whitespace(tmp_path: Path) -> None:
    p = sharded(tmp_path / "ckpt")
    p.write_text(p.read_text() + "\n\t\r ")
    assert check_codes(p) == []


def test_index_may_omit_logical_names(tmp_path: Path) -> None:
    p = sharded(tmp_path / "ckpt", _wm(lambda wm: [wm.pop("w"), wm.pop("v")]))
    assert check_codes(p) == []


def test_index_shard_outside_folder_is_not_read(tmp_path: Path) -> None:
    """A shard name escaping the folder is refused before anything is opened."""
    (tmp_path / "outside.safetensors").write_bytes(b"garbage that would give HEADER_* codes")
    p = sharded(tmp_path / "ckpt", _wm(lambda wm: wm.__setitem__("x", "../outside.safetensors")))
    codes = check_codes(p)
    assert "INDEX_INVALID" in codes
    assert not any(c.startswith("HEADER_") for c in codes)


# ==========================================================================================
# Usage errors, through the API
# ==========================================================================================
def _has_schemes() -> bool:
    try:
        from qformat.schemes import quantize  # noqa: F401
    except ImportError:
        return False
    return True


needs_schemes = pytest.mark.skipif(not _has_schemes(), reason="qformat.schemes (the encoders) is not importable yet")
X = np.random.default_rng(0).standard_normal((8, 128)).astype(np.float32)


def _save(tmp: Path, tensors: dict, metadata: Any = None) -> None:
    qformat.save_file(tensors, tmp / "out.safetensors", metadata=metadata)


def _qt(**changes: Any) -> qformat.QTensor:
    d, c = int4_tensor("w")
    d.update(changes)
    return qformat.QTensor(d, c)


def _nan_x() -> np.ndarray:
    x = X.copy()
    x[3, 5] = np.nan
    return x


def _inf_x() -> np.ndarray:
    x = X.copy()
    x[0, 0] = -np.inf
    return x


def U(code: str, id: str, call: Callable[[Path, Path], Any], marks: Any = ()) -> Any:
    return pytest.param(code, call, id=f"{code}-{id}", marks=marks)


def _slice(expr: Callable[[Any], Any]) -> Callable[[Path, Path], Any]:
    def call(tmp: Path, valid: Path) -> Any:
        with qformat.safe_open(valid) as f:
            return expr(f)
    return call


def _convert(src: Callable[[Path, Path], Path], dst: str = "out.safetensors", **kw: Any) -> Callable[[Path, Path], Any]:
    from qformat.convert import convert

    def call(tmp: Path, valid: Path) -> Any:
        return convert(src(tmp, valid), tmp / dst, **kw)
    return call


def _convert_onto_itself(tmp: Path, valid: Path) -> Any:
    from qformat.convert import convert

    return convert(valid, valid, overwrite=True)


def _plain_file(tmp: Path, valid: Path) -> Path:
    p = tmp / "plain.safetensors"
    _save(tmp, {"x": X})  # writes tmp / "out.safetensors"
    os.replace(tmp / "out.safetensors", p)
    return p


def _plain_384(tmp: Path) -> Path:
    p = tmp / "plain.safetensors"
    qformat.save_file({"model.layers.0.mlp.down_proj.weight": np.ones((64, 384), np.float32)}, p)
    return p


def _bad_config(tmp: Path) -> Path:
    folder = tmp / "model"
    folder.mkdir()
    qformat.save_file({"model.layers.0.mlp.down_proj.weight": np.ones((4, 64), np.float32)}, folder / "model.safetensors")
    (folder / "config.json").write_text('{"model_type": ')
    return folder


def _index_missing_shard(tmp: Path, valid: Path) -> Path:
    p = tmp / "model.safetensors.index.json"
    p.write_text('{"weight_map": {"w": "absent.safetensors"}}')
    return p


def _gguf_unknown_type(tmp: Path, valid: Path) -> Path:
    # GGUF v3 with one tensor of ggml type 9 (Q8_1), which the converter does not handle.
    name = b"w"
    body = struct.pack("<4sIQQ", b"GGUF", 3, 1, 0)
    body += struct.pack("<Q", len(name)) + name + struct.pack("<I", 2) + struct.pack("<QQ", 256, 1)
    body += struct.pack("<IQ", 9, 0)
    body += b"\0" * (-len(body) % 32) + b"\0" * 320  # 256 elements: 8 Q8_1 blocks of 40 bytes
    p = tmp / "iq.gguf"
    p.write_bytes(body)
    return p


def _plot_without_matplotlib(tmp: Path, valid: Path) -> Any:
    """``qformat diff --plot`` where matplotlib cannot be imported (a None entry in
    sys.modules makes ``import matplotlib`` raise ImportError)."""
    import sys

    from qformat.diff import diff_checkpoints, plot

    saved = {m: sys.modules.pop(m) for m in list(sys.modules) if m == "matplotlib" or m.startswith("matplotlib.")}
    sys.modules["matplotlib"] = None  # type: ignore[assignment]
    try:
        return plot(diff_checkpoints(valid, valid), tmp / "plot.png")
    finally:
        del sys.modules["matplotlib"]
        sys.modules.update(saved)


def _export_int4(scale_dtype: str, to: str) -> Callable[[Path, Path], Any]:
    """Export an int4 g32 tensor whose scale is stored as ``scale_dtype`` to ``to``."""

    def call(tmp: Path, valid: Path) -> Any:
        x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
        src = tmp / "int4.safetensors"
        qformat.save_file({"w": qformat.quantize(x, "int", bits=4, group_size=32, scale_dtype=scale_dtype)}, src)
        return export_checkpoint(src, tmp / "out.gguf", to=to)

    return call


def _load_mismatch(tmp: Path, valid: Path) -> Any:
    """A quantized tiny Llama whose config.json no longer fits its down_proj weights, loaded
    with transformers' from_pretrained through qformat.transformers."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import qformat.transformers  # noqa: F401  (registers quant_method "qformat")

    cfg = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=1, intermediate_size=128, vocab_size=256,
                                   num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp / "fp")
    qformat.quantize_checkpoint(tmp / "fp", tmp / "q", scheme="int", bits=4, group_size=32)
    config = json.loads((tmp / "q" / "config.json").read_text())
    config["intermediate_size"] = 96
    (tmp / "q" / "config.json").write_text(json.dumps(config))
    return transformers.AutoModelForCausalLM.from_pretrained(tmp / "q")


def _export_unknown_tokenizer(tmp: Path, valid: Path, vocab_size: int | None = None) -> Any:
    """A llama folder whose byte-level BPE tokenizer (trained here) is in no llama.cpp table
    (with ``vocab_size``: a config.json vocabulary smaller than the tokenizer's)."""
    from .export.test_gguf import _bpe_tokenizer

    pytest.importorskip("tokenizers")
    folder = tmp / "m"
    folder.mkdir()
    _bpe_tokenizer(folder)
    cfg = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 1, "intermediate_size": 64}
    if vocab_size is not None:
        cfg["vocab_size"] = vocab_size
    (folder / "config.json").write_text(json.dumps(cfg))
    qformat.save_file({"model.norm.weight": np.ones(32, np.float32)}, folder / "model.safetensors")
    return export_checkpoint(folder, tmp / "o.gguf", to="gguf")


def _remote(**faults: Any) -> Callable[[Path, Path], Any]:
    """Read the valid file over HTTP from a loopback server with ``faults`` (tests/range_server.py;
    tests/test_remote.py tests every fault mode in depth), without retries."""

    def call(tmp: Path, valid: Path) -> Any:
        from qformat import remote

        from .range_server import Faults, serve_ranges

        redirect = faults.pop("cross_host", False)
        old = remote.DEFAULT_OPTIONS
        remote.DEFAULT_OPTIONS = remote.HttpOptions(connect_timeout=2, read_timeout=2, retries=0, backoff_s=0)
        try:
            with serve_ranges(valid.parent) as target, serve_ranges(valid.parent, Faults(**faults)) as url:
                if redirect:
                    url.faults.redirect_to = target.replace("127.0.0.1", "localhost")
                return qformat.load_file(url + valid.name)
        finally:
            remote.DEFAULT_OPTIONS = old

    return call


USAGE_CASES = [
    U("REMOTE_UNREACHABLE", "connection-dropped", _remote(drop_first=5)),
    U("REMOTE_HTTP_ERROR", "forbidden", _remote(status=403)),
    U("REMOTE_RANGE_IGNORED", "answers-200", _remote(ignore_range=True)),
    U("REMOTE_RANGE_INVALID", "body-one-byte-short", _remote(wrong_length=True)),
    U("REMOTE_CHANGED", "file-changes-after-the-header", _remote(change_after=2)),
    U("REMOTE_REDIRECT_REFUSED", "redirect-to-another-host", _remote(cross_host=True)),
    U("LOAD_MISMATCH", "config-does-not-fit-weights", _load_mismatch),
    U("EXPORT_TOKENIZER_UNKNOWN", "gguf-tokenizer-not-in-llama-cpp-table", _export_unknown_tokenizer),
    U("EXPORT_TOKENIZER_INVALID", "gguf-tokenizer-beyond-the-vocabulary", lambda tmp, v: _export_unknown_tokenizer(tmp, v, vocab_size=8)),
    U("EXPORT_OPTION_INVALID", "gguf-pre-llama-cpp-does-not-load", lambda tmp, v: export_checkpoint(v, tmp / "o.gguf", to="gguf", gguf_pre="no-such-pre")),
    U("EXPORT_TARGET_UNKNOWN", "no-such-target", lambda tmp, v: export_checkpoint(v, tmp / "o", to="no-such-target")),
    # F32 scales that float16 does not hold: GGUF's Q4_0 keeps d in float16.
    U("EXPORT_NOT_EXACT", "f32-scale-to-q4_0", _export_int4("float32", "gguf")),
    # bitsandbytes holds only nf4 / fp4 codes.
    U("EXPORT_UNMAPPABLE", "int4-to-bitsandbytes", _export_int4("float16", "bitsandbytes")),
    U("QUANTIZE_SOURCE_QUANTIZED", "quantize-qformat-file", lambda tmp, v: qformat.quantize_checkpoint(v, tmp / "o.safetensors", scheme="nf4")),
    U("QUANTIZE_RECIPE_INVALID", "rule-matches-nothing", lambda tmp, v: qformat.quantize_checkpoint(
        _plain_file(tmp, v), tmp / "o.safetensors", recipe={"rules": [{"glob": "nope", "keep": True}]})),
    U("IMATRIX_INVALID", "imatrix-not-an-imatrix-file", lambda tmp, v: qformat.quantize_checkpoint(
        _plain_file(tmp, v), tmp / "o.safetensors", scheme="gguf", type="Q8_0", imatrix=v)),
    U("SPLIT_PART_INVALID", "part-k-beyond-n", lambda tmp, v: qformat.quantize_checkpoint(
        _plain_file(tmp, v), tmp / "o", scheme="int", part="3/2")),
    U("SPLIT_PART_INVALID", "merge-without-parts", lambda tmp, v: __import__("qformat.checkpoint.split", fromlist=["merge"]).merge(tmp / "o")),
    U("DEPENDENCY_MISSING", "plot-without-matplotlib", _plot_without_matplotlib),
    U("CONVERT_FORMAT_UNKNOWN", "plain-safetensors", _convert(_plain_file)),
    U("CONVERT_FORMAT_UNKNOWN", "unknown-from", _convert(lambda tmp, v: v, from_format="no-such-format")),
    U("INDEX_INVALID", "convert-index-names-missing-shard", _convert(_index_missing_shard, dst="out")),  # check's code (issue 24)
    U("CONVERT_SOURCE_INVALID", "quantize-config-not-json",
      lambda tmp, v: qformat.quantize_checkpoint(_bad_config(tmp), tmp / "out", scheme="int")),
    U("QUANTIZE_PARTIAL_GROUPS", "quantize-strict-group-100",
      lambda tmp, v: qformat.quantize_checkpoint(_plain_384(tmp), tmp / "o.safetensors", scheme="int", group_size=100, strict=True)),
    U("CONVERT_UNSUPPORTED", "gguf-type-not-handled", _convert(_gguf_unknown_type)),
    U("CONVERT_DESTINATION_INVALID", "destination-is-source", _convert_onto_itself),
    U("QUANTIZE_DESTINATION_INVALID", "destination-is-source",
      lambda tmp, v: qformat.quantize_checkpoint(_plain_file(tmp, v), tmp / "plain.safetensors", scheme="int", overwrite=True)),
    U("QUANTIZE_DESTINATION_INVALID", "shard-size-not-a-size",
      lambda tmp, v: qformat.quantize_checkpoint(_plain_file(tmp, v), tmp / "o", scheme="int", max_shard_size="lots")),
    U("DEQUANTIZE_DESTINATION_INVALID", "destination-exists",
      lambda tmp, v: qformat.dequantize_checkpoint(v, v)),
    U("EXPORT_DESTINATION_INVALID", "destination-is-source",
      lambda tmp, v: __import__("qformat.export", fromlist=["export"]).export(v, v, to="compressed-tensors", overwrite=True)),
    U("FILE_UNREADABLE", "load-missing", lambda tmp, v: qformat.load_file(tmp / "missing.safetensors")),
    U("FILE_UNREADABLE", "open-missing", lambda tmp, v: qformat.safe_open(tmp / "missing.safetensors")),
    U("FILE_UNREADABLE", "load-folder", lambda tmp, v: qformat.load_file(tmp)),
    U("TENSOR_NOT_FOUND", "get_tensor", _slice(lambda f: f.get_tensor("nope"))),
    U("TENSOR_NOT_FOUND", "component-is-not-a-key", _slice(lambda f: f.get_tensor("w.codes"))),
    U("TENSOR_NOT_FOUND", "get_slice", _slice(lambda f: f.get_slice("nope"))),
    U("TENSOR_NOT_FOUND", "descriptor", _slice(lambda f: f.descriptor("nope"))),
    U("TENSOR_NOT_FOUND", "get_qtensor", _slice(lambda f: f.get_qtensor("nope"))),
    U("SLICE_INVALID", "negative-step", _slice(lambda f: f.get_slice("w")[::-1])),
    U("SLICE_INVALID", "zero-step", _slice(lambda f: f.get_slice("w")[::0])),
    U("SLICE_INVALID", "two-ellipses", _slice(lambda f: f.get_slice("w")[..., ...])),
    U("SLICE_INVALID", "non-empty-list", _slice(lambda f: f.get_slice("w")[[0, 1]])),
    U("SLICE_INVALID", "none-axis", _slice(lambda f: f.get_slice("w")[None])),
    U("SLICE_INVALID", "packed-box-with-step", _slice(lambda f: f.get_qtensor_slice("w", np.s_[::2]))),
    U("SLICE_INVALID", "too-many-indices", _slice(lambda f: f.get_slice("w")[0, 0, 0])),
    U("SLICE_INVALID", "index-out-of-range", _slice(lambda f: f.get_slice("w")[4])),
    U("SLICE_INVALID", "negative-out-of-range", _slice(lambda f: f.get_slice("w")[-5])),
    U("SLICE_INVALID", "string", _slice(lambda f: f.get_slice("w")["a"])),
    U("SLICE_INVALID", "list", _slice(lambda f: f.get_slice("w")[[0, 1]])),
    U("SLICE_INVALID", "bool", _slice(lambda f: f.get_slice("w")[True])),
    U("SLICE_INVALID", "none", _slice(lambda f: f.get_slice("w")[None])),
    U("SLICE_INVALID", "two-ellipses", _slice(lambda f: f.get_slice("w")[..., ...])),
    U("SLICE_INVALID", "plain-step", _slice(lambda f: f.get_slice("b")[::-1])),
    U("FRAMEWORK_UNKNOWN", "pt", lambda tmp, v: qformat.safe_open(v, framework="pt")),
    U("FRAMEWORK_UNKNOWN", "empty", lambda tmp, v: qformat.safe_open(v, framework="")),
    U("SCHEME_UNKNOWN", "no-such-scheme", lambda tmp, v: qformat.quantize(X, "no_such_scheme"), needs_schemes),
    U("SCHEME_UNKNOWN", "case-sensitive", lambda tmp, v: qformat.quantize(X, "NF4"), needs_schemes),
    U("ENCODE_PARAM_INVALID", "unknown-param", lambda tmp, v: qformat.quantize(X, "int", no_such_param=1), needs_schemes),
    U("ENCODE_PARAM_INVALID", "bits-99", lambda tmp, v: qformat.quantize(X, "int", bits=99), needs_schemes),
    U("ENCODE_PARAM_INVALID", "block-size-0", lambda tmp, v: qformat.quantize(X, "nf4", block_size=0), needs_schemes),
    U("ENCODE_INPUT_INVALID", "nan", lambda tmp, v: qformat.quantize(_nan_x(), "int"), needs_schemes),
    U("ENCODE_INPUT_INVALID", "inf", lambda tmp, v: qformat.quantize(_inf_x(), "nf4"), needs_schemes),
    U("ENCODE_INPUT_INVALID", "integer-array", lambda tmp, v: qformat.quantize(np.ones((8, 128), np.int32), "int"), needs_schemes),
    U("ENCODE_INPUT_INVALID", "complex-array", lambda tmp, v: qformat.quantize(X.astype(np.complex64), "int"), needs_schemes),
    U("SAVE_INVALID", "metadata-qformat-key", lambda tmp, v: _save(tmp, {"b": X}, {"qformat": "{}"})),
    U("SAVE_INVALID", "metadata-not-string", lambda tmp, v: _save(tmp, {"b": X}, {"a": 1})),
    U("SAVE_INVALID", "empty-name", lambda tmp, v: _save(tmp, {"": X})),
    U("SAVE_INVALID", "name-__metadata__", lambda tmp, v: _save(tmp, {"__metadata__": X})),
    U("SAVE_INVALID", "name-not-string", lambda tmp, v: _save(tmp, {1: X})),
    U("SAVE_INVALID", "object-array", lambda tmp, v: _save(tmp, {"a": np.array(["x"], object)})),
    U("SAVE_INVALID", "str-array", lambda tmp, v: _save(tmp, {"a": np.array(["x"])})),
    U("SAVE_INVALID", "component-collides-with-plain", lambda tmp, v: _save(tmp, {"w": _qt(), "w.scale": X})),
    U("SAVE_INVALID", "logical-collides-with-component", lambda tmp, v: _save(tmp, {"v": _qt(), "v.w.codes": _qt()})),
]


@pytest.mark.parametrize("code, call", USAGE_CASES)
def test_usage_error(code: str, call: Callable[[Path, Path], Any], tmp_path: Path, valid_path: Path) -> None:
    before = sorted(os.listdir(tmp_path))
    raises_code(code, lambda: call(tmp_path, valid_path))
    if code == "SAVE_INVALID":
        assert sorted(os.listdir(tmp_path)) == before, "a refused save must not leave files behind"


@pytest.mark.parametrize("target", ["missing.safetensors", "missing.safetensors.index.json", "empty-folder"])
def test_check_reports_file_unreadable(target: str, tmp_path: Path) -> None:
    if target == "empty-folder":
        (tmp_path / target).mkdir()
    assert "FILE_UNREADABLE" in check_codes(tmp_path / target)


# Codes only reachable through in-memory QTensors: the JSON Schema catches them first in files.
API_CASES = [
    pytest.param("DTYPE_INVALID", lambda tmp: _save(tmp, {"w": _qt(dtype="int8")}), id="DTYPE_INVALID-save"),
    pytest.param("DTYPE_INVALID", lambda tmp: _qt(dtype="float64").dequantize(), id="DTYPE_INVALID-dequantize"),
    pytest.param("LAYOUT_UNKNOWN", lambda tmp: _qt(layout={"name": "marlin", "parameters": {}}).dequantize(), id="LAYOUT_UNKNOWN-dequantize"),
    pytest.param("COMPONENT_MISSING", lambda tmp: _save(tmp, {"w": qformat.QTensor(int4_tensor("w")[0], {})}), id="COMPONENT_MISSING-save"),
    pytest.param("OUT_INVALID", lambda tmp: _qt().dequantize(out=np.empty((1, 1), np.float64)), id="OUT_INVALID-dequantize"),
]


@pytest.mark.parametrize("code, call", API_CASES)
def test_qtensor_error(code: str, call: Callable[[Path], Any], tmp_path: Path) -> None:
    raises_code(code, lambda: call(tmp_path))
    assert not list(tmp_path.iterdir())


def test_json_depth_limit_is_inclusive(write_bytes: Callable[..., Path]) -> None:
    limit = tables.limits()["max_json_depth"]
    # header: depth 64 parses (and fails later, on the metadata value), 65 does not parse
    p = write_bytes(raw_file('{"__metadata__":{"a":' + deep(limit - 2) + "}}"))
    assert check_codes(p) == ["METADATA_INVALID"]
    p = write_bytes(raw_file('{"__metadata__":{"a":' + deep(limit - 1) + "}}"))
    assert check_codes(p) == ["HEADER_INVALID_JSON"]
    # qformat value: depth 64 reads, 65 is refused
    p = write_bytes(build_file({"b": np.ones(2, np.float32)}, qformat=q_with_depth(limit)))
    assert check_codes(p) == []
    assert json.loads(q_with_depth(limit))  # sanity: the builder makes valid JSON
    p = write_bytes(build_file({"b": np.ones(2, np.float32)}, qformat=q_with_depth(limit + 1)))
    assert check_codes(p) == ["QFORMAT_JSON_INVALID"]


def test_qformat_json_may_end_with_json_whitespace(write_bytes: Callable[..., Path]) -> None:
    d, c = int4_tensor("w")
    text = json.dumps(qformat_object({"w": d})) + " \t\r\n"
    p = write_bytes(build_file(c, qformat=text))
    assert check_codes(p) == []


@pytest.mark.parametrize("change", [{"codes": None}, {"shape": "ab"}, {"scale": {"op": "multiply"}}], ids=["no-codes", "shape-str", "scale-no-blocks"])
def test_qtensor_schema_invalid_descriptor(change: dict, tmp_path: Path) -> None:
    d, c = int4_tensor("w")
    for k, v in change.items():
        if v is None:
            del d[k]
        else:
            d[k] = v
    with pytest.raises(QFormatError):
        qformat.save_file({"w": qformat.QTensor(d, c)}, tmp_path / "x.safetensors")
    with pytest.raises(QFormatError):
        qformat.QTensor(d, c).dequantize()


@pytest.mark.parametrize("bad", [5, None, [], {"shape": "ab"}, {"shape": None}, {"shape": [None]}, {"shape": [-4, 8]}], ids=str)
def test_get_slice_of_schema_invalid_descriptor(bad: Any, write_bytes: Callable[..., Path]) -> None:
    path = write_bytes(wfile(lambda d, t: d.__setitem__("w", bad) if not isinstance(bad, dict) else d["w"].update(bad)))
    with qformat.safe_open(path) as f:
        code = f.model.tensor_problems["w"][0].code
        assert code in ("SCHEMA_VIOLATION", "SHAPE_INVALID")
        raises_code(code, lambda: f.get_tensor("w"))
        raises_code(code, lambda: f.get_slice("w")[0])
        raises_code(code, lambda: f.get_slice("w").get_shape())


def test_newer_minor_unknown_top_level_member_is_ignored(write_bytes: Callable[..., Path]) -> None:
    """Minors are additive: a 1.1 reader ignores an optional top-level member a 1.2 file adds."""
    path = write_bytes(W(top={"future": 1}, version="1.3")())
    assert check_codes(path) == []
    assert qformat.load_file(path)["w"].shape == (4, 8)
    same_minor = write_bytes(W(top={"future": 1})())
    assert "SCHEMA_VIOLATION" in check_codes(same_minor)


def test_every_error_code_has_a_case() -> None:
    from qformat.container import STRICT_CODES

    # check --strict's codes: tests/test_container.py::test_read_as_safetensors_reads_it;
    # PLAIN_DTYPE_UNSUPPORTED (torch only since spec 1.2): tests/test_safetensors_parity.py
    covered = set(STRICT_CODES) | {"PLAIN_DTYPE_UNSUPPORTED"}
    covered |= {c.values[0].code for c in FILE_CASES}
    covered |= {c.values[0] for c in INDEX_CASES}
    covered |= {c.values[0] for c in USAGE_CASES}
    covered |= {c.values[0] for c in API_CASES}
    assert covered == ALL_CODES, f"no case for {sorted(ALL_CODES - covered)}; unknown {sorted(covered - ALL_CODES)}"


def test_error_classes_match_the_table() -> None:
    for code, info in tables.errors().items():
        e = qformat.errors.error(code, "m", tensor="t", field="f")
        assert_error(e, code)
        assert e.tensor == "t" and e.field == "f" and e.message == "m"
        assert set(info) >= {"category", "meaning"}
    with pytest.raises(KeyError):
        QFormatError("NO_SUCH_CODE", "m")


# ==========================================================================================
# Scope of errors: what still reads when one tensor is refused, and the positive twins
# ==========================================================================================
def _reads_others_but_not_w(path: Path, code: str) -> None:
    with qformat.safe_open(path) as f:
        assert "w" in f.keys() and "v" in f.keys() and "b" in f.keys()
        np.testing.assert_array_equal(f.get_tensor("b"), np.arange(3, dtype=np.float32))
        d, c = int4_tensor("v", seed=1)
        np.testing.assert_array_equal(f.get_tensor("v"), int4_expected(d, c))
        np.testing.assert_array_equal(f.get_slice("v")[1:3, 2:5], int4_expected(d, c)[1:3, 2:5])
        assert f.descriptor("w") is not None
        raises_code(code, lambda: f.get_tensor("w"))
        raises_code(code, lambda: f.get_slice("w")[0])
        raises_code(code, lambda: f.get_qtensor("w"))
    raises_code(code, lambda: qformat.load_file(path))
    probs = qformat.check(path).problems
    assert {(p.code, p.tensor) for p in probs} == {(code, "w")}


def test_feature_unsupported_is_confined_to_its_tensor(write_bytes: Callable[..., Path]) -> None:
    path = write_bytes(wfile(add_tensor("v"), setf("future_field", {"x": 1}), version="1.3"))
    _reads_others_but_not_w(path, "FEATURE_UNSUPPORTED")


def test_newer_minor_without_unknown_fields_reads(write_bytes: Callable[..., Path]) -> None:
    path = write_bytes(wfile(version="1.7"))
    assert check_codes(path) == []
    d, c = int4_tensor("w")
    np.testing.assert_array_equal(qformat.load_file(path)["w"], int4_expected(d, c))


def test_same_field_in_a_1_0_file_is_a_schema_violation_of_that_tensor(write_bytes: Callable[..., Path]) -> None:
    path = write_bytes(wfile(add_tensor("v"), setf("future_field", 1)))
    _reads_others_but_not_w(path, "SCHEMA_VIOLATION")


def test_tensor_scope_unknown_extension_is_confined(write_bytes: Callable[..., Path]) -> None:
    path = write_bytes(wfile(add_tensor("v"), setf("extensions", [{"name": "org.example.sparse"}])))
    _reads_others_but_not_w(path, "EXTENSION_UNKNOWN")


def test_file_scope_unknown_extension_refuses_the_whole_file(write_bytes: Callable[..., Path]) -> None:
    path = write_bytes(wfile(add_tensor("v"), top={"extensions": [{"name": "org.example.sparse"}]}))
    raises_code("EXTENSION_UNKNOWN", lambda: qformat.safe_open(path))
    probs = qformat.check(path).problems
    assert [(p.code, p.tensor) for p in probs] == [("EXTENSION_UNKNOWN", None)]


@pytest.mark.parametrize("scope", ["file", "tensor"])
def test_optional_unknown_extension_is_ignored(scope: str, write_bytes: Callable[..., Path]) -> None:
    ext = [{"name": "org.example.hint", "must_understand": False, "configuration": {"k": [1, 2]}}]
    data = wfile(top={"extensions": ext}) if scope == "file" else wfile(setf("extensions", ext))
    path = write_bytes(data)
    assert check_codes(path) == []
    d, c = int4_tensor("w")
    np.testing.assert_array_equal(qformat.load_file(path)["w"], int4_expected(d, c))


def test_group_index_shared_by_zero_and_scale_of_one_tensor(write_bytes: Callable[..., Path]) -> None:
    """GPTQ act-order: one g_idx serves both the scale and the zero point (SPEC 4.3)."""
    def share(descs: dict, tensors: dict) -> None:
        blocks = {"type": "grid", "size": [1, None], "index": {"axis": 1, "tensor": "w.g_idx", "count": 2}}
        descs["w"]["zero"] = {"blocks": blocks, "tensor": "w.zero"}

    path = write_bytes(wfile(gidx([1, 0, 1, 0, 0, 0, 1, 1]), put("w.zero", lambda: np.full((4, 2), 3, np.uint8)), share))
    assert check_codes(path) == []
    qformat.load_file(path)


def test_same_extension_name_in_different_lists(write_bytes: Callable[..., Path]) -> None:
    ext = [{"name": "org.example.hint", "must_understand": False}]
    path = write_bytes(wfile(add_tensor("v"), setf("extensions", ext), setf("extensions", ext, t="v"), top={"extensions": ext}))
    assert check_codes(path) == []


@pytest.mark.parametrize("scope", ["file", "tensor"])
def test_reserved_extension_in_newer_minor_is_an_optional_unknown(scope: str, write_bytes: Callable[..., Path]) -> None:
    ext = [{"name": "qformat.future", "must_understand": False}]
    data = wfile(top={"extensions": ext}, version="1.3") if scope == "file" else wfile(setf("extensions", ext), version="1.3")
    path = write_bytes(data)
    assert check_codes(path) == []
    qformat.load_file(path)


def test_empty_logical_name_refuses_only_itself(write_bytes: Callable[..., Path]) -> None:
    path = write_bytes(wfile(add_tensor("v"), lambda d, t: d.__setitem__("", d.pop("w")), version="1.5"))
    with qformat.safe_open(path) as f:
        d, c = int4_tensor("v", seed=1)
        np.testing.assert_array_equal(f.get_tensor("v"), int4_expected(d, c))
        raises_code("SCHEMA_VIOLATION", lambda: f.get_tensor(""))
    assert [(p.code, p.tensor) for p in qformat.check(path).problems] == [("SCHEMA_VIOLATION", "")]


def test_depth_3_is_allowed_and_decodes(write_bytes: Callable[..., Path]) -> None:
    path = write_bytes(wfile(nested(3)))
    assert check_codes(path) == []
    d, c = int4_tensor("w")
    c = dict(c, **{"w.scale": np.full((4, 2), 4.0, np.float16)})  # 2 ** (3 - 1)
    np.testing.assert_array_equal(qformat.load_file(path)["w"], int4_expected(d, c))


def test_padding_bits_are_ignored_by_the_decoder(write_bytes: Callable[..., Path]) -> None:
    clean = qformat.load_file(write_bytes(wfile(shape=(4, 7)), "clean.safetensors"))["w"]
    dirty = write_bytes(wfile(set_word("w.codes", (0, 3), 0xF0), set_word("w.codes", (2, 3), 0xF0), shape=(4, 7)))
    np.testing.assert_array_equal(qformat.load_file(dirty)["w"], clean)
    aligned = write_bytes(wfile(codes_padded(3, bad=True)), "aligned.safetensors")
    np.testing.assert_array_equal(qformat.load_file(aligned)["w"], qformat.load_file(write_bytes(wfile()))["w"])
    assert check_codes(write_bytes(wfile(codes_padded(3, bad=False)))) == []
    # --header-only skips payload checks
    assert qformat.check(dirty, payload=False).ok


def test_nonfinite_params_allowed_when_declared(write_bytes: Callable[..., Path]) -> None:
    path = write_bytes(wfile(setf("allow_nonfinite_params", True), set_word_f("w.scale", (1, 1), np.nan)))
    assert check_codes(path) == []
    w = qformat.load_file(path)["w"]
    assert np.isnan(w[1, 4:8]).all() and np.isfinite(np.delete(w[1], range(4, 8))).all()


def test_int_param_limit_is_inclusive(write_bytes: Callable[..., Path]) -> None:
    path = write_bytes(wfile(put("w.zero", lambda: np.full((4, 2), -(2**24), np.int32))))
    assert check_codes(path) == []


def test_valid_group_index_and_in_place_name(write_bytes: Callable[..., Path]) -> None:
    assert check_codes(write_bytes(wfile(gidx([1, 0, 1, 0, 0, 0, 1, 1], np.int64)))) == []

    def in_place(descs: dict, tensors: dict) -> None:
        descs["w"]["codes"]["tensor"] = "w"
        tensors["w"] = tensors.pop("w.codes")

    path = write_bytes(wfile(in_place))
    assert check_codes(path) == []
    with qformat.safe_open(path) as f:
        assert f.keys() == ["b", "w"]
        assert f.get_tensor("w").dtype == np.float32


def test_errors_name_their_tensor_and_field(write_bytes: Callable[..., Path]) -> None:
    path = write_bytes(wfile(put("w.scale", np.ones((4, 3), np.float16))))
    e = raises_code("COMPONENT_SHAPE", lambda: qformat.load_file(path))
    assert e.tensor == "w" and e.field == "scale.tensor"
    assert "[4, 2]" in e.message and "[4, 3]" in e.message
    (p,) = qformat.check(path).problems
    assert (p.tensor, p.field, p.file) == ("w", "scale.tensor", str(path))
    e = raises_code("TENSOR_SIZE_MISMATCH", lambda: qformat.load_file(write_bytes(raw_file(ent(data_offsets=[0, 4]), DATA8[:4]))))
    assert e.tensor == "t"


# ==========================================================================================
# Hostile inputs: no allocation from claimed sizes, no recursion, no stray exception types
# ==========================================================================================
def _peak_bytes(fn: Callable[[], Any]) -> int:
    """Peak traced allocation of ``fn()`` (QFormatError allowed), after a warm-up call that fills
    the caches (JSON Schema validator, tables)."""
    try:
        fn()
    except QFormatError:
        pass
    tracemalloc.start()
    try:
        try:
            fn()
        except QFormatError:
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


HOSTILE = [
    pytest.param(lambda: raw_file(json.dumps({"t": {"dtype": "F32", "shape": [10**6, 10**6], "data_offsets": [0, 4 * 10**12]}}), DATA8),
                 "DATA_TRUNCATED", id="header-1e12-F32"),
    pytest.param(lambda: raw_file(json.dumps({"t": {"dtype": "U8", "shape": [2**60], "data_offsets": [0, 2**60]}}), DATA8),
                 "DATA_TRUNCATED", id="header-2^60-U8"),
    pytest.param(lambda: wfile(setf("shape", [10**12]), setf("codes.packing.axis", 0), setf("zero.blocks.size", [4]),
                               setf("scale.blocks.size", [4])), "COMPONENT_SHAPE", id="descriptor-1e12"),
    pytest.param(lambda: wfile(setf("shape", [10**6, 10**6])), "COMPONENT_SHAPE", id="descriptor-1e6x1e6"),
    pytest.param(lambda: wfile(setf("shape", [2**53 - 1] * 16), setf("codes.packing.axis", None), delf("zero"), delf("scale")),
                 "SHAPE_INVALID", id="descriptor-rank16-2^53"),
    pytest.param(lambda: wfile(setf("shape", [2**31, 2**31])), "COMPONENT_SHAPE", id="descriptor-2^62"),
    pytest.param(lambda: wfile(gidx([0] * 8), setf("scale.blocks.index.count", 2**53 - 1)), "COMPONENT_SHAPE", id="group-count-2^53"),
    pytest.param(lambda: wfile(setf("scale.blocks", {"type": "flat", "size": 1}), setf("shape", [4, 10**12])),
                 "COMPONENT_SHAPE", id="flat-grid-4e12"),
    pytest.param(lambda: raw_file('{"x":' + deep(100_000) + "}", b""), "HEADER_INVALID_JSON", id="header-depth-1e5"),
    pytest.param(lambda: build_file({"b": np.ones(2, np.float32)}, qformat='{"version":"1.0","tensors":{},"x":' + "{\"a\":" * 50_000 + "1" + "}" * 50_001),
                 "QFORMAT_JSON_INVALID", id="qformat-depth-5e4"),
    pytest.param(lambda: raw_file('{"t":{"dtype":"F32","shape":[' + "9" * 5000 + '],"data_offsets":[0,8]}}', DATA8),
                 "SIZE_OVERFLOW", id="5000-digit-integer"),
    pytest.param(lambda: raw_file('{"t":{"dtype":"F32","shape":[' + "9" * 1_000_000 + '],"data_offsets":[0,8]}}', DATA8),
                 "SIZE_OVERFLOW", id="million-digit-integer"),
]


@pytest.mark.parametrize("make, code", HOSTILE)
def test_hostile_sizes_are_refused_quickly_without_allocating(make: Callable[[], bytes], code: str, write_bytes: Callable[..., Path]) -> None:
    path = write_bytes(make())
    t0 = time.perf_counter()
    raises_code(code, lambda: qformat.load_file(path))
    assert code in check_codes(path)
    assert time.perf_counter() - t0 < 5
    limit = 4 << 20
    assert _peak_bytes(lambda: qformat.load_file(path)) < limit
    assert _peak_bytes(lambda: qformat.check(path)) < limit


def test_zero_sized_tensor_with_huge_axis_reads_without_allocating(write_bytes: Callable[..., Path]) -> None:
    def zero_rows(descs: dict, tensors: dict) -> None:
        descs["w"]["shape"] = [0, 10**12]
        tensors["w.codes"] = np.zeros((0, 5 * 10**11), np.uint8)
        tensors["w.zero"] = np.zeros((0, 25 * 10**10), np.uint8)
        tensors["w.scale"] = np.zeros((0, 25 * 10**10), np.float16)

    path = write_bytes(wfile(zero_rows))
    assert check_codes(path) == []
    assert qformat.load_file(path)["w"].shape == (0, 10**12)
    assert _peak_bytes(lambda: qformat.load_file(path)) < 4 << 20
    assert _peak_bytes(lambda: qformat.check(path)) < 4 << 20


def test_huge_planes_span_is_harmless(write_bytes: Callable[..., Path]) -> None:
    def planes(descs: dict, tensors: dict) -> None:
        descs["w"]["codes"]["packing"]["planes"] = {"span": 2**53 - 1}
        codes = np.random.default_rng(0).integers(0, 16, (4, 8), dtype=np.uint8)
        tensors["w.codes"] = pack(codes, 4, descs["w"]["codes"]["packing"]).astype(np.uint8)

    path = write_bytes(wfile(planes))
    assert check_codes(path) == []
    assert qformat.load_file(path)["w"].shape == (4, 8)


# -- fuzzing ------------------------------------------------------------------------------
def _exercise(path: Path) -> None:
    """Everything a reader or checker does with a file; only QFormatError may escape."""
    try:
        qformat.load_file(path)
    except QFormatError:
        pass
    try:
        with qformat.safe_open(path) as f:
            for name in f.keys():
                calls = [lambda: f.get_tensor(name), lambda: f.descriptor(name), lambda: f.is_quantized(name),
                         lambda: f.get_slice(name)[:1], lambda: f.get_slice(name).get_shape()]
                for fn in calls:
                    try:
                        fn()
                    except QFormatError:
                        pass
    except QFormatError:
        pass
    rep = qformat.check(path)
    assert {p.code for p in rep.problems} <= ALL_CODES
    qformat.check(path, payload=False)


def _rich_file() -> bytes:
    """A valid file using more of the format: codebook table, group index, nested scale, planes."""
    tensors: dict[str, Any] = {}
    descs: dict[str, Any] = {}
    for edit, name, seed in ((nested(2), "w", 0), (gidx([0, 1] * 4), "g", 1)):
        d, c = int4_tensor("w", seed=seed)
        ds, ts = {"w": d}, dict(c)
        edit(ds, ts)
        ren = {k: k.replace("w.", name + ".", 1) for k in ts}
        descs[name] = json.loads(json.dumps(ds["w"]).replace('"w.', f'"{name}.'))
        tensors.update({ren[k]: v for k, v in ts.items()})
    d, c = codebook_tensor("c", n=7, table_len=10, codes=[0, 9, 3, 4, 5, 1, 2])
    descs["c"] = d
    tensors.update(c)
    d, c = int4_tensor("p", seed=2)
    d["codes"]["packing"]["planes"] = {"span": 4}
    d["codes"]["packing"]["slot_order"] = [1, 0]
    codes = np.random.default_rng(2).integers(0, 16, (4, 8), dtype=np.uint8)
    c["p.codes"] = pack(codes, 4, d["codes"]["packing"]).astype(np.uint8)
    descs["p"] = d
    tensors.update(c)
    tensors["b"] = np.arange(3, dtype=np.float32)
    return build_file(tensors, metadata={"note": "fuzz"}, qformat=qformat_object(descs))


SEEDS = {"small": valid_file(), "rich": _rich_file()}


def test_fuzz_seeds_are_valid(write_bytes: Callable[..., Path]) -> None:
    for name, data in SEEDS.items():
        path = write_bytes(data, f"{name}.safetensors")
        assert check_codes(path) == [], name
        qformat.load_file(path)


@st.composite
def mutated(draw: Any) -> bytes:
    data = bytearray(SEEDS[draw(st.sampled_from(sorted(SEEDS)))])
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "flip", "set", "insert", "delete", "truncate", "extend"]))
        i = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[i] = draw(st.sampled_from([0x00, 0x20, 0x22, 0x2C, 0x30, 0x39, 0x5B, 0x5C, 0x7B, 0x7D, 0x80, 0xFF]))
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[i : i + draw(st.integers(1, 8))]
        elif op == "truncate":
            del data[i:]
        else:
            data += draw(st.binary(min_size=1, max_size=16))
    return bytes(data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=mutated())
def test_fuzz_bytes(data: bytes, tmp_path: Path) -> None:
    path = tmp_path / "fuzz.safetensors"
    path.write_bytes(data)
    _exercise(path)


INTERESTING = [None, True, False, -1, 0, 1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 31, 32, 33, 255, 256, 2**24, 2**31, 2**32,
               2**53 - 1, 2**53, 2**63, 2**64, 10**30, 0.5, 1e308, "", "w.codes", "w.scale", "b", "nf4", "float32",
               "canonical", "divide", "flat", "grid", "lsb_first", "msb_first", [], [0], [1, 0], [None, None], {}]
json_values = st.recursive(
    st.sampled_from(INTERESTING) | st.integers(-(2**70), 2**70) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["type", "size", "tensor", "span", "x"]), inner, max_size=2),
    max_leaves=6)


@st.composite
def mutated_descriptor(draw: Any) -> bytes:
    """The rich file's tensors with 1-3 leaves or subtrees of the qformat object replaced,
    deleted, or given an extra key: mostly schema-valid nonsense that reaches semantics."""
    header_len = struct.unpack("<Q", SEEDS["rich"][:8])[0]
    header = json.loads(SEEDS["rich"][8 : 8 + header_len])
    data = SEEDS["rich"][8 + header_len :]
    q = json.loads(header["__metadata__"]["qformat"])
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in json_paths(q) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = q
        for k in path[:-1]:
            parent = parent[k]
        op = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add"]))
        if op == "replace":
            parent[path[-1]] = copy.deepcopy(draw(json_values))  # sampled lists/dicts are shared objects
        elif op == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif op == "add" and isinstance(parent, dict):
            key = draw(st.sampled_from(["order", "index", "planes", "slot_order", "row_alignment", "table_tensor", "encoded", "zero"]))
            parent[key] = copy.deepcopy(draw(json_values))
    header["__metadata__"]["qformat"] = json.dumps(q)
    if draw(st.booleans()):
        header["__metadata__"]["qformat"] = header["__metadata__"]["qformat"].replace('"1.0"', draw(st.sampled_from(['"1.3"', '"1.2"', '"1.1"', '"1.0"'])))
    return raw_file(header, data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=mutated_descriptor())
def test_fuzz_descriptors(data: bytes, tmp_path: Path) -> None:
    path = tmp_path / "fuzz.safetensors"
    path.write_bytes(data)
    _exercise(path)


@st.composite
def mutated_payload(draw: Any) -> bytes:
    """Random bytes in the data buffer only: the header stays valid, the payload does not."""
    seed = SEEDS[draw(st.sampled_from(sorted(SEEDS)))]
    start = 8 + struct.unpack("<Q", seed[:8])[0]
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 12))):
        i = draw(st.integers(start, len(data) - 1))
        data[i] = draw(st.integers(0, 255))
    return bytes(data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=mutated_payload())
def test_fuzz_payload(data: bytes, tmp_path: Path) -> None:
    path = tmp_path / "fuzz.safetensors"
    path.write_bytes(data)
    _exercise(path)


# ==========================================================================================
# Atomic writes
# ==========================================================================================
def _tensors() -> dict[str, Any]:
    d, c = int4_tensor("w")
    return {"w": qformat.QTensor(d, c), "big": np.arange(50_000, dtype=np.float32), "small": np.ones(3, np.float16)}


@pytest.fixture
def previous(tmp_path: Path) -> tuple[Path, bytes]:
    dest = tmp_path / "model.safetensors"
    qformat.save_file({"old": np.full(5, 7, np.int32)}, dest, metadata={"v": "old"})
    return dest, dest.read_bytes()


def _interrupt_write_array(monkeypatch: pytest.MonkeyPatch, exc: BaseException, after: int) -> None:
    import qformat.container as container

    real = container.write_array
    calls = {"n": 0}

    def write_array(f: Any, a: np.ndarray) -> None:
        calls["n"] += 1
        if calls["n"] > after:
            f.write(b"partial")
            raise exc
        real(f, a)

    monkeypatch.setattr(container, "write_array", write_array)


FAILURES = [
    pytest.param(lambda mp: _interrupt_write_array(mp, OSError(28, "No space left on device"), 1), OSError, id="disk-full-midway"),
    pytest.param(lambda mp: _interrupt_write_array(mp, KeyboardInterrupt(), 2), KeyboardInterrupt, id="keyboard-interrupt-midway"),
    pytest.param(lambda mp: _interrupt_write_array(mp, RuntimeError("tobytes failed"), 0), RuntimeError, id="first-array-fails"),
    pytest.param(lambda mp: mp.setattr(os, "fsync", _raise(OSError(5, "I/O error"))), OSError, id="fsync-fails"),
    pytest.param(lambda mp: mp.setattr(os, "replace", _raise(OSError(1, "Operation not permitted"))), OSError, id="replace-fails"),
    pytest.param(lambda mp: mp.setattr(os, "replace", _raise(KeyboardInterrupt())), KeyboardInterrupt, id="interrupt-at-replace"),
]


def _raise(exc: BaseException) -> Callable[..., Any]:
    def f(*a: Any, **k: Any) -> Any:
        raise exc
    return f


@pytest.mark.parametrize("fail, exc", FAILURES)
def test_failed_write_keeps_previous_file(fail: Callable[[pytest.MonkeyPatch], None], exc: type, previous: tuple[Path, bytes],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    dest, before = previous
    with monkeypatch.context() as mp:
        fail(mp)
        with pytest.raises(exc):
            qformat.save_file(_tensors(), dest)
    assert dest.read_bytes() == before
    assert os.listdir(dest.parent) == [dest.name], "a temporary file was left behind"
    assert qformat.load_file(dest)["old"].tolist() == [7] * 5


@pytest.mark.parametrize("fail, exc", FAILURES[:2])
def test_failed_write_of_a_new_file_leaves_nothing(fail: Callable[[pytest.MonkeyPatch], None], exc: type, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as mp:
        fail(mp)
        with pytest.raises(exc):
            qformat.save_file(_tensors(), tmp_path / "new.safetensors")
    assert os.listdir(tmp_path) == []


def test_refused_save_keeps_previous_file(previous: tuple[Path, bytes]) -> None:
    dest, before = previous
    raises_code("SAVE_INVALID", lambda: qformat.save_file({"a": np.ones(2)}, dest, metadata={"qformat": "x"}))
    raises_code("COMPONENT_SHAPE", lambda: qformat.save_file({"w": _qt(shape=[4, 9])}, dest))
    assert dest.read_bytes() == before
    assert os.listdir(dest.parent) == [dest.name]


def test_successful_write_replaces_atomically(previous: tuple[Path, bytes]) -> None:
    dest, before = previous
    with qformat.safe_open(dest) as old:
        qformat.save_file(_tensors(), dest)
        # the old mapping still sees the old bytes: the file was replaced, not rewritten
        assert old.get_tensor("old").tolist() == [7] * 5
    assert os.listdir(dest.parent) == [dest.name]
    assert set(qformat.load_file(dest)) == {"w", "big", "small"}
    assert check_codes(dest) == []


# ==========================================================================================
# No dynamic code execution anywhere in the package
# ==========================================================================================
FORBIDDEN_NAMES = {"pickle", "cPickle", "eval", "exec", "literal_eval", "import_module", "__import__", "marshal", "shelve"}


def _package_sources() -> list[Path]:
    root = Path(qformat.__file__).parent
    return sorted(root.rglob("*.py"))


#: The one allowed dynamic import: the conformance runner's ``--python MODULE:FUNCTION`` names
#: the user's own reader on the command line (like ``python -m``); no file content reaches it.
ALLOWED_DYNAMIC = {("qformat/conformance.py", "import_module"), ("qformat/conformance.py", "importlib.import_module")}


def test_no_dynamic_code_execution_in_qformat() -> None:
    found = []
    files = _package_sources()
    assert len(files) >= 10
    for path in files:
        text = path.read_text(encoding="utf-8")
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.NAME and tok.string in FORBIDDEN_NAMES:
                found.append(f"{path.relative_to(path.parent.parent)}:{tok.start[0]}: {tok.string}")
        for needle in ("importlib.import_module", "__import__(", "eval(", "exec(", "pickle"):
            # plain-text scan as well (comments and strings included), minus this project's prose
            for i, line in enumerate(text.splitlines(), 1):
                code = line.split("#", 1)[0]
                if needle in code and not code.strip().startswith(('"', "'")):
                    found.append(f"{path.relative_to(path.parent.parent)}:{i}: {needle}")
    found = [f for f in found if (f.split(":")[0], f.rsplit(": ", 1)[1]) not in ALLOWED_DYNAMIC]
    assert not found, "dynamic code execution / unsafe deserialization in qformat/: " + "; ".join(sorted(set(found)))
