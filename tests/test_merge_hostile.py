"""``qformat merge`` given part folders from strangers (issue 40, items 2 and 6).

A part folder is copied between hosts; whoever can write it can edit its manifest too.  The
merge must never write outside ``DST`` (a ``..`` or absolute name in a manifest's ``tree``,
``assignment`` or ``files``), never follow a link or copy something that is not a regular file
found in a part, verify every staged byte (its SHA-256 and the recorded tensor digests) and
``qformat check`` the merged folder before it is moved into place, and refuse a second merge
into the same destination while one runs.  Each refusal is SPLIT_PART_INVALID (or
FILE_UNREADABLE) and writes nothing.

The manifests below are edited *consistently* (sizes and digests recomputed), as an attacker
would: each case checks what the merge does, not that a digest was forgotten.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

import qformat
from qformat.checkpoint import split
from qformat.errors import QFormatError

from .test_split_convert import INT4, _cli, _llama


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> Path:
    """A finished staging folder of a 2-part quantize (kept pristine: each test copies it)."""
    base = tmp_path_factory.mktemp("hostile-merge")
    src = base / "src"
    _llama(src)
    out = base / "out"
    for k in (1, 2):
        qformat.quantize_checkpoint(src, out, part=f"{k}/2", **INT4)
    return Path(split.staging_folder(out))


@pytest.fixture
def run(staged, tmp_path) -> "Run":
    return Run(staged, tmp_path)


class Run:
    """A copy of the staging folder under ``tmp_path / "out.parts"`` with a victim file beside it."""

    def __init__(self, staged: Path, tmp: Path):
        self.tmp = tmp
        self.out = tmp / "out"
        self.staging = Path(split.staging_folder(self.out))
        shutil.copytree(staged, self.staging, symlinks=True)
        self.victim = tmp / "victim.txt"
        self.victim.write_text("the user's own file")
        self.before = self.snapshot()

    def part(self, k: int) -> Path:
        return self.staging / f"part-{k}-of-2"

    def manifest(self, k: int) -> dict[str, Any]:
        return json.loads((self.part(k) / "part.json").read_text())

    def edit(self, k: int, fn: Callable[[dict[str, Any]], None]) -> None:
        m = self.manifest(k)
        fn(m)
        (self.part(k) / "part.json").write_text(json.dumps(m))

    def snapshot(self) -> dict[str, bytes]:
        """Every file under tmp but the staging folder (what a refused merge must leave alone)."""
        out = {}
        for p in sorted(self.tmp.rglob("*")):
            if self.staging in p.parents or p == self.staging or p.is_dir():
                continue
            out[str(p.relative_to(self.tmp))] = os.readlink(p).encode() if p.is_symlink() else p.read_bytes()
        return out

    def refused(self, *words: str, code: str = "SPLIT_PART_INVALID") -> QFormatError:
        with pytest.raises(QFormatError) as e:
            split.merge(self.out)
        assert e.value.code == code, e.value
        for wd in words:
            assert wd in str(e.value), (wd, str(e.value))
        self.nothing_written()
        return e.value

    def nothing_written(self) -> None:
        assert not self.out.exists() and not os.path.lexists(self.out)
        assert self.snapshot() == self.before, "a refused merge wrote outside the staging folder"
        assert not [n for n in os.listdir(self.tmp) if n.startswith(".qformat-")]


def _record(m: dict[str, Any], key: str, name: str, data: bytes) -> None:
    """Record ``data`` as the file ``name`` of the manifest's ``files`` or ``tree``, consistently
    (whatever members the manifest's version records)."""
    rec: dict[str, Any] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    if key == "files":
        hlen = int.from_bytes(data[:8], "little") if len(data) >= 8 else 0
        rec["header_sha256"] = hashlib.sha256(data[:8 + hlen]).hexdigest()
    if isinstance(m[key], list):  # an older manifest's tree: names only
        m[key] += [] if name in m[key] else [name]
        return
    old = m[key].get(name, {})
    m[key][name] = {k: v for k, v in rec.items() if not old or k in old} if old else rec


# -- names that leave the destination -------------------------------------------------------
@pytest.mark.parametrize("name", ["../victim.txt", "sub/../../victim.txt", "/abs/victim.txt", "a//b.txt", "a\\b.txt",
                                  "./c.txt", "x\0y"])
def test_a_tree_name_that_leaves_the_destination_is_refused(run, name):
    data = b"PWNED by a part manifest\n"
    staged = os.path.normpath(os.path.join(run.part(1) / "tree", *name.split("/"))) if "\0" not in name else None
    if staged and run.staging in Path(staged).parents:
        os.makedirs(os.path.dirname(staged), exist_ok=True)
        (run.part(1) / "tree" / "sub").mkdir(exist_ok=True)  # so that sub/.. resolves
        Path(staged).write_bytes(data)
    run.edit(1, lambda m: _record(m, "tree", name, data))
    e = run.refused(repr(name))
    assert e.field == "tree"
    assert run.victim.read_text() == "the user's own file"


@pytest.mark.parametrize("name", ["../victim.txt", "{victim}", "sub/model.safetensors", ".."])
def test_a_planned_file_name_that_leaves_the_destination_is_refused(run, name):
    name = name.format(victim=run.victim)  # an absolute name: the victim itself
    m1 = run.manifest(1)
    old = sorted(f for f, k in m1["assignment"].items() if k == 1)[0]
    shard = run.part(1) / "shards" / old
    data = shard.read_bytes()
    staged = Path(os.path.normpath(os.path.join(run.part(1) / "shards", name)))
    if name != ".." and run.staging in staged.parents:  # where an unchecked merge would find the file
        staged.parent.mkdir(parents=True, exist_ok=True)
        shard.rename(staged)

    def rename(m: dict[str, Any]) -> None:
        m["assignment"][name] = m["assignment"].pop(old)
        if old in m["files"]:
            m["files"][name] = m["files"].pop(old)

    run.edit(1, rename)
    run.edit(2, rename)
    e = run.refused(repr(name))
    assert e.field == "assignment"
    assert run.victim.read_text() == "the user's own file" and len(data) > 0


def test_a_tree_name_colliding_with_a_shard_or_temporary_is_refused(run):
    m1 = run.manifest(1)
    shard = sorted(m1["assignment"])[0]
    data = b"{}"
    (run.part(1) / "tree" / shard).write_bytes(data)
    run.edit(1, lambda m: _record(m, "tree", shard, data))
    run.refused("both as a planned file and in its tree")


# -- what a part folder holds: regular files and folders only -----------------------------
def _link_cases(run: Run) -> dict[str, Callable[[], None]]:
    secret = run.tmp / "secret.txt"

    def tree_file() -> None:  # a side file of the tree replaced by a link to a file outside
        p = run.part(1) / "tree" / "tokenizer.json"
        p.unlink()
        os.symlink(secret, p)
        run.edit(1, lambda m: _record(m, "tree", "tokenizer.json", secret.read_bytes()))

    def tree_inside() -> None:  # even a link inside the part: a part folder holds none
        p = run.part(1) / "tree" / "tokenizer.json"
        p.unlink()
        os.symlink("config.json", p)
        run.edit(1, lambda m: _record(m, "tree", "tokenizer.json", (run.part(1) / "tree" / "config.json").read_bytes()))

    def tree_folder() -> None:  # a subfolder of the tree replaced by a link to a folder outside
        outside = run.tmp / "elsewhere"
        outside.mkdir()
        (outside / "config.json").write_bytes((run.part(1) / "tree" / "1_Pooling" / "config.json").read_bytes())
        shutil.rmtree(run.part(1) / "tree" / "1_Pooling")
        os.symlink(outside, run.part(1) / "tree" / "1_Pooling")

    def shard() -> None:  # a shard replaced by a link to a copy of itself outside
        p = sorted((run.part(2) / "shards").iterdir())[0]
        copy = run.tmp / "shard-copy.safetensors"
        copy.write_bytes(p.read_bytes())
        p.unlink()
        os.symlink(copy, p)

    def part_folder() -> None:  # the part folder itself a link to a folder elsewhere
        moved = run.tmp / "moved-part-2"
        run.part(2).rename(moved)
        os.symlink(moved, run.part(2))

    def fifo() -> None:  # a named pipe where a side file was
        p = run.part(1) / "tree" / "tokenizer.json"
        p.unlink()
        os.mkfifo(p)

    return {"tree-file": tree_file, "tree-inside": tree_inside, "tree-folder": tree_folder, "shard": shard,
            "part-folder": part_folder, "fifo": fifo}


@pytest.mark.parametrize("case", ["tree-file", "tree-inside", "tree-folder", "shard", "part-folder", "fifo"])
def test_links_and_special_files_in_a_part_are_refused(run, case):
    secret = run.tmp / "secret.txt"
    secret.write_text("root:x:0:0:a system file's contents\n")
    _link_cases(run)[case]()
    run.before = run.snapshot()
    e = run.refused()
    assert "link" in e.message or "not a regular file" in e.message, e.message
    assert secret.read_text().startswith("root:x")


# -- bytes: each staged file verified, the merged folder checked before it is moved ----------
def _shard(run: Run, k: int = 2) -> Path:
    return sorted((run.part(k) / "shards").iterdir())[0]


def test_a_truncated_shard_with_an_edited_manifest_is_refused(run):
    p = _shard(run)
    data = p.read_bytes()[:-100]
    p.write_bytes(data)
    run.edit(2, lambda m: _record(m, "files", p.name, data))
    run.refused("qformat check", "DATA_TRUNCATED", str(p))


def test_a_changed_byte_with_an_edited_manifest_is_refused_by_the_digests(run):
    p = _shard(run)
    data = bytearray(p.read_bytes())
    data[-1] ^= 0x01  # the last byte of the last tensor: every structural rule still holds
    p.write_bytes(bytes(data))
    run.edit(2, lambda m: _record(m, "files", p.name, bytes(data)))
    run.refused("DIGEST_MISMATCH", str(p))


def test_a_changed_byte_is_refused_by_the_manifest_sha256(run):
    p = _shard(run)
    data = bytearray(p.read_bytes())
    data[-1] ^= 0x01
    p.write_bytes(bytes(data))
    run.refused("SHA-256", str(p))


def test_a_changed_side_file_is_refused(run):
    p = run.part(1) / "tree" / "tokenizer.json"
    p.write_text('{"t": 2}')  # same size, other bytes
    run.refused("SHA-256", "tokenizer.json")


def test_a_manifest_of_version_1_is_refused_clearly(run):
    run.edit(2, lambda m: m.update(version=1))
    run.refused("version 1", "rerun that part")


_BAD_MEMBERS: dict[str, Callable[[dict[str, Any]], None]] = {
    "tree-as-list": lambda m: m.update(tree=["config.json"]),
    "tree-record-string": lambda m: m["tree"].update({"config.json": "x"}),
    "size-as-text": lambda m: next(iter(m["files"].values())).update(size="10"),
    "sha-not-hex": lambda m: next(iter(m["files"].values())).update(sha256="z" * 64),
    "part-as-bool": lambda m: m.update(part=True),
    "parts-zero": lambda m: m.update(parts=0),
    "unknown-command": lambda m: m.update(command="rm"),
    "source-as-text": lambda m: m.update(source="x"),
    "assignment-part-99": lambda m: m["assignment"].update({next(iter(m["assignment"])): 99}),
    "assignment-name-int": lambda m: m.update(assignment=[1, 2]),
    "index-as-number": lambda m: m.update(index=3),
    "no-seconds": lambda m: m.pop("seconds"),
    "not-an-object": lambda m: (m.clear(), m.update(format="qformat-split-part", version=2, part=1, parts=2)),
}


@pytest.mark.parametrize("bad", list(_BAD_MEMBERS))
def test_a_malformed_manifest_is_a_coded_error(run, bad):
    run.edit(1, _BAD_MEMBERS[bad])
    run.refused()


@pytest.mark.parametrize("text", [b"", b"[]", b"{", b'{"format": "qformat-split-part", "format": "x"}', b"\xff\xfe",
                                  b"[" * 100_000, b'{"a": 1} trailing'])
def test_manifest_text_that_is_not_one_json_object_is_a_coded_error(run, text):
    (run.part(2) / "part.json").write_bytes(text)
    run.refused("part-2-of-2")


def test_the_merged_files_are_never_wider_than_the_default_mode(run):
    old = os.umask(0o022)
    try:
        os.chmod(run.part(1) / "tree" / "tokenizer.json", 0o666)  # widened in the staging folder
        os.chmod(run.part(1) / "tree" / "config.json", 0o600)  # a private one stays private
        split.merge(run.out)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(run.out / "tokenizer.json").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(run.out / "config.json").st_mode) == 0o600
    assert qformat.check([str(run.out)]).ok


