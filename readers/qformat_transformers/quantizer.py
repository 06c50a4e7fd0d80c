"""QFormatHfQuantizer: transformers' ``from_pretrained`` / ``save_pretrained`` for qformat.

Loading a qformat checkpoint (``pre_quantized``):

1. :meth:`preprocess_model` (the model is still on the meta device) reads each checkpoint
   file's header with the core (no tensor data), validates every descriptor, and replaces each
   ``nn.Linear`` whose ``weight`` is a quantized logical tensor of its shape (names mapped as
   transformers maps them: :class:`qformat_transformers.strict.NameMap`) by a
   :class:`PendingQLinear`: a placeholder without a weight whose (meta) buffers mirror the
   tensor's components under their stored names, so transformers' own loader reads the packed
   bytes into them (device map, threads and all) and sees neither unexpected nor missing keys;
2. :meth:`update_weight_conversions` (the list transformers will load with is known) adds a
   :class:`qformat_transformers.decoded.DecodeConverter` for every other logical tensor (an
   embedding, a norm: decoded into its entry by the loader itself), then compares the
   checkpoint's names and shapes with the model's exactly as the loader will
   (:func:`qformat_transformers.strict.predict`) and, with ``QFormatConfig(strict=True)`` (the
   default), raises LOAD_MISMATCH naming what does not fit, before any tensor is read;
3. :meth:`postprocess_model` turns each placeholder into a
   :class:`qformat_torch.nn.QLinear` over those same tensors (no copy, never decoded to full
   precision).

A quantized embedding whose rows can be gathered (:func:`qformat_torch.embedding.rows_movable`)
of an ``nn.Embedding`` whose forward :mod:`qformat_torch.embedding` reproduces (``nn.Embedding``'s,
Gemma's scaled one) is not decoded either: step 1 gives its module meta buffers under the
components' names in place of its ``weight``, and step 3 makes it a packed embedding (lookups
decode only the rows asked for, bit for bit) and a head tied to it a
:class:`qformat_torch.embedding.TiedHead` (a QLinear over the same buffers: under the "decode"
policy F.linear on the decoded table, bit for bit, as the tied dense head).  Asking for the
embedding's ``weight`` makes it (and its heads) the plain decoded, tied modules a decoded load
gives.

Quantizing on load (``QFormatConfig(scheme=...)`` or ``recipe=...`` on a plain checkpoint):
the selected Linear modules (``qformat quantize``'s rules over the checkpoint's names, dtypes
and shapes) become placeholders that keep a meta ``weight``; transformers reads each weight in
turn and hands it to :class:`QFormatQuantize`, which encodes it with ``qformat.quantize`` and
drops the full-precision tensor, and hands the tensor's pages (a view of transformers' mmap of
the checkpoint) back to the kernel (:func:`qformat_torch.kernels.release_file_pages`): peak
memory is the packed model plus one layer, not the pages of every weight read so far.  The
checkpoint is compared with the model as in step 2.

``save_pretrained`` writes each QLinear as a qformat logical tensor ``<module>.weight`` with
its components under ``<module>.weight.<component>`` (what ``qformat quantize`` writes) and the
descriptors in the file's ``__metadata__``; a tensor the loader decoded (an embedding, a norm)
that still holds exactly what was decoded goes back in its scheme, over the source file's own
component bytes (a Q8_0 embedding stays Q8_0), and a folder converted from a GGUF keeps its
GGUF record (``gguf``/``gguf.kv.*``), so the save exports as the folder does.  transformers writes that one ``__metadata__`` into
every shard of a sharded save, so a model loaded through qformat gets its own ``save_pretrained``
(:func:`qformat_transformers.saving.save_pretrained`), which rewrites a sharded save into shards that are each complete
qformat files (SPEC §14), and refuses a sharded ``push_to_hub`` before writing.
"""

from __future__ import annotations

import functools
import json
import re
import types
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers.conversion_mapping import get_model_conversion_mapping
from transformers.core_model_loading import ConversionOps
from transformers.quantizers import HfQuantizer

import qformat
from qformat.checkpoint.source import admit_files
from qformat.errors import QFormatError, error, raise_first
from qformat.qtensor import rename_references

from qformat_torch.kernels import release_file_pages
from qformat_torch.mismatch import MISMATCH_CODE

from .config import QFormatConfig
from .decoded import DecodeConverter, decode_converter
from .strict import KeyReport, NameMap, predict

__all__ = ["MISMATCH_CODE", "PendingQLinear", "QFormatHfQuantizer"]


@dataclass
class Planned:
    """One quantized logical tensor of the checkpoint that lands in a QLinear."""

    name: str  # logical tensor name in the checkpoint
    module: str  # module path in the model
    file: str = ""
    descriptor: dict[str, Any] = field(default_factory=dict)
    mirrored: dict[str, str] = field(default_factory=dict)  # component -> placeholder-relative buffer path
    from_file: list[str] = field(default_factory=list)  # components read by us (outside the module's names)


