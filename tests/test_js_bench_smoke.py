"""The JavaScript decode bench (readers/js/bench/run.py) runs and checks its outputs bit for bit.

A smoke test on a small array (no timing is asserted: the bench reports ratios, it is not a
timed unit test).  Skipped where ``node`` is missing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(NODE is None, reason="node (Node.js 18 or later) is not installed: the JavaScript reader cannot run")


def test_js_bench_runs_and_outputs_are_bit_identical(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    cmd = [sys.executable, str(ROOT / "readers" / "js" / "bench" / "run.py"), "--rows", "64", "--cols", "256",
           "--rounds", "1", "--reps", "1", "--warmup", "1", "--cpu", "-1", "--no-thp", "--json", str(out)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["scheme"] for r in rows] == ["int4 g32", "nf4", "mxfp4", "fp8_e4m3", "gguf Q4_K"]
    assert all(r["bit_identical"] and r["js_mvals"] > 0 and r["numpy_mvals"] > 0 for r in rows)
    assert all(r["js_pure_mvals"] > 0 for r in rows)
    assert "| scheme | shape | NumPy, 1 thread | JavaScript | JS / NumPy | JS pure | JS pure / NumPy |" in p.stdout
