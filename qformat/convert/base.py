"""What every converter shares: the source checkpoint it reads and the result it returns.

A converter (one module per source format in this package) looks at a :class:`Checkpoint`
and returns a :class:`Described`: the descriptors that make the source's own tensors
self-describing, any tensors it must add (a value that the source kept outside tensors, such
as bitsandbytes' ``nested_offset``), and the source tensors it leaves out.  Writing the
result (in place, or repacked into qformat's canonical layout) is the job of
:mod:`qformat.convert.writer`, the same for every source.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, MutableMapping

import numpy as np

from ..checkpoint.source import MAX_SIDE_JSON_BYTES, Checkpoint, drop_pages, parse_json_text, read_json_file, source_error
from ..container import TensorSpec
from ..errors import QFormatError, error
from ..pipeline import Component
from ..sources import TensorInfo

__all__ = ["MAX_SIDE_JSON_BYTES", "Checkpoint", "Converter", "Described", "LazyArrays", "drop_pages", "lazy",
           "parse_json_text", "quant_config_value", "read_json_file", "source_error", "unsupported"]


def unsupported(message: str, tensor: str | None = None, field: str | None = None) -> QFormatError:
    """A ``CONVERT_UNSUPPORTED`` error: a variant of the format this converter does not handle."""
    return error("CONVERT_UNSUPPORTED", message, tensor=tensor, field=field)


class LazyArrays(MutableMapping[str, np.ndarray]):
    """Arrays by name, each kept as a :class:`~qformat.pipeline.Component`: its dtype and shape
    are known at once (:meth:`info`), its values are produced only when read (``[name]``).
    Assigning an array stores it as it is; assigning a Component stores the producer."""

    def __init__(self) -> None:
        self._c: dict[str, Component] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        return self._c[name].produce()

    def __setitem__(self, name: str, value: Any) -> None:
        self._c[name] = value if isinstance(value, Component) else Component.of_array(name, value)

    def __delitem__(self, name: str) -> None:
        del self._c[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._c)

    def __len__(self) -> int:
        return len(self._c)

    def __contains__(self, name: object) -> bool:
        return name in self._c

    def component(self, name: str) -> Component:
        return self._c[name]

    def get_component(self, name: str) -> Component | None:
        return self._c.get(name)

    def info(self, name: str) -> TensorInfo | None:
        c = self._c.get(name)
        return None if c is None else c.info


def lazy(dtype: str, shape: Iterable[int], produce: Callable[[], np.ndarray]) -> Component:
    """A component to add to :class:`Described` without computing it now (the name is set on add)."""
    return Component(TensorSpec("", dtype, tuple(int(s) for s in shape)), produce)


@dataclass
class Described:
    """What a converter found: descriptors over the source's tensors, plus additions.

    ``descriptors`` maps each logical tensor name to its descriptor (JSON), whose references
    are stored tensor names: source tensors kept byte for byte, or tensors in ``added``.
    ``dropped`` lists source tensors the output leaves out (for example a bitsandbytes
    quant_state blob once folded into a descriptor is kept, so this is usually empty).
    ``metadata`` is merged into every output file's ``__metadata__``.

    ``added`` and ``plain`` are :class:`LazyArrays`: a converter adds an array it already has,
    or a :func:`lazy` component (dtype, shape, producer), so the writer plans every header from
    specs and produces each added tensor only when it writes it, one at a time (GGUF's
    components are made per tensor at write time, never all up front).  Descriptors are JSON
    and small; every file's header needs all of them before its first tensor body anyway.
    """

    descriptors: dict[str, dict[str, Any]] = field(default_factory=dict)
    added: LazyArrays = field(default_factory=LazyArrays)
    dropped: set[str] = field(default_factory=set)
    metadata: dict[str, str] = field(default_factory=dict)
    #: For sources without safetensors files (GGUF): the only output file's tensors in order.
    plain: LazyArrays = field(default_factory=LazyArrays)
    #: Source tensors and side files (``quanto_qmap.json``, ``hf_quant_config.json``) the converter
    #: checked or read to build the descriptors: a quant-state blob, a codebook it compared, a
    #: folded ``g_idx``, a shape tensor.  In place they stay (the source's runtime reads them);
    #: ``--repack`` leaves them out, their content now being in the descriptors.  Filled by
    #: :func:`qformat.convert.describe` (:func:`qformat.convert.repack.describe_recorded`) from
    #: the converter's ``require``/``array``/``side_json`` calls, so a converter looks at a tensor
    #: it leaves to the model (a bias giving a shape) with ``info``.
    consumed: set[str] = field(default_factory=set)
    consumed_side_files: set[str] = field(default_factory=set)

    def add(self, name: str, array: Any) -> str:
        """Add a tensor (an array, or a :func:`lazy` component) under ``name``; returns ``name``."""
        if name in self.added:
            raise KeyError(f"tensor {name!r} added twice")
        if isinstance(array, Component):
            self.added[name] = Component(TensorSpec(name, array.spec.dtype, array.spec.shape), array.produce, array.copy_from, array.admit)
        else:
            self.added[name] = np.asarray(array)
        return name

    def tensors(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """The described logical tensors one by one: (name, descriptor JSON)."""
        yield from self.descriptors.items()


class Converter:
    """One source format.  Subclasses set ``name`` (the stable id that ``--from`` takes),
    ``title``, and implement :meth:`detect` and :meth:`describe`."""

    name: str = ""
    title: str = ""
    #: Detection order: lower runs first (formats whose config is specific go before generic ones).
    priority: int = 100

    def detect(self, ck: Checkpoint) -> bool:
        raise NotImplementedError

    def describe(self, ck: Checkpoint) -> Described:
        raise NotImplementedError


def quant_config_value(qc: Mapping[str, Any], key: str, kinds: tuple[type, ...], default: Any = None, required: bool = False) -> Any:
    """A typed value of a quantization config, or ``CONVERT_SOURCE_INVALID``."""
    if key not in qc:
        if required:
            raise source_error(f"quantization_config has no {key!r}", field=f"quantization_config.{key}")
        return default
    v = qc[key]
    if isinstance(v, bool) and bool not in kinds:
        raise source_error(f"{key} is {v!r}, expected {' or '.join(k.__name__ for k in kinds)}", field=f"quantization_config.{key}")
    if not isinstance(v, kinds):
        raise source_error(f"{key} is {json.dumps(v)[:60]}, expected {' or '.join(k.__name__ for k in kinds)}", field=f"quantization_config.{key}")
    return v
