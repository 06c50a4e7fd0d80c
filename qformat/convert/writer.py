"""Writing a conversion: validate the descriptors, place tensors in files, write atomically.

The same for every source format.  In place, every source tensor is copied byte for byte
under its own name (from a memory map, in bounded chunks) and the descriptors are added to
``__metadata__``; with ``repack`` the described tensors are rewritten by
:mod:`qformat.convert.repack`.  A single-file source gives a single file; a folder or a
sharded index gives a folder with the same file names, side files (config.json, tokenizer)
copied, and an index whose ``weight_map`` lists every stored and logical tensor.  Files are
written beside the destination and moved into place only when everything succeeded.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from .. import dtypes as _dt
from ..atomic import atomic_write
from ..check import check_file
from ..container import write_file
from ..descriptor import parse_descriptor, validate_descriptor
from ..errors import QFormatError, error
from ..model import required_version
from ..model import METADATA_KEY
from ..sources import TensorInfo
from .base import Checkpoint, Described, source_error
from .repack import repack as repack_descriptor


class _Combined:
    """Source tensors (memory-mapped) overlaid with the converter's added arrays."""

    def __init__(self, ck: Checkpoint, added: dict[str, np.ndarray]):
        self.ck, self.added = ck, added

    def info(self, name: str) -> TensorInfo | None:
        a = self.added.get(name)
        if a is not None:
            st = _dt.storage_name(a.dtype)
            return None if st is None else TensorInfo(st, tuple(a.shape))
        return self.ck.info(name) if self.ck.kind == "safetensors" else None

    def array(self, name: str) -> np.ndarray:
        a = self.added.get(name)
        return a if a is not None else self.ck.array(name)


@dataclass
class Summary:
    """What a conversion wrote."""

    files: list[str] = field(default_factory=list)
    logical: int = 0
    stored: int = 0
    bytes: int = 0


class Progress:
    """A one-line progress bar on a text stream (no third-party dependency)."""

    def __init__(self, total_bytes: int, total_files: int, stream: TextIO | None):
        self.total, self.files, self.stream = max(1, total_bytes), total_files, stream
        self.done_bytes = self.done_files = 0
        self.tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())

    def file_done(self, name: str, nbytes: int) -> None:
        self.done_bytes += nbytes
        self.done_files += 1
        if self.stream is None:
            return
        frac = min(1.0, self.done_bytes / self.total)
        bar = "#" * int(frac * 30)
        line = f"[{bar:<30}] {self.done_files}/{self.files} files {self.done_bytes / 1e6:,.1f}/{self.total / 1e6:,.1f} MB  {name}"
        if self.tty:
            self.stream.write("\r" + line[:120].ljust(120))
            if self.done_files == self.files:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _validated(described: Described, src: _Combined) -> dict[str, Any]:
    parsed = {}
    for name, raw in described.descriptors.items():
        try:
            desc = parse_descriptor(name, raw)
        except QFormatError as e:
            raise source_error(f"the description built for this tensor does not validate: {e}", tensor=name) from None
        probs = validate_descriptor(name, desc, src)
        if probs:
            p = probs[0]
            raise source_error(f"the description built for this tensor does not validate: {p}", tensor=name)
        parsed[name] = desc
    return parsed


