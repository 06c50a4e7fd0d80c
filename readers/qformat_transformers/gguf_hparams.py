"""The GGUF values a transformers config and tokenizer are built from, checked before they are built.

transformers' GGUF loader copies the values of the keys its ``GGUF_CONFIG_MAPPING`` names for an
architecture (and the tokenizer's special token ids) into a config as it finds them, and builds
the model those values describe.  A value of another type, zero, negative, huge or inconsistent
with the rest ends in a transformers or torch exception (``ZeroDivisionError`` for a
``head_count_kv`` of 0, an embedding's padding-index assertion, a tensor of negative size, a
config validation error) or, with a large ``block_count``, in a model of that many layers.
:func:`check` refuses every such value first: ``CONVERT_SOURCE_INVALID`` naming the key, what
was expected and what was found (``CONVERT_UNSUPPORTED`` for a per-layer array where
transformers' config takes one number).

A key the config cannot do without (:data:`REQUIRED`) must be there.  What each key must hold is one table, :data:`RULES`, by the key after the architecture prefix
(``block_count`` for ``llama.block_count``) or by its full name (the tokenizer's keys): the same
rule for every architecture, applied to the keys that architecture's mapping reads.  The
relations between keys and with the tensors are the second table, :data:`RELATIONS`.  Sizes are
bounded by the file itself: a dimension by the largest tensor dimension in the file, the block
count by the blocks its tensors name, so nothing built from them outgrows the input.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from qformat.errors import error

INTS = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64")
FLOATS = ("float32", "float64")
#: Keys a config cannot be built without (when the architecture's mapping reads them), besides
#: one giving transformers' ``head_dim``: without them transformers would take its class default
#: (another model's size) silently.
REQUIRED = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count", "attention.layer_norm_rms_epsilon")
#: The largest context length or sliding window taken: what fits an int32 (llama.cpp's n_ctx).
MAX_POSITIONS = 2**31 - 1
#: Tensor names of a block: ``blk.<index>.<rest>``.
BLOCK = re.compile(r"blk\.(\d+)\.")


# -- what one value must be ------------------------------------------------------------------------
@dataclass(frozen=True)
class Int:
    """An integer from ``low`` to ``high`` (``"dim"``: the largest tensor dimension of the file;
    ``"vocab"``: below the vocabulary size, a token id; ``"blocks"``: see :data:`RELATIONS`).
    ``per_layer``: llama.cpp also takes an array of one value per block here (a model whose
    layers differ), which transformers' config cannot hold.  ``even``: a rotary dimension."""

    low: int = 1
    high: int | str = "dim"
    per_layer: bool = False
    even: bool = False  # rotary dimensions turn in pairs


@dataclass(frozen=True)
class Float:
    """A finite float above 0 (an epsilon, a rotary base)."""


@dataclass(frozen=True)
class Text:
    """A string."""


@dataclass(frozen=True)
class Flag:
    """A bool."""


@dataclass(frozen=True)
class List:
    """An array of ``element`` (``"string"``, ``"int"``, ``"float"``), of the vocabulary's length
    when ``per_token``, not empty when ``nonempty``."""

    element: str
    per_token: bool = False
    nonempty: bool = False


Rule = Int | Float | Text | Flag | List