@dataclass
class Quantized:
    """One quantized logical tensor of the checkpoint, as its header describes it: packed into a
    QLinear when it is the weight of an ``nn.Linear`` of its shape, else decoded into its entry
    by the loader."""

    name: str
    file: str
    descriptor: dict[str, Any]  # JSON, as stored
    shape: tuple[int, ...]
    components: dict[str, tuple[str, tuple[int, ...]]]  # stored name -> (storage dtype, shape)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` (same dtype and shape) hold the same bits (NaNs and signed zeros included)."""
    from qformat_torch.dtypes import int_view_dtype

    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype is torch.bool or a.element_size() not in (1, 2, 4, 8):
        return bool(torch.equal(a, b))
    dt = int_view_dtype(a.element_size())
    return bool(torch.equal(a.contiguous().view(dt), b.contiguous().view(dt)))


class PendingQLinear(nn.Module):
    """Stands in for an ``nn.Linear`` while transformers loads: it has the bias (a parameter
    transformers fills) and either buffers mirroring the packed components (loading a qformat
    checkpoint) or a meta ``weight`` to be quantized as it arrives (quantizing on load)."""

    def __init__(self, linear: nn.Linear, logical: str, keep_weight: bool):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.logical = logical
        self.packed: Any = None
        if keep_weight:
            self.weight = linear.weight
        if linear.bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError(f"{self.logical}: this placeholder is replaced by a QLinear when from_pretrained finishes")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, logical={self.logical!r}"


def _set_module(model: nn.Module, path: str, new: nn.Module) -> None:
    parent_name, _, attr = path.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, attr, new)


def _get_module(model: nn.Module, path: str) -> nn.Module | None:
    try:
        return model.get_submodule(path) if path else model
    except AttributeError:
        return None


def _linear_target(model: nn.Module, names: NameMap, name: str, entries: dict[str, Any],
                   shape: tuple[int, ...]) -> tuple[str, nn.Linear] | None:
    """(module path, module) of the ``nn.Linear`` whose weight the checkpoint tensor ``name``
    of logical shape ``shape`` loads into (as transformers maps the name), or None."""
    target, pattern = names.target(name, entries)
    if pattern is not None or target not in entries:
        return None
    mpath, _, attr = target.rpartition(".")
    mod = _get_module(model, mpath)
    if attr != "weight" or not isinstance(mod, nn.Linear) or tuple(shape) != (mod.out_features, mod.in_features):
        return None
    return mpath, mod


def _moved(renamed: str, target: str, other: str) -> str | None:
    """``other`` given the base model prefix step that took ``renamed`` to ``target`` (none, a
    prefix added, a prefix stripped); None when ``other`` does not have the stripped prefix."""
    if target == renamed:
        return other
    if target.endswith("." + renamed):
        return target[: len(target) - len(renamed)] + other
    head = renamed[: len(renamed) - len(target)]
    if renamed.endswith("." + target) and other.startswith(head):
        return other[len(head):]
    return None


def _untie(model: nn.Module, entry: str) -> None:
    """Drop the weight ties that involve ``entry``: its module becomes a packed layer, whose
    weight is its own (a head stored quantized next to its embedding), so there is no parameter
    left to share and transformers' tie_weights must not look for one."""
    tied = getattr(model, "all_tied_weights_keys", None)
    if tied:
        for target, source in list(tied.items()):
            if entry in (target, source):
                del tied[target]


def local_names(logical: str, components: list[str]) -> dict[str, str]:
    """component (stored name) -> the name it has inside the QLinear: without ``<logical>.`` or,
    failing that, without the module's ``<module>.`` (in-place sources name ``P.qweight``)."""
    module = logical.rpartition(".")[0]
    out = {}
    for c in components:
        if c.startswith(logical + "."):
            out[c] = c[len(logical) + 1:]
        elif module and c.startswith(module + "."):
            out[c] = c[len(module) + 1:]
        else:
            out[c] = c
    if len(set(out.values())) != len(out):
        return {c: c for c in components}
    return out


def _storage_torch(name: str) -> torch.dtype:
    from qformat_torch.dtypes import STORAGE_TORCH

    return STORAGE_TORCH[name]


