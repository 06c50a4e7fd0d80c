"""Tensor-parallel loading with torch.distributed: each rank reads only its slice of the packed weights.

:func:`load_tensor_parallel` turns a model's Linear (or QLinear) modules named by a *plan* into
rank-local parallel layers, in the plain form that Megatron-LM and vLLM use (no DTensor):

- ``"colwise"`` (:class:`ColwiseQLinear`): the weight ``[out_features, in_features]`` is split
  along ``out_features``; the layer takes the whole input and returns this rank's slice of the
  output (its bias is split the same way);
- ``"colwise_rep"``: the same split, followed by an ``all_gather`` of the output slices, so the
  layer returns the whole (replicated) output, as transformers' ``colwise_rep``;
- ``"rowwise"`` (:class:`RowwiseQLinear`): split along ``in_features``; the layer takes this
  rank's slice of the input, computes a partial product and ``all_reduce``\\ s it (SUM) over the
  process group; the bias (whole, on every rank) is added once, after the reduction;
- ``"replicate"``: left as it is (loaded whole, like every module the plan does not name).

The vocabulary is that of transformers' ``base_model_tp_plan`` (and of torch's
``ColwiseParallel`` / ``RowwiseParallel``), and a model's own ``config.base_model_tp_plan`` is the
default plan.  For a Llama it is q/k/v/gate/up ``colwise``, o/down ``rowwise``: attention then
runs on this rank's heads (transformers' Llama reshapes with ``-1`` heads) and the MLP on this
rank's slice of the intermediate features, with two all-reduces per decoder layer.

Every rank splits a dimension ``n`` into ``world`` equal parts (Megatron's rule, so that the
output slice of a colwise layer is exactly the input slice its rowwise partner expects).  Each
part must be block-aligned for the stored tensor's descriptor (qformat.slicing: no packed
container, parameter group, super-block or device-layout tile may be cut): rows of a
per-channel or row-grouped tensor cut anywhere, columns of an int4 g32 tensor only at multiples
of 32, columns of a tensor with flat blocks (nf4) or in a device layout not at all.  The whole
plan is checked, for every rank's bounds, from the headers alone before the first packed byte
is read, so every rank refuses the same way (``SLICE_INVALID``, naming the tensor, the axis and
the alignment rule; no rank is left waiting in a collective).  A split of an attention
projection that would leave a fraction of a head on a rank is refused too.

Reads go through :func:`qformat.slicing.slice_qtensor` over a
:class:`qformat.slicing.RecordingSource`, so ``read_log`` can list every byte range a rank read
(file offsets): the rank's rows (or the column range of every row) of the codes and of the
parameter cells that cover them, plus the plain tensors it loads.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import qformat
from qformat.errors import error, raise_first
from qformat.redact import shown
from qformat.remote import is_url
from qformat.slicing import Read, RecordingSource, describe_alignment, is_aligned, slice_qtensor

from .dtypes import numpy_to_torch
from .nn import QLinear, _get_submodule, _set_module, local_component_names
from .qtensor import TorchQTensor

__all__ = ["ColwiseQLinear", "RowwiseQLinear", "TPStats", "STYLES", "load_tensor_parallel", "llama_tp_plan", "tp_bounds"]

#: the plan styles this loader knows (transformers' vocabulary)
STYLES = ("colwise", "colwise_rep", "rowwise", "replicate")


def llama_tp_plan() -> dict[str, str]:
    """The Megatron plan for Llama-like decoders (transformers' ``LlamaConfig.base_model_tp_plan``)."""
    plan = {f"layers.*.self_attn.{p}": "colwise" for p in ("q_proj", "k_proj", "v_proj")}
    plan["layers.*.self_attn.o_proj"] = "rowwise"
    plan.update({f"layers.*.mlp.{p}": "colwise" for p in ("gate_proj", "up_proj")})
    plan["layers.*.mlp.down_proj"] = "rowwise"
    return plan


def tp_bounds(n: int, rank: int, world: int) -> tuple[int, int]:
    """``(start, stop)`` of rank ``rank``'s equal part of an axis of length ``n`` (``n % world == 0``)."""
    part = n // world
    return rank * part, (rank + 1) * part


class _Parallel:
    """What every parallel layer records about its split."""

    tp_rank: int
    tp_world: int
    tp_group: Any
    tp_style: str


def _gathered(y: torch.Tensor, world: int, group: Any) -> torch.Tensor:
    """Every rank's output slice ``y`` concatenated along the last axis (``all_gather``)."""
    if world == 1:
        return y
    parts = [torch.empty_like(y) for _ in range(world)]
    dist.all_gather(parts, y.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


def _summed(y: torch.Tensor, world: int, group: Any) -> torch.Tensor:
    """The sum of every rank's partial product ``y`` (``all_reduce``, SUM; in place)."""
    if world > 1:
        y = y.contiguous()
        dist.all_reduce(y, op=dist.ReduceOp.SUM, group=group)
    return y


class ColwiseQLinear(QLinear, _Parallel):
    """A QLinear holding rows ``[start, stop)`` of the full weight (out_features split).

    ``forward`` takes the whole input and returns this rank's slice of the output (style
    ``"colwise"``), or, with ``gather_output`` (style ``"colwise_rep"``), all ranks' slices
    gathered along the last axis: the full output on every rank.
    """

    def __init__(self, weight: TorchQTensor, bias: torch.Tensor | None, *, rank: int, world: int, group: Any = None,
                 gather_output: bool = False, **kw: Any):
        super().__init__(weight, bias, **kw)
        self.tp_rank, self.tp_world, self.tp_group = rank, world, group
        self.tp_style = "colwise_rep" if gather_output else "colwise"
        self.gather_output = gather_output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return _gathered(y, self.tp_world, self.tp_group) if self.gather_output else y

    def extra_repr(self) -> str:
        return super().extra_repr() + f", tp={self.tp_style} {self.tp_rank}/{self.tp_world}"


class RowwiseQLinear(QLinear, _Parallel):
    """A QLinear holding columns ``[start, stop)`` of the full weight (in_features split).

    ``forward`` takes this rank's slice of the input (``in_features`` of it), computes the
    partial product, sums the partial products of all ranks with ``all_reduce`` (SUM) over the
    group, then adds the bias (held whole by every rank) once.  Inference only: the in-place
    collective records no gradient.
    """

    def __init__(self, weight: TorchQTensor, bias: torch.Tensor | None, *, rank: int, world: int, group: Any = None, **kw: Any):
        super().__init__(weight, bias, **kw)
        self.tp_rank, self.tp_world, self.tp_group, self.tp_style = rank, world, group, "rowwise"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_world == 1:
            # nothing to sum: the bias goes where QLinear puts it (fused into the float32 decode
            # path's F.linear, whose BLAS rounds a fused bias differently from a later add on
            # some CPUs), so one rank is load_model's layer bit for bit
            return self._forward(x, self.bias)
        y = _summed(self._forward(x, None), self.tp_world, self.tp_group)
        b = self.bias
        return y if b is None else y + b.to(y.dtype)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", tp=rowwise {self.tp_rank}/{self.tp_world}"


class _PlainColwise(nn.Linear, _Parallel):
    """An unquantized Linear split by rows (a plan entry whose checkpoint weight is plain)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        return _gathered(y, self.tp_world, self.tp_group) if self.tp_style == "colwise_rep" else y


class _PlainRowwise(nn.Linear, _Parallel):
    """An unquantized Linear split by columns: partial product, all_reduce (SUM), then the bias."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _summed(F.linear(x, self.weight), self.tp_world, self.tp_group)
        return y if self.bias is None else y + self.bias


@dataclass
class TPStats:
    """What one rank's :func:`load_tensor_parallel` read and how long it took.

    ``reads``: every byte range copied out of the checkpoint, as ``(file, Read)`` with file
    offsets (header included) of that shard file.  ``packed_bytes``: the weights of the Linear
    layers the load built (this rank's slice of each split weight, packed or plain, and whole
    packed Linears outside the plan); ``plain_bytes``: everything else (biases, split or whole,
    and the replicated tensors); ``bytes_read`` is their sum.  ``split``: per split weight, its
    style, the split axis and this rank's bounds on it."""

    rank: int = 0
    world: int = 1
    reads: list[tuple[str, Read]] = field(default_factory=list)  # (shard file, Read)
    packed_bytes: int = 0
    plain_bytes: int = 0
    seconds: float = 0.0
    split: dict[str, tuple[str, int, tuple[int, int]]] = field(default_factory=dict)  # tensor -> (style, dim, this rank's bounds)

    @property
    def bytes_read(self) -> int:
        return self.packed_bytes + self.plain_bytes


@dataclass
class _Split:
    module: str
    key: str  # the checkpoint tensor of its weight
    style: str
    dim: int  # axis of the weight that is split: 0 (out_features) or 1 (in_features)
    bounds: tuple[int, int]
    quantized: bool


def _pattern(p: str) -> re.Pattern[str]:
    # transformers' plan keys name modules relative to the base model ("layers.*.mlp.up_proj", "*"
    # one name part); match them as a dotted suffix of the full module name too ("model.layers.0...")
    body = r"[^.]+".join(re.escape(x) for x in p.split("*"))
    return re.compile(r"(?:.*\.)?" + body)


def _style_of(name: str, plan: list[tuple[re.Pattern[str], str, str]]) -> str | None:
    for rx, style, _ in plan:
        if rx.fullmatch(name):
            return style
    return None


def _default_plan(model: nn.Module) -> Mapping[str, str]:
    cfg = getattr(model, "config", None)
    plan = getattr(cfg, "base_model_tp_plan", None) if cfg is not None else None
    if not plan:
        raise ValueError("no plan given and the model has no config.base_model_tp_plan: pass plan= "
                         "(module name pattern -> 'colwise' | 'colwise_rep' | 'rowwise' | 'replicate'), e.g. llama_tp_plan()")
    return plan


def _home(f: Any, key: str) -> Any:
    """The core SafeOpen of the file that holds ``key`` (the file itself, or its shard)."""
    return f.shard_of(key) if hasattr(f, "shard_of") else f


def load_tensor_parallel(model: nn.Module, path: str | os.PathLike[str], plan: Mapping[str, str] | None = None, *,
                         group: Any = None, rank: int | None = None, world: int | None = None, device: Any = "cpu",
                         kernel: str | None = None, strict: bool = True, read_log: list | None = None) -> nn.Module:
    """Load this rank's tensor-parallel part of a qformat checkpoint into ``model``.

    ``path``: a local qformat file or a sharded checkpoint's ``*.safetensors.index.json`` (a URL
    is ``FILE_UNREADABLE``: the split reads a memory map).  ``plan``
    maps module-name patterns (``*`` stands for one name part; a pattern matches a module name or
    a dotted suffix of it, so transformers' ``"layers.*.mlp.up_proj"`` matches
    ``"model.layers.0.mlp.up_proj"``) to a style of :data:`STYLES`; default: the model's
    ``config.base_model_tp_plan``.  ``group``: the process group (default: the world); its rank
    and size decide the split, or ``rank``/``world`` given explicitly (no process group needed to
    load; the forward of a split model needs one).

    Each planned module whose checkpoint weight is quantized becomes a :class:`ColwiseQLinear` or
    :class:`RowwiseQLinear` holding only this rank's block-aligned part of the packed
    components, read from the file and nothing else; a plain weight becomes the same split of a
    plain Linear.  Colwise biases are split too.  Every other tensor is loaded whole (replicated),
    a quantized non-Linear tensor decoded as :func:`qformat_torch.load_model` does.  ``device``:
    where the rank's tensors go; ``kernel``: the QLinears' kernel policy.

    ``model`` may live on the meta device (nothing allocated before the load): every tensor the
    checkpoint fills is then assigned (not copied), ``tie_weights()`` re-ties a tied head, and
    what no checkpoint holds (non-persistent buffers such as rotary tables) stays the caller's.

    Refused before any packed byte is read (the model untouched): a split that is not
    block-aligned on any rank (``SLICE_INVALID`` naming tensor, axis and alignment), a dimension
    the world does not divide or an attention projection split inside a head (``SLICE_INVALID``),
    a plan style outside :data:`STYLES` (``ValueError``), and with ``strict`` checkpoint tensors
    the model has no place for or model entries the checkpoint does not fill
    (``LOAD_MISMATCH``).

    ``read_log``: a list that receives one :class:`TPStats` for this load (its ``reads`` are the
    byte ranges read).  Returns the model (a bare planned Linear comes back replaced).
    """
    t0 = time.perf_counter()
    if rank is None or world is None:
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("torch.distributed is not initialized: call init_process_group first, or pass rank= and world=")
        rank = dist.get_rank(group) if rank is None else rank
        world = dist.get_world_size(group) if world is None else world
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"expected 0 <= rank < world, found rank {rank}, world {world}")
    plan = dict(_default_plan(model) if plan is None else plan)
    bad = {k: v for k, v in plan.items() if v not in STYLES}
    if bad:
        raise ValueError(f"unknown plan styles {bad}: this loader knows {STYLES}")
    rules = [(_pattern(k), v, k) for k, v in plan.items()]
    dev = torch.device(device)
    stats = TPStats(rank=rank, world=world)
    path = os.fspath(path)
    if is_url(path):  # the slicing below reads a memory map; http(s) ranges are not wired in yet
        raise error("FILE_UNREADABLE", f"load_tensor_parallel reads local checkpoints; {shown(path)} is a URL: download it first")

    with qformat.safe_open(path) as f:
        if hasattr(f, "model"):
            for probs in f.model.tensor_problems.values():
                raise_first(probs)
        else:
            for sh in f.shards.values():
                for probs in sh.model.tensor_problems.values():
                    raise_first(probs)
        splits, plain_keys = _plan(model, f, rules, rank, world, strict)
        # -- reads: nothing of the model has changed yet ----------------------------------------
        new_weights: dict[str, Any] = {}
        biases: dict[str, torch.Tensor | None] = {}
        for s in splits:
            h = _home(f, s.key)
            rec = RecordingSource(h.source)
            if s.quantized:
                desc = h.validated_descriptor(s.key)
                region = tuple(s.bounds if a == s.dim else (0, n) for a, n in enumerate(desc.shape))
                sub, comps = slice_qtensor(desc, rec, region)
                qt = TorchQTensor(sub, {c: numpy_to_torch(a, dev) for c, a in comps.items()})
                new_weights[s.module] = local_component_names(qt, s.key)
            else:
                new_weights[s.module] = _read_plain(h, rec, s.key, _box(h.shape(s.key), s.dim, s.bounds), dev)
            stats.packed_bytes += sum(r.length for r in rec.reads)
            bkey = f"{s.module}.bias" if s.module else "bias"
            if bkey in plain_keys:
                plain_keys.remove(bkey)
                hb = _home(f, bkey)
                brec = RecordingSource(hb.source)
                box = (s.bounds,) if s.dim == 0 else None  # colwise: this rank's outputs; rowwise: whole
                biases[s.module] = _read_plain(hb, brec, bkey, box, dev)
                stats.plain_bytes += sum(r.length for r in brec.reads)
                stats.reads.extend((hb.path, r) for r in brec.reads)  # a bias may sit in another shard
            else:
                biases[s.module] = None
            stats.reads.extend((h.path, r) for r in rec.reads)
            if s.style != "replicate":
                stats.split[s.key] = (s.style, s.dim, s.bounds)
        plain: dict[str, torch.Tensor] = {}
        for key in plain_keys:
            h = _home(f, key)
            if h.is_quantized(key):  # a quantized non-Linear tensor (an embedding): decoded whole
                from .io import SafeOpen as TorchSafeOpen

                with TorchSafeOpen(h.path, dev) as tf:
                    plain[key] = tf.get_tensor(key)
                nb = sum(h.header.entries[c].end - h.header.entries[c].begin for _, c in h.validated_descriptor(key).references())
                stats.plain_bytes += nb
                stats.reads.extend((h.path, Read(c, h.header.data_start + h.header.entries[c].begin,
                                                 h.header.entries[c].end - h.header.entries[c].begin))
                                   for _, c in h.validated_descriptor(key).references())
                continue
            rec = RecordingSource(h.source)
            plain[key] = _read_plain(h, rec, key, None, dev)
            stats.plain_bytes += sum(r.length for r in rec.reads)
            stats.reads.extend((h.path, r) for r in rec.reads)

    # -- the model changes only from here on ----------------------------------------------------
    # Replicated entries first: a QLinear re-selects (repacks) its kernel after every
    # load_state_dict of a tree that holds it, so loading after the swap would repack twice.
    # A model built on the meta device (to allocate nothing before the load) takes the loaded
    # tensors as they are; ties (a head sharing the embedding) are re-made by the model itself.
    current = model.state_dict(keep_vars=True)
    on_meta = any(current[k].is_meta for k in plain if k in current)
    model.load_state_dict(plain, strict=False, assign=on_meta)
    if on_meta and hasattr(model, "tie_weights"):
        model.tie_weights()
    root = model
    for s in splits:
        w, b = new_weights[s.module], biases[s.module]
        old = _get_submodule(model, s.module)
        if b is not None and getattr(old, "bias", None) is not None:
            b = b.to(old.bias.dtype)  # as load_state_dict would have stored it (a bfloat16 model's bias)
        if not s.quantized and isinstance(old, nn.Linear):
            w = w.to(old.weight.dtype)
        if s.style == "replicate":
            new: nn.Module = QLinear(w, b, kernel=kernel)
        elif s.quantized:
            if s.style == "rowwise":
                new = RowwiseQLinear(w, b, rank=rank, world=world, group=group, kernel=kernel)
            else:
                new = ColwiseQLinear(w, b, rank=rank, world=world, group=group, gather_output=s.style == "colwise_rep",
                                     kernel=kernel)
        else:
            cls = _PlainRowwise if s.style == "rowwise" else _PlainColwise
            new = cls(w.shape[1], w.shape[0], bias=b is not None, device="meta")
            new.weight = nn.Parameter(w, requires_grad=False)
            if b is not None:
                new.bias = nn.Parameter(b, requires_grad=False)
            new.tp_rank, new.tp_world, new.tp_group, new.tp_style = rank, world, group, s.style
        if s.module:
            _set_module(root, s.module, new)
        else:
            root = new
    if not on_meta and not any(t.is_meta for t in root.state_dict().values()):
        root.to(dev)
    stats.seconds = time.perf_counter() - t0
    if read_log is not None:
        read_log.append(stats)
    return root


def _box(shape: tuple[int, ...], dim: int, bounds: tuple[int, int]) -> tuple[tuple[int, int], ...]:
    return tuple(bounds if a == dim else (0, n) for a, n in enumerate(shape))


def _read_plain(h: Any, rec: RecordingSource, key: str, box: Any, dev: torch.device) -> torch.Tensor:
    """A plain tensor (or the box of it) copied to ``dev``, its byte runs logged in ``rec``."""
    base = h.plain_array(key)
    view = base if box is None else base[tuple(slice(lo, hi) for lo, hi in box)]
    rec.take(key, base, view)
    return numpy_to_torch(view, dev, h.header.entries[key].dtype)


def _heads_of(model: nn.Module, module: str) -> int | None:
    """``head_dim`` of the attention module that owns ``module`` (its parent), if it has one."""
    parent = _get_submodule(model, module.rpartition(".")[0]) if "." in module else None
    hd = getattr(parent, "head_dim", None)
    return int(hd) if isinstance(hd, int) and hd > 0 else None


def _plan(model: nn.Module, f: Any, rules: list, rank: int, world: int, strict: bool) -> tuple[list[_Split], list[str]]:
    """Decide, from the headers alone, which tensor each rank reads how; refuse what cannot load."""
    keys = set(f.keys())
    entries = model.state_dict(keep_vars=True)
    splits: list[_Split] = []
    replaced: set[str] = set()
    shapes: list[str] = []
    for name, mod in model.named_modules():
        style = _style_of(name, rules)
        if style is None or style == "replicate":
            key = f"{name}.weight" if name else "weight"
            if isinstance(mod, (nn.Linear, QLinear)) and key in keys and _home(f, key).is_quantized(key):
                # a quantized Linear outside the plan stays packed, whole on every rank (as load_model loads it)
                shape = tuple(_home(f, key).shape(key))
                if shape != (mod.out_features, mod.in_features):
                    shapes.append(f"{key}: checkpoint {list(shape)}, module {[mod.out_features, mod.in_features]}")
                    continue
                splits.append(_Split(name, key, "replicate", 0, (0, shape[0]), True))
                replaced.add(name)
            continue
        if isinstance(mod, (ColwiseQLinear, RowwiseQLinear, _PlainColwise, _PlainRowwise)):
            raise ValueError(f"module {name!r} is already tensor-parallel; load into a fresh model")
        if not isinstance(mod, (nn.Linear, QLinear)):
            raise ValueError(f"plan entry {style!r} matches module {name!r}, a {type(mod).__name__}: only Linear and QLinear split")
        key = f"{name}.weight" if name else "weight"
        if key not in keys:
            raise error("LOAD_MISMATCH", f"the checkpoint has no {key!r} for the planned module {name!r} ({style})", tensor=key)
        h = _home(f, key)
        shape = tuple(h.shape(key))
        want = (mod.out_features, mod.in_features)
        if shape != want:
            shapes.append(f"{key}: checkpoint {list(shape)}, module {list(want)}")
            continue
        dim = 1 if style == "rowwise" else 0
        axis = "in_features" if dim else "out_features"
        n = shape[dim]
        if n % world:
            raise error("SLICE_INVALID", f"{axis} ({n}, axis {dim}) does not split into {world} equal parts "
                        f"for a {style} split", tensor=key)
        hd = _heads_of(model, name)
        if hd is not None and n % hd == 0 and (n // world) % hd:
            raise error("SLICE_INVALID", f"a {style} split of {axis} ({n} = {n // hd} heads of {hd}) over {world} "
                        f"ranks gives {n // world} features per rank, not whole heads: attention cannot run on part of "
                        f"a head (use a world size that divides {n // hd})", tensor=key)
        quantized = h.is_quantized(key)
        if quantized:
            desc = h.validated_descriptor(key)  # header only
            for r in range(world):  # every rank's bounds: all ranks refuse alike, none waits in a collective
                region = _box(shape, dim, tp_bounds(n, r, world))
                if not is_aligned(desc, region):
                    raise error("SLICE_INVALID", f"a {style} split over {world} ranks cuts axis {dim} ({axis}) "
                                f"inside a block: rank {r} would take {axis} {region[dim][0]}:{region[dim][1]}, and "
                                + describe_alignment(desc, region), tensor=key)
        splits.append(_Split(name, key, style, dim, tp_bounds(n, rank, world), quantized))
        replaced.add(name)
        bkey = f"{name}.bias" if name else "bias"
        if bkey in keys and dim == 0 and tuple(_home(f, bkey).shape(bkey)) != (n,):
            shapes.append(f"{bkey}: checkpoint {list(_home(f, bkey).shape(bkey))}, module [{n}]")
    if shapes:
        raise error("LOAD_MISMATCH", f"{len(shapes)} planned weights differ in shape from the model: " + "; ".join(shapes[:4]))
    # every other entry loads whole; a replaced module's own entries other than its bias are refilled
    covered = {e for m in replaced for e in entries if e.startswith(f"{m}." if m else "") and e != (f"{m}.bias" if m else "bias")}
    split_keys = {s.key for s in splits}
    plain_keys, unused, wrong = [], [], []
    for key in sorted(keys - split_keys):
        if key in entries:
            want = tuple(entries[key].shape)
            got = tuple(_home(f, key).shape(key))
            if got != want:
                wrong.append(f"{key}: checkpoint {list(got)}, model {list(want)}")
            plain_keys.append(key)
        else:
            unused.append(key)
    if wrong:
        raise error("LOAD_MISMATCH", f"{len(wrong)} tensors differ in shape from the model: " + "; ".join(wrong[:4]))
    loaded = set(plain_keys)
    filled = {id(entries[k]) for k in loaded}  # tied entries share one tensor
    missing = [k for k in entries if k not in covered and k not in loaded and id(entries[k]) not in filled]
    if strict and (unused or missing):
        raise error("LOAD_MISMATCH", f"the checkpoint does not fit {type(model).__name__}: {len(unused)} checkpoint tensors "
                    f"without a place {unused[:4]}, {len(missing)} model entries not filled {missing[:4]} "
                    "(strict=False loads what matches)")
    if not strict:
        plain_keys = [k for k in plain_keys if k in entries]
    return splits, plain_keys
