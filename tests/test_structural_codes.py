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
import random
import shutil
import struct
import subprocess
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

from .strategies import json_paths

CORPUS = Path(__file__).resolve().parent.parent / "conformance" / "v1"
JS = Path(__file__).resolve().parent.parent / "readers" / "js"


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


@st.composite
def mutated_descriptors(draw: st.DrawFn) -> Any:
    d = copy.deepcopy(draw(st.sampled_from(corpus_descriptors())))
    for _ in range(draw(st.integers(0, 3))):
        paths = json_paths(d)
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


EXAMPLES = [
    ({"shape": [2], "dtype": "float64", "codes": {}}, "SCHEMA_VIOLATION"),  # D4 and D5 together
    ({"shape": [2.0], "dtype": "float64"}, "SCHEMA_VIOLATION"),  # D2 (codes missing) wins over D4
    ({"shape": [True], "dtype": "float32", "codes": {"tensor": "c", "element": {"type": "int", "bits": 4, "signedness": "unsigned"}, "packing": {"container": 8, "bit_order": "lsb_first", "axis": None}}}, "SHAPE_INVALID"),
    ({"shape": [2], "dtype": "float32", "codes": {"tensor": "c", "element": {"type": "int", "bits": 4.0, "signedness": "unsigned", "x": 1}, "packing": {"container": 8.0, "bit_order": "lsb_first", "axis": None}}}, "ELEMENT_INVALID"),
    ({"shape": [2], "dtype": "float32", "codes": {"tensor": "c", "element": {"type": "int", "bits": 4, "signedness": "unsigned"}, "packing": {"container": 8, "bit_order": "lsb_first"}}}, "PACKING_INVALID"),
    ({"shape": [2], "dtype": "float32", "codes": {"tensor": "c", "element": {"type": "int", "bits": 4, "signedness": "unsigned"}, "packing": {"container": 8, "bit_order": "lsb_first", "axis": None, "planes": {"span": 2, "x": 1}}}}, "SCHEMA_VIOLATION"),
    ({"shape": [2], "dtype": "float32", "codes": {"tensor": "c", "element": {"type": "int", "bits": 4, "signedness": "unsigned"}, "packing": {"container": 8, "bit_order": "lsb_first", "axis": None}}, "layout": {"parameters": {}}}, "LAYOUT_INVALID"),
    ({"shape": [2], "dtype": "float32", "codes": {"tensor": "c", "element": {"type": "int", "bits": 4, "signedness": "unsigned"}, "packing": {"container": 8, "bit_order": "lsb_first", "axis": None}},
      "zero": {"tensor": "z", "blocks": {"type": "flat", "size": 0}}, "scale": {"op": "multiply", "tensor": "s", "blocks": {"type": "grid"}}}, "BLOCKS_INVALID"),
]


@pytest.mark.parametrize("d, code", EXAMPLES)
def test_examples(d: dict, code: str) -> None:
    assert structure.descriptor_code(d)[0] == code
    assert R.structural_code(d) == code
    assert location_code(d)[0] == code


