"""Sharded checkpoints' index file, ``*.safetensors.index.json`` (SPEC.md, "Sharded checkpoints"):
parsing it and checking it against its shards.  Walking the shards is :mod:`qformat.checkpoint`'s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

from . import tables
from .container import Header, _Dup, strict_json
from .errors import QFormatError, error, raise_first
from .model import FileModel
from .paths import parts, source_file

INDEX_SUFFIX = ".safetensors.index.json"


@dataclass(frozen=True)
class Index:
    path: str
    folder: str
    weight_map: dict[str, str]

    @property
    def shards(self) -> list[str]:
        return sorted(self.by_shard)

    @cached_property
    def by_shard(self) -> dict[str, set[str]]:
        """Shard file -> the names the index places in it (grouped once: checking each shard
        against a scan of the whole map was quadratic in a big checkpoint, issue 40)."""
        out: dict[str, set[str]] = {}
        for name, shard in self.weight_map.items():
            out.setdefault(shard, set()).add(name)
        return out

    def shard_path(self, shard: str) -> str:
        """Where shard file ``shard`` is: next to the index (a path, or for a remote index
        :func:`qformat.remote.sibling_url`: in its folder, the name percent-encoded whole, without
        the index's query)."""
        from .remote import is_url, sibling_url

        if is_url(self.path):
            return sibling_url(self.path, shard)
        return os.path.join(self.folder, shard)


def read_index(path: str | os.PathLike[str]) -> Index:
    """Parse and validate an index file (not its shards); raises INDEX_INVALID / FILE_UNREADABLE."""
    index, problems = scan_index(path)
    raise_first(problems)
    return index


def scan_index(path: str | os.PathLike[str]) -> tuple[Index, list[QFormatError]]:
    """Parse an index, collecting every problem: the returned Index keeps only usable shards.

    Raises FILE_UNREADABLE or INDEX_INVALID when the file itself cannot be used at all.
    """
    path = os.fspath(path)
    limit = tables.limits()["max_index_bytes"]
    from .remote import fetch_bytes, is_url, url_basename, url_folder

    remote = is_url(path)
    name = url_basename(path) if remote else os.path.basename(path)  # a URL's name: never its query
    try:
        if remote:  # at most limit + 1 bytes, whatever the server says the length is
            raw = fetch_bytes(path, limit)
        else:
            with open(path, "rb") as f:
                raw = f.read(limit + 1)
    except OSError as e:
        raise error("FILE_UNREADABLE", f"cannot read {path!r}: {e.strerror or e}") from None
    if len(raw) > limit:
        raise error("INDEX_INVALID", f"the index is larger than {limit} bytes")
    try:
        text = raw.decode("utf-8")
        obj, end = strict_json(text)
        if text[end:].strip(" \t\n\r"):
            raise ValueError("text follows the JSON object")
    except (_Dup, ValueError, UnicodeDecodeError, RecursionError) as e:
        msg = f"key {e.key!r} appears twice" if isinstance(e, _Dup) else str(e)
        raise error("INDEX_INVALID", f"the index is not valid JSON: {msg}"[:300]) from None
    wm = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
        raise error("INDEX_INVALID", f"{name!r} is not a sharded-checkpoint index: expected an object 'weight_map' mapping tensor names to shard file names (a .safetensors file or a *.safetensors.index.json is read; `qformat convert` reads other formats)", field="weight_map")
    # A remote index's shards are resolved relative to its URL (the part up to its last '/').
    folder = url_folder(path) if remote else os.path.dirname(os.path.abspath(path))
    problems = []
    bad = set()
    for shard in sorted(set(wm.values())):
        # the path policy (qformat.paths): a plain file name; locally a regular file in the folder,
        # or a link to one inside it (or into the blobs of the huggingface_hub snapshot it is)
        try:
            parts(shard, code="INDEX_INVALID", root=folder, what="shard name", field="weight_map", single=True)
            if not remote:  # a remote shard: its own open says
                source_file(folder, shard, code="INDEX_INVALID", what="shard", field="weight_map", single=True,
                            missing="listed in the index does not exist")
        except QFormatError as e:
            problems.append(e)
            bad.add(shard)
    return Index(path, folder, {k: v for k, v in wm.items() if v not in bad}), problems


def mismatches(index: Index, shard: str, header: Header, model: FileModel) -> list[QFormatError]:
    """INDEX_MISMATCH problems between the index and one shard's tensors."""
    out = []
    visible = set(header.entries) | set(model.raw)
    listed = index.by_shard.get(shard, set())
    for n in sorted(listed - visible):
        out.append(error("INDEX_MISMATCH", f"the index places {n!r} in {shard!r}, which has no such tensor", tensor=n, field="weight_map"))
    for n in sorted(set(header.entries) - listed):
        out.append(error("INDEX_MISMATCH", f"shard {shard!r} holds {n!r}, which the index does not list for it", tensor=n, field="weight_map"))
    return out


def is_index(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` names an index (``*.json``) rather than a safetensors file."""
    from .remote import is_url, url_basename

    path = os.fspath(path)
    return url_basename(path).endswith(".json") if is_url(path) else path.endswith(".json")
