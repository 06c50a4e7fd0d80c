"""One streaming pipeline for whole-checkpoint work: items -> one transform each -> writer.

An :class:`Item` is one tensor of a source (a checkpoint, or what a converter describes): its
name, its descriptor (JSON, or None for a plain tensor), the output file it belongs to, and its
stored components as :class:`Component` s, each a :class:`~qformat.container.TensorSpec`
plus a callable producing the array when asked.  A :class:`Transform` maps an item to an
:class:`Output`: the output descriptor and output components, again specs plus producers, so
every file's header can be planned before any byte is produced.  :func:`run` applies one
transform per item and hands the outputs to :func:`qformat.checkpoint.writer.write_checkpoint`,
which produces and writes one tensor at a time.

A new whole-checkpoint operation (quantize, dequantize, export) is one small Transform
subclass: ``apply(item, source)`` returning specs and producers, nothing computed up front.
:class:`Identity` is here; ``--repack`` is :class:`qformat.convert.repack.Repack`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from .checkpoint.writer import IndexSpec, OutFile, OutTensor, write_checkpoint
from .container import TensorSpec
from .errors import error
from .sources import Source, TensorInfo


@dataclass(frozen=True)
class Component(OutTensor):
    """A stored tensor known by name, dtype and shape before its bytes exist: the writer's
    :class:`~qformat.checkpoint.writer.OutTensor` (spec, producer, optional ``copy_from``: where
    its bytes already sit unchanged in a file, copied file to file), seen as a source's tensor."""

    @property
    def info(self) -> TensorInfo:
        return TensorInfo(self.spec.dtype, self.spec.shape)

    @staticmethod
    def of_array(name: str, array: Any) -> "Component":
        """A component over an array already in memory (in its storage dtype)."""
        from . import dtypes as _dt

        a = np.asarray(array)
        st = _dt.storage_name(a.dtype)
        if st is None:
            raise error("SAVE_INVALID", f"array dtype {a.dtype} has no safetensors dtype", tensor=name)
        return Component(TensorSpec(name, st, tuple(a.shape)), lambda: a)


@dataclass
class Item:
    """One tensor of a source: ``name`` (logical name, or the stored name of a plain tensor),
    ``descriptor`` (descriptor JSON, None for a plain tensor), ``components`` (stored name ->
    component) and ``file`` (the output file it goes to).  ``parsed`` optionally holds the
    parsed :class:`~qformat.descriptor.Descriptor`."""

    name: str
    descriptor: dict[str, Any] | None
    components: dict[str, Component]
    file: str
    parsed: Any = None


@dataclass
class Output:
    """What a transform makes of an item: descriptor JSON (None for a plain tensor) and the
    components to store, by name."""

    descriptor: dict[str, Any] | None
    components: dict[str, Component] = field(default_factory=dict)


class Transform:
    """Maps an :class:`Item` to an :class:`Output` without producing any array: output
    component specs must be known from the item alone (names, dtypes, shapes); their
    producers run later, one at a time, when the writer reaches them.  ``source`` resolves
    any stored name of the checkpoint (info and array) for transforms that read more."""

    def apply(self, item: Item, source: Source) -> Output:
        raise NotImplementedError


class Identity(Transform):
    """Keep every tensor as it is: same descriptor, same components, bytes copied."""

    def apply(self, item: Item, source: Source) -> Output:
        return Output(item.descriptor, dict(item.components))


class ComponentSource:
    """A :class:`~qformat.sources.Source` over components (info from specs, arrays produced)."""

    def __init__(self, components: Mapping[str, Component], fallback: Source | None = None):
        self.components, self.fallback = components, fallback

    def info(self, name: str) -> TensorInfo | None:
        c = self.components.get(name)
        if c is not None:
            return c.info
        return self.fallback.info(name) if self.fallback is not None else None

    def array(self, name: str) -> np.ndarray:
        c = self.components.get(name)
        if c is not None:
            return c.produce()
        if self.fallback is None:
            raise KeyError(name)
        return self.fallback.array(name)


@dataclass
class Plan:
    """Output files planned from transformed items: stored components and descriptors per file."""

    order: list[str]
    stored: dict[str, dict[str, Component]]
    descriptors: dict[str, dict[str, Any]]

    @property
    def bytes(self) -> int:
        return sum(c.spec.nbytes for f in self.order for c in self.stored[f].values())


def plan(outputs: Iterable[tuple[Item, Output]], order: Iterable[str] | None = None) -> Plan:
    """Gather transformed items into files, in item order: a component name seen twice in one
    file keeps its last producer (the same tensor), a logical tensor lists its descriptor in
    its item's file.  ``order`` lists file names first in that order (others follow sorted)."""
    stored: dict[str, dict[str, Component]] = {}
    descs: dict[str, dict[str, Any]] = {}
    for item, out in outputs:
        files = stored.setdefault(item.file, {})
        for k, c in out.components.items():
            files[k] = c if c.spec.name == k else dataclasses.replace(c, spec=TensorSpec(k, c.spec.dtype, c.spec.shape))
        if out.descriptor is not None:
            descs.setdefault(item.file, {})[item.name] = out.descriptor
    first = [f for f in (order or []) if f in stored]
    names = first + sorted(f for f in stored if f not in first)
    for f in names:
        descs.setdefault(f, {})
    return Plan(names, stored, descs)


def transform_all(items: Iterable[Item], transform: Transform, source: Source) -> Iterator[tuple[Item, Output]]:
    """Apply ``transform`` to each item (specs only; nothing is produced yet)."""
    for item in items:
        yield item, transform.apply(item, source)


def run(plan_: Plan, dst: str | os.PathLike[str], metadata: Callable[[str, dict[str, Any]], dict[str, str] | None], *,
        as_folder: bool, overwrite: bool = False, side_files: Iterable[str] = (), index: IndexSpec | None = None,
        verify: Callable[[str], None] | None = None, release: Callable[[], None] | None = None,
        file_done: Callable[[str, int], None] | None = None, extra_files: Mapping[str, bytes] | None = None) -> list[str]:
    """Write a :class:`Plan` with :func:`~qformat.checkpoint.writer.write_checkpoint`.

    ``metadata(file, descriptors)`` gives each file's ``__metadata__``; ``release()`` runs
    after each tensor body is written (a memory-mapped source drops its resident pages there,
    so they do not accumulate over the checkpoint).
    """
    files = []
    for f in plan_.order:
        out = OutFile(f, metadata(f, plan_.descriptors[f]) or None, logical=list(plan_.descriptors[f]))
        out.tensors = list(plan_.stored[f].values())  # components are the writer's OutTensors
        files.append(out)
    return write_checkpoint(dst, files, as_folder=as_folder, overwrite=overwrite, side_files=side_files, index=index,
                            verify=verify, written=(lambda _s: release()) if release is not None else None, file_done=file_done,
                            extra_files=extra_files)
