"""Writing a conversion: validate the descriptors, place tensors in files, write atomically.

The same for every source format.  In place, every source tensor is copied byte for byte
under its own name (from a memory map, in bounded chunks) and the descriptors are added to
``__metadata__``; with ``repack`` the described tensors are rewritten by
:mod:`qformat.convert.repack`.  A single-file source gives a single file; a folder or a
sharded index gives a folder with the same file names, the source folder's side tree
(config.json, tokenizer, subfolders: :func:`qformat.checkpoint.output.side_files`) copied, and
an index whose ``weight_map`` lists every stored and logical tensor.  With ``repack`` the
output is a self-contained qformat checkpoint: the source tensors and side files the converter
consumed are left out and config.json gets qformat's ``quantization_config``.  Files are
written beside the destination and moved into place only when everything succeeded.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, TextIO

import numpy as np

from ..checkpoint import output as out_
from ..checkpoint import writer as checkpoint_writer
from ..check import check_file
from ..descriptor import parse_descriptor
from ..validate import validate_descriptor
from ..errors import QFormatError, error
from ..model import qformat_json, required_version
from ..model import METADATA_KEY
from ..pipeline import Identity, Item, Plan, Transform, plan as plan_outputs, run, transform_all
from ..sources import TensorInfo
from .base import Checkpoint, Described, source_error
from .repack import Repack


class CombinedSource:
    """Source tensors (memory-mapped) overlaid with the converter's added arrays (produced when read)."""

    def __init__(self, ck: Checkpoint, described: Described):
        self.ck, self.added = ck, described.added

    def info(self, name: str) -> TensorInfo | None:
        if name in self.added:
            return self.added.info(name)
        return self.ck.info(name) if self.ck.kind == "safetensors" else None

    def array(self, name: str) -> np.ndarray:
        c = self.added.get_component(name)
        return c.produce() if c is not None else self.ck.array(name)

    def component(self, name: str) -> Any:
        c = self.added.get_component(name)
        return c if c is not None else self.ck.component(name)


@dataclass
class Summary:
    """What a conversion wrote."""

    files: list[str] = field(default_factory=list)
    logical: int = 0
    stored: int = 0
    bytes: int = 0
    #: A split run (:mod:`qformat.checkpoint.split`): each part's folder, files, bytes, wall and CPU seconds.
    parts: list[dict[str, Any]] = field(default_factory=list)


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


def _validated(described: Described, src: CombinedSource) -> dict[str, Any]:
    parsed = {}
    for name, raw in described.tensors():
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


def items(ck: Checkpoint, described: Described, repack: bool = False, file_name: str | None = None) -> Iterator[Item]:
    """The conversion as pipeline items, in output order: every described tensor (its
    components are the source or added tensors it references, placed in the file of its
    codes), then every source tensor no descriptor references (in its own file; with
    ``repack`` only those the converter did not consume either, ``Described.consumed``), then
    added and plain tensors no descriptor references (in the single output file, named after
    the source's file unless ``file_name`` is given).  Nothing is read beyond headers: components
    are produced when written."""
    src = CombinedSource(ck, described)
    parsed = _validated(described, src)
    single = ck.files[0] if ck.files else "model.safetensors"
    if ck.kind != "safetensors":
        single = file_name or os.path.splitext(ck.files[0])[0] + ".safetensors"

    def home(name: str) -> str:
        if ck.kind == "safetensors" and name in ck:
            return ck.file_of(name)
        return single

    referenced: dict[str, str] = {}  # stored name -> logical tensor that references it
    for name, desc in parsed.items():
        target = home(desc.codes.tensor)
        # A referenced tensor moves next to its codes: a logical tensor never spans shards (SPEC §14).
        for _, ref in desc.references():
            other = referenced.setdefault(ref, name)
            if other != name and not repack and home(ref) != target:
                raise error("CONVERT_UNSUPPORTED", f"tensor {ref!r} is shared by {other!r} and {name!r}, which the output would place in different files", tensor=name)
        comps = {ref: src.component(ref) for _, ref in desc.references()}
        yield Item(name, described.descriptors[name], comps, target, parsed=desc)
    if ck.kind == "safetensors":
        for n in ck.names():
            if n in referenced or n in described.dropped or (repack and n in described.consumed):
                continue
            yield Item(n, None, {n: ck.component(n)}, home(n))
    for n in described.added:
        if n not in referenced:
            yield Item(n, None, {n: described.added.component(n)}, single)
    for n in described.plain:
        yield Item(n, None, {n: described.plain.component(n)}, single)


def plan(ck: Checkpoint, described: Described, repack: bool, file_name: str | None = None) -> Plan:
    """Per output file: the stored components and the logical tensors' descriptor JSON (no array made)."""
    transform: Transform = Repack() if repack else Identity()
    src = CombinedSource(ck, described)
    p = plan_outputs(transform_all(items(ck, described, repack, file_name), transform, src),
                     order=ck.files if ck.kind == "safetensors" else None)
    if not p.order and ck.kind != "safetensors":  # a GGUF without tensors (a vocabulary): its metadata alone
        name = file_name or os.path.splitext(ck.files[0])[0] + ".safetensors"
        p.order.append(name)
        p.stored[name], p.descriptors[name] = {}, {}
    return p


