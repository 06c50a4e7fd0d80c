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
