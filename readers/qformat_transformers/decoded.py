"""Quantized tensors decoded into a model entry by transformers' own loader.

A qformat logical tensor that does not become a :class:`qformat_torch.nn.QLinear` or a packed
embedding (:mod:`qformat_torch.embedding`; an embedding it cannot keep packed, a norm, a Conv1D
weight, a tensor the model has no place for) is handed to transformers' v5
conversion mechanism as one :class:`DecodeConverter`: its source patterns are the logical
tensor's component names (as the model's renamings leave them), its target the logical name,
and its op, :class:`QFormatDecode`, decodes the components with :mod:`qformat_torch` into the
value the entry gets.  The loader then sees the entry provided like any other weight: it is not
MISSING, its components are not UNEXPECTED, the base model prefix and weight tying apply as
usual (a quantized embedding shared with the head fills both), and a logical tensor the model
has no place for is reported under its logical name.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import numpy as np
import torch
from transformers.core_model_loading import ConversionOps, WeightConverter

from qformat.errors import QFormatError, error
from qformat_torch.kernels import release_file_pages
from qformat_torch.qtensor import TorchQTensor

from .strict import NameMap


class QFormatDecode(ConversionOps):
    """Decode one logical tensor from its components, which transformers collects under the
    converter's source patterns, into the entry's dtype.

    ``dtype`` is the dtype transformers would cast a plain tensor for this entry to (the model's
    dtype or its keep-in-fp32 plan); the quantizer's ``get_new_dtype`` records it, since the
    components themselves must arrive uncast.  A decoding error is appended to ``errors`` (the
    quantizer raises it when loading ends: the loader would turn an exception raised here into a
    RuntimeError of its own).
    """

    def __init__(self, logical: str, descriptor: dict[str, Any], components: dict[str, str],
                 shape: tuple[int, ...], errors: list[QFormatError]):
        self.logical = logical
        self.descriptor = descriptor
        self.components = components  # source pattern -> stored component name
        self.shape = shape
        self.errors = errors
        self.dtype: torch.dtype | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> "QFormatDecode":
        # transformers copies a converter for each entry it fills: the copy shares the
        # (read-only) descriptor and the quantizer's error list.
        new = copy.copy(self)
        new.dtype = None
        return new

    def convert(self, input_dict: dict[str, Any], source_patterns: Any = None, target_patterns: Any = None,
                full_layer_name: str | None = None, **kwargs: Any) -> dict[str, Any]:
        comps = {}
        for pattern, value in input_dict.items():
            comps[self.components[pattern]] = value[0] if isinstance(value, list) else value
        try:
            absent = sorted(set(self.components.values()) - set(comps))
            if absent:
                raise error("COMPONENT_MISSING", f"component {absent[0]!r} did not reach the decoder")
            value = _decode(self.descriptor, comps)
        except QFormatError as e:
            self.errors.append(error(e.code, e.message, tensor=self.logical, field=e.field))
            return {}
        if self.dtype is not None and value.dtype != self.dtype:
            value = value.to(self.dtype)
        for t in comps.values():
            release_file_pages(t)  # pages of transformers' mmap of the checkpoint
        return {full_layer_name or self.logical: value}


def _numpy_view(t: torch.Tensor) -> Any:
    """A NumPy view (no copy) of a contiguous CPU tensor in its storage dtype, else None."""
    from qformat import dtypes as qdtypes
    from qformat_torch.dtypes import int_view_dtype, storage_name

    if t.device.type != "cpu" or not t.is_contiguous() or t.dtype is torch.bool or t.numel() == 0:
        return None
    npdt = qdtypes.storage_numpy(storage_name(t.dtype))
    if npdt is None or npdt.itemsize != t.element_size():
        return None
    return t.view(int_view_dtype(t.element_size())).numpy().view(npdt)


def _decode(descriptor: dict[str, Any], comps: dict[str, torch.Tensor]) -> torch.Tensor:
    """The logical tensor of ``comps``: on the CPU by the core's decoder over views of the
    components (its native kernels: 6x faster than the torch decoder on Gemma 3's 262144 x 640
    Q8_0 embedding, and the same bits: the two decoders are held bit-identical by the
    differential tests), elsewhere by the torch decoder on the components' device."""
    import qformat
    from qformat_torch.dtypes import numpy_to_torch

    views = {k: _numpy_view(t) for k, t in comps.items()}
    if any(v is None for v in views.values()):
        return TorchQTensor(descriptor, comps).dequantize()
    out = qformat.QTensor(descriptor, views).dequantize()
    if out.dtype in (np.float32, np.float16, np.float64) and out.flags.c_contiguous:
        return torch.from_numpy(out)  # a fresh array of its own: no copy
    return numpy_to_torch(out, "cpu")


class DecodeConverter(WeightConverter):
    """The converter of one decoded logical tensor (see the module docstring)."""

    __slots__ = ()

    def was_used(self) -> bool:
        # transformers reverts the conversions a load used when it saves; a decoded entry is
        # saved as the plain tensor it now is, so there is nothing to revert.
        return False


def decode_converter(logical: str, descriptor: dict[str, Any], components: list[str], shape: tuple[int, ...],
                     names: NameMap, errors: list[QFormatError]) -> DecodeConverter:
    """The converter that decodes ``logical`` (stored components ``components``) into the model
    entry transformers maps its name to; patterns are anchored, whole names after ``names``'
    renamings (converters match after renamings)."""
    patterns = {f"^{re.escape(names.renamed(c))}$": c for c in components}
    op = QFormatDecode(logical, descriptor, patterns, tuple(shape), errors)
    return DecodeConverter(list(patterns), names.renamed(logical), [op])
