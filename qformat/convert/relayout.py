"""Renaming and reordering what a converter described, exactly: the step between a source's
own naming (GGUF's ``blk.0.attn_q.weight``) and a runtime's (``model.layers.0.self_attn.q_proj.weight``).

:func:`relayout` takes a :class:`~.base.Described` and one :class:`Move` per tensor to keep:

* the new name (a logical tensor's components follow: ``<old>.codes`` becomes ``<new>.codes``);
* optionally a row order (``rows[i]`` is the source row that becomes row ``i``), applied to
  the packed components themselves: whole rows of codes and of per-row parameters move
  (:func:`qformat.slicing.row_components` says which components those are), so the moved
  tensor decodes to exactly the source's rows in the new order, with nothing re-encoded;
* for a plain tensor only, optionally a function of its values (a runtime's own arithmetic on
  a stored tensor, such as Gemma's ``norm - 1``), applied when the tensor is written.

Tensors without a move are left out.  Nothing is produced here: every component stays lazy,
so the writer still holds one tensor at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from ..container import TensorSpec
from ..descriptor import parse_descriptor
from ..dtypes import storage_name
from ..errors import QFormatError, error
from ..pipeline import Component
from ..qtensor import rename_references
from ..slicing import row_components
from .base import Described


@dataclass(frozen=True)
class Move:
    """Where one tensor goes (see the module docstring)."""

    name: str
    rows: np.ndarray | None = None
    values: Callable[[np.ndarray], np.ndarray] | None = None
    #: dtype and shape of ``values``' result (storage dtype name, shape), when it changes them.
    values_info: tuple[str, tuple[int, ...]] | None = None


def reorder_rows(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``a``'s elements as one equal run per row, runs taken in the order ``rows`` (see
    :func:`qformat.slicing.row_components`); the shape is kept."""
    a = np.asarray(a)
    return np.ascontiguousarray(a.reshape(len(rows), -1)[rows]).reshape(a.shape)


def _rows_of(c: Component, rows: np.ndarray, name: str) -> Component:
    n = int(np.prod(c.spec.shape))
    if len(rows) == 0 or n % len(rows):
        raise error("CONVERT_UNSUPPORTED", f"component {c.spec.name!r} of shape {list(c.spec.shape)} does not split into "
                    f"{len(rows)} rows", tensor=name)
    spec = TensorSpec(name, c.spec.dtype, c.spec.shape)
    return Component(spec, lambda: reorder_rows(c.produce(), rows))


def relayout(described: Described, moves: Mapping[str, Move]) -> Described:
    """A new :class:`~.base.Described` with ``moves`` applied (module docstring).

    Raises ``CONVERT_UNSUPPORTED`` naming the tensor when a row order cannot be applied to its
    components (:func:`~qformat.slicing.row_components`), when a value function is given for a
    quantized tensor, or when two tensors would take one name.
    """
    out = Described(metadata={k: v for k, v in described.metadata.items()})
    taken: dict[str, str] = {}

    def claim(new: str, old: str) -> None:
        if new in taken:
            raise error("CONVERT_UNSUPPORTED", f"{old!r} and {taken[new]!r} would both be named {new!r}", tensor=old)
        taken[new] = old

    for old, raw in described.descriptors.items():
        mv = moves.get(old)
        if mv is None:
            continue
        if mv.values is not None:
            raise error("CONVERT_UNSUPPORTED", "a change of values can only be applied to a plain tensor, and this one is quantized", tensor=old)
        claim(mv.name, old)

        def renamed(c: str, old: str = old, new: str = mv.name) -> str:
            if c == old or c.startswith(old + "."):
                return new + c[len(old):]
            raise error("CONVERT_UNSUPPORTED", f"component {c!r} is not named after its tensor", tensor=old)

        follows: dict[str, bool] = {}
        if mv.rows is not None:
            try:
                follows = row_components(parse_descriptor(old, raw))
            except QFormatError as e:
                raise error("CONVERT_UNSUPPORTED", f"its rows cannot be reordered: {e.message}", tensor=old) from None
        out.descriptors[mv.name] = rename_references(raw, renamed)
        for c in sorted({ref for _, ref in parse_descriptor(old, raw).references()}):
            comp = described.added.component(c)
            new = renamed(c)
            claim(new, c)
            if follows.get(c):
                out.added[new] = _rows_of(comp, mv.rows, new)  # type: ignore[arg-type]
            else:
                out.added[new] = Component(TensorSpec(new, comp.spec.dtype, comp.spec.shape), comp.produce, comp.copy_from, comp.admit)
    for old in described.plain:
        mv = moves.get(old)
        if mv is None:
            continue
        claim(mv.name, old)
        comp = described.plain.component(old)
        if mv.values is not None:
            fn = mv.values
            dtype, shape = mv.values_info or (comp.spec.dtype, comp.spec.shape)
            comp = Component(TensorSpec(mv.name, dtype, tuple(shape)), lambda c=comp, fn=fn: np.asarray(fn(np.asarray(c.produce()))))
        if mv.rows is not None:
            comp = _rows_of(comp, mv.rows, mv.name)
        kept = mv.values is None and mv.rows is None
        out.plain[mv.name] = Component(TensorSpec(mv.name, comp.spec.dtype, comp.spec.shape), comp.produce,
                                       comp.copy_from if kept else None, comp.admit if kept else None)
    return out


def storage_of(a: np.dtype) -> str:
    """The safetensors dtype name of a NumPy dtype (for :attr:`Move.values_info`)."""
    st = storage_name(np.dtype(a))
    if st is None:
        raise error("CONVERT_UNSUPPORTED", f"dtype {a} has no safetensors name")
    return st
