"""The conversion machinery shared by every source format: canonical repacking, placement in
shards, destinations, atomicity, progress and the command line.

The repack test runs over every valid case of the conformance corpus, so each packing and
parameter feature of the spec (orders, slot orders, planes, streams, row alignment, flat and
grid blocks, group indexes, nested parameters, in-file codebooks) is rewritten canonically
and must decode to the corpus' frozen expected values.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import qformat
from qformat.conformance import compare
from qformat.convert import Checkpoint, convert, describe, formats, get
from qformat.errors import QFormatError

from .helpers import assert_converts, bits_equal

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "conformance" / "v1"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())
VALID = [c for c in MANIFEST["cases"] if c["expect"] == "valid" and c["input"].endswith(".safetensors")]


def _x(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _source(tmp: Path) -> tuple[Path, dict[str, np.ndarray]]:
    x = _x((24, 96))
    p = tmp / "src.safetensors"
    qformat.save_file({"a": qformat.quantize(x, "int", bits=3, group_size=32),
                       "b": qformat.quantize(x, "nf4", double_quant=True),
                       "c": qformat.quantize(x, "mxfp4"),
                       "plain": x[:2]}, p, metadata={"who": "test"})
    return p, qformat.load_file(p)


def test_registry_ids_are_the_converters_names():
    for name in formats():
        assert get(name).name == name


@pytest.mark.parametrize("case", VALID, ids=[c["id"] for c in VALID])
def test_repack_every_valid_corpus_case(case, tmp_path):
    from qformat.checkpoint.source import unchecked

    src = CORPUS / case["input"]
    if any(f.startswith("rank:") and int(f[5:]) > 16 for f in case["features"]):
        # the canonical packing runs along the last axis, which must be 0..15 (SPEC.md §5.5):
        # repack refuses a higher rank by name and writes nothing
        with pytest.raises(QFormatError) as e:
            convert(src, tmp_path / "out.safetensors", from_format="qformat", repack=True)
        assert e.value.code == "CONVERT_UNSUPPORTED" and "rank" in e.value.message
        assert os.listdir(tmp_path) == []
        return
    report = qformat.check([src], digests=True)  # every command verifies recorded digests as it reads (SPEC.md §3.8)
    if report.problems:
        # The one rule (issue 24): what `qformat check` refuses (a payload finding, a digest that
        # does not match, a tensor a reader refuses) convert refuses with check's code, writing
        # nothing; with --no-check (unchecked) it repacks it as below.  "valid" in the corpus is
        # what a reader that does not verify digests decodes: digests-unknown-algorithm (a
        # 'blake3' digest) is such a file, but commands verify digests by default (SPEC.md §3.8,
        # §12.5), and a verifier that cannot verify refuses (DIGEST_UNSUPPORTED, issue 40: it was
        # skipped silently), so convert refuses it and converts it only with --no-check.
        with pytest.raises(QFormatError) as e:
            convert(src, tmp_path / "out.safetensors", from_format="qformat", repack=True)
        assert e.value.code in {p.code for p in report.problems}, (e.value, report.problems)
        assert os.listdir(tmp_path) == []
        with unchecked():
            _repack_valid_case(case, src, tmp_path)
        return
    _repack_valid_case(case, src, tmp_path)


def _repack_valid_case(case, src, tmp_path):
    expected = qformat.load_file(CORPUS / case["expected"]["path"])
    with qformat.safe_open(src) as f:
        refused = any(f.model.tensor_problems.values())
    dst = tmp_path / "out.safetensors"
    if refused:
        # A tensor the reader refuses cannot be described; the converter says so, writes nothing.
        with pytest.raises(QFormatError) as e:
            convert(src, dst, from_format="qformat", repack=True)
        assert e.value.code == "CONVERT_SOURCE_INVALID"
        assert not dst.exists()
        return
    convert(src, dst, from_format="qformat", repack=True)
    # Payload findings of the source (a NaN scale, say) carry over; nothing new may appear,
    # and non-zero padding disappears (the canonical packing writes zero padding).
    before = {(p.code, p.tensor) for f in qformat.check([src]).files for p in f.problems}
    after = {(p.code, p.tensor) for f in qformat.check([dst]).files for p in f.problems}
    assert after <= before - {(c, t) for c, t in before if c == "PADDING_NONZERO"}, (before, after)
    got = qformat.load_file(dst)
    diff = compare(expected, got)
    assert diff is None, diff
    with qformat.safe_open(dst) as f:
        for name in f.keys():
            d = f.descriptor(name) if name in f.model.descriptors else None
            if d is not None:
                assert d["codes"]["packing"] == {"container": 8, "bit_order": "lsb_first", "axis": len(d["shape"]) - 1 if d["shape"] else None}


def test_qformat_source_in_place_and_repacked(tmp_path):
    src, expected = _source(tmp_path)
    out = assert_converts(src, {k: v for k, v in expected.items() if k != "plain"}, tmp_path, detect_as="qformat")
    with qformat.safe_open(out["in_place"]) as f:
        assert f.metadata()["who"] == "test"  # user metadata carried over


def _sharded(tmp: Path) -> tuple[Path, dict[str, np.ndarray]]:
    folder = tmp / "sharded"
    folder.mkdir()
    x = _x((16, 64), 1)
    qformat.save_file({"a": qformat.quantize(x, "int", bits=4, group_size=32), "p1": x[:1]}, folder / "m-1.safetensors")
    qformat.save_file({"b": qformat.quantize(x, "nf4"), "p2": x[:2]}, folder / "m-2.safetensors")
    wm = {}
    for f in ("m-1.safetensors", "m-2.safetensors"):
        with qformat.safe_open(folder / f) as h:
            for n in h.header.entries:
                wm[n] = f
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": wm}))
    (folder / "config.json").write_text('{"model_type": "test"}')
    exp = qformat.load_file(folder / "m-1.safetensors") | qformat.load_file(folder / "m-2.safetensors")
    return folder, exp


@pytest.mark.parametrize("how", ["folder", "index"])
def test_sharded_source_gives_sharded_output(how, tmp_path):
    folder, exp = _sharded(tmp_path)
    src = folder if how == "folder" else folder / "model.safetensors.index.json"
    out = assert_converts(src, exp, tmp_path)
    for mode, dst in out.items():
        assert sorted(os.listdir(dst)) == ["config.json", "m-1.safetensors", "m-2.safetensors", "model.safetensors.index.json"]
        idx = json.loads((dst / "model.safetensors.index.json").read_text())
        assert idx["weight_map"]["a"] == "m-1.safetensors" and idx["weight_map"]["b"] == "m-2.safetensors"
        if mode == "in_place":
            assert (dst / "config.json").read_text() == '{"model_type": "test"}'
        else:  # a repacked checkpoint is qformat's own (tests/convert/test_repack_self_contained.py)
            assert json.loads((dst / "config.json").read_text()) == {
                "model_type": "test", "quantization_config": {"quant_method": "qformat", "spec_version": "1.2"}}  # 1.2: the writer records digests
        rep = qformat.check([dst / "model.safetensors.index.json"])
        assert rep.ok, rep.to_dict()
        got = qformat.load_checkpoint(dst / "model.safetensors.index.json")
        for k, v in exp.items():
            assert bits_equal(got[k], v)[0], k


def test_components_follow_their_codes_into_one_shard(tmp_path):
    """A source whose scale sits in another shard than its codes: the output moves the scale."""
    folder = tmp_path / "split"
    folder.mkdir()
    x = _x((8, 64), 2)
    qt = qformat.quantize(x, "int", bits=4, group_size=32)
    comps = qt.components
    desc = qt.descriptor
    desc["codes"]["tensor"], desc["scale"]["tensor"] = "w.codes", "w.scale"
    from qformat.container import write_file

    meta = {"qformat": json.dumps({"version": "1.0", "tensors": {"w": desc}})}
    write_file(folder / "a.safetensors", {"w.codes": comps["codes"]}, meta)
    write_file(folder / "b.safetensors", {"w.scale": comps["scale"]}, None)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w.codes": "a.safetensors", "w.scale": "b.safetensors"}}))
    # `qformat check` refuses it (a component must sit in its descriptor's file), and so does
    # convert by default (issue 24); --no-check (unchecked) describes it as one checkpoint.
    from qformat.checkpoint.source import unchecked

    with pytest.raises(QFormatError) as e:
        Checkpoint(folder)
    assert e.value.code == "COMPONENT_MISSING"
    dst = tmp_path / "out"
    with unchecked():
        ck = Checkpoint(folder)
        assert ck.file_of("w.scale") == "b.safetensors"
        convert(folder, dst, from_format="qformat")
    idx = json.loads((dst / "model.safetensors.index.json").read_text())
    assert idx["weight_map"]["w.scale"] == "a.safetensors"
    assert bits_equal(qformat.load_checkpoint(dst / "model.safetensors.index.json")["w"], qt.dequantize())[0]


def test_destination_rules(tmp_path):
    src, _ = _source(tmp_path)
    dst = tmp_path / "o.safetensors"
    convert(src, dst)
    with pytest.raises(QFormatError) as e:
        convert(src, dst)
    assert e.value.code == "CONVERT_DESTINATION_INVALID" and "--overwrite" in str(e.value)
    convert(src, dst, overwrite=True, repack=True)
    with pytest.raises(QFormatError) as e:
        convert(src, src, overwrite=True)
    assert e.value.code == "CONVERT_DESTINATION_INVALID"
    with pytest.raises(QFormatError) as e:
        convert(src, tmp_path / "missing-folder" / "x.safetensors")
    assert e.value.code == "CONVERT_DESTINATION_INVALID"


def test_failed_conversion_leaves_nothing_behind(tmp_path, monkeypatch):
    folder, _ = _sharded(tmp_path)
    from qformat.checkpoint import writer

    calls = []
    real = writer.write_planned

    def flaky(path, *args, **kw):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full (simulated)")
        return real(path, *args, **kw)

    monkeypatch.setattr(writer, "write_planned", flaky)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(OSError):
        convert(folder, tmp_path / "out")
    assert sorted(os.listdir(tmp_path)) == before


def test_every_file_is_synced_before_the_rename_and_a_sync_error_fails_the_write(tmp_path, monkeypatch):
    """Files are flushed by a background thread while the next is written; the folder appears
    only after every flush returned, and a failed flush is the write's error (nothing left)."""
    folder, _ = _sharded(tmp_path)
    from qformat.checkpoint import writer

    synced: list[str] = []
    real = writer.fsync_path

    def record(path):
        assert not os.path.exists(tmp_path / "out")  # nothing renamed into place yet
        synced.append(os.path.basename(path))
        real(path)

    monkeypatch.setattr(writer, "fsync_path", record)
    convert(folder, tmp_path / "out")
    shards = sorted(n for n in os.listdir(tmp_path / "out") if n.endswith(".safetensors"))
    assert len(shards) >= 2 and set(shards) <= set(synced)

    def failing(path):
        raise OSError("I/O error (simulated)")

    monkeypatch.setattr(writer, "fsync_path", failing)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(OSError, match="simulated"):
        convert(folder, tmp_path / "out2")
    assert sorted(os.listdir(tmp_path)) == before


