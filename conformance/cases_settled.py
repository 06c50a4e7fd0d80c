"""Corpus 1.5 (spec 1.2.1, issue 43): the points SPEC.md 1.2.1 settles, one case per point a file
can show, both ways where it matters (``settled-121-*``).

The points are those of an independent reader's review of SPEC.md 1.2 (A1 to A16): array lengths
(the schema's 64), the required order of the container checks, NOT_SAFETENSORS as a required code,
a missing layout argument against an unknown one in a newer minor, nested cells no element uses,
offsets of 2^64 or more, tinygemm's scale order, empty components, version-independent container
rules, numbers that round to an integer, names a shard exposes and blocks compared by value.
Expected outcomes are read from SPEC.md 1.2.1's text; decoded values come from
conformance/spec_reference.py.
"""

from __future__ import annotations

import copy
import json
import struct
from typing import Any

import ml_dtypes
import numpy as np

from . import spec_reference as R
from .build import Built, case, failing, features_of, header_entries, pk, q_file, qformat_json, qtensor, raw_file, st_file, valid, values
from .cases_errors import INDEX, S1, S2, U4, base, base_gidx, base_nested, codebook_file, header_parts, htext, qfile, qtext_file, second

ST = ["clarified", "settled-1.2.1"]
R17 = 17


# -- A1: array lengths are the schema's (64) ----------------------------------------------------------
def _rank17(rng: np.random.Generator, order: list[int] | None = None, packing_order: list[int] | None = None):
    """A float32 tensor of rank 17 ([2, 1 x 15, 6]), 4-bit codes in one stream (axis null: packing axes
    are 0..15), an F16 scale per 3 elements of the last axis: grid 'size' has 17 entries."""
    shape = (2,) + (1,) * 15 + (6,)
    p = pk(8, axis=None, rank=R17)
    size = [1] * 16 + [3]
    g = (2,) + (1,) * 15 + (2,)
    prm: dict[str, Any] = {"blocks": {"type": "grid", "size": size}, "op": "multiply", "values": values(rng, g, np.float16)}
    d, c = qtensor(rng, "w.", shape, "float32", dict(U4), p, {"scale": prm})
    if order is not None:
        d["scale"]["order"] = order
    if packing_order is not None:  # after packing: the codes are written as if no order were given
        d["codes"]["packing"]["order"] = packing_order
    return {"w": d}, c, {"b": rng.normal(size=3).astype(np.float32)}


@case("settled-121-grid-size-rank-17", "a rank-17 tensor whose scale has grid blocks with 17 'size' entries: the schema allows 64 entries, and §5.5 now says so too (1.2's prose said 16): valid",
      ["5.5", "8.1", "15"], ["blocks", "rank"] + ST)
def _(rng):
    descs, comps, plain = _rank17(rng)
    return valid(descs, comps, plain, version="1.2")


@case("settled-121-param-order-17-entries", "a rank-17 tensor's scale has an 'order' of 17 entries (items 0..15 only, so one repeats): structurally valid (at most 64 entries), refused by §9.2's rule that 'order' is a permutation: BLOCKS_INVALID, not SCHEMA_VIOLATION",
      ["5.5", "9.2"], ["blocks", "order", "error:BLOCKS_INVALID"] + ST)
def _(rng):
    descs, comps, plain = _rank17(rng, order=list(range(16)) + [15])
    return failing(q_file(descs, comps, plain, version="1.2"), "BLOCKS_INVALID")


@case("settled-121-packing-order-17-entries", "a rank-17 tensor's packing has an 'order' of 17 entries 0..15 (one repeats): structurally valid, refused by §7.11 (not a permutation): PACKING_INVALID",
      ["5.5", "7.11"], ["packing", "order", "error:PACKING_INVALID"] + ST)
def _(rng):
    descs, comps, plain = _rank17(rng, packing_order=list(range(16)) + [0])
    return failing(q_file(descs, comps, plain, version="1.2"), "PACKING_INVALID")


@case("settled-121-nested-packing-order-17-entries", "a nested descriptor's packing 'order' has 17 entries: it passes D8 (at most 64), so D12 does not apply; the nested descriptor's own §7.11 check refuses it at sub-step 5: PACKING_INVALID, not SCHEMA_VIOLATION",
      ["5.5", "7.11", "9.3"], ["packing", "nested", "order", "error:PACKING_INVALID"] + ST)
def _(rng):
    descs, comps, plain = base_nested(rng)
    descs["w"]["scale"]["encoded"]["codes"]["packing"]["order"] = list(range(16)) + [0]
    return failing(q_file(descs, comps, plain, version="1.2"), "PACKING_INVALID")


@case("settled-121-param-order-65-entries", "a scale 'order' of 65 entries: beyond the schema's 64, D10: SCHEMA_VIOLATION",
      ["5.5"], ["blocks", "order", "error:SCHEMA_VIOLATION"] + ST)
