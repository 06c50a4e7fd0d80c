"""Corpus cases for every error code: malformed containers, invalid content, unsupported features.

Every failing case holds exactly one defect in an otherwise valid file (the base: a 4-bit integer
tensor ``w`` [3, 7] with a U8 zero point and an F16 scale per group of 4, plus a plain F32 ``b``),
so any conforming reader must fail with the one code SPEC.md assigns.  The payload rules that
readers must not enforce (SPEC.md §7.10, §10.6, §12.5) are *valid* cases whose expected output
is decoded by conformance/spec_reference.py, while ``check`` lists the code a checker reports.
The forward-compatibility cases that must read (optional extensions, newer minors) live here
too.

The bytes are laid out by conformance/build.py only; nothing here uses qformat's writer, packing
or decoder (the error table is read for categories only).  Case ids are stable: add cases, never
rename or rebuild existing ones.
"""

from __future__ import annotations

import copy
import json
import struct
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from . import spec_reference as R
from .build import (
    Built,
    case,
    failing,
    header_entries,
    pk,
    q_file,
    qformat_json,
    qtensor,
    raw_file,
    st_file,
    valid,
    values,
)

GRID = lambda *s: {"type": "grid", "size": list(s)}  # noqa: E731
SHAPE = (3, 7)
U4 = {"type": "int", "bits": 4, "signedness": "unsigned"}
OPT = False  # must_understand false, for readability

Descs = dict[str, Any]
Comps = dict[str, Any]


# -- the base file and its variants ----------------------------------------------------------------
def base(rng: np.random.Generator) -> tuple[Descs, Comps, Comps]:
    """(descriptors, components, plain tensors) of a small valid file: ``w`` (4-bit unsigned codes,
    two per byte LSB-first along axis 1, rows of 7 codes so each row ends in a padding nibble; a U8
    zero point and an F16 scale per group of 4, the last group partial) and a plain F32 ``b``."""
    g = (3, 2)
    d, c = qtensor(rng, "w.", SHAPE, "float32", dict(U4), pk(8, rank=2),
                   {"zero": {"blocks": GRID(1, 4), "values": rng.integers(0, 16, size=g).astype(np.uint8)},
                    "scale": {"blocks": GRID(1, 4), "op": "multiply", "values": values(rng, g, np.float16)}})
    return {"w": d}, c, {"b": rng.normal(size=3).astype(np.float32)}