def _metadata(ck: Checkpoint, file: str, described: Described, descs: dict[str, Any]) -> dict[str, str]:
    meta: dict[str, str] = {}
    if ck.kind == "safetensors" and file in ck.files:
        meta.update(ck.metadata(file))
    meta.pop(METADATA_KEY, None)
    meta.update(described.metadata)
    meta[METADATA_KEY] = qformat_json(descs, shard=True)  # a plain shard too: its digests (SPEC.md §3.8)
    return meta


def write(ck: Checkpoint, described: Described, dst: str, repack: bool = False, overwrite: bool = False,
          progress: TextIO | None = None, model_folder: Mapping[str, bytes] | None = None) -> Summary:
    """Write the conversion to ``dst`` (a file for a single-file source, else a folder).

    ``model_folder`` (a GGUF source made runnable, :mod:`qformat_transformers.gguf_layout`): ``dst``
    is a model folder holding ``model.safetensors`` and these files (config.json, tokenizer,
    ...) by name, instead of the single file.  The mapping is first read once the weights are
    written (an error it raises then removes them, and nothing is moved into place).

    Runs on :mod:`qformat.pipeline`: every header is planned from specs first, then each
    tensor is produced (copied from the source's memory map, repacked, or made by the
    converter) and written one at a time, the source's pages released after each.
    """
    as_folder = (ck.kind == "safetensors" and (os.path.isdir(ck.path) or ck.sharded)) or model_folder is not None
    dst = checkpoint_writer.resolve_destination(dst, as_folder, ck.files[0] if ck.kind == "safetensors" else
                                                os.path.splitext(ck.files[0])[0] + ".safetensors")
    if dst == ck.path or (not as_folder and dst in [os.path.join(ck.folder, f) for f in ck.files]):
        raise error("CONVERT_DESTINATION_INVALID", f"the destination {dst} is the source itself")
    checkpoint_writer.check_destination(dst, as_folder, overwrite)
    p = plan(ck, described, repack, "model.safetensors" if model_folder is not None else None)
    total = p.bytes
    bar = Progress(total, len(p.order), progress if len(p.order) > 1 else None)
    summary = Summary(logical=sum(len(d) for d in p.descriptors.values()), stored=sum(len(v) for v in p.stored.values()), bytes=total)
    side: list[checkpoint_writer.SideFile] = []
    # ``model_folder`` is passed on as it is, read only once the weights are written: its files
    # may still be in the making then (gguf_layout proves its tokenizer meanwhile)
    extra: Mapping[str, bytes] = model_folder if model_folder is not None else {}
    if as_folder and model_folder is None:  # a GGUF's folder is not a model folder: nothing beside it is copied
        skip: set[str] = set()
        if repack:  # qformat's config.json; the source format's own side files (read into descriptors) stay behind
            skip = {"config.json", *described.consumed_side_files}
            if isinstance(ck.config, dict):
                extra = {"config.json": out_.config_bytes(*repacked_config(ck, p.descriptors))}
        side = out_.source_side_files(ck, dst, skip)
    index = None
    if as_folder and ck.sharded:
        index = checkpoint_writer.IndexSpec(ck.index_name or "model.safetensors.index.json", dict(ck.index or {}))
    summary.files = run(p, dst, lambda f, descs: _metadata(ck, f, described, descs), as_folder=as_folder, overwrite=overwrite,
                        side_files=side, index=index, verify=verify_output, release=ck.release, file_done=bar.file_done,
                        extra_files=extra if model_folder is not None or extra else None)
    return summary


def repacked_config(ck: Checkpoint, descriptors: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config.json, its new ``quantization_config``) of a repacked checkpoint: the source's
    config with ``quantization_config`` replaced by qformat's, as ``qformat quantize`` writes it
    (``quant_method`` "qformat", ``spec_version`` the lowest version the descriptors need; a
    qformat source's recorded recipe kept).  Every other member stays, mlx-lm's
    ``quantization`` included (transformers does not read it; ``qformat export --to mlx`` takes
    its defaults from it, so the round trip keeps the source's config)."""
    from ..model import required_version

    cfg = dict(ck.config or {})
    source = ck.quantization_config()
    recorded = source if isinstance(source, dict) and source.get("quant_method") == "qformat" else {}
    alld = {n: d for per_file in descriptors.values() for n, d in per_file.items()}
    from ..digests import written_version

    qc = {"quant_method": "qformat", "spec_version": written_version(required_version(alld) if alld else "1.0")}
    qc.update((k, v) for k, v in recorded.items() if k not in qc)
    return cfg, qc


def verify_output(path: str) -> None:
    """Header-level check of a written file: a converter bug must not leave a bad file."""
    rep = check_file(path, payload=False)
    if not rep.ok:
        p = rep.problems[0]
        with_tensor = f" ({p.tensor})" if p.tensor else ""
        raise error("CONVERT_SOURCE_INVALID", f"the converted file fails qformat check: {p.code}{with_tensor}: {p.message}", tensor=p.tensor)
