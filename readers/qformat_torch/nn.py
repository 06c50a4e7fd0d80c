"""Packed weights in torch modules: QLinear, quantize_model, save_model, load_model.

A :class:`QLinear` keeps its weight packed (the qformat components, as buffers on the module's
device).  Its forward runs one of two paths (:mod:`qformat_torch.kernels`):

- a native CPU kernel on a copy of the weight repacked once, when the layer is built or moved
  (int4 grouped affine -> torch's int4 pack, int8 per channel -> torch's int8 mm), for bfloat16
  inputs, where the kernel's weights are within the documented bound of the decoded weights
  (policy ``"auto"``, the default; see :mod:`qformat_torch.kernels`), or under ``"native"``;
- otherwise the exact path: decode the weight with the torch decoder (in chunks of rows, cast to
  the input's dtype chunk by chunk) and run ``F.linear``: bit-identical to
  ``F.linear(x, qlinear.weight.to(x.dtype), bias)``.
Biases, LayerNorms, embeddings and every other state_dict entry stay plain tensors.

The component buffers are stored as raw integer views of their bytes (``int8``/``int16``/
``int32``/``int64`` of the component's width) and viewed back in their storage dtype on use:
``model.half()`` or ``model.to(torch.bfloat16)`` converts floating-point buffers, which would
silently rewrite packed float8 codes or float32 scales; integer buffers are left alone, while
``model.to(device)`` still moves them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

import qformat
from qformat.checkpoint.source import admit_files
from qformat.errors import raise_first

from .dtypes import LOGICAL_TORCH, STORAGE_TORCH, int_view_dtype, storage_name, torch_to_numpy
from . import kernels
from .decode import decode
from .io import safe_open, save_file
from .mismatch import Mismatch
from .qtensor import TorchQTensor
from .sources import TensorSource


def _buffer_name(component: str, taken: set[str]) -> str:
    base = "qweight_" + re.sub(r"[^0-9A-Za-z_]", "_", component)
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


class QLinear(nn.Module):
    """A Linear layer whose weight ``[out_features, in_features]`` stays packed in qformat.

    ``forward`` runs a native kernel where one applies (see the module doc), else decodes the
    weight on the buffers' device (bit-identical to the reference on CPU), cast to the input's
    dtype, and calls ``F.linear``.

    Options (keyword only):

    - ``kernel``: ``"auto"`` (native kernels where each weight they multiply is within 2^-8
      relative per rounding of the decoded weight: the logical dtype's rounding of ``q * s``,
      float16 scales rounded to bfloat16), ``"native"`` (also where an offset or zero point
      rounds), ``"decode"`` (never native: bit-identical to F.linear on the decoded weight), or
      None: the process default, :func:`qformat_torch.kernels.set_kernel_policy`.
    - ``cache``: keep the decoded weight (per compute dtype) after the first forward of the
      decode path: dense speed, dense memory.
    - ``chunk_rows``: rows decoded per chunk on the decode path (default: about 1M elements).
    - ``stream``: on the decode path, run ``F.linear`` per chunk of output rows, so no more than
      chunk x in_features of the weight ever exists; torch's GEMMs may round a row block's
      outputs differently from a single F.linear (bfloat16 with many tokens), so it is opt-in.
    - ``prepare``: pick the path and repack the weight for it now (True, the default), or when
      the layer is first used (False: the first forward, ``kernel_path``, ``kernel_tensors``,
      ``kernel_nbytes``).  ``from_pretrained`` through qformat.transformers builds its layers
      with False, so loading does not unpack codes or scan weight ranges for layers (or
      processes) that never run them.

    The path always follows the current policy (the layer's ``kernel``, else the process
    policy), device and buffers: ``kernel_path`` and ``forward`` re-select when any changed.
    """

    def __init__(self, weight: TorchQTensor | qformat.QTensor, bias: torch.Tensor | None = None, device: Any = None, *,
                 kernel: str | None = None, cache: bool = False, chunk_rows: int | None = None, stream: bool = False,
                 prepare: bool = True):
        super().__init__()
        if kernel is not None and kernel not in kernels.POLICIES:
            raise ValueError(f"kernel must be one of {kernels.POLICIES} or None, found {kernel!r}")
        if isinstance(weight, qformat.QTensor):
            weight = TorchQTensor.from_qtensor(weight, device if device is not None else "cpu")
        elif device is not None:
            weight = weight.to(device)
        if len(weight.shape) != 2:
            raise ValueError(f"a QLinear weight must be 2-D [out_features, in_features], found shape {list(weight.shape)}")
        self.out_features, self.in_features = (int(s) for s in weight.shape)
        self.descriptor: dict[str, Any] = weight.descriptor
        self._parsed = weight.parsed
        self._components: dict[str, tuple[str, str]] = {}  # component -> (buffer name, storage dtype)
        taken: set[str] = set()
        for comp, t in sorted(weight.components.items()):
            bname = _buffer_name(comp, taken)
            dt = storage_name(t.dtype)
            raw = t.view(torch.uint8) if t.dtype == torch.bool else t.view(int_view_dtype(t.element_size()))
            self.register_buffer(bname, raw)
            self._components[comp] = (bname, dt)
        if bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = bias if isinstance(bias, nn.Parameter) else nn.Parameter(bias.detach(), requires_grad=False)
        self.kernel, self.cache, self.chunk_rows, self.stream = kernel, bool(cache), chunk_rows, bool(stream)
        self._prepared: kernels.Prepared | None = None  # not a buffer: state_dict holds only the qformat components
        self._native_key: tuple[Any, ...] | None = None  # None: not prepared yet
        self._decoded: dict[torch.dtype, torch.Tensor] = {}
        self._fast: tuple[Any, ...] | None = None  # forward's fast path (see _make_fast); None: none
        self.register_load_state_dict_post_hook(_reselect_after_load)
        if prepare:
            self._select_kernel()

    # -- kernel selection ----------------------------------------------------------------------
    def _kernel_key(self) -> tuple[Any, ...]:
        comps = [getattr(self, b) for b, _ in self._components.values()]
        policy = self.kernel or kernels.get_kernel_policy()
        dev = comps[0].device if comps else torch.device("cpu")
        return (policy, dev, tuple(c.data_ptr() for c in comps))

    def _select_kernel(self) -> None:
        """Pick the forward path and repack the weight for it (at construction, after a move or a
        load, or when the policy changed)."""
        key = self._kernel_key()
        self._fast = None
        self._prepared = None  # drop the old repacked copy first
        self._decoded.clear()
        self._prepared = kernels.select(self._parsed, self.component_tensors(), key[1], key[0]) if self._components else None
        self._native_key = key
        self._fast = self._make_fast()
        if self._prepared is not None:
            # The kernel holds its own copy: components that are views of a mapped file (as
            # from_pretrained loads them) give their pages back; state_dict, a save or the decode
            # path read them from the file again, byte for byte.
            # A component the kernel reads in place (its codes, shared) keeps its pages.
            shared = {t.untyped_storage().data_ptr() for t in self._prepared.tensors.values() if t.device.type == "cpu"}
            for bname, _ in self._components.values():
                buf = getattr(self, bname)
                if buf.untyped_storage().data_ptr() not in shared:
                    kernels.release_file_pages(buf)
            # the repack's transients leave holes around the copy (see trim_heap): trimmed once
            # every few million weight elements prepared rather than after each layer
            kernels.trim_heap_after(self.out_features * self.in_features)

    def _apply(self, fn: Any, recurse: bool = True) -> "QLinear":  # .to(), .cuda(), .half(), ...
        out = super()._apply(fn, recurse)
        if self._native_key is not None and self._native_key != self._kernel_key():
            self._select_kernel()  # prepared before: prepared again now (a layer not yet used waits for its first use)
        return out

    @property
    def _native(self) -> kernels.Prepared | None:
        """The prepared native kernel (None: the decode path), for the current policy, device and
        buffers: selected (again) here when any changed or the layer was never prepared."""
        if self._native_key != self._kernel_key():
            self._select_kernel()
        elif self._prepared is not None and not self._fast_current():
            self._fast = self._make_fast()  # the same key by another road (a policy set and set back)
        return self._prepared

    @property
    def kernel(self) -> str | None:
        """The layer's own kernel policy (None: the process policy); setting it re-selects at the
        next use."""
        return self.__dict__.get("_kernel")

    @kernel.setter
    def kernel(self, value: str | None) -> None:
        self.__dict__["_kernel"] = value
        self.__dict__["_fast"] = None  # the fast path's record does not cover the layer's policy

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())
        state["_fast"] = None  # holds a closure (Prepared.run): rebuilt at the next use
        return state

    def _make_fast(self) -> tuple[Any, ...] | None:
        """What forward's fast path needs, fixed when the kernel is selected: the prepared call
        (:attr:`kernels.Prepared.run`), the input dtypes it takes, and what ``_kernel_key`` was
        made of, in the form forward can compare cheaply: the process policy's generation (None
        where the layer has its own policy) and the buffers' names and data pointers.  While
        those are unchanged the key is unchanged (a move changes the data pointers, or ``_apply``
        re-selects), so forward skips ``_kernel_key`` and the checks ``_forward`` repeats per call
        (measured: about two thirds of a small layer's QLinear cost at one token).  None where
        the layer decodes or its kernel is not on the CPU."""
        p = self._prepared
        if p is None or p.device.type != "cpu":
            return None
        names = tuple(b for b, _ in self._components.values())
        ptrs = tuple(self._buffers[b].data_ptr() for b in names)
        gen = None if self.kernel else kernels.policy_generation()
        return (p.run, p.path.dtypes, gen, names, ptrs)

    def _fast_current(self) -> bool:
        f = self._fast
        if f is None:
            return False
        gen, bufs = f[2], self._buffers
        return ((gen is None or gen == kernels.policy_generation())
                and tuple(bufs[b].data_ptr() for b in f[3]) == f[4])

    @property
    def kernel_path(self) -> str:
        """The name of the native kernel path this layer runs for its kernel's input dtype, or
        "decode": for the policy in force now (a changed policy re-selects, as forward does)."""
        nat = self._native
        return nat.path.name if nat is not None else "decode"

    @classmethod
    def from_linear(cls, linear: nn.Linear, scheme: str, **params: Any) -> "QLinear":
        """Quantize ``linear.weight`` with ``qformat.quantize`` (on the CPU) and wrap it."""
        w = linear.weight.detach()
        qt = qformat.quantize(torch_to_numpy(w), scheme, **params)
        return cls(TorchQTensor.from_qtensor(qt, w.device), linear.bias)

    def component_tensors(self) -> dict[str, torch.Tensor]:
        """The packed components, in their storage dtypes, on the module's device."""
        out = {}
        for comp, (bname, dt) in self._components.items():
            raw = getattr(self, bname)
            out[comp] = raw.view(STORAGE_TORCH[dt])
        return out

    def packed_weight(self) -> TorchQTensor:
        """The weight as a TorchQTensor (sharing the buffers)."""
        return TorchQTensor(self.descriptor, self.component_tensors(), _parsed=self._parsed)

    def dequantize_weight(self) -> torch.Tensor:
        """The weight decoded to its logical dtype on the module's device."""
        comps = self.component_tensors()
        dev = next(iter(comps.values())).device if comps else torch.device("cpu")
        out = kernels.empty(tuple(self._parsed.shape), LOGICAL_TORCH[self._parsed.dtype], dev)  # usable under inference_mode
        return decode(self._parsed, TensorSource(comps, dev), None, tensor="weight", out=out)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight (decoded on every access; the module keeps only the packed form)."""
        return self.dequantize_weight()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The fast path (batch-1 decoding makes one call per layer per token, where this Python is
        # a good part of a small layer's time): the same kernel call as _forward's native branch,
        # taken where that branch would be -- the kernel selected for the current policy and
        # buffers (_make_fast's record of them), an input of the kernel's dtype on the CPU with
        # in_features columns and no gradient to keep -- and nothing else.
        f = self._fast
        if f is not None and not x.requires_grad and x.dtype in f[1] and x.is_cpu:
            gen, bufs, names, ptrs = f[2], self._buffers, f[3], f[4]
            shape = x.shape
            if ((gen is None or gen == kernels._POLICY["generation"]) and shape[-1] == self.in_features
                    and bufs[names[0]].data_ptr() == ptrs[0] and (len(names) == 1 or tuple(bufs[b].data_ptr() for b in names) == ptrs)):
                # views where they apply (a [batch, tokens, features] activation, contiguous): each
                # reshape with a computed shape costs a microsecond or two at this size
                y = f[0](x.view(-1, shape[-1]) if x.is_contiguous() else x.reshape(-1, shape[-1]).contiguous())
                nd = len(shape)
                if nd == 3:
                    y = y.view(shape[0], shape[1], self.out_features)
                elif nd != 2:
                    y = y.view(shape[:-1] + (self.out_features,))
                b = self._parameters.get("bias")
                if b is None:
                    return y
                return y.add_(b if b.dtype == x.dtype else b.to(x.dtype))  # as _forward adds it
        return self._forward(x, self.bias)

    def _forward(self, x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """``x W^T (+ b)`` on the selected path; the row-parallel layer of
        :mod:`qformat_torch.distributed` passes ``b=None`` and adds its bias after the all-reduce."""
        nat = self._native  # (re)selected here when the policy, device or buffers changed
        if b is not None and b.dtype != x.dtype:
            b = b.to(x.dtype)
        # the kernels have no backward: an input that needs a gradient takes the decode path
        if (nat is not None and x.dtype in nat.path.dtypes and x.device == nat.device and x.shape[-1] == self.in_features
                and not (x.requires_grad and torch.is_grad_enabled())):
            y = nat.run(x.reshape(-1, self.in_features).contiguous()).reshape(x.shape[:-1] + (self.out_features,))
            return y if b is None else y.add_(b)
        if self.stream and not self.cache:
            return kernels.linear_streamed(self._parsed, self.component_tensors(), x, b, self.chunk_rows)
        return F.linear(x, self._weight_for(x), b)

    def _weight_for(self, x: torch.Tensor) -> torch.Tensor:
        """The decoded weight in ``x``'s dtype (cached with ``cache``; else in a reused per-thread
        workspace unless autograd will keep it for the backward pass)."""
        w = self._decoded.get(x.dtype)
        if w is not None:
            return w
        reuse = not self.cache and not (torch.is_grad_enabled() and x.requires_grad)
        w = kernels.decode_chunked(self._parsed, self.component_tensors(), x.dtype, chunk_rows=self.chunk_rows, reuse=reuse)
        if self.cache:
            self._decoded[x.dtype] = w
        return w

    @property
    def kernel_tensors(self) -> dict[str, torch.Tensor]:
        """The native kernel's tensors (its repacked weight, scales, ...), empty on the decode path."""
        return dict(self._native.tensors) if self._native is not None else {}

    @property
    def packed_nbytes(self) -> int:
        return int(sum(getattr(self, b).numel() * getattr(self, b).element_size() for b, _ in self._components.values()))

    @property
    def kernel_nbytes(self) -> int:
        """Bytes of the native kernel's repacked copy of the weight (0 on the decode path); the
        layer holds ``packed_nbytes + kernel_nbytes`` (plus its bias), except where its components
        are views of a mapped file (``from_pretrained`` through qformat.transformers): then only
        ``kernel_nbytes`` stay resident once the kernel is prepared (see ``_select_kernel``)."""
        if self._native is None:
            return 0
        # a kernel tensor that is a view of a component (int8 codes used as they are) is no copy
        own = {getattr(self, b).untyped_storage().data_ptr() for b, _ in self._components.values()}
        return int(sum(t.numel() * t.element_size() for t in self._native.tensors.values()
                       if t.untyped_storage().data_ptr() not in own))

    def extra_repr(self) -> str:
        scheme = self.descriptor.get("scheme", "?")
        # printing a model does not prepare its layers: one never used says so
        path = self.kernel_path if self._native_key is not None else "chosen at first use"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"scheme={scheme}, dtype={self.descriptor['dtype']}, packed_bytes={self.packed_nbytes}, kernel={path}")


