"""The JavaScript reader's range source (readers/js/src/http.js) against the same loopback range
server, and the same faults, as the Python reader's remote tests (tests/range_server.py): every
refusal has the code of qformat/tables/errors.json, and what it decodes equals the reference."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import qformat
from tests.range_server import Faults, serve_ranges

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "tests" / "js_remote_probe.mjs"
OPTS = {"probeBytes": 256}  # the tensors lie past the first request: each read is a range request of its own

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="node (Node.js 18 or later) is not installed")


def _probe(url: str, opts: dict | None = None) -> dict:
    p = subprocess.run(["node", str(PROBE), url, json.dumps({**OPTS, **(opts or {})})], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("remote")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((128, 64)).astype(np.float32)
    qformat.save_file({"w": qformat.quantize(x, "int", bits=4, group_size=32), "b": rng.standard_normal(8).astype(np.float32)}, d / "m.safetensors")
    return d


def test_reads_what_the_reference_decodes(folder: Path) -> None:
    with serve_ranges(folder) as base:
        out = _probe(base + "m.safetensors")
        gets = base.log.gets()
    assert out.get("ok"), out
    ref = qformat.load_file(folder / "m.safetensors")
    assert sorted(out["keys"]) == sorted(ref)
    for name, x in ref.items():
        assert abs(out["sums"][name] - float(np.asarray(x, dtype=np.float64).sum())) < 1e-6, name
    assert len(gets) >= 3 and all(r is not None for _, _, r in gets)  # probe, header's rest or tensors: all ranges
    assert out["bytes"] <= (folder / "m.safetensors").stat().st_size + 256  # nothing read twice but the probe's overlap


@pytest.mark.parametrize(
    ("faults", "code", "gets"),
    [
        (Faults(ignore_range=True), "REMOTE_RANGE_IGNORED", 1),
        (Faults(status=404), "REMOTE_HTTP_ERROR", 1),  # a 4xx is not retried
        (Faults(status=403), "REMOTE_HTTP_ERROR", 1),
        (Faults(fail_5xx_first=10), "REMOTE_HTTP_ERROR", 3),  # one try and two retries
        (Faults(drop_first=10), "REMOTE_UNREACHABLE", 3),
        (Faults(wrong_length=True), "REMOTE_RANGE_INVALID", 1),
        (Faults(huge_length=True), "REMOTE_RANGE_INVALID", 1),
        (Faults(change_after=1), "REMOTE_CHANGED", 2),  # the file changes after the first answer
    ],
)
def test_refusals(folder: Path, faults: Faults, code: str, gets: int) -> None:
    with serve_ranges(folder, faults) as base:
        out = _probe(base + "m.safetensors")
        n = len(base.log.gets())
    assert out.get("code") == code, out
    assert n == gets, (n, out)


def test_retries_recover(folder: Path) -> None:
    for faults in (Faults(drop_first=2), Faults(fail_5xx_first=2)):
        with serve_ranges(folder, faults) as base:
            out = _probe(base + "m.safetensors")
        assert out.get("ok"), (faults, out)


def test_cross_origin_redirect_is_refused(folder: Path) -> None:
    with serve_ranges(folder) as other, serve_ranges(folder, Faults(redirect_to=other)) as base:
        out = _probe(base + "m.safetensors")
        contacted = other.log.gets()
    assert out.get("code") == "REMOTE_REDIRECT_REFUSED", out
    assert contacted == []  # refused from the Location header: the other origin never saw a request


def test_container_codes_through_ranges(folder: Path) -> None:
    """An empty file (the server's 416 'bytes */0') and a truncated one: the container's codes."""
    (folder / "empty.safetensors").write_bytes(b"")
    (folder / "cut.safetensors").write_bytes((folder / "m.safetensors").read_bytes()[:-5])
    with serve_ranges(folder) as base:
        assert _probe(base + "empty.safetensors").get("code") == "HEADER_TOO_SMALL"
        assert _probe(base + "cut.safetensors").get("code") == "DATA_TRUNCATED"
