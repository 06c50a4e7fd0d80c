"""``save_pretrained`` of a model loaded through qformat (bound to the model by
:meth:`qformat_transformers.quantizer.QFormatHfQuantizer.postprocess_model`).

transformers writes the same ``__metadata__`` (the quantizer's) into every shard of a sharded
save; :func:`reshard` rewrites such a save into shards that are each complete qformat files
(SPEC §14).  A model loaded from a local folder also gets the rest of that folder
(:func:`side_tree`, :func:`copy_missing`: tokenizer, sentence-transformers modules, model
card), which ``save_pretrained`` itself does not write.
"""

from __future__ import annotations

import inspect
import json
import os
from typing import Any

import torch

from qformat.errors import error

def _add_variant(name: str, variant: str | None) -> str:
    """transformers' file naming of a variant: ``model.safetensors.index.json`` ->
    ``model.safetensors.index.<variant>.json``."""
    if not variant:
        return name
    head, _, ext = name.rpartition(".")
    return f"{head}.{variant}.{ext}"


def save_pretrained(self: Any, save_directory: Any, *args: Any, **kwargs: Any) -> Any:
    """``model.save_pretrained`` of a model loaded through qformat (bound to the instance by
    :meth:`QFormatHfQuantizer.postprocess_model`).

    transformers writes the same ``__metadata__`` (the quantizer's) into every shard of a
    sharded save, so each shard would describe logical tensors whose components it does not
    hold, and a logical tensor's components may land in different shards.  This runs
    transformers' save_pretrained, then, for a sharded save, rewrites the shards as qformat
    requires (SPEC §14): each logical tensor's components in one shard (the shard of its
    first component), each shard's qformat object with the descriptors of exactly the logical
    tensors it holds, and the index listing every stored tensor and logical name with its
    shard.  One shard is held in memory at a time.  ``push_to_hub`` with a save that shards is
    refused before anything is written (the upload would happen before the repair).

    When the model was loaded from a local folder, the files of that folder the save did not
    write (tokenizer files, sentence-transformers modules such as ``1_Pooling/``, README.md;
    never the source's weights, index or config.json) are copied in afterwards
    (:func:`side_tree`, :func:`copy_missing`), so the saved folder is as complete as the one
    loaded.  They are listed before the save (a link out of the folder stops it before
    anything is written); with ``push_to_hub`` they are not uploaded (the upload runs inside
    the save).
    """
    cls_save = type(self).save_pretrained
    bound = inspect.signature(cls_save).bind(self, save_directory, *args, **kwargs)
    bound.apply_defaults()
    opts = dict(bound.arguments)
    opts.update(opts.pop("kwargs", {}) or {})
    quantizer = getattr(self, "hf_quantizer", None)
    if opts.get("push_to_hub") and quantizer is not None:
        from qformat.checkpoint.output import parse_size

        sd, _ = quantizer.get_state_dict_and_metadata(self)
        total = sum(t.numel() * t.element_size() for t in sd.values())
        if total > parse_size(opts.get("max_shard_size") or "50GB"):
            raise error("SAVE_INVALID", "save_pretrained(push_to_hub=True) of a qformat model that is split into shards is "
                                        "not supported: save it to a folder, then upload the folder with huggingface_hub")
    source = source_folder(self)
    side = side_tree(source, save_directory) if source is not None else []
    out = cls_save(self, save_directory, *args, **kwargs)
    if os.path.isdir(save_directory):
        copy_missing(side, save_directory, root=source)
    if quantizer is not None and os.path.isdir(save_directory):
        from transformers.utils import SAFE_WEIGHTS_INDEX_NAME

        index = os.path.join(os.fspath(save_directory), _add_variant(SAFE_WEIGHTS_INDEX_NAME, opts.get("variant")))
        descs = getattr(quantizer, "saved_descriptors", None) or {}
        if os.path.isfile(index) and descs:
            reshard(index, descs, getattr(quantizer, "saved_digests", None))
    return out


def source_folder(model: Any) -> str | None:
    """The local folder ``model`` was loaded from (``name_or_path``), or None (a hub id, or a
    model built in memory)."""
    path = getattr(model, "name_or_path", None) or getattr(getattr(model, "config", None), "_name_or_path", None)
    return os.fspath(path) if path and os.path.isdir(path) else None


def side_tree(source: str, save_directory: Any) -> list[Any]:
    """What of the folder ``source`` a save into ``save_directory`` carries
    (:func:`qformat.checkpoint.output.side_files`: the whole tree but the top-level weights and
    index; config.json is the save's own); nothing when the two are the same folder."""
    from qformat.checkpoint.output import side_files

    dst = os.path.abspath(os.fspath(save_directory))
    if os.path.realpath(source) == os.path.realpath(dst):
        return []
    return side_files(source, {"config.json"}, exclude=[dst])


