"""QTensor: a quantized tensor held in memory as its descriptor plus component arrays."""

from __future__ import annotations

import copy
import json
from typing import Any, Callable, Mapping

import numpy as np

from . import dtypes as _dt


class QTensor:
    """A logical tensor stored as packed components.

    ``descriptor`` is the JSON-serialisable descriptor (SPEC.md, "Descriptor"); the tensor names
    it references are keys of ``components``, whose values are NumPy arrays in their storage
    dtypes.  ``shape`` and ``dtype`` are the logical ones: what :meth:`dequantize` returns.
    The component arrays are kept as given, never copied (memory maps and zero-stride views
    stay what they are); the descriptor is copied.
    """

    __slots__ = ("_descriptor", "_components")

    def __init__(self, descriptor: Mapping[str, Any], components: Mapping[str, np.ndarray]):
        self._descriptor = json.loads(json.dumps(descriptor))  # a private, plain-JSON copy
        self._components = {str(k): np.asarray(v) for k, v in components.items()}

    @property
    def descriptor(self) -> dict[str, Any]:
        return copy.deepcopy(self._descriptor)

    @property
    def components(self) -> dict[str, np.ndarray]:
        return dict(self._components)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self._descriptor["shape"])

    @property
    def dtype(self) -> np.dtype:
        return _dt.logical_numpy(self._descriptor["dtype"])

    @property
    def nbytes(self) -> int:
        """Bytes of all components together (the stored size)."""
        return int(sum(a.nbytes for a in self._components.values()))

    def dequantize(self, out: np.ndarray | None = None, *, threads: int | None = None) -> np.ndarray:
        """Decode to a NumPy array of the logical shape and dtype (bit-exact reference).

        ``out``: a caller's buffer to decode into (a writable, C-contiguous NumPy array of exactly
        the logical shape and dtype; returned), written in place by the native kernels: no
        temporary array and no copy.  Any other buffer is refused before a byte is decoded
        (TypeError for a non-array, ValueError naming what differs).  ``threads``: how many
        threads decode (default: one per CPU, at most 8); the bits never depend on it."""
        from .decode import check_out, decode  # the decoder sits above this container class
        from .descriptor import parse_descriptor
        from .errors import raise_first
        from .sources import ArraySource
        from .validate import validate_descriptor

        src = ArraySource(self._components)
        desc = parse_descriptor("<qtensor>", self._descriptor)
        if out is not None:  # before validation reads anything: a wrong buffer is the caller's error
            check_out(out, self.shape, self.dtype, "<qtensor>")
        raise_first(validate_descriptor("<qtensor>", desc, src))
        return decode(desc, src, None, tensor="<qtensor>", out=out, threads=threads)

    def renamed(self, fn: Callable[[str], str]) -> "QTensor":
        """A copy whose component names are mapped through ``fn`` (descriptor updated too)."""
        desc = rename_references(self._descriptor, fn)
        return QTensor(desc, {fn(k): v for k, v in self._components.items()})

    def __repr__(self) -> str:
        scheme = self._descriptor.get("scheme", "?")
        return f"QTensor(shape={self.shape}, dtype={self.dtype.name}, scheme={scheme}, nbytes={self.nbytes})"


def rename_references(desc: Mapping[str, Any], fn: Callable[[str], str]) -> dict[str, Any]:
    """Return a copy of a descriptor with every referenced tensor name mapped through ``fn``."""
    out = copy.deepcopy(dict(desc))

    def walk(d: dict[str, Any]) -> None:
        codes = d["codes"]
        codes["tensor"] = fn(codes["tensor"])
        el = codes["element"]
        if "table_tensor" in el:
            el["table_tensor"] = fn(el["table_tensor"])
        for role in ("zero", "scale", "bias"):
            p = d.get(role)
            if p is None:
                continue
            idx = p["blocks"].get("index")
            if idx is not None:
                idx["tensor"] = fn(idx["tensor"])
            if "tensor" in p:
                p["tensor"] = fn(p["tensor"])
            else:
                walk(p["encoded"])

    walk(out)
    return out
