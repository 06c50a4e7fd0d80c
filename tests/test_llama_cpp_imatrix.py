"""``--imatrix`` against llama.cpp itself (marker ``llama_cpp``; docs/llama-cpp.md).

- Files: ``llama-imatrix`` of the tiny Llama 3's F32 GGUF over the test paragraph, in its GGUF
  format and its legacy .dat format; :func:`qformat.imatrix.load_imatrix` reads both, and
  tests/imatrix_files.py writes files of the same layout (checked here).
- Types: ``llama-quantize --pure --imatrix FILE`` to each of the 10 types, of the trained model
  with llama-imatrix's file (GGUF, and .dat for Q4_K and Q5_1) and of the awkward random model
  with a written matrix of awkward importances (zeros, spikes, a 1e6 range), against
  ``qformat.quantize(x, "gguf", type=T, importance=...)`` byte for byte, on the default path and
  on the NumPy reference.
- Presets: ``llama-quantize --imatrix FILE`` against ``qformat quantize --preset P --imatrix
  FILE`` then ``qformat export --to gguf``: the same tensors, types, bytes, general.file_type and
  quantize.imatrix.* counts; Q2_K_S among them (which needs the matrix).
- Fixture: rows, importance vectors and llama-quantize's bytes become
  ``tests/fixtures/llama_quantize/ggml_weighted.safetensors`` (default suite:
  tests/test_imatrix.py); rebuilt and compared here, written with ``QFORMAT_WRITE_FIXTURES=1``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import qformat
from qformat import kernels
from qformat.imatrix import Imatrix, load_imatrix
from qformat.schemes.ggml_blocks import SIZES, TYPES
from qformat.schemes.ggml_weighted import quantize_rows_weighted

from . import llama_cpp as L
from . import llama_cpp_source
from .imatrix_files import write_gguf
from .test_llama_cpp import _once, _qformat, paragraph, source, tools  # noqa: F401 (fixtures)
from .test_llama_cpp_quantize import FIXTURE_ROWS, _tensors, assert_same_tensors, f32_sources, gguf_int  # noqa: F401 (fixtures)
from .test_llama_cpp_quantize import llama_imatrix as _llama_imatrix

pytestmark = pytest.mark.llama_cpp

FIXTURE = Path(__file__).parent / "fixtures" / "llama_quantize" / "ggml_weighted.safetensors"
PRESETS = ("Q4_K_M", "Q2_K_S", "Q3_K_M", "Q4_0", "Q5_K_S", "Q6_K")
#: Rows of the random model added to the fixture by index: row 89936 of output.weight is where a
#: scale search over a near-empty range (importance 0 on the outlier) takes ggml's nearest_int
#: beyond 2^22, whose bit pattern (not rint) decides a Q2_K code.
EXTRA_ROWS = {"random": {"output.weight": 89936}}


def _awkward_importance(names_cols: dict[str, int]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per tensor (sums, counts) whose normalised values are awkward: zero columns, a few huge
    ones, a 1e6 range, one all-zero vector."""
    rng = np.random.default_rng(25)
    out = {}
    for i, (name, cols) in enumerate(sorted(names_cols.items())):
        v = rng.gamma(0.5, 1.0, cols) * np.exp(rng.uniform(-7, 7, cols))
        v[rng.random(cols) < 0.2] = 0
        v[rng.integers(cols)] = 1e4
        if i == 3:
            v[:] = 0
        out[name] = (v.astype(np.float32) * 13, np.array([13.0]))
    return out


@pytest.fixture(scope="session")
def imatrices(f32_sources, paragraph, tmp_path_factory) -> dict[str, Path]:  # noqa: F811
    """{"gguf", "dat": llama-imatrix's files of the trained model; "random": a written GGUF
    matrix for the random model's tensors}."""
    _, trained = f32_sources["trained"]
    out = {fmt: _once(tmp_path_factory, f"imatrix-llama3-{fmt}", lambda d, fmt=fmt: _llama_imatrix(trained, paragraph, d / f"imatrix.{fmt}", fmt))
           / f"imatrix.{fmt}" for fmt in ("gguf", "dat")}
    _, rnd = f32_sources["random"]
    cols = {n: shape[-1] for n, (t, _, shape) in _tensors(rnd).items() if len(shape) == 2 and n != "token_embd.weight"}
    out["random"] = _once(tmp_path_factory, "imatrix-llama3-random",
                          lambda d: write_gguf(d / "imatrix.gguf", _awkward_importance(cols))) / "imatrix.gguf"
    return out


