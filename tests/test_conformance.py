"""The conformance corpus and its runner.

* the committed corpus is exactly what the generator produces (gold files frozen, byte-identical);
* the NumPy reference reader passes a sample of each outcome as a command (every case in
  process, with every other backend: tests/test_backends.py test_reader_passes_the_corpus);
* `qformat check` reports exactly the codes each case declares for checkers;
* every file-level error code has a case;
* deliberately broken readers fail the cases they should, so the runner can catch them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import qformat
from qformat import conformance as conf
from qformat import kernels
from qformat import tables

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "conformance" / "v1"
MANIFEST = conf.load_manifest(str(CORPUS))
CASES = MANIFEST["cases"]
BY_ID = {c["id"]: c for c in CASES}


def run_in_process(fn, cases=CASES) -> dict[str, dict]:
    lines: list[str] = []
    conf.run(str(CORPUS), list(cases), lambda c: conf.run_python(fn, str(CORPUS), c), lines.append, "test")
    return {r["id"]: r for r in map(json.loads, lines[:-1])}


def test_generator_output_equals_committed_corpus():
    from conformance import generate

    assert generate.main(["--check", "--root", str(CORPUS)]) == 0


def test_corpus_size_under_20_mb():
    total = sum(p.stat().st_size for p in CORPUS.rglob("*") if p.is_file())
    assert total < 20 * 2**20, f"corpus is {total / 2**20:.1f} MiB"


#: codes no file can carry for every reader alike: PLAIN_DTYPE_UNSUPPORTED is what a framework
#: reader raises for a plain tensor its framework cannot hold (torch and an F4 tensor with an odd
#: last axis, corpus feature ``plain:f4-odd``); since spec 1.2 the file itself is valid
CAPABILITY_CODES = {"PLAIN_DTYPE_UNSUPPORTED"}


def test_manifest_covers_every_file_error_code():
    """SPEC.md §16: every code that is not a usage (or reader-capability) code has a case, as a
    reader's error, a checker's code or a strict checker's code (conformance/README.md lists them)."""
    file_codes = {c for c, v in tables.errors().items() if v["category"] != "usage"} - CAPABILITY_CODES
    seen = ({c["error"] for c in CASES if c["error"]} | {code for c in CASES for code in c["check"]}
            | {code for c in CASES for code in c["strict"]})
    assert file_codes <= seen, f"no corpus case for {sorted(file_codes - seen)}"


def test_strict_codes_have_cases_of_their_own():
    """Each strict-only code (SPEC.md §2.3 checks 5 and 9, §2.4) appears in some case's `strict`
    list while that case's `check` list lacks it, so a strict checker can show it conforms."""
    from qformat.container import STRICT_ALSO, STRICT_CODES

    for code in (*STRICT_CODES, *STRICT_ALSO):
        assert any(code in c["strict"] and code not in c["check"] for c in CASES), code


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_strict_checker_reports_the_declared_codes(case):
    rep = qformat.check(str(CORPUS / case["input"]), digests=True, strict=True)
    assert sorted({p.code for p in rep.problems}) == case["strict"], [p.to_dict() for p in rep.problems]


def _protocol_sample() -> list[str]:
    """Eight cases of each outcome (valid, malformed, invalid, unsupported), sharded ones
    included: every case is decoded in process by tests/test_backends.py, so the command protocol (a process per
    case, exit codes, output files) needs a sample of each outcome, not all cases (a process
    start per case would cost minutes)."""
    ids: list[str] = []
    for outcome in ("valid", "malformed", "invalid", "unsupported"):
        ids += sorted(c["id"] for c in CASES if c["expect"] == outcome)[::7][:8]
    ids += [c["id"] for c in CASES if c["input"].endswith(".index.json")][:2]
    return sorted(set(ids))


def test_reference_reader_as_a_command_passes():
    """The command protocol end to end: `qformat conformance run --reader "qformat conformance read"`."""
    sample = _protocol_sample()
    ids = [a for i in sample for a in ("--id", i)]
    out = subprocess.run(
        [sys.executable, "-m", "qformat", "conformance", "run", "--corpus", str(CORPUS), "--jobs", "2", *ids,
         "--reader", f"{sys.executable} -m qformat conformance read"],
        capture_output=True, text=True, timeout=900)
    lines = [json.loads(ln) for ln in out.stdout.splitlines()]
    summary = lines[-1]["summary"]
    assert out.returncode == 0, [ln for ln in lines[:-1] if ln["result"] != "pass"][:5]
    assert {ln["id"] for ln in lines[:-1]} == set(sample)
    assert summary["passed"] == len(sample) and summary["failed"] == 0


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_checker_reports_the_declared_codes(case):
    rep = qformat.check(str(CORPUS / case["input"]), digests=True)  # the corpus's checker verifies digests (SPEC.md §12.5)
    assert sorted({p.code for p in rep.problems}) == sorted(set(case["check"])), [p.to_dict() for p in rep.problems]


