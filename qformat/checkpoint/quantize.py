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

import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, TextIO

import numpy as np

from . import output as out_
from . import writer as checkpoint_writer
from .. import gguf_presets, schemes
from .gguf_plain import PlainGGUF
from .writer import OutFile, OutGroup, OutTensor
from ..container import TensorSpec
from ..errors import QFormatError, error
from ..qtensor import rename_references
from ..recipe import FLOAT_STORAGE, Choice, Decision, Recipe, choice as make_choice, decide, recipe_error

SOURCE_ERROR = "QUANTIZE_SOURCE_QUANTIZED"
#: The warning (an error with ``strict``) for group or block sizes that leave partial groups.
PARTIAL_GROUPS = "QUANTIZE_PARTIAL_GROUPS"


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
    #: Warnings, each ``{"code", "message", "tensors", "targets"}`` (``QUANTIZE_PARTIAL_GROUPS``).
    warnings: list[dict[str, Any]] = field(default_factory=list)
    #: A split run (``part`` / ``workers``): each part's folder, files, bytes, wall and CPU seconds.
    parts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def quantized_tensors(self) -> int:
        return sum(v["tensors"] for v in self.quantized.values())

    def to_dict(self) -> dict[str, Any]:
        return {"files": self.files, "quantized": self.quantized, "quantized_tensors": self.quantized_tensors,
                "kept": self.kept, "bytes": self.bytes, "source_bytes": self.source_bytes, "recipe": self.recipe,
                "warnings": self.warnings, **({"parts": self.parts} if self.parts else {})}

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
    if fmt == "qformat" and not _has_quantized(ck):
        return ck  # plain tensors only (`qformat convert` of an F32 / F16 GGUF): quantized as any plain checkpoint
    if fmt == "qformat":
        raise error(SOURCE_ERROR, f"{ck.path} is already a qformat checkpoint; quantize takes plain checkpoints: "
                                  f"`qformat dequantize {os.fspath(src)} PLAIN` gives one to quantize differently, "
                                  f"`qformat convert {os.fspath(src)} DST --repack` rewrites it in the canonical layout")
    if fmt is not None:
        raise error(SOURCE_ERROR, f"{ck.path} holds quantized tensors ({fmt}); quantize takes plain checkpoints: "
                                  f"use `qformat convert {os.fspath(src)} DST` to turn it into qformat")
    return ck


def _has_quantized(ck: Any) -> bool:
    """Whether a qformat checkpoint describes any quantized tensor."""
    from ..convert.qformat_ import QFormatSource

    return bool(QFormatSource().describe(ck).descriptors)


def open_source(src: str | os.PathLike[str]) -> Any:
    """The source of ``qformat quantize``: :func:`open_plain_source`, or for a GGUF file of plain
    tensors (F32 / F16 / BF16, what ``llama-quantize`` takes) a :class:`PlainGGUF`, which reads
    them in place and stands for the file's single-file conversion (``qformat convert model.gguf
    x.safetensors``: its GGUF names and record), so the output is the one quantizing that
    conversion gives.  A GGUF file holding quantized tensors is QUANTIZE_SOURCE_QUANTIZED, as any
    quantized source."""
    from .source import Checkpoint

    if isinstance(src, (str, os.PathLike)) and os.fspath(src).endswith((".safetensors", ".json")):
        return open_plain_source(src)
    if Checkpoint(src).kind != "gguf":
        return open_plain_source(src)
    return PlainGGUF(src)


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
        # by value: a preset's recipe has one rule (one Choice) per tensor, mostly alike
        key = (d.choice.scheme, repr(sorted(d.choice.params.items())), d.choice.dtype, len(info.shape), info.dtype)
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


def partial_axis(shape: tuple[int, ...], desc: Mapping[str, Any]) -> str | None:
    """How a planned descriptor's blocks leave a partial group (a sentence), or None when every
    group of every parameter is whole."""
    params = [v for v in desc.values() if isinstance(v, Mapping) and isinstance(v.get("blocks"), Mapping)]
    for prm in params:
        b = prm["blocks"]
        if b.get("type") == "flat":
            n, size = int(np.prod(shape)), int(b["size"])
            if n % size:
                return f"{n} values in flat blocks of {size}: the last block holds {n % size}"
            continue
        for axis, (n, size) in enumerate(zip(shape, b.get("size") or ())):
            if size is not None and n % int(size):
                return f"{n} values along axis {axis} in groups of {size}: the last group holds {n % int(size)}"
    return None


