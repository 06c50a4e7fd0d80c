"""The architecture matrix (issue 42 item 2; marker ``llama_cpp``, deselected by default:
``./test.sh -m llama_cpp tests/test_arch_matrix.py``).

For every entry of ``tests/arch_matrix_models.py`` (one tiny random-weight model per
architecture both transformers' GGUF loader and llama.cpp's converter support) and each of its
presets:

1. the model, built with transformers from a seed, converted by llama.cpp's own
   ``convert_hf_to_gguf.py`` (F16) and quantized by ``llama-quantize`` (the preset);
2. ``qformat convert x.gguf folder/`` -> transformers: the same token ids and greedy tokens as
   transformers' own GGUF loader on x.gguf, logits bit-identical under the ``decode`` kernel
   policy (the default policy's largest difference recorded);
3. ``qformat export folder/ back.gguf --to gguf`` -> llama.cpp: loads with no warning x.gguf does
   not draw, ``llama-tokenize`` gives x.gguf's ids, ``llama-perplexity`` prints x.gguf's final
   line; whether back.gguf is x.gguf byte for byte is recorded (and what differs, if anything).

An entry with ``xfail`` is an architecture qformat refuses by name: its tests check that
``qformat convert`` refuses llama.cpp's GGUF of it (CONVERT_UNSUPPORTED naming the architecture,
nothing written), then are recorded as expected failures with the entry's reason.  Models, GGUF files and folders are made
once per session (shared by xdist workers); rows go to the llama.cpp results file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from . import arch_matrix as A
from . import llama_cpp as L
from .arch_matrix_models import MODELS, ArchSpec
from .test_llama_cpp import _once, _qformat, _record, paragraph, source, tools  # noqa: F401  (fixtures)

pytestmark = pytest.mark.llama_cpp


def _cases() -> list:
    return [pytest.param(arch, preset, id=f"{arch}-{preset}") for arch, spec in MODELS.items() for preset in spec.presets]


def _tokenizer(source: Path, name: str) -> tuple[Path, dict]:
    """The tokenizer folder and the vocabulary size / special ids its models take (cached across
    sessions: a pure function of the sdist's vocabulary files and the transformers version)."""
    d = A.cached_tokenizer(name, source)
    return d / "tok", json.loads((d / "ids.json").read_text())


def _f16(tmp_path_factory, source: Path, arch: str, spec: ArchSpec) -> Path:
    """The tiny model as llama.cpp's converter writes it (F16)."""
    tok, ids = _tokenizer(source, spec.tokenizer)

    def make(d: Path) -> None:
        A.tiny_model(spec, tok, ids, d / "hf")
        L.convert_hf(d / "hf", "f16", d / "model-F16.gguf")

    return _once(tmp_path_factory, f"matrix-{arch}-F16", make) / "model-F16.gguf"


def _source(tmp_path_factory, source: Path, arch: str, preset: str) -> Path:
    spec = MODELS[arch]
    f16 = _f16(tmp_path_factory, source, arch, spec)
    if preset == "F16":
        return f16
    return _once(tmp_path_factory, f"matrix-{arch}-{preset}", lambda d: L.quantize(f16, d / f"model-{preset}.gguf", preset)) / f"model-{preset}.gguf"


def _folder(tmp_path_factory, src: Path, arch: str, preset: str) -> Path:
    return _once(tmp_path_factory, f"matrix-{arch}-{preset}-hf", lambda d: _qformat("convert", "--quiet", src, d / "hf")) / "hf"


def _exported(tmp_path_factory, folder: Path, arch: str, preset: str) -> Path:
    return _once(tmp_path_factory, f"matrix-{arch}-{preset}-back",
                 lambda d: _qformat("export", folder, d / "back.gguf", "--to", "gguf")) / "back.gguf"


def _refused(tmp_path_factory, src: Path, arch: str, preset: str) -> None:
    """An ``xfail`` entry: ``qformat convert`` must refuse llama.cpp's GGUF of it by name (exit
    status 2, a CONVERT_UNSUPPORTED line naming the GGUF architecture, nothing written); then
    the test is recorded as an expected failure with the entry's reason."""
    spec = MODELS[arch]

    def make(d: Path) -> None:
        p = subprocess.run([sys.executable, "-m", "qformat", "convert", "--quiet", str(src), str(d / "hf")],
                           capture_output=True, text=True, timeout=900, check=False)
        (d / "refusal.json").write_text(json.dumps({"status": p.returncode, "stderr": p.stderr.strip()[-2000:],
                                                    "written": (d / "hf").exists()}))

    got = json.loads((_once(tmp_path_factory, f"matrix-{arch}-{preset}-refusal", make) / "refusal.json").read_text())
    _record(f"arch matrix {arch} {preset} refused", {**got, "reason": spec.xfail})
    assert got["status"] == 2 and not got["written"], got
    assert "[CONVERT_UNSUPPORTED]" in got["stderr"] and repr(spec.gguf_arch) in got["stderr"], got
    pytest.xfail(spec.xfail)


@pytest.mark.parametrize(("arch", "preset"), _cases())
def test_folder_runs_like_transformers_gguf_loader(arch, preset, tmp_path_factory, source, tools):
    src = _source(tmp_path_factory, source, arch, preset)
    if MODELS[arch].xfail:
        _refused(tmp_path_factory, src, arch, preset)
    folder = _folder(tmp_path_factory, src, arch, preset)
    row = A.transformers_row(src, folder)
    _record(f"arch matrix {arch} {preset} transformers", row)


@pytest.mark.parametrize(("arch", "preset"), _cases())
def test_exported_gguf_runs_in_llama_cpp_as_the_original(arch, preset, tmp_path_factory, source, tools, paragraph):
    src = _source(tmp_path_factory, source, arch, preset)
    if MODELS[arch].xfail:
        _refused(tmp_path_factory, src, arch, preset)
    back = _exported(tmp_path_factory, _folder(tmp_path_factory, src, arch, preset), arch, preset)
    same = A.gguf_identity(src, back)
    row = {**same, **A.llama_cpp_row(src, back, paragraph), "gguf_bytes": src.stat().st_size}
    _record(f"arch matrix {arch} {preset} llama.cpp", row)