def _(rng):
    descs, comps, plain = base(rng)
    descs["w"]["scale"]["order"] = [0, 1] * 32 + [0]
    return failing(q_file(descs, comps, plain, version="1.2"), "SCHEMA_VIOLATION")


# -- A2: the container checks in a required order ------------------------------------------------------
def _entries_file(rng: np.random.Generator, first: tuple[str, Any], second_: tuple[str, Any]) -> bytes:
    """The base file's header with two members written first, in this order, before the others."""
    header, data, entries = header_parts(rng)
    rest = {k: v for k, v in header.items() if k != "__metadata__"}
    meta = header["__metadata__"]
    parts = [json.dumps(first[0]) + ":" + json.dumps(first[1], separators=(",", ":")),
             json.dumps(second_[0]) + ":" + json.dumps(second_[1], separators=(",", ":"))]
    if first[0] != "__metadata__" and second_[0] != "__metadata__":
        parts.append('"__metadata__":' + json.dumps(meta, separators=(",", ":")))
    parts += [json.dumps(k) + ":" + json.dumps(v, separators=(",", ":")) for k, v in rest.items() if k not in (first[0], second_[0])]
    return raw_file("{" + ",".join(parts) + "}", data)


def _extra_member(rng, name="b"):
    _, _, entries = header_parts(rng)
    return dict(entries[name], extra=1)


@case("settled-121-container-order-entry-before-metadata", "tensor entry 'b' has a fourth member and comes before a __metadata__ whose value is not a string: the members are checked in header order, so TENSOR_ENTRY_INVALID (check 10 on 'b') decides",
      ["2.3", "1.4"], ["container", "order", "error:TENSOR_ENTRY_INVALID"] + ST)
def _(rng):
    header, _, _ = header_parts(rng)
    bad_meta = dict(header["__metadata__"], other=5)
    return failing(_entries_file(rng, ("b", _extra_member(rng)), ("__metadata__", bad_meta)), "TENSOR_ENTRY_INVALID")


@case("settled-121-container-order-metadata-before-entry", "the same two defects the other way round: a __metadata__ whose value is not a string comes before tensor entry 'b' with a fourth member: METADATA_INVALID (check 8, where __metadata__ appears) decides",
      ["2.3", "1.4"], ["container", "order", "error:METADATA_INVALID"] + ST)
def _(rng):
    header, _, _ = header_parts(rng)
    bad_meta = dict(header["__metadata__"], other=5)
    return failing(_entries_file(rng, ("__metadata__", bad_meta), ("b", _extra_member(rng))), "METADATA_INVALID")


@case("settled-121-container-order-dtype-then-entry", "entry 'b' has an unknown dtype and comes before entry 'w.codes' that lacks 'shape': all checks on one entry before the next, so DTYPE_UNKNOWN (check 11 on 'b') decides, not TENSOR_ENTRY_INVALID",
      ["2.3", "1.4"], ["container", "order", "error:DTYPE_UNKNOWN"] + ST)
def _(rng):
    _, _, entries = header_parts(rng)
    b = dict(entries["b"], dtype="F31")
    wc = {k: v for k, v in entries["w.codes"].items() if k != "shape"}
    return failing(_entries_file(rng, ("b", b), ("w.codes", wc)), "DTYPE_UNKNOWN")


@case("settled-121-container-order-entry-then-dtype", "entry 'w.codes' lacks 'shape' and comes before entry 'b' with an unknown dtype: TENSOR_ENTRY_INVALID decides (header order)",
      ["2.3", "1.4"], ["container", "order", "error:TENSOR_ENTRY_INVALID"] + ST)
def _(rng):
    _, _, entries = header_parts(rng)
    b = dict(entries["b"], dtype="F31")
    wc = {k: v for k, v in entries["w.codes"].items() if k != "shape"}
    return failing(_entries_file(rng, ("w.codes", wc), ("b", b)), "TENSOR_ENTRY_INVALID")


@case("settled-121-container-order-entry-before-tiling", "the offsets of the first two entries are swapped (the tiling breaks, check 15) and the last entry's shape overflows 64 bits (check 12): every entry is checked before the tiling, so SIZE_OVERFLOW",
      ["2.3", "1.4"], ["container", "order", "error:SIZE_OVERFLOW"] + ST)
def _(rng):
    header, data, entries = header_parts(rng)
    names = [k for k in header if k != "__metadata__"]
    a, b = header[names[0]], header[names[1]]
    ra, rb = a["data_offsets"], b["data_offsets"]
    # move 'a' past 'b' keeping each size: tiling broken only if the sizes differ; make it a gap
    a["data_offsets"] = [ra[0] + 1, ra[1] + 1]
    last = header[names[-1]]
    last["shape"] = [2**64] + last["shape"][1:] if last["shape"] else [2**64]
    return failing(raw_file(htext(header), data), "SIZE_OVERFLOW")


