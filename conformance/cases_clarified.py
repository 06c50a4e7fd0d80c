"""Corpus cases of corpus 1.2 (issue 15): the points SPEC.md settles in its clarified 1.1 text, the
ordered structural checks of §5.5 (each code at more than one place), and the required check
orders (§3.5 extension lists, §3.7 step 5.5, §11.1 layout rules).

Built like the other case modules: bytes by conformance/build.py, expected outputs by
conformance/spec_reference.py; case ids are stable.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import ml_dtypes
import numpy as np

from . import spec_reference as R
from .build import Built, case, failing, header_entries, pk, q_file, qformat_json, qtensor, raw_file, st_file, valid, values
from .cases_errors import GRID, U4, M, base, base_nested, codebook_file, delf, header_parts, htext, qtext_file, setf, sub
from .cases_layouts import MA, TG, layout_file

C = ["container", "clarified"]
S = ["descriptor", "structure", "clarified"]
O = ["descriptor", "order", "clarified"]
LY = ["layout", "order", "clarified"]


# -- §2 the container --------------------------------------------------------------------------------
@case("malformed-offsets-reversed", "the plain tensor's data_offsets are [END, BEGIN] (reversed): OFFSETS_INVALID, never TENSOR_SIZE_MISMATCH (§2.2: END >= BEGIN is checked first)",
      ["2.2", "2.3"], C)
def _(rng):
    header, data, _ = header_parts(rng)
    b, e = header["b"]["data_offsets"]
    header["b"]["data_offsets"] = [e, b]
    return failing(raw_file(header, data), "OFFSETS_INVALID")


def _plain_extra(rng, name: str, entry: dict, data: bytes = b"") -> bytes:
    header, buf, _ = header_parts(rng)
    end = len(buf)
    entry = dict(entry, data_offsets=[end, end + len(data)])
    header[name] = entry
    return raw_file(header, buf + data)


@case("malformed-size-overflow-entry-in-empty-tensor", "a plain U8 tensor of shape [0, 2^64]: its count is 0, but an entry of 2^64 is SIZE_OVERFLOW (§2.2)",
      ["2.1", "2.2", "2.3"], C)
def _(rng):
    return failing(_plain_extra(rng, "e", {"dtype": "U8", "shape": [0, 2**64]}), "SIZE_OVERFLOW")


@case("malformed-shape-entry-2-100", "a plain tensor's shape is [2^100] (values are exact, never wrapped or capped below 2^64): SIZE_OVERFLOW",
      ["2.1", "2.2"], C)
def _(rng):
    return failing(_plain_extra(rng, "e", {"dtype": "U8", "shape": [2**100]}), "SIZE_OVERFLOW")


@case("malformed-offset-2-100", "a plain U8 [0] tensor whose end offset is 2^100: TENSOR_SIZE_MISMATCH (exact integers)", ["2.1", "2.2"], C)
def _(rng):
    header, buf, _ = header_parts(rng)
    header["e"] = {"dtype": "U8", "shape": [0], "data_offsets": [len(buf), 2**100]}
    return failing(raw_file(header, buf), "TENSOR_SIZE_MISMATCH")


@case("valid-header-minus-zero", "the first tensor's begin offset is written -0, the integer 0 (§2.1): a valid file", ["2.1"], C)
def _(rng):
    descs, comps, plain = base(rng)
    entries, data = header_entries({**comps, **plain})
    text = htext({"__metadata__": {"qformat": qformat_json(descs)}, **entries})
    text = sub(text, '"data_offsets":[0,', '"data_offsets":[-0,')
    return valid(descs, comps, plain, file_bytes=raw_file(text, data))


@case("valid-plain-bool-byte-2", "a plain BOOL tensor holds the bytes 00 01 02: not an error; returned as stored, byte for byte (§2.6)", ["2.6", "4.1"], C)
def _(rng):
    descs, comps, plain = base(rng)
    bools = np.frombuffer(bytes([0, 1, 2]), np.uint8).view(np.bool_).copy()
    plain = dict(plain, flags=bools)
    return valid(descs, comps, plain)


def _meta_note(rng, note: str) -> bytes:
    header, data, _ = header_parts(rng)
    text = htext(header)
    text = text.replace('{"qformat"', '{"note":"' + note + '","qformat"', 1)
    return raw_file(text, data)


@case("malformed-header-pair-then-lone-low", "a metadata value holds \\ud800\\udc00\\udc00: the third escape is lone (escapes pair left to right): HEADER_INVALID_JSON",
      ["1.2", "2.3"], C)
def _(rng):
    return failing(_meta_note(rng, "\\ud800\\udc00\\udc00"), "HEADER_INVALID_JSON")


@case("malformed-header-lone-high-then-pair", "a metadata value holds \\ud800\\ud800\\udc00: the first escape is lone: HEADER_INVALID_JSON",
      ["1.2", "2.3"], C)
def _(rng):
    return failing(_meta_note(rng, "\\ud800\\ud800\\udc00"), "HEADER_INVALID_JSON")


# -- §3 numbers in the qformat JSON, names, versions, extensions ----------------------------------------
def _qtext_edit(rng, old: str, new: str, version: str = "1.0") -> tuple[bytes, Any]:
    descs, comps, plain = base(rng)
    text = sub(qformat_json(descs, version), old, new)
    return qtext_file(text, comps, plain), (descs, comps, plain)


@case("valid-qformat-number-beyond-binary64", "the element's bits are written 4.0000000000000000001, which rounds to the binary64 value 4: the integer 4 (§3.2)",
      ["3.2", "5.5"], S)
def _(rng):
    data, (descs, comps, plain) = _qtext_edit(rng, '"bits":4', '"bits":4.0000000000000000001')
    return valid(descs, comps, plain, file_bytes=data)


@case("invalid-element-bits-1e999999", "the element's bits are written 1e999999, beyond the binary64 range: never an integer, so check D7 fails: ELEMENT_INVALID",
      ["3.2", "5.5"], S)
def _(rng):
    return failing(_qtext_edit(rng, '"bits":4', '"bits":1e999999')[0], "ELEMENT_INVALID")


@case("valid-qformat-minus-zero-and-exponent", "code_offset written -0 and container written 0.8e1: the integers 0 and 8 (§3.2): a valid file", ["3.2"], S)
def _(rng):
    descs, comps, plain = base(rng)
    text = sub(qformat_json(descs), '"container":8', '"container":0.8e1')
    text = sub(text, '"signedness":"unsigned"', '"signedness":"unsigned","code_offset":-0')
    return valid(descs, comps, plain, file_bytes=qtext_file(text, comps, plain))


@case("unsupported-feature-1.3-tensors-missing", "a 1.3 qformat object without 'tensors': check Q1 fails in a newer minor: FEATURE_UNSUPPORTED, whole file",
      ["3.2", "3.4"], ["forward-compat", "clarified"])
def _(rng):
    descs, comps, plain = base(rng)
    return failing(qtext_file('{"version":"1.3"}', comps, plain), "FEATURE_UNSUPPORTED")


@case("invalid-extension-name-trailing-newline-file-scope", "a file-scope extension named 'org.example.x\\n': patterns match the whole string ($ is the end, not a line end): EXTENSION_NAME_INVALID",
      ["3.3", "3.5"], ["extensions", "clarified"])
def _(rng):
    return M(rng, "EXTENSION_NAME_INVALID", extensions=[{"name": "org.example.x\n", "must_understand": False}])


@case("invalid-extension-order-unknown-before-bad-name", "w's extensions are [must-understand 'org.a.b', 'bad']: the first failing extension decides: EXTENSION_UNKNOWN (§3.5)",
      ["3.5"], ["extensions", "order", "clarified"])
def _(rng):
    return M(rng, "EXTENSION_UNKNOWN", setf("extensions", [{"name": "org.a.b"}, {"name": "bad"}]), check=["EXTENSION_NAME_INVALID", "EXTENSION_UNKNOWN"])


@case("invalid-extension-order-bad-name-before-unknown", "w's extensions are ['bad', must-understand 'org.a.b']: the first failing extension decides: EXTENSION_NAME_INVALID (§3.5)",
      ["3.5"], ["extensions", "order", "clarified"])
def _(rng):
    return M(rng, "EXTENSION_NAME_INVALID", setf("extensions", [{"name": "bad"}, {"name": "org.a.b"}]), check=["EXTENSION_NAME_INVALID", "EXTENSION_UNKNOWN"])


@case("invalid-logical-name-metadata", "a logical tensor is named '__metadata__' (the header's reserved name): SCHEMA_VIOLATION for that tensor (§4.3)",
      ["3.7", "4.3"], ["names", "clarified"])
def _(rng):
    return M(rng, "SCHEMA_VIOLATION", lambda d, c, p: d.__setitem__("__metadata__", d.pop("w")))


# -- §5.5 the structural checks, one case per check and code at new places -----------------------------
_STRUCT = [
    ("d1-nested-not-object", "D12 (D1 inside): the encoded scale is the string 'x'", "SCHEMA_VIOLATION", [setf("scale.encoded", "x")], base_nested),
    ("d2-missing-dtype", "D2: the descriptor has no dtype", "SCHEMA_VIOLATION", [delf("dtype")], base),
    ("d3-shape-boolean-entry", "D3: the shape is [true, 7] (a boolean is never an integer)", "SHAPE_INVALID", [setf("shape", [True, 7])], base),
    ("d3-shape-entry-2-53", "D3: a shape entry of 2^53 (above 2^53 - 1)", "SHAPE_INVALID", [setf("shape", [2**53, 7])], base),
    ("d3-shape-not-array", "D3: the shape is the integer 21", "SHAPE_INVALID", [setf("shape", 21)], base),
    ("d4-dtype-number", "D4: the dtype is the number 32", "DTYPE_INVALID", [setf("dtype", 32)], base),
    ("d5-codes-unknown-member", "D5: codes has an unknown member 'layout'", "SCHEMA_VIOLATION", [setf("codes.layout", "x")], base),
    ("d5-codes-not-object", "D5: codes is an array", "SCHEMA_VIOLATION", [setf("codes", [])], base),
    ("d6-codes-tensor-number", "D6: codes.tensor is the number 3", "SCHEMA_VIOLATION", [setf("codes.tensor", 3)], base),
    ("d7-element-missing-signedness", "D7: the int element has no signedness", "ELEMENT_INVALID", [delf("codes.element.signedness")], base),
    ("d7-element-type-unknown", "D7: the element's type is 'fixed'", "ELEMENT_INVALID", [setf("codes.element.type", "fixed")], base),
    ("d7-code-offset-256", "D7: code_offset 256 (the structural bound is 255)", "ELEMENT_INVALID", [setf("codes.element.code_offset", 256)], base),
    ("d7-frac-bits-17", "D7: frac_bits 17 (0..16)", "ELEMENT_INVALID", [setf("codes.element.frac_bits", 17)], base),
    ("d7-float-element-with-bits", "D7: a float element with a 'bits' member", "ELEMENT_INVALID", [setf("codes.element", {"type": "float", "format": "e2m1fn", "bits": 4})], base),
    ("d8-packing-not-object", "D8: codes.packing is the string 'lsb'", "PACKING_INVALID", [setf("codes.packing", "lsb")], base),
    ("d8-planes-missing-span", "D8: planes is {} (span missing)", "PACKING_INVALID", [setf("codes.packing.planes", {})], base),
    ("d8-straddle-string", "D8: straddle is the string 'false'", "PACKING_INVALID", [setf("codes.packing.straddle", "false")], base),
    ("d8-row-alignment-0", "D8: row_alignment 0", "PACKING_INVALID", [setf("codes.packing.row_alignment", 0)], base),
    ("d8-axis-16", "D8: axis 16 (the structural bound is 15)", "PACKING_INVALID", [setf("codes.packing.axis", 16)], base),
    ("d8-slot-order-empty", "D8: slot_order []", "PACKING_INVALID", [setf("codes.packing.slot_order", [])], base),
    ("d9-planes-unknown-member", "D9: planes has an unknown member 'stride' besides a valid span", "SCHEMA_VIOLATION", [setf("codes.packing.planes", {"span": 7, "stride": 1})], base),
    ("d10-scale-op-missing", "D10: the scale has no op", "SCHEMA_VIOLATION", [delf("scale.op")], base),
    ("d10-order-next-to-encoded", "D10: the encoded scale has an 'order' next to 'encoded'", "SCHEMA_VIOLATION", [setf("scale.order", [0, 1])], base_nested),
    ("d10-param-not-object", "D10: the zero point is the array [1]", "SCHEMA_VIOLATION", [setf("zero", [1])], base),
    ("d10-param-order-out-of-range", "D10: the scale's order is [0, 16] (entries 0..15)", "SCHEMA_VIOLATION", [setf("scale.order", [0, 16])], base),
    ("d11-flat-size-null", "D11: flat blocks with size null", "BLOCKS_INVALID", [setf("scale.blocks", {"type": "flat", "size": None})], base),
    ("d11-index-missing-count", "D11: a group index without count", "BLOCKS_INVALID", [setf("scale.blocks", {"type": "grid", "size": [1, None], "index": {"axis": 1, "tensor": "w.scale"}})], base),
    ("d11-blocks-type-missing", "D11: the zero point's blocks have no type", "BLOCKS_INVALID", [setf("zero.blocks", {"size": [1, 4]})], base),
    ("d12-nested-blocks", "D12: a nested descriptor's own blocks fail (BLOCKS_INVALID there, SCHEMA_VIOLATION for the tensor)", "SCHEMA_VIOLATION", [setf("scale.encoded.scale.blocks.size", [0, 0])], base_nested),
    ("d12-nested-packing", "D12: a nested descriptor's packing container is 64", "SCHEMA_VIOLATION", [setf("scale.encoded.codes.packing.container", 64)], base_nested),
    ("d13-layout-name-empty", "D13: layout.name is ''", "LAYOUT_INVALID", [setf("layout", {"name": ""})], base),
    ("d13-layout-parameters-array", "D13: layout.parameters is an array", "LAYOUT_INVALID", [setf("layout", {"name": "canonical", "parameters": []})], base),
    ("d14-allow-nonfinite-string", "D14: allow_nonfinite_params is the string 'yes'", "SCHEMA_VIOLATION", [setf("allow_nonfinite_params", "yes")], base),
    ("d14-extension-must-understand-string", "D14: an extension's must_understand is the string 'false'", "SCHEMA_VIOLATION", [setf("extensions", [{"name": "org.example.x", "must_understand": "false"}])], base),
    ("d14-scheme-empty", "D14: scheme is '' (1 to 64 characters; §5.4)", "SCHEMA_VIOLATION", [setf("scheme", "")], base),
    ("packing-and-blocks", "D8 and D11 fail: two different specific codes", "SCHEMA_VIOLATION", [setf("codes.packing.container", 12), setf("scale.blocks.size", [0, 4])], base),
    ("element-and-unknown-member", "D7 and D2 fail: a specific code and SCHEMA_VIOLATION", "SCHEMA_VIOLATION", [setf("codes.element.bits", 0), setf("note", "x")], base),
    ("two-packing-failures", "D8 fails twice (container 12, bit_order 'lsb'): one code", "PACKING_INVALID", [setf("codes.packing.container", 12), setf("codes.packing.bit_order", "lsb")], base),
]
for _id, _what, _code, _fns, _maker in _STRUCT:
    @case(f"invalid-structure-{_id}", f"{_what}: {_code} (SPEC.md §5.5)", ["5.5"], S)
    def _(rng, code=_code, fns=_fns, maker=_maker):
        return M(rng, code, *fns, maker=maker)


@case("valid-structure-integers-written-as-floats", "element bits 4.0, container 8.0 and a grid size 4.0: integers however written (§3.2): a valid file", ["3.2", "5.5"], S)
def _(rng):
    descs, comps, plain = base(rng)
    text = qformat_json(descs)
    text = sub(sub(text, '"bits":4', '"bits":4.0'), '"container":8', '"container":8.0')
    text = sub(text, '"size":[1,4]', '"size":[1,4.0]')
    return valid(descs, comps, plain, file_bytes=qtext_file(text, comps, plain))


@case("unsupported-feature-1.3-structure-shape", "a 1.3 file's shape is [-3, 7]: in a newer minor every structural failure is FEATURE_UNSUPPORTED (§5.5)",
      ["3.4", "5.5"], S + ["forward-compat"])
def _(rng):
    return M(rng, "FEATURE_UNSUPPORTED", setf("shape", [-3, 7]), version="1.3")


@case("unsupported-feature-1.3-structure-layout-member", "a 1.3 file's layout has an unknown member 'device': FEATURE_UNSUPPORTED", ["3.4", "5.5"], S + ["forward-compat"])
def _(rng):
    return M(rng, "FEATURE_UNSUPPORTED", setf("layout", {"name": "canonical", "device": "x"}), version="1.3")


# -- §3.7 step 5.5: the order of the semantic checks -----------------------------------------------------
_ORDER = [
    ("element-before-codes-component", "code_offset 16 (4-bit) and the codes component missing", "ELEMENT_INVALID",
     [setf("codes.element.code_offset", 16), setf("codes.tensor", "w.absent")]),
    ("packing-before-codes-dtype", "packing axis 2 (rank 2) and the codes stored as I16", "PACKING_INVALID",
     [setf("codes.packing.axis", 2), lambda d, c, p: c.__setitem__("w.codes", c["w.codes"].astype(np.int16))]),
    ("codes-before-params", "the codes component has the wrong shape and the scale component is missing", "COMPONENT_SHAPE",
     [lambda d, c, p: c.__setitem__("w.codes", np.zeros((3, 5), np.uint8)), setf("scale.tensor", "w.absent")]),
    ("zero-before-scale", "the zero point's component is missing and the scale is stored as I64", "COMPONENT_MISSING",
     [setf("zero.tensor", "w.absent"), lambda d, c, p: c.__setitem__("w.scale", c["w.scale"].astype(np.int64))]),
    ("blocks-before-param-tensor", "the scale's grid size has one entry and its component is missing", "BLOCKS_INVALID",
     [setf("scale.blocks.size", [4]), setf("scale.tensor", "w.absent")]),
    ("param-order-before-component", "the scale's order is [1, 1] and its component is stored as F64", "BLOCKS_INVALID",
     [setf("scale.order", [1, 1]), lambda d, c, p: c.__setitem__("w.scale", c["w.scale"].astype(np.float64))]),
    ("dtype-before-shape", "the scale component is stored as I64 with a wrong shape", "COMPONENT_DTYPE",
     [lambda d, c, p: c.__setitem__("w.scale", np.zeros((2, 3), np.int64))]),
]
#: A checker reports both defects of these cases (§1.4; a failed codes component stops nothing else).
_BOTH = {"codes-before-params": ["COMPONENT_MISSING", "COMPONENT_SHAPE"], "zero-before-scale": ["COMPONENT_DTYPE", "COMPONENT_MISSING"],
         "dtype-before-shape": ["COMPONENT_DTYPE", "COMPONENT_SHAPE"], "element-before-divisibility": ["LAYOUT_MISMATCH", "LAYOUT_SHAPE"],
         "packing-before-divisibility": ["LAYOUT_MISMATCH", "LAYOUT_SHAPE"], "divisibility-before-params": ["LAYOUT_GROUP_SIZE", "LAYOUT_SHAPE"],
         "structure-before-group-size": ["LAYOUT_GROUP_SIZE", "LAYOUT_MISMATCH"]}
for _id, _what, _code, _fns in _ORDER:
    @case(f"invalid-order-{_id}", f"{_what}: the first failing check of §3.7 step 5.5 decides: {_code}", ["3.7"], O)
    def _(rng, code=_code, fns=_fns, id=_id):
        return M(rng, code, *fns, check=_BOTH.get(id))


@case("invalid-order-shape-before-layout", "shape [2^32, 2^32] (numel 2^64) and an unknown layout: sub-step 4 checks the shape size first: SHAPE_INVALID", ["3.7", "5.2"], O)
def _(rng):
    return M(rng, "SHAPE_INVALID", setf("shape", [2**32, 2**32]), setf("layout", {"name": "marlin"}))


@case("invalid-order-layout-before-element", "an unknown layout and code_offset 16: layout (sub-step 4) before element (5.5): LAYOUT_UNKNOWN", ["3.7", "11.1"], O)
def _(rng):
    return M(rng, "LAYOUT_UNKNOWN", setf("layout", {"name": "marlin"}), setf("codes.element.code_offset", 16))


@case("invalid-order-nested-shape-before-nested-rules", "the nested scale's shape is not its grid and its own code_offset is 16: SHAPE_INVALID (§3.7 step 5.5.4)", ["3.7", "9.3"], O)
def _(rng):
    return M(rng, "SHAPE_INVALID", setf("scale.encoded.shape", [2, 3]), setf("scale.encoded.codes.element.code_offset", 16), maker=base_nested)


# -- §11.1 the order of the layout rules, and the settled layout points -------------------------------
def TGF(shape=(8, 64), t=2, g=32, bias=False):
    return lambda rng: layout_file(rng, TG, {"inner_k_tiles": t}, shape, 4, g, bias=bias)


def MAF(shape=(64, 128), b=4, g=32):
    return lambda rng: layout_file(rng, MA, {}, shape, b, g, sdt=np.float16)


_LAYOUT_ORDER = [
    ("element-before-divisibility", "marlin_dense with unsigned codes and N = 96", "LAYOUT_MISMATCH", MAF(), [setf("codes.element.signedness", "unsigned"), setf("shape", [96, 128])]),
    ("packing-before-divisibility", "tinygemm with container 8 and N = 12", "LAYOUT_MISMATCH", TGF(), [setf("codes.packing.container", 8), setf("shape", [12, 64])]),
    ("rank-before-element", "a rank-3 shape and unsigned codes", "LAYOUT_SHAPE", TGF(), [setf("shape", [2, 4, 64]), setf("codes.element.signedness", "unsigned")]),
    ("divisibility-before-params", "marlin_dense with N = 96 and a scale group of 16", "LAYOUT_SHAPE", MAF(), [setf("shape", [96, 128]), setf("scale.blocks.size", [1, 16])]),
    ("structure-before-group-size", "tinygemm with a zero point and a scale group of 16", "LAYOUT_MISMATCH", TGF(bias=True),
     [lambda d, c, p: d["w"].__setitem__("zero", d["w"].pop("bias")) or d["w"]["zero"].pop("op"), setf("scale.blocks.size", [1, 16])]),
    ("params-before-component-shape", "marlin_dense with a scale group of 16 and a wrong codes shape", "LAYOUT_GROUP_SIZE", MAF(),
     [setf("scale.blocks.size", [1, 16]), lambda d, c, p: c.__setitem__("w.codes", np.zeros((8, 256), np.int32))]),
    ("depth-first", "a nested descriptor in a device layout with rank 3", "LAYOUT_MISMATCH", base, [lambda d, c, p: d["w"].__setitem__("scale", {"blocks": GRID(1, 4), "op": "multiply", "encoded": {
        "shape": [3, 2], "dtype": "float32", "codes": {"tensor": "w.scale", "element": {"type": "int", "bits": 4, "signedness": "unsigned"}, "packing": {"container": 32, "bit_order": "lsb_first", "axis": 1}},
        "layout": {"name": TG, "parameters": {"inner_k_tiles": 2}}}})]),
]
for _id, _what, _code, _maker, _fns in _LAYOUT_ORDER:
    @case(f"invalid-layout-order-{_id}", f"{_what}: the first failing rule of §11.1 decides: {_code}", ["11.1"], LY)
    def _(rng, code=_code, maker=_maker, fns=_fns, id=_id):
        return M(rng, code, *fns, maker=maker, version="1.1", check=_BOTH.get(id))


@case("invalid-layout-parameter-true", "tinygemm_int4_cuda with inner_k_tiles true (not an integer): LAYOUT_INVALID (§11.1)", ["11.1", "11.3"], LY)
def _(rng):
    return M(rng, "LAYOUT_INVALID", setf("layout.parameters.inner_k_tiles", True), maker=TGF(), version="1.1")


@case("invalid-layout-parameter-missing-1.3", "a 1.3 file's tinygemm_int4_cuda lacks inner_k_tiles: a missing required parameter stays LAYOUT_INVALID in a newer minor (§11.1)",
      ["11.1", "3.4"], LY + ["forward-compat"])
def _(rng):
    return M(rng, "LAYOUT_INVALID", setf("layout.parameters", {}), maker=TGF(), version="1.3")


def _layout_valid(rng, maker, edit, text_edit=None):
    descs, comps, plain = maker(rng)
    d2 = copy.deepcopy(descs)
    edit(d2)
    data = None
    if text_edit is not None:
        data = qtext_file(text_edit(qformat_json(d2, "1.1")), comps, plain)
    else:
        data = q_file(d2, comps, plain, version="1.1")
    return valid(descs, comps, plain, file_bytes=data, version="1.1")


@case("layout-tinygemm-parameter-written-2.0", "tinygemm_int4_cuda with inner_k_tiles written 2.0, the integer 2 (§3.2, §11.1): a valid file", ["11.1", "11.3"], ["layout", "clarified"])
def _(rng):
    return _layout_valid(rng, TGF(), lambda d: None, lambda t: sub(t, '"inner_k_tiles":2', '"inner_k_tiles":2.0'))


@case("layout-tinygemm-explicit-zero-offset-frac-bits", "tinygemm_int4_cuda whose element sets code_offset 0 and frac_bits 0 explicitly (the defaults): a valid file (§11.1 rule 3)",
      ["11.1", "11.3"], ["layout", "clarified"])
def _(rng):
    return _layout_valid(rng, TGF(), lambda d: d["w"]["codes"]["element"].update(code_offset=0, frac_bits=0))


@case("layout-marlin-straddle-and-order", "marlin_dense whose packing has both straddle false and order [0, 1]: both optional members together are allowed (§11.1 rule 4)",
      ["11.1", "11.4"], ["layout", "clarified"])
def _(rng):
    return _layout_valid(rng, MAF(), lambda d: d["w"]["codes"]["packing"].update(straddle=False, order=[0, 1]))


@case("layout-marlin-group-above-k", "marlin_dense with a scale group of 4096 for K = 128 (G >= K, not listed): one group per row, per channel (runs of 32): a valid file",
      ["11.4"], ["layout", "clarified"])
def _(rng):
    descs, comps, plain = layout_file(rng, MA, {}, (64, 128), 4, 4096, sdt=np.float16)
    return valid(descs, comps, plain, version="1.1")


# -- §8.2, §10.6: group indexes ------------------------------------------------------------------------
@case("valid-group-index-empty-tensor-out-of-range", "logical shape [0, 7] with a group index holding 5 (count 2): no element, nothing decoded, not refused (§10.6); a checker reports GROUP_INDEX_RANGE",
      ["8.2", "10.6"], ["payload", "clarified"])
def _(rng):
    d, c = qtensor(rng, "w.", (0, 7), "float32", dict(U4), pk(8, rank=2),
                   {"scale": {"blocks": GRID(1, None), "op": "multiply", "values": np.ones((0, 2), np.float16),
                              "index": ({"axis": 1, "tensor": "w.g_idx", "count": 2}, np.array([0, 1, 5, 0, 0, 0, 0], np.int32))}})
    descs = {"w": d}
    descs["w"]["scale"]["blocks"] = {"type": "grid", "size": [1, None], "index": {"axis": 1, "tensor": "w.g_idx", "count": 2}}
    return valid(descs, c, {"b": rng.normal(size=3).astype(np.float32)}, check_codes=["GROUP_INDEX_RANGE"])


@case("valid-group-index-shared-two-axes", "one U8 group index serves the zero point (axis 0, count 2) and the scale (axis 1, count 3) of one tensor [6, 6]: the indexed axes need not agree (§4.3, §8.2)",
      ["4.3", "8.2"], ["blocks:index", "clarified"])
def _(rng):
    g = np.array([0, 1, 1, 0, 1, 0], np.uint8)
    d, c = qtensor(rng, "w.", (6, 6), "float32", dict(U4), pk(8, rank=2),
                   {"zero": {"blocks": GRID(None, 1), "values": rng.integers(0, 16, size=(2, 6)).astype(np.uint8)},
                    "scale": {"blocks": GRID(1, None), "op": "multiply", "values": values(rng, (6, 3), np.float16)}})
    d["zero"]["blocks"] = {"type": "grid", "size": [None, 1], "index": {"axis": 0, "tensor": "w.g_idx", "count": 2}}
    d["scale"]["blocks"] = {"type": "grid", "size": [1, None], "index": {"axis": 1, "tensor": "w.g_idx", "count": 3}}
    c["w.g_idx"] = g
    return valid({"w": d}, c, {"b": rng.normal(size=3).astype(np.float32)})
