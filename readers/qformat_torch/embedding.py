"""Packed embeddings: an ``nn.Embedding`` whose table stays packed in qformat.

:func:`pack_embedding` turns an ``nn.Embedding`` (or a model's subclass of it whose forward is
a known one: ``nn.Embedding``'s own, or Gemma's ``F.embedding(...) * embed_scale``) into a
packed one, in place: the module keeps its class (``isinstance`` still holds: its class becomes
a subclass of the old one), its other attributes and buffers, and loses its ``weight``
parameter for the packed components (raw integer buffers ``qweight_<component>``, as in
:class:`qformat_torch.nn.QLinear`).  Its forward decodes only the rows the input asks for: the
distinct ids' rows are gathered from the components that follow the rows
(:func:`qformat.slicing.row_components`: codes and per-row parameters move whole, nothing is
rounded) and decoded by the torch decoder as a tensor of those rows, then cast to the entry's
dtype: bit-identical to ``F.embedding(ids, W)`` on the decoded weight ``W``.  ``weight`` decodes
the whole table on every access (as ``QLinear.weight``).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from qformat.descriptor import Descriptor, parse_descriptor
from qformat.errors import QFormatError
from qformat.slicing import row_components

from .decode import decode
from .dtypes import LOGICAL_TORCH, STORAGE_TORCH, int_view_dtype, storage_name
from .qtensor import TorchQTensor
from .sources import TensorSource

__all__ = ["PackedEmbedding", "TiedHead", "embedding_kind", "pack_embedding", "rows_movable"]

# Gemma's scaled embeddings (Gemma 3, Gemma 3n, ...): F.embedding scaled by a buffer
_SCALED = "".join("return super().forward(input_ids) * self.embed_scale.to(self.weight.dtype)".split())


def embedding_kind(emb: nn.Module) -> str | None:
    """"plain" (``nn.Embedding.forward``), "scaled" (Gemma's ``* embed_scale``), or None: a module
    whose forward this module does not reproduce (it stays a plain decoded embedding)."""
    if not isinstance(emb, nn.Embedding) or emb.max_norm is not None:
        return None
    cls = type(emb)
    if cls.forward is nn.Embedding.forward:
        return "plain"
    try:
        src = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return None
    lines = [ln for ln in (s.strip() for s in src.splitlines()) if ln and not ln.startswith(("def ", "#", '"""'))]
    if len(lines) == 1 and "".join(lines[0].split()) == _SCALED and isinstance(getattr(emb, "embed_scale", None), torch.Tensor):
        return "scaled"
    return None


def rows_movable(desc: Descriptor, components: dict[str, tuple[int, ...]]) -> bool:
    """Whether rows of ``desc`` can be gathered from its components (``row_components``), each
    row-following component being ``[rows, ...]`` or 1-D."""
    try:
        follows = row_components(desc)
    except QFormatError:
        return False
    rows = desc.shape[0]
    for c, f in follows.items():
        shape = components.get(c)
        if shape is None:
            return False
        if f and not ((len(shape) >= 1 and shape[0] == rows) or len(shape) == 1):
            return False
    return True


class PackedEmbedding(nn.Embedding):
    """The behaviour mixed into a packed embedding's class (see the module doc); build one with
    :func:`pack_embedding`."""

    @property
    def weight(self) -> torch.Tensor:  # type: ignore[override]
        """The decoded table as the module's own parameter: asking for it makes the module the
        plain embedding it was (:meth:`unpack`), so that what is done to it (an edit in place, a
        tie, an assignment) holds, as for the embedding a decoded load gives."""
        return self.unpack()

    def weight_decoded(self) -> torch.Tensor:
        """The whole table decoded (a fresh tensor), in the entry's dtype; the module stays packed."""
        comps = self.component_tensors()
        dev = next(iter(comps.values())).device
        out = decode(self._parsed, TensorSource(comps, dev), None, tensor="weight")
        return out if out.dtype == self._entry_dtype else out.to(self._entry_dtype)

    def component_tensors(self) -> dict[str, torch.Tensor]:
        return {c: getattr(self, b).view(STORAGE_TORCH[dt]) for c, (b, dt) in self._components.items()}

    def packed_weight(self) -> TorchQTensor:
        """The table as a TorchQTensor (sharing the buffers)."""
        return TorchQTensor(self.descriptor, self.component_tensors(), _parsed=self._parsed)

    @property
    def packed_nbytes(self) -> int:
        return int(sum(getattr(self, b).numel() * getattr(self, b).element_size() for b, _ in self._components.values()))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The decoded rows ``ids`` (1-D, int64, distinct or not), in the entry's dtype: the
        components' runs of those rows, decoded as a tensor of ``len(ids)`` rows."""
        n, k = self.num_embeddings, self.embedding_dim
        m = int(ids.numel())
        ids = ids.to(getattr(self, next(iter(self._components.values()))[0]).device)
        if self._nested:  # nested parameter descriptors have row counts of their own: decode runs of rows
            return self._rows_by_region(ids)
        comps = {}
        for c, t in self.component_tensors().items():
            if self._follows.get(c):
                g = t.reshape(n, -1).index_select(0, ids)
                comps[c] = g if t.dim() > 1 else g.reshape(-1)
                if t.dim() > 2:
                    comps[c] = g.reshape((m,) + tuple(t.shape[1:]))
            else:
                comps[c] = t
        desc = self._sub_descriptors.get(m)
        if desc is None:
            if len(self._sub_descriptors) > 64:
                self._sub_descriptors.clear()
            desc = self._sub_descriptors[m] = parse_descriptor("weight", {**self.descriptor, "shape": [m, k]})
        dev = ids.device
        out = torch.empty((m, k), dtype=LOGICAL_TORCH[desc.dtype], device=dev)
        out = decode(desc, TensorSource(comps, dev), None, tensor="weight", out=out)
        return out if out.dtype == self._entry_dtype else out.to(self._entry_dtype)

    def _rows_by_region(self, ids: torch.Tensor) -> torch.Tensor:
        """``rows`` by the decoder's region decode, one region per run of consecutive ids."""
        k = self.embedding_dim
        comps = self.component_tensors()
        dev = ids.device
        src = TensorSource(comps, dev)
        out = torch.empty((int(ids.numel()), k), dtype=LOGICAL_TORCH[self._parsed.dtype], device=dev)
        v = ids.tolist()
        i = 0
        while i < len(v):
            j = i + 1
            while j < len(v) and v[j] == v[j - 1] + 1:
                j += 1
            decode(self._parsed, src, ((v[i], v[j - 1] + 1), (0, k)), tensor="weight", out=out[i:j])
            i = j
        return out if out.dtype == self._entry_dtype else out.to(self._entry_dtype)

    def unpack(self) -> nn.Parameter:
        """Turn this module back into the plain embedding it was, its weight the decoded table
        (a parameter, as a loaded one is); ``_on_unpack(weight)``, where set (the loader's: tie the
        heads to it again), runs after.  Returns the weight."""
        p = nn.Parameter(self.weight_decoded())
        hook = self.__dict__.pop("_on_unpack", None)
        for b, _ in self._components.values():
            del self._buffers[b]
        for a in ("descriptor", "_parsed", "_follows", "_kind", "_entry_dtype", "_sub_descriptors", "_components", "_nested"):
            self.__dict__.pop(a, None)
        self.__class__ = self._plain_class
        self.__dict__.pop("_plain_class", None)
        self.register_parameter("weight", p)
        if hook is not None:
            hook(p)
        return p

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "weight" and "_components" in self.__dict__:
            self.unpack()
        super().__setattr__(name, value)

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002
        flat = input.reshape(-1)
        if not flat.numel():
            out = torch.empty(tuple(input.shape) + (self.embedding_dim,), dtype=self._entry_dtype,
                              device=getattr(self, next(iter(self._components.values()))[0]).device)
            return out if self._kind != "scaled" else out * self.embed_scale.to(out.dtype)
        if int(flat.min()) < 0 or int(flat.max()) >= self.num_embeddings:
            raise IndexError("index out of range in self")
        uniq, inv = torch.unique(flat, sorted=True, return_inverse=True)
        out = self.rows(uniq.to(torch.int64))[inv].reshape(tuple(input.shape) + (self.embedding_dim,))
        if self._kind == "scaled":
            out = out * self.embed_scale.to(out.dtype)
        return out

    def _apply(self, fn: Any, recurse: bool = True) -> "PackedEmbedding":  # .to(dtype) changes the entry's dtype
        out = super()._apply(fn, recurse)
        probe = next(iter(self.component_tensors().values()))
        self._entry_dtype = fn(torch.empty(0, dtype=self._entry_dtype, device=probe.device)).dtype
        return out

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, scheme={self.descriptor.get('scheme', '?')}, "
                f"dtype={self._entry_dtype}, packed_bytes={self.packed_nbytes}")