# -- A3: NOT_SAFETENSORS, a required code ---------------------------------------------------------------
def _blob(head: bytes, size: int = 64) -> bytes:
    return head + bytes((7 * i + 3) % 251 for i in range(size - len(head)))


for _id, _head, _what in (
        ("gguf", b"GGUF\x03\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00", "a GGUF file (magic 'GGUF', version 3)"),
        ("zip", b"PK\x03\x04\x14\x00\x00\x00\x08\x00", "a ZIP archive (a PyTorch .pt checkpoint: local file header 'PK\\x03\\x04')"),
        ("pickle", b"\x80\x02}q\x00(X\x06\x00", "a Python pickle stream (protocol 2: 0x80 0x02)"),
        ("text", b"# A model card\n\nSee the paper.\n", "a text file ('# A model card...')"),
        ("text-utf8-cut", "caf\u00e9 na\u00efve \u00fc".encode("utf-8"), "a UTF-8 text whose 8th byte starts a two-byte character cut by the 8-byte window"),
        ("text-bom", "\ufeff{\"a\": 1}\n".encode("utf-8"), "a JSON text file with a byte order mark (U+FEFF counts as text)"),
):
    @case(f"settled-121-not-safetensors-{_id}", f"{_what}: its length prefix fails check 2, and its first bytes match §2.3's signatures: NOT_SAFETENSORS (a required code since 1.2.1), not HEADER_TOO_LARGE",
          ["2.3"], ["container", "error:NOT_SAFETENSORS"] + ST)
    def _(rng, head=_head):
        return failing(_blob(head), "NOT_SAFETENSORS")


for _id, _head, _code, _what in (
        ("binary-length", b"\xf0\xe1\xd2\xc3\xb4\xa5\x96\x87", "HEADER_TOO_LARGE", "8 bytes that are neither a signature nor text (invalid UTF-8)"),
        ("text-with-control", b"ab\x01cdefgh", "HEADER_TOO_LARGE", "ASCII with a 0x01 control byte (not text by §2.3)"),
        ("text-with-del", b"abc\x7fdefg", "HEADER_TOO_LARGE", "ASCII with a DEL byte 0x7F (not text by §2.3)"),
        ("text-c1-control", b"ab\xc2\x85cdef", "HEADER_TOO_LARGE", "UTF-8 holding U+0085, a C1 control below U+00A0 (not text)"),
        ("gguf-length-fits", None, "HEADER_LENGTH_INVALID", "'GGUF' magic would need a file of 1.18 GB; a smaller file fails check 3, so the signature applies"),
):
    @case(f"settled-121-not-safetensors-negative-{_id}" if _head is not None else "settled-121-not-safetensors-gguf-version-0",
          f"{_what}: " + (f"no signature matches, so the check's own code, {_code}" if _head is not None else "NOT_SAFETENSORS"),
          ["2.3"], ["container", f"error:{_code if _head is not None else 'NOT_SAFETENSORS'}"] + ST)
    def _(rng, head=_head, code=_code):
        if head is None:
            return failing(_blob(b"GGUF\x00\x00\x00\x00"), "NOT_SAFETENSORS")
        return failing(_blob(head), code)


@case("settled-121-not-safetensors-short-gguf", "a 6-byte file 'GGUF\\x03\\x00': shorter than 8 bytes, check 1 comes first: HEADER_TOO_SMALL",
      ["2.3"], ["container", "error:HEADER_TOO_SMALL"] + ST)
def _(rng):
    return failing(b"GGUF\x03\x00", "HEADER_TOO_SMALL")


@case("settled-121-not-safetensors-zero-length-text", "the 8 bytes are 8 NUL bytes (a length of 0): check 3 fails and no signature matches (NUL is not text): HEADER_LENGTH_INVALID",
      ["2.3"], ["container", "error:HEADER_LENGTH_INVALID"] + ST)
def _(rng):
    return failing(bytes(8) + b"{}", "HEADER_LENGTH_INVALID")


# -- A4: a missing layout argument is checked before an unknown one ------------------------------------
@case("settled-121-layout-missing-before-unknown-newer", "a 1.3 file's tinygemm_int4_cuda has parameters {'foo': 1}: the required inner_k_tiles is missing (LAYOUT_INVALID in every minor) and 'foo' is unknown (FEATURE_UNSUPPORTED in a newer minor); the missing argument is checked first: LAYOUT_INVALID",
      ["11.1", "3.4"], ["layout", "forward-compat", "error:LAYOUT_INVALID"] + ST)
def _(rng):
    from .cases_layouts import TGF

    descs, comps, plain = TGF()(rng)
    descs["w"]["layout"]["parameters"] = {"foo": 1}
    return failing(q_file(descs, comps, plain, version="1.3"), "LAYOUT_INVALID", check_codes=["FEATURE_UNSUPPORTED", "LAYOUT_INVALID"])


