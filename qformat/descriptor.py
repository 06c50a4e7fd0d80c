"""Descriptors: frozen dataclasses for the qformat object, parsed from schema-valid JSON.

Structure is checked first by the ordered structural checks of SPEC.md §5.5
(:mod:`qformat.structure`, which accept exactly what the JSON Schema accepts; :func:`parse_descriptor`);
the dataclasses are built only from schema-valid dicts; :mod:`qformat.validate` then checks
everything that depends on the logical shape and on the component tensors (SPEC.md,
"Validation").

Names used throughout the package: ``raw`` is a descriptor as JSON (a dict, as stored in the
file), ``desc`` the parsed :class:`Descriptor`, ``prm`` one :class:`Param`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterator, Mapping, NamedTuple

import jsonschema

from . import structure, tables
from .elements import Element
from .errors import QFormatError, error
from .packing import Packing

LOGICAL_DTYPES = ("float32", "float16", "bfloat16")
EXTENSION_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*(\.[a-z0-9][a-z0-9_-]*)+$")
#: Extensions this implementation understands (none in 1.0).
KNOWN_EXTENSIONS: frozenset[str] = frozenset()
#: The specification version this reader implements (major, minor): SPEC.md §3.4.
READER_VERSION = (1, 2)



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

    def stored_grid_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The parameter grid of a logical ``shape`` in the stored tensor's axis order
        (``order[i]`` is the grid axis stored as axis ``i``; SPEC.md §9.1)."""
        grid = self.blocks.grid_shape(shape)
        return tuple(grid[a] for a in self.order) if self.order else grid

    @property
    def grid_axes(self) -> tuple[int, ...] | None:
        """The transpose that takes the stored tensor (viewed in :meth:`stored_grid_shape`)
        to grid axis order, or None when it is stored in grid order already."""
        if not self.order:
            return None
        inverse = [0] * len(self.order)
        for i, a in enumerate(self.order):
            inverse[a] = i
        return tuple(inverse)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"blocks": self.blocks.to_dict()}
        if self.op is not None:
            d["op"] = self.op
        if self.tensor is not None:
            d["tensor"] = self.tensor
            if self.order is not None:
                d["order"] = list(self.order)
        elif self.encoded is not None:
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
            elif p.encoded is not None:
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
    code, msgs = structure.descriptor_code(raw)
    if code is not None:
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


def schema_code(raw: Any) -> tuple[str, list[str]]:
    """(code, messages) for a descriptor that fails the schema, in a file not newer than the
    reader: the code of SPEC.md §5.5, assigned by the ordered structural checks of
    :mod:`qformat.structure` (never from where a JSON Schema validator reports a failure)."""
    code, msgs = structure.descriptor_code(raw)
    return (code or "SCHEMA_VIOLATION"), msgs



class CodesGeometry(NamedTuple):
    """How a descriptor's codes are stored (SPEC.md §7.4): the logical shape in storage axis
    order, the number of codes in one packed row, and the containers per row."""

    stored_shape: tuple[int, ...]
    row_length: int
    words_per_row: int


def codes_shape(desc: Descriptor) -> CodesGeometry:
    """The :class:`CodesGeometry` of a descriptor's codes (a valid descriptor)."""
    p = desc.codes.packing
    order = p.order or tuple(range(len(desc.shape)))
    sshape = tuple(desc.shape[a] for a in order)
    bits = desc.codes.element.bits
    length = desc.numel if p.axis is None else sshape[p.axis]
    return CodesGeometry(sshape, length, p.words_per_row(length, bits))


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