def test_filters_select_by_id_and_feature():
    assert [c["id"] for c in conf.select(CASES, ["int4-*"], [], [])] == [c["id"] for c in CASES if c["id"].startswith("int4-")]
    planes = conf.select(CASES, [], ["packing:planes"], [])
    assert planes and all("packing:planes" in c["features"] for c in planes)
    no16 = conf.select(planes, [], [], ["dtype:float16"])
    assert all("dtype:float16" not in c["features"] for c in no16) and len(no16) < len(planes)


def test_cli_exit_status_and_json_lines(tmp_path):
    bad = tmp_path / "bad_reader.py"
    bad.write_text("import sys\nprint('NOT_A_CODE')\nsys.exit(1)\n")
    out = subprocess.run([sys.executable, "-m", "qformat", "conformance", "run", "--corpus", str(CORPUS), "--id", "int4-*",
                          "--reader", f"{sys.executable} {bad}"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    lines = [json.loads(ln) for ln in out.stdout.splitlines()]
    assert all(ln["result"] == "fail" for ln in lines[:-1]) and lines[-1]["summary"]["failed"] == len(lines) - 1
    out = subprocess.run([sys.executable, "-m", "qformat", "conformance", "run", "--corpus", str(CORPUS), "--id", "no-such-*",
                          "--python", "qformat.conformance:reference_reader"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr


# -- broken readers ---------------------------------------------------------------------------------
def _failed(results: dict[str, dict]) -> set[str]:
    return {i for i, r in results.items() if r["result"] != "pass"}


def _valid_with(tag: str) -> set[str]:
    return {c["id"] for c in CASES if c["expect"] == "valid" and tag in c["features"]}


def test_broken_reader_wrong_nibble_order(monkeypatch):
    """A reader that puts element 0 in the high nibble of LSB-first bytes (bitsandbytes' order)."""
    from qformat import packing, regions

    orig = packing.slot_shifts

    def swapped(p, bits):
        s = orig(p, bits)
        return s[::-1].copy() if len(s) > 1 else s

    monkeypatch.setattr(packing, "slot_shifts", swapped)
    # the native unpacker reads LSB-first bytes without slot_shifts: the NumPy one is the one broken
    monkeypatch.setattr(packing, "_native_unpack", lambda *a: None)
    regions.clear_caches()  # byte tables built by the correct unpacker must not be reused
    try:
        failed = _failed(run_in_process(conf.reference_reader))
    finally:
        monkeypatch.undo()
        regions.clear_caches()
    must = {"int4-twos-complement", "codebook-nf4-flat64", "planes-gguf-split-halves", "slot-order-awq"}
    assert must <= failed, sorted(must - failed)
    assert "float-e4m3fn-as-f8-dtype" not in failed  # one code per byte: nothing to swap


def test_broken_reader_divides_instead_of_multiplying(monkeypatch):
    from qformat import decode

    real = np.multiply

    class _NP:
        def __getattr__(self, name):
            return np.divide if name == "multiply" else getattr(np, name)

    monkeypatch.setattr(decode, "np", _NP())
    with kernels.use("numpy"):  # the broken step is in the NumPy reference path
        failed = _failed(run_in_process(conf.reference_reader))
    assert real is np.multiply
    scaled = {c["id"] for c in CASES if c["expect"] == "valid" and "op:multiply" in c["features"] and "shape:zero-size" not in c["features"]}
    assert scaled and len(scaled & failed) >= 0.9 * len(scaled), sorted(scaled - failed)
    assert "encoded-nvfp4" in failed and "scheme-nvfp4-0" in failed


def test_broken_reader_skips_trailing_bytes_check(tmp_path):
    """A reader without the trailing-bytes check: it reads up to the last tensor and stops."""
    import struct

    def lenient(path):
        try:
            return conf.reference_reader(path)
        except qformat.QFormatError as e:
            if e.code != "TRAILING_BYTES":
                raise
        data = Path(path).read_bytes()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + n])
        last = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
        cut = tmp_path / "cut.safetensors"
        cut.write_bytes(data[: 8 + n + last])
        return conf.reference_reader(str(cut))

    failed = _failed(run_in_process(lenient))
    trailing = {c["id"] for c in CASES if c["error"] == "TRAILING_BYTES"}
    assert trailing and failed == trailing


def test_broken_reader_truncates_to_bfloat16(monkeypatch):
    """A reader that converts binary32 to bfloat16 by dropping the low 16 bits (no rounding)."""
    import ml_dtypes

    from qformat import decode

    orig = decode.round_to_logical

    def trunc(x, dtype, out=None):
        if dtype == "bfloat16":
            t = (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16).view(ml_dtypes.bfloat16)
            if out is None:
                return t
            out[...] = t
            return out
        return orig(x, dtype, out)

    monkeypatch.setattr(decode, "round_to_logical", trunc)
    with kernels.use("numpy"):  # the broken step is in the NumPy reference path
        failed = _failed(run_in_process(conf.reference_reader))
    assert "rounding-ties-subnormals" in failed
    assert len(failed & _valid_with("dtype:bfloat16")) >= 0.5 * len(_valid_with("dtype:bfloat16"))
    assert not (failed - _valid_with("dtype:bfloat16"))
