"""Files and folders qformat writes get ordinary permissions under the current umask.

The writers create private temporaries (so nobody reads a half-written file) and rename them
into place; the result must still be readable by another user or service, as a plain
``open()`` or ``mkdir()`` would have made it, and a replaced file keeps its own mode.
"""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

import qformat
from qformat.convert import convert


def _mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.fixture
def umask():
    def set_(mask: int) -> None:
        os.umask(mask)

    old = os.umask(0o022)
    yield set_
    os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002])
def test_save_file_follows_the_umask(tmp_path, umask, mask):
    umask(mask)
    p = tmp_path / "m.safetensors"
    qformat.save_file({"w": qformat.quantize(np.ones((4, 64), np.float32), "nf4")}, p)
    assert _mode(p) == 0o666 & ~mask


def test_replacing_a_file_keeps_its_mode(tmp_path, umask):
    umask(0o022)
    p = tmp_path / "m.safetensors"
    qformat.save_file({"x": np.zeros(3, np.float32)}, p)
    os.chmod(p, 0o640)
    qformat.save_file({"x": np.ones(3, np.float32)}, p)
    assert _mode(p) == 0o640


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_converted_folder_and_its_files_follow_the_umask(tmp_path, umask, mask):
    umask(0o022)
    src = tmp_path / "src"
    src.mkdir()
    q = qformat.quantize(np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32), "int", bits=4, group_size=32)
    qformat.save_file({"a.weight": q}, src / "model.safetensors")
    (src / "config.json").write_text("{}")
    umask(mask)
    dst = tmp_path / "out"
    convert(src, dst, from_format="qformat")
    assert _mode(dst) == 0o777 & ~mask
    for f in os.listdir(dst):
        assert _mode(dst / f) == 0o666 & ~mask, f


# -- what cannot be read (issue 40): an OS error on a read is FILE_UNREADABLE naming the path ----
_CONVERT = """
import sys
from qformat.convert import convert
def run():
    convert(sys.argv[1], sys.argv[2])
"""

_MERGE = """
import sys
from qformat.checkpoint.split import merge
def run():
    merge(sys.argv[1])
"""


def _open_tree(root) -> None:
    """Everything under ``root`` readable by anyone (the child may run as an ordinary user)."""
    for dirpath, dirs, files in os.walk(root):
        os.chmod(dirpath, 0o777)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o666)


@pytest.mark.parametrize("entry,mode", [("tokenizer.json", 0), ("1_Pooling", 0), ("1_Pooling/config.json", 0),
                                        ("config.json", 0), ("model.safetensors", 0), (".", 0o333)])
def test_an_unreadable_source_entry_is_file_unreadable(tmp_path, entry, mode):
    from .test_side_tree import _quantized
    from .unprivileged import outcome

    src = _quantized(tmp_path)
    _open_tree(tmp_path)
    target = src / entry
    os.chmod(target, mode)
    try:
        kind, msg = outcome(_CONVERT, str(src), str(tmp_path / "out"))
    finally:
        os.chmod(target, 0o777 if target.is_dir() else 0o666)
    assert kind == "CODED FILE_UNREADABLE", (kind, msg)
    assert str(target).rstrip("/.") in msg and "Permission denied" in msg, msg
    assert not (tmp_path / "out").exists() and not [n for n in os.listdir(tmp_path) if n.startswith(".qformat-")]


@pytest.mark.parametrize("entry", ["part-1-of-2/tree/tokenizer.json", "part-2-of-2/shards", "part-2-of-2/shards/*",
                                   "part-1-of-2/part.json"])
def test_an_unreadable_part_file_is_file_unreadable(tmp_path, entry):
    from .test_split_convert import INT4, _llama
    from .unprivileged import outcome
    from qformat.checkpoint import split

    src = tmp_path / "src"
    _llama(src)
    out = tmp_path / "out"
    for k in (1, 2):
        qformat.quantize_checkpoint(src, out, part=f"{k}/2", **INT4)
    _open_tree(tmp_path)
    target = sorted((tmp_path / "out.parts").glob(entry))[0]
    os.chmod(target, 0)
    try:
        kind, msg = outcome(_MERGE, str(out))
    finally:
        os.chmod(target, 0o777 if target.is_dir() else 0o666)
    assert kind == "CODED FILE_UNREADABLE", (kind, msg)
    assert str(target) in msg, msg
    assert not out.exists() and (tmp_path / "out.parts" / "part-2-of-2" / "part.json").is_file()
    split.merge(out)  # readable again: the refused merge changed nothing
