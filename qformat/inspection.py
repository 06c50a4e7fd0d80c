"""``qformat inspect``: what is inside a checkpoint, from its headers alone.

:func:`inspect_checkpoint` opens a qformat or plain safetensors file, a folder, a sharded
index, a GGUF file, or any source checkpoint that ``qformat convert`` detects (read through
its converter in memory: nothing is written), and lists every tensor a reader returns with
its logical shape and dtype, scheme, element encoding, block size, layout, stored bytes and
bits per weight (parameters included), then totals and a per-scheme summary.

For a GGUF file, and for a checkpoint converted from one (its ``__metadata__["gguf"]``), the
report also summarises the GGUF key/values (:func:`gguf_summary`): architecture, name, the
``<arch>.*`` hyperparameters, tokenizer model, pre-tokenizer and vocabulary size, and
``general.file_type`` with its gguf-py ``LlamaFileType`` name.  Tensors in which older
conversions stored large key/values (``gguf.kv.*``) are metadata, not model tensors: they are
left out of the tensor list, the totals and the bits per weight (and named in the summary).

Only headers and metadata are read: no tensor payload of a qformat, plain safetensors or GGUF
file is touched, so the answer comes in milliseconds whatever the checkpoint's size.  Some
converters of other formats read a few small tensors to describe the source (bitsandbytes'
``quant_state`` JSON blobs, GPTQ's ``g_idx``, a compressed-tensors shape tensor, torchao zero
points, an MLX global scale); GGUF files are described from their tensor infos alone.

The module is named ``inspection`` so that it never shadows the standard library's ``inspect``.
:func:`open_checkpoint` is also what ``qformat diff`` reads through (:mod:`qformat.diff`).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from . import dtypes as _dt
from .descriptor import Blocks, Descriptor, parse_descriptor
from .elements import Element
from .errors import QFormatError, error
from .model import METADATA_KEY, required_version
from .redact import shown
from .sources import TensorInfo

#: The version of ``qformat inspect --json``'s output; bumped only when a member changes meaning
#: or disappears (new members may be added without a bump).
FORMAT_VERSION = 1


def natural_key(name: str) -> list[Any]:
    """Sort key ordering ``layer.2`` before ``layer.10``."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