def local_component_names(qt: TorchQTensor, key: str) -> TorchQTensor:
    """``qt`` (the file's tensor ``key``) with its components named as a QLinear holds them:
    ``"<key>.scale"`` -> ``"scale"`` (other names as they are)."""
    prefix = key + "."
    return qt.renamed(lambda c: c[len(prefix):] if c.startswith(prefix) else c)


def _reselect_after_load(module: QLinear, _keys: Any) -> None:
    if module._native_key is not None:  # a layer not prepared yet reads the new bytes at its first use
        module._select_kernel()  # the buffers were overwritten in place: repack the kernel's copy


def _set_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, attr, new)


def quantize_model(model: nn.Module, scheme: str, *, min_numel: int = 4096,
                   include: Callable[[str, nn.Linear], bool] | None = None, **params: Any) -> nn.Module:
    """Replace every ``nn.Linear`` whose weight has at least ``min_numel`` elements by a QLinear.

    Weights are quantized with ``qformat.quantize(weight, scheme, **params)`` on the CPU (the
    reference encoders), the packed result lands on the weight's device.  ``include(name,
    module)`` can narrow the choice.  Returns the model (a bare Linear comes back as a QLinear).
    """
    if isinstance(model, nn.Linear) and not isinstance(model, QLinear):
        if model.weight.numel() >= min_numel and (include is None or include("", model)):
            return QLinear.from_linear(model, scheme, **params)
        return model
    for name, mod in list(model.named_modules()):
        if not name or isinstance(mod, QLinear) or not isinstance(mod, nn.Linear):
            continue
        if mod.weight.numel() < min_numel or (include is not None and not include(name, mod)):
            continue
        _set_module(model, name, QLinear.from_linear(mod, scheme, **params))
    return model


