"""``--repack``: rewrite any valid descriptor into qformat's canonical layout, losslessly.

Canonical means what qformat's own encoders write (SPEC.md Appendix A): codes unpacked to
the logical code grid and packed again into bytes, LSB first, rows along the last logical
axis (no ``order``, ``slot_order``, ``planes``; a device layout is unpacked first); plain parameters stored in
the orientation of their grid (no ``order``); nested descriptors repacked the same way.
Elements, blocks, operations and parameter storage dtypes are kept, so every decoded value
is unchanged: only where the bits sit changes.  Component names become
``<logical>.codes``, ``<logical>.scale``, ``<logical>.scale.codes`` and so on.

A repacked checkpoint is qformat's alone: besides the components of its descriptors it holds
only the source tensors the converter did not consume (:func:`describe_recorded`: the model's
other tensors, biases, norms, embeddings), and the writer gives its config.json qformat's
``quantization_config``.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ..container import TensorSpec
from ..decode import full_region, read_codes
from ..descriptor import Descriptor, Param
from ..errors import error
from ..packing import Packing
from ..pipeline import Component, Item, Output, Transform
from ..schemes._common import codes_entry, packing
from ._fastpack import canonical_copy, pack_canonical
from ..sources import Source, TensorInfo


class _Recording:
    """A checkpoint seen through a converter's ``describe``, recording what it consumes: every
    tensor it checks (``require``) or reads (``array``) and every side JSON file it reads.
    Anything else is the checkpoint's own attribute."""

    def __init__(self, ck: Any):
        self._ck = ck
        self.tensors: set[str] = set()
        self.side_files: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ck, name)

    def __contains__(self, name: object) -> bool:
        return name in self._ck

    def require(self, name: str, dtypes: Any = None, rank: int | None = None) -> Any:
        self.tensors.add(name)
        return self._ck.require(name, dtypes, rank)

    def array(self, name: str) -> np.ndarray:
        self.tensors.add(name)
        return self._ck.array(name)

    def side_json(self, name: str) -> Any:
        value = self._ck.side_json(name)
        if value is not None:
            self.side_files.add(name)
        return value

    def quantization_config(self) -> Any:
        from ..checkpoint.source import Checkpoint

        return Checkpoint.quantization_config(self)  # type: ignore[arg-type]  # its side_json reads are recorded


def describe_recorded(converter: Any, ck: Any) -> Any:
    """``converter.describe(ck)`` with :attr:`~qformat.convert.base.Described.consumed` and
    ``consumed_side_files`` filled: the source tensors the converter checked or read and the
    side JSON files it read while describing.  Those are what the descriptors were built from
    (a bitsandbytes quant-state blob and ``quant_map``, a folded GPTQ ``g_idx``, a
    compressed-tensors ``weight_shape``, ``quanto_qmap.json``), so ``--repack``, whose
    descriptors no longer point at them, leaves them out.  Reads made later, when an added
    tensor is produced, are not counted (the tensors such a producer reads were checked here)."""
    rec = _Recording(ck)
    described = converter.describe(rec)
    described.consumed = set(rec.tensors)
    described.consumed_side_files = set(rec.side_files)
    return described


class Repack(Transform):
    """The ``--repack`` transform: each described tensor rewritten into qformat's canonical
    layout (:func:`repack_plan`), losslessly; plain tensors pass through."""

    def apply(self, item: Item, source: Source) -> Output:
        if item.descriptor is None:
            return Output(None, dict(item.components))
        from ..descriptor import parse_descriptor

        desc = item.parsed if item.parsed is not None else parse_descriptor(item.name, item.descriptor)
        dj, comps = repack_plan(item.name, desc, source)
        return Output(dj, comps)