def test_llama_imatrix_files_are_read(imatrices, f32_sources) -> None:
    g, d = load_imatrix(imatrices["gguf"]), load_imatrix(imatrices["dat"])
    assert (g.format, d.format) == ("gguf", "legacy")
    _, trained = f32_sources["trained"]
    mats = {n for n, (_, _, shape) in _tensors(trained).items() if len(shape) == 2 and n not in ("token_embd.weight", "output.weight")}
    assert set(g.entries) == set(d.entries) == mats
    for n in mats:  # the same statistics, one divided by its count, one multiplied then divided by ncall
        assert np.allclose(g.entries[n], d.entries[n], rtol=1e-5, atol=0), n
        assert (g.entries[n] >= 0).all() and g.entries[n].any()
    assert g.chunk_count >= 1 and g.datasets and g.datasets[0].endswith("paragraph.txt")
    # the layout tests/imatrix_files.py writes is llama-imatrix's: F32 <name>.in_sum2 / <name>.counts and the keys
    from gguf import GGUFReader

    r = GGUFReader(str(imatrices["gguf"]))
    assert {t.name for t in r.tensors} == {n + s for n in mats for s in (".in_sum2", ".counts")}
    assert all(t.tensor_type.name == "F32" for t in r.tensors)
    assert {"imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size"} <= set(r.fields)


def _imatrix_for(kind: str, imatrices, fmt: str = "gguf") -> tuple[Path, Imatrix]:
    p = imatrices["random"] if kind == "random" else imatrices[fmt]
    return p, load_imatrix(p)


def _cases() -> list[tuple[str, str, str]]:
    out = [(t, k, "gguf") for k in ("trained", "random") for t in TYPES]
    return out + [("Q4_K", "trained", "dat"), ("Q5_1", "trained", "dat")]


@pytest.mark.parametrize(("qtype", "kind", "fmt"), _cases())
def test_type_with_imatrix_byte_identical(qtype, kind, fmt, imatrices, f32_sources, tmp_path_factory) -> None:
    _, src = f32_sources[kind]
    path, im = _imatrix_for(kind, imatrices, fmt)
    ref = _tensors(_once(tmp_path_factory, f"gguf-llama3-{kind}-imatrix-{fmt}-{qtype}",
                         lambda d: L.quantize(src, d / "model.gguf", qtype, "--pure", "--imatrix", str(path))) / "model.gguf")
    f32 = _tensors(src)
    compared = weighted = 0
    for name, (tname, raw, shape) in ref.items():
        if tname != qtype:
            assert tname in ("F32", "F16"), f"{name}: {tname}"
            continue
        x = f32[name][1].reshape(shape).astype(np.float32)
        w = im.for_tensor(name, shape[-1])
        want = raw.reshape(-1).view(np.uint8)
        compared += 1
        weighted += w is not None
        rows = x.reshape(-1, shape[-1])
        paths = {"NumPy reference": quantize_rows_weighted(rows, qtype, w) if w is not None else None,
                 "native kernel": kernels.ggml_quantize_weighted(qtype, rows, w) if w is not None and kernels.ggml_available() else None}
        for how, got in paths.items():
            if got is None:
                continue
            bad = np.flatnonzero(got.reshape(-1) != want)
            assert bad.size == 0, f"{name} ({how}): {bad.size} bytes differ, the first in block {bad[0] // SIZES[qtype][1]}"
        # the scheme's QTensor holds those blocks: its decode is gguf-py's dequantize of llama's bytes
        import gguf
        from gguf.quants import dequantize

        y = dequantize(want.reshape(shape[:-1] + (-1,)), gguf.GGMLQuantizationType[qtype]).astype(np.float32)
        q = qformat.quantize(x, "gguf", type=qtype, importance=w)
        assert np.array_equal(q.dequantize().view(np.uint32), y.view(np.uint32)), name
    assert compared == 16, f"{compared} tensors were {qtype}, not the 16 2-D weights"
    assert weighted == (14 if kind == "trained" else 15)  # llama-imatrix has no token_embd / output; the written one no token_embd


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_with_imatrix_equals_llama_quantize(preset, imatrices, f32_sources, tmp_path_factory, tmp_path) -> None:
    folder, src = f32_sources["trained"]
    im = imatrices["gguf"]
    ref_path = _once(tmp_path_factory, f"gguf-llama3-trained-imatrix-{preset}",
                     lambda d: L.quantize(src, d / "model.gguf", preset, "--imatrix", str(im))) / "model.gguf"
    q, out = tmp_path / "q", tmp_path / "out.gguf"
    _qformat("quantize", folder, q, "--preset", preset, "--imatrix", im, "--quiet")
    _qformat("export", q, out, "--to", "gguf", "--quiet")
    assert_same_tensors(ref_path, out)
    for key in ("general.file_type", "quantize.imatrix.entries_count", "quantize.imatrix.chunks_count"):
        assert gguf_int(out, key) == gguf_int(ref_path, key), key


