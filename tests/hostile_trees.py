"""A fuzzing entry point for ``qformat merge`` over hostile part folders (issue 40, item 7).

:func:`one_input` takes any bytes, builds from them a staging folder ``DST.parts`` (a real
two-part quantize, copied, then edited as the bytes say: manifest members replaced by hostile
names, numbers and types, files replaced by links into or out of the sandbox, named pipes,
truncations, flipped bytes, or the manifest's whole text replaced by the bytes), runs
:func:`qformat.checkpoint.split.merge` and asserts the promises:

* any failure is a :class:`qformat.QFormatError` (anything else propagates: a crash);
* nothing outside the sandbox folder changed (canary files around it, with links pointing at
  them, are compared byte for byte, and no new file appears next to them);
* a refused merge leaves no destination and no temporary folder; a merge that succeeds leaves
  only regular files and folders in ``DST``.

With atheris (``pip install atheris``)::

    import atheris, sys
    with atheris.instrument_imports():
        from tests import hostile_trees
    atheris.Setup(sys.argv, hostile_trees.one_input)
    atheris.Fuzz()

Without it, :func:`run_seeded` feeds seeded random inputs (tests/test_merge_hostile.py runs a
short one).  The template parts are made once per process (about a second).
"""

from __future__ import annotations

import atexit
import json
import os
import random
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

#: Segments hostile names are built from (each may climb, be empty, absolute, odd).
SEGMENTS = ["..", ".", "", "x", "tree", "shards", "canary.txt", "part-1-of-2", "out", "sub", "/", "\\", "\0", "C:",
            ".qformat-writer.json", "model-00001-of-00003.safetensors", "tokenizer.json", "a" * 300]
_DEPTH = 4  # the sandbox lies this deep inside the fuzzing root, so up to 4 '..' still land in a watched folder

_TEMPLATE: Path | None = None
_ROOT: Path | None = None


class Bytes:
    """Consumes the fuzzer's bytes: small integers and choices, zero once they run out."""

    def __init__(self, data: bytes):
        self.data, self.i = data, 0

    def byte(self) -> int:
        if self.i >= len(self.data):
            return 0
        self.i += 1
        return self.data[self.i - 1]

    def int(self, n: int) -> int:
        return (self.byte() | self.byte() << 8) % n if n > 0 else 0

    def choice(self, seq: list[Any]) -> Any:
        return seq[self.int(len(seq))]

    def rest(self) -> bytes:
        out, self.i = self.data[self.i:], len(self.data)
        return out


def _template() -> Path:
    """A finished staging folder of a two-part int4 quantize, made once."""
    global _TEMPLATE, _ROOT
    if _TEMPLATE is None:
        import qformat

        from .test_split_convert import INT4, _llama

        _ROOT = Path(tempfile.mkdtemp(prefix="qformat-hostile-trees-"))
        atexit.register(shutil.rmtree, _ROOT, True)
        src = _ROOT / "src"
        _llama(src, layers=2, shards=3)
        out = _ROOT / "template" / "out"
        out.parent.mkdir()
        for k in (1, 2):
            qformat.quantize_checkpoint(src, out, part=f"{k}/2", **INT4)
        _TEMPLATE = Path(str(out) + ".parts")
    return _TEMPLATE


def _name(b: Bytes) -> str:
    return "/".join(b.choice(SEGMENTS) for _ in range(1 + b.int(4)))


def _value(b: Bytes) -> Any:
    return b.choice([_name(b), b.int(1 << 16) - 100, -1, None, True, 1.5, [], {}, "0" * 64, "g" * 64, 2, 10**30])


def _mutate_manifest(m: dict[str, Any], b: Bytes) -> None:
    for _ in range(1 + b.int(4)):
        what = b.int(8)
        if what == 0 and isinstance(m.get("tree"), dict):  # a tree entry under a hostile name
            m["tree"][_name(b)] = b.choice(list(m["tree"].values()) or [{}])
        elif what == 1 and isinstance(m.get("assignment"), dict) and m["assignment"]:  # rename a planned file
            old = b.choice(sorted(m["assignment"]))
            new = _name(b)
            m["assignment"][new] = m["assignment"].pop(old)
            if isinstance(m.get("files"), dict) and old in m["files"]:
                m["files"][new] = m["files"].pop(old)
        elif what == 2:  # a top-level member replaced
            m[b.choice(sorted(m))] = _value(b)
        elif what == 3 and isinstance(m.get("files"), dict) and m["files"]:  # a file record's member replaced
            rec = m["files"][b.choice(sorted(m["files"]))]
            if isinstance(rec, dict) and rec:
                rec[b.choice(sorted(rec))] = _value(b)
        elif what == 4:
            m["index"] = _name(b)
        elif what == 5 and isinstance(m.get("tree"), dict) and m["tree"]:
            m["tree"].pop(b.choice(sorted(m["tree"])))
        elif what == 6:
            m["version"] = b.choice([1, 2, 3, "2", None])
        else:
            m["parts"] = b.choice([1, 2, 3, 0])


