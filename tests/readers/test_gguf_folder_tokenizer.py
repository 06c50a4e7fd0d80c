"""The tokenizer of ``qformat convert model.gguf out/`` (issue 42 item 6): made by a forked child
while the weights are written, and saved with its added tokens in tokenizer_config.json.

* The folder is the same, byte for byte, whether the tokenizer files are made in the child or
  in the converting process (``QFORMAT_GGUF_TOKENIZER_INLINE=1``), and the child is used.
* The files are read only once the weights are written: the child works beside the write.
* A refusal in the child (the tokenizer proof) is raised in the parent with its code, field and
  message; another failure there is made again in the parent, which raises it itself, or, when
  it does not fail there, converts; nothing is written on a refusal and no temporary folder is
  left behind.
* tokenizer_config.json holds ``added_tokens_decoder``: the tokens of tokenizer.json's
  ``added_tokens``, the rest of the file as transformers writes it, and the tokenizer loaded
  back is the one loaded without that key (its backend serializes alike).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import qformat_transformers.gguf_layout as gl  # noqa: E402
from qformat.errors import QFormatError, error  # noqa: E402
from qformat_transformers.gguf_layout import convert_gguf  # noqa: E402

from ..gguf_models import hf_model, write_gguf  # noqa: E402

# These tests fork where the worker may have loaded JAX for another test (convert_gguf itself
# does not fork then, _single_threaded): JAX's at-fork hook warns, and the child never uses JAX.
pytestmark = pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")


@functools.lru_cache(maxsize=None)
def _source(root: str, arch: str) -> Path:
    folder = Path(root) / f"hf-{arch}"
    hf_model(arch, folder, tie=arch == "gemma3")
    return write_gguf(folder, Path(root) / f"{arch}.gguf", arch)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("gguf-folder-tokenizer"))


@pytest.fixture
def temp_dir(tmp_path, monkeypatch):
    """Python's temporary folder for the test alone, to see what is left in it."""
    import tempfile

    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _forks(monkeypatch, single_threaded: bool = True) -> list[int]:
    """os.fork's calls, counted; the converting process taken as running no other thread (an
    xdist worker runs execnet's, and may have loaded JAX for another test: the child is then not
    used, see test_no_child_beside_another_thread)."""
    if single_threaded:
        monkeypatch.setattr(gl, "_single_threaded", lambda: True)
    calls: list[int] = []
    real = os.fork

    def fork() -> int:
        calls.append(1)
        return real()

    monkeypatch.setattr(os, "fork", fork)
    return calls


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_child_and_inline_write_the_same_folder(root, tmp_path, monkeypatch, temp_dir, arch):
    src = _source(root, arch)
    forks = _forks(monkeypatch)
    convert_gguf(src, tmp_path / "child")
    assert len(forks) == 1
    monkeypatch.setenv("QFORMAT_GGUF_TOKENIZER_INLINE", "1")
    convert_gguf(src, tmp_path / "inline")
    assert len(forks) == 1  # no fork inline
    a, b = _files(tmp_path / "child"), _files(tmp_path / "inline")
    assert sorted(a) == sorted(b) and "tokenizer.json" in a and "tokenizer_config.json" in a
    assert a == b
    assert not list(temp_dir.iterdir())


def test_model_files_read_once_the_weights_are_written(root, tmp_path, monkeypatch):
    src = _source(root, "llama")
    forks = _forks(monkeypatch)
    seen: list[list[str]] = []
    real = gl._ModelFiles._all

    def _all(self):
        if self._files is None:  # the first read: the staging folder already holds the weights
            seen.append([p.name for p in tmp_path.glob(".qformat-*/model.safetensors")])
        return real(self)

    monkeypatch.setattr(gl._ModelFiles, "_all", _all)
    convert_gguf(src, tmp_path / "out")
    assert seen == [["model.safetensors"]] and len(forks) == 1


def _refused(src: Path, dst: Path, temp_dir: Path) -> QFormatError:
    with pytest.raises(QFormatError) as e:
        convert_gguf(src, dst)
    assert not dst.exists()
    assert not [p for p in dst.parent.iterdir() if p.name.startswith(".qformat-")]
    assert not list(temp_dir.iterdir())
    return e.value


def test_refusal_in_the_child_is_raised_as_it_is(root, tmp_path, monkeypatch, temp_dir):
    src = _source(root, "llama")
    forks = _forks(monkeypatch)
    parent = os.getpid()

    def refuse(text, want, saved):
        assert os.getpid() != parent  # made in the child
        raise error("CONVERT_UNSUPPORTED", "the probe differs (test)", field="tokenizer.ggml.pre")

    monkeypatch.setattr(gl, "_same_tokenizer", refuse)
    e = _refused(src, tmp_path / "out", temp_dir)
    assert (e.code, e.field, e.tensor, e.message) == ("CONVERT_UNSUPPORTED", "tokenizer.ggml.pre", None, "the probe differs (test)")
    assert len(forks) == 1


