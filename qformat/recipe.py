"""Which tensors ``qformat quantize`` quantizes, and how: the default selection rule and recipes.

**Default selection rule** (:func:`default_selected`): a tensor is quantized when all hold:

1. its dtype is F16, BF16, F32 or F64 and it has exactly 2 axes and at least 4096 elements;
2. its name ends in ``.weight`` (or is ``weight``);
3. it is not an embedding: no dot-separated part of its name contains ``embed`` or ``embd``
   (any case) or is ``wte``, ``wpe`` or ``token_types``;
4. it is not the output head: the part before ``.weight`` is not ``lm_head``, ``embed_out``,
   ``output``, ``head``, ``classifier`` or ``cls``, and its shape is not the shape of an embedding of
   the same checkpoint (a tied head stored as its own tensor is ``[vocab, hidden]`` like the embedding);
5. it is not a norm: no part of its name contains ``norm`` (any case) or is ``ln_f`` or ``ln_<digits>``.

The rule knows both name families: Hugging Face's (``model.embed_tokens``, ``transformer.wte``,
``lm_head``, ``model.norm``, ...) and llama.cpp's GGUF names (gguf-py's ``MODEL_TENSOR`` names:
``token_embd``, ``position_embd``, ``token_types``, ``per_layer_token_embd``, the head ``output``
and ``cls``, the norms ``*_norm``), so a checkpoint converted from GGUF and dequantized is
selected alike.

**Recipe** (TOML, read with :mod:`tomllib`): ordered ``[[rules]]``; each has exactly one of
``glob`` (:func:`fnmatch.fnmatchcase` over the whole tensor name) or ``regex``
(:func:`re.fullmatch`), and exactly one of ``keep = true`` or ``scheme = "<id>"`` with that
scheme's parameters as further keys (``group_size = "none"`` for per channel: TOML has no null;
``dtype`` sets the logical dtype).  The first rule whose pattern matches a name decides.  An
optional ``[default]`` table (``scheme`` and parameters) quantizes the tensors no rule matches,
under the default selection rule; without it they are kept.  Every rule must match at least one
tensor, and a scheme rule may only match floating tensors with at least one axis.  Any problem
is ``QUANTIZE_RECIPE_INVALID`` naming the rule, raised before anything is written.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from . import tables
from .errors import QFormatError, error
from .sources import TensorInfo

#: Storage dtypes the quantizer reads.
FLOAT_STORAGE = ("F16", "BF16", "F32", "F64")
#: The smallest tensor the default rule quantizes.
MIN_ELEMENTS = 4096
HEAD_NAMES = ("lm_head", "embed_out", "output", "head", "classifier", "cls")
_EMBED = re.compile(r"embed|embd|^wte$|^wpe$|^token_types$", re.IGNORECASE)
_NORM = re.compile(r"norm|^ln_f$|^ln_\d+$", re.IGNORECASE)
RECIPE_ERROR = "QUANTIZE_RECIPE_INVALID"


def is_embedding(name: str) -> bool:
    return any(_EMBED.search(p) for p in name.split("."))


def default_selected(name: str, info: TensorInfo, embedding_shapes: Iterable[tuple[int, ...]] = ()) -> bool:
    """The default selection rule (module docstring)."""
    if info.dtype not in FLOAT_STORAGE or len(info.shape) != 2 or info.shape[0] * info.shape[1] < MIN_ELEMENTS:
        return False
    if not (name == "weight" or name.endswith(".weight")):
        return False
    parts = name.split(".")
    if is_embedding(name) or any(_NORM.search(p) for p in parts):
        return False
    module = parts[-2] if len(parts) >= 2 else ""
    if module in HEAD_NAMES:
        return False
    return tuple(info.shape) not in set(map(tuple, embedding_shapes))


def embedding_shapes(infos: Mapping[str, TensorInfo]) -> set[tuple[int, ...]]:
    """Shapes of the 2-D embeddings of a checkpoint (for the tied-head part of the rule)."""
    return {tuple(i.shape) for n, i in infos.items() if is_embedding(n) and len(i.shape) == 2}


def _none(v: Any) -> Any:
    return None if isinstance(v, str) and v.lower() == "none" else v


@dataclass(frozen=True)
class Choice:
    """A scheme and its encoder parameters (``dtype`` apart: None means the tensor's own)."""

    scheme: str
    params: dict[str, Any] = field(default_factory=dict)
    dtype: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"scheme": self.scheme}
        d.update({k: ("none" if v is None else v) for k, v in self.params.items()})
        if self.dtype is not None:
            d["dtype"] = self.dtype
        return d


