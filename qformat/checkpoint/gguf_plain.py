"""A GGUF file of plain tensors (F32 / F16 / BF16, what ``llama-quantize`` takes) read in place
by ``qformat quantize``.

:class:`PlainGGUF` answers what ``qformat quantize`` asks of a source checkpoint exactly as the
:class:`~qformat.checkpoint.source.Checkpoint` of that file's single-file conversion (``qformat
convert model.gguf model.safetensors``) would: the same tensor names, dtypes and shapes, in the
same order (the order the safetensors writer lays that file out in: widest dtype first, then
by name), the same ``__metadata__`` members (the GGUF record, ``gguf`` and its ``gguf.kv.*``
members), no ``config.json``; so the quantized output is byte for byte the one quantizing that
conversion gives.  But nothing is written first: each tensor is a little-endian view of the
GGUF file's memory map (:mod:`qformat.convert.gguf_file` parses it; ggml's dims are reversed
into NumPy order there), read when the writer reaches it, its pages dropped after it
(:meth:`release`), so memory stays bounded by the largest tensor.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .. import dtypes as _dt
from ..container import TensorSpec
from ..errors import error
from ..pipeline import Component
from ..sources import TensorInfo

SOURCE_ERROR = "QUANTIZE_SOURCE_QUANTIZED"


def _file_order_key(name: str, dtype: str) -> tuple[int, str]:
    # qformat.container.plan_file's order: every tensor aligned to its own width
    return (-max(1, _dt.storage_bits(dtype) // 8), name)


class PlainGGUF:
    """The plain tensors of the GGUF file ``src``, as the source checkpoint of ``qformat quantize``
    (see the module).  A file holding quantized tensors is QUANTIZE_SOURCE_QUANTIZED; a file the
    GGUF reader refuses keeps the reader's error (CONVERT_SOURCE_INVALID, CONVERT_UNSUPPORTED)."""

    kind = "safetensors"  # what it stands for: the single-file conversion (export reads its GGUF record)
    sharded = False
    index: dict[str, Any] | None = None
    index_name: str | None = None
    admission = None
    config: dict[str, Any] | None = None  # a single file has no config.json

    def __init__(self, src: str | os.PathLike[str]):
        from ..convert import describe

        ck, _, described = describe(src, "gguf")
        if described.descriptors:
            raise error(SOURCE_ERROR, f"{ck.path} holds quantized tensors (gguf); quantize takes plain checkpoints: "
                                      f"use `qformat convert {os.fspath(src)} DST` to turn it into qformat")
        self._ck = ck
        #: The GGUF file itself (also for a folder holding one): a single file, as its conversion is.
        self.path = os.path.join(ck.folder, ck.files[0])
        self.folder = ck.folder
        self.files = [os.path.splitext(ck.files[0])[0] + ".safetensors"]
        comps: dict[str, Component] = {}
        for n in list(described.plain) + [n for n in described.added if n not in described.plain]:
            lazy = described.plain if n in described.plain else described.added
            c = lazy.component(n)
            comps[n] = Component(TensorSpec(n, c.spec.dtype, tuple(c.spec.shape)), c.produce, c.copy_from, c.admit)
        self._comps = comps
        self._names = sorted(comps, key=lambda n: _file_order_key(n, comps[n].spec.dtype))
        self._metadata = dict(described.metadata)

    # -- what quantize reads ---------------------------------------------------------------
    def names(self) -> list[str]:
        """Every tensor, in the order the single-file conversion stores them."""
        return list(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._comps

    def info(self, name: str) -> TensorInfo | None:
        c = self._comps.get(name)
        return None if c is None else TensorInfo(c.spec.dtype, tuple(c.spec.shape))

    def file_of(self, name: str) -> str:
        if name not in self._comps:
            raise KeyError(name)
        return self.files[0]

    def array(self, name: str) -> np.ndarray:
        """The tensor, a read-only view of the GGUF file's memory map in its storage dtype."""
        c = self._comps.get(name)
        if c is None:
            raise error("CONVERT_SOURCE_INVALID", f"tensor {name!r} is not in the checkpoint", tensor=name)
        return c.produce()

    def admit(self, name: str) -> None:
        """Nothing to check: plain tensors of a GGUF file (the reader checked their extents)."""

    def component(self, name: str) -> Component:
        c = self._comps.get(name)
        if c is None:
            raise error("CONVERT_SOURCE_INVALID", f"tensor {name!r} is not in the checkpoint", tensor=name)
        return c

    def metadata(self, file: str) -> dict[str, str]:
        if file not in self.files:
            raise KeyError(file)
        return dict(self._metadata)

    def quantization_config(self) -> dict[str, Any] | None:
        return None

    def has_qformat(self) -> bool:
        return False

    def release(self) -> None:
        """Drop the GGUF memory map's resident pages (read again from the page cache when touched)."""
        self._ck.release()