_CLASSES: dict[type, type] = {}


def _packed_class(cls: type) -> type:
    if issubclass(cls, PackedEmbedding):
        return cls
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Packed{cls.__name__}", (PackedEmbedding, cls), {"__module__": __name__})
    return _CLASSES[cls]


def pack_embedding(emb: nn.Embedding, weight: TorchQTensor, dtype: torch.dtype | None = None) -> nn.Embedding:
    """Make ``emb`` (see :func:`embedding_kind`) a packed embedding over ``weight`` (shape
    ``[num_embeddings, embedding_dim]``, rows movable: :func:`rows_movable`), in place; its
    lookups come out in ``dtype`` (default: the weight's logical dtype).  Returns ``emb``."""
    kind = embedding_kind(emb)
    if kind is None:
        raise ValueError(f"{type(emb).__name__}: not an embedding whose forward a packed embedding reproduces")
    if tuple(weight.shape) != (emb.num_embeddings, emb.embedding_dim):
        raise ValueError(f"packed weight of shape {list(weight.shape)} for an embedding of {emb.num_embeddings} x {emb.embedding_dim}")
    parsed = weight.parsed
    if not rows_movable(parsed, {c: tuple(t.shape) for c, t in weight.components.items()}):
        raise ValueError("the packed weight's rows cannot be gathered independently")
    emb._parameters.pop("weight", None)
    emb._modules.pop("weight", None)
    plain = type(emb)
    emb.__class__ = _packed_class(plain)
    emb.__dict__["_plain_class"] = plain
    emb._nested = any(prm.encoded is not None for prm in parsed.params())
    emb.descriptor = weight.descriptor
    emb._parsed = parsed
    emb._follows = row_components(parsed)
    emb._kind = kind
    emb._entry_dtype = dtype or LOGICAL_TORCH[parsed.dtype]
    emb._sub_descriptors = {}
    emb._components = {}
    for comp, t in sorted(weight.components.items()):
        bname = "qweight_" + "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in comp)
        raw = t.view(torch.uint8) if t.dtype == torch.bool else t.view(int_view_dtype(t.element_size()))
        emb.register_buffer(bname, raw)
        emb._components[comp] = (bname, storage_name(t.dtype))
    return emb


