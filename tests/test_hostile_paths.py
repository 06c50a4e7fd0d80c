"""The one path policy (:mod:`qformat.paths`, issue 40 item 2) for paths read from inside a
folder or file: a source folder's side files and links, a huggingface_hub cache snapshot's
links into its blobs, a sharded index's shard names.

Escapes reproduced here: a snapshot whose ``blobs/`` is itself a link to a folder outside the
cache (a home folder) let convert, dequantize and export copy any file there that a snapshot
entry links to, a 0600 private key included, into the output, world-readable; an index naming a
shard through a link that leaves its folder was read.  (The merge's manifests: test_merge_hostile.py.)
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

import qformat
from qformat import paths
from qformat.checkpoint.output import side_files
from qformat.errors import QFormatError

from .test_side_tree import COMMANDS, _plain


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _snapshot(tmp: Path, make, blobs_link_to: Path | None = None) -> tuple[Path, Path]:
    """A huggingface_hub cache repository holding the source ``make`` builds as snapshot ``rev``
    (every file a link into ``blobs/``, as huggingface_hub lays it out): (snapshot, blobs).  With
    ``blobs_link_to``, ``blobs`` is a link to that folder instead of a folder of the repository."""
    src = make(tmp)
    repo = tmp / "hub" / "models--org--tiny"
    snap = repo / "snapshots" / "rev"
    snap.mkdir(parents=True)
    if blobs_link_to is not None:
        os.symlink(blobs_link_to, repo / "blobs")
    else:
        (repo / "blobs").mkdir()
    blobs = repo / "blobs"
    for i, p in enumerate(sorted(q for q in src.rglob("*") if q.is_file() and not q.is_symlink() and ".git" not in q.parts
                                 and ".cache" not in q.parts and not q.name.startswith(".qformat-"))):
        rel = p.relative_to(src)
        (blobs / f"blob{i:03d}").write_bytes(p.read_bytes())
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blobs / f"blob{i:03d}", (snap / rel).parent), snap / rel)
    return snap, blobs


# -- hub cache ------------------------------------------------------------------------------
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_blobs_folder_that_links_out_of_the_cache_is_not_followed(command, tmp_path, umask022):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    os.chmod(key, 0o600)
    make, run = COMMANDS[command]
    snap, blobs = _snapshot(tmp_path, make, blobs_link_to=home)  # the blobs land in the home folder
    os.symlink("../../blobs/.ssh/id_ed25519", snap / "tokenizer.json.bak")
    dst = tmp_path / "out"
    with pytest.raises(QFormatError) as e:
        run(snap, dst)
    assert e.value.code == "CONVERT_SOURCE_INVALID", e.value
    assert "outside the folder" in e.value.message
    assert not dst.exists() and not [n for n in os.listdir(tmp_path) if n.startswith(".qformat-")]


def test_a_snapshot_link_to_a_blob_below_blobs_is_refused(tmp_path):
    snap, blobs = _snapshot(tmp_path, _plain)
    (blobs / "deeper").mkdir()
    (blobs / "deeper" / "x").write_text("{}")
    os.symlink("../../blobs/deeper/x", snap / "extra.json")
    with pytest.raises(QFormatError, match="extra.json") as e:
        side_files(str(snap))
    assert e.value.code == "CONVERT_SOURCE_INVALID"


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_real_snapshot_is_carried_whole(command, tmp_path, umask022):
    make, run = COMMANDS[command]
    snap, _ = _snapshot(tmp_path, make)
    dst = tmp_path / "out"
    run(snap, dst)
    assert json.loads((dst / "1_Pooling" / "config.json").read_text())["pooling_mode_mean_tokens"] is True
    assert (dst / "tokenizer.json").is_file() and not (dst / "tokenizer.json").is_symlink()


# -- the mode of copies ---------------------------------------------------------------------
@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("source_mode,want", [(0o600, 0o600), (0o640, 0o640), (0o644, 0o644), (0o666, 0o644), (0o755, 0o644)])
def test_a_copied_side_file_is_never_wider_than_its_source(command, source_mode, want, tmp_path, umask022):
    make, run = COMMANDS[command]
    src = make(tmp_path)
    os.chmod(src / "tokenizer.json", source_mode)
    os.chmod(src / "1_Pooling" / "config.json", source_mode)
    dst = tmp_path / "out"
    run(src, dst)
    assert _mode(dst / "tokenizer.json") == want
    assert _mode(dst / "1_Pooling" / "config.json") == want
    assert _mode(dst / "1_Pooling") == 0o755


def test_a_private_blob_of_a_snapshot_stays_private(tmp_path, umask022):
    snap, blobs = _snapshot(tmp_path, _plain)
    target = os.path.realpath(snap / "tokenizer.json")
    os.chmod(target, 0o600)
    dst = tmp_path / "out"
    qformat.quantize_checkpoint(snap, dst, scheme="int", bits=4, group_size=32)
    assert _mode(dst / "tokenizer.json") == 0o600
    assert _mode(dst / "README.md") == 0o644


def test_copy_mode_is_the_default_mode_intersected_with_the_source(umask022):
    assert paths.copy_mode(0o100600) == 0o600
    assert paths.copy_mode(0o100777) == 0o644
    old = os.umask(0o077)
    try:
        assert paths.copy_mode(0o100644) == 0o600
    finally:
        os.umask(old)


# -- a source folder's own entries ------------------------------------------------------------
@pytest.mark.parametrize("entry", ["config.json", "model.safetensors"])
def test_a_source_entry_that_links_out_of_the_folder_is_refused(entry, tmp_path):
    src = _plain(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.move(str(src / entry), outside / entry)
    os.symlink(outside / entry, src / entry)
    dst = tmp_path / "out"
    with pytest.raises(QFormatError) as e:
        qformat.quantize_checkpoint(src, dst, scheme="int", bits=4, group_size=32)
    assert e.value.code == "CONVERT_SOURCE_INVALID" and entry in e.value.message and "outside the folder" in e.value.message
    assert not dst.exists()


def test_a_source_entry_linking_inside_the_folder_is_read(tmp_path):
    src = _plain(tmp_path)
    (src / "real").mkdir()
    shutil.move(str(src / "config.json"), src / "real" / "config.json")
    os.symlink("real/config.json", src / "config.json")
    qformat.quantize_checkpoint(src, tmp_path / "out", scheme="int", bits=4, group_size=32)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]["quant_method"] == "qformat"


# -- sharded indexes: shard names --------------------------------------------------------------
def _sharded(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    x = np.arange(64, dtype=np.float32).reshape(2, 32)
    qformat.save_file({"a": x}, folder / "m-1.safetensors")
    qformat.save_file({"b": x + 1}, folder / "m-2.safetensors")
    idx = folder / "model.safetensors.index.json"
    idx.write_text(json.dumps({"metadata": {}, "weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors"}}))
    return idx


def _name_shard(idx: Path, name: str) -> None:
    obj = json.loads(idx.read_text())
    obj["weight_map"]["b"] = name
    idx.write_text(json.dumps(obj))


def _readers(idx: Path) -> dict[str, object]:
    """Every way a sharded index is opened, each giving its first coded error (or None)."""
    def first(fn) -> str | None:  # type: ignore[no-untyped-def]
        try:
            fn()
        except QFormatError as e:
            return e.code
        return None

    report = qformat.check([str(idx)])
    return {
        "load_file": first(lambda: qformat.load_file(idx)),
        "safe_open": first(lambda: qformat.safe_open(idx).close()),
        "load_checkpoint": first(lambda: qformat.load_checkpoint(idx)),
        "check": sorted({p.code for p in report.problems}),
        "convert": first(lambda: qformat.dequantize_checkpoint(idx, idx.parent.parent / "deq")),
    }


@pytest.mark.parametrize("how", ["dotdot", "absolute", "link-out", "link-to-folder", "fifo"])
def test_an_index_shard_outside_its_folder_is_index_invalid(how, tmp_path):
    idx = _sharded(tmp_path / "ck")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.move(str(tmp_path / "ck" / "m-2.safetensors"), outside / "m-2.safetensors")
    name = {"dotdot": "../elsewhere/m-2.safetensors", "absolute": str(outside / "m-2.safetensors")}.get(how, "m-2.safetensors")
    if how == "link-out":
        os.symlink(outside / "m-2.safetensors", tmp_path / "ck" / "m-2.safetensors")
    elif how == "link-to-folder":
        os.symlink(outside, tmp_path / "ck" / "m-2.safetensors")
    elif how == "fifo":
        os.mkfifo(tmp_path / "ck" / "m-2.safetensors")
    _name_shard(idx, name)
    got = _readers(idx)
    assert got == {"load_file": "INDEX_INVALID", "safe_open": "INDEX_INVALID", "load_checkpoint": "INDEX_INVALID",
                   "check": ["INDEX_INVALID"], "convert": "INDEX_INVALID"}, got
    assert not (tmp_path / "deq").exists()


def test_an_index_in_a_hub_snapshot_reads_its_shards_through_the_blobs(tmp_path):
    src = tmp_path / "src"
    _sharded(src)
    snap, _ = _snapshot(tmp_path, lambda t: src)
    idx = snap / "model.safetensors.index.json"
    assert _readers(idx) == {"load_file": None, "safe_open": None, "load_checkpoint": None, "check": [], "convert": None}
    assert sorted(qformat.load_file(idx)) == ["a", "b"]


def test_an_index_shard_linking_inside_its_folder_is_read(tmp_path):
    idx = _sharded(tmp_path / "ck")
    (tmp_path / "ck" / "store").mkdir()
    shutil.move(str(tmp_path / "ck" / "m-2.safetensors"), tmp_path / "ck" / "store" / "m-2.safetensors")
    os.symlink("store/m-2.safetensors", tmp_path / "ck" / "m-2.safetensors")
    assert sorted(qformat.load_file(idx)) == ["a", "b"] and qformat.check([str(idx)]).ok


# -- the policy's name rule itself ---------------------------------------------------------------
@pytest.mark.parametrize("name", ["", "..", ".", "../x", "a/../../x", "/etc/passwd", "C:x", "a\\b", "a//b", "a/", "x\0y", 3, None])
def test_names_that_could_leave_the_root_are_refused(name):
    with pytest.raises(QFormatError) as e:
        paths.parts(name, code="INDEX_INVALID", root="/r", field="weight_map")
    assert e.value.code == "INDEX_INVALID" and e.value.field == "weight_map" and "/r" in e.value.message


@pytest.mark.parametrize("name,want", [("a", ["a"]), ("a/b.json", ["a", "b.json"]), ("..a", ["..a"]), ("a..b/c", ["a..b", "c"])])
def test_plain_relative_names_are_accepted(name, want):
    assert paths.parts(name, code="INDEX_INVALID", root="/r") == want


def test_source_file_follows_links_only_while_they_stay_inside(tmp_path):
    (tmp_path / "root" / "d").mkdir(parents=True)
    (tmp_path / "root" / "d" / "f").write_text("x")
    (tmp_path / "out.txt").write_text("y")
    os.symlink("d/f", tmp_path / "root" / "in")
    os.symlink(tmp_path / "out.txt", tmp_path / "root" / "up")
    os.symlink(tmp_path, tmp_path / "root" / "dir-up")
    assert paths.source_file(tmp_path / "root", "d/f", code="INDEX_INVALID") == str(tmp_path / "root" / "d" / "f")
    assert paths.source_file(tmp_path / "root", "in", code="INDEX_INVALID") == str(tmp_path / "root" / "d" / "f")
    assert paths.source_file(tmp_path / "root", "none", code="INDEX_INVALID") is None
    for name in ("up", "dir-up/out.txt"):
        with pytest.raises(QFormatError, match="outside the folder"):
            paths.source_file(tmp_path / "root", name, code="INDEX_INVALID")
    with pytest.raises(QFormatError, match="is a folder"):
        paths.source_file(tmp_path / "root", "d", code="INDEX_INVALID")


# -- save_pretrained of a model loaded through qformat (readers/qformat_transformers/saving.py) ---
def _saving():
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    from qformat_transformers import saving

    return saving


@pytest.mark.parametrize("source_mode,want", [(0o600, 0o600), (0o640, 0o640), (0o644, 0o644), (0o666, 0o644)])
def test_save_pretrained_copies_are_never_wider_than_their_source(source_mode, want, tmp_path, umask022):
    """save_pretrained's copies of the loaded folder's side files (copy_missing) get the mode of
    every other copy (paths.copy_mode): a 0600 file stays 0600."""
    saving = _saving()
    src = _plain(tmp_path)
    os.chmod(src / "tokenizer.json", source_mode)
    os.chmod(src / "1_Pooling" / "config.json", source_mode)
    dst = tmp_path / "saved"
    dst.mkdir()
    side = saving.side_tree(str(src), dst)
    copied = saving.copy_missing(side, dst, root=str(src))
    assert "tokenizer.json" in copied and "1_Pooling/config.json" in copied
    assert (dst / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    assert _mode(dst / "tokenizer.json") == want
    assert _mode(dst / "1_Pooling" / "config.json") == want
    assert not [n for n in os.listdir(dst) if n.startswith(".qformat-")]


def test_save_pretrained_copies_a_snapshot_through_its_blobs(tmp_path, umask022):
    saving = _saving()
    snap, _ = _snapshot(tmp_path, _plain)
    dst = tmp_path / "saved"
    dst.mkdir()
    copied = saving.copy_missing(saving.side_tree(str(snap), dst), dst, root=str(snap))
    assert "tokenizer.json" in copied and not (dst / "tokenizer.json").is_symlink()
    assert json.loads((dst / "1_Pooling" / "config.json").read_text())["pooling_mode_mean_tokens"] is True


def test_save_pretrained_refuses_a_side_file_that_now_links_out(tmp_path, umask022):
    """The loaded folder's side files are listed before the save and copied after it: a name that
    has become a link leaving the folder by then is refused at the copy (the path policy), and
    nothing is copied."""
    saving = _saving()
    src = _plain(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("PRIVATE")
    os.chmod(secret, 0o600)
    dst = tmp_path / "saved"
    dst.mkdir()
    side = saving.side_tree(str(src), dst)
    os.remove(src / "tokenizer.json")
    os.symlink(secret, src / "tokenizer.json")  # while transformers' save ran
    with pytest.raises(QFormatError) as e:
        saving.copy_missing(side, dst, root=str(src))
    assert e.value.code == "CONVERT_SOURCE_INVALID" and "tokenizer.json" in e.value.message, e.value
    assert "outside the folder" in e.value.message
    assert os.listdir(dst) == []


@pytest.mark.parametrize("how", ["dotdot", "absolute", "link-out"])
def test_reshard_refuses_a_shard_outside_the_save(how, tmp_path):
    """reshard rewrites the shards an index names: a name leaving the save folder ('..', an
    absolute path, a link out) was read, rewritten and replaced outside it."""
    saving = _saving()
    save = tmp_path / "saved"
    idx = _sharded(save)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.move(str(save / "m-2.safetensors"), outside / "m-2.safetensors")
    before = (outside / "m-2.safetensors").read_bytes(), os.stat(outside / "m-2.safetensors").st_ino
    if how == "link-out":
        os.symlink(outside / "m-2.safetensors", save / "m-2.safetensors")
    _name_shard(idx, {"dotdot": "../elsewhere/m-2.safetensors", "absolute": str(outside / "m-2.safetensors")}.get(how, "m-2.safetensors"))
    index_before = idx.read_bytes()
    with pytest.raises(QFormatError) as e:
        saving.reshard(str(idx), {})
    assert e.value.code == "INDEX_INVALID" and e.value.field == "weight_map", e.value
    assert ((outside / "m-2.safetensors").read_bytes(), os.stat(outside / "m-2.safetensors").st_ino) == before
    assert sorted(os.listdir(outside)) == ["m-2.safetensors"] and sorted(os.listdir(tmp_path)) == ["elsewhere", "saved"]
    assert idx.read_bytes() == index_before and not [n for n in os.listdir(save) if "qformat-tmp" in n]


def test_reshard_of_plain_shard_names_still_works(tmp_path):
    saving = _saving()
    idx = _sharded(tmp_path / "saved")
    saving.reshard(str(idx), {})
    assert sorted(qformat.load_file(idx)) == ["a", "b"]


# -- qformat check of a folder: the files it lists ---------------------------------------------------
@pytest.mark.parametrize("entry", ["b.safetensors", "model.safetensors.index.json"])
def test_check_of_a_folder_does_not_read_a_link_leaving_it(entry, tmp_path):
    """``qformat check FOLDER`` reads every ``*.safetensors`` (and index) it lists: one that is a
    link leaving the folder is reported (FILE_UNREADABLE, naming it) and not read."""
    ck = tmp_path / "ck"
    ck.mkdir()
    x = np.arange(64, dtype=np.float32).reshape(2, 32)
    qformat.save_file({"a": x}, ck / "a.safetensors")
    outside = tmp_path / "outside"
    outside.mkdir()
    qformat.save_file({"b": x}, outside / "b.safetensors")
    (outside / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"b": "b.safetensors"}}))
    os.symlink(outside / entry, ck / entry)
    report = qformat.check([str(ck)])
    assert [(p.code, os.path.basename(p.file)) for p in report.problems] == [("FILE_UNREADABLE", entry)], report.problems
    assert "outside the folder" in report.problems[0].message and entry in report.problems[0].message
    assert [os.path.basename(f.path) for f in report.files] == ["a.safetensors"]  # the link's target was never read


def test_check_of_a_folder_reads_links_inside_it_and_hub_snapshots(tmp_path):
    ck = tmp_path / "ck"
    (ck / "store").mkdir(parents=True)
    qformat.save_file({"a": np.ones((2, 32), np.float32)}, ck / "store" / "a.safetensors")
    os.symlink("store/a.safetensors", ck / "a.safetensors")
    assert qformat.check([str(ck)]).ok
    plain = tmp_path / "plain"
    plain.mkdir()
    qformat.save_file({"a": np.ones((2, 32), np.float32)}, plain / "a.safetensors")
    snap, _ = _snapshot(tmp_path, lambda t: plain)  # every entry a link into the repository's blobs/
    report = qformat.check([str(snap)])
    assert report.ok and [os.path.basename(f.path) for f in report.files] == ["a.safetensors"]