def test_other_failure_in_the_child_is_made_again_here(root, tmp_path, monkeypatch, temp_dir):
    src = _source(root, "llama")
    forks = _forks(monkeypatch)
    parent = os.getpid()
    calls: list[bool] = []

    def fail(*a, **k):
        calls.append(os.getpid() == parent)  # recorded here only: the child's list is its own
        raise RuntimeError("boom")

    monkeypatch.setattr(gl, "_tokenizer_files", fail)
    with pytest.raises(RuntimeError, match="boom"):
        convert_gguf(src, tmp_path / "out")
    assert calls == [True] and len(forks) == 1
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".qformat-")]
    assert not list(temp_dir.iterdir())


def test_child_that_dies_is_replaced_by_the_parent(root, tmp_path, monkeypatch, temp_dir):
    src = _source(root, "llama")
    monkeypatch.setenv("QFORMAT_GGUF_TOKENIZER_INLINE", "1")
    convert_gguf(src, tmp_path / "inline")
    monkeypatch.delenv("QFORMAT_GGUF_TOKENIZER_INLINE")
    forks = _forks(monkeypatch)
    parent = os.getpid()
    real = gl._tokenizer_files

    def die_in_child(*a, **k):
        if os.getpid() != parent:
            os._exit(3)  # killed, nothing reported
        return real(*a, **k)

    monkeypatch.setattr(gl, "_tokenizer_files", die_in_child)
    convert_gguf(src, tmp_path / "out")
    assert len(forks) == 1
    assert _files(tmp_path / "out") == _files(tmp_path / "inline")
    assert not list(temp_dir.iterdir())


def test_refusal_in_the_parent_stops_the_child(root, tmp_path, monkeypatch, temp_dir):
    src = _source(root, "llama")
    forks = _forks(monkeypatch)

    def refuse(*a, **k):
        raise error("CONVERT_SOURCE_INVALID", "no plan (test)", tensor="blk.0.attn_q.weight")

    monkeypatch.setattr(gl, "plan_moves", refuse)
    e = _refused(src, tmp_path / "out", temp_dir)
    assert e.code == "CONVERT_SOURCE_INVALID" and len(forks) == 1


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_added_tokens_are_in_tokenizer_config(root, tmp_path, arch):
    src = _source(root, arch)
    out = tmp_path / "out"
    convert_gguf(src, out)
    cfg = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    added = cfg.pop("added_tokens_decoder")
    listed = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))["added_tokens"]
    assert listed and added == {str(t.pop("id")): t for t in listed}
    # the rest as transformers saves the tokenizer it builds from the GGUF, beside the same config.json
    ref = tmp_path / "ref"
    ref.mkdir()
    (ref / "config.json").write_bytes((out / "config.json").read_bytes())
    transformers.AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name).save_pretrained(str(ref))
    want = json.loads((ref / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert "added_tokens_decoder" not in want
    assert cfg == want and (out / "tokenizer.json").read_bytes() == (ref / "tokenizer.json").read_bytes()
    # loaded back with the key, the tokenizer is the one loaded without it
    (ref / "tokenizer_config.json").write_bytes((json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode())
    a, b = transformers.AutoTokenizer.from_pretrained(str(out)), transformers.AutoTokenizer.from_pretrained(str(ref))
    assert type(a) is type(b)
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()
    assert {i: t.__getstate__() for i, t in a.added_tokens_decoder.items()} == {i: t.__getstate__() for i, t in b.added_tokens_decoder.items()}
    assert a.special_tokens_map == b.special_tokens_map


def test_no_child_beside_another_thread(root, tmp_path, monkeypatch, temp_dir):
    """A thread of the caller's could hold a lock the child would inherit held: inline then."""
    import threading

    src = _source(root, "llama")
    forks = _forks(monkeypatch, single_threaded=False)
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        convert_gguf(src, tmp_path / "out")
    finally:
        stop.set()
        t.join()
    assert forks == [] and (tmp_path / "out" / "tokenizer.json").is_file()


def test_no_child_to_be_had_converts_inline(root, tmp_path, monkeypatch, temp_dir):
    src = _source(root, "llama")
    _forks(monkeypatch)

    def no_fork() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    convert_gguf(src, tmp_path / "out")
    assert (tmp_path / "out" / "tokenizer.json").is_file()
    assert not list(temp_dir.iterdir())


def test_no_child_beside_jax(monkeypatch):
    """JAX's runtime runs threads of its own (and warns at a fork): inline then."""
    import sys
    import threading

    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.delitem(sys.modules, "jax", raising=False)
    assert gl._single_threaded()
    monkeypatch.setitem(sys.modules, "jax", object())
    assert not gl._single_threaded()
