"""What the whole-checkpoint commands (quantize, dequantize, convert, export) share around the
writer: the source folder's side tree (:func:`side_files`) and config.json, the output's shard
layout (the source's, or by a maximum shard size in Hugging Face's "5GB" syntax), per-file
metadata and a byte progress bar.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any, Callable, Iterable, TextIO

from .writer import IndexSpec, SideFile, destination_error
from ..errors import error
from ..paths import hub_blobs, link_target, unreadable
from ..model import METADATA_KEY

INDEX_NAME = "model.safetensors.index.json"
#: The code of a source folder entry the path policy refuses (a link leaving it, a device).
SOURCE_CODE = "CONVERT_SOURCE_INVALID"


def parse_size(size: Any) -> int:
    """Bytes of a shard size: an integer, or Hugging Face's syntax ("5GB" = 5e9 bytes, "5GiB" =
    5 * 2^30, "500MB", "100KiB"; a lowercase final "b" counts bits, as transformers does)."""
    if isinstance(size, int) and not isinstance(size, bool):
        n = size
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?[Bb]?)\s*", str(size), re.IGNORECASE)
        if not m:
            raise destination_error(f"max shard size {size!r} is not a size such as 5GB, 500MB or 2GiB", field="max_shard_size")
        num, unit = float(m.group(1)), m.group(2)
        u = unit.upper()
        mult = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
                "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}.get(u)
        if mult is None:
            raise destination_error(f"max shard size {size!r} has an unknown unit {unit!r}", field="max_shard_size")
        n = int(num * mult)
        if unit.endswith("b") and u not in ("", "B"):
            n //= 8
    if n < 1:
        raise destination_error(f"max shard size must be at least 1 byte, found {size!r}", field="max_shard_size")
    return n


def shard_by_size(units: Iterable[tuple[str, int]], max_bytes: int) -> tuple[dict[str, str], list[str]]:
    """Greedy shards in order: (unit name -> file name, file names).  A unit (a logical tensor
    with its components) never spans files; one larger than ``max_bytes`` gets a file alone.
    One file is ``model.safetensors``; more are ``model-0000k-of-0000n.safetensors``."""
    groups: list[list[str]] = []
    cur: list[str] = []
    size = 0
    for name, nbytes in units:
        if cur and size + nbytes > max_bytes:
            groups.append(cur)
            cur, size = [], 0
        cur.append(name)
        size += nbytes
    if cur or not groups:
        groups.append(cur)
    n = len(groups)
    files = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    return {u: files[i] for i, g in enumerate(groups) for u in g}, files


#: Top-level names of the checkpoint's weights in other frameworks' formats, as transformers
#: names them (``pytorch_model.bin``, ``tf_model-00001-of-00002.h5``, ``flax_model.msgpack``,
#: their indexes, ``rust_model.ot``): the same tensors, never rewritten, so never carried.
_OTHER_WEIGHTS = ("pytorch_model", "tf_model", "flax_model", "rust_model")


def is_weight_file(name: str) -> bool:
    """Whether a top-level file name of a model folder holds the checkpoint's weights (or their
    index): every ``*.safetensors`` file and ``*.safetensors.index*.json``, and transformers'
    names for the same weights in other frameworks' formats."""
    if name.endswith(".safetensors") or (".safetensors.index" in name and name.endswith(".json")):
        return True
    return re.sub(r"-\d+-of-\d+$", "", name.split(".", 1)[0]) in _OTHER_WEIGHTS


def side_files(folder: str, skip: Iterable[str] = (), exclude: Iterable[str] = ()) -> list[SideFile]:
    """What of a model folder is carried into an output folder unchanged: its whole tree
    (subfolders such as sentence-transformers' ``1_Pooling/`` and their files, tokenizer
    files, README.md, ...), each file under its path relative to ``folder``.

    Left out: at the top level the checkpoint's own weights and index (:func:`is_weight_file`:
    the command writes its own) and the names in ``skip`` (files the command writes itself,
    config.json among them); anywhere, qformat's temporaries (``.qformat-*``), folders whose
    names begin with a dot (``.git``, huggingface_hub's ``.cache``: a repository's history or a
    download's bookkeeping, not the model) and the folders in ``exclude`` (a destination inside
    the source).  A ``*.safetensors`` file inside a subfolder is a module's own weights (a
    sentence-transformers Dense layer) and is copied as it is.

    Links (:mod:`qformat.paths`, the one path policy): a link to a regular file is copied as
    the file's contents when the file lies inside the folder, or directly in the real ``blobs/``
    folder of the huggingface_hub cache repository whose snapshot the folder is (every file of a
    snapshot is such a link; a ``blobs`` that is itself a link is not followed).  A link to
    anything else, a link to a folder, a broken link or a file that is not a regular file is
    refused (``CONVERT_SOURCE_INVALID``, naming it) rather than followed or silently dropped;
    a file or folder that cannot be opened is ``FILE_UNREADABLE``, naming it.  Each file is
    opened (not read) here, so an unreadable one stops the command before anything is written;
    the writer copies each file's bytes into its temporary folder."""
    root = os.path.realpath(folder)
    blobs = hub_blobs(root)
    skip, excluded = set(skip), {os.path.realpath(p) for p in exclude}
    out: list[SideFile] = []

    def walk(path: str, rel: str) -> None:
        try:
            with os.scandir(path) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as e:
            raise unreadable(path, e) from None
        for e in entries:
            name = rel + e.name
            if e.name.startswith(".qformat-") or (not rel and (e.name in skip or is_weight_file(e.name))):
                continue
            if e.is_dir(follow_symlinks=False):
                if not e.name.startswith(".") and os.path.realpath(e.path) not in excluded:
                    walk(e.path, name + "/")
                continue
            if e.is_symlink():
                source = link_target(root, e.path, name, code=SOURCE_CODE, blobs=blobs)
            elif e.is_file(follow_symlinks=False):
                source = e.path
            else:
                raise error(SOURCE_CODE, f"file {name!r} (in {root}) is not a regular file (a device, pipe or socket); remove it",
                            field=name)
            _openable(source)
            out.append(SideFile(source, name))

    walk(root, "")
    return out


