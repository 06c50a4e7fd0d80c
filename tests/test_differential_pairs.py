"""scripts/differential.py: the Python reference, the JavaScript reader and libqformat agree on
the same seeded mutants, every pair (py-js, py-c, js-c): the same outcome, the same code (every
code exactly, NOT_SAFETENSORS included: SPEC.md 1.2.1), the same tensors bit for bit (NaN by
class), for every generator of libqformat/test/differential.py and tests/test_js_differential.py.

libqformat is built the way tests/test_libqformat.py builds it (``libqformat/build-pytest``,
cached by a hash of the sources) where cmake and a C compiler are found, or taken from
``QFORMAT_C``; without either the C reader is left out (``test_c_reader_takes_part`` says why).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "differential.py"
NODE = shutil.which("node")

COUNT = 300
SEED = 20261207


@pytest.fixture(scope="session")
def qformat_c() -> tuple[str | None, str]:
    """(the qformat-c command or None, why not)."""
    if os.environ.get("QFORMAT_C"):
        return os.environ["QFORMAT_C"], ""
    from tests import test_libqformat as tl

    if tl._missing:
        return None, f"libqformat cannot be built here: {' and '.join(tl._missing)} not found on PATH (or set QFORMAT_C)"
    bdir = tl._build("build-pytest", ["-DCMAKE_BUILD_TYPE=Release"])  # the release_build fixture's build
    return str(tl._exe(bdir, "qformat-c")), ""


def _run(args: list[str], timeout: float = 600) -> tuple[dict, subprocess.CompletedProcess]:
    p = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"differential.py printed no summary (exit {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    summary = json.loads(lines[-1])
    failed = summary["disagreeing_mutants"] > 0 or summary["batch_errors"] > 0
    assert p.returncode == (1 if failed else 0), (p.returncode, summary, p.stderr[-2000:])
    return summary, p


def test_readers_agree_pairwise(qformat_c, tmp_path: Path) -> None:
    """COUNT mutants through every available reader: zero disagreements in every pair."""
    c, _why = qformat_c
    readers = [r for r, ok in (("py", True), ("js", NODE is not None), ("c", c is not None)) if ok]
    if len(readers) < 2:
        pytest.skip("neither node nor libqformat is available: nothing to compare the reference with")
    out = tmp_path / "diff"
    args = ["--count", str(COUNT), "--seed", str(SEED), "--jobs", "2", "--readers", ",".join(readers), "--out", str(out)]
    if c:
        args += ["--qformat-c", c]
    s, p = _run(args)
    examples = [json.loads(f.read_text()) for f in sorted(out.glob("*.json"))[:12]]
    assert s["disagreeing_mutants"] == 0 and s["batch_errors"] == 0, (
        f"{s['disagreeing_mutants']} of {COUNT} mutants disagree (seed {SEED}):\n{p.stdout.split(chr(10) + '{')[0]}\n"
        + "\n".join(json.dumps(e) for e in examples) + f"\n{p.stderr[-2000:]}")
    # every generator took part, and the mutants reach decoding as well as many codes
    from scripts.differential import generator_weights

    assert set(s["by_generator"]) == set(generator_weights()), s["by_generator"].keys()
    assert s["outcomes"]["py"]["valid"] >= COUNT // 20, s["outcomes"]
    for key in s["pairs"]:
        assert s["pairs"][key]["mutants"] == COUNT and s["pairs"][key]["agreed"] == COUNT, s["pairs"]


def test_c_reader_takes_part(qformat_c) -> None:
    """Says (as a skip) when libqformat was left out of test_readers_agree_pairwise."""
    c, why = qformat_c
    if c is None:
        pytest.skip(why)


def test_harness_reports_disagreements(tmp_path: Path) -> None:
    """The harness's own check: a reader wrong on purpose (another code for one error, a flipped
    byte in decoded tensors; tests/test_libqformat.py's fake) is reported per generator and pair,
    by kind, with every disagreeing mutant and its outcomes written to --out."""
    from tests.test_libqformat import FAKE_READER

    fake = tmp_path / "fake_reader.py"
    fake.write_text(FAKE_READER.format(repo=str(REPO)))
    out = tmp_path / "out"
    s, p = _run(["--count", "150", "--seed", "3", "--jobs", "2", "--readers", "py,c", "--batch-size", "40",
                 "--qformat-c", f"{sys.executable} {fake}", "--out", str(out),
                 "--generators", "cdiff.header-length,cdiff.payload,jsdiff.payload,jsdiff.json"])
    pc = s["pairs"]["py-c"]
    assert pc["disagreed"].get("code", 0) > 0 and pc["disagreed"].get("bits", 0) > 0, s
    assert pc["mutants"] == 150 and pc["agreed"] + sum(pc["disagreed"].values()) == 150
    assert s["by_generator"]["cdiff.header-length"]["pairs"]["py-c"]["disagreed"].get("code", 0) > 0, s
    assert set(s["by_generator"]) == {"cdiff.header-length", "cdiff.payload", "jsdiff.payload", "jsdiff.json"}
    recs = [json.loads(f.read_text()) for f in sorted(out.glob("*.json"))]
    assert len(recs) == len(list(out.glob("*.safetensors"))) == s["disagreeing_mutants"] > 0
    r = recs[0]
    assert set(r["outcomes"]) == {"py", "c"} and r["pairs"]["py-c"]["kind"] in ("code", "bits")
    assert "py-c" in p.stdout and "TOTAL" in p.stdout  # the table


def test_usage_errors() -> None:
    for bad in (["--readers", "py"], ["--readers", "py,rust"], ["--generators", "nope"]):
        p = subprocess.run([sys.executable, str(SCRIPT), "--count", "1", *bad], capture_output=True, text=True, cwd=REPO)
        assert p.returncode == 2, (bad, p.stdout, p.stderr)
