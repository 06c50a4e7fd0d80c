"""QFormatHfQuantizer: transformers' ``from_pretrained`` / ``save_pretrained`` for qformat.

Loading a qformat checkpoint (``pre_quantized``):

1. :meth:`preprocess_model` (the model is still on the meta device) reads each checkpoint
   file's header with the core (no tensor data), validates every descriptor, and replaces each
   ``nn.Linear`` whose ``weight`` is a quantized logical tensor by a :class:`PendingQLinear`: a
   placeholder without a weight whose (meta) buffers mirror the tensor's components under their
   stored names, so transformers' own loader reads the packed bytes into them (device map,
   threads and all) and sees neither unexpected nor missing keys;
2. :meth:`postprocess_model` turns each placeholder into a
   :class:`qformat_torch.nn.QLinear` over those same tensors (no copy, never decoded to full
   precision).

Quantizing on load (``QFormatConfig(scheme=...)`` or ``recipe=...`` on a plain checkpoint):
the selected Linear modules (``qformat quantize``'s rules over the checkpoint's names, dtypes
and shapes) become placeholders that keep a meta ``weight``; transformers reads each weight in
turn and hands it to :class:`QFormatQuantize`, which encodes it with ``qformat.quantize`` and
drops the full-precision tensor, and hands the tensor's pages (a view of transformers' mmap of
the checkpoint) back to the kernel (:func:`qformat_torch.kernels.release_file_pages`): peak
memory is the packed model plus one layer, not the pages of every weight read so far.

``save_pretrained`` writes each QLinear as a qformat logical tensor ``<module>.weight`` with
its components under ``<module>.weight.<component>`` (what ``qformat quantize`` writes) and the
descriptors in the file's ``__metadata__``.  transformers writes that one ``__metadata__`` into
every shard of a sharded save, so a model loaded through qformat gets its own ``save_pretrained``
(:func:`qformat_transformers.saving.save_pretrained`), which rewrites a sharded save into shards that are each complete
qformat files (SPEC §14), and refuses a sharded ``push_to_hub`` before writing.
"""

from __future__ import annotations

import json
import types
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers.core_model_loading import ConversionOps
from transformers.quantizers import HfQuantizer

import qformat
from qformat.errors import QFormatError, error, raise_first
from qformat.qtensor import rename_references

from qformat_torch.kernels import release_file_pages

from .config import QFormatConfig

#: The code of "the checkpoint does not fit the model".
MISMATCH_CODE = "LOAD_MISMATCH"


def mismatch(message: str, tensor: str) -> QFormatError:
    return error(MISMATCH_CODE, message, tensor=tensor)


@dataclass
class Planned:
    """One quantized logical tensor of the checkpoint that lands in a QLinear."""

    name: str  # logical tensor name in the checkpoint
    module: str  # module path in the model
    file: str = ""
    descriptor: dict[str, Any] = field(default_factory=dict)
    mirrored: dict[str, str] = field(default_factory=dict)  # component -> placeholder-relative buffer path
    from_file: list[str] = field(default_factory=list)  # components read by us (outside the module's names)


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