@case("settled-121-layout-unknown-only-newer", "a 1.3 file's tinygemm_int4_cuda has inner_k_tiles and an unknown 'foo': nothing required is missing, the unknown argument may come from the newer minor: FEATURE_UNSUPPORTED",
      ["11.1", "3.4"], ["layout", "forward-compat", "error:FEATURE_UNSUPPORTED"] + ST)
def _(rng):
    from .cases_layouts import TGF

    descs, comps, plain = TGF()(rng)
    descs["w"]["layout"]["parameters"] = dict(descs["w"]["layout"]["parameters"], foo=1)
    return failing(q_file(descs, comps, plain, version="1.3"), "FEATURE_UNSUPPORTED")


# -- A5: a nested descriptor is checked whole ------------------------------------------------------------
def _nested_codebook_gidx(rng: np.random.Generator, bad_cell: int | None):
    """'w' [3, 7] with a scale indexed by a group index (count 2) that uses only cell 0; the scale is
    a nested codebook descriptor [3, 2] (8 entries in-file); ``bad_cell``: that column's codes are 9
    (past the table)."""
    descs, comps, plain = base(rng)
    codes = rng.integers(0, 8, size=(3, 2))
    if bad_cell is not None:
        codes[:, bad_cell] = 9
    el = {"type": "codebook", "bits": 4, "table_tensor": "w.scale.table"}
    table = np.linspace(0.25, 2.0, 8).astype(np.float32)
    sub, subc = qtensor(rng, "w.scale.", (3, 2), "float32", el, pk(8, rank=2), codes=codes, table=table)
    del comps["w.scale"]
    comps.update(subc)
    comps["w.g_idx"] = np.zeros(7, np.int32)
    descs["w"]["scale"] = {"blocks": {"type": "grid", "size": [1, None], "index": {"axis": 1, "tensor": "w.g_idx", "count": 2}},
                           "op": "multiply", "encoded": sub}
    return descs, comps, plain


@case("settled-121-nested-unused-cell-checked", "the group index uses only cell 0 of the scale's nested codebook descriptor, whose cell-1 codes index past its 8-entry table: the nested descriptor is checked whole (§10.6, 1.2 allowed either): CODE_OUT_OF_RANGE",
      ["10.6", "9.3", "8.2"], ["nested", "element:codebook", "group_index", "error:CODE_OUT_OF_RANGE"] + ST)
def _(rng):
    descs, comps, plain = _nested_codebook_gidx(rng, 1)
    return failing(q_file(descs, comps, plain, version="1.2"), "CODE_OUT_OF_RANGE")


@case("settled-121-nested-unused-cell-valid", "the same file with every nested code inside the table: valid (the group index still uses only cell 0)",
      ["10.6", "9.3", "8.2"], ["nested", "element:codebook", "group_index"] + ST)
def _(rng):
    descs, comps, plain = _nested_codebook_gidx(rng, None)
    return valid(descs, comps, plain, version="1.2")


# -- A8: offsets of 2^64 or more, exact ------------------------------------------------------------------
def _big_offsets(rng: np.random.Generator, begin: int, end: int) -> bytes:
    """The base file with a 4-byte plain F32 [1] tensor 'z' at [begin, end] (written in exact digits)."""
    header, data, _ = header_parts(rng)
    text = htext(header)
    z = '"z":{"dtype":"F32","shape":[1],"data_offsets":[%d,%d]}' % (begin, end)
    return raw_file(text[:-1] + "," + z + "}", data)


for _id, _b, _e, _code, _what in (
        ("tiling", 2**64 + 5, 2**64 + 9, "OFFSETS_INVALID", "[2^64+5, 2^64+9] on a 4-byte tensor: END - BEGIN = 4 passes check 14 exactly, the tiling (check 15) fails"),
        ("reversed", 2**64 + 9, 2**64 + 5, "OFFSETS_INVALID", "[2^64+9, 2^64+5]: reversed, check 14's first half"),
        ("size", 2**64 + 5, 2**64 + 6, "TENSOR_SIZE_MISMATCH", "[2^64+5, 2^64+6] on a 4-byte tensor: END - BEGIN = 1, check 14's second half"),
        ("huge-tiling", 10**300, 10**300 + 4, "OFFSETS_INVALID", "[10^300, 10^300+4] (301 digits) on a 4-byte tensor: the difference is exactly 4, so the tiling decides"),
        ("huge-size", 10**300, 10**301, "TENSOR_SIZE_MISMATCH", "[10^300, 10^301] on a 4-byte tensor: check 14's second half"),
        ("one-huge", 8, 2**64 + 12, "TENSOR_SIZE_MISMATCH", "[8, 2^64+12] on a 4-byte tensor: END - BEGIN is 2^64 + 4"),
):
    @case(f"settled-121-offsets-beyond-2-64-{_id}", f"{_what}: exact arithmetic decides the code (SPEC.md 1.2.1 removes the permission to stop reading digits): {_code}",
          ["2.1", "2.2", "2.3"], ["container", f"error:{_code}"] + ST)
    def _(rng, b=_b, e=_e, code=_code):
        return failing(_big_offsets(rng, b, e), code)