def _mutate_files(part: Path, sandbox: Path, outside: Path, b: Bytes) -> None:
    files = sorted(p for p in part.rglob("*") if p.is_file() and not p.is_symlink())
    for _ in range(b.int(3)):
        if not files:
            return
        p = b.choice(files)
        files.remove(p)  # a link or pipe now: never read by this harness (a pipe would block it)
        how = b.int(6)
        if how == 0:  # a link out of the sandbox (to a canary)
            p.unlink()
            os.symlink(outside / "canary.txt", p)
        elif how == 1 and files:  # a link inside the part
            p.unlink()
            os.symlink(os.path.relpath(b.choice(files), p.parent), p)
        elif how == 2:
            p.unlink()
            os.mkfifo(p)
        elif how == 3:  # truncated
            data = p.read_bytes()
            p.write_bytes(data[: b.int(len(data) + 1)])
            files.append(p)
        elif how == 4:  # one byte changed
            data = bytearray(p.read_bytes())
            if data:
                data[b.int(len(data))] ^= 1 + b.byte() % 255
                p.write_bytes(bytes(data))
            files.append(p)
        else:  # a folder of the part replaced by a link to the outside folder
            d = p.parent
            if d != part:
                shutil.rmtree(d)
                os.symlink(outside, d)
            files = sorted(q for q in part.rglob("*") if q.is_file() and not q.is_symlink())


def _watched(root: Path, sandbox: Path) -> dict[str, bytes]:
    """Every entry under ``root`` outside ``sandbox``: files by content, links by target."""
    out: dict[str, bytes] = {}
    for dirpath, dirs, names in os.walk(root):
        if Path(dirpath) == sandbox or sandbox in Path(dirpath).parents:
            dirs[:] = []
            continue
        for n in names + [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]:
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, root)
            out[rel] = (b"link:" + os.readlink(p).encode()) if os.path.islink(p) else Path(p).read_bytes()
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(dirpath, d))]
    return out


def one_input(data: bytes) -> None:
    """Build a staging folder from ``data``, merge it, assert the promises (module docstring)."""
    from qformat.checkpoint import split
    from qformat.errors import QFormatError

    template = _template()
    assert _ROOT is not None
    work = Path(tempfile.mkdtemp(prefix="case-", dir=_ROOT))
    try:
        outside = work
        for i in range(_DEPTH):
            (outside / "canary.txt").write_text(f"canary {i}\n")
            os.chmod(outside / "canary.txt", 0o600)
            outside = outside / f"d{i}"
            outside.mkdir()
        sandbox = outside
        outside = work  # links point at the outermost canary
        dst = sandbox / "out"
        staging = Path(split.staging_folder(dst))
        shutil.copytree(template, staging)
        b = Bytes(data)
        mode = b.int(4)
        k = 1 + b.int(2)
        manifest = staging / f"part-{k}-of-2" / "part.json"
        if mode == 0:  # the manifest's whole text is the rest of the input
            manifest.write_bytes(b.rest())
        else:
            m = json.loads(manifest.read_text())
            if mode & 1:
                _mutate_manifest(m, b)
            manifest.write_text(json.dumps(m))
            if mode & 2:
                _mutate_files(staging / f"part-{k}-of-2", sandbox, outside, b)
        # The last byte says whether DST exists already (merged with --overwrite): a folder, a
        # link to the folder holding the outermost canary, or a file.
        existing = (data[-1] % 8 if data else 0) - 4
        if existing == 1:
            dst.mkdir()
            (dst / "old.txt").write_text("an earlier destination\n")
        elif existing == 2:
            dst.symlink_to(outside, target_is_directory=True)
        elif existing == 3:
            dst.write_text("an earlier destination\n")
        dst_before = _watched(dst, staging) if existing == 1 else (os.readlink(dst) if existing == 2 else None)
        before = _watched(work, sandbox)
        try:
            split.merge(dst, overwrite=existing > 0)
        except QFormatError:
            if existing <= 0:
                assert not os.path.lexists(dst), "a refused merge left a destination"
            elif existing == 1:
                assert _watched(dst, staging) == dst_before, "a refused merge changed the earlier destination"
            elif existing == 2:
                assert os.readlink(dst) == dst_before, "a refused merge changed the earlier destination link"
        else:
            assert dst.is_dir() and not dst.is_symlink(), "a merge that succeeded left no destination folder"
            for dirpath, dirs, names in os.walk(dst):
                for n in names + dirs:
                    st = os.lstat(os.path.join(dirpath, n))
                    assert stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode), f"merged {n} is not a regular file"
        assert not [n for n in os.listdir(sandbox) if n.startswith(".qformat-")], "the merge left a temporary beside DST"
        assert _watched(work, sandbox) == before, "the merge wrote outside its sandbox"
    finally:
        for dirpath, dirs, names in os.walk(work):  # a fifo or mode change must not stop the clean-up
            for n in dirs:
                p = os.path.join(dirpath, n)
                if not os.path.islink(p):
                    os.chmod(p, 0o700)
        shutil.rmtree(work, ignore_errors=True)


def run_seeded(n: int, seed: int = 0) -> int:
    """Feed ``n`` seeded random inputs to :func:`one_input` (raises on the first broken promise);
    returns ``n``."""
    rng = random.Random(seed)
    for _ in range(n):
        one_input(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))))
    return n