def _model_path(model: nn.Module, ckpt_module: str) -> str | None:
    """The model's module path for a checkpoint module path (as transformers maps names: the
    same, or without / with the base model prefix)."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    cands = [ckpt_module]
    if prefix:
        if ckpt_module.startswith(prefix + "."):
            cands.append(ckpt_module[len(prefix) + 1:])
        cands.append(f"{prefix}.{ckpt_module}")
    for c in cands:
        if _get_module(model, c) is not None:
            return c
    return None


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
        self.decode_into: list[tuple[str, str, str]] = []  # (logical, model param, file)
        self.to_quantize: dict[str, tuple[str, Any, str]] = {}  # model weight name -> (ckpt name, choice, logical dtype)
        self.errors: list[QFormatError] = []
        self.descriptors: dict[str, Any] = {}

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
        if any(t in self.mirror_keys for t in getattr(converter, "target_patterns", ())):
            return None  # packed components keep their storage dtype
        return super().get_new_dtype(converter, param, dtype)

    def preprocess_model(self, model: Any, dtype: Any = None, **kwargs: Any) -> None:
        super().preprocess_model(model, dtype=dtype, **kwargs)
        files = [f for f in (kwargs.get("checkpoint_files") or []) if str(f).endswith(".safetensors")]
        if self.pre_quantized:
            self._plan_load(model, files)
        else:
            self._plan_quantize(model, files)

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
        from qformat_torch.nn import QLinear

        sd = model.state_dict()
        descs: dict[str, Any] = {}
        comps: dict[str, torch.Tensor] = {}
        for path, mod in model.named_modules():
            if not isinstance(mod, QLinear):
                continue
            prefix = f"{path}." if path else ""
            for k in [k for k in sd if k.startswith(prefix) and k != prefix + "bias"]:
                del sd[k]
            logical = prefix + "weight"
            pw = mod.packed_weight()

            def rename(local: str, lg: str = logical) -> str:
                return f"{lg}.{local}"

            descs[logical] = rename_references(pw.descriptor, rename)
            for c, t in pw.components.items():
                comps[rename(c)] = t
        clash = sorted(set(comps) & set(sd))
        if clash:
            raise error("SAVE_INVALID", f"component {clash[0]!r} would collide with a tensor of the model", tensor=clash[0])
        sd.update(comps)
        meta = file_metadata(None, descs) or {}
        self.saved_descriptors = descs
        return sd, meta

    # -- loading a qformat checkpoint ----------------------------------------------------------
    def _plan_load(self, model: nn.Module, files: list[str]) -> None:
        from qformat.io import SafeOpen

        for path in files:
            f = SafeOpen(path)
            try:
                for name in sorted(f.model.raw):
                    raise_first(f.model.tensor_problems.get(name, []))
                    self._plan_tensor(model, f, name, path)
            finally:
                f.close()

    def _plan_tensor(self, model: nn.Module, f: Any, name: str, path: str) -> None:
        desc = f.model.descriptors[name]
        ckpt_module, _, attr = name.rpartition(".")
        mpath = _model_path(model, ckpt_module)
        if mpath is None:
            return  # like transformers: a checkpoint tensor the model has no place for is ignored
        mod = _get_module(model, mpath)
        shape = tuple(desc.shape)
        if attr == "weight" and isinstance(mod, nn.Linear):
            want = (mod.out_features, mod.in_features)
            if shape != want:
                raise mismatch(f"the checkpoint's quantized weight has shape {list(shape)}, the model's "
                               f"{type(mod).__name__} {mpath!r} expects {list(want)}", name)
            self.descriptors[name] = f.model.raw[name]
            plan = Planned(name, mpath, path, json.loads(json.dumps(f.model.raw[name])))
            holder = PendingQLinear(mod, name, keep_weight=False)
            for _, comp in desc.references():
                ent = f.header.entries[comp]
                if comp.startswith(ckpt_module + "."):
                    rel = comp[len(ckpt_module) + 1:]
                    if rel != "bias" and _add_mirror(holder, rel, _storage_torch(ent.dtype), tuple(ent.shape)):
                        plan.mirrored[comp] = rel
                        self.mirror_keys.add(f"{mpath}.{rel}")
                        continue
                plan.from_file.append(comp)
            _set_module(model, mpath, holder)
            self.planned[mpath] = plan
            return
        # A quantized tensor that is not a Linear weight (an embedding, a norm): decoded into its
        # parameter after loading.
        pname = f"{mpath}.{attr}" if mpath else attr
        try:
            param = model.get_parameter(pname)
        except AttributeError:
            return
        if tuple(param.shape) != shape:
            raise mismatch(f"the checkpoint's quantized tensor has shape {list(shape)}, the model's parameter "
                           f"{pname!r} expects {list(param.shape)}", name)
        self.descriptors[name] = f.model.raw[name]
        self.decode_into.append((name, pname, path))

    def _finish_load(self, model: nn.Module) -> None:
        from qformat_torch.io import safe_open
        from qformat_torch.nn import QLinear
        from qformat_torch.qtensor import TorchQTensor

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
            names = local_names(plan.name, list(comps))
            desc = rename_references(plan.descriptor, lambda c, m=names: m.get(c, c))
            try:
                tq = TorchQTensor(desc, {names[c]: t for c, t in comps.items()})
            except QFormatError as e:
                raise error(e.code, e.message, tensor=plan.name, field=e.field) from None
            _set_module(model, mpath, QLinear(tq, holder.bias))
        for logical, pname, path in self.decode_into:
            param = model.get_parameter(pname)
            with safe_open(path, device=param.device) as f:
                value = f.get_tensor(logical)
            with torch.no_grad():
                param.copy_(value.to(param.dtype))
        if self.descriptors and isinstance(self.quantization_config, QFormatConfig) and self.quantization_config.spec_version is None:
            from qformat.model import required_version

            self.quantization_config.spec_version = required_version(self.descriptors)

    # -- quantizing on load --------------------------------------------------------------------
    def _plan_quantize(self, model: nn.Module, files: list[str]) -> None:
        from qformat.checkpoint.quantize import verify_choices, logical_dtype
        from qformat.io import SafeOpen
        from qformat.recipe import decide
        from qformat.sources import TensorInfo

        rec = self.quantization_config.build_recipe()
        infos: dict[str, TensorInfo] = {}
        names: list[str] = []
        if files:
            for path in files:
                f = SafeOpen(path)
                try:
                    if f.model.raw:
                        raise error("QUANTIZE_SOURCE_QUANTIZED", f"{path} holds quantized tensors; load it with QFormatConfig() instead")
                    for n in f.header.entries:
                        infos[n] = TensorInfo(f.header.entries[n].dtype, tuple(f.header.entries[n].shape))
                        names.append(n)
                finally:
                    f.close()
        else:
            from qformat_torch.dtypes import storage_name

            for n, t in model.state_dict().items():
                infos[n] = TensorInfo(storage_name(t.dtype), tuple(t.shape))
                names.append(n)
        names.sort()
        decisions = decide(rec, infos, names)
        verify_choices(decisions, infos, self.quantization_config.scheme is None)
        for d in decisions:
            if d.choice is None:
                continue
            ckpt_module, _, attr = d.name.rpartition(".")
            mpath = _model_path(model, ckpt_module)
            mod = _get_module(model, mpath) if mpath is not None else None
            if attr != "weight" or not isinstance(mod, nn.Linear):
                raise error("QUANTIZE_RECIPE_INVALID", f"{d.name!r} is selected for quantization but is not the weight of an "
                                                       "nn.Linear of the model; quantizing on load keeps only Linear weights packed "
                                                       "(add a keep rule, or use `qformat quantize`)", tensor=d.name)
            info = infos[d.name]
            if tuple(info.shape) != (mod.out_features, mod.in_features):
                raise mismatch(f"the checkpoint's weight has shape {list(info.shape)}, the model's Linear {mpath!r} "
                               f"expects {[mod.out_features, mod.in_features]}", d.name)
            self.to_quantize[f"{mpath}.weight"] = (d.name, d.choice, logical_dtype(info.dtype, d.choice.dtype))
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
            _set_module(model, mpath, QLinear(holder.packed, holder.bias))
        if self.descriptors:
            from qformat.model import required_version

            self.quantization_config.spec_version = required_version(self.descriptors)
