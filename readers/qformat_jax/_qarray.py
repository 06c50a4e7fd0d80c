"""QArray (a packed tensor as a JAX pytree) and :func:`dequantize`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from qformat import QTensor
from qformat.descriptor import Descriptor, Param, parse_descriptor
from qformat.errors import QFormatError, error, raise_first
from qformat.regions import check_group_index
from qformat.sources import ArraySource
from qformat.validate import validate_descriptor

from .decode import _JNP_LOGICAL, decode_traced, descriptor_json, jitted


@lru_cache(maxsize=512)
def parsed(desc_json: str) -> Descriptor:
    return Descriptor.from_dict(json.loads(desc_json))


def group_index_params(desc: Descriptor) -> dict[str, Param]:
    """Group-index component name -> the parameter it indexes, over every (nested) parameter."""
    out: dict[str, Param] = {}
    for prm in desc.params():
        if prm.blocks.index is not None:
            out[prm.blocks.index.tensor] = prm
        if prm.encoded is not None:
            out.update(group_index_params(prm.encoded))
    return out


def host_components(desc: Descriptor, comps: Mapping[str, Any], tensor: str | None = None) -> dict[str, np.ndarray]:
    """Component arrays ready for the device, unchanged in bits and dtype.

    Group indices are range-checked here by the core (:func:`qformat.regions.check_group_index`,
    GROUP_INDEX_RANGE: never used as an out-of-range coordinate) and narrowed to int32, since
    JAX holds no 64-bit integers by default.
    """
    out = {}
    gidx = group_index_params(desc)
    empty = desc.numel == 0  # no element uses any cell: no decode-time check applies (SPEC.md §9, §12.4)
    for name, a in comps.items():
        prm = gidx.get(name)
        if prm is not None and empty:
            a = np.zeros(np.shape(a), np.int32)  # never read
        elif prm is not None:
            try:
                a = check_group_index(prm, np.asarray(a), 0).astype(np.int32)
            except QFormatError as e:  # the same error, naming the tensor
                raise error(e.code, e.message, tensor=tensor, field=e.field) from None
        out[name] = a
    return out


def _is_traced(leaves: Any) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in leaves)


def raise_if_bad(ok: Any, tensor: str | None) -> None:
    if not bool(ok):
        raise error("CODE_OUT_OF_RANGE", "a code indexes past the end of its codebook table", tensor=tensor, field="codes.tensor")


@jax.tree_util.register_pytree_node_class
class QArray:
    """A quantized tensor kept packed in device memory, usable inside ``jax.jit``.

    The component arrays are the pytree leaves; the descriptor (JSON text) is static auxiliary
    data, so every shape in the decode is known at trace time.  ``q.dequantize()`` inside a
    jitted function (a model's forward pass) decodes there, as one fused computation, from the
    packed leaves::

        @jax.jit
        def forward(params, x):
            return x @ params["w"].dequantize().T
    """

    __slots__ = ("_desc_json", "_names", "_leaves", "_sharded")

    def __init__(self, descriptor: Mapping[str, Any] | Descriptor, components: Mapping[str, Any],
                 sharded: "ShardInfo | None" = None):
        self._desc_json = descriptor_json(descriptor)
        self._names = tuple(sorted(components))
        self._leaves = tuple(components[n] for n in self._names)
        self._sharded = sharded

    # -- pytree ------------------------------------------------------------------------------
    def tree_flatten(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        return self._leaves, (self._desc_json, self._names, self._sharded)

    @classmethod
    def tree_unflatten(cls, aux: tuple[Any, ...], leaves: Any) -> "QArray":
        obj = object.__new__(cls)
        obj._desc_json, obj._names, obj._sharded = aux
        obj._leaves = tuple(leaves)
        return obj

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_qtensor(cls, qt: QTensor, device: Any = None) -> "QArray":
        """Validate a :class:`qformat.QTensor` and put its components on ``device``."""
        raw = qt.descriptor
        desc = parse_descriptor("<qtensor>", raw)
        comps = qt.components
        raise_first(validate_descriptor("<qtensor>", desc, ArraySource(comps)))
        host = host_components(desc, comps)
        return cls(desc, jax.device_put(host, device))

    # -- views -------------------------------------------------------------------------------
    @property
    def descriptor(self) -> dict[str, Any]:
        return json.loads(self._desc_json)

    @property
    def components(self) -> dict[str, Any]:
        return dict(zip(self._names, self._leaves))

    @property
    def shape(self) -> tuple[int, ...]:
        if self._sharded is not None:
            return self._sharded.shape
        return parsed(self._desc_json).shape

    @property
    def sharding(self) -> Any:
        """The logical tensor's NamedSharding when the components are sharded, else None."""
        return None if self._sharded is None else jax.sharding.NamedSharding(self._sharded.mesh, self._sharded.spec)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(_JNP_LOGICAL[parsed(self._desc_json).dtype])

    @property
    def nbytes(self) -> int:
        return int(sum(np.dtype(x.dtype).itemsize * int(np.prod(x.shape)) for x in self._leaves))

    def dequantize(self, exact: bool = True) -> jax.Array:
        """Decode (bit-exact with the reference when ``exact``); traceable inside ``jax.jit``.

        Called eagerly, a code past the end of a codebook table raises CODE_OUT_OF_RANGE;
        inside a traced function such a code decodes to NaN (check with :meth:`check` first).
        """
        comps = self.components
        if self._sharded is not None:
            fn = _sharded_decoder(self._desc_json, self._names, self._sharded, exact)
            if _is_traced(self._leaves):
                return fn(*self._leaves)[0]
            out, ok = jax.jit(fn)(*self._leaves)
            raise_if_bad(jnp.all(ok), None)
            return out
        if _is_traced(self._leaves):
            return decode_traced(parsed(self._desc_json), comps, exact)[0]
        out, ok = jitted(self._desc_json, exact)(comps)
        raise_if_bad(ok, None)
        return out

    def check(self) -> "QArray":
        """Raise CODE_OUT_OF_RANGE if a code indexes past a codebook table (decodes once)."""
        if self._sharded is not None:
            _, ok = jax.jit(_sharded_decoder(self._desc_json, self._names, self._sharded, True))(*self._leaves)
            raise_if_bad(jnp.all(ok), None)
            return self
        _, ok = jitted(self._desc_json, True)(self.components)
        raise_if_bad(ok, None)
        return self

    def __repr__(self) -> str:
        d = parsed(self._desc_json)
        extra = "" if self._sharded is None else f", sharding={self._sharded.spec}"
        return f"QArray(shape={self.shape}, dtype={d.dtype}, scheme={d.scheme}, nbytes={self.nbytes}{extra})"


@dataclass(frozen=True)
class ShardInfo:
    """How a sharded QArray's components are laid out (static pytree data).

    Every device holds a standalone quantized block of the logical tensor, all blocks with the
    same local descriptor; each component is stored as a global array whose leading axes are
    the mesh axes that ``spec`` uses (one block per mesh position), sharded over them.
    """

    shape: tuple[int, ...]
    mesh: Any
    spec: Any
    lead_axes: tuple[str, ...]


def lead_axes_of(spec: Any) -> tuple[str, ...]:
    out: list[str] = []
    for entry in spec:
        if entry is None:
            continue
        out.extend(entry if isinstance(entry, tuple) else (entry,))
    return tuple(out)


@lru_cache(maxsize=256)
def _sharded_decoder(desc_json: str, names: tuple[str, ...], info: ShardInfo, exact: bool):  # type: ignore[no-untyped-def]
    """shard_map of the local decode: leaves -> (global decoded array, per-device ok flags)."""
    desc = parsed(desc_json)
    P = jax.sharding.PartitionSpec
    nlead = len(info.lead_axes)
    lead = P(*info.lead_axes)

    def local(*leaves: Any) -> tuple[Any, Any]:
        comps = {n: x.reshape(x.shape[nlead:]) for n, x in zip(names, leaves)}
        out, ok = decode_traced(desc, comps, exact)
        return out, ok.reshape((1,) * nlead)

    return jax.shard_map(local, mesh=info.mesh, in_specs=(lead,) * len(names), out_specs=(info.spec, lead))


def dequantize(q: Any, descriptor: Mapping[str, Any] | Descriptor | None = None, *, exact: bool = True) -> jax.Array:
    """Decode a quantized tensor with jax.numpy (bit-exact with ``qformat`` when ``exact``).

    ``q`` is a :class:`QArray`, a :class:`qformat.QTensor`, or a mapping of component arrays
    (NumPy or JAX) together with its ``descriptor`` (dict or parsed).  Works inside
    ``jax.jit`` when given traced arrays (the descriptor is static).
    """
    if isinstance(q, QArray):
        return q.dequantize(exact)
    if isinstance(q, QTensor):
        return QArray.from_qtensor(q).dequantize(exact)
    if descriptor is None:
        raise TypeError("dequantize(components, descriptor): the descriptor is missing")
    comps = dict(q)
    if _is_traced(comps.values()):
        desc = descriptor if isinstance(descriptor, Descriptor) else Descriptor.from_dict(descriptor)
        return decode_traced(desc, comps, exact)[0]
    desc = descriptor if isinstance(descriptor, Descriptor) else parse_descriptor("<components>", dict(descriptor))
    raise_first(validate_descriptor("<components>", desc, ArraySource(comps)))
    host = host_components(desc, {k: (v if isinstance(v, jax.Array) else np.asarray(v)) for k, v in comps.items()})
    return QArray(desc, host).dequantize(exact)
