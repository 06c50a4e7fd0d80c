"""Reading whole checkpoints: one file, or the shards of a ``*.safetensors.index.json``.

This is the one place that walks an index's shards (SPEC.md, "Sharded checkpoints"): every
loader (NumPy here, the torch and JAX readers through their own per-file loader) goes through
:func:`iter_shards` / :func:`load_checkpoint`, so the index rules (INDEX_INVALID,
INDEX_MISMATCH) are applied the same way everywhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ..container import Header
from ..remote import read_header
from ..errors import error, raise_first
from ..index import is_index, mismatches, read_index
from ..model import FileModel, interpret
from ..sources import FileSource

@dataclass(frozen=True)
class Shard:
    """One file of a checkpoint: its path, validated header, interpreted model and source."""

    path: str
    name: str
    header: Header
    model: FileModel
    source: FileSource


def _basename(path: str) -> str:
    from ..remote import is_url, url_basename

    return url_basename(path) if is_url(path) else os.path.basename(path)


def iter_shards(path: str | os.PathLike[str]) -> Iterator[Shard]:
    """The files of a checkpoint, in a stable order, each with its header and model.

    For a ``.safetensors`` file: that file.  For an index: the index is read and validated
    (:func:`read_index`), then each shard (sorted by file name) is checked against
    it (:func:`mismatches`, INDEX_MISMATCH) before it is yielded.
    """
    path = os.fspath(path)
    if not is_index(path):
        header = read_header(path)
        src = FileSource(path, header)
        yield Shard(path, _basename(path), header, interpret(header, src), src)
        return
    index = read_index(path)
    exposed: dict[str, str] = {}  # name -> the first shard exposing it
    for shard in index.shards:
        sp = index.shard_path(shard)
        header = read_header(sp)
        src = FileSource(sp, header)
        model = interpret(header, src)
        raise_first(mismatches(index, shard, header, model))
        # SPEC.md §14 (1.2.1): a name a second shard exposes is INDEX_MISMATCH with the listing
        # rules, before that shard's qformat content; a logical tensor refused at step 5 counts
        for name in model.logical_names():
            first = exposed.setdefault(name, shard)
            if first != shard:
                raise error("INDEX_MISMATCH", f"tensor {name!r} appears in both {first!r} and {shard!r}", tensor=name, field="weight_map")
        yield Shard(sp, shard, header, model, src)


def load_checkpoint(path: str | os.PathLike[str], load_file: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """Every tensor of a file or of a sharded checkpoint (given its index), decoded.

    ``load_file(path) -> {name: tensor}`` loads one file (:func:`qformat.io.load_file` for
    NumPy; readers pass their own).  For an index, the index is validated against each shard
    (INDEX_INVALID, INDEX_MISMATCH) and the shards' tensors are merged; a name found in two
    shards is INDEX_MISMATCH.
    """
    path = os.fspath(path)
    if not is_index(path):
        return load_file(path)
    out: dict[str, Any] = {}
    for shard in iter_shards(path):
        for name, arr in load_file(shard.path).items():
            if name in out:
                raise error("INDEX_MISMATCH", f"tensor {name!r} appears in more than one shard", tensor=name, field="weight_map")
            out[name] = arr
    return out
