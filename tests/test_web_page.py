"""The viewer page (readers/js/web) end to end in headless Chromium.

The page is served from the repository (it imports ../src/*.js, no build step) and the files it
opens by URL from tests/range_server.py's range-capable server on another loopback port (CORS,
ETag).  tests/web_page.mjs drives it: a qformat checkpoint by URL (table, descriptor, decoded
histogram, check), a second file by URL (per-tensor SQNR against the reference values computed
here with NumPy from the reference reader's decode), a corrupt corpus file by the file picker
(read through Blob.slice: the refused tensor and check's code), a truncated file by URL (its
container code), a file dropped on the page and a GGUF file (its header's tensors listed).  Screenshots are kept under
``$QFORMAT_TEST_ARTIFACTS/web_page`` when that is set, else under the test's tmp_path.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import qformat
from tests import browser

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "conformance" / "v1"
PICKED = "invalid-component-shape-scale"  # a tensor-scoped refusal: the file opens, check reports it

needs_browser = pytest.mark.skipif(browser.available() is not None, reason=str(browser.available()))
needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="node (Node.js 18 or later) is not installed")


def _files(folder: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    ref = {
        "w_int4": rng.standard_normal((512, 256)).astype(np.float32),  # files over the first request's 64 KiB
        "w_nf4": rng.standard_normal((32, 128)).astype(np.float32),
        "bias": rng.standard_normal(16).astype(np.float32),
    }
    qformat.save_file({"w_int4": qformat.quantize(ref["w_int4"], "int", bits=4, group_size=32),
                       "w_nf4": qformat.quantize(ref["w_nf4"], "nf4"), "bias": ref["bias"]}, folder / "a.safetensors")
    qformat.save_file(ref, folder / "b.safetensors")
    data = (folder / "a.safetensors").read_bytes()
    (folder / "truncated.safetensors").write_bytes(data[:-3])
    return ref


def _sqnr(x: np.ndarray, y: np.ndarray) -> float:
    x = x.astype(np.float64)
    e = float(np.sum((x - y.astype(np.float64)) ** 2))
    return math.inf if e == 0 else 10 * math.log10(float(np.sum(x * x)) / e)


@needs_browser
def test_web_page_end_to_end(tmp_path: Path) -> None:
    from tests.range_server import Faults, serve_ranges

    data = tmp_path / "data"
    data.mkdir()
    ref = _files(data)
    _gguf(data / "m.gguf")
    manifest = json.loads((CORPUS / "manifest.json").read_text(encoding="utf-8"))
    case = next(c for c in manifest["cases"] if c["id"] == PICKED)
    shots = Path(os.environ["QFORMAT_TEST_ARTIFACTS"]) / "web_page" if os.environ.get("QFORMAT_TEST_ARTIFACTS") else tmp_path / "shots"
    shots.mkdir(parents=True, exist_ok=True)

    with serve_ranges(data) as files, serve_ranges(data, Faults(redirect_to=files)) as moved, \
            serve_ranges(data, Faults(no_cors=True)) as closed, browser.serve(ROOT / "readers" / "js") as site:
        plan = {"a": files + "a.safetensors", "b": files + "b.safetensors", "tensor": "w_int4",
                "picked": str(CORPUS / case["input"]), "truncated": files + "truncated.safetensors",
                "dropped": str(data / "b.safetensors"), "gguf": str(data / "m.gguf"),
                "redirected": moved + "a.safetensors", "nocors": closed + "a.safetensors"}
        (tmp_path / "plan.json").write_text(json.dumps(plan))
        env = dict(os.environ, QFORMAT_CHROMIUM=browser.chromium() or "")
        p = subprocess.run(["node", str(ROOT / "tests" / "web_page.mjs"), str(browser.PLAYWRIGHT.parent), site + "web/index.html?decoder=wasm",
                            str(tmp_path / "plan.json"), str(shots)], capture_output=True, text=True, timeout=240, env=env)
        assert p.returncode == 0, p.stderr[-3000:]
        out = json.loads(p.stdout.strip().splitlines()[-1])
        gets = files.log.gets()

    assert out["errors"] == [], out
    steps = out["steps"]
    # the page decodes through libqformat as WebAssembly (readers/js/wasm), and the SQNR values
    # checked below against NumPy's come from that path
    assert out["decoder"] == "wasm" and out["wasm"]["path"] == "wasm", (out.get("decoder"), out.get("wasm"))
    assert out["wasm"]["decodes"] >= 2, out["wasm"]

    # 1. the table of the URL-opened checkpoint: every tensor with scheme, shape, dtype, bits, bytes
    a = steps["a"]
    rows = {r[0]: r for r in a["rows"]}
    assert sorted(rows) == ["bias", "w_int4", "w_nf4"]
    with qformat.safe_open(data / "a.safetensors") as f:
        for name in rows:
            desc = f.descriptor(name) if hasattr(f, "descriptor") else None
            shape = list(f.get_tensor(name).shape)
            assert rows[name][2] == "[" + ", ".join(map(str, shape)) + "]", rows[name]
            if desc is not None:
                assert rows[name][1] == str(desc.get("scheme", "(none)"))
    assert rows["w_int4"][3] == "float32" and rows["bias"][1] == "plain" and rows["bias"][3] == "F32"
    assert 4.0 < float(rows["w_int4"][4]) < 6.0, rows["w_int4"]  # 4-bit codes plus a scale per 32
    assert rows["bias"][4] == "32.000"
    # opening reads the header only: its problems are listed, the full check waits for the button
    assert a["problems"] == [{"code": "", "text": "No problems in the header. Run check to read every byte (payload rules and digests)."}], a["problems"]
    assert steps["checked"]["problems"] == [{"code": "", "text": "No problems: check passes."}], steps["checked"]
    assert json.loads(a["descriptor"])["shape"] == [512, 256]
    # the histogram: 64 bars counting every decoded value once
    assert len(a["bars"]) == 64 and sum(a["bars"]) == 512 * 256 and max(a["bars"]) > 0
    # 2. SQNR of B against A, per tensor, as NumPy computes it from the reference decode of A
    decoded = qformat.load_file(data / "a.safetensors")
    got = {label: float(value) for label, value, _ in steps["b"]["sqnr"]}
    assert sorted(got) == ["bias", "w_int4", "w_nf4"]
    for name, x in decoded.items():
        want = _sqnr(np.asarray(x), ref[name])
        assert got[name] == want if math.isinf(want) else abs(got[name] - want) < 1e-9 * abs(want), (name, got[name], want)
    assert 15 < got["w_int4"] < 25 and got["bias"] == math.inf
    widths = {label: w for label, _, w in steps["b"]["sqnr"]}
    assert widths["w_int4"] > 0 and widths["w_nf4"] > 0
    assert widths["bias"] > 1.2 * max(widths["w_int4"], widths["w_nf4"]), widths  # exact is visibly longest
    # 3. the corrupt file from the picker: its refused tensor in the table and check's codes
    picked = steps["picked"]
    want_codes = sorted(case["check"])
    assert sorted({pr["code"] for pr in picked["problems"]}) == want_codes, picked["problems"]
    assert any(r[2].startswith("refused: " + want_codes[0]) for r in picked["rows"]), picked["rows"]
    # 4. the truncated file by URL: its container code, shown in the check and the slot's status
    truncated = steps["truncated"]
    assert [pr["code"] for pr in truncated["problems"]] == ["DATA_TRUNCATED"], truncated
    assert truncated["rows"] == [] and "DATA_TRUNCATED" in truncated["statusA"]
    # 5. the dropped file: the plain reference file's table
    assert sorted(r[0] for r in steps["dropped"]["rows"]) == ["bias", "w_int4", "w_nf4"]
    assert all(r[1] == "plain" for r in steps["dropped"]["rows"])
    # 6. the GGUF file: listed from its header, what qformat check says of it
    gguf = steps["gguf"]
    assert [(r[0], r[1], r[2]) for r in gguf["rows"]] == [("token_embd.weight", "gguf Q4_K", "[8, 256]"), ("blk.0.attn_q.weight", "gguf Q8_0", "[16, 64]"),
                                                          ("output_norm.weight", "gguf F32", "[64]")]
    assert [pr["code"] for pr in gguf["problems"]] == ["NOT_SAFETENSORS"] and "GGUF version 3" in gguf["statusA"]
    # 7. a redirect to another origin (the browser follows it; the final URL is refused)
    assert [pr["code"] for pr in steps["redirected"]["problems"]] == ["REMOTE_REDIRECT_REFUSED"], steps["redirected"]
    # 8. a relative URL is resolved against the page (here: a file the page's server lacks), and
    # a server without CORS headers is named as such, not as a network failure
    assert "REMOTE_HTTP_ERROR" in steps["relative"]["statusB"] and "no-such-file.safetensors" in steps["relative"]["statusB"], steps["relative"]
    assert "REMOTE_UNREACHABLE" in steps["nocors"]["statusB"] and "CORS" in steps["nocors"]["statusB"], steps["nocors"]["statusB"]
    # 9. ?a=&b= opened both slots (opening B used to cancel A) and compared them
    assert "a.safetensors" in steps["query"]["statusA"] and "b.safetensors" in steps["query"]["statusB"], steps["query"]
    assert sorted(steps["query"]["sqnr"]) == ["bias", "w_int4", "w_nf4"]
    # every request for the files' bytes was a range request; the tensors past the first 64 KiB
    # were fetched by ranges of their own
    assert gets and all(rng is not None and rng.startswith("bytes=") for _, _, rng in gets), gets
    assert len([g for g in gets if g[1] == "/b.safetensors"]) >= 2, gets
    assert all((shots / n).stat().st_size > 0 for n in ["1-table-histogram.png", "2-sqnr.png", "3-picked-corrupt.png", "4-truncated.png", "5-gguf.png"])


def _gguf(path: Path) -> None:
    from qformat.export.gguf_writer import TensorEntry, write_gguf

    rng = np.random.default_rng(5)
    kvs = [("general.architecture", {"type": "string", "value": "llama"}),
           ("general.alignment", {"type": "uint32", "value": 64}),
           ("tokenizer.ggml.tokens", {"type": "array", "element_type": "string", "value": [f"t{i}" for i in range(300)]}),
           ("llama.rope.freq_base", {"type": "float32", "value": 10000.0})]
    tensors = [TensorEntry("token_embd.weight", "Q4_K", (8, 256), lambda: rng.integers(0, 256, 8 * 144, dtype=np.uint8)),
               TensorEntry("blk.0.attn_q.weight", "Q8_0", (16, 64), lambda: rng.integers(0, 256, 16 * 2 * 34, dtype=np.uint8)),
               TensorEntry("output_norm.weight", "F32", (64,), lambda: rng.standard_normal(64).astype(np.float32))]
    write_gguf(str(path), kvs, tensors, alignment=64)


def _gguf_probe(path: Path) -> dict:
    p = subprocess.run(["node", str(ROOT / "tests" / "js_gguf_probe.mjs"), str(path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@needs_node
def test_gguf_header_listing_matches_the_reference(tmp_path: Path) -> None:
    """The page's GGUF listing (web/gguf.js) agrees with qformat's GGUF reader, and refuses
    hostile headers with its codes without sizing anything from them."""
    from qformat.convert.gguf_file import GGUFFile

    path = tmp_path / "m.gguf"
    _gguf(path)
    out = _gguf_probe(path)
    ref = GGUFFile(path)
    assert out["alignment"] == ref.alignment == 64
    assert out["kv"]["general.architecture"] == "llama" and out["kv"]["tokenizer.ggml.tokens"] == {"type": 8, "count": 300}
    assert [t["name"] for t in out["tensors"]] == list(ref.tensors)
    for t in out["tensors"]:
        r = ref.tensors[t["name"]]
        assert (tuple(t["shape"]), t["typeName"], t["bytes"], out["dataStart"] + t["offset"]) == (r.shape, r.type_name, r.nbytes, r.start)
    assert {t["typeName"]: t["bitsPerWeight"] for t in out["tensors"]} == {"Q4_K": 4.5, "Q8_0": 8.5, "F32": 32.0}
    data = path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:200])  # inside the token array
    assert _gguf_probe(tmp_path / "cut.gguf")["code"] == "CONVERT_SOURCE_INVALID"
    huge = bytearray(data)
    huge[8:16] = (1 << 62).to_bytes(8, "little")  # tensor_count
    assert _gguf_probe_bytes(tmp_path, bytes(huge))["code"] == "CONVERT_SOURCE_INVALID"
    v9 = bytearray(data)
    v9[4:8] = (9).to_bytes(4, "little")
    assert _gguf_probe_bytes(tmp_path, bytes(v9))["code"] == "CONVERT_UNSUPPORTED"


def _gguf_probe_bytes(tmp_path: Path, data: bytes) -> dict:
    p = tmp_path / "probe.gguf"
    p.write_bytes(data)
    return _gguf_probe(p)


@needs_browser
def test_showing_one_tensor_reads_the_header_and_that_tensor_only(tmp_path: Path) -> None:
    """Opening a checkpoint by URL and showing one tensor's histogram reads its header (within
    the first request's 64 KiB) and that tensor's stored bytes, nothing more: the page no longer
    runs the whole-file check on open (issue 44: it read about twice the file to show one)."""
    from qformat.container import read_header
    from tests.range_server import serve_ranges

    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(3)
    big = {f"w{i}": qformat.quantize(rng.standard_normal((512, 512)).astype(np.float32), "int", bits=4, group_size=32) for i in range(6)}
    qformat.save_file(big, data / "a.safetensors")
    h = read_header(data / "a.safetensors")
    shown = sum(e.nbytes for n, e in h.entries.items() if n.startswith("w2."))
    with serve_ranges(data) as files, browser.serve(ROOT / "readers" / "js") as site:
        plan = {"a": files + "a.safetensors", "tensor": "w2", "only": "a"}
        (tmp_path / "plan.json").write_text(json.dumps(plan))
        env = dict(os.environ, QFORMAT_CHROMIUM=browser.chromium() or "")
        p = subprocess.run(["node", str(ROOT / "tests" / "web_page.mjs"), str(browser.PLAYWRIGHT.parent), site + "web/index.html",
                            str(tmp_path / "plan.json"), str(tmp_path)], capture_output=True, text=True, timeout=240, env=env)
        assert p.returncode == 0, p.stderr[-3000:]
        out = json.loads(p.stdout.strip().splitlines()[-1])
        sent = files.log.bytes_sent
    assert out["errors"] == [], out
    assert len(out["steps"]["a"]["bars"]) == 64
    size = (data / "a.safetensors").stat().st_size
    assert h.data_start < 65536 and shown < size / 5
    assert sent <= 65536 + shown, (sent, shown, size)