class TiedHead(nn.Module):
    """An output projection tied to a packed embedding: ``x W^T (+ b)`` with ``W`` the
    embedding's table, on the paths of :class:`qformat_torch.nn.QLinear` over the embedding's own
    buffers (:func:`qformat_torch.kernels.select`: a native kernel under the policy's bound, or
    the decode path: ``F.linear`` on the decoded table, bit-identical to the tied dense head; the
    decoded table is kept after its first use, as the dense head kept it, since decoding the
    whole vocabulary again for every token would cost more than the matmul).  It holds no tensor
    of its own (its state_dict is the bias at most: the embedding's is the tied one), and
    ``weight`` unpacks the embedding (:meth:`PackedEmbedding.unpack`), whose hook puts a plain
    ``nn.Linear`` sharing the decoded weight back in its place."""

    def __init__(self, embedding: PackedEmbedding, bias: torch.Tensor | None = None, *, kernel: str | None = None):
        super().__init__()
        self.in_features, self.out_features = embedding.embedding_dim, embedding.num_embeddings
        self.__dict__["_embedding"] = embedding  # not a child: its tensors are the embedding's
        self.kernel = kernel
        self._key: tuple[Any, ...] | None = None
        self._prepared: Any = None
        self._decoded: dict[torch.dtype, torch.Tensor] = {}
        if bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = bias if isinstance(bias, nn.Parameter) else nn.Parameter(bias.detach(), requires_grad=False)

    @property
    def _native(self) -> Any:
        """The prepared native kernel for the current policy, device and buffers (None: decode)."""
        from . import kernels

        emb = self._embedding
        comps = emb.component_tensors()
        dev = next(iter(comps.values())).device
        policy = self.kernel or kernels.get_kernel_policy()
        key = (policy, dev, tuple(t.data_ptr() for t in comps.values()))
        if key != self._key:
            self._prepared = None
            self._decoded.clear()
            self._prepared = kernels.select(emb._parsed, comps, dev, policy)
            self._key = key
        return self._prepared

    @property
    def kernel_path(self) -> str:
        nat = self._native
        return nat.path.name if nat is not None else "decode"

    @property
    def weight(self) -> torch.Tensor:
        emb = self._embedding
        return emb.unpack() if isinstance(emb, PackedEmbedding) else emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        from . import kernels

        nat = self._native
        b = self.bias if self.bias is None or self.bias.dtype == x.dtype else self.bias.to(x.dtype)
        if (nat is not None and x.dtype in nat.path.dtypes and x.device == nat.device and x.shape[-1] == self.in_features
                and not (x.requires_grad and torch.is_grad_enabled())):
            y = nat.run(x.reshape(-1, self.in_features).contiguous()).reshape(x.shape[:-1] + (self.out_features,))
            return y if b is None else y.add_(b)
        w = self._decoded.get(x.dtype)
        if w is None:
            emb = self._embedding
            w = self._decoded[x.dtype] = kernels.decode_chunked(emb._parsed, emb.component_tensors(), x.dtype)
        return F.linear(x, w, b)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, tied to a packed embedding"