def choice(scheme: str, params: Mapping[str, Any]) -> Choice:
    """A :class:`Choice` from a scheme id and parameters (``dtype`` among them or not); raises
    SCHEME_UNKNOWN or ENCODE_PARAM_INVALID (unknown parameter name)."""
    known = tables.schemes()
    if not isinstance(scheme, str) or scheme not in known:
        raise error("SCHEME_UNKNOWN", f"no scheme {scheme!r}; known: {', '.join(sorted(known))}")
    allowed = known[scheme]["parameters"]
    ps = {}
    for k, v in params.items():
        if k not in allowed:
            raise error("ENCODE_PARAM_INVALID", f"scheme {scheme!r} has no parameter {k!r}; expected one of {', '.join(allowed)}", field=k)
        ps[k] = _none(v)
    dt = ps.pop("dtype", None)
    return Choice(scheme, ps, dt)


@dataclass(frozen=True)
class Rule:
    """One recipe rule: a pattern (``kind`` glob or regex) and a :class:`Choice` (None: keep)."""

    index: int  # 1-based position in the recipe
    kind: str
    pattern: str
    choice: Choice | None

    @property
    def label(self) -> str:
        return f"rule {self.index} ({self.kind} {self.pattern!r})"

    def matches(self, name: str) -> bool:
        if self.kind == "glob":
            return fnmatch.fnmatchcase(name, self.pattern)
        return re.fullmatch(self.pattern, name) is not None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {self.kind: self.pattern}
        d.update(self.choice.to_dict() if self.choice is not None else {"keep": True})
        return d


def recipe_error(message: str, rule: Rule | None = None, field: str | None = None) -> QFormatError:
    where = f"{rule.label}: " if rule is not None else ""
    return error(RECIPE_ERROR, where + message, field=field or (f"rules[{rule.index - 1}]" if rule else None))


@dataclass
class Recipe:
    """Ordered rules and an optional default choice (applied under the default selection rule)."""

    rules: list[Rule] = field(default_factory=list)
    default: Choice | None = None
    source: str | None = None  # the file it was read from

    @staticmethod
    def load(path: str | os.PathLike[str]) -> "Recipe":
        path = os.fspath(path)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as e:
            raise error("FILE_UNREADABLE", f"cannot read recipe {path!r}: {e.strerror or e}") from None
        r = Recipe.from_toml(raw.decode("utf-8", errors="replace"), where=os.path.basename(path))
        r.source = path
        return r

    @staticmethod
    def from_toml(text: str, where: str = "recipe") -> "Recipe":
        import tomllib

        try:
            obj = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise recipe_error(f"{where} is not valid TOML: {e}") from None
        return Recipe.from_dict(obj)

    @staticmethod
    def from_dict(obj: Mapping[str, Any]) -> "Recipe":
        if not isinstance(obj, Mapping):
            raise recipe_error("a recipe is a table with [[rules]] and an optional [default]")
        extra = sorted(set(obj) - {"rules", "default"})
        if extra:
            raise recipe_error(f"unknown top-level key(s) {', '.join(map(repr, extra))}; a recipe has [[rules]] and an optional [default]")
        rules_raw = obj.get("rules", [])
        if not isinstance(rules_raw, list) or not all(isinstance(r, Mapping) for r in rules_raw):
            raise recipe_error("'rules' must be an array of tables ([[rules]])", field="rules")
        rules = [_rule(i + 1, r) for i, r in enumerate(rules_raw)]
        default = None
        if "default" in obj:
            d = obj["default"]
            if not isinstance(d, Mapping) or "scheme" not in d:
                raise recipe_error("[default] must be a table with a 'scheme' and its parameters", field="default")
            try:
                default = choice(d["scheme"], {k: v for k, v in d.items() if k != "scheme"})
            except QFormatError as e:
                raise recipe_error(f"[default]: {e}", field="default") from None
        if not rules and default is None:
            raise recipe_error("the recipe has no rules and no [default]: it would quantize nothing")
        return Recipe(rules, default)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rules": [r.to_dict() for r in self.rules]}
        if self.default is not None:
            out["default"] = {"selection": "default", **self.default.to_dict()}
        return out


