"""Differential testing of the JavaScript reader (readers/js) against the reference reader.

Corpus files and the hostile-input seeds of tests/test_errors.py are mutated the way its fuzz
strategies do (bytes flipped, set, inserted, deleted, truncated, extended; the qformat object's
leaves and subtrees replaced, deleted or given extra members; payload bytes overwritten), from a
fixed random seed.  Every mutant goes through ``qformat.load_file`` (the reference) and through
one ``node readers/js/bin/qformat-read.mjs --batch`` process; both must agree on every mutant:
the same error code, or the same tensors bit for bit (NaN by class).
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

import qformat
from qformat.conformance import compare, load_manifest
from qformat.errors import QFormatError

from .strategies import json_paths

ROOT = Path(__file__).resolve().parent.parent
JS = ROOT / "readers" / "js"
CORPUS = ROOT / "conformance" / "v1"
NODE = shutil.which("node")

#: Mutants per kind (about 30 s in all on one core).
COUNTS = {"bytes": 1500, "json": 4000, "entries": 1500, "payload": 1500}
SEED = 20240611

pytestmark = pytest.mark.skipif(NODE is None, reason="node (Node.js 18 or later) is not installed: the JavaScript reader cannot run")


def _seeds() -> dict[str, bytes]:
    """Valid single-file corpus inputs, plus the fuzz seeds of tests/test_errors.py."""
    man = load_manifest(str(CORPUS), verify=False)
    out = {}
    for c in man["cases"]:
        if c["expect"] == "valid" and c["input"].endswith(".safetensors"):
            out[c["id"]] = (CORPUS / c["input"]).read_bytes()
    try:
        from tests.test_errors import SEEDS
    except Exception:  # noqa: BLE001 - the other test module is optional here
        SEEDS = {}
    for k, v in SEEDS.items():
        out[f"fuzz-{k}"] = v
    return out


def _split(data: bytes) -> tuple[dict, bytes]:
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _join(header: dict, body: bytes) -> bytes:
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    return struct.pack("<Q", len(hb)) + hb + body


INTERESTING = [None, True, False, -1, 0, 1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 128, 255, 256, 2**24, 2**31,
               2**32, 2**53 - 1, 2**53, 2**63, 2**64, 10**30, 0.5, 4.0, 1e308, "", "w.codes", "w.scale", "b", "nf4",
               "float32", "float16", "bfloat16", "canonical", "marlin_dense", "tinygemm_int4_cuda", "divide",
               "multiply", "add", "subtract", "flat", "grid", "int", "float", "codebook", "e4m3fn", "e8m0fnu",
               "lsb_first", "msb_first", "offset_binary", "twos_complement", "1.2", "1.3", "org.x.y", "qformat.x",
               [], [0], [1, 0], [0, 1], [None, None], [1, None], [None], [1, 32], {}, {"span": 32}, {"span": 0}]
KEYS = ["type", "size", "tensor", "span", "x", "order", "index", "planes", "slot_order", "row_alignment",
        "table_tensor", "encoded", "zero", "bias", "layout", "name", "parameters", "code_offset", "frac_bits",
        "digests", "algorithm", "tensors"]


def _value(rng: random.Random, depth: int = 0, names: list[str] | None = None) -> Any:
    r = rng.random()
    if names and r < 0.1:
        return rng.choice(names)  # another stored or logical tensor's name: claims, conflicts
    if depth < 2 and r < 0.12:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if depth < 2 and r < 0.2:
        return {rng.choice(KEYS): _value(rng, depth + 1) for _ in range(rng.randint(0, 2))}
    if r < 0.3:
        return rng.randint(-(2**70), 2**70) if rng.random() < 0.3 else rng.randint(-2, 300)
    return copy.deepcopy(rng.choice(INTERESTING))


def mutate_bytes(rng: random.Random, seed: bytes) -> bytes:
    """tests/test_errors.py ``mutated``: 1-4 byte-level edits anywhere in the file."""
    data = bytearray(seed)
    for _ in range(rng.randint(1, 4)):
        op = rng.choice(["flip", "flip", "set", "insert", "delete", "truncate", "extend"])
        i = rng.randint(0, max(0, len(data) - 1))
        if op == "flip" and data:
            data[i] ^= 1 << rng.randint(0, 7)
        elif op == "set" and data:
            data[i] = rng.choice([0x00, 0x20, 0x22, 0x2C, 0x30, 0x39, 0x5B, 0x5C, 0x7B, 0x7D, 0x80, 0xFF])
        elif op == "insert":
            data[i:i] = rng.randbytes(rng.randint(1, 8))
        elif op == "delete":
            del data[i : i + rng.randint(1, 8)]
        elif op == "truncate":
            del data[i:]
        else:
            data += rng.randbytes(rng.randint(1, 16))
    return bytes(data)


def mutate_json(rng: random.Random, seed: bytes) -> bytes:
    """tests/test_errors.py ``mutated_descriptor``, on any seed: 1-3 edits of the qformat object
    (or, for a plain file, of the header), sometimes with the version changed."""
    header, body = _split(seed)
    meta = header.get("__metadata__") or {}  # null: no metadata (SPEC.md §2.3 check 8)
    if "qformat" not in meta or rng.random() < 0.15:
        # edit the header itself (tensor entries, metadata)
        target = header
    else:
        target = json.loads(meta["qformat"])
    names = [k for k in header if k != "__metadata__"]
    if target is not header:
        names += list(target.get("tensors", {})) if isinstance(target.get("tensors"), dict) else []
    for _ in range(rng.randint(1, 3)):
        paths = [p for p in json_paths(target) if p]
        if not paths:
            break
        path = rng.choice(paths)
        parent = target
        for k in path[:-1]:
            parent = parent[k]
        op = rng.choice(["replace", "replace", "replace", "delete", "add"])
        if op == "replace":
            parent[path[-1]] = _value(rng, names=names)
        elif op == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif op == "delete" and isinstance(parent, list):
            del parent[path[-1]]
        elif op == "add" and isinstance(parent, dict):
            parent[rng.choice(KEYS)] = _value(rng, names=names)
    if target is not header:
        text = json.dumps(target)
        if rng.random() < 0.4:
            text = text.replace('"1.0"', rng.choice(['"1.3"', '"1.2"', '"1.1"', '"1.0"', '"2.0"'])).replace('"1.1"', rng.choice(['"1.3"', '"1.2"', '"1.1"', '"1.0"']))
        header.setdefault("__metadata__", {})["qformat"] = text
    return _join(header, body)


SAME_WIDTH = [["U8", "I8", "BOOL", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"],
              ["U16", "I16", "F16", "BF16"], ["U32", "I32", "F32"], ["U64", "I64", "F64", "C64"]]


def mutate_entries(rng: random.Random, seed: bytes) -> bytes:
    """Edits that keep the container sound: a tensor entry gets another dtype of the same width,
    another shape of the same element count, or another name (a logical tensor's, a component's,
    a new one), so that the semantic checks of the descriptors see it."""
    header, body = _split(seed)
    names = [k for k in header if k != "__metadata__"]
    if not names:
        return seed
    logical = []
    if "qformat" in (header.get("__metadata__") or {}):
        logical = list(json.loads(header["__metadata__"]["qformat"]).get("tensors", {}))
    for _ in range(rng.randint(1, 2)):
        name = rng.choice(names)
        ent = header[name]
        op = rng.choice(["dtype", "shape", "shape", "rename"])
        if op == "dtype":
            for group in SAME_WIDTH:
                if ent["dtype"] in group:
                    ent["dtype"] = rng.choice(group)
        elif op == "shape":
            n = 1
            for s in ent["shape"]:
                n *= s
            shape = [n]
            if n > 1 and rng.random() < 0.6:
                d = rng.choice([k for k in range(1, n + 1) if n % k == 0])
                shape = [d, n // d]
            if rng.random() < 0.3:
                shape.insert(rng.randint(0, len(shape)), 1)
            if rng.random() < 0.15:
                shape = [] if n == 1 else shape
            ent["shape"] = shape
        else:
            new = rng.choice(logical + names + [name + ".x"])
            if new not in header:
                header[new] = header.pop(name)
                names = [k for k in header if k != "__metadata__"]
    return _join(header, body)


def mutate_payload(rng: random.Random, seed: bytes) -> bytes:
    """tests/test_errors.py ``mutated_payload``: random bytes in the data buffer only."""
    start = 8 + struct.unpack("<Q", seed[:8])[0]
    data = bytearray(seed)
    if start >= len(data):
        return bytes(data)
    for _ in range(rng.randint(1, 12)):
        data[rng.randint(start, len(data) - 1)] = rng.randint(0, 255)
    return bytes(data)


def _reference(path: Path) -> tuple[str | None, dict | None]:
    try:
        return None, qformat.load_file(path)
    except QFormatError as e:
        return e.code, None


def test_js_reader_agrees_with_reference(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    seeds = _seeds()
    names = sorted(seeds)
    kinds = {"bytes": mutate_bytes, "json": mutate_json, "entries": mutate_entries, "payload": mutate_payload}
    jobs = []
    for kind, n in COUNTS.items():
        for i in range(n):
            seed_name = rng.choice(names)
            data = kinds[kind](rng, seeds[seed_name])
            inp = tmp_path / f"{kind}-{i}.safetensors"
            inp.write_bytes(data)
            jobs.append((f"{kind}-{i} (from {seed_name})", inp, tmp_path / f"{kind}-{i}.out.safetensors"))
    listing = "".join(f"{inp}\t{out}\n" for _, inp, out in jobs)
    reader = os.environ.get("QFORMAT_JS_READER", str(JS / "bin" / "qformat-read.mjs"))
    p = subprocess.run([NODE, reader, "--batch"], input=listing, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    results = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    assert len(results) == len(jobs)
    disagreements = []
    codes: dict[str, int] = {}
    for (label, inp, out), res in zip(jobs, results):
        assert res["input"] == str(inp)
        ref_code, ref = _reference(inp)
        codes[ref_code or "valid"] = codes.get(ref_code or "valid", 0) + 1
        if res["crash"]:
            disagreements.append(f"{label}: the JS reader crashed: {res['crash'][:500]}")
        elif ref_code is not None or res["code"] is not None:
            if ref_code != res["code"]:
                disagreements.append(f"{label}: reference {ref_code or 'decodes'}, JS {res['code'] or 'decodes'}")
        else:
            diff = compare(ref, qformat.load_file(out))
            if diff:
                disagreements.append(f"{label}: {diff}")
    assert not disagreements, f"{len(disagreements)} of {len(jobs)} mutants disagree:\n" + "\n".join(disagreements[:40])
    # the mutants must reach many checks, not only the first container ones
    print(f"{len(jobs)} mutants; reference outcomes: {dict(sorted(codes.items()))}")
    assert len(codes) >= 15, codes