def test_unknown_format_and_unknown_from(tmp_path):
    p = tmp_path / "plain.safetensors"
    qformat.save_file({"x": _x((2, 2))}, p)
    with pytest.raises(QFormatError) as e:
        describe(p)
    assert e.value.code == "CONVERT_FORMAT_UNKNOWN"
    with pytest.raises(QFormatError) as e:
        describe(p, from_format="no-such-format")
    assert e.value.code == "CONVERT_FORMAT_UNKNOWN"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qformat", "convert", *args], capture_output=True, text=True, timeout=120)


def test_cli_convert_progress_and_errors(tmp_path):
    folder, exp = _sharded(tmp_path)
    r = _cli(str(folder), str(tmp_path / "out"), "--repack")
    assert r.returncode == 0, r.stderr
    assert "2/2 files" in r.stderr and "[" in r.stderr  # the progress bar, one line per file off a tty
    assert "wrote 2 quantized tensors" in r.stdout
    r = _cli(str(folder), str(tmp_path / "out"))
    assert r.returncode == 2 and "CONVERT_DESTINATION_INVALID" in r.stderr and "Traceback" not in r.stderr
    r = _cli(str(tmp_path / "nothing-here"), str(tmp_path / "o2"))
    assert r.returncode == 2 and "FILE_UNREADABLE" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x01\x00")
    r = _cli(str(bad), str(tmp_path / "o3.safetensors"), "--from", "qformat")
    assert r.returncode == 1 and "HEADER_TOO_SMALL" in r.stderr and "Traceback" not in r.stderr
    r = _cli("--list")
    assert r.returncode == 0 and "gguf" in r.stdout and "gptq" in r.stdout