def second(rng: np.random.Generator, name: str = "v", shape: tuple[int, int] = SHAPE) -> tuple[dict, Comps]:
    """Another valid tensor like ``w`` (4-bit codes, F16 scale per group of 4, no zero point)."""
    return qtensor(rng, f"{name}.", shape, "float16", {"type": "int", "bits": 4, "signedness": "twos_complement"}, pk(8, rank=2),
                   {"scale": {"blocks": GRID(1, 4), "op": "multiply", "values": values(rng, (shape[0], -(-shape[1] // 4)), np.float16)}})


def nested_scale(rng: np.random.Generator, prefix: str, shape: tuple[int, ...], levels: int) -> tuple[dict, Comps]:
    """A float32 descriptor of ``shape`` (4-bit unsigned codes 1..7) whose per-tensor scale is
    itself encoded, ``levels`` descriptors in all; the innermost scale is a plain F32 0.5."""
    r = len(shape)
    if levels <= 1:
        param: dict[str, Any] = {"blocks": GRID(*[None] * r), "op": "multiply", "stored": np.array(0.5, np.float32)}
    else:
        param = {"blocks": GRID(*[None] * r), "op": "multiply", "encoded": nested_scale(rng, prefix + "s.", (1,) * r, levels - 1)}
    return qtensor(rng, prefix, shape, "float32", dict(U4), pk(8, rank=r), {"scale": param}, codes=rng.integers(1, 8, size=shape))


def base_nested(rng: np.random.Generator, levels: int = 1) -> tuple[Descs, Comps, Comps]:
    """The base with ``w``'s scale encoded by a nested descriptor (depth ``levels``)."""
    descs, comps, plain = base(rng)
    sub, subc = nested_scale(rng, "w.scale.", (3, 2), levels)
    del comps["w.scale"]
    comps.update(subc)
    descs["w"]["scale"] = {"blocks": GRID(1, 4), "op": "multiply", "encoded": sub}
    return descs, comps, plain


def base_gidx(rng: np.random.Generator, gidx: list[int], dtype: Any = np.int32) -> tuple[Descs, Comps, Comps]:
    """The base with ``w``'s scale indexed by a group index ``w.g_idx`` (count 2) along axis 1."""
    descs, comps, plain = base(rng)
    descs["w"]["scale"]["blocks"] = {"type": "grid", "size": [1, None], "index": {"axis": 1, "tensor": "w.g_idx", "count": 2}}
    comps["w.g_idx"] = np.array(gidx, dtype)
    return descs, comps, plain


def codebook_file(rng: np.random.Generator, codes: list[int], table_len: int = 10, bits: int = 4,
                  table: Any = None, named: str | None = None) -> tuple[Descs, Comps, Comps]:
    """A 1-D codebook tensor ``c`` (codes in one stream, axis null) with an in-file F32 table of
    ``table_len`` entries (or ``table`` as given, or the named table ``named``), plus plain ``b``."""
    el: dict[str, Any] = {"type": "codebook", "bits": bits}
    if named:
        el["table"] = named
    else:
        el["table_tensor"] = "c.table"
    pkg = pk(8, axis=None, rank=1)
    words = R.pack(np.array(codes), bits, pkg)
    comps: Comps = {"c.codes": words}
    if not named:
        comps["c.table"] = np.linspace(-1, 1, table_len).astype(np.float32) if table is None else table
    d = {"shape": [len(codes)], "dtype": "float32", "codes": {"tensor": "c.codes", "element": el, "packing": pkg}}
    return {"c": d}, comps, {"b": rng.normal(size=3).astype(np.float32)}


def qfile(descs: Descs, comps: Comps, plain: Comps | None = None, **kw: Any) -> bytes:
    return q_file(descs, comps, plain, **kw)


def qtext_file(text: str, comps: Comps, plain: Comps | None = None, extra_meta: dict[str, str] | None = None) -> bytes:
    """A file whose __metadata__["qformat"] is ``text`` verbatim."""
    return st_file({**comps, **(plain or {})}, {**(extra_meta or {}), "qformat": text})


def sub(text: str, old: str, new: str, count: int = 1) -> str:
    """``text`` with ``old`` replaced (it must occur)."""
    assert old in text, (old, text[:200])
    return text.replace(old, new, count)


def header_parts(rng: np.random.Generator) -> tuple[dict[str, Any], bytes, dict[str, Any]]:
    """(header object, data buffer, entries) of the base file."""
    descs, comps, plain = base(rng)
    entries, data = header_entries({**comps, **plain})
    return {"__metadata__": {"qformat": qformat_json(descs)}, **entries}, data, entries


def htext(header: dict[str, Any], ascii: bool = False) -> str:
    return json.dumps(header, separators=(",", ":"), ensure_ascii=ascii)


def entry_text(name: str, e: dict[str, Any]) -> str:
    return json.dumps(name) + ":" + json.dumps(e, separators=(",", ":"))


def mutate(rng: np.random.Generator, edit: Callable[[Descs, Comps, Comps], Any], maker: Callable = base, **kw: Any) -> bytes:
    """The base file (or ``maker``'s) with ``edit`` applied to copies of its parts; ``kw`` go to q_file."""
    descs, comps, plain = maker(rng)
    descs = copy.deepcopy(descs)
    edit(descs, comps, plain)
    return qfile(descs, comps, plain, **kw)


def setf(path: str, value: Any, t: str = "w") -> Callable[[Descs, Comps, Comps], None]:
    """Edit: set a dotted member of descriptor ``t``."""
    def edit(descs: Descs, comps: Comps, plain: Comps) -> None:
        *head, last = path.split(".")
        d = descs[t]
        for k in head:
            d = d[k]
        d[last] = copy.deepcopy(value)
    return edit


def delf(path: str, t: str = "w") -> Callable[[Descs, Comps, Comps], None]:
    def edit(descs: Descs, comps: Comps, plain: Comps) -> None:
        *head, last = path.split(".")
        d = descs[t]
        for k in head:
            d = d[k]
        del d[last]
    return edit


def edits(*fns: Callable[[Descs, Comps, Comps], Any]) -> Callable[[Descs, Comps, Comps], None]:
    def edit(descs: Descs, comps: Comps, plain: Comps) -> None:
        for f in fns:
            f(descs, comps, plain)
    return edit


def put(name: str, value: Any) -> Callable[[Descs, Comps, Comps], None]:
    """Edit: replace (or with None remove) the stored component ``name``."""
    def edit(descs: Descs, comps: Comps, plain: Comps) -> None:
        if value is None:
            del comps[name]
        else:
            comps[name] = value(comps[name]) if callable(value) else value
    return edit


def M(rng: np.random.Generator, code: str, *fns: Callable[[Descs, Comps, Comps], Any], maker: Callable = base,
      check: list[str] | None = None, **kw: Any) -> Built:
    """A failing case: the base (or ``maker``'s file) with edits, refused with ``code``."""
    return failing(mutate(rng, edits(*fns), maker, **kw), code, check_codes=check)


def ext(name: str, must: bool | None = None, **more: Any) -> dict[str, Any]:
    e: dict[str, Any] = {"name": name}
    if must is not None:
        e["must_understand"] = must
    e.update(more)
    return e


def with_ext(descs: Descs, exts: list[dict], t: str = "w") -> Descs:
    d = copy.deepcopy(descs)
    d[t]["extensions"] = exts
    return d


CONTAINER = ["container"]
STRICT = ["container", "strict-container"]


# ==================================================================================================
# §2 the container (malformed): one defect each, in the bytes of the base file
# ==================================================================================================
@case("malformed-header-too-small", "the file is 7 bytes long, shorter than the length prefix: refuse the file with HEADER_TOO_SMALL", ["2.1", "2.3"], CONTAINER)
def _(rng):
    return failing(qfile(*base(rng))[:7], "HEADER_TOO_SMALL")


@case("malformed-header-too-small-empty", "the file is empty (0 bytes): refuse it with HEADER_TOO_SMALL", ["2.3"], CONTAINER)
def _(rng):
    return failing(b"", "HEADER_TOO_SMALL")


@case("malformed-header-too-large",
      "the length prefix claims 100000001 header bytes, above max_header_bytes: refuse with HEADER_TOO_LARGE before reading the header "
      "(the file is necessarily also shorter than the claim; check 2 precedes check 3)", ["2.3", "13", "15"], CONTAINER)
def _(rng):
    data = qfile(*base(rng))
    return failing(struct.pack("<Q", 100_000_001) + data[8:], "HEADER_TOO_LARGE")


@case("malformed-header-length-zero", "the length prefix is 0 (an empty header): refuse with HEADER_LENGTH_INVALID", ["2.3"], CONTAINER)
def _(rng):
    return failing(struct.pack("<Q", 0), "HEADER_LENGTH_INVALID")


@case("malformed-header-length-past-end", "the length prefix points one byte past the end of the file: refuse with HEADER_LENGTH_INVALID", ["2.3"], CONTAINER)
def _(rng):
    data = qfile(*base(rng))
    return failing(struct.pack("<Q", len(data) - 8 + 1) + data[8:], "HEADER_LENGTH_INVALID")


def _not_utf8(rng: np.random.Generator, bad: bytes) -> bytes:
    header, data, _ = header_parts(rng)
    header["__metadata__"]["note"] = "@@"
    text = htext(header).encode("utf-8")
    return raw_file(text.replace(b"@@", bad), data)


@case("malformed-header-not-utf8", "a user metadata value holds the byte 0xFF, which is not UTF-8: refuse with HEADER_NOT_UTF8", ["2.3"], CONTAINER)
def _(rng):
    return failing(_not_utf8(rng, b"\xff"), "HEADER_NOT_UTF8")


@case("malformed-header-not-utf8-overlong", "a user metadata value holds the overlong UTF-8 form C0 AF of '/': refuse with HEADER_NOT_UTF8", ["2.3"], CONTAINER)
def _(rng):
    return failing(_not_utf8(rng, b"\xc0\xaf"), "HEADER_NOT_UTF8")


@case("malformed-header-not-utf8-surrogate", "a user metadata value holds ED A0 80, a UTF-8-encoded surrogate (forbidden by RFC 3629): refuse with HEADER_NOT_UTF8",
      ["2.3"], CONTAINER)
def _(rng):
    return failing(_not_utf8(rng, b"\xed\xa0\x80"), "HEADER_NOT_UTF8")


def _json_case(rng: np.random.Generator, fn: Callable[[str], str | bytes], pad: bool = True) -> bytes:
    header, data, _ = header_parts(rng)
    return raw_file(fn(htext(header)), data, pad=pad)


def _padded(text: str, byte: bytes) -> bytes:
    t = text.encode("utf-8")
    return t + byte * (8 - len(t) % 8 or 8)


@case("malformed-header-nul-padding", "the header object is followed by NUL bytes instead of spaces: refuse with HEADER_INVALID_JSON", ["2.1", "2.3"], CONTAINER)
def _(rng):
    return failing(_json_case(rng, lambda t: _padded(t, b"\x00"), pad=False), "HEADER_INVALID_JSON")


@case("malformed-header-bom", "the header begins with a UTF-8 byte order mark: refuse with HEADER_INVALID_JSON (not HEADER_LEADING_WHITESPACE)", ["2.3"], CONTAINER)
def _(rng):
    return failing(_json_case(rng, lambda t: "\ufeff" + t), "HEADER_INVALID_JSON")


@case("malformed-header-leading-vertical-tab", "the header begins with 0x0B, which is not JSON whitespace: refuse with HEADER_INVALID_JSON (not HEADER_LEADING_WHITESPACE)",
      ["2.3"], CONTAINER)
def _(rng):
    return failing(_json_case(rng, lambda t: "\x0b" + t), "HEADER_INVALID_JSON")


@case("malformed-header-trailing-text", "the header object is followed by text ('x') inside the header length: refuse with HEADER_INVALID_JSON", ["2.3"], CONTAINER)
def _(rng):
    return failing(_json_case(rng, lambda t: t + " x"), "HEADER_INVALID_JSON")


@case("malformed-header-not-object", "the header is a JSON array holding the header object: refuse with HEADER_INVALID_JSON", ["2.1", "2.3"], CONTAINER)
def _(rng):
    return failing(_json_case(rng, lambda t: "[" + t + "]"), "HEADER_INVALID_JSON")


@case("malformed-header-syntax-error", "the header JSON is cut off (its last closing brace is missing): refuse with HEADER_INVALID_JSON", ["2.3"], CONTAINER)
def _(rng):
    return failing(_json_case(rng, lambda t: t[:-1]), "HEADER_INVALID_JSON")


@case("malformed-header-nan-literal", "a user metadata member has the non-JSON literal NaN as its value: refuse with HEADER_INVALID_JSON", ["2.3"], CONTAINER)
def _(rng):
    return failing(_json_case(rng, lambda t: sub(t, '{"__metadata__":{', '{"__metadata__":{"note":NaN,')), "HEADER_INVALID_JSON")


@case("malformed-header-lone-surrogate", "a user metadata value holds the lone surrogate escape \\ud800: refuse with HEADER_INVALID_JSON", ["1.2", "2.3"], CONTAINER)
def _(rng):
    return failing(_json_case(rng, lambda t: sub(t, '{"__metadata__":{', '{"__metadata__":{"note":"a\\ud800b",')), "HEADER_INVALID_JSON")


@case("malformed-header-depth-100", "a user metadata member holds arrays nested so that the header's depth is 100 (> max_json_depth 64): refuse with HEADER_INVALID_JSON",
      ["2.3", "13", "15"], CONTAINER)
def _(rng):
    return failing(_json_case(rng, lambda t: sub(t, '{"__metadata__":{', '{"__metadata__":{"note":' + "[" * 98 + "]" * 98 + ",")),
                   "HEADER_INVALID_JSON")


@case("malformed-duplicate-tensor-name", "the plain tensor 'b' has two identical entries (safetensors keeps the last): refuse with HEADER_DUPLICATE_KEY",
      ["2.3", "2.4"], STRICT)
def _(rng):
    header, data, entries = header_parts(rng)
    e = entry_text("b", entries["b"])
    return failing(raw_file(sub(htext(header), e, e + "," + e), data), "HEADER_DUPLICATE_KEY")


@case("malformed-duplicate-metadata-key", "__metadata__ repeats the user key 'note' (safetensors keeps the last): refuse with HEADER_DUPLICATE_KEY",
      ["2.3", "2.4"], STRICT)
def _(rng):
    header, data, _ = header_parts(rng)
    return failing(raw_file(sub(htext(header), '{"__metadata__":{', '{"__metadata__":{"note":"1","note":"2",'), data), "HEADER_DUPLICATE_KEY")


@case("malformed-duplicate-metadata-object", "the header has two identical __metadata__ members: refuse with HEADER_DUPLICATE_KEY", ["2.1", "2.3"], STRICT)
def _(rng):
    header, data, _ = header_parts(rng)
    m = '"__metadata__":' + json.dumps(header["__metadata__"], separators=(",", ":"))
    return failing(raw_file(sub(htext(header), m, m + "," + m), data), "HEADER_DUPLICATE_KEY")


@case("malformed-duplicate-entry-member", "the entry of 'b' repeats its member 'dtype' (safetensors refuses this too): refuse with HEADER_DUPLICATE_KEY",
      ["2.3", "2.4"], STRICT)
def _(rng):
    header, data, _ = header_parts(rng)
    return failing(raw_file(sub(htext(header), '"b":{"dtype":"F32"', '"b":{"dtype":"F32","dtype":"F32"'), data), "HEADER_DUPLICATE_KEY")


@case("malformed-metadata-value-not-string", "a user __metadata__ value is the number 1, not a string: refuse with METADATA_INVALID", ["2.1", "2.3"], CONTAINER)
def _(rng):
    header, data, _ = header_parts(rng)
    header["__metadata__"]["note"] = 1
    return failing(raw_file(header, data), "METADATA_INVALID")


@case("malformed-metadata-qformat-object", "__metadata__['qformat'] is the qformat object itself instead of a string holding its JSON text: refuse with METADATA_INVALID",
      ["2.1", "2.3", "3.1"], CONTAINER)
def _(rng):
    header, data, _ = header_parts(rng)
    header["__metadata__"]["qformat"] = json.loads(header["__metadata__"]["qformat"])
    return failing(raw_file(header, data), "METADATA_INVALID")


@case("malformed-entry-extra-field", "the entry of 'b' has an extra member 'note' (safetensors ignores it): refuse with TENSOR_ENTRY_INVALID",
      ["2.1", "2.3", "2.4"], STRICT)
def _(rng):
    header, data, _ = header_parts(rng)
    header["b"]["note"] = "x"
    return failing(raw_file(header, data), "TENSOR_ENTRY_INVALID")


@case("malformed-entry-missing-field", "the entry of 'b' has no 'dtype': refuse with TENSOR_ENTRY_INVALID", ["2.1", "2.3"], CONTAINER)
def _(rng):
    header, data, _ = header_parts(rng)
    del header["b"]["dtype"]
    return failing(raw_file(header, data), "TENSOR_ENTRY_INVALID")


@case("malformed-entry-shape-float", "the shape of 'b' is written [3.0]: header integers have no fraction, so refuse with TENSOR_ENTRY_INVALID", ["2.1", "2.3"], CONTAINER)
def _(rng):
    header, data, _ = header_parts(rng)
    return failing(raw_file(sub(htext(header), '"shape":[3],', '"shape":[3.0],'), data), "TENSOR_ENTRY_INVALID")


@case("malformed-entry-offset-exponent", "the end offset of 'b' is written 1.2e1 (twelve, with an exponent): refuse with TENSOR_ENTRY_INVALID", ["2.1", "2.3"], CONTAINER)
def _(rng):
    header, data, _ = header_parts(rng)
    return failing(raw_file(sub(htext(header), '"data_offsets":[0,12]', '"data_offsets":[0,1.2e1]'), data), "TENSOR_ENTRY_INVALID")


@case("malformed-dtype-lower-case", "the plain tensor's dtype is 'f8_e4m3' (names are case-sensitive; F8_E4M3 exists): refuse with DTYPE_UNKNOWN", ["2.3", "2.5"], CONTAINER)
def _(rng):
    descs, comps, _ = base(rng)
    return failing(qfile(descs, comps, {"b": ("f8_e4m3", [4], bytes([0x38, 0x40, 0xB8, 0x00]))}), "DTYPE_UNKNOWN")


@case("malformed-dtype-unknown", "the plain tensor's dtype is 'F128', not a safetensors dtype: refuse with DTYPE_UNKNOWN", ["2.3", "2.5"], CONTAINER)
def _(rng):
    header, data, _ = header_parts(rng)
    header["b"]["dtype"] = "F128"
    return failing(raw_file(header, data), "DTYPE_UNKNOWN")


@case("malformed-size-overflow-count", "the shape of 'b' is [2^32, 2^32]: its element count reaches 2^64, refuse with SIZE_OVERFLOW", ["2.2", "2.3", "13"], CONTAINER)
def _(rng):
    header, data, _ = header_parts(rng)
    header["b"]["shape"] = [2**32, 2**32]
    return failing(raw_file(header, data), "SIZE_OVERFLOW")


@case("malformed-size-overflow-bits", "the shape of 'b' (F32) is [2^62]: the count fits in 64 bits, the bit count 2^67 does not: refuse with SIZE_OVERFLOW",
      ["2.2", "2.3", "13"], CONTAINER)
def _(rng):
    header, data, _ = header_parts(rng)
    header["b"]["shape"] = [2**62]
    return failing(raw_file(header, data), "SIZE_OVERFLOW")


@case("malformed-shape-wraps-2-64", "the shape of 'b' is [2^64 + 3], which is 3 if wrapped to 64 bits: refuse with SIZE_OVERFLOW (no wrap-around)",
      ["2.1", "2.2", "2.3"], CONTAINER)
def _(rng):
    header, data, _ = header_parts(rng)
    header["b"]["shape"] = [2**64 + 3]
    return failing(raw_file(header, data), "SIZE_OVERFLOW")


@case("malformed-offset-wraps-2-64", "the end offset of the last tensor is 2^64 plus its true value: refuse with TENSOR_SIZE_MISMATCH (no wrap-around)",
      ["2.1", "2.2", "2.3"], CONTAINER)
def _(rng):
    header, data, _ = header_parts(rng)
    header["w.zero"]["data_offsets"][1] += 2**64
    return failing(raw_file(header, data), "TENSOR_SIZE_MISMATCH")


@case("malformed-sub-byte-f4-odd", "an F4 tensor of shape [3] spans 12 bits, not whole bytes: refuse with SUB_BYTE_MISALIGNED", ["2.2", "2.3", "2.6"], CONTAINER)
def _(rng):
    descs, comps, plain = base(rng)
    return failing(qfile(descs, comps, {**plain, "f4": ("F4", [3], b"\x21\x03")}), "SUB_BYTE_MISALIGNED")


@case("malformed-sub-byte-f6", "an F6_E3M2 tensor of shape [2] spans 12 bits, not whole bytes: refuse with SUB_BYTE_MISALIGNED", ["2.2", "2.3", "2.6"], CONTAINER)
def _(rng):
    descs, comps, plain = base(rng)
    return failing(qfile(descs, comps, {**plain, "f6": ("F6_E3M2", [2], b"\x41\x02")}), "SUB_BYTE_MISALIGNED")


@case("malformed-size-mismatch", "'b' is declared F32 [2] but its data_offsets span 12 bytes: refuse with TENSOR_SIZE_MISMATCH", ["2.2", "2.3"], CONTAINER)
def _(rng):
    header, data, _ = header_parts(rng)
    header["b"]["shape"] = [2]
    return failing(raw_file(header, data), "TENSOR_SIZE_MISMATCH")


@case("malformed-offsets-overlap", "the last tensor's byte range starts 3 bytes inside the previous one's: refuse with OFFSETS_INVALID", ["2.2", "2.3"], CONTAINER)
def _(rng):
    header, data, _ = header_parts(rng)
    b, e = header["w.zero"]["data_offsets"]
    header["w.zero"]["data_offsets"] = [b - 3, e - 3]
    return failing(raw_file(header, data[:-3]), "OFFSETS_INVALID")


@case("malformed-offsets-hole", "4 unowned bytes lie between the last two tensors: refuse with OFFSETS_INVALID", ["2.2", "2.3"], CONTAINER)
def _(rng):
    header, data, _ = header_parts(rng)
    b, e = header["w.zero"]["data_offsets"]
    header["w.zero"]["data_offsets"] = [b + 4, e + 4]
    return failing(raw_file(header, data[:b] + b"\0" * 4 + data[b:]), "OFFSETS_INVALID")


@case("malformed-offsets-hole-at-start", "the data buffer starts with 4 unowned bytes (the first tensor begins at 4): refuse with OFFSETS_INVALID", ["2.2", "2.3"], CONTAINER)
def _(rng):
    header, data, entries = header_parts(rng)
    for n in entries:
        header[n]["data_offsets"] = [o + 4 for o in header[n]["data_offsets"]]
    return failing(raw_file(header, b"\0" * 4 + data), "OFFSETS_INVALID")


@case("malformed-data-truncated", "the file ends one byte before the last tensor's data does: refuse with DATA_TRUNCATED", ["2.2", "2.3"], CONTAINER)
def _(rng):
    return failing(qfile(*base(rng))[:-1], "DATA_TRUNCATED")


@case("malformed-trailing-bytes", "one byte follows the last tensor's data: refuse with TRAILING_BYTES", ["2.2", "2.3", "2.4"], CONTAINER)
def _(rng):
    return failing(qfile(*base(rng)) + b"\0", "TRAILING_BYTES")


@case("valid-header-escaped-surrogate-pair", "the header is written with \\u escapes, a user metadata value holding an escaped surrogate pair (U+1F600): a valid file, read it",
      ["1.2", "2.3"], CONTAINER)
def _(rng):
    descs, comps, plain = base(rng)
    entries, data = header_entries({**comps, **plain})
    header = {"__metadata__": {"note": "smile \U0001F600 caf\u00e9", "qformat": qformat_json(descs)}, **entries}
    text = htext(header, ascii=True)
    assert "\\ud83d\\ude00" in text
    return valid(descs, comps, plain, file_bytes=raw_file(text, data))


# ==================================================================================================
# §3 the qformat object
# ==================================================================================================
QJ = ["qformat-json"]


def _qtext(rng: np.random.Generator, fn: Callable[[str], str]) -> bytes:
    descs, comps, plain = base(rng)
    return qtext_file(fn(qformat_json(descs)), comps, plain)


@case("invalid-qformat-json-not-json", "__metadata__['qformat'] is the text 'not json': refuse the file with QFORMAT_JSON_INVALID", ["3.1", "3.7"], QJ)
def _(rng):
    return failing(_qtext(rng, lambda t: "not json"), "QFORMAT_JSON_INVALID")


@case("invalid-qformat-json-duplicate-key", "the descriptor of 'w' repeats its member 'dtype' (same value): refuse the file with QFORMAT_JSON_INVALID", ["3.1", "3.7"], QJ)
def _(rng):
    return failing(_qtext(rng, lambda t: sub(t, '"dtype":"float32"', '"dtype":"float32","dtype":"float32"')), "QFORMAT_JSON_INVALID")


@case("invalid-qformat-json-duplicate-tensor", "the qformat object's 'tensors' lists 'w' twice (same descriptor): refuse the file with QFORMAT_JSON_INVALID", ["3.1"], QJ)
def _(rng):
    def fn(t: str) -> str:
        q = json.loads(t)
        d = json.dumps(q["tensors"]["w"], separators=(",", ":"), sort_keys=True)
        return sub(t, '"w":' + d, '"w":' + d + ',"w":' + d)
    return failing(_qtext(rng, fn), "QFORMAT_JSON_INVALID")


@case("invalid-qformat-json-lone-surrogate", "the descriptor's informative 'scheme' holds the lone surrogate escape \\udc00: refuse the file with QFORMAT_JSON_INVALID",
      ["1.2", "3.1"], QJ)
def _(rng):
    return failing(_qtext(rng, lambda t: sub(t, '"dtype":"float32"', '"dtype":"float32","scheme":"int\\udc00"')), "QFORMAT_JSON_INVALID")


@case("invalid-qformat-json-nan", "the qformat text holds a NaN literal (as the value of an optional extension's configuration member): refuse the file with QFORMAT_JSON_INVALID",
      ["3.1"], QJ)
def _(rng):
    return failing(_qtext(rng, lambda t: sub(t, '{"tensors":', '{"extensions":[{"configuration":{"x":NaN},"must_understand":false,"name":"org.example.x"}],"tensors":')),
                   "QFORMAT_JSON_INVALID")


@case("invalid-qformat-json-trailing-text", "the qformat object is followed by ' x': refuse the file with QFORMAT_JSON_INVALID", ["3.1"], QJ)
def _(rng):
    return failing(_qtext(rng, lambda t: t + " x"), "QFORMAT_JSON_INVALID")


@case("invalid-qformat-json-leading-space", "the qformat text begins with a space before '{': refuse the file with QFORMAT_JSON_INVALID", ["3.1"], QJ)
def _(rng):
    return failing(_qtext(rng, lambda t: " " + t), "QFORMAT_JSON_INVALID")


@case("invalid-qformat-json-array", "the qformat text is a JSON array holding the qformat object: refuse the file with QFORMAT_JSON_INVALID", ["3.1"], QJ)
def _(rng):
    return failing(_qtext(rng, lambda t: "[" + t + "]"), "QFORMAT_JSON_INVALID")


def _deep_ext(depth: int) -> str:
    """An optional file-scope extension whose configuration makes the qformat object ``depth`` deep."""
    k = depth - 3  # the object, its extensions array and the extension object hold the configuration
    return '{"configuration":' + '{"a":' * (k - 1) + "{}" + "}" * (k - 1) + ',"must_understand":false,"name":"org.example.deep"}'


@case("invalid-qformat-json-depth-65", "an optional extension's configuration nests so that the qformat object has depth 65 (> max_json_depth 64): refuse with QFORMAT_JSON_INVALID",
      ["3.1", "13", "15"], QJ)
def _(rng):
    return failing(_qtext(rng, lambda t: sub(t, '{"tensors":', '{"extensions":[' + _deep_ext(65) + '],"tensors":')), "QFORMAT_JSON_INVALID")


@case("valid-qformat-json-depth-64", "the qformat object nests exactly max_json_depth (64) deep through an optional extension's configuration: read it",
      ["3.1", "3.5", "15"], QJ + ["forward-compat"])
def _(rng):
    descs, comps, plain = base(rng)
    text = sub(qformat_json(descs), '{"tensors":', '{"extensions":[' + _deep_ext(64) + '],"tensors":')
    return valid(descs, comps, plain, file_bytes=qtext_file(text, comps, plain))


@case("valid-qformat-json-trailing-whitespace", "the qformat object is followed by JSON whitespace (line feed, tab, CR, space), which is allowed: read it",
      ["3.1"], QJ)
def _(rng):
    descs, comps, plain = base(rng)
    return valid(descs, comps, plain, file_bytes=qtext_file(qformat_json(descs) + "\n\t\r ", comps, plain))


@case("valid-qformat-integral-floats", "qformat integers written as 7.0, 4e0 and 4.0 are the integers 7 and 4 (JSON Schema numbers): read it",
      ["3.2"], QJ)
def _(rng):
    descs, comps, plain = base(rng)
    t = qformat_json(descs)
    t = sub(t, '"shape":[3,7]', '"shape":[3,7.0]')
    t = sub(t, '"bits":4', '"bits":4e0')
    t = sub(t, '"size":[1,4]', '"size":[1,4.0]')
    return valid(descs, comps, plain, file_bytes=qtext_file(t, comps, plain))


@case("valid-user-metadata-ignored", "a user metadata key 'qformat_note' and 'format' sit beside 'qformat': they must be ignored; read it",
      ["3.1"], QJ)
def _(rng):
    descs, comps, plain = base(rng)
    return valid(descs, comps, plain, extra_meta={"format": "pt", "qformat_note": "{not json"})


# -- §3.3 version --------------------------------------------------------------------------------
VER = ["version"]


@case("invalid-version-missing", "the qformat object has 'tensors' but no 'version': refuse the file with VERSION_MISSING", ["3.3", "3.7"], VER)
def _(rng):
    return failing(_qtext(rng, lambda t: json.dumps({"tensors": json.loads(t)["tensors"]}, separators=(",", ":"), sort_keys=True)), "VERSION_MISSING")


for _v, _txt in (("1.00", '"1.00"'), ("01.0", '"01.0"'), ("number-1.0", "1.0"), ("1", '"1"'), ("1.0.0", '"1.0.0"'), ("trailing-newline", '"1.0\\n"')):
    @case(f"invalid-version-{_v}", f"'version' is {_txt}, not a string MAJOR.MINOR without leading zeros: refuse the file with VERSION_INVALID", ["3.3", "3.7"], VER)
    def _(rng, txt=_txt):
        return failing(_qtext(rng, lambda t: sub(t, '"version":"1.0"', '"version":' + txt)), "VERSION_INVALID")


for _v in ("2.0", "0.9"):
    @case(f"unsupported-version-{_v}", f"'version' is \"{_v}\", a major version other than 1: refuse the file with VERSION_UNSUPPORTED", ["3.3", "3.4"], VER + ["forward-compat"])
    def _(rng, v=_v):
        return M(rng, "VERSION_UNSUPPORTED", version=v)


# -- §3.2 / §3.4 schema of the qformat object; newer minors -------------------------------------
SCH = ["schema"]
FWD = ["forward-compat"]


@case("invalid-schema-unknown-top-member", "a 1.0 qformat object has an unknown top-level member 'producer': refuse the file with SCHEMA_VIOLATION", ["3.2", "3.7"], SCH)
def _(rng):
    return M(rng, "SCHEMA_VIOLATION", producer="x")


@case("invalid-schema-tensors-not-object", "the qformat object's 'tensors' is an array: refuse the file with SCHEMA_VIOLATION", ["3.2"], SCH)
def _(rng):
    return failing(_qtext(rng, lambda t: json.dumps({"tensors": [], "version": "1.0"}, separators=(",", ":"))), "SCHEMA_VIOLATION")


@case("invalid-schema-tensors-missing", "the qformat object has a version but no 'tensors': refuse the file with SCHEMA_VIOLATION", ["3.2"], SCH)
def _(rng):
    return failing(_qtext(rng, lambda t: '{"version":"1.0"}'), "SCHEMA_VIOLATION")


@case("invalid-schema-extension-without-name", "a file-scope extension object has no 'name': refuse the file with SCHEMA_VIOLATION", ["3.2", "3.5"], SCH + ["extensions"])
def _(rng):
    return M(rng, "SCHEMA_VIOLATION", extensions=[{"must_understand": False}])


@case("invalid-schema-empty-logical-name", "the logical tensor is named '' in 'tensors': refuse that tensor with SCHEMA_VIOLATION", ["3.2", "3.7"], SCH)
def _(rng):
    return M(rng, "SCHEMA_VIOLATION", lambda d, c, p: d.__setitem__("", d.pop("w")))


@case("invalid-schema-empty-logical-name-1.1", "a 1.1 file names a logical tensor '': SCHEMA_VIOLATION in files of any minor (not FEATURE_UNSUPPORTED)",
      ["3.2", "3.4"], SCH + FWD)
def _(rng):
    return M(rng, "SCHEMA_VIOLATION", lambda d, c, p: d.__setitem__("", d.pop("w")), version="1.1")


@case("unsupported-feature-1.1-descriptor-member", "a 1.1 file's descriptor has a member 'sparsity' that 1.1 does not define: SCHEMA_VIOLATION for a 1.1 or 1.2 reader (a 1.0 reader: FEATURE_UNSUPPORTED; see the -1.3 case)",
      ["3.4", "5.5"], FWD)
def _(rng):
    return M(rng, "SCHEMA_VIOLATION", setf("sparsity", {"pattern": "2:4"}), version="1.1")


@case("unsupported-feature-1.1-new-dtype", "a 1.1 file's descriptor has dtype 'float8', which 1.1 does not define: DTYPE_INVALID for a 1.1 or 1.2 reader (see the -1.3 case)",
      ["3.4", "5.3", "5.5"], FWD)
def _(rng):
    return M(rng, "DTYPE_INVALID", setf("dtype", "float8"), version="1.1")


@case("unsupported-feature-1.1-element-member", "a 1.1 file's element has an unknown member 'rounding': ELEMENT_INVALID for a 1.1 or 1.2 reader (a failure inside the element, §5.5; see the -1.3 case)",
      ["3.4", "5.5"], FWD)
def _(rng):
    return M(rng, "ELEMENT_INVALID", setf("codes.element.rounding", "stochastic"), version="1.1")


@case("unsupported-feature-1.1-top-member-type", "a 1.1 file's known top-level member 'extensions' is an object, not an array: SCHEMA_VIOLATION for a 1.1 or 1.2 reader (see the -1.3 case)",
      ["3.4", "3.7"], FWD)
def _(rng):
    return M(rng, "SCHEMA_VIOLATION", version="1.1", extensions={"name": "org.example.x"})


@case("forward-compat-1.1-unknown-top-member", "a 1.1 file has an unknown top-level member 'producer': SCHEMA_VIOLATION for a 1.1 or 1.2 reader, whole file (a 1.0 reader ignores it; see the -1.3 case)",
      ["3.4"], FWD)
def _(rng):
    descs, comps, plain = base(rng)
    return failing(qfile(descs, comps, plain, version="1.1", producer={"name": "x", "build": 7}), "SCHEMA_VIOLATION")


@case("forward-compat-1.1-plain", "a 1.1 file that validates against the 1.0 schema: read it exactly as a 1.0 file", ["3.4"], FWD)
def _(rng):
    descs, comps, plain = base(rng)
    return valid(descs, comps, plain, version="1.1")


# -- §3.5 extensions -------------------------------------------------------------------------------
EXT = ["extensions"]


@case("forward-compat-optional-extension-file", "an unknown file-scope extension with must_understand false: ignore it and read everything", ["3.5"], EXT + FWD)
def _(rng):
    descs, comps, plain = base(rng)
    return valid(descs, comps, plain, extensions=[ext("org.example.stats", OPT, configuration={"mean": 0.1})])


@case("forward-compat-optional-extension-tensor", "an unknown tensor-scope extension with must_understand false on 'w': ignore it and decode 'w'", ["3.5"], EXT + FWD)
def _(rng):
    descs, comps, plain = base(rng)
    return valid(with_ext(descs, [ext("org.example.stats", OPT)]), comps, plain)


@case("forward-compat-optional-extension-nested", "an unknown optional extension inside a nested (encoded) descriptor: ignore it and decode", ["3.5", "9.3"], EXT + FWD)
def _(rng):
    descs, comps, plain = base_nested(rng, 1)
    descs["w"]["scale"]["encoded"]["extensions"] = [ext("org.example.stats", OPT)]
    return valid(descs, comps, plain)


@case("forward-compat-same-extension-two-lists", "the same optional extension name at file scope and in a descriptor (names are unique per list only): read it",
      ["3.5"], EXT + FWD)
def _(rng):
    descs, comps, plain = base(rng)
    e = ext("org.example.stats", OPT)
    return valid(with_ext(descs, [e]), comps, plain, extensions=[e])


@case("forward-compat-1.1-reserved-optional-extension", "a 1.1 file has the optional extension 'qformat.x', which 1.1 does not register: EXTENSION_NAME_INVALID for a 1.1 or 1.2 reader (see the -1.3 case)",
      ["3.4", "3.5"], EXT + FWD)
def _(rng):
    descs, comps, plain = base(rng)
    return failing(qfile(descs, comps, plain, version="1.1", extensions=[ext("qformat.x", OPT)]), "EXTENSION_NAME_INVALID")


@case("unsupported-extension-file-scope", "an unknown file-scope extension with must_understand defaulted (true): refuse the file with EXTENSION_UNKNOWN", ["3.5", "3.7"], EXT + FWD)
def _(rng):
    return M(rng, "EXTENSION_UNKNOWN", extensions=[ext("org.example.sparsity", configuration={"pattern": "2:4"})])


@case("unsupported-extension-tensor-scope", "an unknown tensor-scope extension on 'w' with must_understand true: refuse 'w' with EXTENSION_UNKNOWN", ["3.5", "3.7"], EXT + FWD)
def _(rng):
    return M(rng, "EXTENSION_UNKNOWN", setf("extensions", [ext("org.example.sparsity", True)]))


@case("unsupported-extension-nested", "an unknown must-understand extension inside a nested (encoded) descriptor: refuse 'w' with EXTENSION_UNKNOWN", ["3.5", "9.3"], EXT + FWD)
def _(rng):
    return M(rng, "EXTENSION_UNKNOWN", setf("scale.encoded.extensions", [ext("org.example.sparsity")]), maker=lambda r: base_nested(r, 1))


@case("unsupported-extension-reserved-1.1", "a 1.1 file has the must-understand extension 'qformat.x', which 1.1 does not register: EXTENSION_NAME_INVALID for a 1.1 or 1.2 reader (see the -1.3 case)",
      ["3.4", "3.5"], EXT + FWD)
def _(rng):
    return M(rng, "EXTENSION_NAME_INVALID", version="1.1", extensions=[ext("qformat.x")])


# The same situations one minor above this corpus's version (1.1): what "-1.1" cases tested
# for a 1.0 reader.
@case("unsupported-feature-1.3-descriptor-member", "a 1.3 file's descriptor has a member 'sparsity' unknown to a 1.2 reader: refuse that tensor with FEATURE_UNSUPPORTED",
      ["3.4"], ["descriptor"] + FWD)
def _(rng):
    return M(rng, "FEATURE_UNSUPPORTED", setf("sparsity", {"pattern": "2:4"}), version="1.3")


@case("unsupported-feature-1.3-new-dtype", "a 1.3 file's descriptor has dtype 'float8': FEATURE_UNSUPPORTED, not DTYPE_INVALID", ["3.4"], ["descriptor"] + FWD)
def _(rng):
    return M(rng, "FEATURE_UNSUPPORTED", setf("dtype", "float8"), version="1.3")


@case("unsupported-feature-1.3-element-member", "a 1.3 file's element has an unknown member 'rounding': FEATURE_UNSUPPORTED, not ELEMENT_INVALID", ["3.4"], ["descriptor"] + FWD)
def _(rng):
    return M(rng, "FEATURE_UNSUPPORTED", setf("codes.element.rounding", "stochastic"), version="1.3")


@case("unsupported-feature-1.3-top-member-type", "a 1.3 file's known top-level member 'extensions' is an object: refuse the file with FEATURE_UNSUPPORTED", ["3.4"], FWD)
def _(rng):
    return M(rng, "FEATURE_UNSUPPORTED", version="1.3", extensions={"name": "org.example.x"})


@case("forward-compat-1.3-unknown-top-member", "a 1.3 file has an unknown top-level member 'producer' (a newer minor adds optional members): ignore it and read the file",
      ["3.4"], FWD)
def _(rng):
    descs, comps, plain = base(rng)
    return valid(descs, comps, plain, version="1.3", producer={"name": "x", "build": 7})


@case("forward-compat-1.3-reserved-optional-extension", "a 1.3 file has the unregistered optional extension 'qformat.x' (may come from the newer minor): ignore it and read",
      ["3.4", "3.5"], EXT + FWD)
def _(rng):
    descs, comps, plain = base(rng)
    return valid(descs, comps, plain, version="1.3", extensions=[ext("qformat.x", OPT)])


@case("unsupported-extension-reserved-1.3", "a 1.3 file has the must-understand extension 'qformat.x', unknown to a 1.2 reader: refuse the file with EXTENSION_UNKNOWN",
      ["3.4", "3.5"], EXT + FWD)
def _(rng):
    return M(rng, "EXTENSION_UNKNOWN", version="1.3", extensions=[ext("qformat.x")])


for _id, _n, _what in (("no-dot", "sparsity", "has no dot"), ("upper-case", "Org.Example.Sparsity", "has upper-case letters"),
                       ("empty-label", "org..sparsity", "has an empty label"), ("trailing-newline", "org.example.x\n", "ends with a line feed"),
                       ("reserved", "qformat.x", "uses the reserved 'qformat.' namespace unregistered in 1.0")):
    @case(f"invalid-extension-name-{_id}", f"an optional file-scope extension name {_what}: refuse the file with EXTENSION_NAME_INVALID (whatever must_understand says)",
          ["3.5", "3.7"], EXT)
    def _(rng, n=_n):
        return M(rng, "EXTENSION_NAME_INVALID", extensions=[ext(n, OPT)])


@case("invalid-extension-name-repeated", "the file-scope extension list names 'org.example.x' twice (both optional): refuse the file with EXTENSION_NAME_INVALID", ["3.5"], EXT)
def _(rng):
    return M(rng, "EXTENSION_NAME_INVALID", extensions=[ext("org.example.x", OPT), ext("org.example.x", OPT)])


@case("invalid-extension-name-tensor-no-dot", "an optional tensor-scope extension on 'w' is named 'sparsity' (no dot): refuse 'w' with EXTENSION_NAME_INVALID", ["3.5"], EXT)
def _(rng):
    return M(rng, "EXTENSION_NAME_INVALID", setf("extensions", [ext("sparsity", OPT)]))


@case("invalid-extension-name-tensor-reserved", "an optional tensor-scope extension 'qformat.x' in a 1.0 file: refuse 'w' with EXTENSION_NAME_INVALID", ["3.5"], EXT)
def _(rng):
    return M(rng, "EXTENSION_NAME_INVALID", setf("extensions", [ext("qformat.x", OPT)]))


@case("invalid-extension-name-tensor-repeated", "the extension list of 'w' names 'org.example.x' twice: refuse 'w' with EXTENSION_NAME_INVALID", ["3.5"], EXT)
def _(rng):
    return M(rng, "EXTENSION_NAME_INVALID", setf("extensions", [ext("org.example.x", OPT), ext("org.example.x", OPT)]))


# ==================================================================================================
# §5 descriptors: schema failures and their specific codes (§5.5)
# ==================================================================================================
DESC = ["descriptor"]


@case("invalid-dtype-int8", "the logical dtype is 'int8' (only float32, float16, bfloat16): refuse 'w' with DTYPE_INVALID", ["5.3", "5.5"], DESC)
def _(rng):
    return M(rng, "DTYPE_INVALID", setf("dtype", "int8"))


@case("invalid-dtype-storage-name", "the logical dtype is 'F32', a storage dtype name: refuse 'w' with DTYPE_INVALID", ["5.3", "5.5"], DESC)
def _(rng):
    return M(rng, "DTYPE_INVALID", setf("dtype", "F32"))


@case("invalid-shape-negative", "the logical shape is [-3, 7]: refuse 'w' with SHAPE_INVALID", ["5.2", "5.5"], DESC)
def _(rng):
    return M(rng, "SHAPE_INVALID", setf("shape", [-3, 7]))


@case("invalid-shape-numel-2-64", "the logical shape [2^32, 2^32] has 2^64 elements: refuse 'w' with SHAPE_INVALID", ["5.2", "3.7", "13"], DESC)
def _(rng):
    return M(rng, "SHAPE_INVALID", setf("shape", [2**32, 2**32]))


@case("invalid-element-bits-9", "the integer element has bits 9 (1 to 8): refuse 'w' with ELEMENT_INVALID", ["6.2", "5.5"], DESC)
def _(rng):
    return M(rng, "ELEMENT_INVALID", setf("codes.element.bits", 9))


@case("invalid-element-unknown-member", "the element has an unknown member 'rounding' (a failure inside the element sits at the element): refuse 'w' with ELEMENT_INVALID",
      ["5.5", "6.2"], DESC)
def _(rng):
    return M(rng, "ELEMENT_INVALID", setf("codes.element.rounding", "nearest"))


@case("invalid-element-float-format", "the float element names the unknown format 'e3m4': refuse 'w' with ELEMENT_INVALID", ["6.3", "5.5"], DESC)
def _(rng):
    return M(rng, "ELEMENT_INVALID", setf("codes.element", {"type": "float", "format": "e3m4"}))


@case("invalid-element-codebook-name", "the codebook element names the unknown table 'nf5': refuse 'w' with ELEMENT_INVALID", ["6.4", "5.5"], DESC)
def _(rng):
    return M(rng, "ELEMENT_INVALID", setf("codes.element", {"type": "codebook", "bits": 4, "table": "nf5"}))


@case("invalid-element-code-offset", "4-bit codes with code_offset 16 (must be below 2^bits; the schema allows up to 255): refuse 'w' with ELEMENT_INVALID",
      ["6.2", "12.2"], DESC)
def _(rng):
    return M(rng, "ELEMENT_INVALID", setf("codes.element.code_offset", 16))


@case("invalid-element-code-offset-nested", "a nested descriptor's 4-bit codes have code_offset 16: a semantic rule, so ELEMENT_INVALID at any depth (not SCHEMA_VIOLATION)",
      ["5.5", "6.2", "9.3"], DESC)
def _(rng):
    return M(rng, "ELEMENT_INVALID", setf("scale.encoded.codes.element.code_offset", 16), maker=lambda r: base_nested(r, 1))


@case("invalid-packing-container-64", "codes.packing.container is 64 (8, 16 or 32): refuse 'w' with PACKING_INVALID", ["7.1", "7.11", "5.5"], DESC)
def _(rng):
    return M(rng, "PACKING_INVALID", setf("codes.packing.container", 64))


@case("invalid-packing-missing-axis", "codes.packing has no 'axis' (a required member of packing): refuse 'w' with PACKING_INVALID", ["7.1", "5.5"], DESC)
def _(rng):
    return M(rng, "PACKING_INVALID", delf("codes.packing.axis"))


@case("invalid-packing-axis-out-of-range", "codes.packing.axis is 2 for a rank-2 tensor: refuse 'w' with PACKING_INVALID", ["7.4", "7.11"], DESC)
def _(rng):
    return M(rng, "PACKING_INVALID", setf("codes.packing.axis", 2))


@case("invalid-packing-order-not-permutation", "codes.packing.order is [0, 0]: refuse 'w' with PACKING_INVALID", ["7.3", "7.11"], DESC)
def _(rng):
    return M(rng, "PACKING_INVALID", setf("codes.packing.order", [0, 0]))


@case("invalid-packing-slot-order-not-permutation", "slot_order [0, 0] for two 4-bit slots per byte: refuse 'w' with PACKING_INVALID", ["7.7", "7.11"], DESC)
def _(rng):
    return M(rng, "PACKING_INVALID", setf("codes.packing.slot_order", [0, 0]))


@case("invalid-packing-slot-order-stream", "3-bit codes straddle bytes (stream arrangement) yet slot_order is given: refuse 'w' with PACKING_INVALID",
      ["7.5", "7.11"], DESC)
def _(rng):
    def edit(d: Descs, c: Comps, p: Comps) -> None:
        el = {"type": "int", "bits": 3, "signedness": "unsigned"}
        d["w"]["codes"]["element"] = el
        c["w.codes"] = R.pack(rng.integers(0, 8, size=SHAPE), 3, d["w"]["codes"]["packing"])
        d["w"]["codes"]["packing"]["slot_order"] = [1, 0]
    return M(rng, "PACKING_INVALID", edit)


@case("invalid-schema-packing-unknown-member", "codes.packing has an unknown member 'interleave': SCHEMA_VIOLATION (an unknown packing member is not PACKING_INVALID)",
      ["5.5"], DESC + SCH)
def _(rng):
    return M(rng, "SCHEMA_VIOLATION", setf("codes.packing.interleave", 2))


@case("invalid-blocks-size-0", "the scale's grid block size is [1, 0] (sizes are at least 1): refuse 'w' with BLOCKS_INVALID", ["8.1", "5.5"], DESC)
def _(rng):
    return M(rng, "BLOCKS_INVALID", setf("scale.blocks.size", [1, 0]))


@case("invalid-blocks-unknown-member", "the scale's blocks object has an unknown member 'stride' (it sits at the blocks): refuse 'w' with BLOCKS_INVALID", ["8.1", "5.5"], DESC)
def _(rng):
    return M(rng, "BLOCKS_INVALID", setf("scale.blocks.stride", 2))


@case("invalid-blocks-grid-rank", "the scale's grid size [4] has one entry for a rank-2 tensor: refuse 'w' with BLOCKS_INVALID", ["8.1"], DESC)
def _(rng):
    return M(rng, "BLOCKS_INVALID", setf("scale.blocks.size", [4]))


@case("invalid-blocks-index-axis-sized", "a group index on axis 1 whose grid size there is 4, not null: refuse 'w' with BLOCKS_INVALID", ["8.2"], DESC)
def _(rng):
    return M(rng, "BLOCKS_INVALID", setf("scale.blocks.size", [1, 4]), maker=lambda r: base_gidx(r, [0, 0, 0, 1, 1, 1, 1]))


@case("invalid-blocks-index-axis-missing", "a group index on axis 2 of a rank-2 tensor: refuse 'w' with BLOCKS_INVALID", ["8.2"], DESC)
def _(rng):
    return M(rng, "BLOCKS_INVALID", setf("scale.blocks.index.axis", 2), maker=lambda r: base_gidx(r, [0, 0, 0, 1, 1, 1, 1]))


@case("invalid-blocks-param-order", "the scale's order [1, 1] is not a permutation of its grid axes: refuse 'w' with BLOCKS_INVALID", ["9.2"], DESC)
def _(rng):
    return M(rng, "BLOCKS_INVALID", setf("scale.order", [1, 1]))


@case("invalid-blocks-zero-and-scale", "both the zero point's and the scale's block sizes are 0: every failure gets BLOCKS_INVALID, so refuse 'w' with BLOCKS_INVALID",
      ["5.5", "8.1"], DESC)
def _(rng):
    return M(rng, "BLOCKS_INVALID", setf("scale.blocks.size", [1, 0]), setf("zero.blocks.size", [1, 0]))


@case("invalid-layout-canonical-parameters", "layout 'canonical' with a non-empty 'parameters' {'tile': 16}: refuse 'w' with LAYOUT_INVALID", ["11", "5.5"], DESC)
def _(rng):
    return M(rng, "LAYOUT_INVALID", setf("layout", {"name": "canonical", "parameters": {"tile": 16}}))


@case("invalid-layout-missing-name", "a layout object without 'name': refuse 'w' with LAYOUT_INVALID", ["11", "5.5"], DESC)
def _(rng):
    return M(rng, "LAYOUT_INVALID", setf("layout", {"parameters": {}}))


@case("invalid-schema-layout-unknown-member", "the layout object has an unknown member 'device': SCHEMA_VIOLATION (not LAYOUT_INVALID)", ["5.5", "11"], DESC + SCH)
def _(rng):
    return M(rng, "SCHEMA_VIOLATION", setf("layout", {"name": "canonical", "device": "cpu"}))


@case("unsupported-layout-unknown", "the descriptor names the layout 'marlin', which a 1.0 reader does not implement: refuse 'w' with LAYOUT_UNKNOWN", ["11"], DESC + FWD)
def _(rng):
    return M(rng, "LAYOUT_UNKNOWN", setf("layout", {"name": "marlin", "parameters": {"tile": 16}}))


@case("unsupported-layout-unknown-1.1", "a 1.1 file names the layout 'marlin': LAYOUT_UNKNOWN in files of any minor (not FEATURE_UNSUPPORTED)", ["3.4", "11"], DESC + FWD)
def _(rng):
    return M(rng, "LAYOUT_UNKNOWN", setf("layout", {"name": "marlin"}), version="1.1")


@case("invalid-schema-unknown-descriptor-member", "the descriptor has an unknown member 'sparsity' in a 1.0 file: refuse 'w' with SCHEMA_VIOLATION", ["3.4", "5.5"], DESC + SCH)
def _(rng):
    return M(rng, "SCHEMA_VIOLATION", setf("sparsity", {"pattern": "2:4"}))


@case("invalid-schema-descriptor-not-object", "the descriptor of 'w' is the number 5: refuse 'w' with SCHEMA_VIOLATION", ["5.5"], DESC + SCH)
def _(rng):
    return M(rng, "SCHEMA_VIOLATION", lambda d, c, p: d.__setitem__("w", 5))


@case("invalid-schema-missing-codes", "the descriptor has no 'codes': refuse 'w' with SCHEMA_VIOLATION", ["5.1", "5.5"], DESC + SCH)
def _(rng):
    return M(rng, "SCHEMA_VIOLATION", delf("codes"))


@case("invalid-schema-scale-op-add", "the scale has op 'add' (scale takes multiply or divide): refuse 'w' with SCHEMA_VIOLATION", ["9.1", "5.5"], DESC + SCH)
def _(rng):
    return M(rng, "SCHEMA_VIOLATION", setf("scale.op", "add"))


@case("invalid-schema-zero-with-op", "the zero point has an op ('subtract'; zero takes none): refuse 'w' with SCHEMA_VIOLATION", ["9.1", "5.5"], DESC + SCH)
def _(rng):
    return M(rng, "SCHEMA_VIOLATION", setf("zero.op", "subtract"))


@case("invalid-schema-param-tensor-and-encoded", "the scale has both 'tensor' and 'encoded': refuse 'w' with SCHEMA_VIOLATION", ["9.1", "5.5"], DESC + SCH)
def _(rng):
    def edit(d: Descs, c: Comps, p: Comps) -> None:
        sub_d, sub_c = nested_scale(rng, "w.scale.", (3, 2), 1)
        d["w"]["scale"]["encoded"] = sub_d
        c.update(sub_c)
    return M(rng, "SCHEMA_VIOLATION", edit)


@case("invalid-schema-param-no-blocks", "the scale has no 'blocks': refuse 'w' with SCHEMA_VIOLATION", ["9.1", "5.5"], DESC + SCH)
def _(rng):
    return M(rng, "SCHEMA_VIOLATION", delf("scale.blocks"))


@case("invalid-schema-codes-tensor-empty", "codes.tensor is the empty string: refuse 'w' with SCHEMA_VIOLATION", ["5.5"], DESC + SCH)
def _(rng):
    return M(rng, "SCHEMA_VIOLATION", setf("codes.tensor", ""))


@case("invalid-schema-scheme-too-long", "the informative 'scheme' is 65 characters (at most 64): refuse 'w' with SCHEMA_VIOLATION", ["5.4", "5.5"], DESC + SCH)
def _(rng):
    return M(rng, "SCHEMA_VIOLATION", setf("scheme", "x" * 65))


@case("invalid-schema-65-extensions", "the descriptor lists 65 optional extensions (max_extensions is 64): refuse 'w' with SCHEMA_VIOLATION", ["3.5", "5.5", "15"], DESC + SCH + EXT)
def _(rng):
    return M(rng, "SCHEMA_VIOLATION", setf("extensions", [ext(f"org.example.x{i}", OPT) for i in range(65)]))


@case("invalid-schema-nested-dtype", "the nested (encoded) descriptor's dtype is 'int8': every failure inside a nested descriptor is SCHEMA_VIOLATION (not DTYPE_INVALID)",
      ["5.5", "9.3"], DESC + SCH)
def _(rng):
    return M(rng, "SCHEMA_VIOLATION", setf("scale.encoded.dtype", "int8"), maker=lambda r: base_nested(r, 1))


@case("invalid-schema-two-specific-codes", "dtype 'int8' and element bits 9: two different specific codes, so refuse 'w' with SCHEMA_VIOLATION (§5.5's rule for several failures)",
      ["5.5"], DESC + SCH)
def _(rng):
    return M(rng, "SCHEMA_VIOLATION", setf("dtype", "int8"), setf("codes.element.bits", 9))


@case("invalid-depth-exceeded", "scales encoded 4 levels deep (max_nesting_depth is 3): refuse 'w' with DEPTH_EXCEEDED", ["9.3", "3.7", "15"], DESC)
def _(rng):
    return M(rng, "DEPTH_EXCEEDED", maker=lambda r: base_nested(r, 4))


@case("invalid-shape-nested-not-grid", "the nested scale descriptor's shape is [2, 3], not the parameter grid [3, 2]: refuse 'w' with SHAPE_INVALID", ["9.3"], DESC)
def _(rng):
    def maker(r: np.random.Generator) -> tuple[Descs, Comps, Comps]:
        descs, comps, plain = base(r)
        sub_d, sub_c = nested_scale(r, "w.scale.", (2, 3), 1)
        del comps["w.scale"]
        comps.update(sub_c)
        descs["w"]["scale"] = {"blocks": GRID(1, 4), "op": "multiply", "encoded": sub_d}
        return descs, comps, plain
    return M(rng, "SHAPE_INVALID", maker=maker)


# ==================================================================================================
# §4 names and §12.3 components
# ==================================================================================================
NAMES = ["names"]
COMP = ["components"]


@case("invalid-name-conflict-plain", "the logical tensor is named 'b', the name of a plain tensor: refuse logical 'b' with NAME_CONFLICT", ["4.3", "3.7"], NAMES)
def _(rng):
    return M(rng, "NAME_CONFLICT", lambda d, c, p: d.__setitem__("b", d.pop("w")))


@case("invalid-name-conflict-component", "a second logical tensor is named 'w.scale', a component of 'w': refuse logical 'w.scale' with NAME_CONFLICT ('w' still reads)",
      ["4.3", "3.7"], NAMES)
def _(rng):
    def edit(d: Descs, c: Comps, p: Comps) -> None:
        v, vc = second(rng)
        d["w.scale"] = v
        c.update(vc)
    return M(rng, "NAME_CONFLICT", edit)


@case("invalid-component-missing", "the scale's component 'w.scale' is not in the file: refuse 'w' with COMPONENT_MISSING", ["4.3", "12.3"], COMP)
def _(rng):
    return M(rng, "COMPONENT_MISSING", put("w.scale", None))


@case("invalid-component-missing-codes", "codes.tensor names 'w.qweight', which is not in the file: refuse 'w' with COMPONENT_MISSING", ["4.3", "12.3"], COMP)
def _(rng):
    return M(rng, "COMPONENT_MISSING", setf("codes.tensor", "w.qweight"))


@case("invalid-component-missing-table", "the codebook's table_tensor 'c.table' is not in the file: refuse 'c' with COMPONENT_MISSING", ["4.3", "6.4", "12.3"], COMP)
def _(rng):
    return M(rng, "COMPONENT_MISSING", put("c.table", None), maker=lambda r: codebook_file(r, [0, 9, 3, 4, 5, 1]))


@case("invalid-component-missing-group-index", "the group index 'w.g_idx' is not in the file: refuse 'w' with COMPONENT_MISSING", ["4.3", "8.2", "12.3"], COMP)
def _(rng):
    return M(rng, "COMPONENT_MISSING", put("w.g_idx", None), maker=lambda r: base_gidx(r, [0, 0, 0, 1, 1, 1, 1]))


@case("invalid-component-missing-logical-name", "codes.tensor names the logical tensor 'v' (only stored tensors can be referenced): refuse 'w' with COMPONENT_MISSING",
      ["4.3"], COMP)
def _(rng):
    def edit(d: Descs, c: Comps, p: Comps) -> None:
        v, vc = second(rng)
        d["v"] = v
        c.update(vc)
        d["w"]["codes"]["tensor"] = "v"
        del c["w.codes"]
    return M(rng, "COMPONENT_MISSING", edit)


@case("invalid-component-claimed-twice-zero-scale", "the zero point and the scale of 'w' both name 'w.scale': refuse 'w' with COMPONENT_CLAIMED_TWICE", ["4.3"], NAMES)
def _(rng):
    return M(rng, "COMPONENT_CLAIMED_TWICE", setf("zero.tensor", "w.scale"), put("w.zero", None))


@case("invalid-component-claimed-twice-two-tensors", "'v' uses 'w.scale' as its scale too: refuse both 'w' and 'v' with COMPONENT_CLAIMED_TWICE", ["4.3"], NAMES)
def _(rng):
    def edit(d: Descs, c: Comps, p: Comps) -> None:
        v, vc = second(rng)
        del vc["v.scale"]
        v["scale"]["tensor"] = "w.scale"
        d["v"] = v
        c.update(vc)
    return M(rng, "COMPONENT_CLAIMED_TWICE", edit)


@case("invalid-component-claimed-twice-group-index", "'v' uses the group index 'w.g_idx' of 'w' (sharing is only within one logical tensor): refuse both with COMPONENT_CLAIMED_TWICE",
      ["4.3", "8.2"], NAMES)
def _(rng):
    def edit(d: Descs, c: Comps, p: Comps) -> None:
        v, vc = second(rng)
        v["scale"]["blocks"] = copy.deepcopy(d["w"]["scale"]["blocks"])
        vc["v.scale"] = values(rng, (3, 2), np.float16)
        d["v"] = v
        c.update(vc)
    return M(rng, "COMPONENT_CLAIMED_TWICE", edit, maker=lambda r: base_gidx(r, [0, 0, 0, 1, 1, 1, 1]))


@case("invalid-component-claimed-twice-index-and-param", "'w.g_idx' is both the scale's group index and the zero point's values: refuse 'w' with COMPONENT_CLAIMED_TWICE",
      ["4.3", "8.2"], NAMES)
def _(rng):
    return M(rng, "COMPONENT_CLAIMED_TWICE", setf("zero", {"blocks": {"type": "grid", "size": [None, 1]}, "tensor": "w.g_idx"}), put("w.zero", None),
             maker=lambda r: base_gidx(r, [0, 0, 0, 1, 1, 1, 1]))


@case("invalid-component-dtype-scale-i64", "the scale is stored as I64 (not an allowed parameter dtype): refuse 'w' with COMPONENT_DTYPE", ["9.2", "12.3"], COMP)
def _(rng):
    return M(rng, "COMPONENT_DTYPE", put("w.scale", lambda a: np.ones(a.shape, np.int64)))


@case("invalid-component-dtype-scale-f64", "the scale is stored as F64: refuse 'w' with COMPONENT_DTYPE", ["9.2", "12.3"], COMP)
def _(rng):
    return M(rng, "COMPONENT_DTYPE", put("w.scale", lambda a: a.astype(np.float64)))


@case("invalid-component-dtype-codes-i16", "8-bit containers stored in an I16 tensor of the right shape: refuse 'w' with COMPONENT_DTYPE", ["7.2", "12.3"], COMP)
def _(rng):
    return M(rng, "COMPONENT_DTYPE", put("w.codes", lambda a: a.astype(np.int16)))


@case("invalid-component-dtype-group-index-u64", "the group index is stored as U64 (not allowed): refuse 'w' with COMPONENT_DTYPE", ["8.2", "12.3"], COMP)
def _(rng):
    return M(rng, "COMPONENT_DTYPE", maker=lambda r: base_gidx(r, [0, 0, 0, 1, 1, 1, 1], np.uint64))


@case("invalid-component-dtype-group-index-float", "the group index is stored as F32: refuse 'w' with COMPONENT_DTYPE", ["8.2", "12.3"], COMP)
def _(rng):
    return M(rng, "COMPONENT_DTYPE", maker=lambda r: base_gidx(r, [0, 0, 0, 1, 1, 1, 1], np.float32))


@case("invalid-component-shape-codes", "the codes component is U8 [3, 5], not [3, 4] (4 bytes hold a row of 7 4-bit codes): refuse 'w' with COMPONENT_SHAPE", ["7.4", "12.3"], COMP)
def _(rng):
    return M(rng, "COMPONENT_SHAPE", put("w.codes", lambda a: np.concatenate([a, np.zeros((3, 1), np.uint8)], axis=1)))


@case("invalid-component-shape-codes-transposed", "the codes component is U8 [4, 3] (the right count, transposed): refuse 'w' with COMPONENT_SHAPE", ["7.4", "12.3"], COMP)
def _(rng):
    return M(rng, "COMPONENT_SHAPE", put("w.codes", lambda a: np.ascontiguousarray(a.T)))


@case("invalid-component-shape-scale", "the scale is F16 [2, 3], not the grid [3, 2] (same count): refuse 'w' with COMPONENT_SHAPE", ["9.2", "12.3"], COMP)
def _(rng):
    return M(rng, "COMPONENT_SHAPE", put("w.scale", lambda a: a.reshape(2, 3)))


@case("invalid-component-shape-group-index", "the group index has 6 entries for an axis of 7: refuse 'w' with COMPONENT_SHAPE", ["8.2", "12.3"], COMP)
def _(rng):
    return M(rng, "COMPONENT_SHAPE", maker=lambda r: base_gidx(r, [0, 0, 0, 1, 1, 1]))


@case("invalid-codebook-too-long", "a 4-bit codebook's in-file table has 17 entries (at most 2^4): refuse 'c' with CODEBOOK_INVALID", ["6.4", "12.3"], COMP)
def _(rng):
    return M(rng, "CODEBOOK_INVALID", maker=lambda r: codebook_file(r, [0, 9, 3, 4, 5, 1], table_len=17))


@case("invalid-codebook-empty", "the in-file codebook table has no entries: refuse 'c' with CODEBOOK_INVALID", ["6.4", "12.3"], COMP)
def _(rng):
    return M(rng, "CODEBOOK_INVALID", maker=lambda r: codebook_file(r, [0, 0, 0, 0], table=np.zeros(0, np.float32)))


@case("invalid-codebook-2d", "the in-file codebook table is F32 [2, 5], not 1-D: refuse 'c' with CODEBOOK_INVALID", ["6.4", "12.3"], COMP)
def _(rng):
    return M(rng, "CODEBOOK_INVALID", maker=lambda r: codebook_file(r, [0, 9, 3, 4], table=np.linspace(-1, 1, 10).astype(np.float32).reshape(2, 5)))


@case("invalid-codebook-int-dtype", "the in-file codebook table is I32 (F32, F16 or BF16 only): refuse 'c' with CODEBOOK_INVALID", ["6.4", "12.3"], COMP)
def _(rng):
    return M(rng, "CODEBOOK_INVALID", maker=lambda r: codebook_file(r, [0, 9, 3, 4], table=np.arange(10, dtype=np.int32)))


@case("invalid-codebook-named-too-long", "the named 16-entry table 'nf4' with 3-bit codes (longer than 2^3): refuse 'c' with CODEBOOK_INVALID", ["6.4"], COMP)
def _(rng):
    return M(rng, "CODEBOOK_INVALID", maker=lambda r: codebook_file(r, [0, 1, 2, 7, 5], bits=3, named="nf4"))


# ==================================================================================================
# §12.4 payload: what checkers report, and what readers refuse (§10.6) or decode anyway (§12.5)
# ==================================================================================================
PAY = ["payload"]


def _set(a: np.ndarray, idx: tuple[int, ...], v: Any) -> np.ndarray:
    a = a.copy()
    a[idx] = v
    return a


@case("payload-padding-nonzero-row-tail", "the padding nibble ending a row of 7 4-bit codes is 0xA: checkers report PADDING_NONZERO; readers ignore padding and decode",
      ["7.7", "7.10", "12.4", "12.5"], PAY)
def _(rng):
    descs, comps, plain = base(rng)
    comps["w.codes"] = _set(comps["w.codes"], (1, 3), comps["w.codes"][1, 3] | 0xA0)
    return valid(descs, comps, plain, check_codes=["PADDING_NONZERO"])


@case("payload-padding-nonzero-stream-tail", "a 3-bit code stream ends with padding bits set: checkers report PADDING_NONZERO; readers ignore padding and decode",
      ["7.6", "7.10", "12.4", "12.5"], PAY)
def _(rng):
    d, c = qtensor(rng, "w.", (2, 5), "float32", {"type": "int", "bits": 3, "signedness": "twos_complement"}, pk(8, rank=2),
                   {"scale": {"blocks": GRID(1, None), "op": "multiply", "values": values(rng, (2, 1), np.float32)}})
    assert c["w.codes"].shape == (2, 2)  # 15 bits per row, the top bit of byte 1 is padding
    c["w.codes"] = _set(c["w.codes"], (0, 1), c["w.codes"][0, 1] | 0x80)
    return valid({"w": d}, c, check_codes=["PADDING_NONZERO"])


@case("payload-padding-nonzero-alignment-word", "a row_alignment padding container is non-zero: checkers report PADDING_NONZERO; readers ignore it and decode",
      ["7.9", "7.10", "12.4", "12.5"], PAY)
def _(rng):
    d, c = qtensor(rng, "w.", (2, 6), "float16", dict(U4), pk(8, rank=2, row_alignment=4),
                   {"scale": {"blocks": GRID(1, None), "op": "multiply", "values": values(rng, (2, 1), np.float32)}})
    assert c["w.codes"].shape == (2, 4)
    c["w.codes"] = _set(c["w.codes"], (1, 3), 0x01)
    return valid({"w": d}, c, check_codes=["PADDING_NONZERO"])


@case("payload-param-nonfinite-nan-scale", "one F16 scale value is NaN (allow_nonfinite_params unset): checkers report PARAM_NONFINITE; readers decode NaN for that group",
      ["9.2", "10.4", "12.4", "12.5"], PAY)
def _(rng):
    descs, comps, plain = base(rng)
    comps["w.scale"] = _set(comps["w.scale"], (1, 0), np.nan)
    return valid(descs, comps, plain, check_codes=["PARAM_NONFINITE"])


@case("payload-param-nonfinite-inf-zero", "one F16 zero point is -Inf: checkers report PARAM_NONFINITE; readers decode IEEE results (x - (-Inf) = +Inf) for that group",
      ["9.2", "10.2", "12.4", "12.5"], PAY)
def _(rng):
    descs, comps, plain = base(rng)
    comps["w.zero"] = _set(comps["w.zero"].astype(np.float16), (2, 1), -np.inf)
    return valid(descs, comps, plain, check_codes=["PARAM_NONFINITE"])


@case("payload-param-nonfinite-e8m0", "an F8_E8M0 scale byte is 0xFF (NaN) without allow_nonfinite_params: checkers report PARAM_NONFINITE; readers decode NaN there",
      ["6.3", "9.2", "12.4", "12.5"], PAY)
def _(rng):
    sc = np.array([[127, 0xFF], [130, 120]], np.uint8).view(ml_dtypes.float8_e8m0fnu)
    d, c = qtensor(rng, "w.", (2, 64), "bfloat16", {"type": "float", "format": "e2m1fn"}, pk(8, rank=2),
                   {"scale": {"blocks": GRID(1, 32), "op": "multiply", "values": sc}})
    return valid({"w": d}, c, check_codes=["PARAM_NONFINITE"])


@case("payload-param-divisor-zero", "a scale with op divide has a +0.0 value: checkers report PARAM_DIVISOR_ZERO; readers divide by zero per IEEE (Inf or NaN)",
      ["9.1", "10.2", "12.4", "12.5"], PAY)
def _(rng):
    descs, comps, plain = base(rng)
    descs["w"]["scale"]["op"] = "divide"
    comps["w.scale"] = _set(comps["w.scale"], (0, 1), 0.0)
    return valid(descs, comps, plain, check_codes=["PARAM_DIVISOR_ZERO"])


@case("payload-param-divisor-zero-integer", "an I32 scale with op divide holds the integer 0: checkers report PARAM_DIVISOR_ZERO; readers decode per IEEE",
      ["9.2", "10.2", "12.4", "12.5"], PAY)
def _(rng):
    descs, comps, plain = base(rng)
    descs["w"]["scale"]["op"] = "divide"
    comps["w.scale"] = np.array([[3, 1], [2, 0], [5, 4]], np.int32)
    return valid(descs, comps, plain, check_codes=["PARAM_DIVISOR_ZERO"])


@case("payload-param-divisor-zero-encoded", "an encoded divisor scale decodes to 0 in one cell: checkers report PARAM_DIVISOR_ZERO; readers decode per IEEE",
      ["9.3", "10.2", "12.4", "12.5"], PAY)
def _(rng):
    descs, comps, plain = base_nested(rng, 1)
    descs["w"]["scale"]["op"] = "divide"
    inner = descs["w"]["scale"]["encoded"]
    codes = np.array([[1, 2], [0, 3], [4, 5]])
    comps["w.scale.codes"] = R.pack(codes, 4, inner["codes"]["packing"])
    return valid(descs, comps, plain, check_codes=["PARAM_DIVISOR_ZERO"])


@case("payload-param-divisor-zero-nonfinite-allowed", "a divisor scale of -0.0 in a descriptor that sets allow_nonfinite_params: still PARAM_DIVISOR_ZERO for checkers; readers decode",
      ["12.4", "12.5"], PAY)
def _(rng):
    descs, comps, plain = base(rng)
    descs["w"]["scale"]["op"] = "divide"
    descs["w"]["allow_nonfinite_params"] = True
    comps["w.scale"] = _set(comps["w.scale"], (2, 0), -0.0)
    return valid(descs, comps, plain, check_codes=["PARAM_DIVISOR_ZERO"])


@case("payload-param-int-range", "I32 zero points 2^24+1 and 2^24+3 exceed max_int_param_magnitude: checkers report PARAM_INT_RANGE; readers widen with RNE (to 2^24, 2^24+4)",
      ["9.2", "12.4", "12.5", "15"], PAY)
def _(rng):
    descs, comps, plain = base(rng)
    z = comps["w.zero"].astype(np.int32)
    z[0, 1] = 2**24 + 1
    z[2, 0] = 2**24 + 3
    comps["w.zero"] = z
    return valid(descs, comps, plain, check_codes=["PARAM_INT_RANGE"])


@case("invalid-code-out-of-range", "a 4-bit code 12 indexes past a 10-entry in-file codebook: refuse 'c' with CODE_OUT_OF_RANGE (never read outside the table)",
      ["6.4", "10.6", "12.4"], PAY)
def _(rng):
    return M(rng, "CODE_OUT_OF_RANGE", maker=lambda r: codebook_file(r, [0, 9, 12, 4, 5, 1], table_len=10))


@case("invalid-code-out-of-range-named", "5-bit codes into the 16-entry named table 'nf4' with one code 20: refuse 'c' with CODE_OUT_OF_RANGE",
      ["6.4", "10.6", "12.4"], PAY)
def _(rng):
    return M(rng, "CODE_OUT_OF_RANGE", maker=lambda r: codebook_file(r, [0, 1, 20, 15, 7], bits=5, named="nf4"))


@case("invalid-group-index-range", "a group index value equals its count 2: refuse 'w' with GROUP_INDEX_RANGE (never use it as a grid coordinate)",
      ["8.2", "10.6", "12.4"], PAY)
def _(rng):
    return M(rng, "GROUP_INDEX_RANGE", maker=lambda r: base_gidx(r, [0, 0, 1, 2, 1, 1, 0]))


@case("invalid-group-index-negative", "a group index value is -1: refuse 'w' with GROUP_INDEX_RANGE", ["8.2", "10.6", "12.4"], PAY)
def _(rng):
    return M(rng, "GROUP_INDEX_RANGE", maker=lambda r: base_gidx(r, [0, 0, 1, -1, 1, 1, 0]))


# ==================================================================================================
# §14 sharded checkpoints
# ==================================================================================================
INDEX = "model.safetensors.index.json"
S1, S2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


def shards(rng: np.random.Generator) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Two valid shards ('w' + plain 'b'; 'v' + plain 'c') and an index listing every stored
    tensor and logical name."""
    descs, comps, plain = base(rng)
    v, vc = second(rng)
    pc = {"c": rng.normal(size=2).astype(np.float32)}
    files = {S1: qfile(descs, comps, plain), S2: qfile({"v": v}, vc, pc)}
    wm = {**{n: S1 for n in [*comps, *plain, "w"]}, **{n: S2 for n in [*vc, *pc, "v"]}}
    return files, {"metadata": {"total_size": 0}, "weight_map": dict(sorted(wm.items()))}


def index_case(files: dict[str, bytes], index: dict[str, Any] | bytes, code: str) -> Built:
    data = index if isinstance(index, bytes) else json.dumps(index, indent=1).encode()
    return Built({INDEX: data, **files}, INDEX, "invalid", code, None, [code], [f"error:{code}", "sharded"])


@case("invalid-index-not-json", "the index file holds 'not json': refuse the checkpoint with INDEX_INVALID", ["14"], ["sharded"])
def _(rng):
    files, _ = shards(rng)
    return index_case(files, b"not json", "INDEX_INVALID")


@case("invalid-index-missing-shard", "the index lists tensors in the second shard, whose file is absent: refuse the checkpoint with INDEX_INVALID", ["14"], ["sharded"])
def _(rng):
    files, index = shards(rng)
    del files[S2]
    return index_case(files, index, "INDEX_INVALID")


@case("invalid-index-shard-outside-folder", "the index maps a tensor to '../x.safetensors', outside the index's folder: refuse with INDEX_INVALID without opening it",
      ["13", "14"], ["sharded"])
def _(rng):
    files, index = shards(rng)
    index["weight_map"]["x"] = "../x.safetensors"
    return index_case(files, index, "INDEX_INVALID")


@case("invalid-index-duplicate-key", "the index's weight_map repeats the key 'b' (same shard): refuse the checkpoint with INDEX_INVALID", ["14"], ["sharded"])
def _(rng):
    files, index = shards(rng)
    text = json.dumps(index, separators=(",", ":"))
    return index_case(files, sub(text, f'"b":"{S1}"', f'"b":"{S1}","b":"{S1}"').encode(), "INDEX_INVALID")


@case("invalid-index-no-weight-map", "the index object has no 'weight_map': refuse the checkpoint with INDEX_INVALID", ["14"], ["sharded"])
def _(rng):
    files, index = shards(rng)
    del index["weight_map"]
    return index_case(files, index, "INDEX_INVALID")


@case("invalid-index-listed-absent", "the index places 'ghost' in the first shard, which has no such stored or logical tensor: refuse with INDEX_MISMATCH", ["14"], ["sharded"])
def _(rng):
    files, index = shards(rng)
    index["weight_map"]["ghost"] = S1
    return index_case(files, index, "INDEX_MISMATCH")


@case("invalid-index-present-unlisted", "the first shard holds the plain tensor 'b', which the index does not list: refuse with INDEX_MISMATCH", ["14"], ["sharded"])
def _(rng):
    files, index = shards(rng)
    del index["weight_map"]["b"]
    return index_case(files, index, "INDEX_MISMATCH")


@case("invalid-index-component-unlisted", "the component 'v.scale' of the second shard is not listed in the index (every stored tensor must be): refuse with INDEX_MISMATCH",
      ["14"], ["sharded"])
def _(rng):
    files, index = shards(rng)
    del index["weight_map"]["v.scale"]
    return index_case(files, index, "INDEX_MISMATCH")