# -- A9, A14: tinygemm's scale order and blocks compared by value ----------------------------------------
@case("settled-121-tinygemm-scale-order-not-permutation", "tinygemm_int4_cuda's scale has 'order' [0, 0]: tinygemm requires no order, so rule 6 of §11.1 does not look at it; §9.2 refuses it at step 5.5: BLOCKS_INVALID",
      ["11.1", "11.3", "9.2"], ["layout", "order", "error:BLOCKS_INVALID"] + ST)
def _(rng):
    from .cases_layouts import TGF

    descs, comps, plain = TGF()(rng)
    descs["w"]["scale"]["order"] = [0, 0]
    return failing(q_file(descs, comps, plain, version="1.2"), "BLOCKS_INVALID")


@case("settled-121-tinygemm-bias-blocks-by-value", "tinygemm_int4_cuda with scale blocks size [1, 32] and bias blocks size [1, 32.0]: §11.1 rule 6 compares blocks by value (32.0 is the integer 32): valid",
      ["11.1", "11.3", "3.2"], ["layout"] + ST)
def _(rng):
    from .cases_layouts import TGF

    descs, comps, plain = TGF(bias=True)(rng)
    assert descs["w"]["bias"]["blocks"]["size"] == [1, 32]
    descs["w"]["bias"]["blocks"]["size"] = [1, 32.0]  # written "32.0" by json.dumps
    data = q_file(descs, comps, plain, version="1.2")
    assert b"32.0" in data
    return valid(descs, comps, plain, file_bytes=data)


# -- A10, A11, A12 -----------------------------------------------------------------------------------------
@case("settled-121-empty-component-unrepresentable", "a float16 logical tensor [2^30, 2^31, 0] (2 bytes x 2^61 < 2^63: representable) whose per-element F32 scale component has the same shape (4 bytes x 2^61 = 2^63: no array holds it): SHAPE_UNREPRESENTABLE applies to plain tensors and logical shapes only, never to a component: valid, an empty float16 array",
      ["2.2", "5.2", "3.7"], ["empty"] + ST)
def _(rng):
    shape = (2**30, 2**31, 0)
    d = {"shape": list(shape), "dtype": "float16",
         "codes": {"tensor": "e.codes", "element": {"type": "int", "bits": 8, "signedness": "unsigned"}, "packing": pk(8, rank=3)},
         "scale": {"blocks": {"type": "grid", "size": [1, 1, 1]}, "op": "multiply", "tensor": "e.scale"}}
    header = {"__metadata__": {"qformat": qformat_json({"e": d}, "1.2")},
              "e.codes": {"dtype": "U8", "shape": list(shape), "data_offsets": [0, 0]},
              "e.scale": {"dtype": "F32", "shape": list(shape), "data_offsets": [0, 0]}}
    data = raw_file(htext(header), b"")
    return Built({"input.safetensors": data}, "input.safetensors", "valid", None,
                 {"e": np.zeros(shape, np.float16)}, [], sorted(features_of(d)))


@case("settled-121-container-rules-version-independent", "a '1.0' file (by its qformat object) whose header begins with a line feed and holds a plain F4 tensor: container rules do not depend on the declared qformat version, so a reader reads it (check --strict reports HEADER_LEADING_WHITESPACE)",
      ["2.3", "2.6", "3.3"], ["container", "parity", "plain:f4"] + ST)
def _(rng):
    descs, comps, plain = base(rng)
    f4 = np.array([0x71, 0x8F], np.uint8)  # four e2m1 values, two per byte
    entries, data = header_entries({**comps, **plain})
    entries["f"] = {"dtype": "F4", "shape": [4], "data_offsets": [len(data), len(data) + 2]}
    data = data + f4.tobytes()
    header = {"__metadata__": {"qformat": qformat_json(descs, "1.0")}, **entries}
    raw = raw_file("\n" + htext(header), data)
    expected = {"w": R.decode(descs["w"], comps), **plain, "f": R.plain_f4(f4.tobytes(), [4])}
    return Built({"input.safetensors": raw}, "input.safetensors", "valid", None, expected, [], sorted(features_of(descs["w"]) | {"plain:f4"}))


@case("settled-121-number-underflow-is-zero", "code_offset written 1e-400 and frac_bits written -1e-400: each rounds to zero (RNE to binary64) and is the integer 0 (§3.2), not a non-integer: valid",
      ["3.2"], ["descriptor"] + ST)
