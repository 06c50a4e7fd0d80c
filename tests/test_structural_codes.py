"""SPEC.md §5.5: the ordered structural checks assign every code without a JSON Schema library.

Three things are compared on generated descriptors (corpus descriptors mutated by hypothesis,
and descriptors generated from scratch):

- the JSON Schema (``qformat/schema/qformat-1.0.schema.json``, through ``jsonschema``) and the
  check list accept exactly the same documents, both as the reference reader implements it
  (:mod:`qformat.structure`) and as the corpus's independent transcription does
  (``conformance.spec_reference.structural_code``);
- the reference reader assigns the code of the list (``parse_descriptor``);
- the list gives the same codes as the location-based rule of spec 1.1 (:func:`location_code`,
  kept here as an oracle), so that no corpus expectation changed when the list replaced it.
"""

from __future__ import annotations

import copy
import json
import struct
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance import spec_reference as R
from qformat import structure, tables
from qformat.descriptor import parse_descriptor
from qformat.errors import QFormatError

CORPUS = Path(__file__).resolve().parent.parent / "conformance" / "v1"


@lru_cache(maxsize=None)
def _validator() -> jsonschema.Draft202012Validator:
    s = tables.schema()
    return jsonschema.Draft202012Validator({"$schema": s["$schema"], "$defs": s["$defs"], "$ref": "#/$defs/descriptor"})


def schema_valid(d: Any) -> bool:
    return _validator().is_valid(d)


_SPECIFIC = ((("dtype",), "DTYPE_INVALID"), (("shape",), "SHAPE_INVALID"), (("codes", "element"), "ELEMENT_INVALID"),
             (("codes", "packing"), "PACKING_INVALID"), (("layout",), "LAYOUT_INVALID"))


def location_code(raw: Any) -> tuple[str, list]:
    """Spec 1.1's rule: the code from where the Python jsonschema package reports each failure."""
    errs = list(_validator().iter_errors(raw))
    codes = set()
    for e in errs:
        path = tuple(str(p) for p in e.absolute_path)
        code = "SCHEMA_VIOLATION"
        if e.validator != "additionalProperties":
            for prefix, c in _SPECIFIC:
                if path[: len(prefix)] == prefix:
                    code = c
                    break
            if len(path) >= 2 and path[0] in ("zero", "scale", "bias") and path[1] == "blocks":
                code = "BLOCKS_INVALID"
        codes.add(code)
    return (codes.pop() if len(codes) == 1 else "SCHEMA_VIOLATION"), []


@lru_cache(maxsize=None)
def corpus_descriptors() -> list[dict]:
    out = []
    man = json.loads((CORPUS / "manifest.json").read_text())
    for c in man["cases"]:
        if not c["input"].endswith(".safetensors"):
            continue
        data = (CORPUS / c["input"]).read_bytes()
        try:
            n = struct.unpack("<Q", data[:8])[0]
            q = json.loads(json.loads(data[8 : 8 + n])["__metadata__"]["qformat"])
            out += [v for v in q["tensors"].values() if isinstance(v, dict)]
        except Exception:  # noqa: BLE001 - malformed cases have no descriptor
            continue
    return out


KEYS = ["type", "size", "tensor", "span", "x", "order", "index", "planes", "slot_order", "row_alignment", "table",
        "table_tensor", "encoded", "zero", "scale", "bias", "layout", "name", "parameters", "code_offset", "frac_bits",
        "op", "bits", "format", "signedness", "count", "axis", "dtype", "shape", "codes", "element", "packing",
        "container", "bit_order", "straddle", "scheme", "allow_nonfinite_params", "extensions", "must_understand",
        "configuration", "blocks"]
SCALARS = st.one_of(
    st.sampled_from([None, True, False, 0, 1, 2, 4, 8, 15, 16, 17, 32, 255, 256, 65536, 65537, 2**53 - 1, 2**53,
                     4.0, 8.0, 0.5, -1, 1e300, "", "x", "int", "float", "codebook", "grid", "flat", "nf4", "e2m1fn",
                     "float32", "bfloat16", "lsb_first", "msb_first", "offset_binary", "multiply", "divide", "add",
                     "subtract", "canonical", "x" * 65, "x" * 257]),
    st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=4))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)), max_leaves=8)


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, prefix + (i,))
    return out


