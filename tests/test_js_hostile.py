"""The JavaScript reader (readers/js) against hostile URLs, servers and files (issue 40).

- URLs are shown redacted in every message: no user-info, no query (``?...`` says there was
  one), no fragment, never a header's value; ``showSecrets`` shows them whole.
- Every remote read has a total deadline (tries, backoff and body): a dripping server ends in
  REMOTE_UNREACHABLE instead of holding the read forever.
- Long lists (200,000 tensors and digests) neither overflow the stack nor make a path
  quadratic: the blocks of readers/js/src that run, counted by V8's coverage, grow in
  proportion to the entries (50,000 against 200,000).
- A tensor larger than the platform's arrays (8 GiB in Node 20) is refused with
  SHAPE_UNREPRESENTABLE before anything is fetched or allocated, remote and local.
- The coverage-guided fuzzer (readers/js/fuzz/fuzz.mjs) runs a seeded short session with no
  finding, and its oracle catches a planted defect.

Uses tests/range_server.py (loopback only) and tests/js_remote_probe.mjs,
tests/js_hostile_probe.mjs.
"""

from __future__ import annotations

import base64
import json
import shutil
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import qformat
from tests.range_server import Faults, serve_ranges

ROOT = Path(__file__).resolve().parent.parent
JS = ROOT / "readers" / "js"
PROBE = ROOT / "tests" / "js_remote_probe.mjs"
SCALE = ROOT / "tests" / "js_hostile_probe.mjs"
FUZZ = JS / "fuzz" / "fuzz.mjs"
NODE = shutil.which("node")
FAST = {"retries": 1, "backoffMs": 10, "probeBytes": 256}

pytestmark = pytest.mark.skipif(NODE is None, reason="node (Node.js 18 or later) is not installed")

SECRETS = ("PWSECRET", "SIGSECRET", "AMZSECRET", "AKIASECRET", "TOKSECRET", "FRAGSECRET", "HDRSECRET", "alice")


def _probe(url: str, opts: dict | None = None, timeout: float = 120) -> tuple[dict, str]:
    """The probe's JSON answer, and everything it printed (stdout and stderr)."""
    p = subprocess.run([NODE, str(PROBE), url, json.dumps({**FAST, **(opts or {})})], capture_output=True, text=True,  # type: ignore[list-item]
                       timeout=timeout)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stdout + p.stderr


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("hostile")
    rng = np.random.default_rng(40)
    qformat.save_file({"w": qformat.quantize(rng.standard_normal((64, 64)).astype(np.float32), "int", bits=4, group_size=32),
                       "b": rng.standard_normal(8).astype(np.float32)}, d / "m.safetensors")
    return d


def _secret_url(base: str, query: str) -> str:
    return base.replace("http://", "http://alice:PWSECRET@") + "m.safetensors?" + query + "#FRAGSECRET"


QUERIES = ["sig=SIGSECRET&se=2030", "X-Amz-Signature=AMZSECRET&X-Amz-Credential=AKIASECRET", "token=TOKSECRET"]


@pytest.mark.parametrize("query", QUERIES)
@pytest.mark.parametrize(
    ("faults", "code"),
    [
        (Faults(status=403), "REMOTE_HTTP_ERROR"),
        (Faults(require_token="other"), "REMOTE_HTTP_ERROR"),  # 401: the URL's user-info went as Basic, refused
        (Faults(drop_first=10), "REMOTE_UNREACHABLE"),
        (Faults(ignore_range=True), "REMOTE_RANGE_IGNORED"),
        (Faults(wrong_length=True), "REMOTE_RANGE_INVALID"),
        (Faults(change_after=1), "REMOTE_CHANGED"),
    ],
)
def test_messages_show_urls_redacted(folder: Path, faults: Faults, code: str, query: str) -> None:
    with serve_ranges(folder, faults) as base:
        out, printed = _probe(_secret_url(base, query), {"headers": {"X-Api-Key": "HDRSECRET"}})
        sent = [h.get("Authorization") for h in base.log.headers]
    assert out.get("code") == code, out
    assert out["message"].count(f"{base}m.safetensors?...") >= 1, out["message"]
    assert not [s for s in SECRETS if s in printed], printed
    # the user-info travelled as a header, never in the request line
    assert sent and set(sent) == {"Basic " + base64.b64encode(b"alice:PWSECRET").decode()}


