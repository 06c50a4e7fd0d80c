"""llama-quantize's presets (Q4_K_M, Q5_K_M, ...) as qformat recipes: per tensor, the ggml type
llama.cpp's own mix chooses, so ``qformat quantize --preset Q4_K_M`` then ``qformat export --to
gguf`` gives the file ``llama-quantize`` gives, tensor for tensor.

The mixes are data (``tables/gguf_presets.json``: per preset, the default type and ordered
[condition, type] rules for ``attn_v``, ``ffn_down`` and ``attn_output``); this module applies
them as ``llama_tensor_get_type`` (llama.cpp ``src/llama-quant.cpp``) does for a dense model,
with or without an importance matrix (with one, Q4_0 and Q5_0 give the first eighth of the
``ffn_down`` layers Q4_1 / Q5_1, and Q2_K_S becomes possible):

- which tensors: those llama.cpp quantizes (2 or more axes, name ending in ``weight``, not a
  norm, not ``ffn_gate_inp``, not position / token-type embeddings), by their GGUF names: a
  Hugging Face llama-family folder's names as ``qformat export --to gguf`` renames them, or GGUF
  names as they are;
- in llama.cpp's order (by layer number, then name), counting the ``attn_v`` tensors and the
  ``ffn_down`` layers as it does;
- the output head, or the token embedding of a model without one (tied), becomes Q6_K (Q8_0
  for the Q8_0 preset or rows the type's block does not divide); 70B Llama / Qwen2 models (80
  layers) get Q5_K for an ``attn_v`` at Q3_K or Q4_K;
- a row length the chosen type's block does not divide falls back as llama.cpp's
  ``tensor_type_fallback`` does (Q2_K, Q3_K, TQ1_0, TQ2_0 to Q4_0; Q4_K to Q5_0; Q5_K to Q5_1;
  Q6_K to Q8_0; IQ4_XS to IQ4_NL);
  where no 32-element type fits either, llama.cpp writes F16 and qformat keeps the tensor
  unquantized in its own dtype (noted in :attr:`Resolved.notes`).

:func:`resolve` gives the per-tensor types; :func:`recipe` the qformat recipe (one exact-name
rule per quantized tensor, scheme ``gguf``), and :func:`recipe_toml` the same as a TOML file a
user can read, edit and pass back with ``--recipe``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from . import tables
from .errors import error
from .schemes.ggml_blocks import SIZES

_FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0",
             "IQ4_XS": "IQ4_NL", "TQ1_0": "Q4_0", "TQ2_0": "Q4_0"}
_ATTN_V = ("attn_v.weight", "attn_qkv.weight", "attn_kv_b.weight")
#: Substrings of names llama.cpp never quantizes (tensor_allows_quantization, dense models).
_NOT_QUANTIZED = ("_norm.weight", "ffn_gate_inp.weight", "altup", "laurel", "per_layer_model_proj", "ssm_conv1d",
                  "time_mix_", "attn_rel_b.weight", "position_embd", "token_types")


def presets() -> dict[str, dict[str, Any]]:
    """The preset table (``tables/gguf_presets.json``)."""
    return tables.gguf_presets()


def category(name: str) -> str:
    """llama.cpp's tensor category of a GGUF tensor name (``tensor_get_category``)."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    if any(s in name for s in _ATTN_V):
        return "attn_v"
    for cat, s in (("attn_k", "attn_k.weight"), ("attn_q", "attn_q.weight"), ("attn_output", "attn_output.weight"),
                   ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"), ("ffn_down", "ffn_down")):
        if s in name:
            return cat
    return "other"


def _layer(name: str) -> int:
    m = re.match(r"blk\.(-?\d+)\.", name)
    return int(m.group(1)) if m else -1


def llama_order(names: Sequence[str]) -> list[str]:
    """GGUF names in llama.cpp's weights order (``weight_name_comparer``: layer, then name)."""
    return sorted(names, key=lambda n: (_layer(n), n))


def more_bits(i: int, n: int) -> bool:
    """llama.cpp's ``use_more_bits``: the first and last eighth of the layers and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _holds(cond: str, i: int, n: int, gqa: float, has_imatrix: bool) -> bool:
    if cond == "always":
        return True
    if cond == "more_bits":
        return more_bits(i, n)
    if cond == "first_8th":
        return i < n // 8
    if cond == "first_8th_imatrix":
        return has_imatrix and i < n // 8
    if cond == "first_8th_no_imatrix":
        return not has_imatrix and i < n // 8
    if cond == "first_16th":
        return i < n // 16
    if cond == "first_2":
        return i < 2
    if cond == "first_4":
        return i < 4
    if cond == "gqa_ge_4":
        return gqa >= 4
    raise KeyError(f"unknown preset condition {cond!r}")


@dataclass
class Resolved:
    """A preset applied to one checkpoint: ``types`` maps each source tensor name to quantize to
    its ggml type (absent: kept as it is); ``notes`` says where llama.cpp would differ;
    ``needs_imatrix``: the tensors llama-quantize refuses to quantize without an importance
    matrix entry (Q2_K_S's Q2_K tensors other than the token embedding and output)."""

    preset: str
    types: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    needs_imatrix: list[str] = field(default_factory=list)
    #: The same types by GGUF name (what :func:`quantized_metadata` records).
    gguf_types: dict[str, str] = field(default_factory=dict)


def resolve(preset: str, shapes: Mapping[str, Sequence[int]], config: Mapping[str, Any] | None,
            gguf_names: Mapping[str, str | None] | None = None, has_imatrix: bool = False) -> Resolved:
    """The types ``preset`` gives the tensors ``shapes`` (source name -> shape) of a model with
    ``config`` (config.json: ``num_hidden_layers``, ``num_attention_heads``,
    ``num_key_value_heads``, ``model_type``; a GGUF source's are :func:`gguf_hparams`).  ``gguf_names``: each source name's GGUF name
    (None: not in the GGUF file); by default the names are GGUF names already.
    ``has_imatrix``: an importance matrix will be applied (``--imatrix``).  Raises
    ENCODE_PARAM_INVALID for an unknown preset, or one that needs an importance matrix without one."""
    table = presets()
    if preset not in table:
        raise error("ENCODE_PARAM_INVALID", f"no preset {preset!r}; known: {', '.join(table)}", field="preset")
    p = table[preset]
    if p.get("requires_imatrix") and not has_imatrix:
        raise error("ENCODE_PARAM_INVALID", f"llama.cpp's {preset} needs an importance matrix (llama-quantize refuses it without "
                    "one): give one with --imatrix FILE, or use Q2_K or Q3_K_S", field="preset")
    cfg = dict(config or {})
    to_gguf = {n: (gguf_names[n] if gguf_names is not None else n) for n in shapes}
    by_gguf = {g: n for n, g in to_gguf.items() if g is not None}
    order = llama_order(list(by_gguf))
    n_layer = int(cfg.get("num_hidden_layers") or (max((_layer(g) for g in order), default=-1) + 1))
    heads = int(cfg.get("num_attention_heads") or 1)
    gqa = heads / int(cfg.get("num_key_value_heads") or heads)
    is_70b = n_layer == 80 and cfg.get("model_type") in ("llama", "mistral", "qwen2") and \
        (cfg.get("model_type") == "qwen2" or heads != int(cfg.get("num_key_value_heads") or heads))
    tied = "output.weight" not in by_gguf
    n_attn_v = sum(category(g) == "attn_v" for g in order)
    counters = {"attn_v": 0, "ffn_down": 0}
    out = Resolved(preset)
    for g in order:
        name = by_gguf[g]
        shape = tuple(int(s) for s in shapes[name])
        if len(shape) < 2 or not g.endswith("weight") or any(s in g for s in _NOT_QUANTIZED):
            continue
        cat = category(g)
        t = str(p["type"])
        if cat == "output" or (tied and cat == "token_embd"):
            if shape[-1] % SIZES[t][0] != 0:
                t = "Q8_0"
            elif t != "Q8_0":
                t = "Q6_K"
        elif cat in ("attn_v", "ffn_down", "attn_output", "token_embd"):  # token_embd: untied (TQ1_0, TQ2_0: Q4_K)
            i = counters.get(cat, 0)
            n = n_attn_v if cat == "attn_v" else n_layer
            for cond, typ in p.get(cat, []):
                if _holds(cond, i, n, gqa, has_imatrix):
                    t = typ
                    break
            if cat == "attn_v" and is_70b and t in ("Q3_K", "Q4_K"):
                t = "Q5_K"
            if cat in counters:
                counters[cat] += 1
        if shape[-1] % SIZES[t][0] != 0:
            fb = _FALLBACK.get(t, t)
            if shape[-1] % SIZES[fb][0] != 0:
                out.notes.append(f"{name}: rows of {shape[-1]} fit no block type; llama.cpp writes it as F16, qformat keeps it unquantized")
                continue
            out.notes.append(f"{name}: rows of {shape[-1]} are not a multiple of {SIZES[t][0]} ({t}); falling back to {fb} as llama.cpp does")
            t = fb
        out.types[name] = t
        out.gguf_types[g] = t
        if p.get("requires_imatrix") and t == "Q2_K" and cat not in ("output", "token_embd"):
            out.needs_imatrix.append(name)
    return out


def recipe(resolved: Resolved) -> dict[str, Any]:
    """The qformat recipe (as a dict, :meth:`qformat.recipe.Recipe.from_dict`'s input) of a
    resolved preset: one exact-name rule per quantized tensor, in checkpoint order."""
    return {"rules": [{"glob": _glob_escape(n), "scheme": "gguf", "type": t} for n, t in resolved.types.items()]}


def _glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def recipe_toml(resolved: Resolved) -> str:
    """:func:`recipe` as a TOML file with a header saying where it comes from."""
    lines = [f"# qformat recipe: llama-quantize's {resolved.preset} mix for this checkpoint (qformat quantize --preset {resolved.preset}).",
             "# One rule per quantized tensor; tensors no rule names are kept. Edit the types (scheme gguf: Q4_0, Q4_1, Q5_0,",
             "# Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0) and pass the file back with --recipe."]
    lines += [f"# note: {n}" for n in resolved.notes]
    for n, t in resolved.types.items():
        lines += ["", "[[rules]]", f"glob = {json.dumps(_glob_escape(n))}", 'scheme = "gguf"', f"type = {json.dumps(t)}"]
    return "\n".join(lines) + "\n"


def gguf_names(names: Sequence[str], config: Mapping[str, Any] | None) -> dict[str, str | None]:
    """Each tensor's GGUF name: a Hugging Face llama-family checkpoint's as ``qformat export --to
    gguf`` renames them (None: a tensor llama.cpp's converter leaves out), GGUF names as they
    are.  ENCODE_PARAM_INVALID when neither applies (the mixes are defined on llama.cpp's names)."""
    from .architectures import by_model_type

    mt = (config or {}).get("model_type")
    table = by_model_type(mt)  # the architecture table export uses (qformat/architectures)
    if table is not None:
        out: dict[str, str | None] = {}
        for n in names:
            out[n] = None
            if any(re.fullmatch(p, n) for p in table.skipped):
                continue
            for pat, repl in table.tensors:
                if re.fullmatch(pat, n):
                    out[n] = re.sub(pat, repl, n)
                    break
        return out
    if any(n.startswith("blk.") or n in ("token_embd.weight", "output.weight") for n in names):
        return {n: n for n in names}
    import gguf

    arch = next((a for a, label in gguf.MODEL_ARCH_NAMES.items() if label == mt), None) if isinstance(mt, str) else None
    if arch is not None:
        # other architectures gguf-py knows: its own Hugging Face -> GGUF name map (what
        # llama.cpp's converter uses), though qformat's GGUF export takes only the llama family
        layers = int((config or {}).get("num_hidden_layers") or 0)
        tmap = gguf.get_tensor_name_map(arch, max(layers, 1))
        return {n: tmap.get_name(n, try_suffixes=(".weight", ".bias")) for n in names}
    raise error("ENCODE_PARAM_INVALID", "a GGUF preset follows llama.cpp's tensor names: it needs a Hugging Face folder whose "
                "config.json model_type is an architecture gguf-py knows (llama, qwen2, bert, ...) or tensors with GGUF names "
                f"(blk.N.*, token_embd, output); found model_type {mt!r}", field="preset")


def gguf_hparams(kv: Mapping[str, Any]) -> dict[str, Any]:
    """The config.json keys :func:`resolve` reads (``model_type``, ``num_hidden_layers``,
    ``num_attention_heads``, ``num_key_value_heads``), from a GGUF file's metadata as ``qformat
    convert`` records it (``kv``: key -> {"type", "value"}): ``general.architecture`` and its
    ``block_count``, ``attention.head_count`` and ``attention.head_count_kv``, the values
    llama.cpp's mixes read (a per-layer array: layer 0's, as ``n_gqa()`` takes).  Keys absent
    (or recorded elsewhere) are left out."""

    def value(key: str) -> Any:
        v = kv.get(key)
        v = v.get("value") if isinstance(v, Mapping) else None
        if isinstance(v, list):
            v = v[0] if v else None
        return v

    arch = value("general.architecture")
    if not isinstance(arch, str):
        return {}
    out: dict[str, Any] = {"model_type": arch}
    for name, key in (("num_hidden_layers", "block_count"), ("num_attention_heads", "attention.head_count"),
                      ("num_key_value_heads", "attention.head_count_kv")):
        v = value(f"{arch}.{key}")
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            out[name] = v
    return out


def quantized_metadata(meta: Mapping[str, str], resolved: Resolved, imatrix_kvs: Sequence[tuple[str, dict[str, Any]]] = ()) -> dict[str, str]:
    """A source file's ``__metadata__`` with its GGUF record (``qformat convert`` of a GGUF file:
    member ``gguf``) made what ``llama-quantize`` writes for ``resolved``, so that ``qformat
    export --to gguf`` writes that file: each quantized tensor recorded with its new type, and
    the key/values as llama_model_quantize_impl sets them (``general.quantization_version`` and
    ``general.file_type``, the preset's ftype, removed and appended in that order; the split
    keys removed; then llama-quantize's ``quantize.imatrix.*`` keys, ``imatrix_kvs``, each
    removed and appended).  A file without a record is returned as it is."""
    import gguf

    from .convert.gguf import METADATA_KEY

    text = meta.get(METADATA_KEY)
    if text is None:
        return dict(meta)
    try:
        rec = json.loads(text)
        kv = dict(rec["kv"])
        tensors = [list(t) for t in rec.get("tensors", [])]
    except (ValueError, KeyError, TypeError):
        return dict(meta)  # not a record this can read: export says so
    K = gguf.Keys
    ftype = int(presets()[resolved.preset]["ftype"])
    sets = [(K.General.QUANTIZATION_VERSION, {"type": "uint32", "value": int(gguf.GGML_QUANT_VERSION)}),
            (K.General.FILE_TYPE, {"type": "uint32", "value": ftype}), *imatrix_kvs]
    drop = {k for k, _ in sets} | {K.Split.LLM_KV_SPLIT_NO, K.Split.LLM_KV_SPLIT_COUNT, K.Split.LLM_KV_SPLIT_TENSORS_COUNT}
    kv = {k: v for k, v in kv.items() if k not in drop}
    kv.update(sets)
    for t in tensors:
        if t and t[0] in resolved.gguf_types and len(t) >= 2:
            t[1] = resolved.gguf_types[t[0]]
    rec = {**rec, "kv": kv, "tensors": tensors}
    return {**meta, METADATA_KEY: json.dumps(rec, separators=(",", ":"), ensure_ascii=False)}