def _whole_shape(shape: tuple[int, ...], desc: Mapping[str, Any]) -> tuple[int, ...] | None:
    """``shape`` grown to whole groups of the descriptor's blocks (grid: each axis; flat: the
    last axis), None for a rank-0 tensor."""
    if not shape:
        return None
    out = list(shape)
    for v in desc.values():
        b = v.get("blocks") if isinstance(v, Mapping) else None
        if not isinstance(b, Mapping):
            continue
        if b.get("type") == "flat":  # grow the last axis until the flat blocks are whole
            size, rest = int(b["size"]), math.prod(out[:-1]) if out else 1
            while out and (rest * out[-1]) % size:
                out[-1] += 1
            continue
        for axis, size in enumerate(b.get("size") or ()):
            if size is not None and out[axis] % int(size):
                out[axis] += int(size) - out[axis] % int(size)
    return tuple(out)


def refusing_targets(name: str, shape: tuple[int, ...], desc: Mapping[str, Any], comps: Mapping[str, tuple[str, Any]]) -> list[str]:
    """The export targets whose mapping refuses a planned tensor (from its descriptor and
    component specs alone; nothing is encoded)."""
    from ..descriptor import parse_descriptor
    from ..export import get, targets
    from ..export.base import Context, Refusal
    from ..sources import TensorInfo

    class _Specs:
        def info(self, n: str) -> TensorInfo | None:
            c = comps.get(n)
            return None if c is None else TensorInfo(c[0], tuple(c[1]))

        def array(self, n: str) -> np.ndarray:
            raise KeyError(n)

    parsed = parse_descriptor(name, dict(desc))
    out = []
    for t in targets():
        try:
            get(t).map(name, parsed, Context(None, _Specs()))  # type: ignore[arg-type]
        except Refusal:
            out.append(t)
        except Exception:  # noqa: BLE001 - a target that needs more than the plan cannot say
            pass
    return out


