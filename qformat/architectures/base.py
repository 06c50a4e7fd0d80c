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
- ``hparams``: the ``{arch}.*`` keys its converter writes beyond the ones every text model gets
  (:func:`qformat.export.gguf` writes those), from config.json;
- ``tied``: ``"optional"`` (``output.weight`` when the checkpoint has an ``lm_head``) or
  ``"always"`` (llama.cpp's loader takes the embedding as the output; Gemma);
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

    def has_output(self) -> bool:
        return self.tied != "always"
