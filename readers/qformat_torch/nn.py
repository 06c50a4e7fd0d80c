"""Packed weights in torch modules: QLinear, quantize_model, save_model, load_model.

A :class:`QLinear` keeps its weight packed (the qformat components, as buffers on the module's
device) and dequantizes it with the torch decoder in every forward, then runs ``F.linear``.
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
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

import qformat

from ._convert import STORAGE_TORCH, int_view_dtype, storage_name, torch_to_numpy
from .decode import decode
from .io import safe_open, save_file
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

    ``forward`` decodes the weight on the buffers' device (bit-identical to the reference on CPU),
    casts it to the input's dtype when they differ, and calls ``F.linear``.
    """

    def __init__(self, weight: TorchQTensor | qformat.QTensor, bias: torch.Tensor | None = None, device: Any = None):
        super().__init__()
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
        return decode(self._parsed, TensorSource(comps, dev), None, tensor="weight")

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight (decoded on every access; the module keeps only the packed form)."""
        return self.dequantize_weight()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.dequantize_weight()
        if w.dtype != x.dtype:
            w = w.to(x.dtype)
        b = self.bias
        if b is not None and b.dtype != x.dtype:
            b = b.to(x.dtype)
        return F.linear(x, w, b)

    @property
    def packed_nbytes(self) -> int:
        return int(sum(getattr(self, b).numel() * getattr(self, b).element_size() for b, _ in self._components.values()))

    def extra_repr(self) -> str:
        scheme = self.descriptor.get("scheme", "?")
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"scheme={scheme}, dtype={self.descriptor['dtype']}, packed_bytes={self.packed_nbytes}")


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
    With ``strict``, names the model lacks or leaves unfilled raise RuntimeError.  Returns the
    model (a bare Linear comes back as a QLinear).
    """
    plain: dict[str, torch.Tensor] = {}
    replaced: set[str] = set()
    root: nn.Module = model
    with safe_open(path) as f:
        for key in f.keys():
            modname, _, attr = key.rpartition(".")
            try:
                mod = root.get_submodule(modname) if modname else root
            except AttributeError:
                mod = None
            if f.is_quantized(key) and attr == "weight" and isinstance(mod, nn.Linear | QLinear):
                if isinstance(mod, QLinear):
                    dev = device if device is not None else next(iter(mod.component_tensors().values())).device
                else:
                    dev = device if device is not None else mod.weight.device
                prefix = key + "."
                qw = f.get_qtensor(key).renamed(lambda c, p=prefix: c[len(p):] if c.startswith(p) else c).to(dev)
                new = QLinear(qw, mod.bias)
                if modname:
                    _set_module(root, modname, new)
                else:
                    root = new
                replaced.add(modname)
            else:
                plain[key] = f.get_tensor(key)
    missing, unexpected = root.load_state_dict(plain, strict=False)
    qbuf = _qlinear_buffers(root)
    missing = [k for k in missing if k not in qbuf]
    if strict and (missing or unexpected):
        raise RuntimeError(f"load_model: missing keys {missing[:10]}, unexpected keys {list(unexpected)[:10]}")
    return root