# -- opening anything readable ---------------------------------------------------------------
class Opened:
    """A checkpoint of any readable kind, opened without reading tensor payload.

    ``kind`` is ``"qformat"`` (files with qformat descriptors), ``"safetensors"`` (plain files),
    or ``"source"`` (read through the converter ``source_format``, GGUF included).  The
    converter's description is made on first use of :attr:`described` (for GGUF this reads
    the block scales; :func:`inspect_checkpoint` does not use it for GGUF files).
    """

    def __init__(self, path: str | os.PathLike[str], from_format: str | None = None):
        from . import convert as cv
        from .checkpoint.source import Checkpoint

        self.path = os.fspath(path)
        if os.path.isfile(self.path) and self.path.endswith(".json") and not self.path.endswith(".safetensors.index.json"):
            raise error("FILE_UNREADABLE", f"{self.path!r} is a JSON file but not a sharded checkpoint index (*.safetensors.index.json)")
        self.ck = Checkpoint(self.path)
        if from_format is not None:
            self.converter = cv.get(from_format)
        elif self.ck.kind == "gguf":
            self.converter = cv.get("gguf")
        else:
            try:
                self.converter = cv.detect(self.ck)
            except QFormatError as e:
                if e.code != "CONVERT_FORMAT_UNKNOWN":
                    raise
                self.converter = None  # a plain safetensors checkpoint
        name = None if self.converter is None else self.converter.name
        self.kind = "safetensors" if name is None else ("qformat" if name == "qformat" else "source")
        self.source_format = name if self.kind == "source" else None
        self._described: Any = None

    @property
    def described(self) -> Any:
        """The converter's :class:`~qformat.convert.base.Described` (empty for a plain checkpoint)."""
        if self._described is None:
            from .convert.base import Described

            self._described = Described() if self.converter is None else self.converter.describe(self.ck)
        return self._described

    @property
    def files(self) -> list[str]:
        return list(self.ck.files)

    def file_bytes(self) -> int:
        if self.ck.kind == "safetensors" and all(f in self.ck._headers for f in self.ck.files):
            return sum(self.ck._headers[f].file_size for f in self.ck.files)  # also right for a remote file
        return sum(os.path.getsize(os.path.join(self.ck.folder, f)) for f in self.ck.files)

    def info(self, name: str) -> TensorInfo | None:
        """A stored tensor's dtype and shape: a source tensor or one the converter adds."""
        d = self.described
        if name in d.added:
            return d.added.info(name)
        if name in d.plain:
            return d.plain.info(name)
        return self.ck.info(name) if self.ck.kind == "safetensors" else None

    def array(self, name: str) -> np.ndarray:
        """A stored tensor (memory-mapped source tensor, or the converter's addition produced now)."""
        d = self.described
        c = d.added.get_component(name) or d.plain.get_component(name)
        return c.produce() if c is not None else self.ck.array(name)

    def descriptors(self) -> dict[str, Descriptor]:
        """Every logical tensor's parsed descriptor (schema-checked; SCHEMA_VIOLATION etc. raised)."""
        return {n: parse_descriptor(n, raw) for n, raw in self.described.tensors()}

    def plain_names(self, descs: dict[str, Descriptor]) -> list[str]:
        """Stored tensors that no descriptor references: they read as they are stored."""
        d = self.described
        referenced = {ref for desc in descs.values() for _, ref in desc.references()}
        out = []
        if self.ck.kind == "safetensors":
            out += [n for n in self.ck.names() if n not in referenced and n not in d.dropped]
        out += [n for n in d.added if n not in referenced]
        out += list(d.plain)
        return out

    def spec_versions(self) -> list[str]:
        """The qformat versions the files declare (qformat), or a conversion would record (sources)."""
        if self.kind == "qformat":
            found = set()
            for f in self.ck.files:
                text = self.ck.metadata(f).get(METADATA_KEY)
                if text is None:
                    continue
                try:
                    v = json.loads(text).get("version")
                except (ValueError, AttributeError):
                    v = None
                if isinstance(v, str):
                    found.add(v)
            return sorted(found)
        if self.kind == "source":
            from .digests import written_version  # a conversion records digests (SPEC.md §3.8)

            return [written_version(required_version(dict(self.described.tensors())) if self.source_format != "gguf" else "1.0")]
        return []

    def release(self) -> None:
        """Drop the resident pages of the source's memory maps (bounded memory while streaming)."""
        self.ck.release()


def open_checkpoint(path: str | os.PathLike[str], from_format: str | None = None) -> Opened:
    """Open ``path`` (any kind ``qformat inspect`` reads) without reading tensor payload."""
    return Opened(path, from_format)


# -- describing tensors --------------------------------------------------------------------
def element_text(e: Element) -> str:
    """A short name of an element encoding: ``int4 twos_complement``, ``e4m3fn``, ``codebook4 nf4``."""
    if e.type == "int":
        s = f"int{e.bits} {e.signedness}"
        if e.code_offset:
            s += f" offset {e.code_offset}"
        if e.frac_bits:
            s += f" frac {e.frac_bits}"
        return s
    if e.type == "float":
        return str(e.format)
    return f"codebook{e.bits} {e.table if e.table else 'in-file'}"


def blocks_text(b: Blocks, shape: tuple[int, ...]) -> str:
    """A short name of a block: ``32`` (along the last axis), ``128x128``, ``channel``, ``tensor``,
    ``flat 64``, ``32 g_idx`` (groups of 32 on average, chosen by a group index)."""
    if b.type == "flat":
        return f"flat {b.size}"
    size = list(b.size)  # type: ignore[arg-type]
    eff = [n if s is None else min(int(s), n) for s, n in zip(size, shape)]
    if b.index is not None:
        return f"{-(-shape[b.index.axis] // max(1, b.index.count))} g_idx"
    if all(e == n for e, n in zip(eff, shape)):
        return "tensor"
    if len(shape) >= 2 and all(e == 1 for e in eff[:-1]) and eff[-1] == shape[-1]:
        return "channel"
    if all(e == 1 for e in eff[:-1]):
        return str(eff[-1])
    if len(shape) >= 2 and eff[-1] == shape[-1] and all(e == 1 for e in eff[:-2]):
        return f"{eff[-2]} along axis {len(shape) - 2}"
    return "x".join(str(e) for e in eff)


