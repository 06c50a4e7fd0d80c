"""The points SPEC.md 1.2.1 pins (issue 43; the decisions A1-A16 of the spec-1.2 review), in the
JavaScript reader: one probe file per point, built byte by byte with conformance/build.py's
helpers, read through the command protocol (``qformat-read.mjs --batch``, as the corpus and the
differential harness read it) and checked (``--check``, with its exit status).  Each probe names
the code SPEC.md 1.2.1 decides; the 1.2 reader gave another for most of them (HEADER_TOO_LARGE
for a text file, a ZIP, a pickle and a GGUF file; SCHEMA_VIOLATION for 17-entry orders; ...).

A2 (container check order), A3 (NOT_SAFETENSORS), A4 (layout arguments in a newer minor), A5
(nested descriptors checked whole), A8 (exact offsets, however many digits), A1 (64-entry arrays),
A13 (names shards expose) and A16 (a shard that is a folder).  A7 (verifying reads) is an API
point: readers/js/test/settled.test.mjs.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conformance.build import build_file, q_file, raw_file

ROOT = Path(__file__).resolve().parent.parent
READ = Path(os.environ.get("QFORMAT_JS_READER", ROOT / "readers" / "js" / "bin" / "qformat-read.mjs"))  # another build: QFORMAT_JS_READER
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed: the JavaScript reader cannot run")
TINYGEMM = ROOT / "conformance" / "v1" / "cases" / "layout-tinygemm-t2-8x64-g32" / "input.safetensors"


def _build(OUT: str) -> dict[str, str]:
    """Write every probe under OUT; returns {probe path relative to OUT: the decided code or 'valid'}."""
    expect: dict[str, str] = {}

    def put(id: str, data: bytes, code: str) -> None:
        with open(os.path.join(OUT, id + ".safetensors"), "wb") as f:
            f.write(data)
        expect[id + ".safetensors"] = code

    U8 = lambda a: np.asarray(a, np.uint8)
    F32 = lambda a: np.asarray(a, np.float32)
    INT8 = {"type": "int", "bits": 8, "signedness": "twos_complement"}

    # ---- A1
    def a1():
        shape = [1] * 15 + [4, 1]  # packing axes are 0..15 (B12)
        desc = {"shape": shape, "dtype": "float32",
                "codes": {"tensor": "w.codes", "element": INT8, "packing": {"container": 8, "bit_order": "lsb_first", "axis": 15}},
                "scale": {"blocks": {"type": "grid", "size": [None] * 17}, "op": "multiply", "tensor": "w.scale"}}
        comps = {"w.codes": U8([1, 2, 3, 4]).reshape(shape), "w.scale": F32([2.0]).reshape([1] * 17)}
        put("a1-rank17-grid-size-17", q_file({"w": desc}, comps), "valid")
        d17 = json.loads(json.dumps(desc)); d17["scale"]["blocks"]["size"] = [None] * 15 + [2, 1]
        put("a1-rank17-grid-size-17-blocks", q_file({"w": d17}, {"w.codes": comps["w.codes"], "w.scale": F32([2.0, 3.0]).reshape([1] * 15 + [2, 1])}), "valid")
        d16 = json.loads(json.dumps(desc)); d16["scale"]["blocks"]["size"] = [None] * 16
        put("a1-rank17-grid-size-16", q_file({"w": d16}, comps), "BLOCKS_INVALID")
        # parameter order of 17 entries on a rank-2 tensor
        base = lambda: {"shape": [2, 4], "dtype": "float32",
                        "codes": {"tensor": "w.codes", "element": INT8, "packing": {"container": 8, "bit_order": "lsb_first", "axis": 1}},
                        "scale": {"blocks": {"type": "grid", "size": [1, 4]}, "op": "multiply", "tensor": "w.scale"}}
        c2 = {"w.codes": U8(np.arange(8)).reshape(2, 4), "w.scale": F32([[1.0], [2.0]])}
        d = base(); d["scale"]["order"] = list(range(16)) + [0]
        put("a1-param-order-17", q_file({"w": d}, c2), "BLOCKS_INVALID")
        d = base(); d["scale"]["order"] = [0] * 65
        put("a1-param-order-65", q_file({"w": d}, c2), "SCHEMA_VIOLATION")
        d = base(); d["codes"]["packing"]["order"] = list(range(16)) + [0]
        put("a1-packing-order-17", q_file({"w": d}, c2), "PACKING_INVALID")
        d = base(); d["codes"]["packing"]["order"] = [0] * 65
        put("a1-packing-order-65", q_file({"w": d}, c2), "PACKING_INVALID")
        d = base(); d["scale"]["blocks"]["size"] = [1] * 65
        put("a1-grid-size-65", q_file({"w": d}, c2), "BLOCKS_INVALID")
        d = base(); d["scale"]["blocks"]["size"] = [1] * 17
        put("a1-grid-size-17-rank2", q_file({"w": d}, c2), "BLOCKS_INVALID")
        # nested packing order of 17 entries
        d = base()
        d["scale"] = {"blocks": {"type": "grid", "size": [1, 4]}, "op": "multiply",
                      "encoded": {"shape": [2, 1], "dtype": "float32",
                                  "codes": {"tensor": "s.codes", "element": INT8,
                                            "packing": {"container": 8, "bit_order": "lsb_first", "axis": 1, "order": list(range(16)) + [0]}}}}
        put("a1-nested-packing-order-17", q_file({"w": d}, {"w.codes": c2["w.codes"], "s.codes": U8([[1], [2]])}), "PACKING_INVALID")

    # ---- A2
    def a2():
        meta_bad = {"x": 1}
        ent_extra = {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "extra": 1}
        hdr = '{"a":%s,"__metadata__":%s}' % (json.dumps(ent_extra), json.dumps(meta_bad))
        put("a2-entry-before-metadata", raw_file(hdr, b"\0"), "TENSOR_ENTRY_INVALID")
        hdr = '{"__metadata__":%s,"a":%s}' % (json.dumps(meta_bad), json.dumps(ent_extra))
        put("a2-metadata-before-entry", raw_file(hdr, b"\0"), "METADATA_INVALID")
        # one entry: the order SPEC.md 1.2.1 §2.3 gives: members and dtype a string (10), dtype known
        # (11), then shape, data_offsets and rank (the rest of 10): an unknown dtype comes first
        hdr = '{"a":{"dtype":"X9","shape":"no","data_offsets":[0,1]}}'
        put("a2-dtype-unknown-before-shape", raw_file(hdr, b"\0"), "DTYPE_UNKNOWN")
        hdr = '{"a":{"dtype":"X9","shape":[1],"data_offsets":[0]}}'
        put("a2-dtype-unknown-before-offsets", raw_file(hdr, b"\0"), "DTYPE_UNKNOWN")
        hdr = '{"a":{"dtype":"X9","shape":[%s],"data_offsets":[0,1]}}' % ",".join(["1"] * 65)
        put("a2-dtype-unknown-before-rank", raw_file(hdr, b"\0"), "DTYPE_UNKNOWN")
        hdr = '{"a":{"dtype":7,"shape":"no","data_offsets":[0,1]}}'
        put("a2-dtype-not-string-first", raw_file(hdr, b"\0"), "TENSOR_ENTRY_INVALID")
        hdr = '{"a":{"dtype":"X9","shape":[1],"data_offsets":[0,1],"more":1}}'
        put("a2-members-before-dtype", raw_file(hdr, b"\0"), "TENSOR_ENTRY_INVALID")
        # entry by entry: a's overflow before b's entry problem
        hdr = '{"a":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,1]},"b":{"dtype":"U8"}}'
        put("a2-entry-by-entry", raw_file(hdr, b"\0"), "SIZE_OVERFLOW")
        # check 14 of a before checks 10 of b; tiling (15) after every entry
        hdr = '{"a":{"dtype":"U8","shape":[1],"data_offsets":[5,6]},"b":{"dtype":"Q","shape":[1],"data_offsets":[0,1]}}'
        put("a2-tiling-after-entries", raw_file(hdr, b"\0"), "DTYPE_UNKNOWN")

    # ---- A3
    def a3():
        put("a3-text", b"hello world, this is a README file\n", "NOT_SAFETENSORS")
        put("a3-gguf", b"GGUF\x03\x00\x00\x00" + b"\0" * 40, "NOT_SAFETENSORS")
        put("a3-zip", b"PK\x03\x04\x14\x00\x00\x00" + b"\0" * 40, "NOT_SAFETENSORS")
        put("a3-pickle2", b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01" + b"\0" * 10, "NOT_SAFETENSORS")
        put("a3-pickle5", b"\x80\x05\x95\x10\x00\x00\x00\x00\x00\x00" + b"\0" * 10, "NOT_SAFETENSORS")  # framed: N < 2^48, rule (c) needs no bound (SPEC.md 1.2.1)
        put("a3-pickle5-unframed", b"\x80\x05}q\x00(X\x01" + b"\0" * 10, "NOT_SAFETENSORS")
        put("a3-pickle6", b"\x80\x06\x95\x10\x00\x00\x00\x00\x00\x00" + b"\0" * 10, "HEADER_TOO_LARGE")
        put("a3-pickle-small-n", b"\x80\x02\x00\x00\x00\x00\x00\x00" + b"\0" * 10, "NOT_SAFETENSORS")  # rule (c) has no bound on N (SPEC.md 1.2.1)
        put("a3-text-cut-utf8", b"abcde\xf0\x9f\x98" + b"\0" * 10, "NOT_SAFETENSORS")
        put("a3-text-cut-2of3", b"abcdef\xe2\x82" + b"\0" * 10, "NOT_SAFETENSORS")
        put("a3-text-nbsp", b"abcd\xc2\xa0ef" + b"\0" * 10, "NOT_SAFETENSORS")
        put("a3-text-c1-control", b"abcd\xc2\x85ef" + b"\0" * 10, "HEADER_TOO_LARGE")
        put("a3-text-del", b"abcdefg\x7f" + b"\0" * 10, "HEADER_TOO_LARGE")
        put("a3-text-ctrl", b"abc\x01defg" + b"\0" * 10, "HEADER_TOO_LARGE")
        put("a3-text-tab-crlf", b"a\tb\r\nc d" + b"\0" * 10, "NOT_SAFETENSORS")
        put("a3-text-overlong", b"abcd\xc0\x80ef" + b"\0" * 10, "HEADER_TOO_LARGE")
        put("a3-text-surrogate", b"ab\xed\xa0\x80efg" + b"\0" * 10, "HEADER_TOO_LARGE")
        put("a3-text-bad-cut", b"abcdef\xe0\x80" + b"\0" * 10, "HEADER_TOO_LARGE")  # E0 80: no valid prefix
        put("a3-text-4byte-cut-bad", b"abcde\xf4\x90\x80" + b"\0" * 10, "HEADER_TOO_LARGE")  # F4 90: past U+10FFFF
        put("a3-text-full-emoji", b"abcd\xf0\x9f\x98\x80" + b"\0" * 10, "NOT_SAFETENSORS")
        put("a3-short-gguf", b"GGUF\x03\x00\x00", "HEADER_TOO_SMALL")
        put("a3-binary-garbage", b"\xff\xff\xff\xff\xff\xff\xff\xff" + b"\0" * 10, "HEADER_TOO_LARGE")
        put("a3-zero-length", b"\0" * 8 + b"{}", "HEADER_LENGTH_INVALID")
        put("a3-text-n-below-2-48", b"ab\x00\x00\x00\x00\x00\x00" + b"\0" * 10, "HEADER_LENGTH_INVALID")

    # ---- A4
    def a4():
        src = str(TINYGEMM)
        b = Path(src).read_bytes()
        n = struct.unpack("<Q", b[:8])[0]
        h = json.loads(b[8:8 + n]); data = b[8 + n:]
        def mk(version, params):
            hh = json.loads(json.dumps(h))
            q = json.loads(hh["__metadata__"]["qformat"])
            q["version"] = version
            for d in q["tensors"].values():
                d["layout"]["parameters"] = params
            hh["__metadata__"]["qformat"] = json.dumps(q)
            return raw_file(hh, data)
        put("a4-newer-missing-and-unknown", mk("1.3", {"foo": 1}), "LAYOUT_INVALID")
        put("a4-newer-missing", mk("1.3", {}), "LAYOUT_INVALID")
        put("a4-newer-unknown", mk("1.3", {"inner_k_tiles": 2, "foo": 1}), "FEATURE_UNSUPPORTED")
        put("a4-newer-value-outside", mk("1.3", {"inner_k_tiles": 3}), "FEATURE_UNSUPPORTED")
        put("a4-same-missing-and-unknown", mk("1.2", {"foo": 1}), "LAYOUT_INVALID")

    # ---- A5
    def a5():
        outer = lambda scale: {"shape": [4, 4], "dtype": "float32",
                               "codes": {"tensor": "w.codes", "element": INT8, "packing": {"container": 8, "bit_order": "lsb_first", "axis": 1}},
                               "scale": scale}
        codes = U8(np.arange(16)).reshape(4, 4)
        gi = {"axis": 0, "tensor": "w.g", "count": 2}
        nested = {"shape": [2, 1], "dtype": "float32",
                  "codes": {"tensor": "s.codes", "element": {"type": "codebook", "bits": 2, "table_tensor": "s.table"},
                            "packing": {"container": 8, "bit_order": "lsb_first", "axis": 1}}}
        sc = {"blocks": {"type": "grid", "size": [None, 4], "index": gi}, "op": "multiply", "encoded": nested}
        comps = {"w.codes": codes, "w.g": np.zeros(4, np.int32), "s.codes": U8([[0], [3]]), "s.table": F32([1.5, 2.0])}
        put("a5-nested-unused-cell-code", q_file({"w": outer(sc)}, comps), "CODE_OUT_OF_RANGE")
        comps_ok = dict(comps, **{"s.codes": U8([[0], [1]])})
        put("a5-nested-all-ok", q_file({"w": outer(sc)}, comps_ok), "valid")
        # the nested descriptor's own group index: a value for an unused nested cell out of range
        nested2 = {"shape": [2, 1], "dtype": "float32",
                   "codes": {"tensor": "s.codes", "element": INT8, "packing": {"container": 8, "bit_order": "lsb_first", "axis": 1}},
                   "scale": {"blocks": {"type": "grid", "size": [None, 1], "index": {"axis": 0, "tensor": "s.g", "count": 1}},
                             "op": "multiply", "tensor": "s.scale"}}
        sc2 = {"blocks": {"type": "grid", "size": [None, 4], "index": gi}, "op": "multiply", "encoded": nested2}
        comps2 = {"w.codes": codes, "w.g": np.zeros(4, np.int32), "s.codes": U8([[1], [2]]), "s.g": np.array([0, 7], np.int32), "s.scale": F32([[0.5]])}
        put("a5-nested-unused-cell-group-index", q_file({"w": outer(sc2)}, comps2), "GROUP_INDEX_RANGE")
        # the outer tensor's own codes: unchanged (a code past the table that no... every element is used)

    # ---- A8
    def a8():
        T64 = 1 << 64
        def one(b, e, shape=(4,), dtype="U8", data=b"\0\0\0\0"):
            return raw_file('{"a":{"dtype":"%s","shape":%s,"data_offsets":[%s,%s]}}' % (dtype, json.dumps(list(shape)), b, e), data)
        put("a8-2p64-tiling", one(T64 + 5, T64 + 9), "OFFSETS_INVALID")
        put("a8-2p64-reversed", one(T64 + 9, T64 + 5), "OFFSETS_INVALID")
        put("a8-2p64-size", one(T64 + 5, T64 + 6), "TENSOR_SIZE_MISMATCH")
        big = 10 ** 150
        put("a8-1e150-tiling", one(big + 5, big + 9), "OFFSETS_INVALID")
        put("a8-1e150-reversed", one(big + 9, big + 5), "OFFSETS_INVALID")
        put("a8-1e150-size", one(big + 5, big + 6), "TENSOR_SIZE_MISMATCH")
        huge = 10 ** 5000
        put("a8-1e5000-tiling", one(huge + 5, huge + 9), "OFFSETS_INVALID")
        put("a8-1e5000-carry-size", one(huge - 2, huge + 2), "OFFSETS_INVALID")
        put("a8-1e5000-carry-mismatch", one(huge - 2, huge + 3), "TENSOR_SIZE_MISMATCH")
        put("a8-1e5000-reversed", one(huge + 9, huge + 5), "OFFSETS_INVALID")
        put("a8-1e5000-size", one(huge + 5, huge + 6), "TENSOR_SIZE_MISMATCH")
        put("a8-1e5000-carry", one(huge - 2, huge + 2), "OFFSETS_INVALID")
        put("a8-small-huge", one(0, huge), "TENSOR_SIZE_MISMATCH")
        put("a8-huge-small", one(huge, 4), "OFFSETS_INVALID")
        put("a8-neg-huge", one(-huge, 4), "TENSOR_ENTRY_INVALID")
        put("a8-shape-huge", one(0, 4, shape=(huge,)), "SIZE_OVERFLOW")
        put("a8-shape-huge-empty", one(0, 4, shape=(huge, 0)), "SIZE_OVERFLOW")
        put("a8-minus-zero", raw_file('{"a":{"dtype":"U8","shape":[4],"data_offsets":[-0,4]}}', b"\0" * 4), "valid")
        # two entries tiling through 2^64: [0, 2^63], [2^63, 2^64], [2^64, 2^64+4] -> DATA_TRUNCATED
        m = (1 << 61) - 1
        h = {f"t{i}": {"dtype": "U8", "shape": [m], "data_offsets": [i * m, (i + 1) * m]} for i in range(8)}
        h["z"] = {"dtype": "U8", "shape": [12], "data_offsets": [8 * m, 8 * m + 12]}
        put("a8-tiles-past-2p64", raw_file(h, b"\0" * 4), "DATA_TRUNCATED")

    # ---- A13: shards
    def a13():
        d = os.path.join(OUT, "a13-shards"); os.makedirs(d)
        base = {"shape": [2, 4], "dtype": "float32",
                "codes": {"tensor": "L.codes", "element": INT8, "packing": {"container": 8, "bit_order": "lsb_first", "axis": 1}}}
        good = q_file({"L": base}, {"L.codes": U8(np.arange(8)).reshape(2, 4)})
        bad = dict(base, dtype="float64", codes=dict(base["codes"], tensor="M.codes"))
        badf = q_file({"L": bad}, {"M.codes": U8(np.arange(8)).reshape(2, 4)})
        Path(d, "a.safetensors").write_bytes(good)
        Path(d, "b.safetensors").write_bytes(badf)
        Path(d, "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"L.codes": "a.safetensors", "M.codes": "b.safetensors"}}))
        expect["a13-shards/model.safetensors.index.json"] = "INDEX_MISMATCH"
        # a logical name in shard a that is a component name in shard b (its qformat fine)
        d = os.path.join(OUT, "a13-component"); os.makedirs(d)
        Path(d, "a.safetensors").write_bytes(good)
        other = dict(base, codes=dict(base["codes"], tensor="L"))
        Path(d, "b.safetensors").write_bytes(q_file({"N": other}, {"L": U8(np.arange(8)).reshape(2, 4)}))
        Path(d, "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"L.codes": "a.safetensors", "L": "b.safetensors"}}))
        expect["a13-component/model.safetensors.index.json"] = "valid"  # components are not exposed (Python: names a reader returns)
        # empty logical name refused at step 5 in shard b, and shard a has a plain tensor ""
        d = os.path.join(OUT, "a13-empty-name"); os.makedirs(d)
        Path(d, "a.safetensors").write_bytes(build_file({"": U8([1])}))
        Path(d, "b.safetensors").write_bytes(q_file({"": base}, {"L.codes": U8(np.arange(8)).reshape(2, 4)}))
        Path(d, "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"": "a.safetensors", "L.codes": "b.safetensors"}}))
        expect["a13-empty-name/model.safetensors.index.json"] = "INDEX_MISMATCH"
        # steps 1-4 fail in shard b (QFORMAT_JSON_INVALID); its plain X is a logical name of shard a
        d = os.path.join(OUT, "a13-filescope"); os.makedirs(d)
        Path(d, "a.safetensors").write_bytes(q_file({"X": base}, {"L.codes": U8(np.arange(8)).reshape(2, 4)}))
        Path(d, "b.safetensors").write_bytes(build_file({"X": U8([1])}, {"qformat": "{not json"}))
        Path(d, "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"L.codes": "a.safetensors", "X": "b.safetensors"}}))
        expect["a13-filescope/model.safetensors.index.json"] = "QFORMAT_JSON_INVALID"  # Python today; decision silent
        # A16: a shard that is a directory
        d = os.path.join(OUT, "a16-dir-shard"); os.makedirs(d)
        Path(d, "a.safetensors").write_bytes(good)
        os.makedirs(os.path.join(d, "b.safetensors"))
        Path(d, "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"L.codes": "a.safetensors", "x": "b.safetensors"}}))
        expect["a16-dir-shard/model.safetensors.index.json"] = "INDEX_INVALID"

    # ---- A10: SHAPE_UNREPRESENTABLE for logical shapes (§5.2) too, never for components
    def a10():
        E = [1 << 30, 1 << 31, 0]
        d = {"shape": E, "dtype": "float32",
             "codes": {"tensor": "w.codes", "element": INT8, "packing": {"container": 8, "bit_order": "lsb_first", "axis": 2}}}
        comps = {"w.codes": ("U8", E, b"")}
        put("a10-logical-empty-unrepresentable", q_file({"w": d}, comps), "SHAPE_UNREPRESENTABLE")
        put("a10-logical-empty-float16", q_file({"w": dict(d, dtype="float16")}, comps), "valid")

    # ---- §1.4 (1.2.1): decode-time checks in name order; in one tensor codes before parameters
    def order():
        cb = {"type": "codebook", "bits": 2, "table_tensor": "TABLE"}
        def t(prefix, rows, bad_code_row, bad_index_row):
            el = dict(cb, table_tensor=prefix + "table")
            codes = np.zeros((rows, 128), np.uint8)
            if bad_code_row is not None:
                codes[bad_code_row, -1] = 0b11000000  # code 3 of a 3-entry table
            gidx = np.zeros(rows, np.int32)
            if bad_index_row is not None:
                gidx[bad_index_row] = 5  # count 2
            d = {"shape": [rows, 512], "dtype": "float32",
                 "codes": {"tensor": prefix + "codes", "element": el, "packing": {"container": 8, "bit_order": "lsb_first", "axis": 1}},
                 "scale": {"blocks": {"type": "grid", "size": [None, 512], "index": {"axis": 0, "tensor": prefix + "g", "count": 2}},
                           "op": "multiply", "tensor": prefix + "scale"}}
            return d, {prefix + "codes": codes, prefix + "table": F32([1, 2, 3]), prefix + "g": gidx, prefix + "scale": F32([[1.0], [2.0]])}
        dz, cz = t("0z.", 4, 0, None)   # z: its data first, CODE_OUT_OF_RANGE
        da, ca = t("a.", 4, None, 1)    # a: GROUP_INDEX_RANGE; first by name
        put("order-decode-time-by-name", q_file({"z": dz, "a": da}, {**cz, **ca}), "GROUP_INDEX_RANGE")
        dw, cw = t("w.", 1024, 1023, 0)  # 2^19 values: decoded in chunks; a bad group index in the first, a bad code in the last
        put("order-codes-before-parameters", q_file({"w": dw}, cw), "CODE_OUT_OF_RANGE")

    a1()
    a2()
    a10()
    order()
    a3()
    a4()
    a5()
    a8()
    a13()
    return expect


@pytest.fixture(scope="module")
def probes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], dict[str, str]]:
    """(folder, expected codes, what the JavaScript reader gave) for every probe, one --batch run."""
    d = tmp_path_factory.mktemp("settled121")
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # the 5001-digit offsets of A8
    try:
        expect = _build(str(d))
    finally:
        sys.set_int_max_str_digits(limit)
    names = list(expect)
    lines = "".join(f"{d / n}\t{d / f'out-{i}.safetensors'}\n" for i, n in enumerate(names))
    p = subprocess.run([NODE, str(READ), "--batch"], input=lines, capture_output=True, text=True, timeout=600)  # type: ignore[list-item]
    assert p.returncode == 0, p.stderr[-2000:]
    got = {}
    for ln in p.stdout.splitlines():
        o = json.loads(ln)
        assert o["crash"] is None, o["crash"]
        got[os.path.relpath(o["input"], d)] = o["code"] or "valid"
    return d, expect, got



def test_every_probe_gives_the_decided_code(probes: tuple[Path, dict[str, str], dict[str, str]]) -> None:
    _, expect, got = probes
    assert len(expect) >= 70
    wrong = {k: (v, got.get(k)) for k, v in expect.items() if got.get(k) != v}
    assert not wrong, "\n".join(f"{k}: decided {v}, got {g}" for k, (v, g) in wrong.items())


@pytest.mark.parametrize("prefix", ["a1-", "a2-", "a3-", "a4-", "a5-", "a8-", "a10-", "a13-", "a16-", "order-"])
def test_each_decision_has_probes(probes: tuple[Path, dict[str, str], dict[str, str]], prefix: str) -> None:
    _, expect, got = probes
    mine = [k for k in expect if k.startswith(prefix)]
    assert mine
    assert {k: got[k] for k in mine} == {k: expect[k] for k in mine}


@pytest.mark.parametrize("probe, codes, status", [
    ("a3-text.safetensors", ["NOT_SAFETENSORS"], 1),        # a malformed code since 1.2.1: problems, 1
    ("a3-zip.safetensors", ["NOT_SAFETENSORS"], 1),
    ("a3-gguf.safetensors", ["NOT_SAFETENSORS"], 1),
    ("a3-pickle2.safetensors", ["NOT_SAFETENSORS"], 1),
    ("a3-binary-garbage.safetensors", ["HEADER_TOO_LARGE"], 1),
    ("a5-nested-unused-cell-code.safetensors", ["CODE_OUT_OF_RANGE"], 1),  # checkers report it too
    ("a8-1e5000-tiling.safetensors", ["OFFSETS_INVALID"], 1),
    ("a1-rank17-grid-size-17.safetensors", [], 0),
])
def test_check_codes_and_exit_status(probes: tuple[Path, dict[str, str], dict[str, str]], probe: str, codes: list[str], status: int) -> None:
    d = probes[0]
    p = subprocess.run([NODE, str(READ), "--check", str(d / probe)], capture_output=True, text=True, timeout=120)  # type: ignore[list-item]
    assert [ln.split("\t")[0] for ln in p.stdout.splitlines() if ln.strip()] == codes, p.stdout + p.stderr
    assert p.returncode == status, p.stdout + p.stderr


def test_check_exit_statuses_follow_the_one_table(probes: tuple[Path, dict[str, str], dict[str, str]], tmp_path: Path) -> None:
    """--check exits 0 with no problem, 1 with problems, 2 for a path it cannot read (a usage
    code), as every qformat command (qformat/cli.py EXIT_*); several files: the worst; --help 0."""
    d = probes[0]
    run = lambda *a: subprocess.run([NODE, str(READ), *map(str, a)], capture_output=True, text=True, timeout=120)  # type: ignore[list-item]  # noqa: E731
    ok, bad = d / "a1-rank17-grid-size-17.safetensors", d / "a3-text.safetensors"
    assert run("--check", ok).returncode == 0
    assert run("--check", bad).returncode == 1
    assert run("--check", tmp_path / "missing.safetensors").returncode == 2
    both = run("--check", ok, bad)
    assert both.returncode == 1 and both.stdout.startswith(f"{bad}\tNOT_SAFETENSORS\t")
    assert run("--check", bad, tmp_path / "missing.safetensors").returncode == 2
    h = run("--help")
    assert h.returncode == 0 and "Exit statuses" in h.stdout and "NOT_SAFETENSORS" in h.stdout
    assert run("--check").returncode == 2
    assert run("--bogus", ok).returncode == 2
    # the decode command: a refusal prints its code and exits 1
    r = run(bad, tmp_path / "o.safetensors")
    assert (r.stdout.strip(), r.returncode) == ("NOT_SAFETENSORS", 1)