def _add_mirror(holder: nn.Module, rel: str, dtype: torch.dtype, shape: tuple[int, ...]) -> bool:
    """Register a meta buffer at ``holder``'s relative dotted path ``rel`` (child modules made
    as needed); False when the path collides with something already there."""
    parts = rel.split(".")
    mod = holder
    for p in parts[:-1]:
        child = getattr(mod, p, None) if p in dict(mod.named_children()) else None
        if child is None:
            if hasattr(mod, p):
                return False
            child = nn.Module()
            mod.add_module(p, child)
        mod = child
    leaf = parts[-1]
    if hasattr(mod, leaf) or not leaf or not all(parts):
        return False
    mod.register_buffer(leaf, torch.empty(shape, dtype=dtype, device="meta"))
    return True


def _get_rel(holder: nn.Module, rel: str) -> torch.Tensor:
    mod_path, _, leaf = rel.rpartition(".")
    mod = holder.get_submodule(mod_path) if mod_path else holder
    return getattr(mod, leaf)


def _module_device(model: nn.Module, path: str, fallback: torch.Tensor | None = None) -> torch.device:
    if fallback is not None and fallback.device.type != "meta":
        return fallback.device
    while True:
        mod = _get_module(model, path)
        if mod is not None:
            for t in list(mod.parameters()) + list(mod.buffers()):
                if t.device.type != "meta":
                    return t.device
        if not path:
            return torch.device("cpu")
        path = path.rpartition(".")[0]


class QFormatQuantize(ConversionOps):
    """Quantize-on-load op: encode the arriving full-precision weight with ``qformat.quantize``
    and park the packed tensor on its placeholder (the weight itself is dropped)."""

    def __init__(self, hf_quantizer: "QFormatHfQuantizer"):
        self.hf_quantizer = hf_quantizer

    def convert(self, input_dict: dict[str, Any], full_layer_name: str | None = None, model: Any = None,
                missing_keys: Any = None, **kwargs: Any) -> dict[str, Any]:
        for name, value in input_dict.items():
            value = value[0] if isinstance(value, list) else value
            self.hf_quantizer.encode_into(model, name, value)
            release_file_pages(value)  # its pages, read through transformers' mmap
            if missing_keys is not None:
                missing_keys.discard(name)
        return {}