def test_show_secrets_shows_the_whole_url(folder: Path) -> None:
    with serve_ranges(folder, Faults(status=403)) as base:
        url = _secret_url(base, "token=TOKSECRET")
        out, _ = _probe(url, {"showSecrets": True})
    assert out["code"] == "REMOTE_HTTP_ERROR"
    assert url in out["message"], out["message"]


def test_an_authorization_header_is_never_shown(folder: Path) -> None:
    with serve_ranges(folder, Faults(require_token="right")) as base:
        out, printed = _probe(base + "m.safetensors?token=TOKSECRET", {"headers": {"Authorization": "Bearer HDRSECRET"}})
        ok, _ = _probe(base + "m.safetensors", {"headers": {"Authorization": "Bearer right"}})
    assert out["code"] == "REMOTE_HTTP_ERROR" and "HDRSECRET" not in printed and "TOKSECRET" not in printed
    assert ok.get("ok"), ok


def test_a_dripping_server_ends_at_the_deadline(folder: Path) -> None:
    """The server sends 256 bytes a second: without a deadline the header's read takes minutes
    (it never ended before this change); with deadlineMs 1000 it is refused within seconds."""
    big = folder / "drip.safetensors"
    qformat.save_file({"x": np.zeros(1 << 16, np.float32)}, big)
    with serve_ranges(folder, Faults(drip_bytes_per_s=256)) as base:
        t = time.monotonic()
        out, printed = _probe(base + "drip.safetensors?sig=SIGSECRET", {"deadlineMs": 1000, "probeBytes": 65536, "retries": 3})
        took = time.monotonic() - t
    assert out["code"] == "REMOTE_UNREACHABLE", out
    assert "deadline of 2.0 s" in out["message"] and "SIGSECRET" not in printed, out["message"]  # 1 s + 64 KiB at 64 KiB/s
    assert took < 60, took


def _sparse_file(path: Path, big_bytes: int) -> None:
    """A file whose header declares a small F32 tensor and a U8 tensor of ``big_bytes``; the
    data is a hole (no disk, no memory)."""
    header = {"small": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "big": {"dtype": "U8", "shape": [big_bytes], "data_offsets": [8, 8 + big_bytes]}}
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(hb)) + hb)
        fh.truncate(8 + len(hb) + 8 + big_bytes)


GIB8 = 8 << 30


def test_a_remote_tensor_past_the_platform_arrays_is_refused_before_it_is_fetched(tmp_path: Path) -> None:
    _sparse_file(tmp_path / "big.safetensors", GIB8)
    with serve_ranges(tmp_path) as base:
        limit = _probe(base + "big.safetensors", {"tensors": ["small"]})[0]["maxArrayLength"]
        # a platform whose arrays hold 8 GiB would fetch it: there the same bound is the caller's
        opts = {"tensors": ["big"]} if limit < GIB8 else {"tensors": ["big"], "maxArrayLength": 1 << 32}
        base.log.reset()
        out, printed = _probe(base + "big.safetensors", opts)
        sent = base.log.bytes_sent
    assert out["code"] == "SHAPE_UNREPRESENTABLE", out
    assert '"big"' in out["message"] and "RangeError" not in printed
    assert sent <= 65536 + 4096, sent  # the probe and the header: nothing of the tensor


def test_a_local_tensor_past_the_platform_arrays_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "big.safetensors"
    _sparse_file(p, GIB8)
    limit = json.loads(subprocess.run([NODE, "-e", 'import("./readers/js/src/index.js").then((m) => console.log(m.MAX_ARRAY_LENGTH))'],  # type: ignore[list-item]
                                      cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    if limit >= GIB8:
        pytest.skip(f"this platform's arrays hold {limit} elements: an 8 GiB tensor is read (a hole of zeros), not refused")
    r = subprocess.run([NODE, str(JS / "bin" / "qformat-read.mjs"), str(p), str(tmp_path / "out.safetensors")],  # type: ignore[list-item]
                       capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout.strip()) == (1, "SHAPE_UNREPRESENTABLE"), r.stdout + r.stderr
    assert "RangeError" not in r.stderr and not (tmp_path / "out.safetensors").exists()


def _scale(n: int) -> dict:
    p = subprocess.run([NODE, str(SCALE), str(n)], capture_output=True, text=True, timeout=900)  # type: ignore[list-item]
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])["ops"]