def test_an_existing_destination_that_is_a_link_is_replaced_itself(run, tmp_path):
    """``merge --overwrite`` onto a destination that is a link replaces the link, never what it
    points at, and leaves no moved-aside ``.qformat-old-*`` behind (found by the atheris merge
    target: the old link was moved aside and rmtree, which refuses links, left it there)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("not the merge's")
    run.out.symlink_to(elsewhere, target_is_directory=True)
    split.merge(run.out, overwrite=True)
    assert run.out.is_dir() and not run.out.is_symlink() and qformat.check([str(run.out)]).ok
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep.txt"]
    assert not [n for n in os.listdir(run.out.parent) if n.startswith(".qformat-")]


# -- two merges into one destination --------------------------------------------------------
#: Run in the first merge's process: the merge stops inside its critical section (placing its
#: first file) until the test lets it go, so the second merge overlaps it every time.
_PAUSE_INSIDE = """
import os, time
import qformat.checkpoint.split as sp
_place = sp._place
def _paused(src, dst):
    sp._place = _place
    open(os.environ["QF_TEST_INSIDE"], "w").close()
    end = time.monotonic() + 120
    while not os.path.exists(os.environ["QF_TEST_GO"]):
        if time.monotonic() > end:
            raise SystemExit("test hook: never released")
        time.sleep(0.005)
    return _place(src, dst)
