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
- Fixtures: rows of those tensors and llama-quantize's bytes for them are the frozen fixture
  ``tests/fixtures/llama_quantize/ggml_blocks.safetensors`` that the default suite checks
  (tests/test_gguf_scheme.py); this test rebuilds it from llama.cpp and fails if it differs
  (``QFORMAT_WRITE_FIXTURES=1`` writes it instead).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import qformat
from qformat.gguf_presets import presets
from qformat.schemes.ggml_blocks import SIZES, TYPES, quantize_blocks

from . import llama_cpp as L
from . import llama_cpp_models as M
from . import llama_cpp_source
from .test_llama_cpp import _hf_folder, _once, _qformat, source, tools  # noqa: F401 (fixtures)

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
    """name -> (ggml type name, raw bytes or values as stored, NumPy-order shape)."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    return {t.name: (t.tensor_type.name, np.asarray(t.data), tuple(int(s) for s in reversed(t.shape.tolist()))) for t in r.tensors}


def assert_same_tensors(ref_path: Path, out: Path) -> None:
    """Two GGUF files hold the same tensors, each of the same type, shape and bytes."""
    ref, got = _tensors(ref_path), _tensors(out)
    assert sorted(ref) == sorted(got)
    for name, (tname, raw, shape) in ref.items():
        gname, graw, gshape = got[name]
        assert (gname, gshape) == (tname, shape), name
        assert np.array_equal(np.asarray(graw).reshape(-1).view(np.uint8), np.asarray(raw).reshape(-1).view(np.uint8)), name


def gguf_int(path: Path, key: str) -> int:
    """An integer metadata value of a GGUF file."""
    from gguf import GGUFReader

    f = GGUFReader(str(path)).fields[key]
    return int(f.parts[f.data[0]][0])


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