def repack(name: str, desc: Descriptor, src: Source) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(canonical descriptor JSON, its component arrays) for logical tensor ``name``."""
    out, comps = repack_plan(name, desc, src)
    return out, {k: c.produce() for k, c in comps.items()}


def repack_plan(name: str, desc: Descriptor, src: Source) -> tuple[dict[str, Any], dict[str, Component]]:
    """(canonical descriptor JSON, its components) for logical tensor ``name``, nothing computed:
    each component's dtype and shape are known now and its array is made when produced (each
    on its own, reading ``src`` again), so a writer can plan headers first and hold one at a time."""
    comps: dict[str, Component] = {}
    renamed: dict[str, str] = {}  # source name of a shared tensor (group index) -> new name
    out = _repack(name, desc, src, comps, renamed)
    return out, comps


def _canonical(desc: Descriptor, src: Source) -> tuple[Descriptor, Callable[[], Source], Source]:
    """(canonical descriptor, a callable giving the source of its components, a source for
    their infos).  A device layout (SPEC.md §11) is a permutation of its canonical component:
    it is unpacked exactly (NumPy reference, qformat.layouts) when a component is produced;
    its infos are taken from one unpacking now, dropped at once."""
    if desc.layout == "canonical":
        return desc, lambda: src, src
    from ..layouts import canonical_view

    cdesc, view = canonical_view(desc, src)
    infos = {n: TensorInfo(*_info(view, n)) for _, n in cdesc.references()}
    del view
    return cdesc, lambda: canonical_view(desc, src)[1], _Infos(infos)


class _Infos:
    def __init__(self, infos: dict[str, TensorInfo]):
        self.infos = infos

    def info(self, name: str) -> TensorInfo | None:
        return self.infos.get(name)


def _info(src: Any, name: str) -> tuple[str, tuple[int, ...]]:
    i = src.info(name)
    if i is None:
        raise error("CONVERT_SOURCE_INVALID", f"tensor {name!r} is not in the checkpoint", tensor=name)
    return i.dtype, tuple(i.shape)


def _packed_shape(shape: tuple[int, ...], bits: int) -> tuple[int, ...]:
    """Shape of :func:`qformat.schemes._common.pack` of codes of ``shape``."""
    s = tuple(shape) if shape else (1,)
    return s[:-1] + (Packing.from_dict(packing(len(s))).words_per_row(s[-1], bits),)


def _file_range(src: Any, name: str) -> tuple[str, int] | None:
    """Where the source tensor ``name`` sits byte for byte in a file (None when unknown)."""
    component = getattr(src, "component", None)
    if component is None:
        return None
    try:
        return component(name).copy_from  # type: ignore[no-any-return]
    except Exception:  # noqa: BLE001 - not a stored tensor of a file: produce it instead
        return None


def _admit_of(src: Any, name: str, where: Any) -> Any:
    """The copied source tensor's payload check (``OutTensor.admit``; None when not copied)."""
    if where is None:
        return None
    try:
        return src.component(name).admit
    except Exception:  # noqa: BLE001
        return None


#: the canonical packing runs along the last axis, and packing axes are 0..15 (SPEC.md §5.5)
MAX_REPACK_RANK = 16