def partial_group_warnings(decisions: list[Decision], infos: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One ``QUANTIZE_PARTIAL_GROUPS`` warning per choice whose group or block size leaves partial
    groups in some tensor: the tensors, the first one's arithmetic, and the export targets that
    refuse it.  Partial groups are valid qformat (SPEC.md §7), but most other formats have none."""
    by_choice: dict[int, tuple[Choice, list[str], str, list[str]]] = {}
    for d in decisions:
        if d.choice is None:
            continue
        info = infos[d.name]
        shape = tuple(info.shape)
        desc, comps = schemes.plan(shape, d.choice.scheme, logical_dtype(info.dtype, d.choice.dtype), **d.choice.params)
        why = partial_axis(shape, desc)
        if why is None:
            continue
        entry = by_choice.get(id(d.choice))
        if entry is None:
            refusing = refusing_targets(d.name, shape, desc, comps)
            whole = _whole_shape(shape, desc)
            if whole is not None and refusing:  # only the targets that refuse it for its partial groups
                wdesc, wcomps = schemes.plan(whole, d.choice.scheme, logical_dtype(info.dtype, d.choice.dtype), **d.choice.params)
                anyway = set(refusing_targets(d.name, whole, wdesc, wcomps))
                refusing = [t for t in refusing if t not in anyway]
            by_choice[id(d.choice)] = (d.choice, [d.name], why, refusing)
        else:
            entry[1].append(d.name)
    out = []
    for choice, names, why, refusing in by_choice.values():
        more = f" and {len(names) - 1} more" if len(names) > 1 else ""
        then = (f"; export --to {', --to '.join(refusing)} will refuse {'it' if len(names) == 1 else 'them'} (whole groups only)"
                if refusing else "")
        what = f"{label(choice)} leaves partial groups in {names[0]!r}{more} ({why})"
        msg = f"{what}; the file is valid{then}; choose a size that divides the axis, or pass --strict to refuse"
        out.append({"code": PARTIAL_GROUPS, "message": msg, "tensors": names, "targets": refusing,
                    "strict_message": f"{what}{then}; choose a size that divides the axis (without --strict this is a warning)"})
    return out


@checkpoint_writer.writing_for("quantize")
def quantize_checkpoint(src: str | os.PathLike[str], dst: str | os.PathLike[str], scheme: str | None = None, recipe: Any = None, *,
                        max_shard_size: int | str | None = None, overwrite: bool = False, progress: TextIO | None = None,
                        notice: Callable[[str], None] | None = None, strict: bool = False, preset: str | None = None,
                        imatrix: Any = None, part: Any = None, workers: int | None = None, **params: Any) -> QuantizeSummary:
    """Quantize the plain checkpoint ``src`` into a qformat checkpoint at ``dst``.

    ``src``: a folder (config.json with model.safetensors or a sharded index), a .safetensors
    file or an index.json; or a GGUF file of F32 / F16 / BF16 tensors, read in place as its
    single-file conversion would be (:mod:`qformat.checkpoint.gguf_plain`).  ``dst``: a folder
    for a folder or sharded source (or with ``max_shard_size``), else a file.  ``scheme`` and ``params`` (as :func:`qformat.quantize`;
    ``dtype`` defaults to each tensor's own floating dtype) apply under the default selection
    rule; ``recipe`` (a TOML path, a :class:`~qformat.recipe.Recipe` or its dict) adds ordered
    rules.  A folder's other files and subfolders (tokenizer, sentence-transformers modules, ...)
    are carried unchanged (:func:`qformat.checkpoint.output.side_files`) and config.json gets
    qformat's ``quantization_config``.  Nothing is written unless everything succeeds.

    ``preset`` (Q4_K_M, Q5_K_M, ... :mod:`qformat.gguf_presets`) instead of a scheme or recipe:
    llama-quantize's mix of GGUF types for this checkpoint, as the recipe
    :func:`preset_recipe` gives; config.json's quantization_config records ``gguf_preset``.

    ``imatrix`` (a path or a loaded :class:`qformat.imatrix.Imatrix`): llama.cpp's importance
    matrix, applied as ``llama-quantize --imatrix`` applies it to every tensor quantized with
    scheme ``gguf`` that it has an entry for (looked up by GGUF name); with it the presets take
    their importance-matrix branches, and Q2_K_S becomes possible.  quantization_config records
    the file's name, format, entry and chunk counts and datasets under ``imatrix``.

    A group or block size that leaves partial groups is a ``QUANTIZE_PARTIAL_GROUPS`` warning
    (in ``summary.warnings`` and through ``notice``, naming the export targets that refuse such
    tensors); with ``strict`` it is that error and nothing is written.

    ``part`` ("K/N") writes only part K of N of the output's shards into ``DST.parts/`` for a
    later :func:`qformat.checkpoint.split.merge`; ``workers`` (N) runs N such parts as N
    processes and merges them: the same files as one process writes
    (:mod:`qformat.checkpoint.split`).
    """
    from ..convert.writer import verify_output

    if part is not None or workers is not None:
        from . import split

        kwargs = dict(src=src, dst=dst, scheme=scheme, recipe=recipe, max_shard_size=max_shard_size, overwrite=overwrite,
                      progress=progress, notice=notice, strict=strict, preset=preset, imatrix=imatrix, **params)
        return split.run(quantize_checkpoint, kwargs, command="quantize", part=part, workers=workers, notice=notice)

    ck = open_source(src)
    im = _load_imatrix(imatrix)
    resolved = None
    if preset is not None:
        if scheme is not None or recipe is not None or params:
            raise error("ENCODE_PARAM_INVALID", "a preset is a whole recipe: give --preset alone, without a scheme, its options or --recipe",
                        field="preset")
        resolved = resolve_preset(ck, preset, has_imatrix=im is not None)
        for note in resolved.notes:
            if notice is not None:
                notice(f"note: {note}")
        recipe = gguf_presets.recipe(resolved)
    rec = resolve_recipe(scheme, recipe, params)
    recipe_default = scheme is None
    names = ck.names()
    infos = {n: ck.info(n) for n in names}
    decisions = decide(rec, infos, names)
    verify_choices(decisions, infos, recipe_default)
    importance = importance_vectors(ck, im, decisions, infos, resolved)
    warnings = partial_group_warnings(decisions, infos)
    strict_messages = [w.pop("strict_message") for w in warnings]
    if warnings and strict:
        w = warnings[0]
        raise error(PARTIAL_GROUPS, strict_messages[0], tensor=w["tensors"][0])
    for w in warnings:
        if notice is not None:
            notice(f"warning: [{w['code']}] {w['message']}")
    as_folder = os.path.isdir(ck.path) or ck.sharded or max_shard_size is not None
    dst = checkpoint_writer.resolve_destination(dst, as_folder, ck.files[0])
    # a GGUF file's tensors stand for its single-file conversion, which is no file: any other path will do
    own = [] if isinstance(ck, PlainGGUF) else [os.path.join(ck.folder, f) for f in ck.files]
    if dst == ck.path or (not as_folder and dst in own):
        raise checkpoint_writer.destination_error(f"the destination {dst} is the source itself")
    checkpoint_writer.check_destination(dst, as_folder, overwrite)

    summary = QuantizeSummary(recipe=rec.to_dict(), warnings=warnings)
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
        unit = _quantized_unit(ck, d.name, info, d.choice, taken, importance.get(d.name))
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
    if resolved is not None:  # a GGUF source's record becomes what llama-quantize writes (export --to gguf reads it)
        from ..export.gguf import imatrix_kvs

        # quantize.imatrix.file: the path as given, as llama-quantize writes its argument (config.json keeps the name)
        im_kvs = imatrix_kvs({"quantization_config": {"imatrix": {**_imatrix_record(im, importance), "file": im.path}}}) if im is not None else []
        metas = {f: gguf_presets.quantized_metadata(m, resolved, im_kvs) for f, m in metas.items()}
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
        from ..digests import written_version

        qc = {"quant_method": "qformat", "spec_version": written_version(required_version(alld) if alld else "1.0"), **rec.to_dict()}
        if preset is not None:
            qc["gguf_preset"] = preset
        if im is not None:
            qc["imatrix"] = _imatrix_record(im, importance)
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


def resolve_preset(ck: Any, preset: str, has_imatrix: bool = False) -> "gguf_presets.Resolved":
    """The per-tensor types of ``preset`` for the opened plain checkpoint ``ck``."""
    names = ck.names()
    infos = {n: ck.info(n) for n in names}
    cfg = _config(ck)
    shapes = {n: tuple(i.shape) for n, i in infos.items() if i.dtype in FLOAT_STORAGE}
    names = gguf_presets.gguf_names(list(shapes), cfg)
    from ..export.gguf import gguf_metadata

    found = gguf_metadata(ck)  # a converted GGUF: its head counts where config.json has none (a single file has no config.json)
    if found is not None:
        cfg = {**gguf_presets.gguf_hparams(found[0]["kv"]), **{k: v for k, v in cfg.items() if v is not None}}
    return gguf_presets.resolve(preset, shapes, cfg, names, has_imatrix=has_imatrix)


def preset_recipe(src: str | os.PathLike[str], preset: str, imatrix: Any = None) -> "gguf_presets.Resolved":
    """``preset`` resolved for the plain checkpoint ``src`` (what ``qformat quantize --preset``
    applies, with ``imatrix`` given or not; :func:`qformat.gguf_presets.recipe_toml` writes it
    as an editable recipe)."""
    return resolve_preset(open_source(src), preset, has_imatrix=imatrix is not None)


def _imatrix_record(im: Any, importance: Mapping[str, Any]) -> dict[str, Any]:
    """What quantization_config records of an applied importance matrix."""
    return {"file": os.path.basename(im.path), "format": im.format, "entries": len(im.entries),
            "chunks": im.chunk_count, "datasets": list(im.datasets), "applied": len(importance)}


def _config(ck: Any) -> dict[str, Any]:
    return ck.config if isinstance(getattr(ck, "config", None), dict) else {}


def _load_imatrix(imatrix: Any) -> Any:
    from ..imatrix import Imatrix, load_imatrix

    if imatrix is None or isinstance(imatrix, Imatrix):
        return imatrix
    return load_imatrix(imatrix)


def importance_vectors(ck: Any, im: Any, decisions: list[Decision], infos: Mapping[str, Any],
                       resolved: "gguf_presets.Resolved | None") -> dict[str, np.ndarray]:
    """The importance vector of each tensor quantized with scheme ``gguf`` that the importance
    matrix ``im`` has an entry for (by the tensor's GGUF name), as llama-quantize looks them up.
    ENCODE_PARAM_INVALID when no tensor uses scheme gguf; IMATRIX_INVALID for an entry of the
    wrong length, or a tensor a preset cannot quantize without one (Q2_K_S)."""
    if im is None:
        return {}
    gg = [d.name for d in decisions if d.choice is not None and d.choice.scheme == "gguf"]
    if not gg:
        raise error("ENCODE_PARAM_INVALID", "an importance matrix weights scheme gguf's quantizers (llama.cpp's types), and no tensor "
                    "is quantized with scheme gguf; use --preset or --scheme gguf", field="imatrix")
    names = gguf_presets.gguf_names(gg, _config(ck))
    out: dict[str, np.ndarray] = {}
    for n in gg:
        shape = tuple(infos[n].shape)
        v = im.for_tensor(names.get(n), shape[-1] if shape else 0, shape[0] if len(shape) == 3 else 1)
        if v is not None:
            out[n] = v
    for n in resolved.needs_imatrix if resolved is not None else ():
        if n not in out:
            raise error("IMATRIX_INVALID", f"{os.path.basename(im.path)} has no entry for {names.get(n) or n!r}, and {resolved.preset} "
                        "quantizes it to Q2_K, which llama-quantize refuses without one", tensor=n)
    return out


def logical_dtype(storage: str, requested: Any = None) -> str:
    """The logical dtype a tensor stored as ``storage`` is quantized to: ``requested`` when
    given, else the tensor's own floating dtype (float32 for F64)."""
    if requested is not None:  # checked where it is used (qformat.schemes.plan, as quantize checks it)
        return requested
    return {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float32"}[storage]


def _quantized_unit(ck: Any, name: str, info: Any, c: Choice, taken: set[str],
                    importance: np.ndarray | None = None) -> tuple[str, list[OutTensor], OutGroup, dict[str, Any]]:
    """The planned components of one quantized tensor and the group that encodes it once
    (``importance``: its importance vector for scheme gguf, from an importance matrix)."""
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

        extra = {} if importance is None else {"importance": importance}
        try:
            q = quantize(ck.array(name), c.scheme, dtype=dtype, **c.params, **extra)
        except QFormatError as e:
            if e.tensor is not None:
                raise
            if importance is not None and e.code == "ENCODE_INPUT_INVALID" and _encodes(name, c, dtype):
                # the weights alone encode: the importance values overflowed the weighted quantizer
                raise error("IMATRIX_INVALID", f"the importance matrix's entry for this tensor (largest value "
                            f"{float(np.max(importance)):.6g}) makes the weighted quantizer fail ({e.message}); the same "
                            "weights quantize without it", tensor=name, field="imatrix") from None
            raise error(e.code, e.message, tensor=name, field=e.field) from None  # the encoder does not know the name
        q = q.renamed(rename)
        if q.descriptor != desc:
            raise error("SAVE_INVALID", "internal: the encoder's descriptor differs from the planned one", tensor=name)
        return q.components

    def _encodes(name: str, c: Choice, dtype: str) -> bool:
        from ..schemes import quantize

        try:
            quantize(ck.array(name), c.scheme, dtype=dtype, **c.params)
        except QFormatError:
            return False
        return True

    def never() -> np.ndarray:  # a grouped tensor is made by its group
        raise AssertionError(name)

    return name, [OutTensor(s, never) for s in specs], OutGroup(tuple(s.name for s in specs), produce), desc