def _qlinear_buffers(model: nn.Module) -> dict[str, tuple[str, QLinear]]:
    """state_dict key of every QLinear component buffer -> (module prefix, module)."""
    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, QLinear):
            prefix = f"{name}." if name else ""
            for bname, _ in mod._components.values():
                out[prefix + bname] = (prefix, mod)
    return out


def save_model(model: nn.Module, path: str | os.PathLike[str], metadata: Mapping[str, str] | None = None) -> None:
    """Write a model's state: each QLinear weight as a qformat tensor ``<module>.weight`` (its
    packed components, byte for byte), every other state_dict entry as a plain tensor."""
    qbuf = _qlinear_buffers(model)
    tensors: dict[str, Any] = {k: v for k, v in model.state_dict().items() if k not in qbuf}
    for prefix, mod in {p: m for p, m in qbuf.values()}.items():
        tensors[prefix + "weight"] = mod.packed_weight()
    save_file(tensors, path, metadata)


def load_model(model: nn.Module, path: str | os.PathLike[str], *, device: Any = None, strict: bool = True) -> nn.Module:
    """Load a file written by :func:`save_model` (or any qformat file with matching names).

    A quantized ``<module>.weight`` whose module is an ``nn.Linear`` (or a QLinear) replaces that
    module by a QLinear holding the packed components on the module's device (or ``device``);
    any other quantized tensor is decoded into its parameter; plain tensors load as usual.

    Everything is planned and read before the model is touched.  A shape that differs (a
    quantized weight against its Linear, any tensor against its parameter or buffer) is
    LOAD_MISMATCH; with ``strict`` so are file tensors the model has no place for and state_dict
    entries the file does not fill (a parameter tied to one the file fills counts as filled).
    The error names the first few on each side; the model is left as it was.  Returns the model
    (a bare Linear comes back as a QLinear).

    What ``qformat check`` refuses (a non-finite scale, a recorded digest that differs, ...) is
    refused with check's code before the model is touched; inside
    ``qformat.checkpoint.source.unchecked()`` the file is read as it is.
    """
    adm = admit_files([os.fspath(path)])  # check's header rules: refused before anything is read
    plan = _plan_load(model, path, device)
    found = Mismatch(plan.unused, plan.missing, plan.shapes) if strict else Mismatch(shapes=plan.shapes)
    if found:
        names = found.unused or found.missing
        hint = "load_model(..., strict=False) loads what matches and skips the rest (shapes must still match)" if names else ""
        raise found.error(type(model).__name__, hint)
    if adm is not None:  # check's payload rules for what the model reads (qformat.checkpoint.source.unchecked() skips)
        for key in [k for k, _ in plan.qlinear.values()] + plan.plain:
            adm.check_logical(key)
    with safe_open(path) as f:  # every read (and decode) before the first change to the model
        plain = {key: f.get_tensor(key) for key in plan.plain}
        packed = {}
        for modname, (key, dev) in plan.qlinear.items():
            packed[modname] = local_component_names(f.get_qtensor(key), key).to(dev)
    # Plain tensors first (biases included), then the QLinears, which take the loaded bias:
    # load_state_dict runs every QLinear's post-load hook, and each would repack its kernel's
    # copy of the weight a second time (2.6x the load time of a 7B-shaped layer).
    model.load_state_dict(plain, strict=False)
    root: nn.Module = model
    for modname, qw in packed.items():
        new = QLinear(qw, _get_submodule(root, modname).bias)
        if modname:
            _set_module(root, modname, new)
        else:
            root = new
    return root