sp._place = _paused
"""


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, "the first merge never reached its critical section"
        time.sleep(0.005)


@pytest.mark.parametrize("round_", range(4))
def test_a_second_merge_while_one_runs_is_refused_and_writes_nothing(staged, tmp_path, round_):
    r = Run(staged, tmp_path)
    inside, go = tmp_path / "inside", tmp_path / "go"
    env = dict(os.environ, QF_TEST_INSIDE=str(inside), QF_TEST_GO=str(go))
    code = f"import sys\n{_PAUSE_INSIDE}\nfrom qformat.cli import main\nsys.exit(main(sys.argv[1:]))"
    first = subprocess.Popen([sys.executable, "-c", code, "merge", str(r.out)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(inside, first)
        temps = sorted(n for n in os.listdir(tmp_path) if n.startswith(".qformat-"))
        assert len(temps) == 1, temps  # the first merge's temporary folder, being filled
        second = _cli("merge", str(r.out), *(["--overwrite"] if round_ % 2 else []))
        assert second.returncode == 2, (second.returncode, second.stdout, second.stderr)
        assert "SPLIT_PART_INVALID" in second.stderr and "another qformat merge" in second.stderr, second.stderr
        assert "Traceback" not in second.stderr
        assert not r.out.exists(), "the second merge wrote the destination"
        assert sorted(n for n in os.listdir(tmp_path) if n.startswith(".qformat-")) == temps, "the second merge wrote beside it"
        assert (r.part(1) / "part.json").is_file() and (r.part(2) / "part.json").is_file(), "the second merge touched the parts"
    finally:
        go.touch()
        out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert qformat.check([str(r.out)], digests=True).ok
    assert not r.staging.exists()


def test_two_merges_started_together_never_both_succeed(staged, tmp_path):
    """Without a pause: whatever the timing, one merge writes DST and the other is refused
    (the lock, or no parts left once the first removed them), with a code."""
    for i in range(3):
        (tmp_path / str(i)).mkdir()
        r = Run(staged, tmp_path / str(i))
        code = "import sys\nfrom qformat.cli import main\nsys.exit(main(sys.argv[1:]))"
        procs = [subprocess.Popen([sys.executable, "-c", code, "merge", str(r.out)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
        for p in procs:
            p.stdout.close()
            p.stderr.close()
        assert sorted(rc for rc, _ in results) == [0, 2], results
        loser = next(err for rc, err in results if rc == 2)
        assert "SPLIT_PART_INVALID" in loser and "Traceback" not in loser, loser
        assert qformat.check([str(r.out)]).ok


def test_a_stale_lock_file_of_a_killed_merge_does_not_block(run):
    (run.staging / split.LOCK).write_text("process 999999 on host gone")  # left by a killed merge: nobody holds it
    split.merge(run.out)
    assert qformat.check([str(run.out)]).ok


def test_hostile_trees_seeded_run():
    """A short seeded run of the fuzzing entry point (tests/hostile_trees.py): 300 staging
    folders built from random bytes, none may escape, leave a destination when refused, or
    fail with anything but a coded error."""
    from . import hostile_trees

    assert hostile_trees.run_seeded(300, seed=0) == 300
