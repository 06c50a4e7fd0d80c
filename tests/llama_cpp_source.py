"""llama.cpp's source as PyPI ships it, for the tests that read it or build it.

The llama-cpp-python sdist vendors a whole llama.cpp tree (``vendor/llama.cpp``): its converter
(``convert_hf_to_gguf.py``, ``conversion/``), its gguf-py, its C++ sources and ``models/`` with
real tokenizers (``ggml-vocab-*.gguf``, no weights) and their test vectors.  Nothing of it is
part of qformat: it is fetched with pip at test time, checked against the sha256 below, and
extracted once into a cache folder.

API (small on purpose; ``tests/llama_cpp.py`` builds its harness on it):

- :func:`source_dir` ``(*parts) -> Path``: the ``vendor/llama.cpp`` folder, with at least
  ``parts`` (paths relative to it, such as ``"models"`` or ``"conversion/base.py"``) extracted;
  with no parts, the whole tree.  :func:`llama_cpp_source` is ``source_dir()``.
- :func:`require` ``(*parts) -> Path``: :func:`source_dir` for a test, which is skipped (with the
  reason) when the source cannot be had, or fails when ``QFORMAT_REQUIRE_LLAMA_CPP=1`` (CI).
- :func:`sdist` ``() -> Path``: the sdist tarball itself.

Where things come from, in order: ``QFORMAT_LLAMA_CPP_SRC`` (an extracted ``vendor/llama.cpp``
folder, used as it is), ``QFORMAT_LLAMA_CPP_SDIST`` (a tarball already downloaded), the cache
(``$QFORMAT_CACHE``, else ``~/.cache/qformat``), else ``pip download --no-deps --no-binary :all:
llama-cpp-python==VERSION`` into the cache.  Extraction happens under a file lock, so
pytest-xdist workers (and concurrent sessions) extract each part once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Iterator

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
#: sha256 of the PyPI sdist llama_cpp_python-0.3.36.tar.gz.
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_NAME = f"llama_cpp_python-{VERSION}.tar.gz"
#: The llama.cpp folder inside the sdist.
TREE = f"llama_cpp_python-{VERSION}/vendor/llama.cpp"
DOWNLOAD_TIMEOUT_S = 900
_RECORD = ".qformat-extracted.json"  # the parts extracted so far (written after each extraction)


class Unavailable(RuntimeError):
    """The source cannot be had here (no network, pip failed, a wrong download)."""


def cache_root() -> Path:
    """``$QFORMAT_CACHE``, else ``~/.cache/qformat``."""
    env = os.environ.get("QFORMAT_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "qformat"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` while the block runs (released if the process dies)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            import fcntl
        except ImportError:  # Windows: no lock; workers may extract the same files twice
            yield
            return
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sdist() -> Path:
    """The sdist tarball: ``QFORMAT_LLAMA_CPP_SDIST``, the cached copy, or a pip download
    (verified against :data:`SDIST_SHA256` before it is kept)."""
    env = os.environ.get("QFORMAT_LLAMA_CPP_SDIST")
    if env:
        if not Path(env).is_file():
            raise Unavailable(f"QFORMAT_LLAMA_CPP_SDIST={env} is not a file")
        return Path(env)
    root = cache_root()
    target = root / SDIST_NAME
    with locked(root / f"{SDIST_NAME}.lock"):
        if target.is_file():
            return target
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root, prefix=".download-") as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--disable-pip-version-check",
                   f"{PACKAGE}=={VERSION}", "-d", tmp]
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise Unavailable(f"{' '.join(cmd)}: {e}") from None
            got = Path(tmp) / SDIST_NAME
            if p.returncode != 0 or not got.is_file():
                tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-8:])
                raise Unavailable(f"{' '.join(cmd)} failed (exit status {p.returncode}):\n{tail}")
            digest = _sha256(got)
            if digest != SDIST_SHA256:
                raise Unavailable(f"the downloaded {SDIST_NAME} has sha256 {digest}, expected {SDIST_SHA256}")
            os.replace(got, target)
    return target


def _covered(part: str, done: list[str]) -> bool:
    return "" in done or any(part == d or part.startswith(d.rstrip("/") + "/") for d in done)


def source_dir(*parts: str) -> Path:
    """The llama.cpp folder of the sdist, with ``parts`` (relative paths; none: everything)
    extracted.  Raises :class:`Unavailable` when the source cannot be had."""
    wanted = [p.strip("/") for p in parts] or [""]
    env = os.environ.get("QFORMAT_LLAMA_CPP_SRC")
    if env:
        src = Path(env)
        missing = [p for p in wanted if not (src / p).exists()]
        if missing:
            raise Unavailable(f"QFORMAT_LLAMA_CPP_SRC={env} lacks {', '.join(missing)}")
        return src
    root = cache_root() / "sdist"
    tree = root / TREE
    record = root / f"llama_cpp_python-{VERSION}" / _RECORD

    def done() -> list[str]:
        try:
            return list(json.loads(record.read_text()))
        except (OSError, ValueError):
            return []

    if all(_covered(p, done()) for p in wanted):
        return tree
    tarball = sdist()
    with locked(cache_root() / f"llama_cpp_python-{VERSION}.extract.lock"):
        have = done()
        todo = [p for p in wanted if not _covered(p, have)]
        if todo:
            if not have and _sha256(tarball) != SDIST_SHA256:
                raise Unavailable(f"{tarball} has sha256 {_sha256(tarball)}, expected {SDIST_SHA256}")
            _extract(tarball, root, todo, have)
            record.parent.mkdir(parents=True, exist_ok=True)
            record.write_text(json.dumps(sorted(set(have) | set(todo))))
    missing = [p for p in wanted if p and not (tree / p).exists()]
    if missing:
        raise Unavailable(f"the sdist has no {', '.join(missing)} under {TREE}")
    return tree


def _under(name: str, prefixes: list[str]) -> bool:
    return any(name == p or name.startswith(p + "/") for p in prefixes)


def _extract(tarball: Path, root: Path, parts: list[str], have: list[str]) -> None:
    """Extract the members of ``tarball`` under :data:`TREE` / each of ``parts`` into ``root``
    (tarfile's ``data`` filter: no absolute paths, links out of the tree or device files).  Files
    of parts extracted before (``have``) are not written again: another process may be reading
    them."""
    prefixes = [f"{TREE}/{p}".rstrip("/") for p in parts]
    if "" in parts:
        prefixes = [TREE.split("/")[0]]  # the whole sdist (a build may want its CMake files too)
    done = [f"{TREE}/{p}".rstrip("/") for p in have]
    with tarfile.open(tarball, "r:gz") as tf:
        members = [m for m in tf.getmembers() if _under(m.name, prefixes) and not (m.isfile() and _under(m.name, done))]
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tf.extractall(root, members=members, **kw)


def llama_cpp_source() -> Path:
    """The whole llama.cpp tree (``source_dir()``)."""
    return source_dir()


def require(*parts: str) -> Path:
    """:func:`source_dir` for a test: skips it when the source cannot be had (the reason shown),
    unless ``QFORMAT_REQUIRE_LLAMA_CPP=1``, where that is a failure."""
    import pytest

    try:
        return source_dir(*parts)
    except Unavailable as e:
        if os.environ.get("QFORMAT_REQUIRE_LLAMA_CPP") == "1":
            pytest.fail(f"llama.cpp source unavailable: {e}")
        pytest.skip(f"llama.cpp source unavailable: {e}")
    raise AssertionError("unreachable")


def clear() -> None:
    """Remove the extracted tree (the tarball stays)."""
    shutil.rmtree(cache_root() / "sdist" / f"llama_cpp_python-{VERSION}", ignore_errors=True)