def plan(ck: Checkpoint, described: Described, repack: bool) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Per output file: {stored name: array} and {logical name: descriptor JSON}."""
    src = _Combined(ck, described.added)
    parsed = _validated(described, src)
    single = ck.files[0] if ck.files else "model.safetensors"
    if ck.kind != "safetensors":
        single = os.path.splitext(ck.files[0])[0] + ".safetensors"

    def home(name: str) -> str:
        if ck.kind == "safetensors" and name in ck:
            return ck.file_of(name)
        return single

    referenced: dict[str, str] = {}  # stored name -> logical tensor that references it
    files: dict[str, dict[str, Any]] = {}
    descs: dict[str, dict[str, Any]] = {}
    for name, desc in parsed.items():
        target = home(desc.codes.tensor)
        if repack:
            dj, arrays = repack_descriptor(name, desc, src)
        else:
            dj = described.descriptors[name]
            arrays = {ref: src.array(ref) for _, ref in desc.references()}
        # A referenced tensor moves next to its codes: a logical tensor never spans shards (SPEC §14).
        for _, ref in desc.references():
            other = referenced.setdefault(ref, name)
            if other != name and not repack and home(ref) != target:
                raise error("CONVERT_UNSUPPORTED", f"tensor {ref!r} is shared by {other!r} and {name!r}, which the output would place in different files", tensor=name)
        out = files.setdefault(target, {})
        for k, v in arrays.items():
            if repack or k not in out:
                out[k] = v
        descs.setdefault(target, {})[name] = dj
    if ck.kind == "safetensors":
        for n in ck.names():
            if n in referenced or n in described.dropped:
                continue
            files.setdefault(home(n), {})[n] = ck.array(n)
    for n, a in described.added.items():
        if n not in referenced:
            files.setdefault(single, {})[n] = a
    for n, a in described.plain.items():
        files.setdefault(single, {})[n] = a
    for f in files:
        descs.setdefault(f, {})
    return files, descs


def _metadata(ck: Checkpoint, file: str, described: Described, descs: dict[str, Any]) -> dict[str, str]:
    meta: dict[str, str] = {}
    if ck.kind == "safetensors" and file in ck.files:
        meta.update(ck.metadata(file))
    meta.pop(METADATA_KEY, None)
    meta.update(described.metadata)
    if descs:
        # The lowest version whose features the file uses (SPEC.md §17.1): "1.0" unless a 1.1 layout.
        meta[METADATA_KEY] = json.dumps({"version": required_version(descs), "tensors": descs}, separators=(",", ":"), sort_keys=True)
    return meta


def write(ck: Checkpoint, described: Described, dst: str, repack: bool = False, overwrite: bool = False,
          progress: TextIO | None = None) -> Summary:
    """Write the conversion to ``dst`` (a file for a single-file source, else a folder)."""
    dst = os.path.abspath(dst)
    as_folder = ck.kind == "safetensors" and (os.path.isdir(ck.path) or ck.sharded)
    if dst == ck.path or (not as_folder and dst in [os.path.join(ck.folder, f) for f in ck.files]):
        raise error("CONVERT_DESTINATION_INVALID", f"the destination {dst} is the source itself")
    if os.path.exists(dst) and not overwrite:
        raise error("CONVERT_DESTINATION_INVALID", f"{dst} exists; pass --overwrite to replace it")
    if os.path.exists(dst) and as_folder != os.path.isdir(dst):
        raise error("CONVERT_DESTINATION_INVALID", f"{dst} is a {'file' if as_folder else 'folder'}, expected a {'folder' if as_folder else 'file'} for this source")
    parent = os.path.dirname(dst)
    if not os.path.isdir(parent):
        raise error("CONVERT_DESTINATION_INVALID", f"the destination's folder {parent} does not exist")
    files, descs = plan(ck, described, repack)
    order = [f for f in ck.files if f in files] + sorted(f for f in files if f not in ck.files)
    if ck.kind != "safetensors":
        order = sorted(files)
    total = sum(int(a.nbytes) for f in order for a in files[f].values())
    bar = Progress(total, len(order), progress if len(order) > 1 else None)
    summary = Summary(logical=sum(len(d) for d in descs.values()), stored=sum(len(v) for v in files.values()), bytes=total)
    tmp = tempfile.mkdtemp(prefix=".qformat-convert-", dir=parent)
    try:
        for f in order:
            path = os.path.join(tmp, f)
            write_file(path, files[f], _metadata(ck, f, described, descs[f]) or None)
            _verify(path)
            bar.file_done(f, sum(int(a.nbytes) for a in files[f].values()))
        if not as_folder:
            (f,) = order
            os.replace(os.path.join(tmp, f), dst)
            shutil.rmtree(tmp, ignore_errors=True)
            summary.files = [dst]
            return summary
        skip = set(ck.files) | ({ck.index_name} if ck.index_name else set())
        for n in sorted(os.listdir(ck.folder)):
            p = os.path.join(ck.folder, n)
            if n in skip or not os.path.isfile(p) or n.endswith(".safetensors") or n.startswith(".qformat-"):
                continue
            shutil.copyfile(p, os.path.join(tmp, n))
        if ck.sharded:
            weight_map: dict[str, str] = {}
            for f in order:
                for n in files[f]:
                    weight_map[n] = f
                for n in descs[f]:
                    weight_map.setdefault(n, f)
            idx = {k: v for k, v in (ck.index or {}).items() if k != "weight_map"}
            md = dict(idx.get("metadata") or {}) if isinstance(idx.get("metadata"), dict) else {}
            md["total_size"] = total
            idx["metadata"] = md
            idx["weight_map"] = dict(sorted(weight_map.items()))
            with atomic_write(os.path.join(tmp, ck.index_name or "model.safetensors.index.json"), "w", encoding="utf-8") as fh:
                json.dump(idx, fh, indent=2, ensure_ascii=False)
                fh.write("\n")
        if os.path.exists(dst):
            old = tempfile.mkdtemp(prefix=".qformat-old-", dir=parent)
            os.rmdir(old)
            os.replace(dst, old)
            os.replace(tmp, dst)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    summary.files = [os.path.join(dst, f) for f in order]
    return summary


def _verify(path: str) -> None:
    """Header-level check of a written file: a converter bug must not leave a bad file."""
    rep = check_file(path, payload=False)
    if not rep.ok:
        p = rep.problems[0]
        with_tensor = f" ({p.tensor})" if p.tensor else ""
        raise error("CONVERT_SOURCE_INVALID", f"the converted file fails qformat check: {p.code}{with_tensor}: {p.message}", tensor=p.tensor)
