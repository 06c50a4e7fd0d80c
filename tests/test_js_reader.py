"""The JavaScript reader (readers/js) passes the whole conformance corpus, and its own unit tests.

The whole corpus goes through one ``qformat-read.mjs --batch`` process (the command protocol's
batch form: the same decode, the same codes) and each case is judged by the runner's own verdict;
the documented command itself, ``qformat conformance run --reader "node
readers/js/bin/qformat-read.mjs" --jobs 2``, one Node process per case, runs on every 8th case
(the whole corpus that way took 80 s of CPU, most of it Node starting 557 times); then
``node --test readers/js/test/``.  The package has no npm dependencies, so nothing is installed
first.  Skipped (with the reason) where ``node`` is missing.
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


def test_js_reader_passes_the_whole_corpus(tmp_path: Path) -> None:
    """Every case through ``--batch``: decoded outputs compared with the expected tensors, codes
    with the expected code, by qformat.conformance's verdict (as ``conformance run`` judges)."""
    from qformat import conformance
    from qformat.io import load_file

    assert _node_major() >= 18, "the JavaScript reader needs Node.js 18 or later"
    corpus = str(ROOT / "conformance" / "v1")
    cases = conformance.load_manifest(corpus)["cases"]
    outs = {c["id"]: tmp_path / f"{i}.safetensors" for i, c in enumerate(cases)}
    listing = "".join(f"{Path(corpus) / c['input']}\t{outs[c['id']]}\n" for c in cases)
    p = subprocess.run([NODE, str(JS / "bin" / "qformat-read.mjs"), "--batch"], input=listing, cwd=ROOT,  # type: ignore[list-item]
                       capture_output=True, text=True, timeout=1200)
    lines = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == len(cases), (len(lines), p.stderr[-2000:])
    failed = []
    for c, ln in zip(cases, lines):
        assert ln["input"] == str(Path(corpus) / c["input"]), (ln, c["input"])
        got = load_file(outs[c["id"]]) if ln["code"] is None and ln["crash"] is None else None
        res = conformance._verdict(c, got, ln["code"], ln["crash"], corpus)
        if res["result"] != "pass":
            failed.append(res)
    assert not failed, "\n".join(f"{f['id']}: got {f.get('got')}: {f.get('detail')}" for f in failed[:30])


def test_documented_command_passes_a_sample_of_the_corpus() -> None:
    """The command a third party runs, one process per case, on every 8th case of the manifest."""
    manifest = json.loads((ROOT / "conformance" / "v1" / "manifest.json").read_text(encoding="utf-8"))
    sample = [c["id"] for c in manifest["cases"]][::8]
    cmd = [sys.executable, "-m", "qformat", "conformance", "run", "--reader", "node readers/js/bin/qformat-read.mjs",
           "--jobs", "2", *(a for i in sample for a in ("--id", i))]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    lines = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    summary = lines[-1]["summary"]
    failed = [ln for ln in lines[:-1] if ln["result"] != "pass"]
    assert summary["cases"] == len(sample) > 60
    assert not failed, "\n".join(f"{f['id']}: got {f['got']}: {f['detail']}" for f in failed[:30])
    assert p.returncode == 0, p.stderr[-2000:]
    assert summary["passed"] == summary["cases"]


def test_js_unit_tests() -> None:
    p = subprocess.run([NODE, "--test", "test/"], cwd=JS, capture_output=True, text=True, timeout=600)  # type: ignore[list-item]
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