def _(rng):
    descs, comps, plain = base(rng)
    text = qformat_json(descs, "1.2")
    old = '"signedness":"unsigned"'
    assert text.count(old) == 1, text
    text = text.replace(old, old + ',"code_offset":1e-400,"frac_bits":-1e-400')
    return valid(descs, comps, plain, file_bytes=qtext_file(text, comps, plain))


# -- A13: names a shard exposes ---------------------------------------------------------------------------
def _index(weight_map: dict[str, str]) -> bytes:
    return json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}, indent=1).encode()


@case("settled-121-shard-exposes-refused-logical-name", "the second shard's logical tensor 'b' is refused at step 5 (its shape is [-1]) and the first shard has a plain 'b': a name of 'tensors' counts as exposed once the shard's steps 1 to 4 pass, refused or not: INDEX_MISMATCH",
      ["14", "3.7"], ["sharded", "error:INDEX_MISMATCH"] + ST)
def _(rng):
    d1, c1, p1 = base(rng)
    v, c2 = second(rng)
    v = copy.deepcopy(v)
    v["shape"] = [-1]
    wm = {n: S1 for n in [*c1, *p1, "w"]}
    wm.update({n: S2 for n in c2})
    files = {INDEX: _index(dict(sorted(wm.items()))), S1: qfile(d1, c1, p1), S2: qfile({"b": v}, c2)}
    return Built(files, INDEX, "invalid", "INDEX_MISMATCH", None, ["INDEX_MISMATCH", "SHAPE_INVALID"], ["error:INDEX_MISMATCH", "sharded"])


# -- A2, within one entry ------------------------------------------------------------------------------
@case("settled-121-container-order-dtype-before-shape-type", "entry 'b' has dtype 'XX' (unknown) and shape \"abc\" (not an array): within one entry, dtype's name (check 11) is checked before the types of shape and data_offsets (the rest of check 10): DTYPE_UNKNOWN",
      ["2.3", "1.4"], ["container", "order", "error:DTYPE_UNKNOWN"] + ST)
def _(rng):
    header, data, _ = header_parts(rng)
    header["b"] = dict(header["b"], dtype="XX", shape="abc")
    return failing(raw_file(htext(header), data), "DTYPE_UNKNOWN")


@case("settled-121-not-safetensors-pickle-framed", "a Python pickle of protocol 4 (0x80 0x04, then a frame opcode 0x95 and its 8-byte length): the length prefix reads as a small N that fails check 3, and rule c of §2.3 needs no bound on N: NOT_SAFETENSORS",
      ["2.3"], ["container", "error:NOT_SAFETENSORS"] + ST)
def _(rng):
    return failing(_blob(b"\x80\x04\x95\x2a\x00\x00\x00\x00\x00\x00\x00}\x94", 50), "NOT_SAFETENSORS")


# -- §1.4: the one code of a request, in a fixed order ----------------------------------------------------
def _text_ordered(descs: dict[str, Any], order: list[str], version: str = "1.2") -> str:
    """The qformat JSON with ``tensors`` members written in ``order`` (not sorted)."""
    body = ",".join(json.dumps(n) + ":" + json.dumps(descs[n], separators=(",", ":"), sort_keys=True) for n in order)
    return '{"tensors":{' + body + '},"version":"' + version + '"}'


def _two_refused(rng: np.random.Generator):
    """'w' (the base tensor) and 'v' (a second one), as descriptors and components."""
    descs, comps, plain = base(rng)
    v, vc = second(rng)
    descs["v"] = v
    comps.update(vc)
    return descs, comps, plain


@case("settled-121-request-order-tensors-text", "two logical tensors refused at step 5, written 'w' then 'v' in the text of 'tensors': 'w' has dtype 'float64' (DTYPE_INVALID), 'v' a shape [-1] (SHAPE_INVALID); the first in text order decides (not the first in name order): DTYPE_INVALID",
      ["1.4", "3.7"], ["descriptor", "order", "error:DTYPE_INVALID"] + ST)
def _(rng):
    descs, comps, plain = _two_refused(rng)
    descs["w"]["dtype"] = "float64"
    descs["v"]["shape"] = [-1]
    return failing(qtext_file(_text_ordered(descs, ["w", "v"]), comps, plain), "DTYPE_INVALID", check_codes=["DTYPE_INVALID", "SHAPE_INVALID"])


@case("settled-121-request-order-tensors-text-reversed", "the same two tensors written 'v' then 'w': SHAPE_INVALID decides",
      ["1.4", "3.7"], ["descriptor", "order", "error:SHAPE_INVALID"] + ST)
def _(rng):
    descs, comps, plain = _two_refused(rng)
    descs["w"]["dtype"] = "float64"
    descs["v"]["shape"] = [-1]
    return failing(qtext_file(_text_ordered(descs, ["v", "w"]), comps, plain), "SHAPE_INVALID", check_codes=["DTYPE_INVALID", "SHAPE_INVALID"])