@dataclass
class _LoadPlan:
    """What :func:`load_model` does with each tensor of a file, decided from its header."""

    qlinear: dict[str, tuple[str, Any]] = field(default_factory=dict)  # module path -> (file tensor, device)
    plain: list[str] = field(default_factory=list)  # file tensors load_state_dict takes (quantized ones decoded)
    unused: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    shapes: list[tuple[str, str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)


def _get_submodule(root: nn.Module, name: str) -> nn.Module | None:
    try:
        return root.get_submodule(name) if name else root
    except AttributeError:
        return None


def _plan_load(model: nn.Module, path: str | os.PathLike[str], device: Any) -> _LoadPlan:
    plan = _LoadPlan()
    entries = model.state_dict(keep_vars=True)
    replaced: list[str] = []
    misshapen: list[str] = []  # Linear modules whose quantized weight has another shape
    misshapen_entries: set[str] = set()
    with safe_open(path) as f:
        for problems in f.model.tensor_problems.values():
            raise_first(problems)
        for key in f.keys():
            shape = tuple(f.shape(key))
            modname, _, attr = key.rpartition(".")
            mod = _get_submodule(model, modname)
            if f.is_quantized(key) and attr == "weight" and isinstance(mod, nn.Linear | QLinear):
                want = (mod.out_features, mod.in_features)
                if shape != want:
                    plan.shapes.append((key, f"{type(mod).__name__} {modname or '(the model)'}", shape, want))
                    misshapen.append(modname)
                    continue
                if device is not None:
                    dev = torch.device(device)
                elif isinstance(mod, QLinear):
                    dev = mod.packed_weight().device
                else:
                    dev = mod.weight.device
                plan.qlinear[modname] = (key, dev)
                replaced.append(modname)
            elif key in entries:
                want = tuple(entries[key].shape)
                if shape != want:
                    plan.shapes.append((key, key, shape, want))
                    misshapen_entries.add(key)
                else:
                    plan.plain.append(key)
            else:
                plan.unused.append(key)
    # A replaced module's own entries (its weight, or an old QLinear's components) are refilled by
    # the new QLinear; its bias still comes from the file.  An entry of the wrong shape is
    # reported as such, not as missing too.
    refilled = {k for m in replaced + misshapen for k in entries
                if k.startswith(f"{m}." if m else "") and k != (f"{m}.bias" if m else "bias")} | misshapen_entries
    loaded = set(plan.plain)
    filled = {id(entries[k]) for k in loaded}  # tied entries share one tensor
    plan.missing = [k for k in entries if k not in refilled and k not in loaded and id(entries[k]) not in filled]
    return plan

