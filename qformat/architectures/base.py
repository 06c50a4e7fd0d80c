"""One model architecture as llama.cpp and transformers both know it: the entry of the table.

An :class:`Architecture` says everything that differs between a Hugging Face checkpoint of the
architecture and llama.cpp's GGUF of it (convert_hf_to_gguf.py, the ``conversion/`` module of
the family):

- ``tensors``: Hugging Face tensor names (regular expressions) -> llama.cpp's names (the
  replacement, gguf-py ``tensor_mapping.py``'s ``MODEL_TENSOR`` names), and ``skipped``: tensors
  llama.cpp does not take (``rotary_emb.inv_freq``);
- ``rotary``: the q/k projections whose rows llama.cpp stores in its interleaved rotary order
  (``LlamaModel.permute``), each with the config key of its head count;
- ``norm_shift``: the tensors llama.cpp stores as the Hugging Face value plus a constant
  (Gemma's ``Gemma3RMSNorm`` multiplies by ``1 + w``: GGUF holds ``w + 1``, transformers ``w``);
- ``head_split``: fused q/k/v projections whose rows are per head in the Hugging Face checkpoint
  and per part (all q, all k, all v) in llama.cpp's (Bloom), a move of whole rows;
- ``transposed``: the 2-D tensors llama.cpp stores as the transpose of the Hugging Face one (GPT-2's
  ``Conv1D`` weights are ``[in, out]``; its converter writes ``[out, in]``, blocks along ``in``):
  a quantized one keeps its packed bytes and is described with a transposed storage order
  (:func:`transposed_descriptor`), a plain one is transposed as it is copied;
- ``hparams``: the ``{arch}.*`` keys its converter writes beyond the ones every text model gets
  (:func:`qformat.export.gguf` writes those), from config.json;
- ``tied``: ``"optional"`` (``output.weight`` when the checkpoint has an ``lm_head``) or
  ``"always"`` (llama.cpp's loader takes the embedding as the output; Gemma);
- ``hf_export``: whether a Hugging Face checkpoint of it (not converted from a GGUF) exports, or
  only a folder converted from a GGUF file, which records the keys llama.cpp reads;
- ``tokenizer_model``: the ``tokenizer.ggml.model`` its converter writes (``gpt2``: byte-level
  BPE; ``llama``: SentencePiece).

Both directions read the same entry: ``qformat convert model.gguf out/`` checks that
transformers' GGUF loader renames, reorders and shifts each tensor as the entry says, and
``qformat export --to gguf`` applies the entry the other way.  Nothing here imports torch or
transformers; gguf-py is imported only by the functions that name keys.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

#: A hyperparameter key: (key template with ``{arch}``, gguf-py value type, value from config.json
#: or None to leave the key out).
HParam = tuple[str, str, Callable[[dict[str, Any]], Any]]


def head_split_permutation(rows: int, n_head: int, parts: int = 3) -> np.ndarray:
    """llama.cpp's row order of a fused projection whose Hugging Face rows are per head, each
    head's ``parts`` slices (q, k, v) together (Bloom's ``query_key_value``): all heads' q rows,
    then all k rows, then all v rows (convert_hf_to_gguf.py ``BloomModel``).  Row i of the result
    is source row ``perm[i]``."""
    return np.arange(rows).reshape(n_head, parts, rows // n_head // parts).swapaxes(0, 1).reshape(-1)


def rotary_permutation(rows: int, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order (convert_hf_to_gguf.py ``LlamaModel.permute``): per head, the
    two halves of the head's rows interleaved.  Row i of the result is source row ``perm[i]``."""
    return np.arange(rows).reshape(n_head, 2, rows // n_head // 2).swapaxes(1, 2).reshape(-1)


@dataclass(frozen=True)
class Architecture:
    """One row of the table (see the module docstring)."""

    name: str  # general.architecture (gguf-py MODEL_ARCH_NAMES)
    model_arch: str  # the gguf-py MODEL_ARCH member (its tensor name map)
    model_types: tuple[str, ...]  # config.json model_type values of the architecture
    tensors: tuple[tuple[str, str], ...]
    skipped: tuple[str, ...] = ()
    rotary: tuple[tuple[str, str], ...] = ()  # (HF name pattern, config key of its head count)
    norm_shift: tuple[str, float] | None = None  # (HF name pattern, value added in GGUF)
    transposed: tuple[str, ...] = ()  # HF name patterns of 2-D tensors GGUF holds transposed
    #: fused q/k/v projections whose rows llama.cpp regroups from per-head to per-part order
    #: (:func:`head_split_permutation`), each with the config key of its head count.
    head_split: tuple[tuple[str, str], ...] = ()
    #: Whether ``qformat export --to gguf`` writes a GGUF from a Hugging Face checkpoint of it (one
    #: not converted from a GGUF): the common keys and ``hparams`` are all its converter writes.
    #: False: only a folder ``qformat convert model.gguf out/`` made, which records the GGUF's
    #: keys, exports (the table then names the tensors back).
    hf_export: bool = True
    tied: str = "optional"
    tokenizer_model: str = "gpt2"
    #: ``{arch}.*`` keys written after the common ones (in the converter's order).
    hparams: tuple[HParam, ...] = ()
    #: Whether the converter writes ``{arch}.rope.dimension_count`` (llama's TextModel does).
    rope_dimension_count: bool = True
    rope_types: tuple[str, ...] = ("default", "linear")  # config rope types the exporter writes
    #: transformers 5 keeps per-layer-type rope parameters for some models (Gemma 3:
    #: ``full_attention`` / ``sliding_attention``); the section whose values llama.cpp's keys take.
    rope_section: str | None = None
    notes: str = ""
    _compiled: list[tuple[re.Pattern[str], str]] = field(default_factory=list, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._compiled.extend((re.compile(p), r) for p, r in self.tensors)

    # -- names -------------------------------------------------------------------------------------
    def gguf_name(self, hf_name: str) -> str | None:
        """llama.cpp's name of the Hugging Face tensor ``hf_name``; None for a tensor llama.cpp
        does not take; KeyError when the table has no name for it."""
        if any(re.fullmatch(p, hf_name) for p in self.skipped):
            return None
        for pat, repl in self._compiled:
            if pat.fullmatch(hf_name):
                return pat.sub(repl, hf_name)
        raise KeyError(hf_name)

    # -- rows and values ---------------------------------------------------------------------------
    def heads_of(self, hf_name: str, config: dict[str, Any]) -> int | None:
        """The head count whose rotary order the rows of ``hf_name`` take in llama.cpp (None:
        the rows are stored as they are)."""
        for pat, key in self.rotary:
            if re.fullmatch(pat, hf_name):
                heads = config.get(key) or config.get("num_attention_heads")
                return int(heads) if heads else None
        return None

    def permutation(self, hf_name: str, rows: int, config: dict[str, Any]) -> np.ndarray | None:
        """GGUF row i is Hugging Face row ``perm[i]`` (None: no reordering)."""
        for pat, key in self.head_split:
            if re.fullmatch(pat, hf_name):
                n = config.get(key) or config.get("num_attention_heads")
                if not n or rows % (3 * int(n)):
                    raise ValueError(f"{rows} rows do not split into {n} heads of q, k and v")
                return head_split_permutation(rows, int(n))
        heads = self.heads_of(hf_name, config)
        if heads is None:
            return None
        if rows % (2 * heads):
            raise ValueError(f"{rows} rows do not split into {heads} heads of two halves")
        return rotary_permutation(rows, heads)

    def shift(self, hf_name: str) -> float:
        """What llama.cpp adds to the Hugging Face values of ``hf_name`` (0.0: nothing)."""
        if self.norm_shift is not None and re.fullmatch(self.norm_shift[0], hf_name):
            return self.norm_shift[1]
        return 0.0

    def rope(self, config: dict[str, Any]) -> dict[str, Any]:
        """The rope parameters of config.json llama.cpp's keys are written from."""
        rp = config.get("rope_parameters") or config.get("rope_scaling") or {}
        if not isinstance(rp, dict):
            return {}
        if self.rope_section is not None and isinstance(rp.get(self.rope_section), dict):
            return rp[self.rope_section]
        return rp

    def transposes(self, hf_name: str) -> bool:
        """Whether llama.cpp stores ``hf_name`` (2-D) as its transpose."""
        return any(re.fullmatch(p, hf_name) for p in self.transposed)

    def has_output(self) -> bool:
        return self.tied != "always"


def transposed_descriptor(raw: dict[str, Any]) -> dict[str, Any]:
    """The descriptor (JSON) of the transpose of the 2-D tensor ``raw`` describes, over the same
    components: nothing is re-encoded or moved.  The logical shape swaps; the codes' storage
    ``order`` composes with the swap (SPEC.md §7.3: the stored grid stays where it is, so ``axis``
    and the rows of packed blocks do not change); each parameter's block grid swaps, a stored
    parameter's ``order`` composes likewise (§9.2) and an encoded one's nested descriptor is
    transposed the same way (§9.3).  ValueError for what has no such description (another rank,
    a device layout, a block kind other than a grid)."""
    import copy

    if len(raw.get("shape", ())) != 2:
        raise ValueError(f"a tensor of rank {len(raw.get('shape', ()))}, not 2")
    layout = (raw.get("layout") or {}).get("name", "canonical")
    if layout != "canonical":
        raise ValueError(f"device layout {layout!r}")
    if raw.get("extensions"):
        raise ValueError("extensions, whose meaning may depend on the axes")
    out = copy.deepcopy(raw)
    out["shape"] = list(raw["shape"])[::-1]
    packing = out["codes"]["packing"]
    packing["order"] = [1 - a for a in packing.get("order", (0, 1))]
    for role in ("scale", "bias", "zero"):
        p = out.get(role)
        if p is None:
            continue
        blocks = p.get("blocks", {})
        if blocks.get("type") != "grid" or len(blocks.get("size", ())) != 2:
            raise ValueError(f"the {role}'s blocks are not a 2-D grid")
        blocks["size"] = list(blocks["size"])[::-1]
        if p.get("encoded") is not None:
            p["encoded"] = transposed_descriptor(p["encoded"])
        else:
            p["order"] = [1 - a for a in p.get("order", (0, 1))]
    return out