def test_weighted_fixture_is_what_llama_quantize_writes(imatrices, f32_sources, tmp_path_factory) -> None:
    from safetensors.numpy import load_file, save_file

    arrays: dict[str, np.ndarray] = {}
    for kind in ("random", "trained"):
        _, src = f32_sources[kind]
        path, im = _imatrix_for(kind, imatrices)
        f32 = _tensors(src)
        spans = {name: (0, rows) for name, rows in FIXTURE_ROWS.items()}
        spans.update({f"{name}@{r}": (r, r + 1) for name, r in EXTRA_ROWS.get(kind, {}).items()})
        for key, (a, b) in spans.items():
            name = key.split("@")[0]
            _, data, shape = f32[name]
            arrays[f"input.{kind}.{key}"] = np.ascontiguousarray(data.reshape(shape)[a:b].astype(np.float32))
            arrays[f"importance.{kind}.{key}"] = np.ascontiguousarray(im.for_tensor(name, shape[-1]))
        for qtype in TYPES:
            ref = _tensors(_once(tmp_path_factory, f"gguf-llama3-{kind}-imatrix-gguf-{qtype}",
                                 lambda d, qtype=qtype: L.quantize(src, d / "model.gguf", qtype, "--pure", "--imatrix", str(path))) / "model.gguf")
            for key, (a, b) in spans.items():
                tname, raw, shape = ref[key.split("@")[0]]
                assert tname == qtype
                per_row = shape[-1] // SIZES[qtype][0] * SIZES[qtype][1]
                arrays[f"{qtype}.{kind}.{key}"] = np.ascontiguousarray(raw.reshape(-1).view(np.uint8)[a * per_row: b * per_row].reshape(b - a, per_row))
    meta = {"made_by": "tests/test_llama_cpp_imatrix.py::test_weighted_fixture_is_what_llama_quantize_writes",
            "llama_cpp": f"llama-quantize --pure --imatrix, built from the {llama_cpp_source.PACKAGE} {llama_cpp_source.VERSION} sdist",
            "imatrix": "trained: llama-imatrix -c 32 of the test paragraph; random: tests/imatrix_files.py with awkward values",
            "flags": json.dumps(L.build_record().get("flags", []))}
    if os.environ.get("QFORMAT_WRITE_FIXTURES") == "1":
        FIXTURE.parent.mkdir(parents=True, exist_ok=True)
        save_file(arrays, str(FIXTURE), metadata=meta)
    have = load_file(str(FIXTURE))
    assert sorted(have) == sorted(arrays)
    for k in arrays:
        assert np.array_equal(have[k], arrays[k]), k
