"""The qformat view of an opened file: version, descriptors, component claims, plain tensors.

:func:`interpret` turns a validated container header plus a component source into a
:class:`FileModel`.  Problems that make the whole file unreadable (unknown major version, an
unknown must-understand file extension, a broken qformat object) are collected in
``file_problems``; problems confined to one logical tensor are in ``tensor_problems`` so that
the rest of the file still reads.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from . import layouts, structure, tables
from .container import Header, _Dup, strict_json
from .descriptor import READER_VERSION, Descriptor, Extension, depth_of, extension_problems
from .errors import QFormatError, error
from .validate import validate_descriptor
from .sources import Source

METADATA_KEY = "qformat"
VERSION_RE = re.compile(r"^(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})$")


@dataclass
class FileModel:
    version: str | None = None
    descriptors: dict[str, Descriptor] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)
    plain: list[str] = field(default_factory=list)
    components: dict[str, str] = field(default_factory=dict)  # component -> logical owner
    file_problems: list[QFormatError] = field(default_factory=list)
    #: the qformat object's ``digests`` member (SPEC.md §3.8), when the file has a valid one
    digests: dict[str, Any] | None = None
    tensor_problems: dict[str, list[QFormatError]] = field(default_factory=dict)

    def problems(self) -> list[QFormatError]:
        out = list(self.file_problems)
        for probs in self.tensor_problems.values():
            out.extend(probs)
        return out

    def logical_names(self) -> list[str]:
        """Names a reader returns: plain tensors and logical tensors, sorted."""
        return sorted(set(self.plain) | set(self.raw))


def required_version(descriptors: Any) -> str:
    """The version a writer records for these descriptors (dicts or Descriptors): the lowest one
    whose features they use (SPEC.md §17.1), ``"1.0"`` unless a 1.1 feature appears."""
    return layouts.required_version(descriptors.values() if isinstance(descriptors, dict) else descriptors)


def qformat_json(descriptors: Mapping[str, Any], shard: bool = False) -> str | None:
    """The ``__metadata__["qformat"]`` value a writer records for ``descriptors`` (name ->
    descriptor dict): the lowest version whose features they use (SPEC.md §17.1), keys sorted,
    no spaces.  None when there are no descriptors, unless ``shard``: a checkpoint's file of plain
    tensors only still gets a qformat object (``"tensors": {}``), so that the digests its writer
    adds (SPEC.md §3.8) protect its bytes as they protect the quantized shards'."""
    if not descriptors and not shard:
        return None
    return json.dumps({"version": required_version(dict(descriptors)), "tensors": dict(descriptors)}, separators=(",", ":"), sort_keys=True)


def parse_version(v: Any) -> tuple[int, int] | QFormatError:
    if not isinstance(v, str) or not VERSION_RE.fullmatch(v):
        return error("VERSION_INVALID", f"expected a string MAJOR.MINOR such as \"1.0\", found {v!r}"[:200], field="version")
    major, minor = (int(x) for x in v.split("."))
    if major != READER_VERSION[0]:
        return error("VERSION_UNSUPPORTED", f"this reader implements major version {READER_VERSION[0]}, the file declares {v}", field="version")
    return major, minor


def interpret(header: Header, src: Source) -> FileModel:
    """Build the qformat view of a file whose container is already valid: the qformat object
    is parsed and checked (file problems stop there), then each descriptor on its own (tensor
    problems), then the component claims and name conflicts across descriptors."""
    m = FileModel()
    text = (header.metadata or {}).get(METADATA_KEY)
    if text is None:
        m.plain = sorted(header.entries)
        _plain_dtype_problems(m, header)
        return m
    obj = _qformat_object(text, m)
    if obj is None:
        return m
    ver = parse_version(obj["version"])
    if isinstance(ver, QFormatError):
        m.file_problems.append(ver)
        return m
    m.version = obj["version"]
    newer = ver[1] > READER_VERSION[1]
    m.file_problems.extend(_top_level_problems(obj, newer, ver[1]))
    if m.file_problems:
        return m
    if "digests" in obj and (newer or ver[1] >= 2):
        m.digests = obj["digests"]
    claims: dict[str, list[str]] = {}
    for name, raw in obj["tensors"].items():
        m.raw[name] = raw
        desc, probs = _interpret_descriptor(name, raw, src, newer, ver[1])
        if desc is not None:
            _claim(desc, name, claims)
            if not probs:
                m.descriptors[name] = desc
        if probs:
            m.tensor_problems[name] = probs
    _claim_and_name_problems(m, claims, header)
    m.plain = sorted(n for n in header.entries if n not in m.components and n not in m.raw)
    _plain_dtype_problems(m, header)
    return m