@case("settled-121-request-order-integer-like-names", "logical tensors named 'b2' and '1' written in that order, 'b2' refused with DTYPE_INVALID and '1' with SHAPE_INVALID: text order holds for names that look like integers too (a JavaScript object would list '1' first): DTYPE_INVALID",
      ["1.4", "3.7"], ["descriptor", "order", "error:DTYPE_INVALID"] + ST)
def _(rng):
    descs, comps, plain = _two_refused(rng)
    descs["w"]["dtype"] = "float64"
    descs["v"]["shape"] = [-1]
    renamed = {"b2": descs["w"], "1": descs["v"]}
    return failing(qtext_file(_text_ordered(renamed, ["b2", "1"]), comps, plain), "DTYPE_INVALID", check_codes=["DTYPE_INVALID", "SHAPE_INVALID"])


@case("settled-121-request-order-claim-before-conflict", "step 6 with two problems: 'v' uses 'w.scale' as its scale too (COMPONENT_CLAIMED_TWICE for 'w' and 'v') and a third logical tensor is named 'b', the plain tensor's name (NAME_CONFLICT): COMPONENT_CLAIMED_TWICE",
      ["1.4", "3.7", "4.3"], ["names", "order", "error:COMPONENT_CLAIMED_TWICE"] + ST)
def _(rng):
    descs, comps, plain = base(rng)
    v, vc = second(rng)
    del vc["v.scale"]
    v["scale"]["tensor"] = "w.scale"
    u, uc = second(rng, "u")
    descs["v"] = v
    descs["b"] = u
    comps.update(vc)
    comps.update(uc)
    text = _text_ordered(descs, ["b", "v", "w"])
    return failing(qtext_file(text, comps, plain), "COMPONENT_CLAIMED_TWICE", check_codes=["COMPONENT_CLAIMED_TWICE", "NAME_CONFLICT"])


def _gidx_and_codebook(rng: np.random.Generator, a_name: str, c_name: str):
    """A tensor (named a_name) whose group index has a value past its count, and a codebook tensor
    (named c_name) with a code past its table: each fails only when decoded."""
    descs, comps, plain = base_gidx(rng, [0, 0, 0, 1, 1, 1, 5])
    dc, cc, _ = codebook_file(rng, [0, 9, 12, 4, 5, 1], table_len=10)
    d = {a_name: descs["w"]}
    c = {k: v for k, v in comps.items()}
    cdesc = copy.deepcopy(dc["c"])
    cdesc["codes"]["tensor"] = f"{c_name}.codes"
    cdesc["codes"]["element"]["table_tensor"] = f"{c_name}.table"
    d[c_name] = cdesc
    c[f"{c_name}.codes"] = cc["c.codes"]
    c[f"{c_name}.table"] = cc["c.table"]
    return d, c, plain


@case("settled-121-request-order-decode-name-order", "two tensors that fail only when decoded, 'w' written first: 'w' (a group index value 5 past count 2: GROUP_INDEX_RANGE) and 'a' (a code 12 past its 10-entry codebook: CODE_OUT_OF_RANGE): decode-time checks go in name order, so 'a' decides: CODE_OUT_OF_RANGE",
      ["1.4", "10.6"], ["order", "element:codebook", "group_index", "error:CODE_OUT_OF_RANGE"] + ST)
def _(rng):
    d, c, plain = _gidx_and_codebook(rng, "w", "a")
    return failing(qtext_file(_text_ordered(d, ["w", "a"]), c, plain), "CODE_OUT_OF_RANGE", check_codes=["CODE_OUT_OF_RANGE", "GROUP_INDEX_RANGE"])


@case("settled-121-request-order-decode-name-order-reversed", "the same defects with the names swapped ('a' has the group index, 'w' the codebook): GROUP_INDEX_RANGE",
      ["1.4", "10.6"], ["order", "element:codebook", "group_index", "error:GROUP_INDEX_RANGE"] + ST)
def _(rng):
    d, c, plain = _gidx_and_codebook(rng, "a", "z")
    return failing(qtext_file(_text_ordered(d, ["z", "a"]), c, plain), "GROUP_INDEX_RANGE", check_codes=["CODE_OUT_OF_RANGE", "GROUP_INDEX_RANGE"])


@case("settled-121-request-order-codes-before-params", "one tensor whose codes index past its codebook (CODE_OUT_OF_RANGE) and whose scale's group index has a value past its count (GROUP_INDEX_RANGE): within one tensor the codes come first: CODE_OUT_OF_RANGE",
      ["1.4", "10.6"], ["order", "element:codebook", "group_index", "error:CODE_OUT_OF_RANGE"] + ST)