#: What each key must hold.  Hyperparameters by the key after ``<arch>.`` (the keys
#: transformers' GGUF_CONFIG_MAPPING reads, for every architecture it supports); the rest by name.
RULES: dict[str, Rule] = {
    "block_count": Int(1, "blocks"),
    "context_length": Int(1, MAX_POSITIONS),
    "embedding_length": Int(),
    "feed_forward_length": Int(per_layer=True),
    "attention.head_count": Int(per_layer=True),
    "attention.head_count_kv": Int(per_layer=True),
    "attention.key_length": Int(even=True),
    "attention.value_length": Int(),
    "rope.dimension_count": Int(even=True),
    "attention.sliding_window": Int(1, MAX_POSITIONS),
    "attention.relative_buckets_count": Int(),
    "vocab_size": Int(),
    "expert_count": Int(),
    "expert_used_count": Int(),
    "expert_feed_forward_length": Int(),
    "expert_gating_func": Int(0, 2),
    "decoder_start_token_id": Int(0, "vocab"),
    "rope.freq_base": Float(),
    "attention.layer_norm_rms_epsilon": Float(),
    "attention.layer_norm_epsilon": Float(),
    "general.name": Text(),
    "tokenizer.ggml.model": Text(),
    "tokenizer.ggml.pre": Text(),
    "tokenizer.chat_template": Text(),
    "tokenizer.ggml.tokens": List("string", per_token=True, nonempty=True),
    "tokenizer.ggml.scores": List("float", per_token=True),
    "tokenizer.ggml.token_type": List("int", per_token=True),
    "tokenizer.ggml.merges": List("string"),
    "tokenizer.ggml.precompiled_charsmap": List("int"),
    "tokenizer.ggml.bos_token_id": Int(0, "vocab"),
    "tokenizer.ggml.eos_token_id": Int(0, "vocab"),
    "tokenizer.ggml.unknown_token_id": Int(0, "vocab"),
    "tokenizer.ggml.padding_token_id": Int(0, "vocab"),
    "tokenizer.ggml.add_bos_token": Flag(),
    "tokenizer.ggml.add_eos_token": Flag(),
    "tokenizer.ggml.add_space_prefix": Flag(),
}


@dataclass
class Source:
    """What the checks read: the architecture, the key/values (key -> (type, value, element
    type)), the tensors' shapes (NumPy order), and the keys transformers' mapping reads for the
    architecture (suffix -> config attribute).  :meth:`get` gives only values their rule passed."""

    arch: str
    kv: dict[str, tuple[str, Any, str | None]]
    shapes: dict[str, tuple[int, ...]]
    mapping: dict[str, str | None]
    checked: set[str] = field(default_factory=set)

    def key(self, suffix: str) -> str:
        return suffix if suffix in _GLOBAL else f"{self.arch}.{suffix}"

    def get(self, suffix: str) -> Any:
        """The value of ``suffix``'s key once its rule passed it (None before, or without one)."""
        key = self.key(suffix)
        return self.kv[key][1] if key in self.checked else None

    @property
    def largest_dim(self) -> int:
        return max((d for s in self.shapes.values() for d in s), default=0)

    @property
    def blocks(self) -> set[int]:
        return {int(m.group(1)) for n in self.shapes if (m := BLOCK.match(n))}

    @property
    def vocab(self) -> tuple[int, str] | None:
        """The vocabulary size and where it comes from: the token embedding's rows, else the
        token list's length (None without either)."""
        emb = self.shapes.get("token_embd.weight")
        if emb is not None and len(emb) == 2:
            return emb[0], "the rows of token_embd.weight"
        tokens = self.get("tokenizer.ggml.tokens")
        return (len(tokens), "the length of tokenizer.ggml.tokens") if isinstance(tokens, list) else None

    @property
    def n_vocab(self) -> int | None:
        v = self.vocab
        return None if v is None else v[0]


_GLOBAL = {k for k in RULES if k.startswith(("general.", "tokenizer."))}


def _invalid(key: str, expected: str, found: Any) -> Exception:
    return error("CONVERT_SOURCE_INVALID", f"{key} is {found}, expected {expected}", field=key)


def _found(t: str, v: Any, et: str | None) -> str:
    if t == "array":
        return f"an array of {len(v)} {et} values"
    if t == "string":
        return f"the string {v[:40]!r}" + ("..." if len(v) > 40 else "")
    return f"{v!r} ({t})"