def _main_param(d: Descriptor) -> Any:
    return d.scale or d.zero or d.bias


def derived_scheme(d: Descriptor) -> str:
    """A description of a descriptor without a ``scheme`` member: element, then block."""
    p = _main_param(d)
    e = d.codes.element
    s = f"int{e.bits}" if e.type == "int" else (str(e.format) if e.type == "float" else f"codebook{e.bits}")
    if p is not None:
        g = blocks_text(p.blocks, d.shape)
        s += " " + ({"channel": "per channel", "tensor": "per tensor"}.get(g) or (f"g{g}" if g[0].isdigit() and " " not in g.split(" g_idx")[0] else g))
    if d.zero is not None:
        s += " asym"
    return s


def _nbytes(i: TensorInfo) -> int:
    return -(-math.prod(i.shape) * _dt.storage_bits(i.dtype) // 8)


@dataclass
class TensorRow:
    """One tensor as ``qformat inspect`` lists it."""

    name: str
    shape: list[int]
    dtype: str
    quantized: bool
    scheme: str | None
    scheme_source: str | None  # "descriptor" (its scheme member) or "derived"; None for plain tensors
    element: str
    block: dict[str, Any] | None
    granularity: str | None
    layout: str | None
    stored_bytes: int
    bits_per_weight: float | None
    components: list[str] = field(default_factory=list)

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": self.shape, "dtype": self.dtype, "quantized": self.quantized,
                "scheme": self.scheme, "scheme_source": self.scheme_source, "element": self.element,
                "block": self.block, "granularity": self.granularity, "layout": self.layout,
                "elements": self.elements, "stored_bytes": self.stored_bytes, "bits_per_weight": _round(self.bits_per_weight),
                "components": self.components}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _bpw(nbytes: int, elements: int) -> float | None:
    return nbytes * 8 / elements if elements else None


def _quantized_row(name: str, d: Descriptor, info: Any) -> TensorRow:
    comps = list(dict.fromkeys(ref for _, ref in d.references()))
    nbytes = 0
    for c in comps:
        i = info(c)
        if i is None:
            raise error("COMPONENT_MISSING", f"the descriptor references {c!r}, which is not in the checkpoint", tensor=name)
        nbytes += _nbytes(i)
    p = _main_param(d)
    return TensorRow(name, list(d.shape), d.dtype, True, d.scheme or derived_scheme(d), "descriptor" if d.scheme else "derived",
                     element_text(d.codes.element), p.blocks.to_dict() if p is not None else None,
                     blocks_text(p.blocks, d.shape) if p is not None else None, d.layout, nbytes,
                     _bpw(nbytes, math.prod(d.shape)), comps)


def plain_dtype(storage: str) -> str:
    """The NumPy-style name of a safetensors dtype (``F32`` -> ``float32``; ``F4`` stays ``F4``)."""
    from . import tables

    return tables.dtypes()[storage].get("numpy") or storage


def _plain_row(name: str, i: TensorInfo) -> TensorRow:
    nbytes = _nbytes(i)
    return TensorRow(name, list(i.shape), plain_dtype(i.dtype), False, None, None, i.dtype, None, None, None, nbytes,
                     _bpw(nbytes, math.prod(i.shape)), [name])


# -- GGUF key/values ------------------------------------------------------------------------------
#: Arrays longer than this are summarised by their length (vocabularies, merges, scores).
SHORT_ARRAY = 64