def _(rng):
    table = np.linspace(0.25, 2.0, 10).astype(np.float32)
    el = {"type": "codebook", "bits": 4, "table_tensor": "w.table"}
    codes = rng.integers(0, 10, size=(3, 7))
    codes[1, 2] = 13
    g = (3, 2)
    d, c = qtensor(rng, "w.", (3, 7), "float32", el, pk(8, rank=2),
                   {"scale": {"blocks": {"type": "grid", "size": [1, None]}, "op": "multiply", "values": values(rng, g, np.float16),
                              "index": ({"axis": 1, "tensor": "w.g_idx", "count": 2}, np.array([0, 0, 0, 1, 1, 1, 7], np.int32))}},
                   codes=codes, table=table)
    return failing(q_file({"w": d}, c, {"b": rng.normal(size=3).astype(np.float32)}, version="1.2"), "CODE_OUT_OF_RANGE",
                   check_codes=["CODE_OUT_OF_RANGE", "GROUP_INDEX_RANGE"])


# -- §2.3: checks 6 and 7 together ------------------------------------------------------------------
_E = '{"dtype":"F32","shape":[0],"data_offsets":[0,0]}'
for _id, _text, _code, _what in (
        ("dup-then-trailing-text", '{"a":%s,"a":%s} x' % (_E, _E), "HEADER_DUPLICATE_KEY", "a repeated member name in the header object, then text after the object: the object is parsed (and its repeated name found) before the bytes after it are looked at"),
        ("dup-then-syntax-error-same-object", '{"a":{"x":1,"x":2,"y":NaN}}', "HEADER_INVALID_JSON", "an object repeats 'x' and then holds a NaN literal before it closes: the syntax error comes first in the text"),
        ("dup-closed-then-syntax-error", '{"a":{"x":1,"x":2},"b":NaN}', "HEADER_DUPLICATE_KEY", "an inner object repeating 'x' closes before a later NaN literal: the repeated name is found first"),
        ("surrogate-then-dup", '{"__metadata__":{"x":"\\udc00"},"a":{"x":1,"x":2}}', "HEADER_DUPLICATE_KEY", "a lone surrogate escape in an earlier string and a repeated name later: lone surrogates are looked for after the whole object is parsed"),
        ("dup-then-too-deep", '{"a":%s,"a":%s,"z":%s%s}' % (_E, _E, "[" * 70, "]" * 70), "HEADER_INVALID_JSON", "a repeated name and, later, arrays nested 70 deep: the depth of the whole header is checked first"),
):
    @case(f"settled-121-header-json-{_id}", f"{_what}: {_code} (§2.3, checks 6 and 7 together)", ["2.3"], ["container", "order", f"error:{_code}"] + ST)
    def _(rng, text=_text, code=_code):
        return failing(raw_file(text, b""), code)


@case("settled-121-request-order-decode-code-points", "two tensors that fail only when decoded, named U+FF01 (a group index past its count: GROUP_INDEX_RANGE) and U+1F600 (a code past its codebook: CODE_OUT_OF_RANGE): code-point order puts U+FF01 first (UTF-16 code-unit order would put U+1F600, a surrogate pair, first): GROUP_INDEX_RANGE",
      ["1.4", "10.6", "3.2"], ["order", "element:codebook", "group_index", "error:GROUP_INDEX_RANGE"] + ST)
def _(rng):
    d, c, plain = _gidx_and_codebook(rng, "\uff01", "\U0001f600")
    return failing(qtext_file(_text_ordered(d, ["\U0001f600", "\uff01"]), c, plain), "GROUP_INDEX_RANGE", check_codes=["CODE_OUT_OF_RANGE", "GROUP_INDEX_RANGE"])


@case("settled-121-header-json-depth-counts-below-zero", "a header object whose __metadata__ repeats a member name, followed by two closing braces and 64 opening brackets: the depth count over the whole text goes below zero and back up to 62 only, so the depth check passes and the repeated name decides: HEADER_DUPLICATE_KEY (a reader counting depth without sign sees it as 'too deep')",
      ["2.3", "1.2"], ["container", "order", "error:HEADER_DUPLICATE_KEY"] + ST)
def _(rng):
    return failing(raw_file('{"__metadata__":{"n":"1","n":"2"}}}}' + "[" * 64, b""), "HEADER_DUPLICATE_KEY")


@case("settled-121-request-order-index-before-nested", "one scale with both a group index value past its count (GROUP_INDEX_RANGE) and a nested codebook code past its table (CODE_OUT_OF_RANGE): within one parameter its group index comes before its nested descriptor (§1.4): GROUP_INDEX_RANGE",
      ["1.4", "10.6", "9.3", "8.2"], ["order", "nested", "element:codebook", "group_index", "error:GROUP_INDEX_RANGE"] + ST)
def _(rng):
    descs, comps, plain = _nested_codebook_gidx(rng, 1)
    comps["w.g_idx"] = np.array([0, 0, 0, 1, 1, 1, 5], np.int32)
    return failing(q_file(descs, comps, plain, version="1.2"), "GROUP_INDEX_RANGE", check_codes=["CODE_OUT_OF_RANGE", "GROUP_INDEX_RANGE"])