@st.composite
def mutated_descriptors(draw: st.DrawFn) -> Any:
    d = copy.deepcopy(draw(st.sampled_from(corpus_descriptors())))
    for _ in range(draw(st.integers(0, 3))):
        paths = _paths(d)
        path = draw(st.sampled_from(paths))
        if not path:
            if draw(st.booleans()):
                d = draw(JSON)
            continue
        parent = d
        for k in path[:-1]:
            parent = parent[k]
        op = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if op == "replace":
            parent[path[-1]] = draw(JSON)
        elif op == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.sampled_from(KEYS))] = draw(JSON)
        if not isinstance(d, (dict, list)):
            break
    return d


def _agree(d: Any) -> None:
    valid = schema_valid(d)
    ours, _ = structure.descriptor_code(d)
    theirs = R.structural_code(d)
    assert (ours is None) == valid, (d, ours)
    assert (theirs is None) == valid, (d, theirs)
    if valid:
        return
    assert ours == theirs == location_code(d)[0], (d, ours, theirs, location_code(d)[0])
    if isinstance(d, dict) and structure.is_object(d):
        from qformat.descriptor import depth_of
        if depth_of(d) <= tables.limits()["max_nesting_depth"]:
            with pytest.raises(QFormatError) as ei:
                parse_descriptor("t", d)
            assert ei.value.code == ours


@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutated_descriptors())
def test_list_and_schema_agree_on_mutated_corpus_descriptors(d: Any) -> None:
    _agree(d)


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(KEYS), JSON, max_size=6))
def test_list_and_schema_agree_on_arbitrary_objects(d: Any) -> None:
    _agree(d)


def test_every_corpus_descriptor_is_structurally_valid_or_refused_alike() -> None:
    for d in corpus_descriptors():
        _agree(d)


@pytest.mark.parametrize("d, code", [
    ({"shape": [2], "dtype": "float64", "codes": {}}, "SCHEMA_VIOLATION"),  # D4 and D5 together
    ({"shape": [2.0], "dtype": "float64"}, "SCHEMA_VIOLATION"),  # D2 (codes missing) wins over D4
    ({"shape": [True], "dtype": "float32", "codes": {"tensor": "c", "element": {"type": "int", "bits": 4, "signedness": "unsigned"}, "packing": {"container": 8, "bit_order": "lsb_first", "axis": None}}}, "SHAPE_INVALID"),
    ({"shape": [2], "dtype": "float32", "codes": {"tensor": "c", "element": {"type": "int", "bits": 4.0, "signedness": "unsigned", "x": 1}, "packing": {"container": 8.0, "bit_order": "lsb_first", "axis": None}}}, "ELEMENT_INVALID"),
    ({"shape": [2], "dtype": "float32", "codes": {"tensor": "c", "element": {"type": "int", "bits": 4, "signedness": "unsigned"}, "packing": {"container": 8, "bit_order": "lsb_first"}}}, "PACKING_INVALID"),
    ({"shape": [2], "dtype": "float32", "codes": {"tensor": "c", "element": {"type": "int", "bits": 4, "signedness": "unsigned"}, "packing": {"container": 8, "bit_order": "lsb_first", "axis": None, "planes": {"span": 2, "x": 1}}}}, "SCHEMA_VIOLATION"),
    ({"shape": [2], "dtype": "float32", "codes": {"tensor": "c", "element": {"type": "int", "bits": 4, "signedness": "unsigned"}, "packing": {"container": 8, "bit_order": "lsb_first", "axis": None}}, "layout": {"parameters": {}}}, "LAYOUT_INVALID"),
    ({"shape": [2], "dtype": "float32", "codes": {"tensor": "c", "element": {"type": "int", "bits": 4, "signedness": "unsigned"}, "packing": {"container": 8, "bit_order": "lsb_first", "axis": None}},
      "zero": {"tensor": "z", "blocks": {"type": "flat", "size": 0}}, "scale": {"op": "multiply", "tensor": "s", "blocks": {"type": "grid"}}}, "BLOCKS_INVALID"),
])
def test_examples(d: dict, code: str) -> None:
    assert structure.descriptor_code(d)[0] == code
    assert R.structural_code(d) == code
    assert location_code(d)[0] == code
