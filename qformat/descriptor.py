"""Descriptors: frozen dataclasses for the qformat object, and their semantic validation.

Structure is checked by the JSON Schema first (:func:`schema_problems`); the dataclasses are
built only from schema-valid dicts; :func:`validate_descriptor` then checks everything that
depends on the logical shape and on the component tensors (SPEC.md, "Validation").
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterator, Mapping

import jsonschema

from . import tables
from .elements import Element
from .errors import QFormatError, error
from .packing import Packing
from .sources import Source

LOGICAL_DTYPES = ("float32", "float16", "bfloat16")
EXTENSION_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*(\.[a-z0-9][a-z0-9_-]*)+$")
#: Extensions this implementation understands (none in 1.0).
KNOWN_EXTENSIONS: frozenset[str] = frozenset()
#: The specification version this reader implements (major, minor): SPEC.md §3.4.
READER_VERSION = (1, 1)

# Which storage dtypes may carry which role.
_CONTAINER_DTYPES = {
    8: {"U8", "I8", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"},
    16: {"U16", "I16", "F16", "BF16"},
    32: {"U32", "I32", "F32"},
}
PARAM_DTYPES = {"F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "I8", "U8", "I16", "U16", "I32", "U32"}
INT_PARAM_DTYPES = {"I8", "U8", "I16", "U16", "I32", "U32"}
INDEX_DTYPES = {"I8", "U8", "I16", "U16", "I32", "U32", "I64"}
TABLE_DTYPES = {"F32", "F16", "BF16"}


# -- dataclasses ---------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupIndex:
    axis: int
    tensor: str
    count: int


@dataclass(frozen=True)
class Blocks:
    """``grid`` (size per axis, None = whole axis, optional group index) or ``flat``."""

    type: str
    size: tuple[int | None, ...] | int
    index: GroupIndex | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Blocks":
        if d["type"] == "flat":
            return cls("flat", int(d["size"]))
        idx = d.get("index")
        gi = None if idx is None else GroupIndex(int(idx["axis"]), idx["tensor"], int(idx["count"]))
        return cls("grid", tuple(None if s is None else int(s) for s in d["size"]), gi)

    def to_dict(self) -> dict[str, Any]:
        if self.type == "flat":
            return {"type": "flat", "size": self.size}
        d: dict[str, Any] = {"type": "grid", "size": list(self.size)}  # type: ignore[arg-type]
        if self.index is not None:
            d["index"] = {"axis": self.index.axis, "tensor": self.index.tensor, "count": self.index.count}
        return d

    def grid_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Shape of the parameter grid for a logical ``shape`` (assumes a valid block)."""
        if self.type == "flat":
            return (-(-math.prod(shape) // int(self.size)),)  # type: ignore[arg-type]
        out = []
        for a, (n, s) in enumerate(zip(shape, self.size)):  # type: ignore[arg-type]
            if self.index is not None and a == self.index.axis:
                out.append(self.index.count)
            else:
                out.append(1 if s is None else -(-n // s))
        return tuple(out)


@dataclass(frozen=True)
class Param:
    """A zero point, scale or bias: a plain tensor or a nested (encoded) descriptor."""

    role: str
    blocks: Blocks
    op: str | None
    tensor: str | None = None
    order: tuple[int, ...] | None = None
    encoded: "Descriptor | None" = None

    @classmethod
    def from_dict(cls, role: str, d: Mapping[str, Any]) -> "Param":
        enc = d.get("encoded")
        order = d.get("order")
        return cls(
            role,
            Blocks.from_dict(d["blocks"]),
            d.get("op"),
            tensor=d.get("tensor"),
            order=None if order is None else tuple(int(a) for a in order),
            encoded=None if enc is None else Descriptor.from_dict(enc),
        )

    @property
    def arith(self) -> str:
        """The binary32 operation this parameter applies (SPEC.md §10.2), named as in NumPy,
        torch and jax.numpy: ``subtract`` for a zero point, else the parameter's ``op``."""
        return "subtract" if self.role == "zero" else str(self.op)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"blocks": self.blocks.to_dict()}
        if self.op is not None:
            d["op"] = self.op
        if self.tensor is not None:
            d["tensor"] = self.tensor
            if self.order is not None:
                d["order"] = list(self.order)
        else:
            assert self.encoded is not None
            d["encoded"] = self.encoded.to_dict()
        return d


@dataclass(frozen=True)
class Codes:
    tensor: str
    element: Element
    packing: Packing

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Codes":
        return cls(d["tensor"], Element.from_dict(d["element"]), Packing.from_dict(d["packing"]))

    def to_dict(self) -> dict[str, Any]:
        return {"tensor": self.tensor, "element": self.element.to_dict(), "packing": self.packing.to_dict()}


@dataclass(frozen=True)
class Extension:
    name: str
    must_understand: bool = True
    configuration: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Extension":
        return cls(d["name"], bool(d.get("must_understand", True)), dict(d.get("configuration", {})))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name}
        if not self.must_understand:
            d["must_understand"] = False
        if self.configuration:
            d["configuration"] = dict(self.configuration)
        return d


@dataclass(frozen=True)
class Descriptor:
    """One logical tensor (SPEC.md, "Descriptor")."""

    shape: tuple[int, ...]
    dtype: str
    codes: Codes
    zero: Param | None = None
    scale: Param | None = None
    bias: Param | None = None
    layout: str = "canonical"
    layout_parameters: Mapping[str, Any] = field(default_factory=dict)
    allow_nonfinite_params: bool = False
    scheme: str | None = None
    extensions: tuple[Extension, ...] = ()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Descriptor":
        lay = d.get("layout", {"name": "canonical"})
        return cls(
            shape=tuple(int(s) for s in d["shape"]),
            dtype=d["dtype"],
            codes=Codes.from_dict(d["codes"]),
            zero=Param.from_dict("zero", d["zero"]) if "zero" in d else None,
            scale=Param.from_dict("scale", d["scale"]) if "scale" in d else None,
            bias=Param.from_dict("bias", d["bias"]) if "bias" in d else None,
            layout=lay["name"],
            layout_parameters=dict(lay.get("parameters", {})),
            allow_nonfinite_params=bool(d.get("allow_nonfinite_params", False)),
            scheme=d.get("scheme"),
            extensions=tuple(Extension.from_dict(e) for e in d.get("extensions", [])),
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"shape": list(self.shape), "dtype": self.dtype, "codes": self.codes.to_dict()}
        for p in self.params():
            d[p.role] = p.to_dict()
        if self.layout != "canonical" or self.layout_parameters:
            d["layout"] = {"name": self.layout, "parameters": dict(self.layout_parameters)}
        if self.allow_nonfinite_params:
            d["allow_nonfinite_params"] = True
        if self.scheme is not None:
            d["scheme"] = self.scheme
        if self.extensions:
            d["extensions"] = [e.to_dict() for e in self.extensions]
        return d

    def params(self) -> Iterator[Param]:
        """The parameters present, in decode order (zero, scale, bias)."""
        for p in (self.zero, self.scale, self.bias):
            if p is not None:
                yield p

    def references(self) -> Iterator[tuple[str, str]]:
        """Every (role path, component name) this descriptor and its nested ones reference."""
        yield "codes.tensor", self.codes.tensor
        if self.codes.element.table_tensor is not None:
            yield "codes.element.table_tensor", self.codes.element.table_tensor
        for p in self.params():
            if p.blocks.index is not None:
                yield f"{p.role}.blocks.index.tensor", p.blocks.index.tensor
            if p.tensor is not None:
                yield f"{p.role}.tensor", p.tensor
            else:
                assert p.encoded is not None
                for path, name in p.encoded.references():
                    yield f"{p.role}.encoded.{path}", name

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


# -- schema --------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def _validator(defn: str | None) -> jsonschema.protocols.Validator:
    s = tables.schema()
    if defn is not None:
        s = {"$schema": s["$schema"], "$defs": s["$defs"], "$ref": f"#/$defs/{defn}"}
    return jsonschema.Draft202012Validator(s)


def schema_messages(obj: Any, defn: str | None = None) -> list[str]:
    """Human-readable schema violations of ``obj`` ('' path = the object itself)."""
    out = []
    for e in sorted(_validator(defn).iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
        path = "/".join(str(p) for p in e.absolute_path) or "(root)"
        msg = e.message
        if len(msg) > 300:
            msg = msg[:300] + "..."
        out.append(f"at {path}: {msg}")
    return out


# -- semantic validation -------------------------------------------------------------------
def parse_descriptor(name: str, raw: Any) -> Descriptor:
    """Schema-check a raw descriptor (as this reader's version) and build it; raises QFormatError."""
    max_depth = tables.limits()["max_nesting_depth"]
    if not isinstance(raw, Mapping):
        raise error("SCHEMA_VIOLATION", "a descriptor must be a JSON object", tensor=name)
    if depth_of(raw) > max_depth:
        raise error("DEPTH_EXCEEDED", f"encoded parameters nest {depth_of(raw)} deep, the limit is {max_depth}", tensor=name)
    if schema_messages(raw, "descriptor"):
        code, msgs = schema_code(raw)
        raise error(code, "; ".join(msgs[:5]), tensor=name)
    return Descriptor.from_dict(raw)


def extension_problems(exts: list[Extension] | tuple[Extension, ...], newer: bool, scope: str,
                       tensor: str | None = None, field: str = "extensions") -> list[QFormatError]:
    """Problems of one ``extensions`` list (SPEC.md, "Extensions").

    ``newer`` is true when the file declares a minor version above this reader's: a
    ``qformat.`` name the reader does not know may then be registered by that newer minor, so
    it is treated as an unknown extension rather than an invalid name.
    """
    probs = []
    seen: set[str] = set()
    for e in exts:
        if not EXTENSION_NAME.fullmatch(e.name):
            probs.append(error("EXTENSION_NAME_INVALID", f"expected a dotted lower-case namespaced name such as 'org.example.feature', found {e.name!r}"[:300], tensor=tensor, field=field))
            continue
        if e.name in seen:
            probs.append(error("EXTENSION_NAME_INVALID", f"extension {e.name!r} appears twice in one list", tensor=tensor, field=field))
            continue
        seen.add(e.name)
        if e.name in KNOWN_EXTENSIONS:
            continue
        if e.name.startswith("qformat.") and not newer:
            probs.append(error("EXTENSION_NAME_INVALID", f"{e.name!r} is in the reserved 'qformat.' namespace but the file's version registers no such extension", tensor=tensor, field=field))
        elif e.must_understand:
            probs.append(error("EXTENSION_UNKNOWN", f"{scope} extension {e.name!r} is must_understand and this reader does not implement it", tensor=tensor, field=field))
    return probs


#: Where in a descriptor a schema failure sits -> the specific code for it (first match wins).
_SCHEMA_CODES = (
    (("dtype",), "DTYPE_INVALID"),
    (("shape",), "SHAPE_INVALID"),
    (("codes", "element"), "ELEMENT_INVALID"),
    (("codes", "packing"), "PACKING_INVALID"),
    (("layout",), "LAYOUT_INVALID"),
)


def schema_code(raw: Any) -> tuple[str, list[str]]:
    """(code, messages) for a descriptor that fails the schema of a file not newer than the reader.

    A failure confined to one member that has its own code gets that code (a bad logical dtype
    is DTYPE_INVALID, a bit width out of range ELEMENT_INVALID ...); an unknown or missing
    member, or failures in several places, is SCHEMA_VIOLATION.
    """
    errs = list(_validator("descriptor").iter_errors(raw))
    msgs = schema_messages(raw, "descriptor")
    paths = [tuple(str(p) for p in e.absolute_path) for e in errs]
    unknown = any(e.validator in ("additionalProperties", "required") and not e.absolute_path for e in errs)
    codes = set()
    for path, e in zip(paths, errs):
        code = "SCHEMA_VIOLATION"
        for prefix, c in _SCHEMA_CODES:
            if path[: len(prefix)] == prefix and e.validator != "additionalProperties":
                code = c
                break
        if len(path) >= 2 and path[0] in ("zero", "scale", "bias") and path[1] == "blocks" and e.validator != "additionalProperties":
            code = "BLOCKS_INVALID"
        codes.add(code)
    if unknown or len(codes) != 1:
        return "SCHEMA_VIOLATION", msgs
    return codes.pop(), msgs



def _perm_ok(order: tuple[int, ...] | None, rank: int) -> bool:
    return order is None or sorted(order) == list(range(rank))


def _squeeze(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(s for s in shape if s != 1)


def codes_shape(desc: Descriptor) -> tuple[tuple[int, ...], int, int]:
    """(storage shape S', row length L, words per row W) of a descriptor's codes."""
    p = desc.codes.packing
    order = p.order or tuple(range(len(desc.shape)))
    sshape = tuple(desc.shape[a] for a in order)
    bits = desc.codes.element.bits
    length = desc.numel if p.axis is None else sshape[p.axis]
    return sshape, length, p.words_per_row(length, bits)


def validate_descriptor(name: str, desc: Descriptor, src: Source, depth: int = 0, newer: bool = False,
                        minor: int | None = None) -> list[QFormatError]:
    """Every semantic problem of ``desc`` against the components in ``src``.

    ``minor`` is the minor version the file declares (default: this reader's, or one above it
    when ``newer``): a device layout is known only in files of the version that defines it or
    later (SPEC.md §11).  Does not read payload bytes except small group-index checks are left
    to :mod:`qformat.check`.
    """
    from . import layouts as _layouts

    if minor is None:
        minor = READER_VERSION[1] + (1 if newer else 0)
    probs: list[QFormatError] = []
    lim = tables.limits()

    def add(code: str, field: str, msg: str) -> None:
        probs.append(error(code, msg, tensor=name, field=field))

    rank = len(desc.shape)
    if rank > lim["max_rank"]:
        add("SHAPE_INVALID", "shape", f"rank must be at most {lim['max_rank']}, found {rank}")
        return probs
    if desc.numel >= 1 << 64:
        add("SHAPE_INVALID", "shape", f"the element count of shape {list(desc.shape)} reaches 2^64")
        return probs
    if desc.dtype not in LOGICAL_DTYPES:
        add("DTYPE_INVALID", "dtype", f"expected one of {', '.join(LOGICAL_DTYPES)}, found {desc.dtype!r}")
    probs.extend(extension_problems(desc.extensions, newer, "tensor", tensor=name))
    probs.extend(_layouts.problems(desc, minor, READER_VERSION[1], depth, tensor=name))  # SPEC.md §11
    if probs:
        return probs

    # codes
    codes, el, p = desc.codes, desc.codes.element, desc.codes.packing
    for m in el.problems():
        add("ELEMENT_INVALID", "codes.element", m)
    if el.type == "codebook":
        if el.table is not None:
            n = len(tables.codebooks()[el.table]["values_f32"])
            if n > (1 << el.bits):
                add("CODEBOOK_INVALID", "codes.element.table", f"table {el.table!r} has {n} entries, more than 2^{el.bits}")
        else:
            info = src.info(el.table_tensor or "")
            if info is None:
                add("COMPONENT_MISSING", "codes.element.table_tensor", f"no tensor named {el.table_tensor!r} in the file")
            elif info.dtype not in TABLE_DTYPES:
                add("CODEBOOK_INVALID", "codes.element.table_tensor", f"table dtype must be one of {sorted(TABLE_DTYPES)}, found {info.dtype}")
            elif len(info.shape) != 1 or not 1 <= info.shape[0] <= (1 << el.bits):
                add("CODEBOOK_INVALID", "codes.element.table_tensor", f"table must be 1-D with 1..{1 << el.bits} entries, found shape {list(info.shape)}")
    for m in p.problems(el.bits):
        add("PACKING_INVALID", "codes.packing", m)
    if not _perm_ok(p.order, rank):
        add("PACKING_INVALID", "codes.packing.order", f"expected a permutation of 0..{rank - 1}, found {list(p.order or ())}")
    if p.axis is None:
        pass
    elif rank == 0:
        add("PACKING_INVALID", "codes.packing.axis", "a rank-0 tensor must be packed with axis null")
    elif p.axis >= rank:
        add("PACKING_INVALID", "codes.packing.axis", f"expected a storage axis below {rank}, found {p.axis}")
    if not probs:
        info = src.info(codes.tensor)
        if info is None:
            add("COMPONENT_MISSING", "codes.tensor", f"no tensor named {codes.tensor!r} in the file")
        else:
            if info.dtype not in _CONTAINER_DTYPES[p.container]:
                add("COMPONENT_DTYPE", "codes.tensor", f"a {p.container}-bit container needs one of {sorted(_CONTAINER_DTYPES[p.container])}, found {info.dtype}")
            sshape, length, wpr = codes_shape(desc)
            if desc.layout != "canonical":  # the device tensor's own shape replaces §7.4 (§11)
                want_dev = _layouts.codes_component_shape(desc)
                if info.shape != want_dev:
                    add("COMPONENT_SHAPE", "codes.tensor", f"layout {desc.layout!r} stores the codes as {list(want_dev)}, found {list(info.shape)}")
            elif p.axis is None:
                if math.prod(info.shape) != wpr:
                    add("COMPONENT_SHAPE", "codes.tensor", f"expected {wpr} containers in all for {desc.numel} codes of {el.bits} bits, found shape {list(info.shape)} ({math.prod(info.shape)})")
            else:
                want = sshape[: p.axis] + (wpr,) + sshape[p.axis + 1 :]
                if info.shape != want:
                    add("COMPONENT_SHAPE", "codes.tensor", f"expected shape {list(want)} ({wpr} containers per row of {length} {el.bits}-bit codes), found {list(info.shape)}")

    # params
    for prm in desc.params():
        probs.extend(_validate_param(name, desc, prm, src, depth, newer, minor))
    return probs


def _validate_param(name: str, desc: Descriptor, prm: Param, src: Source, depth: int, newer: bool,
                    minor: int | None = None) -> list[QFormatError]:
    probs: list[QFormatError] = []
    role = prm.role
    rank = len(desc.shape)

    def add(code: str, field: str, msg: str) -> None:
        probs.append(error(code, msg, tensor=name, field=field))

    b = prm.blocks
    if b.type == "grid":
        if len(b.size) != rank:  # type: ignore[arg-type]
            add("BLOCKS_INVALID", f"{role}.blocks.size", f"expected {rank} entries (one per logical axis), found {len(b.size)}")  # type: ignore[arg-type]
            return probs
        if b.index is not None:
            gi = b.index
            if gi.axis >= rank:
                add("BLOCKS_INVALID", f"{role}.blocks.index.axis", f"expected an axis below {rank}, found {gi.axis}")
                return probs
            if b.size[gi.axis] is not None:  # type: ignore[index]
                add("BLOCKS_INVALID", f"{role}.blocks.size", f"the indexed axis {gi.axis} must have size null, found {b.size[gi.axis]}")  # type: ignore[index]
            info = src.info(gi.tensor)
            if info is None:
                add("COMPONENT_MISSING", f"{role}.blocks.index.tensor", f"no tensor named {gi.tensor!r} in the file")
            elif info.dtype not in INDEX_DTYPES:
                add("COMPONENT_DTYPE", f"{role}.blocks.index.tensor", f"a group index needs an integer dtype, found {info.dtype}")
            elif info.shape != (desc.shape[gi.axis],):
                add("COMPONENT_SHAPE", f"{role}.blocks.index.tensor", f"expected shape [{desc.shape[gi.axis]}], found {list(info.shape)}")
    if probs:
        return probs
    grid = b.grid_shape(desc.shape)
    if prm.tensor is not None:
        if not _perm_ok(prm.order, len(grid)):
            add("BLOCKS_INVALID", f"{role}.order", f"expected a permutation of 0..{len(grid) - 1}, found {list(prm.order or ())}")
            return probs
        info = src.info(prm.tensor)
        if info is None:
            add("COMPONENT_MISSING", f"{role}.tensor", f"no tensor named {prm.tensor!r} in the file")
            return probs
        if info.dtype not in PARAM_DTYPES:
            add("COMPONENT_DTYPE", f"{role}.tensor", f"a parameter needs one of {sorted(PARAM_DTYPES)}, found {info.dtype}")
        stored = tuple(grid[a] for a in prm.order) if prm.order else grid
        if _squeeze(info.shape) != _squeeze(stored) or math.prod(info.shape) != math.prod(stored):
            add("COMPONENT_SHAPE", f"{role}.tensor", f"expected the parameter grid {list(stored)} (size-1 axes may be dropped or added), found {list(info.shape)}")
        return probs
    enc = prm.encoded
    assert enc is not None
    if depth + 1 > tables.limits()["max_nesting_depth"]:
        add("DEPTH_EXCEEDED", f"{role}.encoded", f"nesting depth {depth + 1} exceeds the limit {tables.limits()['max_nesting_depth']}")
        return probs
    if enc.shape != grid:
        add("SHAPE_INVALID", f"{role}.encoded.shape", f"an encoded parameter's shape must equal its grid {list(grid)}, found {list(enc.shape)}")
        return probs
    for p in validate_descriptor(name, enc, src, depth + 1, newer, minor):
        p.field = f"{role}.encoded.{p.field}" if p.field else f"{role}.encoded"
        probs.append(error(p.code, p.message, tensor=name, field=p.field))
    return probs


def depth_of(d: Mapping[str, Any]) -> int:
    """Nesting depth of a raw descriptor dict (0 = no encoded parameters); bounded walk."""
    best = 0
    for role in ("zero", "scale", "bias"):
        p = d.get(role)
        if isinstance(p, Mapping) and isinstance(p.get("encoded"), Mapping):
            best = max(best, 1 + depth_of(p["encoded"]))
            if best > 64:
                return best
    return best