def copy_missing(side: list[Any], save_directory: Any, root: str | None = None) -> list[str]:
    """Copy each of ``side`` (:class:`qformat.checkpoint.writer.SideFile`) into
    ``save_directory`` unless a file of that name is there (the save wrote it, or it was there
    before: nothing in the destination is replaced).  Returns the relative names copied.

    ``root``: the folder ``side`` was listed from (:func:`side_tree`).  It was listed before the
    save, so each name is resolved again now by the path policy
    (:func:`qformat.paths.source_file`): a name that has become a link leaving the folder (or a
    hub snapshot's blobs), or has gone, is ``CONVERT_SOURCE_INVALID`` before anything is
    copied.  Each copy is :func:`qformat.checkpoint.writer.copy_file`'s (the user's default
    mode, never wider than the source's: a 0600 file stays 0600) into a temporary file that
    then replaces nothing but its own name; folders are made as ``mkdir`` makes them."""
    import secrets

    from qformat import paths
    from qformat.checkpoint.writer import copy_file

    folder = os.fspath(save_directory)
    todo = []
    for s in side:
        path = os.path.join(folder, *paths.parts(s.name, code="CONVERT_SOURCE_INVALID", root=root or folder, what="side file"))
        if os.path.lexists(path):
            continue
        source = s.source if root is None else paths.source_file(
            root, s.name, code="CONVERT_SOURCE_INVALID", what="side file", missing="was in the folder before the save and is gone")
        todo.append((s.name, source, path))
    copied = []
    for name, source, path in todo:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = os.path.join(os.path.dirname(path), f".qformat-{secrets.token_hex(8)}.tmp")
        try:
            copy_file(source, tmp)
            os.replace(tmp, path)
        except BaseException:
            if os.path.lexists(tmp):
                os.remove(tmp)
            raise
        copied.append(name)
    return copied


def reshard(index_path: str, descriptors: dict[str, Any], digests: dict[str, str] | None = None) -> None:
    """Rewrite the shards of a sharded save so that each is a complete qformat file (see
    :func:`save_pretrained`).  Every new shard is written to a temporary file first and all
    replace the old ones at the end, so a failure leaves the old shards (and raises).
    ``digests`` (stored name -> SHA-256 of the bytes the save wrote): each shard records those of
    the tensors it holds (the bytes move unchanged)."""
    from safetensors import safe_open as st_open
    from safetensors.torch import save_file as st_save

    from qformat import paths
    from qformat.checkpoint.output import file_metadata
    from qformat.descriptor import parse_descriptor
    from qformat.digests import with_digests

    folder = os.path.dirname(index_path)
    with open(index_path, encoding="utf-8") as f:
        index = json.load(f)
    where: dict[str, str] = dict(index["weight_map"])  # stored tensor -> shard, as written
    for shard in sorted(set(where.values()), key=str):
        # the path policy: shards are read, rewritten and replaced, so each must be a plain file
        # name of the save folder, a regular file or a link that stays inside it
        paths.source_file(folder, shard, code="INDEX_INVALID", what="shard", field="weight_map", single=True,
                          missing="listed in the index does not exist")
    place = dict(where)
    owner: dict[str, str] = {}
    for logical, desc in descriptors.items():
        comps = sorted({c for _, c in parse_descriptor(logical, desc).references()})
        missing = [c for c in comps if c not in where]
        if missing:
            raise error("SAVE_INVALID", f"component {missing[0]!r} is missing from the saved shards", tensor=logical)
        owner[logical] = where[comps[0]]
        for c in comps:
            place[c] = owner[logical]
    shards = sorted(set(place.values()))
    temps: list[tuple[str, str]] = []
    try:
        for shard in shards:
            names = sorted(n for n, s in place.items() if s == shard)
            tensors: dict[str, torch.Tensor] = {}
            for src in sorted({where[n] for n in names}):
                with st_open(os.path.join(folder, src), framework="pt") as f:
                    base = f.metadata() or {}
                    for n in names:
                        if where[n] == src:
                            tensors[n] = f.get_tensor(n)
            meta = {k: v for k, v in base.items() if k != "qformat"}
            meta = file_metadata(meta, {lg: d for lg, d in descriptors.items() if owner[lg] == shard}) or {}
            if "qformat" in meta and digests:
                meta["qformat"] = with_digests(meta["qformat"], {n: digests[n] for n in names if n in digests})
            tmp = os.path.join(folder, f".{shard}.qformat-tmp")
            st_save(tensors, tmp, metadata=meta)
            del tensors
            temps.append((tmp, os.path.join(folder, shard)))
    except BaseException:
        for tmp, _ in temps:
            if os.path.exists(tmp):
                os.remove(tmp)
        raise
    for tmp, dst in temps:
        os.replace(tmp, dst)
    for emptied in sorted(set(where.values()) - set(shards)):  # held only components that moved away
        os.remove(os.path.join(folder, emptied))
    weight_map = dict(place)
    weight_map.update(owner)
    index["weight_map"] = dict(sorted(weight_map.items()))
    tmp = index_path + ".qformat-tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, index_path)