def _openable(path: str) -> None:
    """FILE_UNREADABLE, naming ``path``, unless it can be opened for reading (nothing is read)."""
    try:
        os.close(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)))
    except OSError as e:
        raise unreadable(path, e) from None


def source_side_files(ck: Any, dst: str, skip: Iterable[str] = ()) -> list[SideFile]:
    """:func:`side_files` of a checkpoint's folder for an output folder at ``dst``: empty when
    the source is a single file (its folder is not a model folder); otherwise the source's own
    weight files and index are left out too, and so is ``dst`` when it lies inside the folder."""
    if not (os.path.isdir(ck.path) or ck.sharded):
        return []
    own = set(ck.files) | ({ck.index_name} if ck.index_name else set())
    return side_files(ck.folder, {*skip, *own}, exclude=[dst])


def config_bytes(config: Any, quantization_config: dict[str, Any] | None) -> bytes:
    """config.json with ``quantization_config`` replaced (None: removed); every other member kept in order."""
    cfg = dict(config)
    cfg.pop("quantization_config", None)
    if quantization_config is not None:
        cfg["quantization_config"] = quantization_config
    return (json.dumps(cfg, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def file_metadata(base: dict[str, str] | None, descriptors: dict[str, Any]) -> dict[str, str]:
    """A checkpoint file's ``__metadata__``: the source's members without qformat's, plus a qformat
    object with the descriptors, which every file gets (one of plain tensors only an empty one),
    so that its writer records a digest of every stored tensor (SPEC.md §3.8)."""
    from ..model import qformat_json

    meta = {k: v for k, v in (base or {}).items() if k != METADATA_KEY}
    meta[METADATA_KEY] = qformat_json(descriptors, shard=True)  # type: ignore[assignment]
    return meta


def index_spec(ck: Any, resharded: bool) -> IndexSpec | None:
    """The index to write: the source's (its other members kept) for the source's sharding, a new
    one for more than one file of a new sharding (decided by the caller), else None."""
    if resharded:
        return IndexSpec(INDEX_NAME, {"metadata": {}})
    if ck.sharded:
        return IndexSpec(ck.index_name or INDEX_NAME, dict(ck.index or {}))
    return None


class ByteProgress:
    """Progress over bytes written: tqdm when installed and ``stream`` is a terminal, a plain
    one-line bar on a terminal otherwise, nothing when ``stream`` is None or not a terminal."""

    def __init__(self, total: int, stream: TextIO | None, label: str = "writing"):
        self.total = max(1, total)
        self.done = 0
        self.stream = stream if stream is not None and getattr(stream, "isatty", lambda: False)() else None
        self._bar: Any = None
        self._last = -1
        if self.stream is not None:
            try:
                from tqdm import tqdm  # optional (the "demo" extra)

                self._bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=label, file=self.stream, leave=False)
            except ImportError:
                self._bar = None
        self.label = label

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        if self.stream is None:
            return
        if self._bar is not None:
            self._bar.update(nbytes)
            return
        pct = int(100 * self.done / self.total)
        if pct != self._last:
            self._last = pct
            bar = "#" * (pct * 30 // 100)
            self.stream.write(f"\r{self.label} [{bar:<30}] {pct:3d}% {self.done / 1e6:,.1f}/{self.total / 1e6:,.1f} MB")
            self.stream.flush()

    def close(self) -> None:
        if self.stream is None:
            return
        if self._bar is not None:
            self._bar.close()
        else:
            self.stream.write("\r" + " " * 79 + "\r")
            self.stream.flush()


def stderr_notice(message: str) -> None:
    """A notice on stderr, URLs and tokens in it shown by the one redaction rule."""
    from ..redact import scrub

    print(f"qformat: {scrub(message)}", file=sys.stderr)


def release_after(release: Callable[[], None] | None, progress: ByteProgress) -> Callable[[Any], None]:
    """The writer's per-tensor callback: advance the bar, drop the source's mapped pages."""

    def written(spec: Any) -> None:
        progress.advance(spec.nbytes)
        if release is not None:
            release()

    return written