def _check_value(src: Source, key: str, rule: Rule, t: str, v: Any, et: str | None) -> None:
    if isinstance(rule, Int):
        blocks = src.kv.get(src.key("block_count"))
        layers = blocks[1] if blocks is not None else None
        if rule.per_layer and t == "array" and et in INTS and len(v) == layers:
            raise error("CONVERT_UNSUPPORTED", f"{key} is {_found(t, v, et)}, one per layer; transformers' config takes one "
                        "integer for every layer", field=key)
        high: int | None
        if rule.high == "dim":
            high, why = src.largest_dim, "the largest tensor dimension in the file"
        elif rule.high == "vocab":
            n = src.n_vocab
            high, why = (None, "") if n is None else (n - 1, f"below the vocabulary size {n}")
        elif rule.high == "blocks":
            high, why = None, ""  # the relation with the tensors' blocks says more (RELATIONS)
        else:
            high, why = int(rule.high), ""
        bounds = f"from {rule.low}" + ("" if high is None else f" to {high}") + (f" ({why})" if why else "")
        if t not in INTS:
            raise _invalid(key, f"an integer {bounds}", _found(t, v, et))
        if v < rule.low or (high is not None and v > high) or (rule.even and v % 2):
            raise _invalid(key, f"{'an even' if rule.even else 'an'} integer {bounds}", v)
    elif isinstance(rule, Float):
        if t not in FLOATS:
            raise _invalid(key, "a float (a finite number above 0)", _found(t, v, et))
        f = float(v)  # the JSON form holds non-finite values as "nan" / "inf" / "-inf"
        if not (math.isfinite(f) and f > 0):
            raise _invalid(key, "a finite number above 0", f)
    elif isinstance(rule, Text):
        if t != "string":
            raise _invalid(key, "a string", _found(t, v, et))
    elif isinstance(rule, Flag):
        if t != "bool":
            raise _invalid(key, "a bool", _found(t, v, et))
    else:
        want = {"string": ("string",), "int": INTS, "float": FLOATS}[rule.element]
        if t != "array" or et not in want:
            raise _invalid(key, f"an array of {rule.element} values", _found(t, v, et))
        if rule.nonempty and not v:
            raise _invalid(key, f"a non-empty array of {rule.element} values", "empty")
        vocab = src.vocab
        if rule.per_token and vocab is not None and len(v) != vocab[0]:
            raise _invalid(key, f"one value per token ({vocab[0]}, {vocab[1]})", f"an array of {len(v)}")


# -- relations between values and with the tensors --------------------------------------------------
def _blocks(src: Source) -> None:
    n = src.get("block_count")
    if n is None:
        return
    have = sorted(src.blocks)
    # distinct indices from 0 to n-1, n of them: exactly blocks 0 to n-1 (no range(n) is made)
    if len(have) == n and (not have or (have[0] == 0 and have[-1] == n - 1)):
        return
    gap = next((i for i, b in enumerate(have) if b != i), None)
    found = (f"tensors of {len(have)} blocks, blk.{have[0]} to blk.{have[-1]}" + (f" (blk.{gap} has none)" if gap is not None else "")
             if have else "no blk.N tensors")
    raise error("CONVERT_SOURCE_INVALID", f"{src.key('block_count')} is {n}, expected the number of blocks the tensors hold "
                f"(blk.0 to blk.N-1, each with tensors); found {found}", field=src.key("block_count"))


def _vocabulary(src: Source) -> None:
    size, vocab = src.get("vocab_size"), src.vocab
    n = None if vocab is None else vocab[0]
    if size is not None and vocab is not None and size != vocab[0]:
        raise error("CONVERT_SOURCE_INVALID", f"{src.key('vocab_size')} is {size}, expected the vocabulary size {vocab[0]} "
                    f"({vocab[1]})", field=src.key("vocab_size"))
    out = src.shapes.get("output.weight")
    if out is not None and n is not None and (len(out) != 2 or out[0] != n):
        raise error("CONVERT_SOURCE_INVALID", f"output.weight has shape {list(out)}, expected {n} rows (the vocabulary size)",
                    tensor="output.weight")