#: ``tokenizer.ggml.<name>_token_id`` keys shown as the special token ids, in gguf-py's order.
SPECIAL_IDS = ("bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "mask", "cls")
#: The tokenizer flags shown (``tokenizer.ggml.<flag>``).
TOKENIZER_FLAGS = ("add_bos_token", "add_eos_token", "add_sep_token", "add_space_prefix")


def gguf_summary(kv: dict[str, Any], version: Any = None, alignment: Any = None, kv_tensors: list[str] | None = None,
                 members: dict[str, str] | None = None) -> dict[str, Any]:
    """What a GGUF file's key/values say about the model (``kv``: key -> the JSON form the
    converter records, ``{"type", "value"}``, or a stub of a value kept elsewhere with its
    ``length``): ``architecture``, ``name``, ``file_type`` (``{"id", "name"}``, the name from
    gguf-py's ``LlamaFileType``), ``quantization_version``, ``hyperparameters`` (every
    ``<architecture>.*`` key, prefix removed; long arrays as their length), ``tokenizer``
    (``model``, ``pre``, ``vocab_size``, ``special_ids``: ``tokenizer.ggml.<type>_token_id`` by
    type, ``flags``: add_bos_token, add_space_prefix ..., ``chat_template``: the text, or None),
    the GGUF ``version``, ``alignment`` and key count.  ``members``: the ``__metadata__`` a
    converted checkpoint keeps large values in (a chat template over 64 KiB is one)."""
    import gguf

    K = gguf.Keys

    def value(key: str) -> Any:
        v = kv.get(key)
        return v.get("value") if isinstance(v, dict) else None

    arch = value(K.General.ARCHITECTURE)
    ft = value(K.General.FILE_TYPE)
    ft_name = gguf.LlamaFileType(ft).name if isinstance(ft, int) and ft in gguf.LlamaFileType._value2member_map_ else None
    hyper: dict[str, Any] = {}
    if isinstance(arch, str):
        for key in sorted(k for k in kv if k.startswith(arch + ".")):
            v = kv[key]
            if not isinstance(v, dict):
                continue
            if v.get("type") == "array":
                items = v.get("value")
                if isinstance(items, list) and len(items) <= SHORT_ARRAY and v.get("element_type") != "array":
                    hyper[key[len(arch) + 1 :]] = items
                else:
                    hyper[key[len(arch) + 1 :]] = {"length": len(items) if isinstance(items, list) else v.get("length")}
            elif "value" in v:
                hyper[key[len(arch) + 1 :]] = v["value"]
    tokens = kv.get(K.Tokenizer.LIST)
    n_tokens = None
    if isinstance(tokens, dict):
        n_tokens = len(tokens["value"]) if isinstance(tokens.get("value"), list) else tokens.get("length")
    if n_tokens is None and isinstance(arch, str):
        n_tokens = value(K.LLM.VOCAB_SIZE.format(arch=arch))
    model = value(K.Tokenizer.MODEL)
    tok = None
    if model is not None or n_tokens is not None:
        template = kv.get(K.Tokenizer.CHAT_TEMPLATE)
        text = template.get("value") if isinstance(template, dict) else None
        if isinstance(template, dict) and "metadata" in template and members is not None:  # kept in its own member
            try:
                text = json.loads(members[str(template["metadata"])]).get("value")
            except (KeyError, ValueError, AttributeError):
                text = None
        tok = {"model": model, "pre": value(K.Tokenizer.PRE), "vocab_size": n_tokens,
               "special_ids": {t: value(f"tokenizer.ggml.{t}_token_id") for t in SPECIAL_IDS if isinstance(value(f"tokenizer.ggml.{t}_token_id"), int)},
               "flags": {f: value(f"tokenizer.ggml.{f}") for f in TOKENIZER_FLAGS if isinstance(value(f"tokenizer.ggml.{f}"), bool)},
               "chat_template": text if isinstance(text, str) else None}
    out = {"architecture": arch, "name": value(K.General.NAME), "file_type": None if ft is None else {"id": ft, "name": ft_name},
           "quantization_version": value(K.General.QUANTIZATION_VERSION), "hyperparameters": hyper, "tokenizer": tok,
           "version": version, "alignment": alignment, "keys": len(kv)}
    if kv_tensors:
        out["kv_tensors"] = sorted(kv_tensors)
    return out


def _gguf_file_kv(f: Any) -> tuple[dict[str, Any], int, int]:
    """A GGUF file's key/values in the converter's JSON form (long arrays as their length)."""
    from .convert.gguf import kv_json

    kv: dict[str, Any] = {}
    for key, v in f.kv.items():
        if v.type == "array" and len(v.value) > SHORT_ARRAY:
            kv[key] = {"type": "array", "element_type": v.element_type, "length": len(v.value)}
        else:
            kv[key] = kv_json(v)
    return kv, f.version, f.alignment


def _recorded_gguf(o: Opened) -> tuple[dict[str, Any] | None, set[str]]:
    """The summary of the ``gguf`` metadata a converted checkpoint records (None without one), and
    the tensors of older conversions that hold large values (not model tensors)."""
    from .convert.gguf import METADATA_KEY as GGUF_KEY

    if o.ck.kind != "safetensors":
        return None, set()
    for f in o.ck.files:
        text = o.ck.metadata(f).get(GGUF_KEY)
        if text is None:
            continue
        try:
            meta = json.loads(text)
            kv = meta["kv"]
            if not isinstance(kv, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return {"error": f"{f}: __metadata__[{GGUF_KEY!r}] is not the JSON object qformat convert records"}, set()
        moved = {str(v["tensor"]) for v in kv.values() if isinstance(v, dict) and "tensor" in v}
        return gguf_summary(kv, meta.get("version"), meta.get("alignment"), sorted(moved), o.ck.metadata(f)), moved
    return None, set()


def gguf_lines(g: dict[str, Any]) -> list[str]:
    """The text report's lines for :func:`gguf_summary`."""
    if "error" in g:
        return [f"  GGUF metadata: {g['error']}"]
    ft = g["file_type"]
    what = [f"architecture {g['architecture'] or '-'}"]
    if g["name"]:
        what.append(f"name {g['name']!r}")
    if ft is not None:
        what.append(f"file type {ft['name'] or 'unknown'} ({ft['id']})")
    if g["quantization_version"] is not None:
        what.append(f"quantization version {g['quantization_version']}")
    what.append(f"GGUF v{g['version']}, alignment {g['alignment']}, {g['keys']} keys")
    out = ["  GGUF: " + ", ".join(what)]
    if g["hyperparameters"]:
        items = [f"{k} {_short(v)}" for k, v in g["hyperparameters"].items()]
        out.append("  hyperparameters: " + ", ".join(items))
    t = g["tokenizer"]
    if t is not None:
        out.append(f"  tokenizer: {t['model'] or '-'}, pre-tokenizer {t['pre'] or '-'}, vocabulary {t['vocab_size'] if t['vocab_size'] is not None else '-'}")
        if t.get("special_ids"):
            out.append("  special token ids: " + ", ".join(f"{k} {v}" for k, v in t["special_ids"].items()))
        if t.get("flags"):
            out.append("  tokenizer flags: " + ", ".join(f"{k} {str(v).lower()}" for k, v in t["flags"].items()))
        tpl = t.get("chat_template")
        if tpl is not None:
            out.append(f"  chat template ({len(tpl)} characters):")
            out += ["    " + line for line in tpl.splitlines()]
        else:
            out.append("  chat template: none")
    if g.get("kv_tensors"):
        out.append(f"  key/values stored as tensors (not counted as model tensors): {', '.join(g['kv_tensors'])}")
    return out


def _short(v: Any) -> str:
    if isinstance(v, dict) and "length" in v:
        return f"[{v['length']} values]"
    if isinstance(v, float):
        return f"{v:g}"
    return json.dumps(v, ensure_ascii=False) if isinstance(v, (list, str)) else str(v)


def _gguf_rows(f: Any) -> Iterator[TensorRow]:
    """GGUF tensors from the tensor infos alone (no block is read): the scheme and element the
    converter gives them (SPEC.md Appendix C.1), the GGUF file's own bytes."""
    from .convert import gguf as g

    for t in f.tensors.values():
        n = math.prod(t.shape)
        if t.ggml_type in g.PLAIN:
            st = _dt.storage_name(g.PLAIN[t.ggml_type]) or t.type_name
            yield TensorRow(t.name, list(t.shape), plain_dtype(st), False, None, None, t.type_name, None, None, None, t.nbytes, _bpw(t.nbytes, n), [t.name])
            continue
        spec = g.TYPES.get(t.ggml_type)
        computed = g.gguf_codes.TYPES.get(t.ggml_type)
        if spec is None and computed is not None:  # codes computed per element (i-quants, TQ*, NVFP4, ...)
            gran = str(computed.block) + (f" (sub-blocks of {computed.sub})" if computed.sub else "")
            block = {"type": "grid", "size": [1] * (len(t.shape) - 1) + [computed.sub or computed.block]}
            yield TensorRow(t.name, list(t.shape), "float32", True, "gguf_" + computed.name.lower(), "descriptor", computed.element_text(),
                            block, gran, "gguf_blocks", t.nbytes, _bpw(t.nbytes, n), [t.name])
            continue
        if spec is None:
            yield TensorRow(t.name, list(t.shape), "float32", True, "gguf_" + t.type_name.lower(), "derived",
                            f"{t.type_name} (no qformat mapping)", None, None, "gguf_blocks", t.nbytes, _bpw(t.nbytes, n), [t.name])
            continue
        el = "codebook4 e2m1 (gguf)" if spec.name == "MXFP4" else element_text(Element.from_dict(spec.codes.element()))
        gran = str(spec.block) + (f" (sub-blocks of {spec.sub})" if spec.sub else "")
        block = {"type": "grid", "size": [1] * (len(t.shape) - 1) + [spec.sub or spec.block]}
        yield TensorRow(t.name, list(t.shape), "float32", True, "gguf_" + spec.name.lower(), "descriptor", el, block, gran,
                        "gguf_blocks", t.nbytes, _bpw(t.nbytes, n), [t.name])


@dataclass
class Inspection:
    """What ``qformat inspect`` reports about one checkpoint (:meth:`to_dict` is the ``--json`` output).

    ``path`` is the path or URL as given; :meth:`to_dict` and :meth:`lines` show a URL by
    :func:`qformat.redact.shown` (no user-info, no query)."""

    path: str
    kind: str
    source_format: str | None
    spec_versions: list[str]
    files: list[str]
    file_bytes: int
    tensors: list[TensorRow]
    gguf: dict[str, Any] | None = None  # gguf_summary() of a GGUF file or of the GGUF metadata a conversion records

    def totals(self) -> dict[str, Any]:
        q = [t for t in self.tensors if t.quantized]
        el = sum(t.elements for t in self.tensors)
        qel = sum(t.elements for t in q)
        nb = sum(t.stored_bytes for t in self.tensors)
        qnb = sum(t.stored_bytes for t in q)
        return {"tensors": len(self.tensors), "quantized": len(q), "plain": len(self.tensors) - len(q),
                "elements": el, "stored_bytes": nb, "bits_per_weight": _round(_bpw(nb, el)),
                "quantized_elements": qel, "quantized_stored_bytes": qnb, "quantized_bits_per_weight": _round(_bpw(qnb, qel))}

    def schemes(self) -> list[dict[str, Any]]:
        """One entry per (scheme, element, granularity) of the quantized tensors, then per plain dtype."""
        groups: dict[tuple[bool, str, str, str], list[TensorRow]] = {}
        for t in self.tensors:
            groups.setdefault((not t.quantized, t.scheme or "plain", t.element, t.granularity or ""), []).append(t)
        out = []
        for key in sorted(groups):
            rows = groups[key]
            el, nb = sum(t.elements for t in rows), sum(t.stored_bytes for t in rows)
            out.append({"scheme": key[1], "element": key[2], "granularity": key[3] or None, "quantized": rows[0].quantized,
                        "tensors": len(rows), "elements": el,
                        "stored_bytes": nb, "bits_per_weight": _round(_bpw(nb, el))})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"format_version": FORMAT_VERSION, "path": shown(self.path), "kind": self.kind, "source_format": self.source_format,
                "spec_version": self.spec_versions[0] if len(self.spec_versions) == 1 else (self.spec_versions or None),
                "files": self.files, "file_bytes": self.file_bytes, "gguf": self.gguf, "totals": self.totals(), "schemes": self.schemes(),
                "tensors": [t.to_dict() for t in self.tensors]}

    def lines(self) -> list[str]:
        """The text report: a header, one row per tensor, the per-scheme summary and totals."""
        what = {"qformat": "qformat checkpoint", "safetensors": "plain safetensors checkpoint",
                "source": f"{self.source_format} checkpoint (read through qformat convert; nothing written)"}[self.kind]
        ver = ", ".join(self.spec_versions) if self.spec_versions else "-"
        out = [f"{shown(self.path)}: {what}",
               f"  {len(self.files)} file(s), {self.file_bytes / 1e6:,.1f} MB; qformat spec version {ver}"
               + (" (as converted)" if self.kind == "source" else "")]
        if self.gguf is not None:
            out += gguf_lines(self.gguf)
        out.append("")
        cols = ["tensor", "shape", "dtype", "scheme", "element", "block", "layout", "bits/w", "bytes"]
        rows = [[t.name, "x".join(map(str, t.shape)) or "scalar", t.dtype, t.scheme or "plain", t.element, t.granularity or "-",
                 t.layout or "-", "-" if t.bits_per_weight is None else f"{t.bits_per_weight:.2f}", f"{t.stored_bytes:,}"] for t in self.tensors]
        out += text_table(cols, rows, right={7, 8})
        out.append("")
        srows = [[s["scheme"], s["element"], s["granularity"] or "-", str(s["tensors"]), f"{s['elements']:,}", f"{s['stored_bytes']:,}",
                  "-" if s["bits_per_weight"] is None else f"{s['bits_per_weight']:.2f}"] for s in self.schemes()]
        out += text_table(["scheme", "element", "block", "tensors", "elements", "bytes", "bits/w"], srows, right={3, 4, 5, 6})
        t = self.totals()
        qbpw = "-" if t["quantized_bits_per_weight"] is None else f"{t['quantized_bits_per_weight']:.2f}"
        bpw = "-" if t["bits_per_weight"] is None else f"{t['bits_per_weight']:.2f}"
        out += ["", f"total: {t['tensors']} tensors ({t['quantized']} quantized, {t['plain']} plain), {t['elements']:,} elements, "
                f"{t['stored_bytes']:,} bytes stored; {bpw} bits/weight overall, {qbpw} over quantized tensors"]
        return out


def text_table(cols: list[str], rows: list[list[str]], right: set[int] = frozenset()) -> list[str]:  # type: ignore[assignment]
    """Rows of plain text under a header line: columns padded to width, ``right`` aligned right."""
    w = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(cols)]

    def fmt(r: list[str]) -> str:
        return "  ".join(v.rjust(w[i]) if i in right else v.ljust(w[i]) for i, v in enumerate(r)).rstrip()

    return [fmt(cols), "-" * len(fmt(["-" * x for x in w]))] + [fmt(r) for r in rows]