def test_long_lists_are_linear_and_do_not_overflow_the_stack() -> None:
    """200,000 tensors each with a digest: check reports 200,000 mismatches (a spread of them
    overflowed the stack at about 130,000), verify-reads and lazy reads finish.  Work grows in
    proportion: executed blocks (exact counts) at most 4.5 times those of 50,000 entries, CPU
    time at most 10 times (quadratic paths gave 16 and more: 50,000 verified reads took 88 s)."""
    small, large = _scale(50_000), _scale(200_000)
    assert large["check-digests"]["result"] == 200_000
    assert large["load-verify"]["result"] == large["lazy-load-verify"]["result"] == 200_000
    assert large["lazy-one-by-one"]["result"] == 200_000
    for op in small:
        assert small[op]["blocks"] > 0 and large[op]["blocks"] > 0, (op, small[op], large[op])
        ratio = large[op]["blocks"] / small[op]["blocks"]
        assert ratio <= 4.5, (op, ratio, small[op], large[op])
        cpu = large[op]["cpu_ms"] / max(small[op]["cpu_ms"], 200)
        assert cpu <= 10, (op, cpu, small[op], large[op])


def _fuzz(*args: str, cwd: Path = ROOT, timeout: float = 600) -> dict:
    p = subprocess.run([NODE, str(cwd / "readers" / "js" / "fuzz" / "fuzz.mjs"), *args], cwd=cwd,  # type: ignore[list-item]
                       capture_output=True, text=True, timeout=timeout)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert p.returncode == (1 if out["findings"] else 0), p.stderr[-3000:]
    return out


def test_fuzz_seeded_short_run(tmp_path: Path) -> None:
    """A seeded session of the coverage-guided fuzzer: the conformance corpus and tests/test_errors.py's
    seeds, mutated; no input may end in anything but a decode or a coded refusal."""
    from tests.test_errors import SEEDS

    seeds = tmp_path / "seeds"
    seeds.mkdir()
    for name, data in SEEDS.items():
        (seeds / f"{name}.safetensors").write_bytes(data)
    out = _fuzz("--seed", "1", "--execs", "1500", "--seeds", str(seeds), "--findings", str(tmp_path / "findings"))
    assert out["findings"] == [], out["findings"]
    assert out["execs"] == 1500 and out["seeds"] >= 500
    assert out["corpus"] > out["seeds"], out  # mutants reached blocks no seed did: coverage guides it
    assert out["blocks"] >= 1000, out


def test_fuzz_oracle_catches_a_planted_defect(tmp_path: Path) -> None:
    """The fuzzer on a copy of the reader with a defect it once found (a zero-length read of
    an empty tensor through the lazy path threw a plain Error): reported as a crash, with the
    input kept."""
    copy = tmp_path / "repo"
    shutil.copytree(JS, copy / "readers" / "js")
    shutil.copytree(ROOT / "conformance", copy / "conformance")
    src = copy / "readers" / "js" / "src" / "source.js"
    text = src.read_text(encoding="utf-8")
    planted = text.replace("if (len === 0) return new Uint8Array(0);  // an empty tensor", "// planted: an empty tensor")
    assert planted != text
    src.write_text(planted, encoding="utf-8")
    out = _fuzz("--seed", "1", "--execs", "600", "--findings", str(tmp_path / "findings"), cwd=copy)
    crashes = [f for f in out["findings"] if f["kind"] == "crash"]
    assert crashes and "were read before they were fetched" in crashes[0]["message"], out["findings"]
    assert Path(crashes[0]["file"]).is_file()