def _embedding(src: Source) -> None:
    emb = src.shapes.get("token_embd.weight")
    n = src.get("embedding_length")
    if emb is not None and n is not None and (len(emb) != 2 or emb[1] != n):
        raise error("CONVERT_SOURCE_INVALID", f"{src.key('embedding_length')} is {n}, expected the width of token_embd.weight "
                    f"(shape {list(emb)})", field=src.key("embedding_length"))


def _heads(src: Source) -> None:
    heads, kv, n = src.get("attention.head_count"), src.get("attention.head_count_kv"), src.get("embedding_length")
    # transformers' Llama and Gemma configs require it even where a key gives the head size; the
    # others make a head embedding_length / head_count wide without one (every released model of
    # these architectures has whole heads)
    if heads is not None and n is not None and n % heads:
        raise error("CONVERT_SOURCE_INVALID", f"{src.key('attention.head_count')} is {heads}, expected a divisor of "
                    f"{src.key('embedding_length')} ({n}): the attention heads split the embedding evenly",
                    field=src.key("attention.head_count"))
    if heads is not None and kv is not None and heads % kv:
        raise error("CONVERT_SOURCE_INVALID", f"{src.key('attention.head_count_kv')} is {kv}, expected a divisor of "
                    f"{src.key('attention.head_count')} ({heads}): each key/value head serves a whole group of query heads",
                    field=src.key("attention.head_count_kv"))


#: The relations, in order: each refuses with the key it blames.
RELATIONS: tuple[Callable[[Source], None], ...] = (_blocks, _vocabulary, _embedding, _heads)


# -- the check ----------------------------------------------------------------------------------------
def read_kv(described: Any) -> dict[str, tuple[str, Any, str | None]]:
    """Every key/value of a GGUF as the ``gguf`` converter recorded it (``__metadata__["gguf"]``,
    large values from their own members): key -> (type, value, element type)."""
    from qformat.convert.gguf import METADATA_KEY

    out: dict[str, tuple[str, Any, str | None]] = {}
    for key, v in json.loads(described.metadata[METADATA_KEY]).get("kv", {}).items():
        if "metadata" in v:  # a large value in its own member
            v = json.loads(described.metadata[v["metadata"]])
        out[key] = (v["type"], v["value"], v.get("element_type"))
    return out


def check(arch: str, kv: dict[str, tuple[str, Any, str | None]], shapes: dict[str, tuple[int, ...]]) -> None:
    """Refuse the GGUF (architecture ``arch``, key/values ``kv`` from :func:`read_kv`, tensor
    ``shapes``) if a value transformers will read breaks a rule of :data:`RULES` or
    :data:`RELATIONS` (see the module docstring)."""
    from transformers.integrations import GGUF_CONFIG_MAPPING

    mapping = dict(GGUF_CONFIG_MAPPING.get(arch) or {})
    src = Source(arch, kv, shapes, mapping)
    missing = [src.key(k) for k, attr in mapping.items() if (k in REQUIRED or attr == "head_dim") and src.key(k) not in kv]
    if missing:
        raise error("CONVERT_SOURCE_INVALID", f"the GGUF has no {', '.join(missing)}: the model's config cannot be built "
                    "without it (transformers would take a class default silently)", field=missing[0])
    read = [k for k, attr in mapping.items() if attr is not None] + sorted(_GLOBAL)
    # the token list first: without a token embedding, the per-token rules and the token ids are
    # measured against it
    for suffix in sorted(read, key=lambda k: k != "tokenizer.ggml.tokens"):
        key = src.key(suffix)
        if key not in kv:
            continue
        rule = RULES.get(suffix)
        if rule is None:  # a key transformers reads that no rule covers: tests/test_gguf_hostile.py keeps the table complete
            raise error("CONVERT_UNSUPPORTED", f"{key} is read by transformers' GGUF loader, and qformat has no rule for its values",
                        field=key)
        _check_value(src, key, rule, *kv[key])
        src.checked.add(key)
    for relation in RELATIONS:
        relation(src)