class QFormatHfQuantizer(HfQuantizer):
    """The transformers quantizer of ``quant_method: "qformat"`` (see the module docstring)."""

    requires_calibration = False

    def __init__(self, quantization_config: QFormatConfig, **kwargs: Any):
        super().__init__(quantization_config, **kwargs)
        self.planned: dict[str, Planned] = {}  # model module path -> plan
        self.mirror_keys: set[str] = set()
        self.decoded: list[Quantized] = []  # decoded into an entry by the loader (DecodeConverter)
        #: embedding module path -> (its tensor, component -> buffer path relative to the module,
        #: entry dtype, paths of the heads tied to it): kept packed (:meth:`_place_embedding`)
        self.packed_embeddings: dict[str, tuple[Quantized, dict[str, str], torch.dtype, list[str]]] = {}
        self.decoded_entries: dict[str, Quantized] = {}  # model entry -> the decoded tensor it holds (kept in its scheme on save)
        #: The GGUF record of a folder ``qformat convert`` made from a GGUF (``__metadata__`` members
        #: ``gguf`` and ``gguf.kv.*``), carried into what save_pretrained writes, so that the save
        #: exports to the GGUF's own key/values as the folder does.
        self.source_metadata: dict[str, str] = {}
        self.to_quantize: dict[str, tuple[str, Any, str]] = {}  # model weight name -> (ckpt name, choice, logical dtype)
        self.errors: list[QFormatError] = []
        self.descriptors: dict[str, Any] = {}
        self.stored: dict[str, tuple[int, ...]] | None = None  # every stored tensor's shape (None: no headers)
        self.logical_of: dict[str, str] = {}  # component -> its logical tensor
        #: What loading will leave missing, unexpected or misshapen (see :func:`qformat_transformers.strict.predict`).
        self.key_report: KeyReport | None = None
        #: ``qformat check``'s rules for the checkpoint's files (None: quantizing on load, or unchecked())
        self.admission: Any = None

    # -- transformers' hooks -------------------------------------------------------------------
    def validate_environment(self, *args: Any, **kwargs: Any) -> None:
        if not self.pre_quantized and not self.quantization_config.quantizes:
            raise error("QUANTIZE_RECIPE_INVALID", "QFormatConfig() on a plain checkpoint quantizes nothing: "
                                                   "give a scheme (QFormatConfig(scheme=...)) or a recipe")

    def is_serializable(self, *args: Any, **kwargs: Any) -> bool:
        return True

    @property
    def is_trainable(self) -> bool:
        return False

    def param_needs_quantization(self, model: Any, param_name: str, **kwargs: Any) -> bool:
        return not self.pre_quantized and param_name in self.to_quantize

    def get_quantize_ops(self) -> ConversionOps:
        return QFormatQuantize(self)

    def get_new_dtype(self, converter: Any, param: Any, dtype: Any) -> Any:
        if isinstance(converter, DecodeConverter):
            # the decoded value gets the dtype a plain tensor for this entry would get
            converter.operations[0].dtype = dtype
            return None  # its components arrive as stored
        if any(t in self.mirror_keys for t in getattr(converter, "target_patterns", ())):
            return None  # packed components keep their storage dtype
        return super().get_new_dtype(converter, param, dtype)

    def preprocess_model(self, model: Any, dtype: Any = None, **kwargs: Any) -> None:
        super().preprocess_model(model, dtype=dtype, **kwargs)
        files = [str(f) for f in (kwargs.get("checkpoint_files") or [])]
        if not files or not all(f.endswith(".safetensors") for f in files):
            files = []  # no headers to read (a state_dict, .bin files): nothing to plan or compare
        # The model's own conversion mapping (a from_pretrained(key_mapping=...) is not known
        # yet: update_weight_conversions compares with the full list).
        names = NameMap(model, get_model_conversion_mapping(model))
        if self.pre_quantized:
            self._plan_load(model, files, names)
        else:
            self._plan_quantize(model, files, names)

    def update_weight_conversions(self, weight_conversions: Any, model: Any) -> Any:
        """transformers' conversion list, plus one decoding converter per quantized tensor that is
        not a QLinear's weight; then the strict comparison (LOAD_MISMATCH), before any read."""
        conversions = list(super().update_weight_conversions(weight_conversions, model))
        if self.stored is None:
            return conversions
        names = NameMap(model, conversions)
        # from_pretrained(key_mapping=...) renamings are first seen here: a Linear weight that
        # only they name is packed now rather than decoded
        entries = model.state_dict()
        self.decoded = [q for q in self.decoded if not self._place(model, q, names, entries)]
        self._ignore_own_tensors(model, names)
        decoders = [decode_converter(q.name, q.descriptor, list(q.components), q.shape, names, self.errors) for q in self.decoded]
        self.decoded_entries = {t: q for q in self.decoded if (t := names.target(q.name, entries)[0]) in entries}
        conversions += decoders
        decoded = {p: op.shape for dc in decoders for op in dc.operations for p in dc.source_patterns}
        self.key_report = predict(model, self.stored, conversions, logical_of=self.logical_of,
                                  quantized_on_load=self.to_quantize, decoded=decoded)
        found = self.key_report.mismatch
        if found and self.quantization_config.strict:
            prefix = getattr(model, "base_model_prefix", "")
            raise found.error(type(model).__name__, (
                f"Names are compared as transformers maps them (its conversion mapping, base model prefix {prefix!r}). "
                "QFormatConfig(strict=False) leaves this to transformers' own loading report "
                "(for a qformat checkpoint: config=qformat_config(path, QFormatConfig(strict=False)))"))
        return conversions

    def _ignore_own_tensors(self, model: nn.Module, names: NameMap) -> None:
        """Stored tensors that belong to a packed layer without being loaded into the model join
        the model's ``_keys_to_ignore_on_load_unexpected``, the list transformers' loading report
        skips (and the strict comparison reads):

        * components qformat reads from the file itself (``Planned.from_file``: bitsandbytes'
          ``P.weight.absmax`` when the codes are ``P.weight`` itself, so no buffer can sit under
          that name);
        * in a checkpoint ``qformat convert`` described in place, the source format's tensors
          that no descriptor references (GPTQ's ``P.g_idx`` without activation order,
          bitsandbytes' ``P.weight.quant_map`` and quant-state blob, compressed-tensors'
          ``P.weight_shape``): the plain tensors under a quantized tensor's own names (``P.*`` of
          a packed Linear ``P``, bias and weight apart; ``L.*`` of a decoded ``L``) that have no
          place in the model.
        """
        entries = model.state_dict()
        own = {c for plan in self.planned.values() for c in plan.from_file}
        packed = tuple(plan.name.rpartition(".")[0] + "." for plan in self.planned.values())
        decoded = tuple(q.name + "." for q in self.decoded if names.target(q.name, entries)[0] in entries)
        for name in self.stored or {}:
            if name in self.logical_of or name in self.descriptors:
                continue
            layer = next((p for p in packed if name.startswith(p)), None)
            in_layer = layer is not None and name[len(layer):] not in ("weight", "bias")
            if in_layer or (bool(decoded) and name.startswith(decoded)):
                own.add(name)
        patterns = set()
        for name in own:
            target, _ = names.target(name, entries)
            if target not in entries:
                patterns.add(f"^{re.escape(target)}$")
        if patterns:
            model._keys_to_ignore_on_load_unexpected = set(model._keys_to_ignore_on_load_unexpected or ()) | patterns

    def postprocess_model(self, model: Any, **kwargs: Any) -> Any:
        out = super().postprocess_model(model, **kwargs)
        if self.errors:
            raise self.errors[0]
        if self.pre_quantized:
            self._finish_load(model)
        else:
            self._finish_quantize(model)
        # save_pretrained writes one __metadata__ into every shard; ours splits it per shard
        from .saving import save_pretrained

        model.save_pretrained = types.MethodType(save_pretrained, model)
        return out

    def get_state_dict_and_metadata(self, model: Any) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        from qformat.checkpoint.output import file_metadata
        from qformat.digests import with_digests
        from qformat_torch.dtypes import tensor_sha256
        from qformat_torch.embedding import PackedEmbedding
        from qformat_torch.nn import QLinear

        sd = model.state_dict()
        descs: dict[str, Any] = {}
        comps: dict[str, torch.Tensor] = {}
        for path, mod in model.named_modules():
            if not isinstance(mod, QLinear | PackedEmbedding):
                continue
            prefix = f"{path}." if path else ""
            for k in [k for k in sd if k.startswith(prefix) and k != prefix + "bias"
                      and (isinstance(mod, QLinear) or k[len(prefix):].startswith("qweight_"))]:
                del sd[k]
            logical = prefix + "weight"
            pw = mod.packed_weight()

            def rename(local: str, lg: str = logical) -> str:
                return f"{lg}.{local}"

            descs[logical] = rename_references(pw.descriptor, rename)
            for c, t in pw.components.items():
                comps[rename(c)] = t
        self._keep_decoded(model, sd, descs, comps)
        clash = sorted(set(comps) & set(sd))
        if clash:
            raise error("SAVE_INVALID", f"component {clash[0]!r} would collide with a tensor of the model", tensor=clash[0])
        sd.update(comps)
        meta = file_metadata(dict(self.source_metadata) or None, descs) or {}
        # SPEC.md §3.8: a digest of each component, from the bytes handed to transformers' writer
        # (plain tensors are not listed: transformers drops tied ones after this hook)
        self.saved_digests = {name: tensor_sha256(t) for name, t in comps.items()}
        if "qformat" in meta:
            meta["qformat"] = with_digests(meta["qformat"], self.saved_digests)
            if isinstance(self.quantization_config, QFormatConfig):  # config.json is written after this hook
                self.quantization_config.spec_version = json.loads(meta["qformat"])["version"]
        self.saved_descriptors = descs
        return sd, meta

    def _keep_decoded(self, model: Any, sd: dict[str, torch.Tensor], descs: dict[str, Any], comps: dict[str, torch.Tensor]) -> None:
        """Each entry the loader decoded from a quantized tensor (an embedding, a norm) goes back
        in its scheme when it still holds exactly what was decoded: the source file's components
        are read again and decoded as the load decoded them, and where every bit equals the entry
        (cast as loaded), the entry is replaced by those components, byte for byte, under
        ``<entry>.<component>`` with its descriptor (a Q8_0 embedding stays Q8_0, not float32).
        Entries tied to it (a head sharing the embedding) are dropped with it: transformers ties
        them again on load.  An entry that changed, or whose source can no longer be read, is
        saved as the plain tensor it is."""
        from qformat_torch.io import safe_open

        from .decoded import _decode

        tied = dict(getattr(model, "all_tied_weights_keys", None) or {})  # target -> source
        for entry, q in self.decoded_entries.items():
            cur = sd.get(entry)
            if not isinstance(cur, torch.Tensor) or cur.device.type == "meta":
                continue
            try:
                with safe_open(q.file) as f:
                    stored = f.get_qtensor(q.name).components
                    src = {c: stored[c].clone() for c in q.components}  # a copy: the save may replace the file
            except (QFormatError, OSError):
                continue
            try:
                value = _decode(q.descriptor, src)
            except QFormatError:
                continue
            value = value.to(cur.dtype) if value.dtype != cur.dtype else value
            if value.shape != cur.shape or not _same_bits(value, cur.detach().cpu()):
                continue
            names = local_names(q.name, list(src))
            desc = rename_references(q.descriptor, lambda c, m=names, e=entry: f"{e}.{m.get(c, c)}")
            del sd[entry]
            for target, source in tied.items():
                if source == entry and target in sd and sd[target].data_ptr() == cur.data_ptr():
                    del sd[target]
            descs[entry] = desc
            comps.update({f"{entry}.{names[c]}": t for c, t in src.items()})

    # -- loading a qformat checkpoint ----------------------------------------------------------
    def _plan_load(self, model: nn.Module, files: list[str], names: NameMap) -> None:
        from qformat.io import SafeOpen, open_admitted

        if files:
            self.stored = {}
            # the one rule (issue 24): what `qformat check` refuses is refused here with its code;
            # header rules now, payload rules in _finish_load (qformat.checkpoint.source.unchecked() skips)
            self.admission = admit_files(files)
        entries = model.state_dict()  # before any placeholder: the names the checkpoint maps to
        for path in files:
            # the header and memory map the admission checked, parsed once (None inside unchecked())
            f = open_admitted(self.admission, path) if self.admission is not None else SafeOpen(path)
            try:
                if not self.source_metadata:
                    self.source_metadata = {k: v for k, v in (f.metadata() or {}).items() if k == "gguf" or k.startswith("gguf.")}
                self.stored.update({n: tuple(e.shape) for n, e in f.header.entries.items()})
                for name in sorted(f.model.raw):
                    raise_first(f.model.tensor_problems.get(name, []))
                    desc = f.model.descriptors[name]
                    comps = sorted({c for _, c in desc.references()})
                    q = Quantized(name, path, json.loads(json.dumps(f.model.raw[name])), tuple(desc.shape),
                                  {c: (f.header.entries[c].dtype, tuple(f.header.entries[c].shape)) for c in comps})
                    self.descriptors[name] = f.model.raw[name]
                    self.logical_of.update({c: name for c in comps})
                    if not self._place(model, q, names, entries) and not self._place_embedding(model, q, names, entries):
                        # a norm, an embedding it cannot keep packed, a tensor with no place in the model: the loader
                        # decodes it into the entry its name maps to (update_weight_conversions)
                        self.decoded.append(q)
            finally:
                f.close()

    def _place(self, model: nn.Module, q: Quantized, names: NameMap, entries: dict[str, Any]) -> bool:
        """Replace the ``nn.Linear`` whose weight ``q`` is (names mapped by ``names``, shape
        equal) by a placeholder mirroring its components; False when there is none."""
        found = _linear_target(model, names, q.name, entries, q.shape)
        if found is None:
            return False
        mpath, mod = found
        plan = Planned(q.name, mpath, q.file, q.descriptor)
        holder = PendingQLinear(mod, q.name, keep_weight=False)
        renamed = names.renamed(q.name)
        target = f"{mpath}.weight"
        for comp, (dtype, shape) in q.components.items():
            where = _moved(renamed, target, names.renamed(comp))  # where the loader will put it
            if where is not None and where.startswith(mpath + "."):
                rel = where[len(mpath) + 1:]
                if rel != "bias" and _add_mirror(holder, rel, _storage_torch(dtype), shape):
                    plan.mirrored[comp] = rel
                    self.mirror_keys.add(f"{mpath}.{rel}")
                    continue
            plan.from_file.append(comp)
        _untie(model, target)
        _set_module(model, mpath, holder)
        self.planned[mpath] = plan
        return True

    def _place_embedding(self, model: nn.Module, q: Quantized, names: NameMap, entries: dict[str, Any]) -> bool:
        """Keep the embedding ``q`` loads into packed (:mod:`qformat_torch.embedding`), when its
        module's forward is one a packed embedding reproduces and its rows can be gathered: its
        ``weight`` parameter gives way to a child module of meta buffers under the components'
        names, which the loader fills; each head tied to it becomes a placeholder that
        :meth:`_finish_embeddings` makes a :class:`qformat_torch.embedding.TiedHead` (a QLinear
        over the same buffers), the tie itself dropped.  False (the loader decodes it) otherwise."""
        from qformat.descriptor import parse_descriptor
        from qformat_torch.embedding import embedding_kind, rows_movable

        target, pattern = names.target(q.name, entries)
        if pattern is not None or target not in entries or len(q.shape) != 2:
            return False
        mpath, _, attr = target.rpartition(".")
        emb = _get_module(model, mpath)
        if attr != "weight" or embedding_kind(emb) is None or tuple(q.shape) != (emb.num_embeddings, emb.embedding_dim):
            return False
        if not isinstance(emb._parameters.get("weight"), torch.Tensor) or "weight" in emb._modules:
            return False
        try:
            parsed = parse_descriptor(q.name, q.descriptor)
        except QFormatError:
            return False
        if not rows_movable(parsed, {c: s for c, (_, s) in q.components.items()}):
            return False
        renamed = names.renamed(q.name)
        rels: dict[str, str] = {}
        for comp in q.components:
            where = _moved(renamed, target, names.renamed(comp))
            if where is None or not where.startswith(target + "."):
                return False
            rels[comp] = where[len(mpath) + 1:]
        tied = dict(getattr(model, "all_tied_weights_keys", None) or {})  # target -> source
        heads = []
        for t, src in tied.items():
            if src != target:
                continue
            hpath, _, hattr = t.rpartition(".")
            head = _get_module(model, hpath)
            if hattr != "weight" or not isinstance(head, nn.Linear) or (head.out_features, head.in_features) != tuple(q.shape):
                return False
            heads.append(hpath)
        dtype = emb.weight.dtype
        del emb._parameters["weight"]
        holder = nn.Module()
        holder._is_hf_initialized = True  # transformers' init of an nn.Embedding skips it
        emb.add_module("weight", holder)
        for comp, (dt, shape) in q.components.items():
            if not _add_mirror(emb, rels[comp], _storage_torch(dt), shape):
                raise error("LOAD_MISMATCH", f"component {comp!r} collides with a tensor of the embedding", tensor=q.name)
            self.mirror_keys.add(f"{mpath}.{rels[comp]}")
        _untie(model, target)
        for hpath in heads:
            _set_module(model, hpath, PendingQLinear(_get_module(model, hpath), f"{hpath}.weight", keep_weight=False))
        self.packed_embeddings[mpath] = (q, rels, dtype, heads)
        return True

    def _finish_embeddings(self, model: nn.Module) -> None:
        """Each planned embedding becomes a packed embedding over the components the loader read
        into its buffers (file-mapped: nothing decoded), each head tied to it a TiedHead."""
        from qformat_torch.embedding import TiedHead, pack_embedding

        for mpath, (q, rels, dtype, heads) in self.packed_embeddings.items():
            emb = _get_module(model, mpath)
            if emb is None or "weight" not in emb._modules:
                continue
            comps = {}
            for comp, rel in rels.items():
                t = _get_rel(emb, rel)
                if t.device.type == "meta":
                    raise error("COMPONENT_MISSING", f"component {comp!r} was not loaded from the checkpoint", tensor=q.name)
                comps[comp] = t
            tq = _local_qtensor(q.name, q.descriptor, comps)
            pack_embedding(emb, tq, dtype)
            for hpath in heads:
                holder = _get_module(model, hpath)
                if isinstance(holder, PendingQLinear):
                    _set_module(model, hpath, TiedHead(emb, holder.bias, kernel=self.quantization_config.kernel))
            emb.__dict__["_on_unpack"] = functools.partial(self._embedding_unpacked, weakref.ref(model), mpath)

    def _embedding_unpacked(self, model_ref: Any, mpath: str, weight: nn.Parameter) -> None:
        """A packed embedding became a plain one (something asked for its weight): its tied heads
        become ``nn.Linear`` modules sharing that weight and the ties are declared again, and it
        is saved in its scheme while it holds what was decoded (as a decoded load's)."""
        from qformat_torch.embedding import TiedHead

        model = model_ref()
        q, _, _, heads = self.packed_embeddings[mpath]
        target = f"{mpath}.weight"
        self.decoded_entries[target] = q
        if model is None:
            return
        tied = getattr(model, "all_tied_weights_keys", None)
        for hpath in heads:
            head = _get_module(model, hpath)
            if not isinstance(head, TiedHead):
                continue
            with torch.device("meta"):
                lin = nn.Linear(head.in_features, head.out_features, bias=head.bias is not None)
            lin.weight = weight
            if head.bias is not None:
                lin.bias = head.bias
            _set_module(model, hpath, lin)
            if isinstance(tied, dict):
                tied[f"{hpath}.weight"] = target

    def _finish_load(self, model: nn.Module) -> None:
        from qformat_torch.io import safe_open
        from qformat_torch.nn import QLinear

        if self.admission is not None:
            for name in ([p.name for p in self.planned.values()] + [q.name for q in self.decoded]
                         + [e[0].name for e in self.packed_embeddings.values()]):
                self.admission.check_logical(name)
            self.admission = None  # its memory maps go with it (the model keeps this quantizer)
        for mpath, plan in self.planned.items():
            holder = _get_module(model, mpath)
            if not isinstance(holder, PendingQLinear):
                continue
            comps: dict[str, torch.Tensor] = {}
            for comp, rel in plan.mirrored.items():
                t = _get_rel(holder, rel)
                if t.device.type == "meta":
                    raise error("COMPONENT_MISSING", f"component {comp!r} was not loaded from the checkpoint", tensor=plan.name)
                comps[comp] = t
            if plan.from_file:
                dev = _module_device(model, mpath, next(iter(comps.values()), None))
                with safe_open(plan.file, device=dev) as f:
                    src = f.get_qtensor(plan.name).components
                comps.update({c: src[c] for c in plan.from_file})
            tq = _local_qtensor(plan.name, plan.descriptor, comps)
            # prepared at first use: loading neither unpacks codes nor scans weight ranges
            _set_module(model, mpath, QLinear(tq, holder.bias, kernel=self.quantization_config.kernel, prepare=False))
        self._finish_embeddings(model)
        if self.descriptors and isinstance(self.quantization_config, QFormatConfig) and self.quantization_config.spec_version is None:
            from qformat.model import required_version

            self.quantization_config.spec_version = required_version(self.descriptors)

    # -- quantizing on load --------------------------------------------------------------------
    def _plan_quantize(self, model: nn.Module, files: list[str], names: NameMap) -> None:
        from qformat.checkpoint.quantize import verify_choices, logical_dtype
        from qformat.io import SafeOpen
        from qformat.recipe import decide
        from qformat.sources import TensorInfo

        rec = self.quantization_config.build_recipe()
        infos: dict[str, TensorInfo] = {}
        entries = model.state_dict()
        if files:
            for path in files:
                f = SafeOpen(path)
                try:
                    if f.model.raw:
                        raise error("QUANTIZE_SOURCE_QUANTIZED", f"{path} holds quantized tensors; load it with QFormatConfig() instead")
                    for n in f.header.entries:
                        infos[n] = TensorInfo(f.header.entries[n].dtype, tuple(f.header.entries[n].shape))
                finally:
                    f.close()
        else:
            from qformat_torch.dtypes import storage_name

            for n, t in entries.items():
                infos[n] = TensorInfo(storage_name(t.dtype), tuple(t.shape))
        if files:
            self.stored = {n: tuple(i.shape) for n, i in infos.items()}
        decisions = decide(rec, infos, sorted(infos))
        verify_choices(decisions, infos, self.quantization_config.scheme is None)
        for d in decisions:
            if d.choice is None:
                continue
            target, pattern = names.target(d.name, entries)
            mpath, _, attr = target.rpartition(".")
            mod = _get_module(model, mpath) if pattern is None and target in entries else None
            if attr != "weight" or not isinstance(mod, nn.Linear):
                raise error("QUANTIZE_RECIPE_INVALID", f"{d.name!r} is selected for quantization but is not the weight of an "
                                                       "nn.Linear of the model; quantizing on load keeps only Linear weights packed "
                                                       "(add a keep rule, or use `qformat quantize`)", tensor=d.name)
            info = infos[d.name]
            if tuple(info.shape) != (mod.out_features, mod.in_features):
                continue  # stays a plain weight of the wrong shape: the strict comparison (or transformers) reports it
            self.to_quantize[target] = (d.name, d.choice, logical_dtype(info.dtype, d.choice.dtype))
            _untie(model, target)
            _set_module(model, mpath, PendingQLinear(mod, d.name, keep_weight=True))
        self.quantization_config.rules = rec.to_dict()["rules"]
        default = rec.to_dict().get("default")
        self.quantization_config.default = default

    def encode_into(self, model: nn.Module, name: str, value: torch.Tensor) -> None:
        """Encode one arriving weight (the QFormatQuantize op) onto its placeholder."""
        from qformat_torch.dtypes import torch_to_numpy
        from qformat_torch.qtensor import TorchQTensor

        mpath = name.rpartition(".")[0]
        holder = _get_module(model, mpath)
        ckpt_name, choice, dt = self.to_quantize[name]
        try:
            qt = qformat.quantize(torch_to_numpy(value), choice.scheme, dtype=dt, **choice.params)
        except QFormatError as e:
            self.errors.append(error(e.code, e.message, tensor=ckpt_name, field=e.field))
            qt = None
        if isinstance(holder, PendingQLinear):
            holder.weight = None
            if qt is not None:
                holder.packed = TorchQTensor.from_qtensor(qt, value.device)
                self.descriptors[ckpt_name] = qt.descriptor

    def _finish_quantize(self, model: nn.Module) -> None:
        from qformat_torch.nn import QLinear

        for name, (ckpt_name, _, _) in self.to_quantize.items():
            mpath = name.rpartition(".")[0]
            holder = _get_module(model, mpath)
            if not isinstance(holder, PendingQLinear):
                continue
            if holder.packed is None:
                raise error("TENSOR_NOT_FOUND", "the checkpoint did not provide this weight, so it could not be quantized", tensor=ckpt_name)
            _set_module(model, mpath, QLinear(holder.packed, holder.bias, kernel=self.quantization_config.kernel))
        if self.descriptors:
            from qformat.model import required_version

            self.quantization_config.spec_version = required_version(self.descriptors)


def _local_qtensor(name: str, descriptor: Any, comps: dict[str, torch.Tensor]) -> Any:
    """The stored tensor ``name`` over its loaded components, renamed to the module's local
    component names (an invalid result is refused with its code, naming the tensor)."""
    from qformat_torch.qtensor import TorchQTensor

    names = local_names(name, list(comps))
    desc = rename_references(descriptor, lambda c, m=names: m.get(c, c))
    try:
        return TorchQTensor(desc, {names[c]: t for c, t in comps.items()})
    except QFormatError as e:
        raise error(e.code, e.message, tensor=name, field=e.field) from None