def _qformat_object(text: str, m: FileModel) -> dict[str, Any] | None:
    """The parsed qformat metadata object with a 'version', or None with a file problem."""
    limit = tables.limits()["max_qformat_json_bytes"]
    if len(text.encode("utf-8")) > limit:
        m.file_problems.append(error("QFORMAT_JSON_INVALID", f"the qformat metadata value is larger than {limit} bytes"))
        return None
    try:
        obj, end = strict_json(text)
        if text[end:].strip(" \t\n\r"):
            raise ValueError("text follows the JSON object")
    except _Dup as d:
        m.file_problems.append(error("QFORMAT_JSON_INVALID", f"key {d.key!r} appears twice in one object"))
        return None
    except (ValueError, RecursionError) as e:
        m.file_problems.append(error("QFORMAT_JSON_INVALID", f"the qformat metadata value is not JSON: {e}"[:300]))
        return None
    if not isinstance(obj, dict):
        m.file_problems.append(error("QFORMAT_JSON_INVALID", f"expected a JSON object, found {type(obj).__name__}"))
        return None
    if "version" not in obj:
        m.file_problems.append(error("VERSION_MISSING", "the qformat object has no 'version'", field="version"))
        return None
    return obj


def _top_level_problems(obj: dict[str, Any], newer: bool, minor: int | None = None) -> list[QFormatError]:
    """Problems of the qformat object's own members (the descriptors are checked one by one)."""
    # A newer minor may add optional top-level members; anything a reader must understand
    # comes as an extension, so an older reader ignores members it does not know.
    msgs = structure.object_failures(obj, newer, minor)  # SPEC.md §3.2, checks Q1 to Q5
    if msgs:
        code = "FEATURE_UNSUPPORTED" if newer else "SCHEMA_VIOLATION"
        return [error(code, "; ".join(msgs))]
    exts = [Extension.from_dict(e) for e in obj.get("extensions", [])]
    return extension_problems(exts, newer, "file")


def _interpret_descriptor(name: str, raw: Any, src: Source, newer: bool, minor: int) -> tuple[Descriptor | None, list[QFormatError]]:
    """(the descriptor when it is schema-valid, its problems) for one entry of ``tensors``."""
    max_depth = tables.limits()["max_nesting_depth"]
    deep = isinstance(raw, dict) and depth_of(raw) > max_depth
    code, msgs = structure.descriptor_code(raw) if isinstance(raw, dict) and not deep else (None, [])
    if name in ("", "__metadata__"):  # SPEC.md §3.2, §4.3: refuses this tensor only, in any minor
        return None, [error("SCHEMA_VIOLATION", "a logical tensor name must not be empty or '__metadata__'", tensor=name)]
    if deep:
        return None, [error("DEPTH_EXCEEDED", f"encoded parameters nest {depth_of(raw)} deep, the limit is {max_depth}", tensor=name)]
    if not isinstance(raw, dict):
        return None, [error("FEATURE_UNSUPPORTED" if newer else "SCHEMA_VIOLATION", "a descriptor must be a JSON object", tensor=name)]
    if code is not None:
        return None, [error("FEATURE_UNSUPPORTED" if newer else code, "; ".join(msgs[:5]), tensor=name)]
    desc = Descriptor.from_dict(raw)
    return desc, validate_descriptor(name, desc, src, newer=newer, minor=minor)


def _claim(desc: Descriptor, name: str, claims: dict[str, list[str]]) -> None:
    """Record which stored tensors ``name`` references.  A group index may serve several
    parameters of one tensor (GPTQ's scale and zero), so it counts once per tensor."""
    own: dict[str, bool] = {}
    for path, comp in desc.references():
        is_index = path.endswith("blocks.index.tensor")
        if comp in own and own[comp] and is_index:
            continue
        own[comp] = is_index
        claims.setdefault(comp, []).append(name)


def _claim_and_name_problems(m: FileModel, claims: dict[str, list[str]], header: Header) -> None:
    """COMPONENT_CLAIMED_TWICE and NAME_CONFLICT across descriptors; fills ``m.components``."""
    for comp, owners in claims.items():
        if len(owners) > 1:
            for owner in sorted(set(owners)):
                m.tensor_problems.setdefault(owner, []).append(
                    error("COMPONENT_CLAIMED_TWICE", f"component {comp!r} is referenced {len(owners)} times (by {sorted(owners)})", tensor=owner))
                m.descriptors.pop(owner, None)
        if comp in header.entries:  # a reference to no stored tensor is COMPONENT_MISSING, not a claim
            m.components[comp] = owners[0]
    for name in m.raw:
        owner = m.components.get(name)
        if name in header.entries and owner is None and name not in m.tensor_problems:
            m.tensor_problems.setdefault(name, []).append(
                error("NAME_CONFLICT", f"logical tensor {name!r} has the name of a plain tensor in the file", tensor=name))
            m.descriptors.pop(name, None)
        elif owner is not None and owner != name:
            m.tensor_problems.setdefault(name, []).append(
                error("NAME_CONFLICT", f"logical tensor {name!r} has the name of a component of {owner!r}", tensor=name))
            m.descriptors.pop(name, None)


def _plain_dtype_problems(m: FileModel, header: Header) -> None:
    """SHAPE_UNREPRESENTABLE for a plain empty tensor no array can hold (SPEC.md §2.2); every
    storage dtype has a plain reading since 1.2 (§2.6)."""
    from .sources import plain_shape_problem

    for n in m.plain:
        e = header.entries[n]
        msg = plain_shape_problem(e.dtype, e.shape)
        if msg is not None:
            m.tensor_problems.setdefault(n, []).append(error("SHAPE_UNREPRESENTABLE", msg, tensor=n, field="shape"))
