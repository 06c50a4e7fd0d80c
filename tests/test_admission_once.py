"""One load reads and parses each safetensors header once (issue 42, item 6), bound to one open file.

A model loader admits its files (``admit_files``: ``qformat check``'s header rules) and then reads
them through ``Admission.open``: the SafeOpen it gets is over the very header, interpretation and
memory map the rules passed, so a file replaced after its admission is never read under the
admitted facts (no cache keyed by path: the parse lives only as long as the load's admission)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import qformat
import qformat.container as container
from qformat.check import Admission, check, check_file, check_index, open_source
from qformat.checkpoint.source import admit_files
from qformat.container import read_header, read_mapped
from qformat.io import open_admitted
from qformat.errors import QFormatError
from qformat.io import SafeOpen, safe_open


def _write(path, seed: int, rows: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, 64)).astype(np.float32)
    b = np.full(3, seed, np.float32)
    qformat.save_file({"w": qformat.quantize(w, "int", bits=4, group_size=32), "b": b}, path)
    with safe_open(path) as f:
        return {k: f.get_tensor(k) for k in f.keys()}


@pytest.fixture
def parses(monkeypatch):
    """The number of header parses (every local read goes through container.parse_header)."""
    n = [0]
    orig = container.parse_header

    def counted(*a, **k):
        n[0] += 1
        return orig(*a, **k)

    monkeypatch.setattr(container, "parse_header", counted)
    return n


def test_admit_then_open_parses_each_header_once(tmp_path, parses):
    p = str(tmp_path / "m.safetensors")
    want = _write(p, 1)
    parses[0] = 0
    adm = admit_files([p])
    assert parses[0] == 1
    with open_admitted(adm, p) as f:
        assert parses[0] == 1  # the admitted parse, not a new one
        assert f.header is adm._opened[p][0] and f.source is adm._sources[p]
        assert sorted(f.keys()) == sorted(want)
        for k, v in want.items():
            np.testing.assert_array_equal(f.get_tensor(k), v)
    adm.check_logical("w")  # payload rules over the same map
    assert parses[0] == 1
    # a path the admission did not read: opened anew, as SafeOpen(path)
    q = str(tmp_path / "other.safetensors")
    _write(q, 2)
    with open_admitted(adm, q) as g:
        assert sorted(g.keys()) == sorted(want)


def test_replaced_file_is_not_read_under_admitted_facts(tmp_path):
    p = str(tmp_path / "m.safetensors")
    want = _write(p, 1)
    other = str(tmp_path / "x.safetensors")
    _write(other, 7, rows=16)  # another size and other values
    adm = admit_files([p])
    os.replace(other, p)  # swapped under the name after admission
    with open_admitted(adm, p) as f:
        # header, interpretation and bytes are all of the admitted file (its inode is mapped)
        assert f.shape("w") == want["w"].shape
        for k, v in want.items():
            np.testing.assert_array_equal(f.get_tensor(k), v)
    adm.check_logical("w")
    # a fresh open reads what is there now
    with SafeOpen(p) as g:
        assert g.shape("w") == (16, 64)


def test_read_mapped_binds_header_and_map_to_one_file(tmp_path):
    p = str(tmp_path / "m.safetensors")
    want = _write(p, 3)
    header, src = open_source(p)
    before = bytes(src._mm[:])
    assert len(before) == header.file_size == os.path.getsize(p)
    _write(str(tmp_path / "y.safetensors"), 4, rows=32)
    os.replace(str(tmp_path / "y.safetensors"), p)
    assert bytes(src._mm[:]) == before  # still the file whose header was read
    np.testing.assert_array_equal(src.array("b"), want["b"])


@pytest.mark.parametrize("content", [None, b"", b"\x01\x00\x00\x00\x00\x00\x00\x00{", b"PK\x03\x04zzzzzzzz"])
def test_read_mapped_errors_are_read_headers(tmp_path, content):
    p = str(tmp_path / "bad.safetensors")
    if content is not None:
        with open(p, "wb") as f:
            f.write(content)
    with pytest.raises(QFormatError) as a:
        read_header(p)
    with pytest.raises(QFormatError) as b:
        read_mapped(p)
    assert (a.value.code, a.value.message) == (b.value.code, b.value.message)


def _sharded(tmp_path) -> tuple[str, list[str]]:
    a, b = str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")
    qformat.save_file({"x": np.ones(4, np.float32)}, a)
    qformat.save_file({"y": qformat.quantize(np.ones((4, 32), np.float32), "int", bits=4, group_size=32)}, b)
    idx = str(tmp_path / "model.safetensors.index.json")
    with open(idx, "w") as f:
        wm = {n: os.path.basename(s) for s in (a, b) for n in read_header(s).entries}
        json.dump({"metadata": {}, "weight_map": wm}, f)
    return idx, [a, b]


def test_index_shards_parsed_once(tmp_path, parses):
    idx, files = _sharded(tmp_path)
    parses[0] = 0
    reports, probs = check_index(idx)
    assert parses[0] == 2 and not probs and all(r.ok for r in reports)
    parses[0] = 0
    adm = Admission(files, idx, digests=False)
    adm.headers()
    assert parses[0] == 2
    with open_admitted(adm, files[1]) as f:
        assert f.is_quantized("y")
    assert parses[0] == 2


@pytest.mark.parametrize("cut", [1, 40])
def test_admission_refuses_as_check_does(tmp_path, cut):
    p = str(tmp_path / "m.safetensors")
    _write(p, 5)
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) - cut)
    first = check_file(p, payload=False).problems[0]
    assert check([p]).problems[0] == first
    with pytest.raises(QFormatError) as e:
        admit_files([p])
    assert (e.value.code, e.value.message, e.value.tensor) == (first.code, first.message, first.tensor)