def _rule(index: int, raw: Mapping[str, Any]) -> Rule:
    pats = [k for k in ("glob", "regex") if k in raw]
    label = f"rule {index}"
    if len(pats) != 1:
        raise error(RECIPE_ERROR, f"{label}: needs exactly one of 'glob' or 'regex', found {len(pats)}", field=f"rules[{index - 1}]")
    kind = pats[0]
    pattern = raw[kind]
    if not isinstance(pattern, str) or not pattern:
        raise error(RECIPE_ERROR, f"{label}: {kind} must be a non-empty string, found {pattern!r}", field=f"rules[{index - 1}]")
    rule = Rule(index, kind, pattern, None)
    if kind == "regex":
        try:
            re.compile(pattern)
        except re.error as e:
            raise recipe_error(f"the regular expression does not compile: {e}", rule) from None
    keep, scheme = raw.get("keep"), raw.get("scheme")
    rest = {k: v for k, v in raw.items() if k not in (kind, "keep", "scheme")}
    if keep is not None and scheme is not None:
        raise recipe_error("has both 'keep' and 'scheme'; a rule either keeps or quantizes", rule)
    if keep is not None:
        if keep is not True:
            raise recipe_error(f"'keep' must be true, found {keep!r} (leave it out and give a scheme to quantize)", rule)
        if rest:
            raise recipe_error(f"a keep rule takes no parameters, found {', '.join(map(repr, sorted(rest)))}", rule)
        return rule
    if scheme is None:
        raise recipe_error("needs 'scheme = \"<id>\"' or 'keep = true'", rule)
    try:
        c = choice(scheme, rest)
    except QFormatError as e:
        raise recipe_error(str(e), rule) from None
    return Rule(index, kind, pattern, c)


@dataclass(frozen=True)
class Decision:
    """What happens to one tensor: ``choice`` None keeps it; ``rule`` is the deciding rule
    (None for the default selection rule, or for a tensor nothing selected)."""

    name: str
    choice: Choice | None
    rule: Rule | None


def decide(recipe: Recipe, infos: Mapping[str, TensorInfo], names: Sequence[str]) -> list[Decision]:
    """A decision per name (in order): first matching rule, else the default under the default
    selection rule, else keep.  Raises QUANTIZE_RECIPE_INVALID for a rule matching nothing or
    a scheme rule matching a tensor that cannot be quantized (not floating, or rank 0)."""
    emb = embedding_shapes(infos)
    used: set[int] = set()
    out = []
    for n in names:
        info = infos[n]
        rule = next((r for r in recipe.rules if r.matches(n)), None)
        if rule is not None:
            used.add(rule.index)
            if rule.choice is not None and (info.dtype not in FLOAT_STORAGE or not info.shape):
                raise recipe_error(f"matches {n!r}, a {info.dtype} tensor of shape {list(info.shape)}, which cannot be quantized "
                                   "(floating tensors with at least one axis only); add a keep rule for it before this one", rule)
            out.append(Decision(n, rule.choice, rule))
        elif recipe.default is not None and default_selected(n, info, emb):
            out.append(Decision(n, recipe.default, None))
        else:
            out.append(Decision(n, None, None))
    for r in recipe.rules:
        if r.index not in used:
            earlier = [q for q in recipe.rules if q.index < r.index and any(q.matches(n) and r.matches(n) for n in names)]
            why = f" (every tensor it matches is taken by an earlier rule: {earlier[0].label})" if earlier else ""
            raise recipe_error(f"matches no tensor of the checkpoint{why}", r)
    return out
