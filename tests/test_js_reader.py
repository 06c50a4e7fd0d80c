"""The JavaScript reader (readers/js) passes the whole conformance corpus, and its own unit tests.

Runs exactly the documented command,
``qformat conformance run --reader "node readers/js/bin/qformat-read.mjs" --jobs 2``, and asserts
that every case passes; then ``node --test readers/js/test/``.  The package has no npm
dependencies, so nothing is installed first.  Skipped (with the reason) where ``node`` is missing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
JS = ROOT / "readers" / "js"
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(NODE is None, reason="node (Node.js 18 or later) is not installed: the JavaScript reader cannot run")


def _node_major() -> int:
    out = subprocess.run([NODE, "--version"], capture_output=True, text=True, check=True).stdout  # type: ignore[list-item]
    return int(out.strip().lstrip("v").split(".")[0])


def test_js_reader_passes_the_whole_corpus() -> None:
    assert _node_major() >= 18, "the JavaScript reader needs Node.js 18 or later"
    cmd = [sys.executable, "-m", "qformat", "conformance", "run", "--reader", "node readers/js/bin/qformat-read.mjs",
           "--jobs", "2"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    lines = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    summary = lines[-1]["summary"]
    failed = [ln for ln in lines[:-1] if ln["result"] != "pass"]
    manifest = json.loads((ROOT / "conformance" / "v1" / "manifest.json").read_text(encoding="utf-8"))
    assert summary["cases"] == len(manifest["cases"])
    assert not failed, "\n".join(f"{f['id']}: got {f['got']}: {f['detail']}" for f in failed[:30])
    assert p.returncode == 0, p.stderr[-2000:]
    assert summary["passed"] == summary["cases"]


def test_js_unit_tests() -> None:
    p = subprocess.run([NODE, "--test", "test/"], cwd=JS, capture_output=True, text=True, timeout=600)  # type: ignore[list-item]
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
