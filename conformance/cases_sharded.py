"""Corpus cases of corpus 1.3 (issue 15): the sharded-checkpoint points SPEC.md §14 settles.

A name exposed by two shards, shards without a qformat object, and the required order of the
index checks (the index, then shard names and existence, then shard by shard in order of file
name: container, listing rules, qformat content).  Expected outcomes are read from §14's text;
decoded values come from conformance/spec_reference.py.  The rule "an index larger than
max_index_bytes is INDEX_INVALID" has no case: such an index (over 64 MiB) does not fit the
corpus's size limit (20 MB).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from . import spec_reference as R
from .build import Built, case, features_of, st_file
from .cases_errors import INDEX, S1, S2, base, qfile, second

SH = ["sharded", "clarified"]


def _index(weight_map: dict[str, str]) -> bytes:
    """The index file, `weight_map` members in the order given (not sorted)."""
    return json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}, indent=1).encode()


def _parts(rng: np.random.Generator) -> tuple[dict, dict, dict, dict, dict, dict]:
    """(descs, comps, plain) of the first shard ('w' + plain 'b') and of the second ('v' + plain 'c')."""
    d1, c1, p1 = base(rng)
    v, c2 = second(rng)
    p2 = {"c": rng.normal(size=2).astype(np.float32)}
    return d1, c1, p1, {"v": v}, c2, p2


def _wm(*groups: tuple[list[str], str]) -> dict[str, str]:
    return {n: shard for names, shard in groups for n in names}


def _invalid(files: dict[str, bytes], code: str, check: list[str], expect: str = "invalid") -> Built:
    return Built({INDEX: files.pop(INDEX), **files}, INDEX, expect, code, None, sorted(set(check)),
                 sorted({f"error:{code}", "sharded"}))


@case("valid-sharded-plain-shard", "the second shard has no qformat object (a plain safetensors file): every tensor in it is plain and read as stored (§14)",
      ["14", "3.1"], SH)
def _(rng):
    d1, c1, p1, _, _, _ = _parts(rng)
    p2 = {"e": rng.normal(size=(2, 3)).astype(np.float32), "f": np.arange(4, dtype=np.int32)}
    wm = _wm(([*c1, *p1, "w"], S1), ([*p2], S2))
    expected = {"w": R.decode(d1["w"], c1), **p1, **p2}
    return Built({INDEX: _index(dict(sorted(wm.items()))), S1: qfile(d1, c1, p1), S2: st_file(p2, {"format": "pt"})}, INDEX, "valid", None,
                 expected, [], sorted(features_of(d1["w"]) | {"sharded"}))


@case("invalid-index-logical-name-in-plain-shard", "the index lists 'v' in the second shard, which has no qformat object and so no logical tensor 'v' (only plain 'e'): INDEX_MISMATCH",
      ["14", "3.1"], SH)
def _(rng):
    d1, c1, p1, _, _, _ = _parts(rng)
    p2 = {"e": rng.normal(size=3).astype(np.float32)}
    wm = _wm(([*c1, *p1, "w"], S1), (["e", "v"], S2))
    return _invalid({INDEX: _index(dict(sorted(wm.items()))), S1: qfile(d1, c1, p1), S2: st_file(p2)}, "INDEX_MISMATCH", ["INDEX_MISMATCH"])


@case("invalid-index-stored-name-in-two-shards", "both shards store a plain tensor 'b'; the index lists 'b' in the first: the second shard's 'b' is INDEX_MISMATCH (a name two shards expose)",
      ["14"], SH)
def _(rng):
    d1, c1, p1, d2, c2, _ = _parts(rng)
    p2 = {"b": rng.normal(size=2).astype(np.float32)}
    wm = _wm(([*c1, *p1, "w"], S1), ([*c2, "v"], S2))
    return _invalid({INDEX: _index(dict(sorted(wm.items()))), S1: qfile(d1, c1, p1), S2: qfile(d2, c2, p2)}, "INDEX_MISMATCH", ["INDEX_MISMATCH"])


@case("invalid-index-logical-name-in-two-shards", "the second shard's logical tensor is named 'b', the name of the first shard's plain tensor; the index lists every stored tensor and no logical name, so only the rule 'a name two shards expose' applies: INDEX_MISMATCH",
      ["14", "4.3"], SH)
def _(rng):
    d1, c1, p1, d2, c2, p2 = _parts(rng)
    wm = _wm(([*c1, *p1], S1), ([*c2, *p2], S2))
    return _invalid({INDEX: _index(dict(sorted(wm.items()))), S1: qfile(d1, c1, p1), S2: qfile({"b": d2["v"]}, c2, p2)}, "INDEX_MISMATCH", ["INDEX_MISMATCH"])


@case("invalid-index-order-shard-names-first", "the index places 'ghost' in the first shard (INDEX_MISMATCH) and 'x' in a shard file that does not exist: INDEX_INVALID (shard names and existence are checked before any shard); a checker reports both",
      ["14"], SH)
def _(rng):
    d1, c1, p1, d2, c2, p2 = _parts(rng)
    wm = _wm(([*c1, *p1, "w", "ghost"], S1), ([*c2, *p2, "v"], S2), (["x"], "model-00003-of-00003.safetensors"))
    return _invalid({INDEX: _index(wm), S1: qfile(d1, c1, p1), S2: qfile(d2, c2, p2)}, "INDEX_INVALID", ["INDEX_INVALID", "INDEX_MISMATCH"])


def _bad_dtype(descs: dict[str, Any], name: str) -> dict[str, Any]:
    d = json.loads(json.dumps(descs))
    d[name]["dtype"] = "float64"
    return d


@case("invalid-index-order-shards-by-file-name", "the index lists the second shard's tensors first; the first shard by file name has a descriptor of dtype 'float64' (DTYPE_INVALID), the second an unlisted plain tensor 'c': shards are taken in order of file name, so DTYPE_INVALID; a checker reports both",
      ["14", "5.5"], SH)
def _(rng):
    d1, c1, p1, d2, c2, p2 = _parts(rng)
    wm = _wm(([*c2, "v"], S2), ([*c1, *p1, "w"], S1))
    return _invalid({INDEX: _index(wm), S1: qfile(_bad_dtype(d1, "w"), c1, p1), S2: qfile(d2, c2, p2)}, "DTYPE_INVALID",
                    ["DTYPE_INVALID", "INDEX_MISMATCH"])


@case("invalid-index-order-listing-before-next-shard", "the first shard's plain 'b' is not listed (INDEX_MISMATCH); the second shard has a descriptor of dtype 'float64' (DTYPE_INVALID): the first shard's listing decides, INDEX_MISMATCH; a checker reports both",
      ["14", "5.5"], SH)
def _(rng):
    d1, c1, p1, d2, c2, p2 = _parts(rng)
    wm = _wm(([*c1, "w"], S1), ([*c2, *p2, "v"], S2))
    return _invalid({INDEX: _index(dict(sorted(wm.items()))), S1: qfile(d1, c1, p1), S2: qfile(_bad_dtype(d2, "v"), c2, p2)}, "INDEX_MISMATCH",
                    ["DTYPE_INVALID", "INDEX_MISMATCH"])


@case("invalid-index-order-listing-before-content", "in the first shard, the plain 'b' is not listed (INDEX_MISMATCH) and 'w' has dtype 'float64' (DTYPE_INVALID): the listing rules come before the shard's qformat content, INDEX_MISMATCH; a checker reports both",
      ["14", "5.5"], SH)
def _(rng):
    d1, c1, p1, d2, c2, p2 = _parts(rng)
    wm = _wm(([*c1, "w"], S1), ([*c2, *p2, "v"], S2))
    return _invalid({INDEX: _index(dict(sorted(wm.items()))), S1: qfile(_bad_dtype(d1, "w"), c1, p1), S2: qfile(d2, c2, p2)}, "INDEX_MISMATCH",
                    ["DTYPE_INVALID", "INDEX_MISMATCH"])


@case("malformed-index-order-container-before-listing", "the first shard has 3 bytes after its last tensor (TRAILING_BYTES) and its plain 'b' is not listed: the shard's container comes before the listing rules, TRAILING_BYTES; a checker cannot list a broken shard's tensors and reports TRAILING_BYTES",
      ["14", "2.3"], SH)
def _(rng):
    d1, c1, p1, d2, c2, p2 = _parts(rng)
    wm = _wm(([*c1, "w"], S1), ([*c2, *p2, "v"], S2))
    return _invalid({INDEX: _index(dict(sorted(wm.items()))), S1: qfile(d1, c1, p1) + b"\0\0\0", S2: qfile(d2, c2, p2)}, "TRAILING_BYTES",
                    ["TRAILING_BYTES"], expect="malformed")
