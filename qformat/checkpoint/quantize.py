"""``qformat quantize``: a plain (unquantized) checkpoint in, a qformat checkpoint out, streaming.

Which tensors and how: :mod:`qformat.recipe` (the default selection rule, recipes).  Every
output header is planned first from names, dtypes and shapes (each scheme's planner, :func:`qformat.schemes.plan`
says what each encoder writes without encoding); then each tensor is read from the source's
memory map, encoded and written only when the writer reaches it, its components at their
planned offsets, and the source's pages are dropped: peak memory is the largest tensor's
working set, whatever the checkpoint's size.  The destination appears in one rename when
every file was written and checked.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, TextIO

import numpy as np

from . import output as out_
from . import writer as checkpoint_writer
from .. import schemes
from .writer import OutFile, OutGroup, OutTensor
from ..container import TensorSpec
from ..errors import QFormatError, error
from ..qtensor import rename_references
from ..recipe import Choice, Decision, Recipe, choice as make_choice, decide, recipe_error

SOURCE_ERROR = "QUANTIZE_SOURCE_QUANTIZED"


@dataclass
class QuantizeSummary:
    """What ``quantize_checkpoint`` wrote: files, and per scheme label the tensors, source bytes
    and stored bytes; ``kept`` the tensors copied unchanged."""

    files: list[str] = field(default_factory=list)
    quantized: dict[str, dict[str, int]] = field(default_factory=dict)
    kept: dict[str, int] = field(default_factory=lambda: {"tensors": 0, "bytes": 0})
    bytes: int = 0
    source_bytes: int = 0
    recipe: dict[str, Any] = field(default_factory=dict)

    @property
    def quantized_tensors(self) -> int:
        return sum(v["tensors"] for v in self.quantized.values())

    def to_dict(self) -> dict[str, Any]:
        return {"files": self.files, "quantized": self.quantized, "quantized_tensors": self.quantized_tensors,
                "kept": self.kept, "bytes": self.bytes, "source_bytes": self.source_bytes, "recipe": self.recipe}

    def lines(self) -> list[str]:
        """The human summary: one line per scheme, one for the kept tensors, one total."""
        rows = []
        for label, v in self.quantized.items():
            rows.append(f"  quantized {v['tensors']:5d} tensors with {label}: {v['source_bytes'] / 1e6:,.1f} MB -> {v['bytes'] / 1e6:,.1f} MB")
        rows.append(f"  kept      {self.kept['tensors']:5d} tensors unchanged: {self.kept['bytes'] / 1e6:,.1f} MB")
        rows.append(f"  total {self.source_bytes / 1e6:,.1f} MB -> {self.bytes / 1e6:,.1f} MB in {len(self.files)} file(s)")
        return rows


def open_plain_source(src: str | os.PathLike[str]) -> Any:
    """The source as a :class:`qformat.convert.base.Checkpoint`, refusing one that holds
    quantized tensors (QUANTIZE_SOURCE_QUANTIZED, pointing to ``qformat convert``)."""
    from .source import Checkpoint

    ck = Checkpoint(src)
    fmt = quantized_format(ck)
    if fmt is not None:
        raise error(SOURCE_ERROR, f"{ck.path} holds quantized tensors ({fmt}); quantize takes plain checkpoints: "
                                  f"use `qformat convert {os.fspath(src)} DST` to turn it into qformat")
    return ck


def quantized_format(ck: Any) -> str | None:
    """The quantized format a source is in (a ``qformat convert`` id, or the config's
    ``quant_method``), or None for a plain checkpoint."""
    from ..convert.registry import REGISTRY

    if ck.kind != "safetensors":
        return ck.kind
    qc = ck.quantization_config()
    for conv in sorted((c() for c in REGISTRY.values()), key=lambda c: (c.priority, c.name)):
        try:
            if conv.detect(ck):
                return conv.name
        except QFormatError:
            return conv.name
    if qc is not None:
        m = qc.get("quant_method") if isinstance(qc, dict) else None
        return f"quantization_config quant_method {m!r}" if m else "a quantization_config"
    return None


def label(c: Choice) -> str:
    ps = " ".join(f"{k}={'none' if v is None else v}" for k, v in c.params.items())
    return c.scheme + (f" {ps}" if ps else "") + (f" dtype={c.dtype}" if c.dtype else "")


def resolve_recipe(scheme: str | None, recipe: Any, params: Mapping[str, Any]) -> Recipe:
    """The recipe a quantize request means: ``recipe`` (None, a :class:`Recipe`, a dict, TOML
    text or a path) with ``scheme`` and its ``params`` as the default rule; the same for
    ``qformat quantize``, ``quantize_checkpoint`` and quantize-on-load.  Raises
    QUANTIZE_RECIPE_INVALID or ENCODE_PARAM_INVALID."""
    if recipe is None:
        r = Recipe()
    elif isinstance(recipe, Recipe):
        r = Recipe(list(recipe.rules), recipe.default, recipe.source)
    elif isinstance(recipe, Mapping):
        r = Recipe.from_dict(recipe)
    else:
        r = Recipe.load(recipe)
    if scheme is not None:
        if r.default is not None:
            raise recipe_error("the recipe has a [default] and a scheme was given too; give the default in one place")
        r.default = make_choice(scheme, params)
    elif params:
        raise error("ENCODE_PARAM_INVALID", f"scheme parameters {', '.join(sorted(params))} were given without a scheme")
    if not r.rules and r.default is None:
        raise recipe_error("nothing to quantize: give a scheme (--scheme) or a recipe (--recipe)")
    return r


def verify_choices(decisions: list[Decision], infos: Mapping[str, Any], recipe_default: bool) -> None:
    """Check each (choice, rank, dtype) once against the encoder on a small proxy: parameter
    values (named by rule) and the exactness of the planned layout."""
    seen: set[tuple[Any, ...]] = set()
    for d in decisions:
        if d.choice is None:
            continue
        info = infos[d.name]
        key = (id(d.choice), len(info.shape), info.dtype)
        if key in seen:
            continue
        seen.add(key)
        dt = None
        try:
            dt = logical_dtype(info.dtype, d.choice.dtype)
            schemes.verify_plan(d.choice.scheme, len(info.shape), dt, **d.choice.params)
        except QFormatError as e:
            if d.rule is not None:
                raise recipe_error(f"{e} (for {d.name!r})", d.rule) from None
            if recipe_default:
                raise recipe_error(f"[default]: {e} (for {d.name!r})", field="default") from None
            raise


def quantize_checkpoint(src: str | os.PathLike[str], dst: str | os.PathLike[str], scheme: str | None = None, recipe: Any = None, *,
                        max_shard_size: int | str | None = None, overwrite: bool = False, progress: TextIO | None = None,
                        notice: Callable[[str], None] | None = None, **params: Any) -> QuantizeSummary:
    """Quantize the plain checkpoint ``src`` into a qformat checkpoint at ``dst``.

    ``src``: a folder (config.json with model.safetensors or a sharded index), a .safetensors
    file or an index.json.  ``dst``: a folder for a folder or sharded source (or with
    ``max_shard_size``), else a file.  ``scheme`` and ``params`` (as :func:`qformat.quantize`;
    ``dtype`` defaults to each tensor's own floating dtype) apply under the default selection
    rule; ``recipe`` (a TOML path, a :class:`~qformat.recipe.Recipe` or its dict) adds ordered
    rules.  A folder's other files and subfolders (tokenizer, sentence-transformers modules, ...)
    are carried unchanged (:func:`qformat.checkpoint.output.side_files`) and config.json gets
    qformat's ``quantization_config``.  Nothing is written unless everything succeeds.
    """
    from ..convert.writer import verify_output

    ck = open_plain_source(src)
    rec = resolve_recipe(scheme, recipe, params)
    recipe_default = scheme is None
    names = ck.names()
    infos = {n: ck.info(n) for n in names}
    decisions = decide(rec, infos, names)
    verify_choices(decisions, infos, recipe_default)
    dst = os.path.abspath(os.fspath(dst))
    as_folder = os.path.isdir(ck.path) or ck.sharded or max_shard_size is not None
    if dst == ck.path or (not as_folder and dst in [os.path.join(ck.folder, f) for f in ck.files]):
        raise error(checkpoint_writer.DESTINATION_ERROR, f"the destination {dst} is the source itself")
    checkpoint_writer.check_destination(dst, as_folder, overwrite)

    summary = QuantizeSummary(recipe=rec.to_dict())
    units: list[tuple[str, list[OutTensor], OutGroup | None, dict[str, Any] | None]] = []
    taken = set(names)
    for d in decisions:
        info = infos[d.name]
        nbytes = TensorSpec(d.name, info.dtype, info.shape).nbytes
        summary.source_bytes += nbytes
        if d.choice is None:
            c = ck.component(d.name)
            units.append((d.name, [OutTensor(c.spec, c.produce)], None, None))
            summary.kept["tensors"] += 1
            summary.kept["bytes"] += nbytes
            continue
        unit = _quantized_unit(ck, d.name, info, d.choice, taken)
        units.append(unit)
        row = summary.quantized.setdefault(label(d.choice), {"tensors": 0, "source_bytes": 0, "bytes": 0})
        row["tensors"] += 1
        row["source_bytes"] += nbytes
        row["bytes"] += sum(t.spec.nbytes for t in unit[1])

    # Files: the source's, or greedy shards of at most max_shard_size bytes.
    if max_shard_size is not None:
        where, order = out_.shard_by_size(((u[0], sum(t.spec.nbytes for t in u[1])) for u in units), out_.parse_size(max_shard_size))
        base_meta = ck.metadata(ck.files[0]) if ck.files else {}
        metas = {f: base_meta for f in order}
        index = out_.index_spec(ck, resharded=True) if len(order) > 1 else None
    else:
        where = {u[0]: ck.file_of(u[0]) for u in units}
        order = list(ck.files)
        metas = {f: ck.metadata(f) for f in order}
        index = out_.index_spec(ck, resharded=False)
    if not as_folder:
        order = [os.path.basename(dst)]
        where = {u[0]: order[0] for u in units}
        metas = {order[0]: ck.metadata(ck.files[0])}
    files: dict[str, OutFile] = {f: OutFile(f, None) for f in order}
    descs: dict[str, dict[str, Any]] = {f: {} for f in order}
    for name, tensors, group, desc in units:
        f = files[where[name]]
        f.tensors += tensors
        if group is not None:
            f.groups.append(group)
        if desc is not None:
            descs[f.name][name] = desc
            f.logical.append(name)
    for f in files.values():
        f.metadata = out_.file_metadata(metas[f.name], descs[f.name])
    outs = [files[f] for f in order if files[f].tensors or len(order) == 1]
    summary.bytes = sum(f.data_bytes for f in outs)

    extra: dict[str, bytes] = {}
    side: list[checkpoint_writer.SideFile] = []
    if as_folder:
        side = out_.source_side_files(ck, dst, skip={"config.json"})  # the model folder's tree, config.json rewritten
        from ..model import required_version

        alld = {k: v for d in descs.values() for k, v in d.items()}
        qc = {"quant_method": "qformat", "spec_version": required_version(alld) if alld else "1.0", **rec.to_dict()}
        summary.recipe = qc
        cfg = ck.config if (os.path.isdir(ck.path) or ck.sharded) else None
        if isinstance(cfg, dict):
            extra["config.json"] = out_.config_bytes(cfg, qc)
    bar = out_.ByteProgress(summary.bytes, progress, "quantize")
    try:
        summary.files = checkpoint_writer.write_checkpoint(
            dst, outs, as_folder=as_folder, overwrite=overwrite, side_files=side, index=index, verify=verify_output,
            written=out_.release_after(ck.release, bar), extra_files=extra, notice=notice)
    finally:
        bar.close()
    return summary


def logical_dtype(storage: str, requested: Any = None) -> str:
    """The logical dtype a tensor stored as ``storage`` is quantized to: ``requested`` when
    given, else the tensor's own floating dtype (float32 for F64)."""
    if requested is not None:  # checked where it is used (qformat.schemes.plan, as quantize checks it)
        return requested
    return {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float32"}[storage]


def _quantized_unit(ck: Any, name: str, info: Any, c: Choice, taken: set[str]) -> tuple[str, list[OutTensor], OutGroup, dict[str, Any]]:
    """The planned components of one quantized tensor and the group that encodes it once."""
    dtype = logical_dtype(info.dtype, c.dtype)
    desc, comps = schemes.plan(info.shape, c.scheme, dtype, **c.params)
    prefix = name + "."

    def rename(local: str) -> str:
        return local if (local == name or local.startswith(prefix)) else prefix + local

    desc = rename_references(desc, rename)
    specs = []
    for local, (st, shape) in comps.items():
        n = rename(local)
        if n in taken and n != name:
            raise error("SAVE_INVALID", f"component {n!r} of {name!r} would collide with a tensor of the source", tensor=name)
        specs.append(TensorSpec(n, st, shape))

    def produce() -> dict[str, np.ndarray]:
        from ..schemes import quantize

        q = quantize(ck.array(name), c.scheme, dtype=dtype, **c.params)
        q = q.renamed(rename)
        if q.descriptor != desc:
            raise error("SAVE_INVALID", "internal: the encoder's descriptor differs from the planned one", tensor=name)
        return q.components

    def never() -> np.ndarray:  # a grouped tensor is made by its group
        raise AssertionError(name)

    return name, [OutTensor(s, never) for s in specs], OutGroup(tuple(s.name for s in specs), produce), desc
