"""Strict loading: a checkpoint's tensor names against the model's, as transformers maps them.

transformers' loader (``transformers.core_model_loading.convert_and_load_state_dict_in_model``)
renames every stored tensor with the weight conversion mapping (all renamings, then at most one
converter: :func:`transformers.core_model_loading.rename_source_key`), adds or strips the base
model prefix where only the other spelling is in the model, and keeps what is left over for its
loading report: checkpoint tensors with no place (UNEXPECTED), model entries nothing filled
(MISSING, randomly initialised), shapes that differ (MISMATCH).  Then it ties weights (a tied
entry is filled when any member of its group is) and drops the names the model's
``_keys_to_ignore_on_load_missing`` / ``_keys_to_ignore_on_load_unexpected`` patterns match (and
the old ``rotary_emb.inv_freq`` and ``position_ids`` buffers).

:func:`predict` runs the same steps over the checkpoint's header names, with the conversion list
transformers is about to use, before anything is read: the model is still on the meta device.
Its :class:`KeyReport` holds transformers' view (the keys its report would list) and the user's
view (:class:`qformat_torch.mismatch.Mismatch`: a quantized tensor under its logical name).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from torch import nn
from transformers.core_model_loading import (WeightConverter, WeightRenaming, apply_renamings, dot_natural_key,
                                             rename_source_key)

from qformat_torch.mismatch import Mismatch


class NameMap:
    """transformers' renaming of checkpoint keys for one model and one conversion list.

    The transforms are copies: renaming marks a transform as used, which transformers records
    for ``save_pretrained``; only its own loading should do that.
    """

    def __init__(self, model: nn.Module, conversions: Iterable[Any]):
        conversions = copy.deepcopy(list(conversions))
        self.renamings = [c for c in conversions if isinstance(c, WeightRenaming)]
        self.converters = [c for c in conversions if isinstance(c, WeightConverter)]
        self.by_pattern = {p: c for c in self.converters for p in c.source_patterns}
        self.prefix = getattr(model, "base_model_prefix", "") or ""
        self.model = model

    def target(self, key: str, entries: Mapping[str, Any]) -> tuple[str, str | None]:
        """(the model entry ``key`` is loaded into, the matching converter's source pattern or
        None), exactly as the loader computes it for a model whose state_dict is ``entries``."""
        target, pattern = rename_source_key(key, self.renamings, self.converters, self.prefix, entries)
        if target not in entries and key in entries:
            # the loader's fallback: a key already right is only given the prefix treatment
            target, pattern = rename_source_key(key, [], [], self.prefix, entries)
        return target, pattern

    def renamed(self, key: str) -> str:
        """``key`` after the renamings alone (what converters and the prefix step then see)."""
        return apply_renamings(key, self.renamings)

    def converter_targets(self, target: str, pattern: str) -> list[str]:
        """The entries a converter matched by ``pattern`` produces, given its first one."""
        conv = self.by_pattern[pattern]
        return [target.replace(conv.target_patterns[0], t) for t in conv.target_patterns]


@dataclass
class KeyReport:
    """The outcome :func:`predict` foresees.

    * ``missing`` / ``unexpected``: the keys transformers' loading report will list;
    * ``mismatch``: the same in checkpoint names (a quantized tensor under its logical name, its
      components never listed), plus the shapes that differ.
    """

    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatch: Mismatch = field(default_factory=Mismatch)


def predict(model: nn.Module, stored: Mapping[str, tuple[int, ...]], conversions: Iterable[Any], *,
            logical_of: Mapping[str, str] | None = None, quantized_on_load: Iterable[str] = (),
            decoded: Mapping[str, tuple[int, ...]] | None = None) -> KeyReport:
    """What loading the stored tensors ``stored`` (name -> shape, every shard's) into ``model``
    with ``conversions`` (transformers' list, as ``update_weight_conversions`` receives it) will
    leave missing, unexpected or in the wrong shape.

    ``logical_of``: component name -> its logical tensor; ``quantized_on_load``: model entries
    encoded as they arrive (their shapes are checked when planned, and transformers skips them
    too); ``decoded``: source pattern of a decoding converter -> the logical shape it produces.
    """
    logical_of, decoded = logical_of or {}, decoded or {}
    names = NameMap(model, conversions)
    entries = model.state_dict()  # meta tensors: names and shapes only
    missing = set(entries)
    unexpected: dict[str, str] = {}  # transformers' key -> stored name
    shapes: dict[str, tuple[str, tuple[int, ...], tuple[int, ...]]] = {}  # checkpoint name -> (entry, have, want)
    quantized_on_load = set(quantized_on_load)
    for key in sorted(stored, key=dot_natural_key):
        target, pattern = names.target(key, entries)
        name = logical_of.get(key, key)
        if target in entries:
            if pattern is not None:
                missing.difference_update(names.converter_targets(target, pattern))
                have = decoded.get(pattern)
            else:
                missing.discard(target)
                have = None if target in quantized_on_load else tuple(stored[key])
            want = tuple(entries[target].shape)
            if have is not None and tuple(have) != want:
                shapes.setdefault(name, (target, tuple(have), want))
        elif pattern is not None:
            for t in names.converter_targets(target, pattern):
                unexpected.setdefault(t, key)
        else:
            unexpected.setdefault(target, key)
    missing = _filled_by_ties(model, missing)
    missing_ok, unexpected_ok = _ignored(model)
    report = KeyReport()
    report.missing = sorted((k for k in missing if not (missing_ok and missing_ok.search(k))), key=dot_natural_key)
    kept = {k: v for k, v in unexpected.items() if not (unexpected_ok and unexpected_ok.search(k))}
    report.unexpected = sorted(kept, key=dot_natural_key)
    unused = dict.fromkeys(logical_of.get(v, v) for v in sorted(kept.values(), key=dot_natural_key))
    report.mismatch = Mismatch(list(unused), list(report.missing),
                               [(c, t, a, b) for c, (t, a, b) in sorted(shapes.items(), key=lambda kv: dot_natural_key(kv[0]))])
    return report


def _filled_by_ties(model: nn.Module, missing: set[str]) -> set[str]:
    """``tie_weights(missing_keys=...)``: an entry tied to one the checkpoint fills is filled (any
    member of a tied group fills the others); a group none of whose members is filled stays missing."""
    groups: dict[str, set[str]] = {}
    for target, source in (getattr(model, "all_tied_weights_keys", None) or {}).items():
        groups.setdefault(source, {source}).add(target)
    out = set(missing)
    for group in groups.values():
        if not group <= missing:
            out -= group
    return out


def _ignored(model: nn.Module) -> tuple[re.Pattern[str] | None, re.Pattern[str] | None]:
    """The patterns ``_adjust_missing_and_unexpected_keys`` drops from the report: the model's
    ``_keys_to_ignore_on_load_missing`` / ``_keys_to_ignore_on_load_unexpected``, and checkpoint
    buffers that older versions stored (``rotary_emb.inv_freq``, ``position_ids``) where the model
    has them as buffers."""
    buffers = [n for n, _ in model.named_buffers()]
    unexpected = set(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ())
    if any(b.endswith("rotary_emb.inv_freq") for b in buffers):
        unexpected.add(r"rotary_emb\.inv_freq")
    if any(b.endswith("position_ids") for b in buffers):
        unexpected.add(r"(^|\.)position_ids$")
    missing = set(getattr(model, "_keys_to_ignore_on_load_missing", None) or ())

    def union(patterns: set[str]) -> re.Pattern[str] | None:
        return re.compile("|".join(f"({p})" for p in patterns)) if patterns else None

    return union(missing), union(unexpected)