def inspect_checkpoint(path: str | os.PathLike[str], from_format: str | None = None) -> Inspection:
    """Describe the checkpoint at ``path`` from its headers (see the module docstring).

    Raises :class:`~qformat.errors.QFormatError` (FILE_UNREADABLE, a container code,
    CONVERT_SOURCE_INVALID, ...) when the path cannot be read as any checkpoint.
    """
    o = open_checkpoint(path, from_format)
    if o.source_format == "gguf":
        from .convert.gguf_file import GGUFFile

        f = GGUFFile(os.path.join(o.ck.folder, o.ck.files[0]))
        rows = list(_gguf_rows(f))
        kv, version, alignment = _gguf_file_kv(f)
        summary: dict[str, Any] | None = gguf_summary(kv, version, alignment)
        del f
    else:
        summary, kv_tensors = _recorded_gguf(o)
        descs = o.descriptors()
        rows = [_quantized_row(n, d, o.info) for n, d in descs.items()]
        for n in o.plain_names(descs):
            if n in kv_tensors:
                continue  # a GGUF key/value an older conversion stored as a tensor: metadata
            i = o.info(n)
            assert i is not None
            rows.append(_plain_row(n, i))
    rows.sort(key=lambda r: natural_key(r.name))
    return Inspection(os.fspath(path), o.kind, o.source_format, o.spec_versions(), o.files, o.file_bytes(), rows, summary)