def _repack(prefix: str, desc: Descriptor, src: Source, comps: dict[str, Component], renamed: dict[str, str]) -> dict[str, Any]:
    if len(desc.shape) > MAX_REPACK_RANK:
        raise error("CONVERT_UNSUPPORTED", f"--repack packs codes along the last axis, and a packing axis is at most 15 "
                    f"(SPEC.md §5.5); this tensor has rank {len(desc.shape)}: convert it without --repack",
                    tensor=prefix, field="shape")
    original = desc
    desc, get_src, infos = _canonical(desc, src)
    el = desc.codes.element
    element = el.to_dict()
    if el.table_tensor is not None:
        element["table_tensor"] = _copy(get_src, infos, el.table_tensor, f"{prefix}.table", comps, renamed)
    codes_name = f"{prefix}.codes"
    cdesc = desc

    out_shape = _packed_shape(tuple(desc.shape), el.bits)
    # Codes already in the canonical packing (a qformat file, a GGUF conversion) are the same
    # bytes with the padding bits of each row cleared: no unpacking (tests/convert/test_fastpack.py).
    stored = infos.info(desc.codes.tensor)
    as_is = (len(desc.shape) >= 1 and desc.codes.packing == Packing.from_dict(packing(len(desc.shape)))
             and stored is not None and stored.dtype == "U8" and math.prod(stored.shape) == math.prod(out_shape))

    where = None
    if as_is and desc is original and (desc.shape[-1] * el.bits) % 8 == 0:
        where = _file_range(src, desc.codes.tensor)  # no padding bits: the very bytes of the source

    def codes() -> np.ndarray:
        if as_is:
            words = np.asarray(get_src().array(cdesc.codes.tensor)).reshape(out_shape)
            return canonical_copy(words, cdesc.shape[-1], el.bits)
        return pack_canonical(read_codes(cdesc, get_src(), full_region(cdesc.shape)), el.bits)

    comps[codes_name] = Component(TensorSpec(codes_name, "U8", out_shape), codes, where, _admit_of(src, desc.codes.tensor, where))
    d: dict[str, Any] = {"shape": list(desc.shape), "dtype": desc.dtype, "codes": codes_entry(codes_name, element, len(desc.shape))}
    for p in desc.params():
        d[p.role] = _param(prefix, desc, p, src, get_src, infos, comps, renamed, direct=desc is original)
    if desc.allow_nonfinite_params:
        d["allow_nonfinite_params"] = True
    if desc.scheme is not None:
        d["scheme"] = desc.scheme
    if desc.extensions:
        d["extensions"] = [e.to_dict() for e in desc.extensions]
    return d


def _param(prefix: str, desc: Descriptor, p: Param, src: Source, get_src: Callable[[], Source], infos: Any,
           comps: dict[str, Component], renamed: dict[str, str], direct: bool = False) -> dict[str, Any]:
    blocks = p.blocks.to_dict()
    if p.blocks.index is not None:
        blocks["index"]["tensor"] = _copy(get_src, infos, p.blocks.index.tensor, f"{prefix}.group_index", comps, renamed)
    out: dict[str, Any] = {"blocks": blocks}
    if p.op is not None:
        out["op"] = p.op
    pname = f"{prefix}.{p.role}"
    if p.encoded is not None:
        # A nested descriptor is canonical once its parent is (canonical_view rewrites the whole tree).
        out["encoded"] = _repack(pname, p.encoded, _Deferred(get_src, infos), comps, renamed)
        return out
    assert p.tensor is not None
    grid = tuple(p.blocks.grid_shape(desc.shape))
    order = p.order or tuple(range(len(grid)))
    tensor = p.tensor

    def values() -> np.ndarray:
        stored = np.asarray(get_src().array(tensor))
        permuted = tuple(grid[a] for a in order)
        v = stored.reshape(permuted).transpose(np.argsort(order)) if math.prod(grid) else np.zeros(grid, stored.dtype)
        return np.ascontiguousarray(v)

    # np.ascontiguousarray makes a 0-d array 1-d: a rank-0 parameter is stored with shape [1] (as always).
    same = direct and tuple(order) == tuple(range(len(grid))) and math.prod(grid) == math.prod(_info(infos, tensor)[1] or (1,))
    where = _file_range(src, tensor) if same else None  # stored in grid order: the source's bytes
    comps[pname] = Component(TensorSpec(pname, _info(infos, tensor)[0], grid or (1,)), values, where, _admit_of(src, tensor, where))
    out["tensor"] = pname
    return out


class _Deferred:
    """A source whose arrays come from ``get_src()`` when read and whose infos are known now."""

    def __init__(self, get_src: Callable[[], Source], infos: Any):
        self.get_src, self.infos = get_src, infos

    def info(self, name: str) -> Any:
        return self.infos.info(name)

    def array(self, name: str) -> np.ndarray:
        return self.get_src().array(name)


def _copy(get_src: Callable[[], Source], infos: Any, name: str, new: str, comps: dict[str, Component], renamed: dict[str, str]) -> str:
    if name in renamed:
        return renamed[name]
    dtype, shape = _info(infos, name)
    comps[new] = Component(TensorSpec(new, dtype, shape or (1,)), lambda: np.ascontiguousarray(get_src().array(name)))
    renamed[name] = new
    return new