# -- the JavaScript reader's checks (readers/js/src/structure.js), written from the same text ---------
_JS_CODES = r"""
import { createInterface } from "node:readline";
import { parseStrict } from "./src/json.js";
import { descriptorFailures, structuralCode } from "./src/structure.js";
for await (const line of createInterface({ input: process.stdin })) {
  if (!line) continue;
  console.log(JSON.stringify(structuralCode(descriptorFailures(parseStrict(line, { maxDepth: 64 }).value))));
}
"""


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if depth < 2 and r < 0.15:
        return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if depth < 2 and r < 0.3:
        return {rng.choice(KEYS): _random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    if r < 0.4:
        return rng.randint(-(2**70), 2**70) if rng.random() < 0.3 else rng.randint(-2, 300)
    return copy.deepcopy(rng.choice(_JS_SCALARS))


_JS_SCALARS = [None, True, False, 0, 1, 2, 4, 8, 15, 16, 17, 32, 255, 256, 65536, 65537, 2**53 - 1, 2**53, 4.0, 8.0, 0.5, -1,
               1e300, "", "x", "int", "float", "codebook", "grid", "flat", "nf4", "e2m1fn", "float32", "bfloat16",
               "lsb_first", "msb_first", "offset_binary", "multiply", "divide", "add", "subtract", "canonical",
               "x" * 65, "x" * 257, "\U0001F600" * 64, "\U0001F600" * 65, {}, [], {"span": 2}, [None, 32],
               list(range(16)), list(range(17)), [15] * 16, [None] * 17, list(range(256)), list(range(257))]


def _well_formed(d: Any) -> bool:
    """No lone surrogate, NaN or infinity (qformat JSON refuses them before any descriptor is
    examined, §3.1)."""
    try:
        json.dumps(d, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (UnicodeEncodeError, ValueError):
        return False
    return True


@lru_cache(maxsize=None)
def _well_formed_corpus() -> tuple[dict, ...]:
    """The well-formed corpus descriptors, in corpus order, filtered once (filtering the 500 of
    them again for each of the 6,000 random descriptors took 20 s of CPU); only copies of them
    are mutated."""
    return tuple(d for d in corpus_descriptors() if _well_formed(d))


def _random_descriptor(rng: random.Random) -> Any:
    if rng.random() < 0.25:
        return {rng.choice(KEYS): _random_json(rng) for _ in range(rng.randint(0, 6))}
    d = copy.deepcopy(rng.choice(_well_formed_corpus()))
    for _ in range(rng.randint(0, 3)):
        path = rng.choice(json_paths(d))
        if not path:
            continue
        parent = d
        for k in path[:-1]:
            parent = parent[k]
        op = rng.choice(["replace", "replace", "delete", "add"])
        if op == "replace":
            parent[path[-1]] = _random_json(rng)
        elif op == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[rng.choice(KEYS)] = _random_json(rng)
    return d


@pytest.mark.skipif(shutil.which("node") is None, reason="node (Node.js 18 or later) is not installed")
def test_js_reader_checks_agree_with_the_transcription() -> None:
    """readers/js assigns §5.5 codes by its own checks (no schema library); on mutated corpus
    descriptors and arbitrary objects it gives the transcription's code (None: valid)."""
    rng = random.Random(15)
    docs = [_random_descriptor(rng) for _ in range(6000)]
    docs += [d for d, _ in EXAMPLES]
    bases = list(_well_formed_corpus())
    for base in rng.sample(bases, min(40, len(bases))):
        for path in json_paths(base)[1:]:  # every member and item replaced by boundary values, or removed
            for v in rng.sample(_JS_SCALARS, 6) + ["<delete>"]:
                d = copy.deepcopy(base)
                parent = d
                for k in path[:-1]:
                    parent = parent[k]
                if v == "<delete>":
                    del parent[path[-1]]
                else:
                    parent[path[-1]] = copy.deepcopy(v)
                docs.append(d)
        for path in json_paths(base):  # every object given a member, a known one or not
            for k in rng.sample(KEYS, 8):
                d = copy.deepcopy(base)
                parent = d
                for p in path:
                    parent = parent[p]
                if isinstance(parent, dict):
                    parent[k] = copy.deepcopy(rng.choice(_JS_SCALARS))
                    docs.append(d)
    lines = [json.dumps(d) for d in docs]
    p = subprocess.run([shutil.which("node"), "--input-type=module", "-e", _JS_CODES], input="\n".join(lines) + "\n",
                       capture_output=True, text=True, encoding="utf-8", timeout=300, cwd=JS)
    assert p.returncode == 0, p.stderr[-2000:]
    got = [json.loads(x) for x in p.stdout.splitlines()]
    assert len(got) == len(docs)
    want = [R.structural_code(d) for d in docs]
    bad = [(line, code, w) for line, code, w in zip(lines, got, want) if code != w]
    assert not bad, f"{len(bad)} of {len(docs)} disagree, e.g. {bad[:5]}"
    codes = set(want)
    assert {None, "SCHEMA_VIOLATION", "SHAPE_INVALID", "DTYPE_INVALID", "ELEMENT_INVALID", "PACKING_INVALID",
            "BLOCKS_INVALID", "LAYOUT_INVALID"} <= codes, codes
